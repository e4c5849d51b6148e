#include "confirmed_publisher.h"

#include <amqp_tcp_socket.h>
#include <sys/time.h>

#include <cstring>

#include "amqp_session.h"

namespace postspool::bench {
namespace {

amqp_bytes_t Bytes(std::string_view s) {
  return amqp_bytes_t{s.size(), const_cast<char*>(s.data())};
}

std::string Text(amqp_bytes_t b) {
  return b.bytes == nullptr ? std::string() : std::string(static_cast<const char*>(b.bytes), b.len);
}


timeval Timeval(int ms) { return timeval{ms / 1000, (ms % 1000) * 1000}; }

}  // namespace

// ---------------------------------------------------------------------------
// AmqpConnection

Status AmqpConnection::Open(const BrokerAddress& address, int timeout_ms) {
  Close();
  conn_ = amqp_new_connection();
  if (conn_ == nullptr) return Status(StatusCode::kIoError, "amqp_new_connection failed");
  amqp_socket_t* socket = amqp_tcp_socket_new(conn_);
  if (socket == nullptr) {
    Close();
    return Status(StatusCode::kIoError, "amqp_tcp_socket_new failed");
  }
  timeval tv = Timeval(timeout_ms);
  amqp_set_rpc_timeout(conn_, &tv);
  if (const int rc = amqp_socket_open_noblock(socket, address.host.c_str(), address.port, &tv);
      rc != AMQP_STATUS_OK) {
    amqp_destroy_connection(conn_);
    conn_ = nullptr;
    return Status(StatusCode::kIoError, std::string("connect: ") + amqp_error_string2(rc));
  }
  const amqp_rpc_reply_t r =
      amqp_login(conn_, address.vhost.c_str(), 0, 131072, /*heartbeat=*/0, AMQP_SASL_METHOD_PLAIN,
                 address.user.c_str(), address.password.c_str());
  if (r.reply_type != AMQP_RESPONSE_NORMAL) {
    amqp_destroy_connection(conn_);
    conn_ = nullptr;
    return daemon::AmqpReplyStatus(r, "login");
  }
  amqp_channel_open(conn_, 1);
  if (Status s = RpcStatus("channel.open"); !s.ok()) {
    Close();
    return s;
  }
  return Status::Ok();
}

void AmqpConnection::Close() {
  if (conn_ == nullptr) return;
  amqp_connection_close(conn_, AMQP_REPLY_SUCCESS);
  amqp_destroy_connection(conn_);
  conn_ = nullptr;
}

Status AmqpConnection::RpcStatus(const char* what) const {
  const amqp_rpc_reply_t r = amqp_get_rpc_reply(conn_);
  if (r.reply_type == AMQP_RESPONSE_NORMAL) return Status::Ok();
  return daemon::AmqpReplyStatus(r, what);
}

std::string AmqpConnection::ServerProperty(std::string_view key) const {
  if (conn_ == nullptr) return {};
  const amqp_table_t* t = amqp_get_server_properties(conn_);
  for (int i = 0; t != nullptr && i < t->num_entries; ++i) {
    const amqp_table_entry_t& e = t->entries[i];
    if (Text(e.key) == key && (e.value.kind == AMQP_FIELD_KIND_UTF8 ||
                               e.value.kind == AMQP_FIELD_KIND_BYTES)) {
      return Text(e.value.value.bytes);
    }
  }
  return {};
}

Status AmqpConnection::QueueMessageCount(const std::string& queue, uint32_t* count) {
  if (conn_ == nullptr) return Status(StatusCode::kIoError, "not connected");
  const amqp_queue_declare_ok_t* ok =
      amqp_queue_declare(conn_, 1, Bytes(queue), /*passive=*/1, 0, 0, 0, amqp_empty_table);
  if (ok == nullptr) return RpcStatus("queue.declare (passive)");
  *count = ok->message_count;
  amqp_maybe_release_buffers(conn_);
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// ConfirmedPublisher

Status ConfirmedPublisher::Open(const BrokerAddress& address, const Options& options) {
  options_ = options;
  next_tag_ = 1;
  first_unsettled_ = 1;
  settled_.clear();
  counters_ = {};
  if (Status s = connection_.Open(address, options.timeout_ms); !s.ok()) return s;
  amqp_confirm_select(connection_.get(), 1);
  if (Status s = connection_.RpcStatus("confirm.select"); !s.ok()) {
    connection_.Close();
    return s;
  }
  return Status::Ok();
}

Status ConfirmedPublisher::Publish(std::string_view routing_key, std::string_view body,
                                   std::string_view message_id) {
  if (!connection_.open()) return Status(StatusCode::kIoError, "not connected");
  while (unconfirmed() >= options_.window_max) {
    if (Status s = ReadConfirms(); !s.ok()) return s;
  }
  amqp_basic_properties_t props;
  std::memset(&props, 0, sizeof props);
  props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_CONTENT_ENCODING_FLAG |
                 AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG;
  props.content_type = amqp_cstring_bytes("application/json");
  props.content_encoding = amqp_cstring_bytes("utf-8");
  props.delivery_mode = 2;  // persistent
  props.message_id = Bytes(message_id);
  const int rc = amqp_basic_publish(connection_.get(), 1, Bytes(options_.exchange),
                                    Bytes(routing_key), options_.mandatory ? 1 : 0,
                                    /*immediate=*/0, &props, Bytes(body));
  if (rc != AMQP_STATUS_OK) {
    return Status(StatusCode::kIoError, std::string("basic.publish: ") + amqp_error_string2(rc));
  }
  ++next_tag_;
  ++counters_.published;
  settled_.push_back(false);
  return Status::Ok();
}

Status ConfirmedPublisher::WaitForConfirms() {
  while (unconfirmed() > 0) {
    if (Status s = ReadConfirms(); !s.ok()) return s;
  }
  return Status::Ok();
}

Status ConfirmedPublisher::ReadConfirms() {
  amqp_connection_state_t conn = connection_.get();
  timeval wait = Timeval(options_.timeout_ms);
  timeval immediate{0, 0};
  for (bool first = true;; first = false) {
    amqp_frame_t frame;
    const int rc = amqp_simple_wait_frame_noblock(conn, &frame, first ? &wait : &immediate);
    if (rc == AMQP_STATUS_TIMEOUT) {
      if (!first) break;  // nothing more has arrived
      return Status(StatusCode::kTimedOut, "no confirm from the broker within " +
                                               std::to_string(options_.timeout_ms) + " ms");
    }
    if (rc != AMQP_STATUS_OK) {
      return Status(StatusCode::kIoError, std::string("read: ") + amqp_error_string2(rc));
    }
    if (Status s = HandleFrame(frame); !s.ok()) return s;
  }
  if (!amqp_frames_enqueued(conn) && !amqp_data_in_buffer(conn)) amqp_maybe_release_buffers(conn);
  if (on_confirms_) on_confirms_(counters_);
  return Status::Ok();
}

Status ConfirmedPublisher::HandleFrame(const amqp_frame_t& frame) {
  if (frame.frame_type != AMQP_FRAME_METHOD) return Status::Ok();  // heartbeat, stray content
  amqp_connection_state_t conn = connection_.get();
  const amqp_method_t& method = frame.payload.method;
  switch (method.id) {
    case AMQP_BASIC_ACK_METHOD: {
      const auto* m = static_cast<const amqp_basic_ack_t*>(method.decoded);
      Settle(m->delivery_tag, m->multiple != 0, true);
      return Status::Ok();
    }
    case AMQP_BASIC_NACK_METHOD: {
      const auto* m = static_cast<const amqp_basic_nack_t*>(method.decoded);
      Settle(m->delivery_tag, m->multiple != 0, false);
      return Status::Ok();
    }
    case AMQP_BASIC_RETURN_METHOD: {
      // The returned message's header and body follow; a confirm (ack) for
      // it comes after them.
      ++counters_.returned;
      amqp_message_t message;
      const amqp_rpc_reply_t r = amqp_read_message(conn, frame.channel, &message, 0);
      if (r.reply_type != AMQP_RESPONSE_NORMAL) {
        return daemon::AmqpReplyStatus(r, "read a returned message");
      }
      amqp_destroy_message(&message);
      return Status::Ok();
    }
    case AMQP_CHANNEL_CLOSE_METHOD: {
      const auto* m = static_cast<const amqp_channel_close_t*>(method.decoded);
      return Status(StatusCode::kIoError, "channel closed by the broker: " +
                                              std::to_string(m->reply_code) + " " +
                                              Text(m->reply_text));
    }
    case AMQP_CONNECTION_CLOSE_METHOD: {
      const auto* m = static_cast<const amqp_connection_close_t*>(method.decoded);
      return Status(StatusCode::kIoError, "connection closed by the broker: " +
                                              std::to_string(m->reply_code) + " " +
                                              Text(m->reply_text));
    }
    default:
      return Status::Ok();
  }
}

void ConfirmedPublisher::Settle(uint64_t delivery_tag, bool multiple, bool ack) {
  uint64_t& counter = ack ? counters_.acked : counters_.nacked;
  if (delivery_tag < first_unsettled_ || delivery_tag >= next_tag_) return;  // unknown tag
  const uint64_t from = multiple ? first_unsettled_ : delivery_tag;
  for (uint64_t tag = from; tag <= delivery_tag; ++tag) {
    const size_t i = static_cast<size_t>(tag - first_unsettled_);
    if (!settled_[i]) {
      settled_[i] = true;
      ++counter;
    }
  }
  while (!settled_.empty() && settled_.front()) {
    settled_.pop_front();
    ++first_unsettled_;
  }
}

}  // namespace postspool::bench
