// libpostspool-shim: interposes the C library's file calls in any
// dynamically linked program (LD_PRELOAD) and posts, through libpostspool,
// what the program writes, renames, links and removes.
//
// Rules every interposer keeps (the host must never notice the shim):
//  - the real call is made exactly once, with the caller's arguments, and
//    its return value and errno are what the caller gets;
//  - nothing is posted while the shim itself (or libpostspool inside it) is
//    running on this thread (t_depth), in a vfork child or a process made by
//    clone() without fork() (the pid is not the one fork() told us), or once
//    the process has started tearing down its libraries at exit;
//  - unconfigured, every interposer is the real call plus one load.
//
// Files written are posted when the last descriptor of the program that was
// open for writing is closed: close, fclose, dup2/dup3 onto it (shell
// redirections), close_range/closefrom, and the descriptors still open when
// the program exits. That covers data written by any means (write, stdio,
// copy_file_range, sendfile, mmap, ftruncate) without interposing them.
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <string>

#include "file_identity.h"
#include "postspool.h"
#include "shim_config.h"

#define SHIM_EXPORT extern "C" __attribute__((visibility("default")))

// The C library's declarations carry nonnull attributes, which a function
// pointer type used as a template argument drops (harmlessly).
#pragma GCC diagnostic ignored "-Wignored-attributes"

