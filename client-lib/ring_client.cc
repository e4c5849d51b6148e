#include "ring_client.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace postspool::client {
namespace {

// This process's start time in clock ticks since boot (/proc/self/stat,
// field 22): with the pid, a lane owner that a reused pid cannot be.
bool StartTicks(uint64_t* ticks) {
  UniqueFd fd(::open("/proc/self/stat", O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return false;
  char buf[1024];
  ssize_t n;
  do {
    n = ::read(fd.get(), buf, sizeof buf - 1);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return false;
  buf[n] = '\0';
  char state = 0;
  return ring::ParseProcStat(buf, &state, ticks);
}

}  // namespace

RingClient::~RingClient() { Detach(); }

void RingClient::Detach() {
  if (map_ != nullptr) {
    // Only the process that claimed the lane gives it back: a child that
    // inherited this object must not release its parent's lane.
    if (have_lane_ && pid_ == ::getpid()) ring::ReleaseLane(ring_, lane_, identity_);
    ::munmap(map_, bytes_);
  }
  map_ = nullptr;
  ring_ = ring::Ring();
  have_lane_ = false;
  fd_.reset();
}

bool RingClient::Attach(DaemonSocket* socket, Deadline deadline, std::string* reason) {
  uint64_t ticks = 0;
  if (!StartTicks(&ticks)) {
    *reason = "cannot read /proc/self/stat (the lane owner's start time)";
    return false;
  }
  UniqueFd fd;
  DaemonSocket::Result r = socket->RequestRing(deadline, &fd);
  if (!r.accepted) {
    *reason = "ring: " + r.reason;
    return false;
  }
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) < ring::kHeaderBytes) {
    *reason = "ring: the daemon's descriptor is not a ring file";
    return false;
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (map == MAP_FAILED) {
    *reason = std::string("ring: mmap: ") + std::strerror(errno);
    return false;
  }
  std::string why;
  if (!ring::Ring::Open(std::span(static_cast<std::byte*>(map), bytes), &ring_, &why)) {
    ::munmap(map, bytes);
    *reason = "ring: " + why;
    return false;
  }
  fd_ = std::move(fd);
  map_ = map;
  bytes_ = bytes;
  pid_ = ::getpid();
  identity_ = ring::MakeIdentity(pid_, ticks);
  next_check_ = Clock::now() + kCheckInterval;
  return true;
}

RingClient::Result RingClient::Post(std::span<const std::byte> record, DaemonSocket* socket,
                                    Deadline attach_deadline, Deadline deadline) {
  const auto now = Clock::now();
  if (map_ != nullptr && now >= next_check_) {
    // A ring file removed (by hand, or by a reboot of /run while this
    // process lived on) is read by nobody.
    next_check_ = now + kCheckInterval;
    struct stat st{};
    if (::fstat(fd_.get(), &st) != 0 || st.st_nlink == 0) Detach();
  }
  if (map_ == nullptr) {
    if (now < retry_after_) return Result{Outcome::kUnavailable, unavailable_};
    // Asked for on a connection a post already used: a process that posts
    // once never pays for the ring, and a daemon that is down costs no
    // second connect.
    if (socket->descriptor() < 0) return Result{Outcome::kUnavailable, "ring: not asked for yet"};
    std::string reason;
    if (!Attach(socket, attach_deadline, &reason)) {
      retry_after_ = now + kRetryAfter;
      unavailable_ = reason;
      return Result{Outcome::kUnavailable, std::move(reason)};
    }
  }
  if (ring_.full().load(std::memory_order_relaxed) != 0) {
    // The daemon's quota for this user is reached: the socket says so
    // properly (POSTSPOOL_ENOSPACE), the ring must not take more.
    return Result{Outcome::kUnavailable, "ring: the daemon takes no more of this user's posts"};
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!have_lane_) {
      if (!ring::ClaimLane(ring_, identity_, static_cast<uint32_t>(pid_), &lane_, &tail_)) {
        return Result{Outcome::kUnavailable, "ring: every lane is taken"};
      }
      have_lane_ = true;
    }
    switch (ring::Append(ring_, lane_, &tail_, record)) {
      case ring::AppendResult::kAppended: {
        const uint64_t end = tail_;
        if (ring::TakeDoorbell(ring_)) {
          ::syscall(SYS_futex, ring_.base() + ring::kOffDoorbell, FUTEX_WAKE, 1, nullptr, nullptr, 0);
        }
        if (ring_.durability().load(std::memory_order_relaxed) == ring::kDurabilitySynced &&
            !WaitJournaled(end, deadline)) {
          return Result{Outcome::kNotSynced, "ring: not journaled within the budget"};
        }
        return Result{Outcome::kAppended, {}};
      }
      case ring::AppendResult::kFull:
        return Result{Outcome::kUnavailable, "ring: this process's lane is full"};
      case ring::AppendResult::kTooBig:
        return Result{Outcome::kUnavailable, "ring: the post is larger than half a lane"};
      case ring::AppendResult::kBroken:
        // Damaged (another process of this uid wrote over it): give it back
        // for the daemon to reset, and take another.
        ring::ReleaseLane(ring_, lane_, identity_);
        have_lane_ = false;
        break;
    }
  }
  return Result{Outcome::kUnavailable, "ring: lanes damaged"};
}

bool RingClient::WaitJournaled(uint64_t end, Deadline deadline) const {
  for (int spin = 0;; ++spin) {
    const uint64_t head = ring_.head(lane_).load(std::memory_order_acquire);
    if (head >= end && head - end < ring_.lane_bytes()) return true;
    if (Clock::now() >= deadline) return false;
    if (spin < 64) {
      ::sched_yield();
    } else {
      const timespec ts{0, 20000};
      ::nanosleep(&ts, nullptr);
    }
  }
}

}  // namespace postspool::client
