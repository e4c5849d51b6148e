#include "ring_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/ipc.h>
#include <sys/random.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
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

constexpr const char* kRecordMagic = "postspool-ring-1";

// "<uid><suffix>"
bool ParseRecordName(const char* name, const char* suffix, uid_t* uid) {
  char* end = nullptr;
  errno = 0;
  const unsigned long v = std::strtoul(name, &end, 10);
  if (errno != 0 || end == name || std::strcmp(end, suffix) != 0 || v > 0xfffffffeul) return false;
  if (name[0] == '0' && name[1] != '.') return false;  // one spelling per uid
  if (name[0] < '0' || name[0] > '9') return false;
  *uid = static_cast<uid_t>(v);
  return true;
}

// A ring's record in ring_dir: "postspool-ring-1 <key> <shm id>\n".
Status ReadRecord(int dir_fd, const std::string& name, key_t* key, int* shm_id) {
  UniqueFd fd(::openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) return Status::FromErrno(errno, "open " + name);
  char text[128];
  const ssize_t n = ::read(fd.get(), text, sizeof text - 1);
  if (n <= 0) return Status(StatusCode::kCorruption, name + ": empty");
  text[n] = '\0';
  char magic[32];
  int k = 0;
  int id = -1;
  if (std::sscanf(text, "%31s %d %d", magic, &k, &id) != 3 || std::strcmp(magic, kRecordMagic) != 0 ||
      id < 0) {
    return Status(StatusCode::kCorruption, name + ": not a ring record");
  }
  *key = static_cast<key_t>(k);
  *shm_id = id;
  return Status::Ok();
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
  for (Segment& s : segments_) {
    if (s.map != nullptr) ::shmdt(s.map);
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
      if (ParseRecordName(e->d_name, ".shm", &uid)) {
        uids.push_back(uid);
      } else if (ParseRecordName(e->d_name, ".ring", &uid)) {
        PS_LOG_WARNING("ring_dir %s: %s is a ring file of an earlier version (rings are System V "
                       "shared memory now): not read; remove it once its posts are not needed",
                       dir, e->d_name);
      }
    }
    ::closedir(d);
    std::sort(uids.begin(), uids.end());
    for (uid_t uid : uids) {
      const std::string name = std::to_string(uid) + ".shm";
      if (entries_.size() >= config_.ring_uids_max) {
        PS_LOG_WARNING("ring_dir %s holds more rings than ring_uids_max (%u): uid %u's is not read",
                       dir, config_.ring_uids_max, static_cast<unsigned>(uid));
        continue;
      }
      key_t key = 0;
      int shm_id = -1;
      Status s = ReadRecord(dir_fd_.get(), name, &key, &shm_id);
      if (s.ok()) s = AttachRing(uid, key, shm_id);
      if (!s.ok()) {
        PS_LOG_WARNING("ring of uid %u: %s; a new one is made when asked", static_cast<unsigned>(uid),
                       s.ToString().c_str());
        ::unlinkat(dir_fd_.get(), name.c_str(), 0);
      }
    }
  }
  // The thread takes no signal (SIGTERM is the ingest loop's, by signalfd).
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  thread_ = std::thread([this] {
    ::pthread_setname_np(::pthread_self(), "ps-doorbell");
    DoorbellThread();
  });
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return Status::Ok();
}

uint32_t RealRings::RingDurability() const {
  return config_.durability == Durability::kSynced ? ring::kDurabilitySynced : ring::kDurabilityAccepted;
}

