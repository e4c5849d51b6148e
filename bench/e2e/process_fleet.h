// Many short-lived client processes that start together: the harness's
// model of jobs on a node. Each process is a fork of the harness (no exec)
// that runs a body making `posts_per_process` posts and records, for each,
// its outcome in memory shared with the parent (so nothing is lost if a
// child dies, and the parent reads every call's latency afterwards).
//
// Lifetime: Fork() creates the processes, which wait at a start line;
// Release() lets them all go at once; Wait() reaps them. The children hold
// none of the parent's descriptors (a child must not keep the broker
// fixture's supervisor pipe open) and leave with _exit, running no
// destructor of the parent's objects. Fork before starting any thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "status.h"

namespace postspool::bench {

// CLOCK_MONOTONIC in nanoseconds: the same clock in every process.
int64_t MonotonicNs();
inline double Seconds(int64_t ns) { return static_cast<double>(ns) / 1e9; }
// n per second over `ns` nanoseconds; 0 for an empty interval.
inline double PerSecond(uint64_t n, int64_t ns) {
  return ns > 0 ? static_cast<double>(n) / Seconds(ns) : 0.0;
}

struct PostOutcome {
  static constexpr int32_t kNotRun = -1000;  // the child never got to it
  uint8_t id[16] = {};
  int64_t start_ns = 0;    // MonotonicNs() before the call
  int64_t latency_ns = 0;  // how long the call took
  int32_t rc = kNotRun;    // 0 for success
  int32_t transport = 0;   // postspool_transport, or 0
  // Where a slow call's time went (getrusage of the thread around it): CPU
  // time, and context switches: voluntary ones mean it blocked (on an ack,
  // a lock, the disk), involuntary ones that it was preempted.
  int64_t cpu_ns = 0;
  int32_t voluntary_switches = 0;
  int32_t involuntary_switches = 0;
  char detail[120] = {};   // for a failed call: why (NUL-terminated, truncated)
};

// Measures one call for a PostOutcome: construct just before the call,
// Finish() just after.
class CallTimer {
 public:
  explicit CallTimer(PostOutcome* outcome);
  void Finish();

 private:
  PostOutcome* outcome_;
  int64_t cpu_ns_ = 0;
  long voluntary_ = 0;
  long involuntary_ = 0;
};

class ProcessFleet {
 public:
  // The body a child runs: fills outcomes[0..posts_per_process) and returns
  // its exit code (0 for success). Runs after fork, in the child.
  using Body = std::function<int(int process, std::span<PostOutcome> outcomes)>;

  ProcessFleet(int processes, int posts_per_process);
  ~ProcessFleet();  // releases and reaps children still there, unmaps
  ProcessFleet(const ProcessFleet&) = delete;
  ProcessFleet& operator=(const ProcessFleet&) = delete;

  Status Fork(const Body& body);
  // Lets every child start; returns the time of the release.
  int64_t Release();
  // Reaps every child; the CPU time they used is then children_cpu_s().
  void Wait();

  int processes() const { return processes_; }
  int posts_per_process() const { return posts_per_process_; }
  // All outcomes, process by process.
  std::span<const PostOutcome> outcomes() const { return {outcomes_, total()}; }
  size_t total() const { return static_cast<size_t>(processes_) * posts_per_process_; }
  // Children that did not exit with status 0.
  int failed_processes() const { return failed_processes_; }
  // Earliest call start and latest call end over all outcomes that ran.
  int64_t first_start_ns() const;
  int64_t last_end_ns() const;
  // The time Wait() had reaped the last child.
  int64_t reaped_ns() const { return reaped_ns_; }
  // User plus system CPU seconds of the reaped children.
  double children_cpu_s() const { return children_cpu_s_; }

 private:
  int processes_;
  int posts_per_process_;
  PostOutcome* outcomes_ = nullptr;  // shared mapping
  size_t mapping_bytes_ = 0;
  std::vector<pid_t> pids_;
  int start_read_fd_ = -1;
  int start_write_fd_ = -1;
  int failed_processes_ = 0;
  int64_t reaped_ns_ = 0;
  double children_cpu_s_ = 0;
};

}  // namespace postspool::bench
