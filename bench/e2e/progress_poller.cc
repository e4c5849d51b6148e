#include "progress_poller.h"

#include <algorithm>
#include <chrono>

#include "process_fleet.h"

namespace postspool::bench {
namespace {

constexpr int kRpcTimeoutMs = 30000;

}  // namespace

ProgressPoller::ProgressPoller(const testing::DaemonProcess* daemon, BrokerAddress address,
                               std::string queue, int interval_ms)
    : daemon_(daemon),
      address_(std::move(address)),
      queue_(std::move(queue)),
      interval_ms_(interval_ms) {}

Status ProgressPoller::Start() {
  if (Status s = connection_.Open(address_, kRpcTimeoutMs); !s.ok()) return s;
  stop_ = false;
  thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

void ProgressPoller::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  connection_.Close();
}

ProgressSample ProgressPoller::Latest() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return samples_.empty() ? ProgressSample{} : samples_.back();
}

std::vector<ProgressSample> ProgressPoller::samples() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return samples_;
}

bool ProgressPoller::WaitFor(uint64_t target, int timeout_s) const {
  const int64_t deadline = MonotonicNs() + int64_t{timeout_s} * 1000000000;
  while (MonotonicNs() < deadline) {
    const ProgressSample s = Latest();
    if (s.confirmed >= target && s.queue_depth >= target) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms_));
  }
  return false;
}

void ProgressPoller::Run() {
  ProgressSample last;
  while (!stop_) {
    ProgressSample s;
    s.t_ns = MonotonicNs();
    // A counter never goes down: a sample taken before the daemon wrote its
    // metrics file, or when the queue could not be asked, keeps the
    // previous value.
    auto metrics = daemon_->Metrics();
    s.accepted = std::max(last.accepted, metrics["socket_posts_journaled_total"]);
    s.adopted = std::max(last.adopted, metrics["spool_posts_journaled_total"]);
    s.confirmed = std::max(last.confirmed, metrics["confirmed_total"]);
    uint32_t depth = 0;
    s.queue_depth = connection_.QueueMessageCount(queue_, &depth).ok()
                        ? std::max<uint64_t>(last.queue_depth, depth)
                        : last.queue_depth;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      samples_.push_back(s);
    }
    last = s;
    std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms_));
  }
}

}  // namespace postspool::bench