Status RealRings::CreateRing(uid_t uid) {
  const uint64_t bytes = ring::RingBytes(config_.ring_lanes, config_.ring_lane_bytes);
  // A random key rather than IPC_PRIVATE: the record names key and id
  // together, so a restarted daemon cannot mistake a segment that reused
  // the id (another daemon's, in tests) for its own.
  int shm_id = -1;
  key_t key = 0;
  for (int attempt = 0; attempt < 16 && shm_id < 0; ++attempt) {
    uint32_t r = 0;
    if (::getrandom(&r, sizeof r, 0) != sizeof r) return Status::FromErrno(errno, "getrandom");
    key = static_cast<key_t>(r & 0x7fffffff);
    if (key == IPC_PRIVATE) continue;
    shm_id = ::shmget(key, bytes, IPC_CREAT | IPC_EXCL | 0600);
    if (shm_id < 0 && errno != EEXIST) return Status::FromErrno(errno, "shmget");
  }
  if (shm_id < 0) return Status(StatusCode::kAlreadyExists, "shmget: no free key in 16 tries");
  void* map = ::shmat(shm_id, nullptr, 0);
  if (map == reinterpret_cast<void*>(-1)) {
    const int e = errno;
    ::shmctl(shm_id, IPC_RMID, nullptr);
    return Status::FromErrno(e, "shmat");
  }
  ring::Ring::Format(std::span(static_cast<std::byte*>(map), bytes), config_.ring_lanes,
                     config_.ring_lane_bytes, uid, RingDurability());
  // Only now may the uid attach it: the owner is the uid, the creator stays
  // the daemon.
  shmid_ds ds{};
  if (::shmctl(shm_id, IPC_STAT, &ds) != 0 ||
      (ds.shm_perm.uid = uid, ds.shm_perm.mode = 0600, ::shmctl(shm_id, IPC_SET, &ds) != 0)) {
    const int e = errno;
    ::shmdt(map);
    ::shmctl(shm_id, IPC_RMID, nullptr);
    return Status::FromErrno(e, "shmctl IPC_SET");
  }
  if (Status s = WriteRecord(uid, key, shm_id); !s.ok()) {
    ::shmdt(map);
    ::shmctl(shm_id, IPC_RMID, nullptr);
    return s;
  }
  ::shmdt(map);
  if (Status s = AttachRing(uid, key, shm_id); !s.ok()) return s;
  PS_LOG_INFO("ring for uid %u created (shm id %d): %u lanes of %u bytes", static_cast<unsigned>(uid),
              shm_id, config_.ring_lanes, config_.ring_lane_bytes);
  return Status::Ok();
}

Status RealRings::AttachRing(uid_t uid, key_t key, int shm_id) {
  shmid_ds ds{};
  if (::shmctl(shm_id, IPC_STAT, &ds) != 0) {
    return Status::FromErrno(errno, "shm id " + std::to_string(shm_id) + " (gone after a reboot or ipcrm)");
  }
  if (ds.shm_perm.__key != key || ds.shm_perm.cuid != ::geteuid() ||
      ds.shm_segsz < ring::kHeaderBytes ||
      ds.shm_segsz > ring::RingBytes(ring::kLanesMax, ring::kLaneBytesMax)) {
    return Status(StatusCode::kCorruption,
                  "shm id " + std::to_string(shm_id) + " is not a ring of this daemon (key, creator or size)");
  }
  // The owner may have changed owner or mode (IPC_SET): as the creator, the
  // daemon puts them back, so that the segment serves its uid and no other.
  if (ds.shm_perm.uid != uid || (ds.shm_perm.mode & 0777) != 0600) {
    ds.shm_perm.uid = uid;
    ds.shm_perm.mode = 0600;
    if (::shmctl(shm_id, IPC_SET, &ds) != 0) return Status::FromErrno(errno, "shmctl IPC_SET");
  }
  void* map = ::shmat(shm_id, nullptr, 0);
  if (map == reinterpret_cast<void*>(-1)) return Status::FromErrno(errno, "shmat");
  Segment seg;
  seg.shm_id = shm_id;
  seg.map = map;
  seg.bytes = ds.shm_segsz;
  seg.retired = (ds.shm_perm.mode & SHM_DEST) != 0;
  Entry e;
  e.uid = uid;
  std::string why;
  if (!ring::Ring::Open(std::span(static_cast<std::byte*>(map), seg.bytes), &e.ring, &why)) {
    ::shmdt(map);
    return Status(StatusCode::kCorruption, "shm id " + std::to_string(shm_id) + ": " + why);
  }
  e.ring.durability().store(RingDurability(), std::memory_order_relaxed);
  e.ring.doorbell().store(0, std::memory_order_relaxed);
  if (seg.retired) {
    // Removed by its user: read what it holds this run, then let it go.
    ::unlinkat(dir_fd_.get(), (std::to_string(uid) + ".shm").c_str(), 0);
  }
  segments_.push_back(seg);
  entries_.push_back(e);
  {
    std::lock_guard lock(doorbells_mu_);
    doorbells_.push_back(reinterpret_cast<uint32_t*>(e.ring.base() + ring::kOffDoorbell));
  }
  // A thread waiting on the doorbells it had: it waits on this one too.
  Futex(reinterpret_cast<uint32_t*>(&state_), FUTEX_WAKE_PRIVATE, 1);
  metrics_->rings.store(entries_.size(), std::memory_order_relaxed);
  return Status::Ok();
}

