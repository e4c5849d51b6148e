// Hostile neighbours in the shared spool directory (mode 3733): another user
// plants something under a victim's <uid>.current before the victim's first
// post. The victim's appends must still succeed, into a file the victim owns
// alone (one link) that the attacker cannot read, and read back intact.
//
// Runs as real users: the test (root) creates a victim and an attacker with
// useradd and forks children that become them. Skipped when not root or
// without useradd.
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "segment_writer.h"
#include "test_util.h"

namespace postspool::segment {
namespace {

using namespace std::chrono_literals;
using testing::NumberedPost;
using testing::ReadFile;

struct User {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
};

bool Executable(const char* path) { return ::access(path, X_OK) == 0; }

// Runs a command (no shell), quietly; its exit status, or -1.
int Run(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

// useradd takes a lock on /etc/passwd; other test processes may hold it for
// a moment, so a failure is retried.
int RunWithRetries(const std::vector<std::string>& args) {
  int rc = -1;
  for (int attempt = 0; attempt < 20 && rc != 0; ++attempt) {
    rc = Run(args);
    if (rc != 0) ::usleep(100 * 1000);
  }
  return rc;
}

// Runs `body` as `user` (groups dropped, then gid, then uid) in a child
// process; returns its exit status (0 when body returned 0).
int RunAs(const User& user, const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(user.gid) != 0 || ::setuid(user.uid) != 0) {
      ::_exit(120);
    }
    ::_exit(body());
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::vector<std::byte> Framed(const PostData& post) {
  std::vector<std::byte> out;
  if (!AppendRecord(testing::PostPayload(post), &out).ok()) std::abort();
  return out;
}

class SpoolSquattingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    skip_reason_.clear();
    if (::geteuid() != 0) {
      skip_reason_ = "needs root to create the victim and attacker users";
      return;
    }
    if (!Executable("/usr/sbin/useradd") || !Executable("/usr/sbin/userdel")) {
      skip_reason_ = "useradd/userdel not found in /usr/sbin";
      return;
    }
    // Unique per process, so that parallel runs do not collide.
    const std::string suffix = std::to_string(::getpid());
    group_name_ = "pssg" + suffix;
    if (Executable("/usr/sbin/groupadd") &&
        RunWithRetries({"/usr/sbin/groupadd", group_name_}) == 0) {
      if (const group* g = ::getgrnam(group_name_.c_str())) spool_gid_ = g->gr_gid;
    } else {
      group_name_.clear();
      spool_gid_ = 0;  // root's group: neither test user is in it
    }
    for (auto [user, name] : {std::pair{&victim_, "pssv" + suffix},
                              std::pair{&attacker_, "pssa" + suffix}}) {
      if (RunWithRetries({"/usr/sbin/useradd", "-M", "-N", "-s", "/usr/sbin/nologin", name}) !=
          0) {
        skip_reason_ = "useradd " + name + " failed";
        return;
      }
      user->name = name;
      const passwd* pw = ::getpwnam(name.c_str());
      if (pw == nullptr) {
        skip_reason_ = "getpwnam " + name + " found nothing after useradd";
        return;
      }
      user->uid = pw->pw_uid;
      user->gid = pw->pw_gid;
    }
  }

  static void TearDownTestSuite() {
    for (User* user : {&victim_, &attacker_}) {
      if (!user->name.empty()) RunWithRetries({"/usr/sbin/userdel", user->name});
      *user = User{};
    }
    if (!group_name_.empty()) RunWithRetries({"/usr/sbin/groupdel", group_name_});
    group_name_.clear();
  }

  void SetUp() override {
    if (!skip_reason_.empty()) GTEST_SKIP() << skip_reason_;
    // The spool: root-owned, group of the daemon, sticky and setgid, users
    // may create files but not list or remove others'.
    ASSERT_FALSE(spool_.path().empty());
    ASSERT_EQ(::chown(spool_.path().c_str(), 0, spool_gid_), 0);
    ASSERT_EQ(::chmod(spool_.path().c_str(), 03733), 0);
    // Somewhere else on the same filesystem, for files the victim owns.
    ASSERT_EQ(::chmod(elsewhere_.path().c_str(), 0711), 0);
  }

  std::string CurrentPath() const { return spool_.File(SpoolCurrentName(victim_.uid)); }

  // A file the victim owns (0600) outside the spool, with `text` in it.
  std::string VictimFile(const std::string& text) {
    const std::string path = elsewhere_.File("victim-secret");
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    ::close(fd);
    EXPECT_EQ(::chown(path.c_str(), victim_.uid, victim_.gid), 0);
    return path;
  }

  static std::string Contents(const std::string& path) {
    std::string out;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return "<unreadable>";
    char buf[4096];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
    ::close(fd);
    return out;
  }

  // Plants the squatter as the attacker; 0 on success.
  int AsAttacker(const std::function<int()>& plant) { return RunAs(attacker_, plant); }

