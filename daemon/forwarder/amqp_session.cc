#include "amqp_session.h"

#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "amqp_properties.h"
#include "publish_frames.h"
#include "unique_fd.h"

namespace postspool::daemon {
namespace {

constexpr amqp_channel_t kChannel = 1;
constexpr int kFrameMax = 131072;

amqp_bytes_t Bytes(std::string_view s) {
  // rabbitmq-c takes non-const pointers but only reads through them.
  return amqp_bytes_t{s.size(), const_cast<char*>(s.data())};
}

std::string ToString(amqp_bytes_t b) {
  return std::string(static_cast<const char*>(b.bytes), b.len);
}

timeval ToTimeval(uint32_t ms) {
  timeval tv;
  tv.tv_sec = static_cast<time_t>(ms / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000);
  return tv;
}

StatusCode CodeForReply(int reply_code) {
  switch (reply_code) {
    case AMQP_ACCESS_REFUSED:  // 403
    case AMQP_NOT_ALLOWED:     // 530: e.g. no access to the vhost
      return StatusCode::kPermissionDenied;
    case AMQP_NOT_FOUND:  // 404
      return StatusCode::kNotFound;
    case AMQP_PRECONDITION_FAILED:  // 406: e.g. exchange exists with other properties
      return StatusCode::kInvalidArgument;
    default:
      return StatusCode::kIoError;
  }
}

// `step` names what was being done, e.g. "login".
Status FromReply(const amqp_rpc_reply_t& r, const std::string& step) {
  switch (r.reply_type) {
    case AMQP_RESPONSE_NORMAL:
      return Status::Ok();
    case AMQP_RESPONSE_NONE:
      return Status(StatusCode::kIoError, step + ": no reply from the broker");
    case AMQP_RESPONSE_LIBRARY_EXCEPTION:
      return Status(StatusCode::kIoError, step + ": " + amqp_error_string2(r.library_error));
    case AMQP_RESPONSE_SERVER_EXCEPTION:
      if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
        const auto* m = static_cast<const amqp_connection_close_t*>(r.reply.decoded);
        return Status(CodeForReply(m->reply_code),
                      step + ": the broker closed the connection: " +
                          std::to_string(m->reply_code) + " " + ToString(m->reply_text));
      }
      if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
        const auto* m = static_cast<const amqp_channel_close_t*>(r.reply.decoded);
        return Status(CodeForReply(m->reply_code),
                      step + ": the broker closed the channel: " +
                          std::to_string(m->reply_code) + " " + ToString(m->reply_text));
      }
      return Status(StatusCode::kIoError, step + ": unexpected reply from the broker");
  }
  return Status(StatusCode::kIoError, step + ": unknown reply type");
}

// rabbitmq-c reports a failed TCP connect only as "a socket error occurred".
// To tell the operator why (refused, unreachable, timed out), connect once
// more, directly, and report that errno.
std::string DescribeConnectFailure(const std::string& host, int port, uint32_t timeout_ms) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (::getaddrinfo(host.c_str(), service.c_str(), &hints, &res) != 0 || res == nullptr) {
    return "cannot resolve the host name";
  }
  int err = 0;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                         ai->ai_protocol));
    if (!fd.valid()) {
      err = errno;
      continue;
    }
    if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) == 0) {
      err = 0;
      break;
    }
    if (errno != EINPROGRESS) {
      err = errno;
      continue;
    }
    pollfd p{fd.get(), POLLOUT, 0};
    const int n = ::poll(&p, 1, static_cast<int>(timeout_ms));
    if (n == 0) {
      err = ETIMEDOUT;
      continue;
    }
    socklen_t len = sizeof err;
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err == 0) break;
  }
  ::freeaddrinfo(res);
  if (err == 0) return "the connection failed (it works now: the broker may have just started)";
  return std::strerror(err);
}

// The CA bundle OpenSSL would use by default; rabbitmq-c does not load
// OpenSSL's default verify paths itself, and the daemon does not link
// OpenSSL, so the file is found here: $SSL_CERT_FILE, then the usual
// locations (Debian/Ubuntu, Fedora/RHEL, openSUSE, others).
std::string SystemCaBundle() {
  if (const char* env = std::getenv("SSL_CERT_FILE"); env != nullptr && *env != '\0') return env;
  for (const char* path : {"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
                           "/etc/ssl/ca-bundle.pem", "/etc/ssl/cert.pem"}) {
    struct stat st;
    if (::stat(path, &st) == 0 && S_ISREG(st.st_mode)) return path;
  }
  return {};
}