Status RealRings::WriteRecord(uid_t uid, key_t key, int shm_id) {
  const std::string name = std::to_string(uid) + ".shm";
  const std::string tmp = "." + name + ".tmp";
  char text[64];
  const int n = std::snprintf(text, sizeof text, "%s %d %d\n", kRecordMagic, static_cast<int>(key), shm_id);
  ::unlinkat(dir_fd_.get(), tmp.c_str(), 0);
  UniqueFd fd(::openat(dir_fd_.get(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                       0600));
  if (!fd.valid()) return Status::FromErrno(errno, "create " + tmp);
  if (::write(fd.get(), text, static_cast<size_t>(n)) != n) {
    const int e = errno;
    ::unlinkat(dir_fd_.get(), tmp.c_str(), 0);
    return Status::FromErrno(e == 0 ? EIO : e, "write " + tmp);
  }
  if (::renameat(dir_fd_.get(), tmp.c_str(), dir_fd_.get(), name.c_str()) != 0) {
    const int e = errno;
    ::unlinkat(dir_fd_.get(), tmp.c_str(), 0);
    return Status::FromErrno(e, "rename " + tmp);
  }
  return Status::Ok();
}

bool RealRings::Removed(const Segment& seg) const {
  shmid_ds ds{};
  return ::shmctl(seg.shm_id, IPC_STAT, &ds) != 0 || (ds.shm_perm.mode & SHM_DEST) != 0;
}

Status RealRings::ForUid(uid_t uid, int* shm_id) {
  if (!dir_fd_.valid()) return Status(StatusCode::kUnsupported, "rings are off (ring_dir is empty)");
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].uid != uid || segments_[i].retired) continue;
    if (!Removed(segments_[i])) {
      *shm_id = segments_[i].shm_id;
      return Status::Ok();
    }
    // Its user removed it (ipcrm, or logind at logout): the daemon still
    // reads it, but nobody can attach it any more. A new one replaces it.
    segments_[i].retired = true;
    PS_LOG_INFO("ring of uid %u (shm id %d) was removed by its user: a new one replaces it",
                static_cast<unsigned>(uid), segments_[i].shm_id);
  }
  if (entries_.size() >= config_.ring_uids_max) {
    return Status(StatusCode::kUnsupported, "ring_uids_max rings exist");
  }
  if (std::find(refused_.begin(), refused_.end(), uid) != refused_.end()) {
    return Status(StatusCode::kUnsupported, "this uid's ring could not be made");
  }
  // A removed ring stays attached (and in memory) until the daemon stops:
  // one replacement per uid and run bounds what removing costs the node.
  size_t removed = 0;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].uid == uid && segments_[i].retired) ++removed;
  }
  if (removed >= 2) {
    return Status(StatusCode::kUnsupported,
                  "this uid removed its ring twice: its processes use the socket until the daemon "
                  "restarts");
  }
  if (Status s = CreateRing(uid); !s.ok()) {
    PS_LOG_ERROR("ring for uid %u: %s (its processes use the socket)", static_cast<unsigned>(uid),
                 s.ToString().c_str());
    if (refused_.size() < 1024) refused_.push_back(uid);
    return Status(StatusCode::kUnsupported, s.message());
  }
  *shm_id = segments_.back().shm_id;
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
  // Against the thread's parked_ = 1, then state_ load (both seq_cst):
  // either it sees the 1 and does not wait, or this sees it parked.
  state_.store(1, std::memory_order_seq_cst);
  if (parked_.load(std::memory_order_seq_cst) != 0) {
    Futex(reinterpret_cast<uint32_t*>(&state_), FUTEX_WAKE_PRIVATE, 1);
  }
}

void RealRings::Awake() {
  if (state_.load(std::memory_order_relaxed) == 0) return;
  state_.store(0, std::memory_order_seq_cst);
}

void RealRings::WakeLoop() {
  uint32_t expected = 1;
  if (state_.compare_exchange_strong(expected, 2)) {
    const uint64_t one = 1;
    if (::write(wake_fd_.get(), &one, sizeof one) < 0) {
      // EAGAIN: the counter is full, so the loop is being woken anyway.
    }
  }
}

