// Talking to RabbitMQ directly, as the baselines do (rabbitmq-c, blocking
// API, channel 1): a connection (AmqpConnection) and a publisher with
// publisher confirms and a bounded window of unconfirmed messages
// (ConfirmedPublisher). The harness uses the publisher long-lived for the
// broker's ceiling, and once per post (connect, login, channel,
// confirm.select, publish, wait for the confirm, close) for the naive
// baseline.
#pragma once

#include <amqp.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <string_view>

#include "status.h"

namespace postspool::bench {

struct BrokerAddress {
  std::string host = "127.0.0.1";
  int port = 5672;
  std::string user = "guest";
  std::string password = "guest";
  std::string vhost = "/";
};

// One AMQP connection with channel 1 open; no heartbeats.
class AmqpConnection {
 public:
  AmqpConnection() = default;
  ~AmqpConnection() { Close(); }
  AmqpConnection(const AmqpConnection&) = delete;
  AmqpConnection& operator=(const AmqpConnection&) = delete;

  // Connects, logs in and opens channel 1; `timeout_ms` bounds the TCP
  // connect and each RPC.
  Status Open(const BrokerAddress& address, int timeout_ms);
  // connection.close (waiting for close-ok) and frees the connection.
  void Close();
  bool open() const { return conn_ != nullptr; }
  amqp_connection_state_t get() const { return conn_; }

  // A string property of the broker's connection.start, e.g. "version";
  // empty when absent.
  std::string ServerProperty(std::string_view key) const;
  // Messages ready in `queue` (queue.declare with passive set).
  Status QueueMessageCount(const std::string& queue, uint32_t* count);
  // The status of the last RPC; `what` names it.
  Status RpcStatus(const char* what) const;

 private:
  amqp_connection_state_t conn_ = nullptr;
};

struct PublishCounters {
  uint64_t published = 0;
  uint64_t acked = 0;
  uint64_t nacked = 0;
  uint64_t returned = 0;  // basic.return: unroutable (mandatory)
};

class ConfirmedPublisher {
 public:
  struct Options {
    std::string exchange;
    uint32_t window_max = 1000;  // unconfirmed messages in flight
    bool mandatory = true;       // as postspoold publishes (publish_mandatory)
    int timeout_ms = 30000;      // connect, each RPC, each wait for a confirm
  };

  // Connects and selects publisher confirms.
  Status Open(const BrokerAddress& address, const Options& options);
  void Close() { connection_.Close(); }

  // Publishes one persistent message with the properties postspoold sets
  // (content type application/json, encoding utf-8, delivery mode 2,
  // message_id). While window_max messages are unconfirmed it first reads
  // confirms, blocking for at most timeout_ms for each.
  Status Publish(std::string_view routing_key, std::string_view body,
                 std::string_view message_id);
  // Reads confirms until every published message is acked or nacked.
  Status WaitForConfirms();

  // Called after each batch of confirms has been read, with the counters
  // (e.g. to time when the n-th message was confirmed).
  void set_on_confirms(std::function<void(const PublishCounters&)> f) {
    on_confirms_ = std::move(f);
  }

  const PublishCounters& counters() const { return counters_; }
  uint64_t unconfirmed() const { return counters_.published - counters_.acked - counters_.nacked; }
  AmqpConnection& connection() { return connection_; }

 private:
  // Blocks (timeout_ms at most) for one frame, handles it, then handles the
  // frames already received without blocking.
  Status ReadConfirms();
  Status HandleFrame(const amqp_frame_t& frame);
  void Settle(uint64_t delivery_tag, bool multiple, bool ack);

  AmqpConnection connection_;
  Options options_;
  uint64_t next_tag_ = 1;
  // settled_[i] is whether delivery tag first_unsettled_ + i is settled.
  uint64_t first_unsettled_ = 1;
  std::deque<bool> settled_;
  PublishCounters counters_;
  std::function<void(const PublishCounters&)> on_confirms_;
};

}  // namespace postspool::bench