amqp_table_entry_t BoolEntry(const char* key, bool value) {
  amqp_table_entry_t e;
  e.key = amqp_cstring_bytes(key);
  e.value.kind = AMQP_FIELD_KIND_BOOLEAN;
  e.value.value.boolean = value ? 1 : 0;
  return e;
}

amqp_table_entry_t StringEntry(const char* key, const char* value) {
  amqp_table_entry_t e;
  e.key = amqp_cstring_bytes(key);
  e.value.kind = AMQP_FIELD_KIND_UTF8;
  e.value.value.bytes = amqp_cstring_bytes(value);
  return e;
}

}  // namespace

Status AmqpReplyStatus(const amqp_rpc_reply_t& reply, const std::string& step) {
  return FromReply(reply, step);
}

AmqpSession::AmqpSession(amqp_connection_state_t conn) : conn_(conn) {}

AmqpSession::~AmqpSession() { amqp_destroy_connection(conn_); }

int AmqpSession::fd() const { return amqp_get_sockfd(conn_); }

int AmqpSession::heartbeat_s() const { return amqp_get_heartbeat(conn_); }

Status AmqpSession::Open(const BrokerUrl& url, const Options& options,
                         std::unique_ptr<AmqpSession>* out) {
  amqp_connection_state_t conn = amqp_new_connection();
  if (conn == nullptr) return Status(StatusCode::kIoError, "out of memory");
  std::unique_ptr<AmqpSession> session(new AmqpSession(conn));

  amqp_socket_t* socket = url.tls ? amqp_ssl_socket_new(conn) : amqp_tcp_socket_new(conn);
  if (socket == nullptr) {
    return Status(StatusCode::kIoError,
                  url.tls ? "cannot set up TLS (OpenSSL initialisation failed)"
                          : "cannot create a socket");
  }
  if (url.tls) {
    amqp_ssl_socket_set_verify_peer(socket, options.tls_verify_peer ? 1 : 0);
    amqp_ssl_socket_set_verify_hostname(socket, options.tls_verify_hostname ? 1 : 0);
    const std::string ca = options.tls_ca_file.empty() ? SystemCaBundle() : options.tls_ca_file;
    if (!ca.empty()) {
      if (int rc = amqp_ssl_socket_set_cacert(socket, ca.c_str()); rc != AMQP_STATUS_OK) {
        return Status(StatusCode::kInvalidArgument,
                      "cannot load the TLS CA certificates from " + ca + " (tls_ca_file): " +
                          amqp_error_string2(rc));
      }
    } else if (options.tls_verify_peer) {
      return Status(StatusCode::kInvalidArgument,
                    "no system CA bundle found to verify the broker's certificate: set "
                    "tls_ca_file");
    }
    if (!options.tls_cert_file.empty()) {
      const std::string& key =
          options.tls_key_file.empty() ? options.tls_cert_file : options.tls_key_file;
      if (int rc = amqp_ssl_socket_set_key(socket, options.tls_cert_file.c_str(), key.c_str());
          rc != AMQP_STATUS_OK) {
        return Status(StatusCode::kInvalidArgument,
                      "cannot load the TLS client certificate " + options.tls_cert_file +
                          " and key " + key + " (tls_cert_file, tls_key_file): " +
                          amqp_error_string2(rc));
      }
    }
  }

  timeval timeout = ToTimeval(options.connect_timeout_ms);
  // Bounds the protocol handshake and the setup RPCs (and the closing one).
  amqp_set_handshake_timeout(conn, &timeout);
  amqp_set_rpc_timeout(conn, &timeout);
  if (int rc = amqp_socket_open_noblock(socket, url.host.c_str(), url.port, &timeout);
      rc != AMQP_STATUS_OK) {
    std::string why = amqp_error_string2(rc);
    if (rc == AMQP_STATUS_SOCKET_ERROR) {
      why = DescribeConnectFailure(url.host, url.port, options.connect_timeout_ms);
    } else if (rc == AMQP_STATUS_TIMEOUT) {
      why = "no answer within connect_timeout_ms = " + std::to_string(options.connect_timeout_ms);
    } else if (rc == AMQP_STATUS_SSL_PEER_VERIFY_FAILED) {
      const std::string ca = options.tls_ca_file.empty() ? SystemCaBundle() : options.tls_ca_file;
      return Status(StatusCode::kPermissionDenied,
                    "TLS connect: the broker's certificate is not signed by a CA in " + ca +
                        " (tls_ca_file), or it has expired; set tls_ca_file to the CA that "
                        "signed it");
    } else if (rc == AMQP_STATUS_SSL_HOSTNAME_VERIFY_FAILED) {
      return Status(StatusCode::kPermissionDenied,
                    "TLS connect: the broker's certificate does not name host '" + url.host +
                        "' (use the name in the certificate in post_broker, or set "
                        "tls_verify_hostname = false)");
    }
    return Status(StatusCode::kIoError, std::string(url.tls ? "TLS connect: " : "connect: ") + why);
  }

  // Capabilities: without them the broker sends no basic.nack and no
  // connection.blocked (rabbitmq-c adds its own defaults, such as
  // authentication_failure_close, to these).
  amqp_table_entry_t capabilities[] = {
      BoolEntry("publisher_confirms", true),
      BoolEntry("connection.blocked", true),
      BoolEntry("basic.nack", true),
      BoolEntry("authentication_failure_close", true),
  };
  amqp_table_entry_t properties[3] = {
      StringEntry("product", "postspoold"),
      StringEntry("information", "postspool: file change notifications (Sarracenia v03)"),
  };
  properties[2].key = amqp_cstring_bytes("capabilities");
  properties[2].value.kind = AMQP_FIELD_KIND_TABLE;
  properties[2].value.value.table.num_entries = std::size(capabilities);
  properties[2].value.value.table.entries = capabilities;
  amqp_table_t client_properties{static_cast<int>(std::size(properties)), properties};
  const int heartbeat = static_cast<int>(std::min<uint32_t>(options.heartbeat_s, 65535));
  if (Status s = FromReply(amqp_login_with_properties(conn, url.vhost.c_str(), 0, kFrameMax,
                                                       heartbeat, &client_properties,
                                                       AMQP_SASL_METHOD_PLAIN, url.user.c_str(),
                                                       url.password.c_str()),
                           "login as user '" + url.user + "' to vhost '" + url.vhost + "'");
      !s.ok()) {
    return s;
  }
  amqp_channel_open(conn, kChannel);
  if (Status s = FromReply(amqp_get_rpc_reply(conn), "open channel"); !s.ok()) return s;
  amqp_confirm_select(conn, kChannel);
  if (Status s = FromReply(amqp_get_rpc_reply(conn), "select publisher confirms"); !s.ok()) {
    return s;
  }
  amqp_exchange_declare(conn, kChannel, Bytes(options.exchange), amqp_cstring_bytes("topic"),
                        options.exchange_declare ? 0 : 1, /*durable=*/1, /*auto_delete=*/0,
                        /*internal=*/0, amqp_empty_table);
  Status s = FromReply(amqp_get_rpc_reply(conn),
                       (options.exchange_declare ? "declare exchange '" : "check exchange '") +
                           options.exchange + "'");
  if (!s.ok()) {
    if (s.code() == StatusCode::kNotFound && !options.exchange_declare) {
      return Status(StatusCode::kNotFound,
                    "configuration error: exchange '" + options.exchange +
                        "' does not exist in vhost '" + url.vhost +
                        "' and exchange_declare is false: create it (a durable topic exchange) "
                        "or set exchange_declare = true");
    }
    if (s.code() == StatusCode::kInvalidArgument) {
      return Status(StatusCode::kInvalidArgument,
                    "configuration error: " + s.message() +
                        " (postspoold declares it as a durable topic exchange; delete the "
                        "existing one or set exchange_declare = false)");
    }
    return s;
  }
  session->direct_writes_ = !url.tls;
  session->frame_max_ = static_cast<uint32_t>(amqp_get_frame_max(conn));
  const int negotiated_heartbeat_s = amqp_get_heartbeat(conn);
  session->write_timeout_ms_ = negotiated_heartbeat_s > 0
                                   ? static_cast<uint32_t>(negotiated_heartbeat_s) * 1000
                                   : options.connect_timeout_ms;
  *out = std::move(session);
  return Status::Ok();
}

