// The simulation's only source of randomness: a seeded SplitMix64 stream.
// Everything random in a run (faults, clients, the broker, crash points)
// draws from streams forked from the run's one seed, so that a seed replays
// exactly. No std:: distributions: their results differ between standard
// libraries.
#pragma once

#include <cstdint>

namespace postspool::sim {

class SimRng {
 public:
  explicit SimRng(uint64_t seed) : state_(seed) {}

  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n); 0 when n is 0.
  uint64_t Below(uint64_t n) {
    if (n == 0) return 0;
    return Next() % n;  // the bias (n / 2^64) does not matter here
  }
  // Uniform in [lo, hi].
  uint64_t Range(uint64_t lo, uint64_t hi) { return lo + Below(hi - lo + 1); }
  // True with probability ppm / 1,000,000.
  bool Ppm(uint32_t ppm) { return ppm != 0 && Below(1000000) < ppm; }
  bool OneIn(uint64_t n) { return n != 0 && Below(n) == 0; }
  // A new independent stream (for a component), drawn from this one.
  SimRng Fork() { return SimRng(Next() ^ 0x5851f42d4c957f2dull); }

 private:
  uint64_t state_;
};

}  // namespace postspool::sim
