#include "ring_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "log.h"

namespace postspool::daemon {
namespace {

long Futex(uint32_t* word, int op, uint32_t value) {
  return ::syscall(SYS_futex, word, op, value, nullptr, nullptr, 0);
}

#ifndef FUTEX_32
#define FUTEX_32 2
#endif

// struct futex_waitv of Linux 5.16 (linux/futex.h of older headers lacks it).
struct WaitV {
  uint64_t val;
  uint64_t uaddr;
  uint32_t flags;
  uint32_t reserved;
};

#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif

bool ParseRingName(const char* name, uid_t* uid) {
  // "<uid>.ring"
  char* end = nullptr;
  errno = 0;
  const unsigned long v = std::strtoul(name, &end, 10);
  if (errno != 0 || end == name || std::strcmp(end, ".ring") != 0 || v > 0xfffffffeul) return false;
  if (name[0] == '0' && name[1] != '.') return false;  // one spelling per uid
  *uid = static_cast<uid_t>(v);
  return true;
}

}  // namespace

RealRings::RealRings(const Config& config, Metrics* metrics) : config_(config), metrics_(metrics) {}

RealRings::~RealRings() {
  if (thread_.joinable()) {
    // A state the thread never waits for: whatever it loaded last, its
    // wait returns.
    state_.store(kStateStop);
    Futex(reinterpret_cast<uint32_t*>(&state_), FUTEX_WAKE_PRIVATE, 1);
    thread_.join();
  }
  for (File& f : files_) {
    if (f.map != nullptr) ::munmap(f.map, f.bytes);
  }
}

Status RealRings::Open() {
  if (config_.ring_dir.empty()) return Status::Ok();
  const char* dir = config_.ring_dir.c_str();
  if (::mkdir(dir, 0700) != 0 && errno != EEXIST) {
    return Status::FromErrno(errno, "ring_dir " + config_.ring_dir + ": mkdir");
  }
  dir_fd_.reset(::open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir_fd_.valid()) return Status::FromErrno(errno, "ring_dir " + config_.ring_dir + ": open");
  struct stat st{};
  if (::fstat(dir_fd_.get(), &st) != 0) return Status::FromErrno(errno, "ring_dir: fstat");
  if (st.st_uid != ::geteuid()) {
    return Status(StatusCode::kPermissionDenied,
                  "ring_dir " + config_.ring_dir + " is owned by uid " + std::to_string(st.st_uid) +
                      ", not the daemon's: remove it (the daemon creates it)");
  }
  if ((st.st_mode & 0077) != 0 && ::fchmod(dir_fd_.get(), 0700) != 0) {
    return Status::FromErrno(errno, "ring_dir " + config_.ring_dir + ": chmod 0700");
  }
  wake_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake_fd_.valid()) return Status::FromErrno(errno, "eventfd");

  // Rings of an earlier run: their posts were accepted and must be read.
  if (DIR* d = ::fdopendir(::dup(dir_fd_.get())); d != nullptr) {
    std::vector<uid_t> uids;
    while (dirent* e = ::readdir(d)) {
      uid_t uid;
      if (ParseRingName(e->d_name, &uid)) uids.push_back(uid);
    }
    ::closedir(d);
    std::sort(uids.begin(), uids.end());
    for (uid_t uid : uids) {
      if (entries_.size() >= config_.ring_uids_max) {
        PS_LOG_WARNING("ring_dir %s holds more rings than ring_uids_max (%u): uid %u's is not read",
                       dir, config_.ring_uids_max, static_cast<unsigned>(uid));
        continue;
      }
      if (Status s = OpenRing(uid, false); !s.ok()) {
        PS_LOG_WARNING("ring of uid %u: %s", static_cast<unsigned>(uid), s.ToString().c_str());
      }
    }
  }
  // The thread takes no signal (SIGTERM is the ingest loop's, by signalfd).
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  thread_ = std::thread([this] { DoorbellThread(); });
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return Status::Ok();
}