Status AmqpSession::Publish(std::string_view exchange, std::string_view routing_key,
                            std::string_view body, std::string_view message_id,
                            bool mandatory) {
  amqp_basic_properties_t props;
  std::memset(&props, 0, sizeof props);
  props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_CONTENT_ENCODING_FLAG |
                 AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG;
  props.content_type = Bytes(kPostContentType);
  props.content_encoding = Bytes(kPostContentEncoding);
  props.delivery_mode = kPostDeliveryMode;
  props.message_id = Bytes(message_id);
  const int rc = amqp_basic_publish(conn_, kChannel, Bytes(exchange), Bytes(routing_key),
                                    mandatory ? 1 : 0, /*immediate=*/0, &props, Bytes(body));
  if (rc != AMQP_STATUS_OK) {
    return Status(StatusCode::kIoError, std::string("publish: ") + amqp_error_string2(rc));
  }
  ++published_;
  return Status::Ok();
}

Status AmqpSession::AppendPublish(std::string_view exchange, std::string_view routing_key,
                                  std::string_view body, std::string_view message_id,
                                  bool mandatory) {
  if (!direct_writes_) return Publish(exchange, routing_key, body, message_id, mandatory);
  PublishFrame m;
  m.channel = kChannel;
  m.exchange = exchange;
  m.routing_key = routing_key;
  m.body = body;
  m.message_id = message_id;
  m.mandatory = mandatory;
  if (Status s = AppendPublishFrames(m, frame_max_, &pending_); !s.ok()) {
    // Nothing of it was appended, but the channel's delivery tags would no
    // longer match the caller's count if it went on: the same as a failed
    // publish, the connection is given up.
    return Status(StatusCode::kIoError, "publish: " + s.message());
  }
  ++published_;
  if (pending_.size() >= kFlushBytes) return Flush();
  return Status::Ok();
}

