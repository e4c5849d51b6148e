#include "standby_session.h"

#include <algorithm>
#include <cassert>

namespace postspool::daemon {

Status StandbySession::Open(const BrokerUrl& url, size_t index,
                            const AmqpSession::Options& options, Clock::time_point now) {
  assert(!session_);
  std::unique_ptr<AmqpSession> session;
  if (Status s = AmqpSession::Open(url, options, &session); !s.ok()) {
    WaitBeforeOpen(Clock::now());  // the connect took time
    return s;
  }
  session_ = std::move(session);
  index_ = index;
  warm_ = false;
  blocked_ = false;
  retry_ = kRetryInitial;
  ScheduleTick(now);
  return Status::Ok();
}

Status StandbySession::Tend(Clock::time_point now) {
  if (!session_) return Status::Ok();
  if (Status s = session_->ReadFrames(this); !s.ok()) {
    Drop(now);
    return s;
  }
  ScheduleTick(now);
  return Status::Ok();
}

void StandbySession::ScheduleTick(Clock::time_point now) {
  // Often enough to send a heartbeat in time (rabbitmq-c sends one when it
  // is called and one is due).
  const int heartbeat_s = session_->heartbeat_s();
  next_tick_ = heartbeat_s > 0 ? now + std::chrono::milliseconds(heartbeat_s * 1000 / 2)
                               : Clock::time_point::max();
}

std::unique_ptr<AmqpSession> StandbySession::Take(bool took_over, Clock::time_point now) {
  next_tick_ = Clock::time_point::max();
  if (took_over) open_at_ = now + kReopenAfterTakeover;
  warm_ = false;
  return std::move(session_);
}

void StandbySession::Put(std::unique_ptr<AmqpSession> session, size_t index, bool warm,
                         bool blocked, Clock::time_point now) {
  session_ = std::move(session);
  index_ = index;
  warm_ = warm;
  blocked_ = blocked;
  ScheduleTick(now);
}

void StandbySession::Drop(Clock::time_point now) {
  if (!session_) return;
  session_.reset();
  warm_ = false;
  next_tick_ = Clock::time_point::max();
  WaitBeforeOpen(now);
}

void StandbySession::WaitBeforeOpen(Clock::time_point now) {
  open_at_ = now + retry_;
  retry_ = std::min(retry_ * 2, kRetryMax);
}

}  // namespace postspool::daemon