namespace postspool::shim {
namespace {

// ---------------------------------------------------------------------------
// The real functions (the next definition after the shim's own).

template <typename F>
F Next(std::atomic<F>* slot, const char* name) {
  F f = slot->load(std::memory_order_relaxed);
  if (f == nullptr) {
    f = reinterpret_cast<F>(::dlsym(RTLD_NEXT, name));
    slot->store(f, std::memory_order_relaxed);
  }
  return f;
}

#define REAL(name)                                                 \
  ([]() {                                                          \
    static std::atomic<decltype(&::name)> slot{nullptr};           \
    return Next(&slot, #name);                                     \
  }())

// The shim's own descriptors bypass every interposer.
int RawOpenAt(int dirfd, const char* path, int flags) {
  return static_cast<int>(::syscall(SYS_openat, dirfd, path, flags | O_CLOEXEC, 0));
}
void RawClose(int fd) { ::syscall(SYS_close, fd); }

// ---------------------------------------------------------------------------
// State.

enum class InitState : int { kNotYet, kRunning, kActive, kInactive };

std::atomic<InitState> g_init{InitState::kNotYet};
Config* g_config = nullptr;               // set once, never freed (used until exit)
std::atomic<pid_t> g_pid{0};              // the process fork() last told us about
std::atomic<bool> g_exiting{false};       // no posts once teardown began
std::atomic<postspool_client*> g_client{nullptr};
pthread_mutex_t g_client_mutex = PTHREAD_MUTEX_INITIALIZER;
int (*g_real_main)(int, char**, char**) = nullptr;
// True in the child of a fork() (until it execs): its descriptors, until it
// opens its own, are the parent's too.
bool g_fork_child = false;

// Posts the shim should have made and could not (see Dropped): this
// process's count, how many of them reached the daemon's count
// (postspool_report_dropped), and whether it said so on stderr yet.
std::atomic<uint64_t> g_posts_dropped{0};
std::atomic<uint64_t> g_posts_dropped_reported{0};
std::atomic<bool> g_drop_said{false};

// > 0 while this thread runs shim code: nothing it does is posted.
__thread int t_depth __attribute__((tls_model("initial-exec"))) = 0;

struct Guard {
  Guard() { ++t_depth; }
  ~Guard() { --t_depth; }
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;
};

// Restores errno on scope exit to what it was when armed.
struct ErrnoKeeper {
  int saved = errno;
  ~ErrnoKeeper() { errno = saved; }
};

// Descriptors libpostspool opened (its socket, spool files): a host that
// closes or overwrites one of them (programs that close every descriptor)
// makes the client unusable, since the number may now name a host file.
constexpr int kOwnedFdsMax = 65536;
std::atomic<uint64_t> g_owned[kOwnedFdsMax / 64];

void SetOwned(int fd) {
  if (fd >= 0 && fd < kOwnedFdsMax) {
    g_owned[fd / 64].fetch_or(uint64_t{1} << (fd % 64), std::memory_order_relaxed);
  }
}
void ClearOwned(int fd) {
  if (fd >= 0 && fd < kOwnedFdsMax) {
    g_owned[fd / 64].fetch_and(~(uint64_t{1} << (fd % 64)), std::memory_order_relaxed);
  }
}
bool IsOwned(int fd) {
  return fd >= 0 && fd < kOwnedFdsMax &&
         (g_owned[fd / 64].load(std::memory_order_relaxed) >> (fd % 64) & 1) != 0;
}

// The host closed a descriptor of the client: abandon the client (its state
// names descriptors that are no longer its own, so it is neither used nor
// closed again) and open a fresh one on the next post.
void AbandonClient(int fd) {
  ClearOwned(fd);
  g_client.store(nullptr, std::memory_order_release);
}

// A small spin lock for the shim's tables: never held across a call that
// could block or re-enter the shim.
class SpinLock {
 public:
  void lock() {
    while (flag_.test_and_set(std::memory_order_acquire)) {
    }
  }
  void unlock() { flag_.clear(std::memory_order_release); }
  // In a fork child: a thread of the parent that held it does not exist.
  void reset() { flag_.clear(std::memory_order_relaxed); }

 private:
  std::atomic_flag flag_ = ATOMIC_FLAG_INIT;
};

// Extra descriptors made by dup/dup2/dup3 of a written file: closing one of
// them is not the last close, so it is not posted (the shell opens f, dup2s
// it onto 1 and closes the original before the command writes).
struct DupCount {
  dev_t dev;
  ino_t ino;
  int count;
};
constexpr int kDupCountsMax = 64;
DupCount g_dups[kDupCountsMax];
SpinLock g_dups_lock;

void AddDup(dev_t dev, ino_t ino) {
  g_dups_lock.lock();
  int free_slot = -1;
  for (int i = 0; i < kDupCountsMax; ++i) {
    if (g_dups[i].count > 0 && g_dups[i].dev == dev && g_dups[i].ino == ino) {
      ++g_dups[i].count;
      g_dups_lock.unlock();
      return;
    }
    if (g_dups[i].count == 0 && free_slot < 0) free_slot = i;
  }
  if (free_slot >= 0) g_dups[free_slot] = DupCount{dev, ino, 1};
  g_dups_lock.unlock();
}

// True (and one fewer) if the file has another descriptor made by dup.
bool TakeDup(dev_t dev, ino_t ino) {
  g_dups_lock.lock();
  for (int i = 0; i < kDupCountsMax; ++i) {
    if (g_dups[i].count > 0 && g_dups[i].dev == dev && g_dups[i].ino == ino) {
      --g_dups[i].count;
      g_dups_lock.unlock();
      return true;
    }
  }
  g_dups_lock.unlock();
  return false;
}

// shim_post_minterval: when each recent path was last posted (a path hash
// per slot; a collision at worst posts once more).
struct RecentPost {
  uint64_t hash;
  int64_t at_ns;
};
constexpr int kRecentPostsMax = 256;
RecentPost g_recent[kRecentPostsMax];
SpinLock g_recent_lock;

int64_t MonotonicNs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// False if the same path was posted less than shim_post_minterval ago.
bool OutsideMinInterval(const char* path) {
  if (g_config->shim_post_minterval_ns <= 0) return true;
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (const char* p = path; *p != 0; ++p) h = (h ^ static_cast<unsigned char>(*p)) * 1099511628211ull;
  const int64_t now = MonotonicNs();
  RecentPost& slot = g_recent[h % kRecentPostsMax];
  g_recent_lock.lock();
  const bool post = slot.hash != h || now - slot.at_ns >= g_config->shim_post_minterval_ns;
  if (post) slot = RecentPost{h, now};
  g_recent_lock.unlock();
  return post;
}

// ---------------------------------------------------------------------------
// Initialisation: once, at the first interposed call (or before main).

// The child of fork(): the only thread is the one that forked, so locks that
// other threads of the parent held are free here.
void AtForkChild() {
  g_pid.store(static_cast<pid_t>(::syscall(SYS_getpid)), std::memory_order_relaxed);
  g_fork_child = true;
  g_posts_dropped.store(0, std::memory_order_relaxed);  // a new process: its own count
  g_posts_dropped_reported.store(0, std::memory_order_relaxed);
  g_drop_said.store(false, std::memory_order_relaxed);
  g_dups_lock.reset();
  g_recent_lock.reset();
  g_client_mutex = PTHREAD_MUTEX_INITIALIZER;
}

bool ReadWholeFile(const char* path, std::string* out) {
  const int fd = RawOpenAt(AT_FDCWD, path, O_RDONLY);
  if (fd < 0) return false;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out->append(buf, static_cast<size_t>(n));
  }
  RawClose(fd);
  return true;
}

void Complain(const std::string& what) {
  const std::string line = "libpostspool-shim: " + what + "; posting nothing\n";
  (void)!::write(STDERR_FILENO, line.data(), line.size());
}

// Parses the configuration, on the one thread that wins the race to it.
// Returns at once on the others (Active waits for the winner).
void Init() {
  InitState expected = InitState::kNotYet;
  if (!g_init.compare_exchange_strong(expected, InitState::kRunning, std::memory_order_acq_rel)) {
    return;
  }
  Guard guard;
  ErrnoKeeper keep_errno;
  auto* config = new Config;
  std::string error;
  bool ok = true;
  if (const char* file = ::getenv("POSTSPOOL_SHIM_CONFIG"); file != nullptr && *file != 0) {
    std::string text;
    if (!ReadWholeFile(file, &text)) {
      error = std::string("cannot read POSTSPOOL_SHIM_CONFIG ") + file + ": " + ::strerror(errno);
      ok = false;
    } else if (!ParseOptions(text, false, config, &error)) {
      error = std::string(file) + ": " + error;
      ok = false;
    }
  }
  if (const char* options = ::getenv("POSTSPOOL_SHIM_OPTIONS"); ok && options != nullptr) {
    if (!ParseOptions(options, true, config, &error)) {
      error = "POSTSPOOL_SHIM_OPTIONS: " + error;
      ok = false;
    }
  }
  if (!ok) Complain(error);
  if (!ok || !config->configured) {
    delete config;
    g_init.store(InitState::kInactive, std::memory_order_release);
    return;
  }
  g_config = config;
  g_pid.store(static_cast<pid_t>(::syscall(SYS_getpid)), std::memory_order_relaxed);
  ::pthread_atfork(nullptr, nullptr, AtForkChild);
  g_init.store(InitState::kActive, std::memory_order_release);
}

// How long a thread waits for another thread's Init. Init runs no host
// code and takes microseconds; the bound is for a child forked while a
// thread of its parent was in Init (that thread does not exist there).
constexpr int64_t kInitWaitNs = 1000000000;

// The shim's state once Init has finished, on whichever thread it runs.
// A thread that arrives while another initialises waits for it: taking
// kRunning for "inactive" lost the posts of threads that closed files
// together at start-up (issue 20).
InitState AwaitInit() {
  Init();
  InitState s = g_init.load(std::memory_order_acquire);
  if (s != InitState::kRunning) return s;
  const int64_t until = MonotonicNs() + kInitWaitNs;
  while ((s = g_init.load(std::memory_order_acquire)) == InitState::kRunning) {
    if (MonotonicNs() > until) {
      // Whatever this call would have posted is lost: count it (nothing
      // can be said, the configuration is unknown).
      g_posts_dropped.fetch_add(1, std::memory_order_relaxed);
      return s;
    }
    ::sched_yield();
  }
  return s;
}

// Under shim_debug, the count of posts not made, when the program ends or
// execs, if any.
void SayDropTotal() {
  const uint64_t n = g_posts_dropped.load(std::memory_order_relaxed);
  if (n == 0 || g_config == nullptr || !g_config->shim_debug) return;
  const std::string line =
      "libpostspool-shim: " + std::to_string(n) + " post(s) not made in this process, " +
      std::to_string(g_posts_dropped_reported.load(std::memory_order_relaxed)) +
      " of them counted by the daemon\n";
  (void)!::write(STDERR_FILENO, line.data(), line.size());
}

// Whether this call may post. Cheap on the common path.
bool Active() {
  if (t_depth > 0 || g_exiting.load(std::memory_order_relaxed)) return false;
  InitState s = g_init.load(std::memory_order_acquire);
  if (s == InitState::kNotYet || s == InitState::kRunning) s = AwaitInit();
  if (s != InitState::kActive) return false;
  return static_cast<pid_t>(::syscall(SYS_getpid)) == g_pid.load(std::memory_order_relaxed);
}

// A post the shim should have made and did not: `what` names it (a path),
// `why` the reason. Counted; under shim_debug one line each on stderr, else
// one line on stderr for the first in the process (libpostspool-shim(7),
// "POSTS NOT MADE").
void Dropped(const char* what, const char* why) {
  const uint64_t n = g_posts_dropped.fetch_add(1, std::memory_order_relaxed) + 1;
  // The node's count (shim_posts_dropped_total), through the uid's ring:
  // without a client or a ring it stays in this process.
  if (postspool_client* c = g_client.load(std::memory_order_acquire); c != nullptr) {
    if (postspool_report_dropped(c, 1) == POSTSPOOL_OK) {
      g_posts_dropped_reported.fetch_add(1, std::memory_order_relaxed);
    }
  }
  std::string line = "libpostspool-shim: post of ";
  line += what != nullptr ? what : "(unknown)";
  line += " not made: ";
  line += why;
  if (g_config != nullptr && g_config->shim_debug) {
    line += " (" + std::to_string(n) + " in this process)\n";
  } else if (!g_drop_said.exchange(true, std::memory_order_relaxed)) {
    line += "; later ones in this process are counted, not shown (shim_debug on shows each)\n";
  } else {
    return;
  }
  (void)!::write(STDERR_FILENO, line.data(), line.size());
}

// ---------------------------------------------------------------------------
// Paths.

constexpr size_t kPathMax = PATH_MAX;

// The path of a descriptor (/proc/self/fd); false if it has none or the
// file was removed.
bool FdPath(int fd, char* out) {
  char link[64];
  ::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = ::readlink(link, out, kPathMax - 1);
  if (n <= 0 || out[0] != '/') return false;
  out[n] = 0;
  static constexpr char kDeleted[] = " (deleted)";
  constexpr size_t kDeletedLen = sizeof kDeleted - 1;
  return !(static_cast<size_t>(n) > kDeletedLen && ::strcmp(out + n - kDeletedLen, kDeleted) == 0);
}

// The absolute, normalised form of `path` relative to `dirfd`. With
// realpathPost the directory part is resolved (symbolic links), the last
// component kept (it may be a link, or gone).
bool AbsPath(int dirfd, const char* path, char* out) {
  if (path == nullptr || path[0] == 0) return false;
  char joined[kPathMax * 2];
  if (path[0] == '/') {
    if (::strlen(path) >= sizeof joined) return false;
    ::strcpy(joined, path);
  } else {
    char base[kPathMax];
    if (dirfd == AT_FDCWD) {
      if (::syscall(SYS_getcwd, base, sizeof base) <= 0 || base[0] != '/') return false;
    } else if (!FdPath(dirfd, base)) {
      return false;
    }
    if (::snprintf(joined, sizeof joined, "%s/%s", base, path) >= static_cast<int>(sizeof joined)) {
      return false;
    }
  }
  if (!NormalisePath(joined, out, kPathMax)) return false;
  if (g_config->realpathPost) {
    char* slash = ::strrchr(out, '/');
    if (slash != nullptr && slash != out) {
      *slash = 0;
      char resolved[kPathMax];
      const bool ok = ::realpath(out, resolved) != nullptr;
      *slash = '/';
      if (ok) {
        char joined_again[kPathMax * 2];
        ::snprintf(joined_again, sizeof joined_again, "%s%s", resolved, slash);
        if (::strlen(joined_again) < kPathMax) ::strcpy(out, joined_again);
      }
    }
  }
  return true;
}

// ---------------------------------------------------------------------------
// Posting.

postspool_client* Client() {
  postspool_client* c = g_client.load(std::memory_order_acquire);
  if (c != nullptr) return c;
  ::pthread_mutex_lock(&g_client_mutex);
  c = g_client.load(std::memory_order_acquire);
  if (c == nullptr) {
    postspool_options options;
    postspool_options_init(&options);
    options.log_stderr = g_config->shim_debug ? 1 : 0;
    if (postspool_open(&options, &c) != POSTSPOOL_OK) c = nullptr;
    g_client.store(c, std::memory_order_release);
  }
  ::pthread_mutex_unlock(&g_client_mutex);
  return c;
}

void Send(struct postspool_post* post) {
  if (!g_config->post_baseUrl.empty()) post->base_url = g_config->post_baseUrl.c_str();
  postspool_client* c = Client();
  if (c == nullptr) {
    Dropped(post->rel_path, "libpostspool could not open a client");
    return;
  }
  if (const int rc = postspool_post(c, post, nullptr); rc != POSTSPOOL_OK) {
    Dropped(post->rel_path, postspool_strerror(rc));
  }
}

int64_t Ns(const timespec& t) { return int64_t{t.tv_sec} * 1000000000 + t.tv_nsec; }

void SetAttributes(const struct stat& st, struct postspool_post* post) {
  post->has_mode = 1;
  post->mode = st.st_mode & 07777;
  post->has_mtime = 1;
  post->mtime_ns = Ns(st.st_mtim);
  post->has_atime = 1;
  post->atime_ns = Ns(st.st_atim);
}

// Size, times, mode and identity of the regular file open on `fd`.
// `digest` must hold kSha512Bytes.
bool SetFileFields(int fd, const struct stat& st, uint8_t* digest, struct postspool_post* post) {
  SetAttributes(st, post);
  post->has_size = 1;
  post->size = st.st_size;
  switch (g_config->identity) {
    case Identity::kSha512:
      if (!Sha512OfFd(fd, digest)) return false;
      post->identity_method = POSTSPOOL_IDENTITY_SHA512;
      post->identity_value = digest;
      post->identity_size = kSha512Bytes;
      break;
    case Identity::kMd5:
      if (!Md5OfFd(fd, digest)) return false;
      post->identity_method = POSTSPOOL_IDENTITY_MD5;
      post->identity_value = digest;
      post->identity_size = kMd5Bytes;
      break;
    case Identity::kCod:
      post->identity_method = POSTSPOOL_IDENTITY_COD;
      post->identity_value = "sha512";
      post->identity_size = 6;
      break;
    case Identity::kNone:
      break;
  }
  return true;
}

// A written file: what it holds now. `expect` (when given) is the file the
// closed descriptor named: a file that was replaced or removed since is not
// posted.
void PostFile(const char* path, const struct stat* expect, const char* rename_from = nullptr,
              const char* hlink = nullptr) {
  const int fd = RawOpenAt(AT_FDCWD, path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    // Gone (removed, renamed) since: nothing to post. Else (a file the
    // program may write but not read, mode 0200) a post not made.
    if (errno != ENOENT && errno != ELOOP) Dropped(RelPathOf(*g_config, path), "cannot open it for reading");
    return;
  }
  struct stat st;
  uint8_t digest[kSha512Bytes];
  struct postspool_post post;
  postspool_post_init(&post);
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
      (expect == nullptr || (st.st_dev == expect->st_dev && st.st_ino == expect->st_ino))) {
    post.rel_path = RelPathOf(*g_config, path);
    if (!SetFileFields(fd, st, digest, &post)) {
      RawClose(fd);
      Dropped(post.rel_path, "cannot read it for its checksum");
      return;
    }
    post.rename = rename_from;
    post.hlink = hlink;
    RawClose(fd);
    Send(&post);
    return;
  }
  RawClose(fd);
}

// Anything that exists at `path` now (after a rename or link): a regular
// file with its content, a directory, a symbolic link with its target.
void PostEntry(const char* path, const char* rename_from, const char* hlink) {
  struct stat st;
  if (::lstat(path, &st) != 0) return;
  if (S_ISREG(st.st_mode)) {
    PostFile(path, nullptr, rename_from, hlink);
    return;
  }
  struct postspool_post post;
  postspool_post_init(&post);
  post.rel_path = RelPathOf(*g_config, path);
  post.rename = rename_from;
  char target[kPathMax];
  if (S_ISDIR(st.st_mode)) {
    post.op_flags = POSTSPOOL_OP_DIRECTORY;
    SetAttributes(st, &post);
  } else if (S_ISLNK(st.st_mode)) {
    const ssize_t n = ::readlink(path, target, sizeof target - 1);
    if (n <= 0) return;
    target[n] = 0;
    post.link = target;
  } else {
    return;  // FIFOs, sockets, devices: nothing a subscriber can copy
  }
  Send(&post);
}

void PostRemoved(const char* path, bool directory) {
  struct postspool_post post;
  postspool_post_init(&post);
  post.rel_path = RelPathOf(*g_config, path);
  post.op_flags = POSTSPOOL_OP_REMOVE | (directory ? POSTSPOOL_OP_DIRECTORY : 0u);
  Send(&post);
}

void PostSymlink(const char* path, const char* target) {
  struct postspool_post post;
  postspool_post_init(&post);
  post.rel_path = RelPathOf(*g_config, path);
  post.link = target;
  Send(&post);
}

// A descriptor about to be closed, if closing it may post: open for
// writing, a regular file, accepted by the configuration.
struct WrittenFile {
  struct stat st;
  char path[kPathMax];
};

bool InspectWritten(int fd, WrittenFile* f) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_ACCMODE) == O_RDONLY || (flags & O_PATH) != 0) return false;
  if (::fstat(fd, &f->st) != 0 || !S_ISREG(f->st.st_mode)) return false;
  return FdPath(fd, f->path) && Accepts(*g_config, f->path);
}