Status RealRings::OpenRing(uid_t uid, bool create) {
  const std::string name = std::to_string(uid) + ".ring";
  const uint64_t want = ring::RingBytes(config_.ring_lanes, config_.ring_lane_bytes);
  UniqueFd fd(::openat(dir_fd_.get(), name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC));
  bool fresh = false;
  if (!fd.valid() && errno == ENOENT && create) {
    fd.reset(::openat(dir_fd_.get(), name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                      0600));
    if (!fd.valid()) return Status::FromErrno(errno, "create " + name);
    if (::ftruncate(fd.get(), static_cast<off_t>(want)) != 0) {
      const int e = errno;
      ::unlinkat(dir_fd_.get(), name.c_str(), 0);
      return Status::FromErrno(e, "size " + name);
    }
    fresh = true;
  }
  if (!fd.valid()) return Status::FromErrno(errno, "open " + name);
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(errno, "fstat " + name);
  if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || st.st_nlink != 1 ||
      (st.st_mode & 0077) != 0 || st.st_size < static_cast<off_t>(ring::kHeaderBytes) ||
      static_cast<uint64_t>(st.st_size) > ring::RingBytes(ring::kLanesMax, ring::kLaneBytesMax)) {
    return Status(StatusCode::kCorruption,
                  name + " is not a ring file of this daemon (type, owner, links, mode or size)");
  }
  File f;
  f.bytes = static_cast<size_t>(st.st_size);
  f.map = ::mmap(nullptr, f.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (f.map == MAP_FAILED) return Status::FromErrno(errno, "mmap " + name);
  const std::span<std::byte> mem(static_cast<std::byte*>(f.map), f.bytes);
  const uint32_t durability = config_.durability == Durability::kSynced ? ring::kDurabilitySynced
                                                                         : ring::kDurabilityAccepted;
  if (fresh) ring::Ring::Format(mem, config_.ring_lanes, config_.ring_lane_bytes, uid, durability);
  Entry e;
  e.uid = uid;
  std::string why;
  if (!ring::Ring::Open(mem, &e.ring, &why)) {
    ::munmap(f.map, f.bytes);
    return Status(StatusCode::kCorruption, name + ": " + why);
  }
  e.ring.durability().store(durability, std::memory_order_relaxed);
  e.ring.doorbell().store(0, std::memory_order_relaxed);
  f.fd = std::move(fd);
  files_.push_back(std::move(f));
  entries_.push_back(e);
  {
    std::lock_guard lock(doorbells_mu_);
    doorbells_.push_back(reinterpret_cast<uint32_t*>(e.ring.base() + ring::kOffDoorbell));
  }
  metrics_->rings.store(entries_.size(), std::memory_order_relaxed);
  if (fresh) {
    PS_LOG_INFO("ring for uid %u created: %u lanes of %u bytes", static_cast<unsigned>(uid),
                e.ring.lane_count(), e.ring.lane_bytes());
  }
  return Status::Ok();
}

Status RealRings::ForUid(uid_t uid, int* fd) {
  if (!dir_fd_.valid()) return Status(StatusCode::kUnsupported, "rings are off (ring_dir is empty)");
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].uid == uid) {
      *fd = files_[i].fd.get();
      return Status::Ok();
    }
  }
  if (entries_.size() >= config_.ring_uids_max) {
    return Status(StatusCode::kUnsupported, "ring_uids_max rings exist");
  }
  if (std::find(refused_.begin(), refused_.end(), uid) != refused_.end()) {
    return Status(StatusCode::kUnsupported, "this uid's ring file could not be made");
  }
  if (Status s = OpenRing(uid, true); !s.ok()) {
    if (s.code() == StatusCode::kCorruption) {
      // Something else under the name: keep it for a person, make a new one.
      const std::string name = std::to_string(uid) + ".ring";
      const std::string aside = name + ".bad-" + std::to_string(::time(nullptr));
      PS_LOG_WARNING("ring_dir %s: %s; renamed to %s", config_.ring_dir.c_str(),
                     s.message().c_str(), aside.c_str());
      if (::renameat(dir_fd_.get(), name.c_str(), dir_fd_.get(), aside.c_str()) == 0) {
        s = OpenRing(uid, true);
      }
    }
    if (!s.ok()) {
      PS_LOG_ERROR("ring for uid %u: %s (its processes use the socket)", static_cast<unsigned>(uid),
                   s.ToString().c_str());
      if (refused_.size() < 1024) refused_.push_back(uid);
      return Status(StatusCode::kUnsupported, s.message());
    }
  }
  *fd = files_.back().fd.get();
  return Status::Ok();
}

