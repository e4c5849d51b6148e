// BrokerPath: decides, without any I/O, when the forwarder's path to the
// broker is broken although the connection is up, and what to do about it.
// The forwarder feeds it the broker's confirms and asks it after each round.
//
// Why (issue 19): RabbitMQ (3.10 seen) can refuse with basic.nack every
// publish on a channel opened while a quorum queue elects a leader, for as
// long as that channel lives, while fresh connections are acked. A frozen or
// partitioned node confirms nothing while TCP and even heartbeats may hold
// for a while. Neither ends by waiting; a new connection ends both.
//
// The path is *refused* when the broker nacked posts and acked none for
// refused_ms since the first of those nacks; *silent* when posts wait (in
// flight, or waiting to be published again) and the broker sent no ack nor
// nack for silent_ms. While the broker blocks publishing
// (connection.blocked: an alarm) neither is judged: that is a state the
// broker announces, and it ends by itself.
//
// The policy, bounded: the first step is a new connection to the same
// broker; each later one moves to the next broker of post_broker. After
// step n the next step waits at least min(wait_max_ms, refused_ms * 2^n) and
// for the fault to be seen again on the new connection. An ack resets the
// steps. A fault of the other kind is not held by the last step's wait
// (the steps go on, so faults that alternate still move through the
// brokers): a cluster that was silent (a frozen node holding a quorum
// queue's leader) and then elects a new leader may refuse on the connection
// it has, and waiting out the silent steps' doubled wait would only delay
// delivery. (A new channel on the same connection would do for the nack case,
// but rabbitmq-c's blocking RPCs would have to run while the old channel's
// confirms still arrive; a connection is cheap for one publisher per node.)
//
// Not thread-safe: the forwarder thread's own.
#pragma once

#include <chrono>
#include <cstdint>

namespace postspool::daemon {

class BrokerPath {
 public:
  using Clock = std::chrono::steady_clock;

  struct Options {
    uint32_t refused_ms = 1000;
    uint32_t silent_ms = 5000;
    uint32_t wait_max_ms = 30000;
  };
  enum class Fault { kNone, kRefused, kSilent };
  enum class Step { kNone, kReconnect, kNextBroker };
  struct Verdict {
    Step step = Step::kNone;
    Fault fault = Fault::kNone;
    std::chrono::milliseconds fault_for{0};  // how long the fault lasted
    std::chrono::milliseconds hold{0};       // the least wait before another step
  };

  explicit BrokerPath(const Options& options);

  // A connection is up (new, or publishing again after connection.unblocked):
  // the clocks start over; the steps taken so far are kept.
  void OnConnected(Clock::time_point now);
  // The broker acked posts: the path works.
  void OnAck(Clock::time_point now);
  // The broker nacked posts.
  void OnNack(Clock::time_point now);
  // connection.blocked: no judgement until OnConnected.
  void OnBlocked() { blocked_ = true; }

  // After a round: `posts_wait` is true when posts are in flight or waiting
  // to be published again. A step other than kNone is to be carried out now
  // (the caller drops the connection and connects as told, then calls
  // OnConnected).
  Verdict Check(Clock::time_point now, bool posts_wait);

  // The fault seen now, without taking a step (for the status).
  Fault fault(Clock::time_point now, bool posts_wait) const;
  uint32_t steps() const { return steps_; }

 private:
  const Options options_;
  bool blocked_ = false;
  Clock::time_point first_nack_{};     // of the nacks since the last ack; {} if none
  Clock::time_point last_response_{};  // last ack or nack, or the connection
  Clock::time_point wait_since_{};     // posts wait since; {} if none wait
  Clock::time_point next_step_at_{};
  uint32_t steps_ = 0;  // since the last ack
  Fault last_fault_ = Fault::kNone;
};

const char* FaultName(BrokerPath::Fault fault);

}  // namespace postspool::daemon