  // The victim appends two batches of records through SegmentAppender, as
  // the client library does (an O_PATH descriptor of the spool directory),
  // then checks everything the victim's posts must be.
  void ExpectVictimPostsAreSafe() {
    const int rc = RunAs(victim_, [this] {
      const int dirfd = ::open(spool_.path().c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
      if (dirfd < 0) return 2;
      SegmentAppender appender(dirfd, ::geteuid(), {});
      for (uint64_t i = 0; i < 4; ++i) {
        if (!appender.Append(Framed(NumberedPost(7, i)), Clock::now() + 2s).ok()) return 3;
      }
      return 0;
    });
    ASSERT_EQ(rc, 0) << "the victim's appends failed";

    // Exactly one file holds the posts: a current segment of the victim's,
    // owned by the victim, one link, not readable by the attacker.
    std::vector<std::string> holding;
    for (const std::string& name : spool_.List()) {
      const auto parsed = ParseSpoolName(name);
      // The shared name holds the squatter, which the victim must not use.
      if (!parsed || parsed->uid != victim_.uid || name == SpoolCurrentName(victim_.uid)) {
        continue;
      }
      struct stat st;
      ASSERT_EQ(::fstatat(spool_.fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW), 0);
      holding.push_back(name);
      EXPECT_TRUE(S_ISREG(st.st_mode)) << name;
      EXPECT_EQ(st.st_uid, victim_.uid) << name;
      EXPECT_TRUE(parsed->current) << name;
      EXPECT_EQ(st.st_nlink, 1u) << name;
      EXPECT_EQ(st.st_mode & 07777, 0660u) << name;
      EXPECT_EQ(st.st_gid, spool_gid_) << name << ": the spool's group, for the daemon";
      const auto r = ReadFile(spool_.File(name));
      ASSERT_TRUE(r.open_status.ok()) << r.open_status.ToString();
      EXPECT_TRUE(r.skips.empty());
      ASSERT_EQ(r.posts.size(), 4u) << name;
      for (uint64_t i = 0; i < 4; ++i) EXPECT_EQ(r.posts[i], NumberedPost(7, i));
      const std::string path = spool_.File(name);
      EXPECT_EQ(AsAttacker([&path] {
                  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
                  return fd < 0 && errno == EACCES ? 0 : 1;
                }),
                0)
          << "the attacker can read " << name;
    }
    EXPECT_EQ(holding.size(), 1u);
  }

  static inline std::string skip_reason_;
  static inline std::string group_name_;
  static inline gid_t spool_gid_ = 0;
  static inline User victim_;
  static inline User attacker_;
  testing::TempDir spool_;
  testing::TempDir elsewhere_;
};

TEST_F(SpoolSquattingTest, AnAttackersOwnFileUnderTheVictimsNameIsNotUsed) {
  const std::string path = CurrentPath();
  ASSERT_EQ(AsAttacker([&path] {
              ::umask(0);
              const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
              return fd >= 0 && ::write(fd, "bait", 4) == 4 ? 0 : 1;
            }),
            0);
  ExpectVictimPostsAreSafe();
  EXPECT_EQ(Contents(path), "bait") << "the victim's posts went into the attacker's file";
}

TEST_F(SpoolSquattingTest, ASymlinkToAFileTheVictimOwnsIsNotFollowed) {
  const std::string target = VictimFile("secret");
  const std::string path = CurrentPath();
  ASSERT_EQ(AsAttacker([&] { return ::symlink(target.c_str(), path.c_str()); }), 0);
  ExpectVictimPostsAreSafe();
  EXPECT_EQ(Contents(target), "secret");
}

TEST_F(SpoolSquattingTest, AFifoDoesNotHangOrFailTheVictim) {
  const std::string path = CurrentPath();
  ASSERT_EQ(AsAttacker([&path] {
              ::umask(0);
              return ::mkfifo(path.c_str(), 0666);
            }),
            0);
  ExpectVictimPostsAreSafe();
}

TEST_F(SpoolSquattingTest, ADirectoryUnderTheVictimsNameIsNotUsed) {
  const std::string path = CurrentPath();
  ASSERT_EQ(AsAttacker([&path] { return ::mkdir(path.c_str(), 0777); }), 0);
  ExpectVictimPostsAreSafe();
  ::rmdir(path.c_str());
}

TEST_F(SpoolSquattingTest, AHardLinkToAFileTheVictimOwnsIsNotWrittenThrough) {
  const std::string target = VictimFile("secret");
  const std::string path = CurrentPath();
  // With fs.protected_hardlinks = 1 (the usual default) the kernel refuses
  // the attacker a link to a file they cannot read and write; then root
  // makes the link, as on a system where the sysctl is off.
  if (AsAttacker([&] { return ::link(target.c_str(), path.c_str()); }) != 0) {
    ASSERT_EQ(::link(target.c_str(), path.c_str()), 0) << std::strerror(errno);
  }
  ExpectVictimPostsAreSafe();
  EXPECT_EQ(Contents(target), "secret");
}

}  // namespace
}  // namespace postspool::segment
