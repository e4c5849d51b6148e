// StandbySession: a second broker connection, to another node of
// post_broker, that the forwarder keeps open and idle so that it can move
// to it at once when its connection breaks (broker_standby).
//
// Why (issue 19): in RabbitMQ 3.10 a channel's first publish to a quorum
// queue asks the node that the queue's record names as its leader, with no
// timeout. While that node is frozen (stopped, or cut off by a partition)
// the publish waits until the other nodes declare it down (net_ticktime, 60 s
// by default), on whichever node the channel is: so a fresh connection to
// another node confirms nothing for about a minute. A channel that has
// published to the queue before follows the queue's leader election instead,
// and confirms again about 9 s after the freeze. The standby is therefore
// made *warm*: the forwarder swaps its two connections once, when nothing is
// in flight, so that the standby's channel has published and had a confirm
// (Forwarder::MaintainStandby). A queue first bound after that is not warm
// on the standby.
//
// While idle, the standby reads what the broker sends (heartbeats, a close,
// connection.blocked) and sends heartbeats; a standby that breaks is dropped
// and opened again later, with waits doubling from kRetryInitial to
// kRetryMax. It publishes nothing while it is the standby, so it holds no
// confirms.
//
// Not thread-safe: the forwarder thread's own.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "amqp_session.h"
#include "amqp_url.h"
#include "status.h"

namespace postspool::daemon {

class StandbySession final : private AmqpSession::Handler {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kRetryInitial{10'000};
  static constexpr std::chrono::milliseconds kRetryMax{300'000};
  // After it took over, the next standby waits this long: a new channel
  // warmed while a frozen node still leads a queue would hang in its first
  // publish (the file comment) until the cluster declares the node down.
  static constexpr std::chrono::milliseconds kReopenAfterTakeover{120'000};

  bool open() const { return session_ != nullptr; }
  // Its channel has published and had a confirm (see the file comment).
  bool warm() const { return warm_; }
  // The broker (index into post_broker) it is connected to.
  size_t broker_index() const { return index_; }
  // The broker announced connection.blocked and has not unblocked since.
  bool blocked() const { return blocked_; }
  // When an attempt to open one is due.
  Clock::time_point open_at() const { return open_at_; }

  // Opens it to `url` (index `index` of post_broker). Blocks within the
  // options' connect timeout (AmqpSession::Open). On failure it waits
  // before the next attempt (open_at()).
  Status Open(const BrokerUrl& url, size_t index, const AmqpSession::Options& options,
              Clock::time_point now);

  // Keeps it alive: handles what the broker sent and sends a heartbeat when
  // one is due. Call it when fd() is readable, and by next_tick(). A broken
  // standby is dropped (the error is returned; it is opened again later).
  Status Tend(Clock::time_point now);
  // The socket, for poll() (-1 if none); when Tend is due without input.
  int fd() const { return session_ ? session_->fd() : -1; }
  Clock::time_point next_tick() const { return next_tick_; }

  // Hands the connection over (to become the forwarder's own); the standby
  // is then closed until Put or Open. With `took_over` (the forwarder's
  // connection broke) the next Open is due kReopenAfterTakeover from `now`.
  std::unique_ptr<AmqpSession> Take(bool took_over = false,
                                    Clock::time_point now = Clock::time_point{});
  // Takes the forwarder's connection as the standby (a swap: it has nothing
  // in flight), to broker `index`; `warm` if it had a confirm.
  void Put(std::unique_ptr<AmqpSession> session, size_t index, bool warm, bool blocked,
           Clock::time_point now);
  // Closes it; the next Open is due after the current wait.
  void Drop(Clock::time_point now);

 private:
  // AmqpSession::Handler: a standby publishes nothing, so confirms and
  // returns do not come; blocked and unblocked are noted.
  void OnAck(uint64_t, bool) override {}
  void OnNack(uint64_t, bool) override {}
  void OnReturn(std::string_view, int, std::string_view) override {}
  void OnBlocked(std::string_view) override { blocked_ = true; }
  void OnUnblocked() override { blocked_ = false; }
  void ScheduleTick(Clock::time_point now);
  // The next Open is due after the current wait, which then doubles.
  void WaitBeforeOpen(Clock::time_point now);

  std::unique_ptr<AmqpSession> session_;
  size_t index_ = 0;
  bool warm_ = false;
  bool blocked_ = false;
  Clock::time_point open_at_{};
  Clock::time_point next_tick_ = Clock::time_point::max();
  std::chrono::milliseconds retry_ = kRetryInitial;
};

}  // namespace postspool::daemon
