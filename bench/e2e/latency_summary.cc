#include "latency_summary.h"

#include <algorithm>
#include <cmath>

namespace postspool::bench {
namespace {

double Ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }

// The nearest-rank percentile of sorted, non-empty `v`.
int64_t Rank(const std::vector<int64_t>& v, double p) {
  const double n = static_cast<double>(v.size());
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * n));
  rank = std::clamp<size_t>(rank, 1, v.size());
  return v[rank - 1];
}

}  // namespace

LatencySummary Summarize(std::vector<int64_t> latencies_ns) {
  LatencySummary s;
  if (latencies_ns.empty()) return s;
  std::sort(latencies_ns.begin(), latencies_ns.end());
  double sum = 0;
  for (int64_t ns : latencies_ns) sum += static_cast<double>(ns);
  s.count = latencies_ns.size();
  s.mean_ms = sum / static_cast<double>(s.count) / 1e6;
  s.p50_ms = Ms(Rank(latencies_ns, 50));
  s.p90_ms = Ms(Rank(latencies_ns, 90));
  s.p99_ms = Ms(Rank(latencies_ns, 99));
  s.p999_ms = Ms(Rank(latencies_ns, 99.9));
  s.max_ms = Ms(latencies_ns.back());
  return s;
}

}  // namespace postspool::bench
