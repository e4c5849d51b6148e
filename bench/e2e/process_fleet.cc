#include "process_fleet.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <memory>
#include <new>

namespace postspool::bench {
namespace {

double CpuSeconds(const rusage& u) {
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// In the child: closes every descriptor above stderr except `keep`.
void CloseAllBut(int keep) {
  if (keep > 3) ::close_range(3, static_cast<unsigned>(keep - 1), 0);
  ::close_range(static_cast<unsigned>(keep + 1), ~0U, 0);
}

}  // namespace

int64_t MonotonicNs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

namespace {

struct ThreadUsage {
  int64_t cpu_ns = 0;
  long voluntary = 0;
  long involuntary = 0;
};

ThreadUsage ThreadUsageNow() {
  rusage u{};
  ::getrusage(RUSAGE_THREAD, &u);
  ThreadUsage t;
  t.cpu_ns = (int64_t{u.ru_utime.tv_sec} + u.ru_stime.tv_sec) * 1000000000 +
             (int64_t{u.ru_utime.tv_usec} + u.ru_stime.tv_usec) * 1000;
  t.voluntary = u.ru_nvcsw;
  t.involuntary = u.ru_nivcsw;
  return t;
}

}  // namespace

CallTimer::CallTimer(PostOutcome* outcome) : outcome_(outcome) {
  const ThreadUsage u = ThreadUsageNow();
  cpu_ns_ = u.cpu_ns;
  voluntary_ = u.voluntary;
  involuntary_ = u.involuntary;
  outcome_->start_ns = MonotonicNs();
}

void CallTimer::Finish() {
  outcome_->latency_ns = MonotonicNs() - outcome_->start_ns;
  const ThreadUsage u = ThreadUsageNow();
  outcome_->cpu_ns = u.cpu_ns - cpu_ns_;
  outcome_->voluntary_switches = static_cast<int32_t>(u.voluntary - voluntary_);
  outcome_->involuntary_switches = static_cast<int32_t>(u.involuntary - involuntary_);
}

ProcessFleet::ProcessFleet(int processes, int posts_per_process)
    : processes_(std::max(processes, 0)), posts_per_process_(std::max(posts_per_process, 0)) {
  mapping_bytes_ = std::max<size_t>(total(), 1) * sizeof(PostOutcome);
  void* p = ::mmap(nullptr, mapping_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                   -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  outcomes_ = static_cast<PostOutcome*>(p);
  std::uninitialized_default_construct_n(outcomes_, std::max<size_t>(total(), 1));
}

ProcessFleet::~ProcessFleet() {
  if (!pids_.empty()) Wait();
  if (start_read_fd_ >= 0) ::close(start_read_fd_);
  if (start_write_fd_ >= 0) ::close(start_write_fd_);
  ::munmap(outcomes_, mapping_bytes_);
}

Status ProcessFleet::Fork(const Body& body) {
  int start[2];
  if (::pipe2(start, O_CLOEXEC) != 0) return Status::FromErrno(errno, "pipe for the start line");
  start_read_fd_ = start[0];
  start_write_fd_ = start[1];
  for (int i = 0; i < processes_; ++i) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      const int err = errno;
      Release();
      Wait();
      return Status::FromErrno(err, "fork client process " + std::to_string(i));
    }
    if (pid == 0) {
      CloseAllBut(start_read_fd_);
      // End of file when the parent closes the write end: the start.
      char c;
      while (::read(start_read_fd_, &c, 1) < 0 && errno == EINTR) {
      }
      ::close(start_read_fd_);
      int rc = 70;
      try {
        rc = body(i, std::span<PostOutcome>(outcomes_ + static_cast<size_t>(i) * posts_per_process_,
                                            static_cast<size_t>(posts_per_process_)));
      } catch (...) {
        rc = 71;
      }
      ::_exit(rc);
    }
    pids_.push_back(pid);
  }
  ::close(start_read_fd_);
  start_read_fd_ = -1;
  return Status::Ok();
}

int64_t ProcessFleet::Release() {
  const int64_t now = MonotonicNs();
  if (start_write_fd_ >= 0) ::close(start_write_fd_);
  start_write_fd_ = -1;
  return now;
}

void ProcessFleet::Wait() {
  Release();
  rusage before{};
  ::getrusage(RUSAGE_CHILDREN, &before);
  for (const pid_t pid : pids_) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed_processes_;
  }
  pids_.clear();
  reaped_ns_ = MonotonicNs();
  rusage after{};
  ::getrusage(RUSAGE_CHILDREN, &after);
  children_cpu_s_ = CpuSeconds(after) - CpuSeconds(before);
}

int64_t ProcessFleet::first_start_ns() const {
  int64_t first = LLONG_MAX;
  for (const PostOutcome& o : outcomes()) {
    if (o.rc != PostOutcome::kNotRun) first = std::min(first, o.start_ns);
  }
  return first == LLONG_MAX ? 0 : first;
}

int64_t ProcessFleet::last_end_ns() const {
  int64_t last = 0;
  for (const PostOutcome& o : outcomes()) {
    if (o.rc != PostOutcome::kNotRun) last = std::max(last, o.start_ns + o.latency_ns);
  }
  return last;
}

}  // namespace postspool::bench
