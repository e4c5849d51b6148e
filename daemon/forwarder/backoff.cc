#include "backoff.h"

#include <algorithm>

namespace postspool::daemon {

Backoff::Backoff(uint32_t initial_ms, uint32_t max_ms, uint64_t seed)
    : initial_ms_(std::max<uint32_t>(initial_ms, 1)),
      max_ms_(std::max(max_ms, std::max<uint32_t>(initial_ms, 1))),
      rng_(seed) {}

uint32_t BackoffCapMs(uint32_t initial_ms, uint32_t max_ms, uint32_t attempt) {
  // Stop doubling once at the maximum: no overflow however many attempts.
  uint64_t cap = initial_ms;
  for (uint32_t i = 0; i < attempt && cap < max_ms; ++i) cap *= 2;
  return static_cast<uint32_t>(std::min<uint64_t>(cap, max_ms));
}

uint32_t Backoff::cap_ms() const { return BackoffCapMs(initial_ms_, max_ms_, attempt_); }

std::chrono::milliseconds Backoff::Next() {
  const uint32_t cap = cap_ms();
  if (attempt_ < UINT32_MAX) ++attempt_;
  std::uniform_int_distribution<uint32_t> pick(0, cap);
  return std::chrono::milliseconds(pick(rng_));
}

}  // namespace postspool::daemon
