// Backoff: the delays between attempts to reach a broker, exponential with
// full jitter (the "Full Jitter" of the AWS Architecture Blog's "Exponential
// Backoff and Jitter"): the n-th delay in a row is uniform in
// [0, min(max_ms, initial_ms * 2^n)]. Full jitter spreads the reconnects of
// many daemons after a broker restart instead of bunching them.
//
// Pure logic, no clock and no I/O: the caller sleeps. Not thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <random>

namespace postspool::daemon {

// min(max_ms, initial_ms * 2^attempt), without overflow.
uint32_t BackoffCapMs(uint32_t initial_ms, uint32_t max_ms, uint32_t attempt);

class Backoff {
 public:
  // `seed` makes the sequence reproducible (tests print it). initial_ms is
  // at least 1; max_ms below initial_ms is raised to it.
  Backoff(uint32_t initial_ms, uint32_t max_ms, uint64_t seed);

  // The delay before the next attempt; counts one more attempt.
  std::chrono::milliseconds Next();
  // The upper bound of the delay Next() will draw: min(max, initial * 2^attempt).
  uint32_t cap_ms() const;
  // Attempts since the last Reset().
  uint32_t attempt() const { return attempt_; }
  // After an attempt that worked: the next delay is drawn from [0, initial].
  void Reset() { attempt_ = 0; }

 private:
  uint32_t initial_ms_;
  uint32_t max_ms_;
  uint32_t attempt_ = 0;
  std::mt19937_64 rng_;
};

}  // namespace postspool::daemon
