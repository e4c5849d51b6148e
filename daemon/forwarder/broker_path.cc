#include "broker_path.h"

#include <algorithm>

namespace postspool::daemon {

using std::chrono::milliseconds;

BrokerPath::BrokerPath(const Options& options) : options_(options) {}

void BrokerPath::OnConnected(Clock::time_point now) {
  blocked_ = false;
  first_nack_ = Clock::time_point{};
  last_response_ = now;
  wait_since_ = Clock::time_point{};
}

void BrokerPath::OnAck(Clock::time_point now) {
  first_nack_ = Clock::time_point{};
  last_response_ = now;
  steps_ = 0;
  next_step_at_ = Clock::time_point{};
  last_fault_ = Fault::kNone;
}

void BrokerPath::OnNack(Clock::time_point now) {
  if (first_nack_ == Clock::time_point{}) first_nack_ = now;
  last_response_ = now;
}

BrokerPath::Fault BrokerPath::fault(Clock::time_point now, bool posts_wait) const {
  if (blocked_ || !posts_wait) return Fault::kNone;
  if (first_nack_ != Clock::time_point{} && now - first_nack_ >= milliseconds(options_.refused_ms)) {
    return Fault::kRefused;
  }
  const Clock::time_point since =
      std::max(last_response_, wait_since_ == Clock::time_point{} ? now : wait_since_);
  if (now - since >= milliseconds(options_.silent_ms)) return Fault::kSilent;
  return Fault::kNone;
}

BrokerPath::Verdict BrokerPath::Check(Clock::time_point now, bool posts_wait) {
  Verdict v;
  if (!posts_wait) {
    wait_since_ = Clock::time_point{};
    return v;
  }
  if (wait_since_ == Clock::time_point{}) wait_since_ = now;
  v.fault = fault(now, posts_wait);
  // A fault of the other kind is not held by the last one's wait (the steps
  // go on: faults that alternate still move through the brokers).
  if (v.fault != Fault::kNone && v.fault != last_fault_ && last_fault_ != Fault::kNone) {
    next_step_at_ = Clock::time_point{};
  }
  if (v.fault != Fault::kNone) last_fault_ = v.fault;
  if (v.fault == Fault::kNone || now < next_step_at_) return v;
  v.fault_for = std::chrono::duration_cast<milliseconds>(
      now - (v.fault == Fault::kRefused ? first_nack_ : std::max(last_response_, wait_since_)));
  v.step = steps_ == 0 ? Step::kReconnect : Step::kNextBroker;
  const uint64_t hold_ms = std::min<uint64_t>(
      options_.wait_max_ms, static_cast<uint64_t>(std::max<uint32_t>(options_.refused_ms, 1))
                                << std::min<uint32_t>(steps_, 20));
  v.hold = milliseconds(hold_ms);
  next_step_at_ = now + v.hold;
  if (steps_ < UINT32_MAX) ++steps_;
  return v;
}

const char* FaultName(BrokerPath::Fault fault) {
  switch (fault) {
    case BrokerPath::Fault::kNone: return "none";
    case BrokerPath::Fault::kRefused: return "refused";
    case BrokerPath::Fault::kSilent: return "silent";
  }
  return "none";
}

}  // namespace postspool::daemon
