// Rate-limited logging of repeated events: the daemon's one helper for
// "this keeps happening" messages (bad input, failing writes, squatters,
// broker errors). The first occurrence is logged at once; after that at most
// one line per interval, saying how many were not logged in between, so a
// fault that repeats a million times costs a handful of lines, not a
// million.
//
// Not thread-safe: each thread keeps its own limiters.
#pragma once

#include <chrono>
#include <cstdint>

namespace postspool::daemon {

class LogLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  explicit LogLimiter(std::chrono::milliseconds interval = std::chrono::seconds(10))
      : interval_(interval) {}

  // True when this occurrence is to be logged; *suppressed is then the
  // number of occurrences not logged since the last logged one.
  bool Allow(Clock::time_point now, uint64_t* suppressed) {
    if (logged_once_ && now < next_) {
      ++suppressed_;
      return false;
    }
    logged_once_ = true;
    next_ = now + interval_;
    *suppressed = suppressed_;
    suppressed_ = 0;
    return true;
  }

 private:
  std::chrono::milliseconds interval_;
  Clock::time_point next_{};
  uint64_t suppressed_ = 0;
  bool logged_once_ = false;
};

}  // namespace postspool::daemon
