// Percentiles of a set of call latencies, as the harness reports them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace postspool::bench {

struct LatencySummary {
  size_t count = 0;
  double mean_ms = 0;
  double p50_ms = 0;
  double p90_ms = 0;
  double p99_ms = 0;
  double p999_ms = 0;
  double max_ms = 0;
};

// Nearest-rank percentiles (the p-th percentile is the smallest sample with
// at least p% of the samples at or below it). All zero for no samples.
LatencySummary Summarize(std::vector<int64_t> latencies_ns);

}  // namespace postspool::bench