void PostWritten(const WrittenFile& f) {
  if (OutsideMinInterval(f.path)) PostFile(f.path, &f.st);
}

// Which descriptors CollectOpen takes.
enum class Collect {
  kClosing,  // all in the range (close_range, closefrom, exit); owned ones abandon the client
  kExec,     // those an exec closes (FD_CLOEXEC); owned ones are left alone
};

// Every written file still open, in [first, last] (each file once):
// at exit, at exec, and for close_range/closefrom. Returns how many files
// went to `out` (up to `max`; those over it are posts not made).
int CollectOpen(unsigned first, unsigned last, Collect which, WrittenFile* out, int max) {
  const int dir = RawOpenAt(AT_FDCWD, "/proc/self/fd", O_RDONLY | O_DIRECTORY);
  if (dir < 0) return 0;
  int n = 0;
  alignas(8) char buf[4096];
  for (;;) {
    const long got = ::syscall(SYS_getdents64, dir, buf, sizeof buf);
    if (got <= 0) break;
    for (long off = 0; off < got;) {
      const auto* d = reinterpret_cast<const struct dirent64*>(buf + off);
      off += d->d_reclen;
      if (d->d_name[0] < '0' || d->d_name[0] > '9') continue;
      const unsigned long ufd = ::strtoul(d->d_name, nullptr, 10);
      const int fd = static_cast<int>(ufd);
      if (ufd < first || ufd > last || fd == dir) continue;
      if (IsOwned(fd)) {
        if (which == Collect::kClosing) AbandonClient(fd);
        continue;
      }
      if (which == Collect::kExec) {
        const int fd_flags = ::fcntl(fd, F_GETFD);
        if (fd_flags < 0 || (fd_flags & FD_CLOEXEC) == 0) continue;
      }
      WrittenFile* f = &out[n < max ? n : max];  // out has max + 1 slots
      if (!InspectWritten(fd, f)) continue;
      bool seen = false;
      for (int i = 0; i < n && !seen; ++i) {
        seen = out[i].st.st_dev == f->st.st_dev && out[i].st.st_ino == f->st.st_ino;
      }
      if (seen) continue;
      if (n < max) {
        ++n;
      } else {
        Dropped(RelPathOf(*g_config, f->path), "more files open for writing than the shim tracks at once");
      }
    }
  }
  RawClose(dir);
  return n;
}

