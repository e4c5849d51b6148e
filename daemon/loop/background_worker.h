// One thread for the ingest loop's work that io_uring has no operation for
// (creating a journal segment: an unnamed file, its header, a link, and at
// `synced` two fsyncs), so that the loop's thread never waits for it. Jobs
// run in the order submitted; the loop learns of finished ones when
// event_fd() is readable and collects them with TakeDone().
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "status.h"
#include "unique_fd.h"

namespace postspool::daemon {

class BackgroundWorker {
 public:
  BackgroundWorker() = default;
  // Waits for the job that is running (a bounded file operation); jobs not
  // started yet are dropped.
  ~BackgroundWorker();
  BackgroundWorker(const BackgroundWorker&) = delete;
  BackgroundWorker& operator=(const BackgroundWorker&) = delete;

  // Creates the event descriptor and starts the thread.
  Status Start();
  void Submit(std::function<int64_t()> job, uint64_t cookie);
  // Readable (an eventfd) when a job finished.
  int event_fd() const { return event_fd_.get(); }
  // Clears the event and returns the finished jobs, in order:
  // (cookie, result).
  std::vector<std::pair<uint64_t, int64_t>> TakeDone();

 private:
  void Run();

  UniqueFd event_fd_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<int64_t()>, uint64_t>> jobs_;
  std::vector<std::pair<uint64_t, int64_t>> done_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace postspool::daemon