// Writes to rabbitmq-c's socket behind its back. That is safe because
// rabbitmq-c writes only from inside its own calls (amqp_basic_publish, the
// heartbeats sent from amqp_simple_wait_frame_noblock, close-ok, Close), and
// Flush returns only once every byte of the buffer is written (or the
// connection is given up): our frames and rabbitmq-c's never interleave.
// rabbitmq-c does not see our writes, so it may send a heartbeat sooner than
// needed: harmless.
Status AmqpSession::Flush() {
  if (pending_.empty()) return Status::Ok();
  using Clock = std::chrono::steady_clock;
  const int fd = amqp_get_sockfd(conn_);
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(write_timeout_ms_);
  size_t done = 0;
  Status result;
  while (done < pending_.size()) {
    const ssize_t n = ::send(fd, pending_.data() + done, pending_.size() - done,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // The broker is not reading (flow control, or a stalled node): wait
      // for room, within the bound.
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) {
        result = Status(StatusCode::kIoError,
                        "publish: the broker took no data for " +
                            std::to_string(write_timeout_ms_) + " ms (" +
                            std::to_string(pending_.size() - done) + " bytes left to write)");
        break;
      }
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, static_cast<int>(left) + 1) < 0 && errno != EINTR) {
        const int err = errno;
        result = Status(StatusCode::kIoError,
                        std::string("publish: poll on the broker socket: ") + std::strerror(err),
                        err);
        break;
      }
      continue;
    }
    const int err = n == 0 ? EPIPE : errno;
    result = Status(StatusCode::kIoError,
                    std::string("publish: write to the broker: ") + std::strerror(err), err);
    break;
  }
  pending_.clear();
  // Bounded memory: a buffer grown past the flush size by one large post
  // does not stay that large.
  if (pending_.capacity() > 2 * kFlushBytes) pending_.shrink_to_fit();
  return result;
}

Status AmqpSession::ReadFrames(Handler* handler) {
  // Posts appended and not flushed would sit unsent while their confirms
  // are awaited, and a close-ok sent from here would go before them: the
  // caller flushes every round before it reads.
  assert(pending_.empty());
  for (;;) {
    amqp_frame_t frame;
    // 1 µs rather than 0: rabbitmq-c notices that the broker's heartbeats
    // stopped only when its receive deadline comes before the wait's, and a
    // zero timeout is earlier than every deadline.
    timeval tv{0, 1};
    const int rc = amqp_simple_wait_frame_noblock(conn_, &frame, &tv);
    if (rc == AMQP_STATUS_TIMEOUT) break;
    if (rc != AMQP_STATUS_OK) {
      return Status(StatusCode::kIoError,
                    rc == AMQP_STATUS_HEARTBEAT_TIMEOUT
                        ? "no heartbeat from the broker for " + std::to_string(2 * heartbeat_s()) +
                              " s (heartbeat_s): the connection is dead"
                        : std::string("read: ") + amqp_error_string2(rc));
    }
    if (Status s = HandleFrame(frame, handler); !s.ok()) return s;
    // On plain TCP, once what the last read brought is used up, stop rather
    // than read again: that read would find nothing (EAGAIN, then
    // rabbitmq-c's poll), two system calls per round, and anything that
    // arrived meanwhile makes the caller's next poll return at once. (Over
    // TLS, OpenSSL may hold bytes that a poll does not report.)
    if (direct_writes_ && !HasBufferedInput()) break;
  }
  // Frees the memory decoded frames used (bounded memory: without it the
  // connection's pools only grow).
  amqp_maybe_release_buffers(conn_);
  return Status::Ok();
}