constexpr int kOpenFilesMax = 256;

// The files a closing range of descriptors leaves: collected before the
// call, posted after it. The buffer is a mapping of its own (a WrittenFile
// holds a path; 256 of them do not belong on a host thread's stack).
class RangeClose {
 public:
  RangeClose(unsigned first, unsigned last, Collect which = Collect::kClosing) {
    void* p = ::mmap(nullptr, Bytes(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      Dropped("(the files open for writing)", "no memory to list them");
      return;
    }
    files_ = static_cast<WrittenFile*>(p);
    count_ = CollectOpen(first, last, which, files_, kOpenFilesMax);
  }
  ~RangeClose() {
    if (files_ != nullptr) ::munmap(files_, Bytes());
  }
  RangeClose(const RangeClose&) = delete;
  RangeClose& operator=(const RangeClose&) = delete;
  void Post() {
    for (int i = 0; i < count_; ++i) PostWritten(files_[i]);
  }

 private:
  static size_t Bytes() { return sizeof(WrittenFile) * (kOpenFilesMax + 1); }
  WrittenFile* files_ = nullptr;
  int count_ = 0;
};

// At exit (after the program's own exit handlers, before any library is
// torn down), or at _exit: post what is still open, then post nothing more.
void PostAtExit() {
  if (!Active()) return;
  {
    Guard guard;
    ErrnoKeeper keep_errno;
    RangeClose open(0, ~0u);
    open.Post();
    SayDropTotal();
  }
  g_exiting.store(true, std::memory_order_relaxed);
}

// Before an exec replaces the program: the kernel closes the descriptors
// marked close-on-exec without a close() the shim sees, so the files
// written through them are posted here (the others stay open in the new
// program, which posts them at its last close or exit if it runs under the
// shim). Not in a fork child: its descriptors are its parent's, which is
// still writing and posts at its own close.
void PostBeforeExec() {
  if (g_fork_child || !Active()) return;
  Guard guard;
  ErrnoKeeper keep_errno;
  RangeClose closing(0, ~0u, Collect::kExec);
  closing.Post();
  SayDropTotal();
}

int WrappedMain(int argc, char** argv, char** envp) {
  // Registered here, after the C library registered the dynamic linker's
  // finaliser, so it runs before any library's destructors; and before the
  // program's own handlers, so it runs after them (coreutils' close_stdout).
  ::atexit(PostAtExit);
  // Initialised before the program's own code runs, so that threads it
  // starts find the shim ready (Active also waits, for threads started by
  // constructors).
  (void)Active();
  return g_real_main(argc, argv, envp);
}

// Shared by close and the closing half of dup2/dup3.
struct PendingClose {
  bool post = false;
  WrittenFile file;
};

// The descriptor `fd` is about to be closed (by close, or replaced by
// dup2/dup3): abandons the client if it was the client's; else finds out
// whether the close should post.
void BeforeClose(int fd, PendingClose* pending) {
  if (IsOwned(fd)) {
    AbandonClient(fd);
    return;
  }
  pending->post = InspectWritten(fd, &pending->file);
}

void AfterClose(const PendingClose& pending) {
  if (!pending.post) return;
  if (TakeDup(pending.file.st.st_dev, pending.file.st.st_ino)) return;  // not the last
  PostWritten(pending.file);
}

// After a successful dup of `fd`: one more descriptor of its file.
void CountDup(int fd) {
  WrittenFile f;
  if (InspectWritten(fd, &f)) AddDup(f.st.st_dev, f.st.st_ino);
}

// Path calls: the absolute paths, computed before the call.
bool Watched(int dirfd, const char* path, char* abs) {
  return AbsPath(dirfd, path, abs) && Accepts(*g_config, abs);
}

}  // namespace
}  // namespace postspool::shim