bool RealRings::OwnerAlive(uint64_t identity) {
  const pid_t pid = ring::IdentityPid(identity);
  if (pid <= 0) return false;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  UniqueFd fd(::open(path, O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return errno != ENOENT && errno != ESRCH;  // unsure: alive
  char buf[1024];
  const ssize_t n = ::read(fd.get(), buf, sizeof buf - 1);
  if (n <= 0) return true;
  buf[n] = '\0';
  char state = 0;
  uint64_t start = 0;
  if (!ring::ParseProcStat(buf, &state, &start)) return true;
  // A zombie has exited: its lane will never be written again.
  if (state == 'Z' || state == 'X') return false;
  return (start & ((1ull << 41) - 1)) == ring::IdentityStart(identity);
}

void RealRings::DrainWakeFd() {
  uint64_t v;
  while (::read(wake_fd_.get(), &v, sizeof v) > 0) {
  }
}

void RealRings::Sleep() {
  if (!thread_.joinable()) return;
  state_.store(1, std::memory_order_seq_cst);
  Futex(reinterpret_cast<uint32_t*>(&state_), FUTEX_WAKE_PRIVATE, 1);
}

void RealRings::Awake() {
  if (state_.load(std::memory_order_relaxed) == 0) return;
  state_.store(0, std::memory_order_seq_cst);
  Futex(reinterpret_cast<uint32_t*>(&state_), FUTEX_WAKE_PRIVATE, 1);
}

void RealRings::DoorbellThread() {
  uint32_t* state = reinterpret_cast<uint32_t*>(&state_);
  std::vector<WaitV> waitv;
  bool warned = false;
  for (;;) {
    const uint32_t s = state_.load();
    if (s == kStateStop) return;
    if (s != 1) {
      Futex(state, FUTEX_WAIT_PRIVATE, s);
      continue;
    }
    waitv.clear();
    waitv.push_back(WaitV{1, reinterpret_cast<uintptr_t>(state), FUTEX_32 | FUTEX_PRIVATE_FLAG, 0});
    {
      std::lock_guard lock(doorbells_mu_);
      for (uint32_t* d : doorbells_) waitv.push_back(WaitV{1, reinterpret_cast<uintptr_t>(d), FUTEX_32, 0});
    }
    const long r = ::syscall(SYS_futex_waitv, waitv.data(), waitv.size(), 0, nullptr, CLOCK_MONOTONIC);
    if (r < 0 && (errno == ENOSYS || errno == EPERM)) {
      // Before Linux 5.16 (or a seccomp filter without it): no waiting on
      // several words. The loop is woken every millisecond instead, a cost
      // only while it is idle.
      if (!warned) {
        PS_LOG_WARNING("futex_waitv: %s: the idle ingest loop polls the rings every millisecond",
                       std::strerror(errno));
        warned = true;
      }
      timespec ts{0, 1000000};
      ::nanosleep(&ts, nullptr);
    } else if (r == 0) {
      continue;  // woken on state_: the loop is awake, nothing rang
    }
    if (r < 0 && errno == EINTR) continue;
    // A doorbell was rung (or changed under us): wake the loop unless it
    // woke on its own meanwhile.
    uint32_t expected = 1;
    if (state_.compare_exchange_strong(expected, 2)) {
      const uint64_t one = 1;
      if (::write(wake_fd_.get(), &one, sizeof one) < 0) {
        // EAGAIN: the counter is full, so the loop is being woken anyway.
      }
    }
  }
}

}  // namespace postspool::daemon
