// Writing segments: atomic creation, appends from many processes at once,
// sealing, and the spool's current-segment protocol.
#include "segment_writer.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstddef>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include "test_util.h"

namespace postspool::segment {
namespace {

using namespace std::chrono_literals;
using testing::NumberedPost;
using testing::ReadFile;
using testing::TempDir;

Deadline In(Clock::duration d) { return Clock::now() + d; }

std::vector<std::byte> Framed(const PostData& post) {
  std::vector<std::byte> out;
  if (!AppendRecord(testing::PostPayload(post), &out).ok()) std::abort();
  return out;
}

// Runs `body` in a child process; returns a waitable pid. The child exits 0
// if body returns true.
template <typename F>
pid_t Spawn(F body) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body() ? 0 : 1);
  return pid;
}

bool WaitOk(pid_t pid) {
  int status = 0;
  return ::waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

TEST(CreateSegment, WritesTheHeaderWithTheExactModeAndRefusesAnExistingName) {
  TempDir dir;
  const mode_t old_umask = ::umask(077);
  UniqueFd fd;
  ASSERT_TRUE(CreateSegment(dir.fd(), "a.seg", NewHeader(5), 0640, true, &fd).ok());
  ::umask(old_umask);
  struct stat st;
  ASSERT_EQ(::stat(dir.File("a.seg").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_EQ(st.st_size, static_cast<off_t>(kHeaderBytes));
  Header h;
  ASSERT_TRUE(ReadHeader(fd.get(), &h).ok());
  EXPECT_EQ(h.segment_id, 5u);
  EXPECT_EQ(h.creator_pid, static_cast<uint32_t>(::getpid()));
  EXPECT_FALSE(h.sealed());

  UniqueFd again;
  EXPECT_EQ(CreateSegment(dir.fd(), "a.seg", NewHeader(6), 0640, false, &again).code(),
            StatusCode::kAlreadyExists);
  ASSERT_TRUE(ReadHeader(fd.get(), &h).ok());
  EXPECT_EQ(h.segment_id, 5u);
  EXPECT_EQ(dir.List().size(), 1u) << "no temporary file left behind";
}

TEST(AppendToSegment, AppendedRecordsReadBack) {
  TempDir dir;
  UniqueFd fd;
  ASSERT_TRUE(CreateSegment(dir.fd(), "s", NewHeader(1), 0600, false, &fd).ok());
  std::vector<PostData> posts;
  for (int i = 0; i < 20; ++i) {
    posts.push_back(NumberedPost(1, static_cast<uint64_t>(i)));
    ASSERT_TRUE(AppendToSegment(fd.get(), Framed(posts.back()), In(1s), i % 2 == 0).ok());
  }
  EXPECT_EQ(ReadFile(dir.File("s")).posts, posts);
}

TEST(AppendToSegment, SealedSegmentRefusesAppendsAndIsLeftUnchanged) {
  TempDir dir;
  UniqueFd fd;
  ASSERT_TRUE(CreateSegment(dir.fd(), "s", NewHeader(1), 0600, false, &fd).ok());
  ASSERT_TRUE(AppendToSegment(fd.get(), Framed(NumberedPost(1, 1)), In(1s), false).ok());
  UniqueFd sealer(::openat(dir.fd(), "s", O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(SealSegment(sealer.get(), In(1s)).ok());
  ASSERT_TRUE(SealSegment(sealer.get(), In(1s)).ok()) << "sealing twice is fine";
  struct stat before, after;
  ASSERT_EQ(::fstat(fd.get(), &before), 0);
  EXPECT_EQ(AppendToSegment(fd.get(), Framed(NumberedPost(1, 2)), In(1s), false).code(),
            StatusCode::kSealed);
  ASSERT_EQ(::fstat(fd.get(), &after), 0);
  EXPECT_EQ(before.st_size, after.st_size);
  Header h;
  ASSERT_TRUE(ReadHeader(fd.get(), &h).ok());
  EXPECT_TRUE(h.sealed());
  EXPECT_EQ(ReadFile(dir.File("s")).posts.size(), 1u);
}

TEST(SealSegment, RefusesAnAppendModeDescriptor) {
  TempDir dir;
  UniqueFd fd;
  ASSERT_TRUE(CreateSegment(dir.fd(), "s", NewHeader(1), 0600, false, &fd).ok());
  EXPECT_EQ(SealSegment(fd.get(), In(1s)).code(), StatusCode::kInvalidArgument);
}

TEST(SealSegment, WaitsForAnAppendInProgressAndTimesOutBoundedly) {
  TempDir dir;
  UniqueFd fd;
  ASSERT_TRUE(CreateSegment(dir.fd(), "s", NewHeader(1), 0600, false, &fd).ok());
  UniqueFd appender(::openat(dir.fd(), "s", O_RDWR | O_APPEND | O_CLOEXEC));
  ASSERT_EQ(::flock(appender.get(), LOCK_SH), 0);  // an append in progress
  UniqueFd sealer(::openat(dir.fd(), "s", O_RDWR | O_CLOEXEC));
  const auto start = Clock::now();
  EXPECT_EQ(SealSegment(sealer.get(), In(30ms)).code(), StatusCode::kTimedOut);
  EXPECT_LT(Clock::now() - start, 1s);
  ASSERT_EQ(::flock(appender.get(), LOCK_UN), 0);
  EXPECT_TRUE(SealSegment(sealer.get(), In(1s)).ok());
}

TEST(AppendToSegment, TimesOutWhileTheSealerHoldsTheLockAndWritesNothing) {
  TempDir dir;
  UniqueFd fd;
  ASSERT_TRUE(CreateSegment(dir.fd(), "s", NewHeader(1), 0600, false, &fd).ok());
  UniqueFd sealer(::openat(dir.fd(), "s", O_RDWR | O_CLOEXEC));
  ASSERT_EQ(::flock(sealer.get(), LOCK_EX), 0);
  EXPECT_EQ(AppendToSegment(fd.get(), Framed(NumberedPost(1, 1)), In(20ms), false).code(),
            StatusCode::kTimedOut);
  struct stat st;
  ASSERT_EQ(::fstat(fd.get(), &st), 0);
  EXPECT_EQ(st.st_size, static_cast<off_t>(kHeaderBytes));
}

TEST(SpoolNames, FormatAndParseRoundTrip) {
  EXPECT_EQ(SpoolCurrentName(1000), "1000.current");
  EXPECT_EQ(SpoolSealedName(1000, 0xabcULL), "1000.0000000000000abc.sealed");
  auto cur = ParseSpoolName("1000.current");
  ASSERT_TRUE(cur);
  EXPECT_TRUE(cur->current);
  EXPECT_EQ(cur->uid, 1000u);
  EXPECT_EQ(SpoolPrivateCurrentName(1000, 0xabcULL), "1000.0000000000000abc.current");
  auto own = ParseSpoolName("1000.00000000deadbeef.current");
  ASSERT_TRUE(own);
  EXPECT_TRUE(own->current);
  EXPECT_EQ(own->uid, 1000u);
  EXPECT_EQ(own->segment_id, 0xdeadbeefULL);
  auto sealed = ParseSpoolName("0.ffffffffffffffff.sealed");
  ASSERT_TRUE(sealed);
  EXPECT_FALSE(sealed->current);
  EXPECT_EQ(sealed->uid, 0u);
  EXPECT_EQ(sealed->segment_id, 0xffffffffffffffffULL);
  for (const char* bad : {"", ".current", "01000.current", "x.current", "1000.cur",
                          "1000.abc.sealed", "1000.0000000000000ABC.sealed",
                          "99999999999.current", ".tmp.12.0000000000000abc", "1000",
                          "1000.abc.current", "1000.0000000000000ABC.current",
                          "1000.0000000000000abc.currentx", "1000.0000000000000abc.",
                          "1000.0000000000000abcd.current", "1000.0000000000000abc.other"}) {
    EXPECT_FALSE(ParseSpoolName(bad)) << bad;
  }
}

// The names in `dir` that parse as a current segment of `uid`.
std::vector<std::string> CurrentNames(const TempDir& dir, uid_t uid) {
  std::vector<std::string> out;
  for (const std::string& name : dir.List()) {
    const auto parsed = ParseSpoolName(name);
    if (parsed && parsed->current && parsed->uid == uid) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(SegmentAppender, AFifoUnderTheCurrentNameSendsWritersToAPrivateSegment) {
  TempDir dir;
  const uid_t uid = ::geteuid();
  ASSERT_EQ(::mkfifoat(dir.fd(), SpoolCurrentName(uid).c_str(), 0666), 0);
  SegmentAppender appender(dir.fd(), uid, {});
  ASSERT_TRUE(appender.Append(Framed(NumberedPost(1, 1)), In(1s)).ok());
  ASSERT_TRUE(appender.Append(Framed(NumberedPost(1, 2)), In(1s)).ok());
  const std::string private_name = appender.current_name();
  EXPECT_NE(private_name, SpoolCurrentName(uid));
  const auto parsed = ParseSpoolName(private_name);
  ASSERT_TRUE(parsed) << private_name;
  EXPECT_TRUE(parsed->current);
  EXPECT_EQ(parsed->segment_id, appender.segment_id()) << "name and header carry one id";
  EXPECT_EQ(ReadFile(dir.File(private_name)).posts.size(), 2u);

  // The daemon takes the private segment away: the next append makes a new
  // private segment, since the FIFO is still there.
  const std::string sealed = SpoolSealedName(uid, parsed->segment_id);
  ASSERT_EQ(::renameat(dir.fd(), private_name.c_str(), dir.fd(), sealed.c_str()), 0);
  ASSERT_TRUE(appender.Append(Framed(NumberedPost(1, 3)), In(1s)).ok());
  EXPECT_NE(appender.current_name(), private_name);
  const auto names = CurrentNames(dir, uid);
  ASSERT_EQ(names.size(), 2u);  // the FIFO and the new private segment
  const auto current = ReadFile(dir.File(appender.current_name()));
  ASSERT_EQ(current.posts.size(), 1u);
  EXPECT_EQ(current.posts[0].id, (PostId{1, 3}));
  EXPECT_EQ(ReadFile(dir.File(sealed)).posts.size(), 2u);
}

TEST(SegmentAppender, ASymlinkOrDirectoryUnderTheCurrentNameIsNeverFollowed) {
  for (const bool symlink : {true, false}) {
    SCOPED_TRACE(symlink ? "symlink" : "directory");
    TempDir dir;
    TempDir elsewhere;
    const uid_t uid = ::geteuid();
    const std::string target = elsewhere.File("target");
    std::ofstream(target) << "untouched";
    if (symlink) {
      ASSERT_EQ(::symlinkat(target.c_str(), dir.fd(), SpoolCurrentName(uid).c_str()), 0);
    } else {
      ASSERT_EQ(::mkdirat(dir.fd(), SpoolCurrentName(uid).c_str(), 0700), 0);
    }
    SegmentAppender appender(dir.fd(), uid, {});
    ASSERT_TRUE(appender.Append(Framed(NumberedPost(1, 1)), In(1s)).ok());
    EXPECT_NE(appender.current_name(), SpoolCurrentName(uid));
    EXPECT_EQ(ReadFile(dir.File(appender.current_name())).posts.size(), 1u);
    std::ifstream in(target);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "untouched");
    if (!symlink) ::unlinkat(dir.fd(), SpoolCurrentName(uid).c_str(), AT_REMOVEDIR);
  }
}

TEST(SegmentAppender, AHardLinkUnderTheCurrentNameIsNotWrittenThrough) {
  TempDir dir;
  const uid_t uid = ::geteuid();
  // A segment of ours, linked under the current name by someone else.
  UniqueFd own;
  ASSERT_TRUE(CreateSegment(dir.fd(), "other-name", NewHeader(7), 0600, false, &own).ok());
  ASSERT_EQ(::linkat(dir.fd(), "other-name", dir.fd(), SpoolCurrentName(uid).c_str(), 0), 0);
  SegmentAppender appender(dir.fd(), uid, {});
  ASSERT_TRUE(appender.Append(Framed(NumberedPost(1, 1)), In(1s)).ok());
  EXPECT_NE(appender.current_name(), SpoolCurrentName(uid));
  struct stat st;
  ASSERT_EQ(::fstat(own.get(), &st), 0);
  EXPECT_EQ(st.st_size, static_cast<off_t>(kHeaderBytes)) << "nothing written through the link";
  EXPECT_EQ(ReadFile(dir.File(appender.current_name())).posts.size(), 1u);
}

TEST(SegmentAppender, AHardLinkMadeAfterTheOpenMovesTheNextAppendToANewSegment) {
  TempDir dir;
  const uid_t uid = ::geteuid();
  SegmentAppender appender(dir.fd(), uid, {});
  ASSERT_TRUE(appender.Append(Framed(NumberedPost(1, 1)), In(1s)).ok());
  ASSERT_EQ(appender.current_name(), SpoolCurrentName(uid));
  ASSERT_EQ(::linkat(dir.fd(), SpoolCurrentName(uid).c_str(), dir.fd(), "stolen", 0), 0);
  ASSERT_TRUE(appender.Append(Framed(NumberedPost(1, 2)), In(1s)).ok());
  EXPECT_EQ(ReadFile(dir.File("stolen")).posts.size(), 1u) << "the linked file got no more";
  EXPECT_NE(appender.current_name(), SpoolCurrentName(uid));
  const auto current = ReadFile(dir.File(appender.current_name()));
  ASSERT_EQ(current.posts.size(), 1u);
  EXPECT_EQ(current.posts[0].id, (PostId{1, 2}));
}

TEST(CreateSegment, SyncsANewNameByTheFileWhenTheDirectoryIsOpenedOPath) {
  TempDir dir;
  UniqueFd path_fd(::open(dir.path().c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(path_fd.valid());
  EXPECT_EQ(NewNameSyncFor(path_fd.get()), NewNameSync::kFile);
  EXPECT_EQ(NewNameSyncFor(dir.fd()), NewNameSync::kFileAndDirectory);
}

// Installs a seccomp filter that kills the process on syncfs(2). False if
// the kernel (or a container's policy) does not allow one.
bool KillOnSyncfs() {
#if defined(__x86_64__)
  constexpr uint32_t kArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
  constexpr uint32_t kArch = AUDIT_ARCH_AARCH64;
#else
  return false;
#endif
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kArch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_syncfs, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog program{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return false;
  return ::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &program) == 0;
}

TEST(SegmentAppender, SyncedAppendsThroughAnOPathDirectoryNeverCallSyncfs) {
  TempDir dir;
  // Probe first, so that a kernel without seccomp is a skip, not a failure.
  const pid_t probe = Spawn([] { return KillOnSyncfs(); });
  if (!WaitOk(probe)) GTEST_SKIP() << "seccomp filters are not available here";
  const pid_t child = Spawn([&dir] {
    if (!KillOnSyncfs()) return false;
    // As the client library opens a spool directory users cannot list.
    UniqueFd dirfd(::open(dir.path().c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    SegmentAppender::Options options;
    options.sync = true;
    options.segment_bytes_max = 4096;  // roll over too: new names, seals
    SegmentAppender appender(dirfd.get(), ::geteuid(), options);
    for (int i = 0; i < 40; ++i) {
      if (!appender.Append(Framed(NumberedPost(1, static_cast<uint64_t>(i))), In(5s)).ok()) {
        return false;
      }
    }
    return true;
  });
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_FALSE(WIFSIGNALED(status) && WTERMSIG(status) == SIGSYS) << "syncfs was called";
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  size_t posts = 0;
  for (const std::string& name : dir.List()) posts += ReadFile(dir.File(name)).posts.size();
  EXPECT_EQ(posts, 40u);
}

// The daemon's side of the protocol: rename the current segment away, then
// seal it, then read it.
std::vector<PostData> AdoptCurrent(const TempDir& dir, uid_t uid, std::string* adopted_name) {
  const std::string cur = SpoolCurrentName(uid);
  const std::string name = SpoolSealedName(uid, NewSegmentId());
  if (::renameat(dir.fd(), cur.c_str(), dir.fd(), name.c_str()) != 0) return {};
  UniqueFd fd(::openat(dir.fd(), name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC));
  if (!SealSegment(fd.get(), In(5s)).ok()) std::abort();
  if (adopted_name) *adopted_name = name;
  return ReadFile(dir.File(name)).posts;
}

TEST(SegmentAppender, CreatesTheCurrentSegmentAndReopensAfterItWasSealed) {
  TempDir dir;
  SegmentAppender appender(dir.fd(), ::geteuid(), {});
  ASSERT_TRUE(appender.Append(Framed(NumberedPost(1, 1)), In(1s)).ok());
  const uint64_t first_id = appender.segment_id();
  std::string name;
  auto adopted = AdoptCurrent(dir, ::geteuid(), &name);
  ASSERT_EQ(adopted.size(), 1u);
  ASSERT_TRUE(appender.Append(Framed(NumberedPost(1, 2)), In(1s)).ok());
  EXPECT_NE(appender.segment_id(), first_id);
  EXPECT_EQ(ReadFile(dir.File(name)).posts.size(), 1u) << "nothing appended after sealing";
  const auto current = ReadFile(dir.File(SpoolCurrentName(::geteuid())));
  ASSERT_EQ(current.posts.size(), 1u);
  EXPECT_EQ(current.posts[0].id, (PostId{1, 2}));
}

TEST(SegmentAppender, RollsOverToANewSegmentAtTheSizeLimit) {
  TempDir dir;
  SegmentAppender::Options options;
  options.segment_bytes_max = 4096;
  SegmentAppender appender(dir.fd(), ::geteuid(), options);
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(appender.Append(Framed(NumberedPost(1, static_cast<uint64_t>(i))), In(1s)).ok());
  }
  std::set<uint64_t> seen;
  int sealed_files = 0;
  for (const std::string& name : dir.List()) {
    auto parsed = ParseSpoolName(name);
    ASSERT_TRUE(parsed) << name;
    struct stat st;
    ASSERT_EQ(::stat(dir.File(name).c_str(), &st), 0);
    EXPECT_LE(st.st_size, 4096) << name;
    if (!parsed->current) {
      ++sealed_files;
      UniqueFd fd(::open(dir.File(name).c_str(), O_RDONLY | O_CLOEXEC));
      Header h;
      ASSERT_TRUE(ReadHeader(fd.get(), &h).ok());
      EXPECT_TRUE(h.sealed()) << name;
      EXPECT_EQ(h.segment_id, parsed->segment_id);
    }
    for (const PostData& p : ReadFile(dir.File(name)).posts) EXPECT_TRUE(seen.insert(p.id.lo).second);
  }
  EXPECT_GT(sealed_files, 3);
  EXPECT_EQ(seen.size(), 100u);
}

TEST(SegmentAppender, ForkedChildOpensItsOwnDescriptor) {
  TempDir dir;
  SegmentAppender appender(dir.fd(), ::geteuid(), {});
  ASSERT_TRUE(appender.Append(Framed(NumberedPost(1, 0)), In(1s)).ok());
  const int parent_fd = appender.descriptor();
  // Were the child to share the parent's open file description, its flock
  // unlock would drop a lock the parent holds mid-append.
  const pid_t child = Spawn([&] {
    for (int i = 0; i < 50; ++i) {
      if (!appender.Append(Framed(NumberedPost(2, static_cast<uint64_t>(i))), In(1s)).ok()) {
        return false;
      }
    }
    const long same = ::syscall(SYS_kcmp, ::getpid(), ::getppid(), /*KCMP_FILE=*/0,
                                appender.descriptor(), parent_fd);
    return same > 0 || (same < 0 && (errno == ENOSYS || errno == EPERM));
  });
  ASSERT_TRUE(WaitOk(child));
  for (int i = 1; i < 50; ++i) {
    ASSERT_TRUE(appender.Append(Framed(NumberedPost(1, static_cast<uint64_t>(i))), In(1s)).ok());
  }
  EXPECT_EQ(appender.descriptor(), parent_fd);
  EXPECT_EQ(ReadFile(dir.File(SpoolCurrentName(::geteuid()))).posts.size(), 100u);
}

TEST(SegmentAppender, EightProcessesAppendingTenThousandRecordsEachLoseNothing) {
  TempDir dir;
  constexpr int kWriters = 8;
  constexpr int kRecords = 10000;
  std::vector<pid_t> pids;
  for (int w = 0; w < kWriters; ++w) {
    pids.push_back(Spawn([&dir, w] {
      SegmentAppender::Options options;
      options.segment_bytes_max = 1ull << 30;  // one segment for all
      SegmentAppender appender(dir.fd(), ::geteuid(), options);
      for (int i = 0; i < kRecords; ++i) {
        if (!appender.Append(Framed(NumberedPost(static_cast<uint64_t>(w),
                                                 static_cast<uint64_t>(i))), In(10s)).ok()) {
          return false;
        }
      }
      return true;
    }));
  }
  for (pid_t pid : pids) ASSERT_TRUE(WaitOk(pid));
  ASSERT_EQ(dir.List().size(), 1u);
  const auto r = ReadFile(dir.File(SpoolCurrentName(::geteuid())));
  ASSERT_TRUE(r.open_status.ok());
  EXPECT_TRUE(r.skips.empty());
  EXPECT_EQ(r.torn_tail_bytes, 0u);
  ASSERT_EQ(r.posts.size(), static_cast<size_t>(kWriters * kRecords));
  std::vector<int64_t> next(kWriters, 0);
  for (const PostData& p : r.posts) {
    const auto w = static_cast<size_t>(p.id.hi);
    ASSERT_LT(w, static_cast<size_t>(kWriters));
    // Exactly once, intact, and in each writer's order.
    ASSERT_EQ(static_cast<int64_t>(p.id.lo), next[w]);
    ASSERT_EQ(p, NumberedPost(p.id.hi, p.id.lo));
    ++next[w];
  }
}

TEST(SegmentAppender, SealingWhileWritersAppendLosesNothingAndSealedFilesStayClosed) {
  TempDir dir;
  constexpr int kWriters = 4;
  constexpr int kRecords = 20000;
  std::vector<pid_t> pids;
  for (int w = 0; w < kWriters; ++w) {
    pids.push_back(Spawn([&dir, w] {
      SegmentAppender appender(dir.fd(), ::geteuid(), {});
      for (int i = 0; i < kRecords; ++i) {
        const auto rec = Framed(NumberedPost(static_cast<uint64_t>(w), static_cast<uint64_t>(i)));
        if (!appender.Append(rec, In(10s)).ok()) return false;
      }
      return true;
    }));
  }
  std::map<std::string, off_t> adopted_sizes;
  std::map<std::pair<uint64_t, uint64_t>, int> seen;
  auto adopt = [&] {
    std::string name;
    for (const PostData& p : AdoptCurrent(dir, ::geteuid(), &name)) ++seen[{p.id.hi, p.id.lo}];
    if (!name.empty()) {
      struct stat st;
      ASSERT_EQ(::stat(dir.File(name).c_str(), &st), 0);
      adopted_sizes[name] = st.st_size;
    }
  };
  int running = kWriters;
  size_t adopted_while_writing = 0;
  while (running > 0) {
    adopt();
    adopted_while_writing = adopted_sizes.size();
    ::usleep(1000);
    int status;
    while (::waitpid(-1, &status, WNOHANG) > 0) {
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      --running;
    }
  }
  adopt();
  EXPECT_GE(adopted_while_writing, 2u) << "the test should seal while the writers write";
  for (const auto& [name, size] : adopted_sizes) {
    struct stat st;
    ASSERT_EQ(::stat(dir.File(name).c_str(), &st), 0);
    EXPECT_EQ(st.st_size, size) << name << " grew after it was sealed and read";
  }
  ASSERT_EQ(seen.size(), static_cast<size_t>(kWriters * kRecords));
  for (const auto& [id, count] : seen) ASSERT_EQ(count, 1) << id.first << "/" << id.second;
}

}  // namespace
}  // namespace postspool::segment