using namespace postspool::shim;  // NOLINT: the interposers below are C symbols

// ---------------------------------------------------------------------------
// Descriptors.

SHIM_EXPORT int close(int fd) {
  if (t_depth > 0) ClearOwned(fd);
  if (!Active()) return REAL(close)(fd);
  Guard guard;
  const int entry_errno = errno;
  PendingClose pending;
  BeforeClose(fd, &pending);
  errno = entry_errno;
  const int rc = REAL(close)(fd);
  const int call_errno = errno;
  // Linux frees the descriptor even when close fails (EINTR, EIO): only
  // EBADF means nothing was closed.
  if (!(rc != 0 && call_errno == EBADF)) AfterClose(pending);
  errno = call_errno;
  return rc;
}

SHIM_EXPORT int fclose(FILE* stream) {
  if (!Active()) return REAL(fclose)(stream);
  Guard guard;
  const int entry_errno = errno;
  PendingClose pending;
  const int fd = stream != nullptr ? ::fileno(stream) : -1;
  if (fd >= 0) BeforeClose(fd, &pending);
  errno = entry_errno;
  const int rc = REAL(fclose)(stream);
  const int call_errno = errno;
  AfterClose(pending);
  errno = call_errno;
  return rc;
}

namespace {

int DupOnto(int oldfd, int newfd, int flags, bool three) {
  const auto call = [&]() {
    return three ? REAL(dup3)(oldfd, newfd, flags) : REAL(dup2)(oldfd, newfd);
  };
  if (t_depth > 0) {
    const int rc = call();
    if (rc >= 0) SetOwned(rc);
    return rc;
  }
  if (oldfd == newfd || !Active()) return call();
  Guard guard;
  const int entry_errno = errno;
  PendingClose pending;
  BeforeClose(newfd, &pending);
  errno = entry_errno;
  const int rc = call();
  const int call_errno = errno;
  if (rc >= 0) {
    AfterClose(pending);
    CountDup(rc);
  }
  errno = call_errno;
  return rc;
}

}  // namespace