void RealRings::DoorbellThread() {
  using SteadyClock = std::chrono::steady_clock;
  uint32_t* state = reinterpret_cast<uint32_t*>(&state_);
  std::vector<WaitV> waitv;
  std::vector<size_t> ring_of;  // waitv index - 1 -> doorbell index
  // Per doorbell: when it last woke the loop, and until when it is not
  // waited on. A producer rings at most once per sleep of the loop, but a
  // process can write the word and wake it at will: each doorbell wakes
  // the loop at most once per kDoorbellGap, so what one uid can cost the
  // daemon this way is bounded (its own posts wait up to that long).
  std::vector<SteadyClock::time_point> last_wake, muted_until;
  bool warned = false;
  for (;;) {
    const uint32_t s = state_.load();
    if (s == kStateStop) return;
    if (s != 1) {
      parked_.store(1, std::memory_order_seq_cst);
      if (state_.load(std::memory_order_seq_cst) == s) Futex(state, FUTEX_WAIT_PRIVATE, s);
      parked_.store(0, std::memory_order_relaxed);
      continue;
    }
    const auto now = SteadyClock::now();
    auto until = SteadyClock::time_point::max();
    waitv.clear();
    ring_of.clear();
    waitv.push_back(WaitV{1, reinterpret_cast<uintptr_t>(state), FUTEX_32 | FUTEX_PRIVATE_FLAG, 0});
    {
      std::lock_guard lock(doorbells_mu_);
      last_wake.resize(doorbells_.size());
      muted_until.resize(doorbells_.size());
      for (size_t i = 0; i < doorbells_.size(); ++i) {
        if (muted_until[i] > now) {
          until = std::min(until, muted_until[i]);
          continue;
        }
        waitv.push_back(WaitV{1, reinterpret_cast<uintptr_t>(doorbells_[i]), FUTEX_32, 0});
        ring_of.push_back(i);
      }
    }
    timespec timeout{};
    if (until != SteadyClock::time_point::max()) {
      // futex_waitv takes an absolute CLOCK_MONOTONIC time, steady_clock's.
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(until.time_since_epoch()).count();
      timeout.tv_sec = static_cast<time_t>(ns / 1000000000);
      timeout.tv_nsec = static_cast<long>(ns % 1000000000);
    }
    const long r = ::syscall(SYS_futex_waitv, waitv.data(), waitv.size(), 0,
                             until == SteadyClock::time_point::max() ? nullptr : &timeout,
                             CLOCK_MONOTONIC);
    const int err = r < 0 ? errno : 0;
    if (r < 0 && (err == ENOSYS || err == EPERM)) {
      // Before Linux 5.16 (or a seccomp filter without it): no waiting on
      // several words. The loop is woken every millisecond instead, a cost
      // only while it is idle.
      if (!warned) {
        PS_LOG_WARNING("futex_waitv: %s: the idle ingest loop polls the rings every millisecond",
                       std::strerror(err));
        warned = true;
      }
      timespec ts{0, 1000000};
      ::nanosleep(&ts, nullptr);
      WakeLoop();
      continue;
    }
    if (r == 0 || err == EINTR) continue;  // woken on state_: the loop is awake
    if (err == ETIMEDOUT) {
      // A muted doorbell's time is up: whatever its producers posted
      // meanwhile is read now, and that counts as its wake-up.
      const auto t = SteadyClock::now();
      {
        std::lock_guard lock(doorbells_mu_);
        for (size_t i = 0; i < muted_until.size(); ++i) {
          if (muted_until[i] != SteadyClock::time_point{} && muted_until[i] <= t) {
            muted_until[i] = SteadyClock::time_point{};
            last_wake[i] = t;
          }
        }
      }
      WakeLoop();
      continue;
    }
    // EAGAIN because the loop woke before the wait began: it reads every
    // lane anyway, and nothing rang (its doorbells read 0 now, which must
    // not count as rings: that would mute them).
    if (err == EAGAIN && state_.load() != 1) continue;
    // Which doorbells rang: the one that woke us, or (EAGAIN: a word was
    // not 1 when we began) every one that is not 1 now.
    const auto woke = SteadyClock::now();
    bool wake = false;
    std::lock_guard lock(doorbells_mu_);
    for (size_t k = 0; k < ring_of.size(); ++k) {
      const bool rang = r > 0 ? static_cast<size_t>(r) == k + 1
                              : __atomic_load_n(doorbells_[ring_of[k]], __ATOMIC_RELAXED) != 1;
      if (!rang) continue;
      const size_t i = ring_of[k];
      if (woke - last_wake[i] < kDoorbellGap) {
        muted_until[i] = last_wake[i] + kDoorbellGap;
      } else {
        last_wake[i] = woke;
        wake = true;
      }
    }
    if (wake || (r < 0 && err != EAGAIN)) WakeLoop();
  }
}

}  // namespace postspool::daemon
