#include "ring_client.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/ipc.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
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

void Pause(int spin) {
  if (spin < 64) {
    ::sched_yield();
  } else {
    const timespec ts{0, 20000};
    ::nanosleep(&ts, nullptr);
  }
}

}  // namespace

RingClient::~RingClient() { Detach(); }

void RingClient::Detach() {
  if (map_ != nullptr) {
    // Only the process that claimed the lane gives it back: a child that
    // inherited this object must not release its parent's lane.
    if (have_lane_ && pid_ == ::getpid()) ring::ReleaseLane(ring_, lane_, identity_);
    ::shmdt(map_);
  }
  map_ = nullptr;
  ring_ = ring::Ring();
  have_lane_ = false;
  shm_id_ = -1;
}

bool RingClient::Removed() const {
  shmid_ds ds{};
  return ::shmctl(shm_id_, IPC_STAT, &ds) != 0 || (ds.shm_perm.mode & SHM_DEST) != 0;
}

bool RingClient::Attach(DaemonSocket* socket, Deadline deadline, std::string* reason) {
  uint64_t ticks = 0;
  if (!StartTicks(&ticks)) {
    *reason = "cannot read /proc/self/stat (the lane owner's start time)";
    return false;
  }
  int shm_id = -1;
  DaemonSocket::Result r = socket->RequestRing(deadline, &shm_id);
  if (!r.accepted) {
    *reason = "ring: " + r.reason;
    return false;
  }
  shmid_ds ds{};
  if (::shmctl(shm_id, IPC_STAT, &ds) != 0) {
    *reason = std::string("ring: shm id ") + std::to_string(shm_id) + ": " + std::strerror(errno);
    return false;
  }
  if (ds.shm_segsz < ring::kHeaderBytes || ds.shm_perm.uid != ::geteuid()) {
    *reason = "ring: the daemon's shm id is not a ring of this user";
    return false;
  }
  const size_t bytes = ds.shm_segsz;
  void* map = ::shmat(shm_id, nullptr, 0);
  if (map == reinterpret_cast<void*>(-1)) {
    *reason = std::string("ring: shmat: ") + std::strerror(errno);
    return false;
  }
  std::string why;
  if (!ring::Ring::Open(std::span(static_cast<std::byte*>(map), bytes), &ring_, &why)) {
    ::shmdt(map);
    *reason = "ring: " + why;
    return false;
  }
  shm_id_ = shm_id;
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
    // A removed ring (ipcrm, logind at logout) is read only until the
    // daemon stops: ask for the one that replaces it.
    next_check_ = now + kCheckInterval;
    if (Removed()) Detach();
  }
  if (map_ == nullptr) {
    if (now < retry_after_) return Result{Outcome::kUnavailable, unavailable_};
    // Asked for from the second post on (a process that posts once never
    // pays for the ring), on the first post's connection if it is still
    // up, else on a new one: a socket post that timed out (a busy daemon)
    // must not keep a process from its ring. A daemon that is down costs no
    // second connect (the socket's back-off answers at once).
    if (socket->descriptor() < 0 && !posted_) {
      posted_ = true;
      return Result{Outcome::kUnavailable, "ring: not asked for yet"};
    }
    posted_ = true;
    // At most half of what is left of the socket's share: a post must not
    // go to the spool because its ring was slow to come.
    const auto now_attach = Clock::now();
    const Deadline half = attach_deadline > now_attach ? now_attach + (attach_deadline - now_attach) / 2
                                                       : attach_deadline;
    std::string reason;
    if (!Attach(socket, half, &reason)) {
      retry_wait_ = std::clamp(retry_wait_ * 2, std::chrono::milliseconds(kRetryFirst), kRetryMax);
      retry_after_ = now + retry_wait_;
      unavailable_ = reason;
      return Result{Outcome::kUnavailable, std::move(reason)};
    }
    retry_wait_ = std::chrono::milliseconds(0);
  }
  if (ring_.full().load(std::memory_order_relaxed) != 0) {
    // The daemon's quota for this user is reached: the socket says so
    // properly (POSTSPOOL_ENOSPACE), the ring must not take more.
    return Result{Outcome::kQuotaFull, "ring: the daemon takes no more of this user's posts"};
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
        // Room comes as the daemon reads: wait for it (within the budget)
        // rather than let this post overtake the ones in the lane.
        if (WaitForRoom(record.size(), deadline)) {
          --attempt;
          continue;
        }
        return Result{Outcome::kUnavailable, "ring: this process's lane stayed full for the budget"};
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

bool RingClient::AddDropped(uint64_t count, DaemonSocket* socket, Deadline deadline,
                            std::string* reason) {
  if (map_ != nullptr && Removed()) Detach();
  if (map_ == nullptr) {
    // The back-off of refused ring requests applies here as for posts: a
    // process that drops many posts asks at most as often as it posts.
    if (Clock::now() < retry_after_) {
      *reason = unavailable_;
      return false;
    }
    if (!Attach(socket, deadline, reason)) {
      retry_wait_ = std::clamp(retry_wait_ * 2, std::chrono::milliseconds(kRetryFirst), kRetryMax);
      retry_after_ = Clock::now() + retry_wait_;
      unavailable_ = *reason;
      return false;
    }
    retry_wait_ = std::chrono::milliseconds(0);
    next_check_ = Clock::now() + kCheckInterval;
  }
  ring::AddDropped(ring_, count);
  return true;
}

bool RingClient::WaitForRoom(size_t bytes, Deadline deadline) const {
  for (int spin = 0;; ++spin) {
    // As ring::Append counts: a record that does not fit before the end of
    // the lane skips to its start.
    const uint64_t size = ring_.lane_bytes();
    const uint64_t to_end = size - tail_ % size;
    const uint64_t skip = to_end < bytes ? to_end : 0;
    const uint64_t head = ring_.head(lane_).load(std::memory_order_acquire);
    if (head > tail_ || tail_ + skip + bytes - head <= size) return true;
    if (Clock::now() >= deadline) return false;
    Pause(spin);
  }
}

bool RingClient::WaitDrained(Deadline deadline) const {
  if (map_ == nullptr || !have_lane_ || pid_ != ::getpid()) return true;
  return WaitJournaled(tail_, deadline);
}

bool RingClient::WaitJournaled(uint64_t end, Deadline deadline) const {
  for (int spin = 0;; ++spin) {
    const uint64_t head = ring_.head(lane_).load(std::memory_order_acquire);
    if (head >= end && head - end < ring_.lane_bytes()) return true;
    if (Clock::now() >= deadline) return false;
    Pause(spin);
  }
}

}  // namespace postspool::client