SHIM_EXPORT int dup2(int oldfd, int newfd) { return DupOnto(oldfd, newfd, 0, false); }
SHIM_EXPORT int dup3(int oldfd, int newfd, int flags) { return DupOnto(oldfd, newfd, flags, true); }

SHIM_EXPORT int dup(int oldfd) {
  const int rc = REAL(dup)(oldfd);
  if (rc < 0) return rc;
  if (t_depth > 0) {
    SetOwned(rc);
    return rc;
  }
  if (!Active()) return rc;
  Guard guard;
  ErrnoKeeper keep_errno;
  CountDup(rc);
  return rc;
}

SHIM_EXPORT int close_range(unsigned first, unsigned last, int flags) {
  if (!Active() || (flags & CLOSE_RANGE_CLOEXEC) != 0) return REAL(close_range)(first, last, flags);
  Guard guard;
  const int entry_errno = errno;
  RangeClose closing(first, last);
  errno = entry_errno;
  const int rc = REAL(close_range)(first, last, flags);
  const int call_errno = errno;
  if (rc == 0) closing.Post();
  errno = call_errno;
  return rc;
}

SHIM_EXPORT void closefrom(int lowfd) {
  if (!Active() || lowfd < 0) return REAL(closefrom)(lowfd);
  Guard guard;
  const int entry_errno = errno;
  RangeClose closing(static_cast<unsigned>(lowfd), ~0u);
  errno = entry_errno;
  REAL(closefrom)(lowfd);
  const int call_errno = errno;
  closing.Post();
  errno = call_errno;
}

// The descriptors libpostspool opens are recorded (see IsOwned); the host's
// are passed through untouched.
#define SHIM_OPEN_MODE(flags, mode)                  \
  mode_t mode = 0;                                   \
  if (((flags) & O_CREAT) != 0 || ((flags) & O_TMPFILE) == O_TMPFILE) { \
    va_list ap;                                      \
    va_start(ap, flags);                             \
    mode = static_cast<mode_t>(va_arg(ap, int));     \
    va_end(ap);                                      \
  }

SHIM_EXPORT int open(const char* path, int flags, ...) {
  SHIM_OPEN_MODE(flags, mode)
  const int fd = REAL(open)(path, flags, mode);
  if (t_depth > 0 && fd >= 0) SetOwned(fd);
  return fd;
}

SHIM_EXPORT int open64(const char* path, int flags, ...) {
  SHIM_OPEN_MODE(flags, mode)
  const int fd = REAL(open64)(path, flags, mode);
  if (t_depth > 0 && fd >= 0) SetOwned(fd);
  return fd;
}

SHIM_EXPORT int openat(int dirfd, const char* path, int flags, ...) {
  SHIM_OPEN_MODE(flags, mode)
  const int fd = REAL(openat)(dirfd, path, flags, mode);
  if (t_depth > 0 && fd >= 0) SetOwned(fd);
  return fd;
}

SHIM_EXPORT int openat64(int dirfd, const char* path, int flags, ...) {
  SHIM_OPEN_MODE(flags, mode)
  const int fd = REAL(openat64)(dirfd, path, flags, mode);
  if (t_depth > 0 && fd >= 0) SetOwned(fd);
  return fd;
}

SHIM_EXPORT int socket(int domain, int type, int protocol) {
  const int fd = REAL(socket)(domain, type, protocol);
  if (t_depth > 0 && fd >= 0) SetOwned(fd);
  return fd;
}

// ---------------------------------------------------------------------------
// Names.

namespace {

// Runs `call` and, when it succeeded and the shim is active, `post`: the
// shape of every path call. `before` computes what `post` needs and says
// whether there is anything to post.
template <typename Before, typename Call, typename Post>
int PathCall(Before before, Call call, Post post) {
  if (!Active()) return call();
  Guard guard;
  const int entry_errno = errno;
  const bool watch = before();
  errno = entry_errno;
  const int rc = call();
  const int call_errno = errno;
  if (rc == 0 && watch) post();
  errno = call_errno;
  return rc;
}

struct TwoPaths {
  char from[kPathMax];
  char to[kPathMax];
  bool from_watched = false;
  bool to_watched = false;
};

int RenameCall(int olddirfd, const char* oldpath, int newdirfd, const char* newpath,
               unsigned flags, bool at2) {
  TwoPaths p;
  return PathCall(
      [&] {
        p.from_watched = Watched(olddirfd, oldpath, p.from);
        p.to_watched = Watched(newdirfd, newpath, p.to);
        return p.from_watched || p.to_watched;
      },
      [&] {
        return at2 ? REAL(renameat2)(olddirfd, oldpath, newdirfd, newpath, flags)
                   : REAL(renameat)(olddirfd, oldpath, newdirfd, newpath);
      },
      [&] {
        if ((flags & RENAME_EXCHANGE) != 0) {
          // Both names now hold what the other held.
          if (p.to_watched) PostEntry(p.to, nullptr, nullptr);
          if (p.from_watched) PostEntry(p.from, nullptr, nullptr);
          return;
        }
        if (p.to_watched) {
          // From outside the watched names, the file simply appears. The
          // old name goes out as its absolute path (post_baseDir kept), the
          // form an sr3 subscriber maps onto its tree (FORMAT.md, "fileOp
          // values").
          PostEntry(p.to, p.from_watched ? p.from : nullptr, nullptr);
        } else {
          struct stat st;
          PostRemoved(p.from, ::lstat(p.to, &st) == 0 && S_ISDIR(st.st_mode));
        }
      });
}

}  // namespace

