#include "background_worker.h"

#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

namespace postspool::daemon {

BackgroundWorker::~BackgroundWorker() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

Status BackgroundWorker::Start() {
  event_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!event_fd_.valid()) return Status::FromErrno(errno, "eventfd");
  try {
    thread_ = std::thread([this] {
      ::pthread_setname_np(::pthread_self(), "ps-worker");
      Run();
    });
  } catch (const std::system_error& e) {
    return Status(StatusCode::kIoError, std::string("starting the loop's worker thread: ") + e.what());
  }
  return Status::Ok();
}

void BackgroundWorker::Submit(std::function<int64_t()> job, uint64_t cookie) {
  {
    std::lock_guard lock(mu_);
    jobs_.emplace_back(std::move(job), cookie);
  }
  cv_.notify_one();
}

std::vector<std::pair<uint64_t, int64_t>> BackgroundWorker::TakeDone() {
  uint64_t v;
  [[maybe_unused]] const ssize_t n = ::read(event_fd_.get(), &v, sizeof v);
  std::lock_guard lock(mu_);
  return std::exchange(done_, {});
}

void BackgroundWorker::Run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
    if (stop_) return;
    auto [job, cookie] = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    const int64_t result = job();
    lock.lock();
    done_.emplace_back(cookie, result);
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(event_fd_.get(), &one, sizeof one);
  }
}

}  // namespace postspool::daemon
