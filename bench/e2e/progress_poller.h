// Watching the daemon and the queue while the broker catches up: a thread
// that samples the daemon's metrics file (its counters) and the queue's
// depth (a passive queue.declare on a connection of its own) at a fixed
// interval, and keeps every sample.
//
// The queue's depth is exact at the interval; the daemon rewrites its
// metrics file in its periodic work (every 100 ms at best), so its counters
// lag by up to that much.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "confirmed_publisher.h"
#include "e2e/daemon_process.h"
#include "status.h"

namespace postspool::bench {

struct ProgressSample {
  int64_t t_ns = 0;          // MonotonicNs()
  uint64_t accepted = 0;     // socket_posts_journaled_total
  uint64_t adopted = 0;      // spool_posts_journaled_total
  uint64_t confirmed = 0;    // confirmed_total
  uint64_t queue_depth = 0;  // messages ready in the queue
};

class ProgressPoller {
 public:
  // `daemon` must outlive the poller; it need not be running yet (its
  // counters read as zero until it writes its metrics file).
  ProgressPoller(const testing::DaemonProcess* daemon, BrokerAddress address, std::string queue,
                 int interval_ms);
  ~ProgressPoller() { Stop(); }
  ProgressPoller(const ProgressPoller&) = delete;
  ProgressPoller& operator=(const ProgressPoller&) = delete;

  // Connects and starts the thread. Start it after forking the client
  // processes (a fork must not copy a running thread's half-done state).
  Status Start();
  void Stop();

  ProgressSample Latest() const;
  // Waits until the daemon has confirmed `target` posts and the queue holds
  // that many, or `timeout_s` passes. True if reached.
  bool WaitFor(uint64_t target, int timeout_s) const;
  // The time of the first sample for which `reached` holds; 0 if none.
  template <typename Pred>
  int64_t FirstTime(Pred reached) const {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const ProgressSample& s : samples_) {
      if (reached(s)) return s.t_ns;
    }
    return 0;
  }
  // Every sample so far.
  std::vector<ProgressSample> samples() const;

 private:
  void Run();

  const testing::DaemonProcess* daemon_;
  const BrokerAddress address_;
  const std::string queue_;
  const int interval_ms_;
  AmqpConnection connection_;  // the thread's, between Start and Stop
  std::thread thread_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mutex_;
  std::vector<ProgressSample> samples_;  // guarded by mutex_
};

}  // namespace postspool::bench