SHIM_EXPORT int rename(const char* oldpath, const char* newpath) {
  if (!Active()) return REAL(rename)(oldpath, newpath);
  return RenameCall(AT_FDCWD, oldpath, AT_FDCWD, newpath, 0, false);
}
SHIM_EXPORT int renameat(int olddirfd, const char* oldpath, int newdirfd, const char* newpath) {
  if (!Active()) return REAL(renameat)(olddirfd, oldpath, newdirfd, newpath);
  return RenameCall(olddirfd, oldpath, newdirfd, newpath, 0, false);
}
SHIM_EXPORT int renameat2(int olddirfd, const char* oldpath, int newdirfd, const char* newpath,
                          unsigned flags) {
  if (!Active()) return REAL(renameat2)(olddirfd, oldpath, newdirfd, newpath, flags);
  return RenameCall(olddirfd, oldpath, newdirfd, newpath, flags, true);
}

namespace {

int LinkCall(int olddirfd, const char* oldpath, int newdirfd, const char* newpath, int flags,
             bool at) {
  TwoPaths p;
  return PathCall(
      [&] {
        p.to_watched = Watched(newdirfd, newpath, p.to);
        return p.to_watched;
      },
      [&] {
        return at ? REAL(linkat)(olddirfd, oldpath, newdirfd, newpath, flags)
                  : REAL(link)(oldpath, newpath);
      },
      // A hard link is posted as the file it now is, with its content, not
      // as fileOp hlink: sr3 subscribers do not apply hlink (its link1file
      // reads fileOp.link first: KeyError), and a subscriber that never had
      // the other name could not link to it anyway.
      [&] { PostEntry(p.to, nullptr, nullptr); });
}

int SymlinkCall(const char* target, int newdirfd, const char* linkpath, bool at) {
  char abs[kPathMax];
  return PathCall([&] { return target != nullptr && Watched(newdirfd, linkpath, abs); },
                  [&] {
                    return at ? REAL(symlinkat)(target, newdirfd, linkpath)
                              : REAL(symlink)(target, linkpath);
                  },
                  [&] { PostSymlink(abs, target); });
}

int RemoveCall(int dirfd, const char* path, int call_kind, int flags) {
  // call_kind: 0 unlink, 1 unlinkat, 2 rmdir, 3 remove
  char abs[kPathMax];
  bool directory = call_kind == 2 || (call_kind == 1 && (flags & AT_REMOVEDIR) != 0);
  return PathCall(
      [&] {
        if (!Watched(dirfd, path, abs)) return false;
        if (call_kind == 3) {
          struct stat st;
          directory = ::lstat(abs, &st) == 0 && S_ISDIR(st.st_mode);
        }
        return true;
      },
      [&] {
        switch (call_kind) {
          case 0: return REAL(unlink)(path);
          case 1: return REAL(unlinkat)(dirfd, path, flags);
          case 2: return REAL(rmdir)(path);
          default: return REAL(remove)(path);
        }
      },
      [&] { PostRemoved(abs, directory); });
}

int MkdirCall(int dirfd, const char* path, mode_t mode, bool at) {
  char abs[kPathMax];
  return PathCall([&] { return Watched(dirfd, path, abs); },
                  [&] { return at ? REAL(mkdirat)(dirfd, path, mode) : REAL(mkdir)(path, mode); },
                  [&] { PostEntry(abs, nullptr, nullptr); });
}

}  // namespace

SHIM_EXPORT int link(const char* oldpath, const char* newpath) {
  if (!Active()) return REAL(link)(oldpath, newpath);
  return LinkCall(AT_FDCWD, oldpath, AT_FDCWD, newpath, 0, false);
}
SHIM_EXPORT int linkat(int olddirfd, const char* oldpath, int newdirfd, const char* newpath,
                       int flags) {
  if (!Active()) return REAL(linkat)(olddirfd, oldpath, newdirfd, newpath, flags);
  return LinkCall(olddirfd, oldpath, newdirfd, newpath, flags, true);
}
SHIM_EXPORT int symlink(const char* target, const char* linkpath) {
  if (!Active()) return REAL(symlink)(target, linkpath);
  return SymlinkCall(target, AT_FDCWD, linkpath, false);
}
SHIM_EXPORT int symlinkat(const char* target, int newdirfd, const char* linkpath) {
  if (!Active()) return REAL(symlinkat)(target, newdirfd, linkpath);
  return SymlinkCall(target, newdirfd, linkpath, true);
}
SHIM_EXPORT int unlink(const char* path) {
  if (!Active()) return REAL(unlink)(path);
  return RemoveCall(AT_FDCWD, path, 0, 0);
}
SHIM_EXPORT int unlinkat(int dirfd, const char* path, int flags) {
  if (!Active()) return REAL(unlinkat)(dirfd, path, flags);
  return RemoveCall(dirfd, path, 1, flags);
}
SHIM_EXPORT int rmdir(const char* path) {
  if (!Active()) return REAL(rmdir)(path);
  return RemoveCall(AT_FDCWD, path, 2, 0);
}
SHIM_EXPORT int remove(const char* path) {
  if (!Active()) return REAL(remove)(path);
  return RemoveCall(AT_FDCWD, path, 3, 0);
}
SHIM_EXPORT int mkdir(const char* path, mode_t mode) {
  if (!Active()) return REAL(mkdir)(path, mode);
  return MkdirCall(AT_FDCWD, path, mode, false);
}
SHIM_EXPORT int mkdirat(int dirfd, const char* path, mode_t mode) {
  if (!Active()) return REAL(mkdirat)(dirfd, path, mode);
  return MkdirCall(dirfd, path, mode, true);
}

