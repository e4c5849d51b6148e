// AmqpSession: one connection to one broker with one channel (1) in
// publisher-confirm mode, over rabbitmq-c's blocking API. Thin glue: it
// turns rabbitmq-c calls and frames into Status values and Handler calls and
// decides nothing; the forwarder decides what to do about them.
//
// Not thread-safe: the forwarder thread's own. The socket descriptor (fd())
// may be shut down from another thread to interrupt a blocked write, under
// the forwarder's own lock (see Forwarder).
#pragma once

#include <amqp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "amqp_url.h"
#include "status.h"

namespace postspool::daemon {

class AmqpSession {
 public:
  struct Options {
    uint32_t heartbeat_s = 30;
    uint32_t connect_timeout_ms = 5000;  // TCP and TLS connect, login, each setup RPC
    std::string tls_ca_file;             // empty: the system's CA bundle
    std::string tls_cert_file;
    std::string tls_key_file;
    bool tls_verify_peer = true;
    bool tls_verify_hostname = true;
    std::string exchange;
    bool exchange_declare = true;  // declare it durable topic, or only check it exists
  };

  // Receives what the broker sends on the connection.
  class Handler {
   public:
    virtual ~Handler() = default;
    virtual void OnAck(uint64_t delivery_tag, bool multiple) = 0;
    virtual void OnNack(uint64_t delivery_tag, bool multiple) = 0;
    // A mandatory message could not be routed; its ack follows.
    virtual void OnReturn(std::string_view message_id, int reply_code,
                          std::string_view reply_text) = 0;
    virtual void OnBlocked(std::string_view reason) = 0;
    virtual void OnUnblocked() = 0;
  };

  // Connects (within connect_timeout_ms), logs in advertising the
  // capabilities publisher_confirms, connection.blocked and basic.nack,
  // opens channel 1, selects confirms and declares (or passively checks) the
  // exchange. The status says which step failed and why, in words:
  //   kNotFound          the exchange does not exist (exchange_declare false)
  //   kInvalidArgument   the exchange exists with other properties, or the
  //                      TLS files cannot be loaded
  //   kPermissionDenied  the broker refused the login or an operation
  //   kIoError           anything else (refused, unreachable, TLS, timeout)
  static Status Open(const BrokerUrl& url, const Options& options,
                     std::unique_ptr<AmqpSession>* out);
  ~AmqpSession();  // closes the socket without the closing handshake
  AmqpSession(const AmqpSession&) = delete;
  AmqpSession& operator=(const AmqpSession&) = delete;

  // The socket, for poll().
  int fd() const;
  // The heartbeat the broker and we agreed on, seconds (0: none).
  int heartbeat_s() const;

  // basic.publish on channel 1 with the post properties (amqp_properties.h).
  // Blocks while the socket's send buffer is full. An error means the
  // connection is unusable.
  Status Publish(std::string_view exchange, std::string_view routing_key,
                 std::string_view body, std::string_view message_id, bool mandatory);

  // Batched publishing, for the forwarder's rounds. On a plain TCP
  // connection, AppendPublish encodes the same basic.publish as Publish
  // (publish_frames.h) into a pending buffer, and Flush writes the buffer to
  // the socket in one write (or a few, if the send buffer fills); the
  // buffer is flushed by AppendPublish itself once it holds kFlushBytes. On a
  // TLS connection AppendPublish is Publish (rabbitmq-c's TLS socket cannot
  // be bypassed) and Flush has nothing to do. Channel 1 counts delivery tags
  // in the order of the appends, as with Publish. An error from either
  // means the connection is unusable (frames may have been written in
  // part); what was appended since the last successful Flush may or may not
  // have reached the broker. Flush before calling ReadFrames or Close.
  static constexpr size_t kFlushBytes = size_t{1} << 20;
  Status AppendPublish(std::string_view exchange, std::string_view routing_key,
                       std::string_view body, std::string_view message_id, bool mandatory);
  // Waits at most the write timeout (the negotiated heartbeat interval, or
  // connect_timeout_ms without heartbeats) for the broker to take the
  // bytes: a broker that reads nothing for that long is a broken path
  // (kIoError).
  Status Flush();
  size_t pending_bytes() const { return pending_.size(); }
  // The delivery tag the broker gives the next publish on channel 1 (tags
  // count every publish since confirm.select, from 1): a publisher that
  // takes over a channel that has published goes on from there.
  uint64_t next_delivery_tag() const { return published_ + 1; }

  // Handles every frame that is available without waiting (rabbitmq-c's
  // queued frames and buffered bytes first, then the socket: on plain TCP
  // one read of it, what came later is for the next call, which the
  // caller's poll of fd() prompts), and sends a heartbeat when one is due.
  // Returns an error when the connection is unusable (closed by the broker,
  // with its reply code and text; a missed heartbeat; a socket error).
  Status ReadFrames(Handler* handler);

  // Frames or bytes rabbitmq-c holds that a poll() on fd() would not
  // report (read while publishing): call ReadFrames before sleeping.
  bool HasBufferedInput() const;

  // The closing handshake (connection.close, waiting for close-ok at most
  // connect_timeout_ms). Best effort: for a clean stop.
  void Close();

 private:
  explicit AmqpSession(amqp_connection_state_t conn);
  Status HandleFrame(const amqp_frame_t& frame, Handler* handler);
  void EndReturn(Handler* handler);

  amqp_connection_state_t conn_;
  // Set by Open: plain TCP (AppendPublish writes the socket itself), the
  // negotiated frame_max, the bound of one Flush.
  bool direct_writes_ = false;
  uint64_t published_ = 0;  // basic.publish sent (or appended) on channel 1
  uint32_t frame_max_ = 0;
  uint32_t write_timeout_ms_ = 0;
  std::string pending_;  // encoded frames not written yet
  // A basic.return's content (header, then body frames) follows its method.
  bool in_return_ = false;
  bool return_header_seen_ = false;
  uint64_t return_body_remaining_ = 0;
  std::string return_message_id_;
  int return_reply_code_ = 0;
  std::string return_reply_text_;
};

// A status for an rpc reply of rabbitmq-c: ok for a normal reply, else an
// error saying what the broker or the library said, prefixed with `step`
// (e.g. "login"). Shared with the tests' and benchmarks' AMQP clients.
Status AmqpReplyStatus(const amqp_rpc_reply_t& reply, const std::string& step);

}  // namespace postspool::daemon