void AmqpSession::EndReturn(Handler* handler) {
  in_return_ = false;
  handler->OnReturn(return_message_id_, return_reply_code_, return_reply_text_);
}

Status AmqpSession::HandleFrame(const amqp_frame_t& frame, Handler* handler) {
  if (frame.frame_type == AMQP_FRAME_HEADER) {
    if (in_return_ && !return_header_seen_) {
      return_header_seen_ = true;
      const auto* props = static_cast<const amqp_basic_properties_t*>(frame.payload.properties.decoded);
      return_message_id_.clear();
      if (props != nullptr && (props->_flags & AMQP_BASIC_MESSAGE_ID_FLAG) != 0) {
        return_message_id_ = ToString(props->message_id);
      }
      return_body_remaining_ = frame.payload.properties.body_size;
      if (return_body_remaining_ == 0) EndReturn(handler);
    }
    return Status::Ok();
  }
  if (frame.frame_type == AMQP_FRAME_BODY) {
    if (in_return_ && return_header_seen_) {
      return_body_remaining_ -= std::min<uint64_t>(return_body_remaining_,
                                                   frame.payload.body_fragment.len);
      if (return_body_remaining_ == 0) EndReturn(handler);
    }
    return Status::Ok();
  }
  if (frame.frame_type != AMQP_FRAME_METHOD) return Status::Ok();

  const amqp_method_t& method = frame.payload.method;
  if (in_return_) {
    // A method before the returned message's content ended: report what we
    // have, so that the return is not lost.
    EndReturn(handler);
  }
  switch (method.id) {
    case AMQP_BASIC_ACK_METHOD: {
      const auto* m = static_cast<const amqp_basic_ack_t*>(method.decoded);
      handler->OnAck(m->delivery_tag, m->multiple != 0);
      break;
    }
    case AMQP_BASIC_NACK_METHOD: {
      const auto* m = static_cast<const amqp_basic_nack_t*>(method.decoded);
      handler->OnNack(m->delivery_tag, m->multiple != 0);
      break;
    }
    case AMQP_BASIC_RETURN_METHOD: {
      const auto* m = static_cast<const amqp_basic_return_t*>(method.decoded);
      in_return_ = true;
      return_header_seen_ = false;
      return_body_remaining_ = 0;
      return_message_id_.clear();
      return_reply_code_ = m->reply_code;
      return_reply_text_ = ToString(m->reply_text);
      break;
    }
    case AMQP_CONNECTION_BLOCKED_METHOD: {
      const auto* m = static_cast<const amqp_connection_blocked_t*>(method.decoded);
      handler->OnBlocked(ToString(m->reason));
      break;
    }
    case AMQP_CONNECTION_UNBLOCKED_METHOD:
      handler->OnUnblocked();
      break;
    case AMQP_CONNECTION_CLOSE_METHOD: {
      const auto* m = static_cast<const amqp_connection_close_t*>(method.decoded);
      Status s(CodeForReply(m->reply_code),
               "the broker closed the connection: " + std::to_string(m->reply_code) + " " +
                   ToString(m->reply_text));
      amqp_connection_close_ok_t ok{};
      amqp_send_method(conn_, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
      return s;
    }
    case AMQP_CHANNEL_CLOSE_METHOD: {
      const auto* m = static_cast<const amqp_channel_close_t*>(method.decoded);
      Status s(CodeForReply(m->reply_code),
               "the broker closed the channel: " + std::to_string(m->reply_code) + " " +
                   ToString(m->reply_text));
      amqp_channel_close_ok_t ok{};
      amqp_send_method(conn_, frame.channel, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
      return s;
    }
    default:
      break;  // nothing else concerns a publisher
  }
  return Status::Ok();
}

bool AmqpSession::HasBufferedInput() const {
  return amqp_frames_enqueued(conn_) != 0 || amqp_data_in_buffer(conn_) != 0;
}

void AmqpSession::Close() {
  assert(pending_.empty());
  amqp_connection_close(conn_, AMQP_REPLY_SUCCESS);
}

}  // namespace postspool::daemon