namespace {

template <typename Call>
int TruncateCall(const char* path, Call call) {
  char abs[kPathMax];
  return PathCall([&] { return Watched(AT_FDCWD, path, abs); }, call,
                  [&] {
                    if (OutsideMinInterval(abs)) PostFile(abs, nullptr);
                  });
}

}  // namespace

SHIM_EXPORT int truncate(const char* path, off_t length) {
  return TruncateCall(path, [&] { return REAL(truncate)(path, length); });
}
SHIM_EXPORT int truncate64(const char* path, off64_t length) {
  return TruncateCall(path, [&] { return REAL(truncate64)(path, length); });
}

// ---------------------------------------------------------------------------
// Process start and end.

// The C library's start, which calls main: declared in no header.
SHIM_EXPORT int __libc_start_main(int (*main)(int, char**, char**), int argc, char** argv,
                                  void (*init)(), void (*fini)(), void (*rtld_fini)(),
                                  void* stack_end);
SHIM_EXPORT int __libc_start_main(int (*main)(int, char**, char**), int argc, char** argv,
                                  void (*init)(), void (*fini)(), void (*rtld_fini)(),
                                  void* stack_end) {
  using StartMain = int (*)(int (*)(int, char**, char**), int, char**, void (*)(), void (*)(),
                            void (*)(), void*);
  static std::atomic<StartMain> slot{nullptr};
  const StartMain real = Next(&slot, "__libc_start_main");
  g_real_main = main;
  return real(WrappedMain, argc, argv, init, fini, rtld_fini, stack_end);
}

// The exec family: each variant the C library has, because its own calls
// between them (execl to execve, say) do not go through the interposers.
// posix_spawn and system make a new process and are not needed.
SHIM_EXPORT int execve(const char* path, char* const argv[], char* const envp[]) {
  PostBeforeExec();
  return REAL(execve)(path, argv, envp);
}
SHIM_EXPORT int execv(const char* path, char* const argv[]) {
  PostBeforeExec();
  return REAL(execv)(path, argv);
}
SHIM_EXPORT int execvp(const char* file, char* const argv[]) {
  PostBeforeExec();
  return REAL(execvp)(file, argv);
}
SHIM_EXPORT int execvpe(const char* file, char* const argv[], char* const envp[]) {
  PostBeforeExec();
  return REAL(execvpe)(file, argv, envp);
}
SHIM_EXPORT int fexecve(int fd, char* const argv[], char* const envp[]) {
  PostBeforeExec();
  return REAL(fexecve)(fd, argv, envp);
}
SHIM_EXPORT int execveat(int dirfd, const char* path, char* const argv[], char* const envp[],
                         int flags) {
  PostBeforeExec();
  return REAL(execveat)(dirfd, path, argv, envp, flags);
}

namespace {

// The arguments of execl, execle and execlp, up to their terminating null
// pointer, become an argv array on the caller's stack, as the C library
// builds it (an exec after fork in a threaded program may not allocate).
constexpr size_t kExeclArgsMax = 1 << 20;

// How many arguments (arg0 included) come before the null pointer; 0 if
// more than kExeclArgsMax.
size_t CountExeclArgs(va_list* ap) {
  va_list count;
  va_copy(count, *ap);
  size_t n = 1;
  while (va_arg(count, char*) != nullptr) {
    if (++n > kExeclArgsMax) {
      n = 0;
      break;
    }
  }
  va_end(count);
  return n;
}

// Fills argv[0..argc] (the last a null pointer) and leaves *ap after the
// null pointer (execle's envp).
void FillExeclArgs(const char* arg0, va_list* ap, size_t argc, char** argv) {
  argv[0] = const_cast<char*>(arg0);
  for (size_t i = 1; i <= argc; ++i) argv[i] = va_arg(*ap, char*);
}

}  // namespace

#define SHIM_EXECL_ARGV(arg0)                                                    \
  va_list ap;                                                                  \
  va_start(ap, arg0);                                                          \
  const size_t argc = CountExeclArgs(&ap);                                     \
  if (argc == 0) {                                                             \
    va_end(ap);                                                                \
    errno = E2BIG;                                                             \
    return -1;                                                                 \
  }                                                                            \
  char** argv = static_cast<char**>(__builtin_alloca((argc + 1) * sizeof(char*))); \
  FillExeclArgs(arg0, &ap, argc, argv);

SHIM_EXPORT int execl(const char* path, const char* arg, ...) {
  SHIM_EXECL_ARGV(arg)
  va_end(ap);
  PostBeforeExec();
  return REAL(execv)(path, argv);
}
SHIM_EXPORT int execlp(const char* file, const char* arg, ...) {
  SHIM_EXECL_ARGV(arg)
  va_end(ap);
  PostBeforeExec();
  return REAL(execvp)(file, argv);
}
SHIM_EXPORT int execle(const char* path, const char* arg, ...) {
  SHIM_EXECL_ARGV(arg)
  char* const* envp = va_arg(ap, char* const*);
  va_end(ap);
  PostBeforeExec();
  return REAL(execve)(path, argv, envp);
}

SHIM_EXPORT void _exit(int status) {
  PostAtExit();
  REAL(_exit)(status);
  ::syscall(SYS_exit_group, status);
  __builtin_unreachable();
}

SHIM_EXPORT void _Exit(int status) {
  PostAtExit();
  REAL(_Exit)(status);
  ::syscall(SYS_exit_group, status);
  __builtin_unreachable();
}

// Runs when the shim is unloaded (the end of exit, or dlclose): from here on
// the libraries it uses may be gone.
__attribute__((destructor)) static void ShimUnloading() {
  g_exiting.store(true, std::memory_order_relaxed);
}
