// The packages, built and used as a node would use them.
//
// Debian: builds the .debs with dpkg-buildpackage from a copy of the source
// tree, installs them with dpkg, and checks what the maintainer scripts made
// (the user from sysusers.d, the directories and modes of
// packaging/README.md from tmpfiles.d, the configuration's statoverride);
// reruns systemd-sysusers and systemd-tmpfiles on the installed files as a
// boot would (there is no systemd as PID 1 here, so the test, not systemd,
// starts the installed /usr/sbin/postspoold as the packaged user, with the
// installed configuration edited to point at the test broker); posts with the
// installed /usr/bin/postspool as two ordinary users created by the test and
// sees every post at a real RabbitMQ, with the poster's uid as its origin in
// the daemon's journal (the v03 message carries no uid); checks that neither
// user can list, read, write, delete, replace or forge (a file under the
// other's uid) the other's spool files; upgrades to a rebuilt package (the
// same .debs repacked with dpkg-deb under a higher version) with posts in the
// journal and in the spool, and again with the daemon running, restarting it
// as the package's postinst would under systemd, and sees every post arrive;
// then removes and purges the packages and checks what is left each time.
//
// RPM: builds the spec with rpmbuild (--nodeps: Debian has no RPM database
// of the build dependencies) and checks the packages' file lists, scriptlets
// and dependencies with rpm -qp.
//
// Needs root, dpkg-buildpackage, rpmbuild, useradd, and (for the Debian part)
// no postspool already on the machine (a real installation is never touched):
// otherwise skipped with the reason. Cleans up at the end, also when it fails: the daemon is
// killed, the packages purged, the users and the postspool user deleted.
//
// Takes several minutes (two package builds on a 2-core machine), hence its
// own meson suite "packaging", run by scripts/test.sh in the normal build
// only.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "broker/broker_fixture.h"
#include "hostile/test_users.h"
#include "test_util.h"

namespace postspool::testing {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr char kConf[] = "/etc/postspool/postspoold.conf";
constexpr char kIncoming[] = "/var/spool/postspool/incoming";
constexpr char kQuarantine[] = "/var/spool/postspool/quarantine";
constexpr char kJournal[] = "/var/lib/postspool/journal";
constexpr char kSocket[] = "/run/postspool/postspoold.sock";
constexpr char kExchange[] = "xs_pkgtest";
const std::vector<std::string> kDebs = {"libpostspool0", "libpostspool-dev", "postspoold",
                                         "postspool-shim"};

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

struct CmdResult {
  int status = -1;  // exit status; 124 when `timeout` ended it
  std::string output;  // stdout and stderr
};

// Runs `command` with /bin/sh, at most `timeout_s` seconds.
CmdResult Sh(const std::string& command, int timeout_s = 120) {
  const std::string full = "timeout -k 10 " + std::to_string(timeout_s) + " /bin/sh -c " +
                           Quote(command) + " 2>&1 </dev/null";
  CmdResult r;
  FILE* p = ::popen(full.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int w = ::pclose(p);
  r.status = WIFEXITED(w) ? WEXITSTATUS(w) : 128 + (WIFSIGNALED(w) ? WTERMSIG(w) : 0);
  return r;
}

// Runs `command` as `user` (no supplementary groups, a minimal environment).
CmdResult ShAs(const TestUser& user, const std::string& command, int timeout_s = 60) {
  return Sh("setpriv --reuid=" + std::to_string(user.uid) + " --regid=" +
                std::to_string(user.gid) + " --clear-groups -- env -i PATH=/usr/bin:/bin " +
                "/bin/sh -c " + Quote(command),
            timeout_s);
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// "owner:group mode" of a path, as stat prints them; "" if it is missing.
std::string OwnerMode(const std::string& path) {
  const CmdResult r = Sh("stat -c '%U:%G %a' " + Quote(path));
  return r.status == 0 ? Trim(r.output) : "";
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

// The files in a directory (as root).
std::vector<std::string> List(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    out.push_back(e.path().filename());
  }
  return out;
}

// The installed postspoold, started as the user postspool the way the unit
// starts it (LimitNOFILE=65536, --config of the unit); stderr to a log file.
class InstalledDaemon {
 public:
  explicit InstalledDaemon(std::string log_path) : log_path_(std::move(log_path)) {}
  ~InstalledDaemon() { Kill(); }

  bool Start() {
    const passwd* pw = ::getpwnam("postspool");
    if (pw == nullptr) return false;
    const uid_t uid = pw->pw_uid;
    const gid_t gid = pw->pw_gid;
    const int log_fd = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) return false;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(log_fd, 1);
      ::dup2(log_fd, 2);
      const rlimit nofile{65536, 65536};
      ::setrlimit(RLIMIT_NOFILE, &nofile);
      if (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0) _exit(127);
      // After setuid, which clears it.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::execl("/usr/sbin/postspoold", "postspoold", "--config", kConf, nullptr);
      _exit(127);
    }
    ::close(log_fd);
    if (pid_ < 0) return false;
    // Up when a post over the socket works; the socket file alone may be a
    // stale one from the previous run.
    const auto deadline = Clock::now() + 30s;
    while (Clock::now() < deadline) {
      int status;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      if (Listening()) return true;
      std::this_thread::sleep_for(100ms);
    }
    return false;
  }

  // SIGTERM and wait (the drain is shutdown_drain_ms, 5 s); the exit status,
  // or -1 if it had to be killed.
  int Stop() {
    if (pid_ <= 0) return -1;
    ::kill(pid_, SIGTERM);
    const auto deadline = Clock::now() + 60s;
    while (Clock::now() < deadline) {
      int status;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(50ms);
    }
    Kill();
    return -1;
  }

  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  std::string Log() const { return Sh("tail -n 40 " + Quote(log_path_)).output; }

 private:
  // The socket accepts a connection (it is listening, not stale).
  static bool Listening() {
    return Sh("python3 -c \"import socket; s = socket.socket(socket.AF_UNIX, "
              "socket.SOCK_SEQPACKET); s.connect('" + std::string(kSocket) + "')\"")
               .status == 0;
  }

  std::string log_path_;
  pid_t pid_ = -1;
};

class PackagingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (installs packages, creates users)";
    for (const char* tool : {"dpkg-buildpackage", "dpkg-deb", "rpmbuild", "systemd-sysusers",
                             "systemd-tmpfiles", "setpriv", "python3", "lintian"}) {
      if (Sh(std::string("command -v ") + tool).status != 0) {
        GTEST_SKIP() << tool << " is not installed (scripts/install-deps.sh installs it)";
      }
    }
    std::string why;
    if (!CanCreateUsers(&why)) GTEST_SKIP() << why;
    source_dir_ = std::getenv("POSTSPOOL_SOURCE_DIR") ? std::getenv("POSTSPOOL_SOURCE_DIR") : "";
    ASSERT_FALSE(source_dir_.empty()) << "POSTSPOOL_SOURCE_DIR is not set (meson sets it)";
    char tmpl[] = "/tmp/postspool-pkgtest-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    work_ = tmpl;
    ::chmod(work_.c_str(), 0755);
    cleanup_ = true;
  }

  void TearDown() override {
    if (!cleanup_) return;
    daemon_.reset();
    if (installs_) {
      // Purge whatever is installed, then what purge leaves by design (the
      // system user), and the users this test made.
      const CmdResult purge = Sh("dpkg --purge postspool-shim postspoold libpostspool-dev libpostspool0", 300);
      if (purge.status != 0) std::fprintf(stderr, "cleanup: dpkg --purge: %s\n", purge.output.c_str());
      if (::getpwnam("postspool") != nullptr) Sh("userdel postspool");
      if (::getgrnam("postspool") != nullptr) Sh("groupdel postspool");
      Sh("rm -rf /etc/postspool /var/lib/postspool /var/spool/postspool /run/postspool");
      RestoreSetAside();
    }
    for (const TestUser& u : users_) DeleteUser(u);
    if (!std::getenv("POSTSPOOL_PKGTEST_KEEP")) Sh("rm -rf " + Quote(work_));
    else std::fprintf(stderr, "kept %s\n", work_.c_str());
  }

  // Copies the source tree (without build directories and .git) to
  // work_/<name>/src and builds the .debs there; returns their directory.
  // Why the packages must not be installed here: a postspool package, user
  // or directory is already on the machine (a real installation, or what a
  // root run of scripts/run-local.sh left), which this test would take over
  // and purge. "" if there is none: then TearDown purges what the test
  // installs.
  std::string ExistingPostspool() {
    if (Sh("dpkg-query -W -f='${Status}' postspoold libpostspool0 libpostspool-dev postspool-shim 2>/dev/null "
           "| grep -q installed")
            .status == 0 ||
        ::getpwnam("postspool") != nullptr || ::getgrnam("postspool") != nullptr) {
      return "postspool is installed on this machine (package, or user or group postspool): the "
             "test installs and purges its own and will not touch that";
    }
    if (DaemonLive()) {
      return "a postspoold runs on the default paths (it holds /var/lib/postspool/journal/lock or "
             "answers on /run/postspool/postspoold.sock): the test will not touch its files";
    }
    // Directories without a package, user or daemon: what a root run of
    // postspoold on its defaults (scripts/run-local.sh) left. They are set
    // aside, whole, and put back after the test.
    aside_ = "/var/tmp/postspool-packaging-test-aside." + std::to_string(::getpid());
    for (const char* d : kDefaultDirs) {
      if (!Exists(d)) continue;
      const std::string to = aside_ + d;
      const CmdResult mv = Sh("mkdir -p " + Quote(std::filesystem::path(to).parent_path()) +
                              " && mv " + Quote(d) + " " + Quote(to));
      if (mv.status != 0) return std::string("cannot set ") + d + " aside: " + mv.output;
      std::printf("[ packaging ] set %s aside in %s until the end of the test\n", d, to.c_str());
    }
    installs_ = true;
    return "";
  }

  static constexpr const char* kDefaultDirs[] = {"/etc/postspool", "/var/lib/postspool",
                                                 "/var/spool/postspool", "/run/postspool"};

  // A postspoold uses the default paths: it holds the journal lock, or its
  // socket accepts.
  static bool DaemonLive() {
    const int lock = ::open("/var/lib/postspool/journal/lock", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (lock >= 0) {
      const bool held = ::flock(lock, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
      ::close(lock);
      if (held) return true;
    }
    const int s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s < 0) return false;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "/run/postspool/postspoold.sock");
    const bool answers = ::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    ::close(s);
    return answers;
  }

  void RestoreSetAside() {
    if (aside_.empty()) return;
    for (const char* d : kDefaultDirs) {
      const std::string from = aside_ + d;
      if (!Exists(from)) continue;
      const CmdResult mv = Sh("mv " + Quote(from) + " " + Quote(d));
      if (mv.status != 0) {
        std::fprintf(stderr, "cleanup: cannot put %s back from %s: %s\n", d, from.c_str(),
                     mv.output.c_str());
        return;  // keep the rest where it is, for a person to put back
      }
    }
    Sh("rm -rf " + Quote(aside_));
  }

  std::string BuildDebs() {
    const std::string dir = work_ + "/deb";
    const CmdResult copy = Sh("mkdir -p " + dir + "/src && tar -C " + Quote(source_dir_) +
                              " --exclude='./build*' --exclude=./.git --exclude=./run -cf - . | "
                              "tar -C " + dir + "/src -xf -");
    EXPECT_EQ(copy.status, 0) << copy.output;
    const auto t0 = Clock::now();
    const CmdResult build = Sh("cd " + dir + "/src && DEB_BUILD_OPTIONS='nocheck parallel=2' "
                               "dpkg-buildpackage -b -us -uc > ../build.log 2>&1 || "
                               "{ tail -n 60 ../build.log; exit 1; }",
                               1800);
    EXPECT_EQ(build.status, 0) << build.output;
    std::printf("[ figures ] dpkg-buildpackage: %.0f s\n",
                std::chrono::duration<double>(Clock::now() - t0).count());
    return dir;
  }

  std::string DebPath(const std::string& dir, const std::string& package) {
    return Trim(Sh("ls " + dir + "/" + package + "_*.deb").output);
  }

  // The same .debs under a higher version (repacked with dpkg-deb: same files,
  // the control files' version and exact dependencies on it changed).
  std::string Repack(const std::string& from_dir, const std::string& suffix) {
    const std::string dir = work_ + "/repack" + suffix;
    Sh("mkdir -p " + dir);
    for (const std::string& p : kDebs) {
      const std::string deb = DebPath(from_dir, p);
      const std::string version = Trim(Sh("dpkg-deb -f " + Quote(deb) + " Version").output);
      const std::string tree = dir + "/" + p;
      const CmdResult r = Sh("dpkg-deb -R " + Quote(deb) + " " + tree + " && sed -i 's/" +
                             version + "/" + version + suffix + "/g' " + tree +
                             "/DEBIAN/control && dpkg-deb -b " + tree + " " + dir + "/" + p +
                             "_" + version + suffix + "_repack.deb >/dev/null");
      EXPECT_EQ(r.status, 0) << r.output;
    }
    return dir;
  }

  CmdResult InstallDebs(const std::string& dir) {
    std::string files;
    for (const std::string& p : kDebs) files += " " + Quote(DebPath(dir, p));
    // stdin is /dev/null: a conffile prompt would fail the install.
    return Sh("DEBIAN_FRONTEND=noninteractive dpkg -i" + files, 300);
  }

  // Posts `count` posts as `user` with the installed postspool; returns the
  // ids and appends "<id> <transport>" to *transports.
  std::vector<std::string> Post(const TestUser& user, const std::string& tag, int count,
                                const std::string& want_transport,
                                const std::string& extra_options = "") {
    std::vector<std::string> ids;
    for (int i = 0; i < count; ++i) {
      const CmdResult r = ShAs(user, "/usr/bin/postspool post --budget-ms 2000 --rel-path "
                                         "pkgtest/" + user.name + "/" + tag + "/" +
                                         std::to_string(i) + " --size " + std::to_string(i) +
                                         " " + extra_options);
      EXPECT_EQ(r.status, 0) << user.name << " " << tag << ": " << r.output;
      std::istringstream in(r.output);
      std::string id, transport;
      in >> id >> transport;
      EXPECT_EQ(transport, want_transport) << user.name << " " << tag << ": " << r.output;
      if (r.status == 0 && !id.empty()) {
        ids.push_back(id);
        poster_[id] = user.uid;
      }
    }
    return ids;
  }

  // Union of the origin uids in the daemon's journal (read as root).
  void ReadOrigins() {
    for (const std::string& name : List(kJournal)) {
      if (name.rfind("journal-", 0) != 0) continue;
      const ReadResult r = ReadFile(std::string(kJournal) + "/" + name);
      for (const PostData& p : r.posts) {
        if (p.origin_uid) origins_[Uuid(p.id)] = *p.origin_uid;
      }
    }
  }

  // Waits (bounded) until every id in `ids` is at the broker's test queue.
  bool WaitArrived(const std::vector<std::string>& ids, int timeout_s = 120) {
    const auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
    while (true) {
      std::vector<ReceivedMessage> got;
      if (consumer_.GetAll("pkgtest", &got).ok()) {
        for (const ReceivedMessage& m : got) arrived_[m.message_id] = m.body;
      }
      bool all = true;
      for (const std::string& id : ids) all = all && arrived_.count(id) != 0;
      if (all) return true;
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(200ms);
    }
  }

  void ExpectOrigins(const std::vector<std::string>& ids) {
    for (const std::string& id : ids) {
      ASSERT_TRUE(origins_.count(id)) << "post " << id << " not found in the journal";
      EXPECT_EQ(origins_[id], poster_[id]) << "origin of post " << id;
    }
  }

  std::string source_dir_;
  std::string work_;
  bool cleanup_ = false;
  bool installs_ = false;  // TearDown purges the packages and the user
  std::string aside_;      // where the default directories found here were set aside
  std::vector<TestUser> users_;
  std::unique_ptr<InstalledDaemon> daemon_;
  AmqpTestClient consumer_;
  std::map<std::string, uint32_t> poster_;   // post id -> uid that posted it
  std::map<std::string, uint32_t> origins_;  // post id -> origin uid in the journal
  std::map<std::string, std::string> arrived_;  // message_id -> body
};

TEST_F(PackagingTest, RpmsBuildWithTheirFilesScriptletsAndDependencies) {
  const std::string top = work_ + "/rpmbuild";
  const CmdResult prep = Sh(
      "mkdir -p " + top + "/SOURCES && tar -C " + Quote(source_dir_) +
      " --exclude='./build*' --exclude=./.git --exclude=./run --transform 's,^\\.,postspool-0.3.0,' "
      "-czf " + top + "/SOURCES/postspool-0.3.0.tar.gz . && cp " + Quote(source_dir_) +
      "/packaging/systemd/postspool.sysusers " + top + "/SOURCES/");
  ASSERT_EQ(prep.status, 0) << prep.output;
  const auto t0 = Clock::now();
  const CmdResult build = Sh("rpmbuild --nodeps --load " +
                                 Quote(source_dir_ + "/tests/packaging/rpm-macros-debian") +
                                 " --define '_topdir " + top + "' -bb " +
                                 Quote(source_dir_ + "/packaging/rpm/postspool.spec") +
                                 " > " + top + "/build.log 2>&1 || { tail -n 60 " + top +
                                 "/build.log; exit 1; }",
                             1800);
  ASSERT_EQ(build.status, 0) << build.output;
  std::printf("[ figures ] rpmbuild: %.0f s\n",
              std::chrono::duration<double>(Clock::now() - t0).count());
  const std::string rpms = top + "/RPMS/*/";
  auto rpm = [&](const std::string& name) {
    return Trim(Sh("ls " + rpms + name + "-0.3.0-1*.rpm").output);
  };
  const std::string daemon_rpm = rpm("postspool");
  const std::string lib_rpm = rpm("libpostspool");
  const std::string devel_rpm = rpm("libpostspool-devel");
  const std::string shim_rpm = rpm("postspool-shim");
  ASSERT_FALSE(daemon_rpm.empty() || lib_rpm.empty() || devel_rpm.empty() || shim_rpm.empty())
      << Sh("ls -R " + top + "/RPMS").output;

  const std::string files = Sh("rpm -qlp " + daemon_rpm).output;
  for (const char* f : {"/usr/sbin/postspoold", "/usr/bin/postspool",
                        "/usr/lib/systemd/system/postspoold.service",
                        "/usr/lib/sysusers.d/postspool.conf", "/usr/lib/tmpfiles.d/postspool.conf",
                        "/etc/postspool/postspoold.conf", "/var/spool/postspool/incoming",
                        "/var/spool/postspool/quarantine", "/var/lib/postspool/journal",
                        "/run/postspool", "/usr/share/man/man1/postspool.1",
                        "/usr/share/man/man5/postspool.conf.5", "/usr/share/man/man8/postspoold.8"}) {
    EXPECT_NE(files.find(f), std::string::npos) << f << " not in " << daemon_rpm << ":\n" << files;
  }
  // Owners and modes as packaging/README.md has them; the config a conffile.
  const std::string dump = Sh("rpm -qp --dump " + daemon_rpm).output;
  auto dump_line = [&](const std::string& path) {
    std::istringstream in(dump);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind(path + " ", 0) == 0) return line;
    }
    return std::string();
  };
  // --dump: path size mtime digest mode owner group isconfig isdoc rdev symlink
  auto fields = [&](const std::string& path) {
    std::istringstream in(dump_line(path));
    std::vector<std::string> v;
    std::string w;
    while (in >> w) v.push_back(w);
    return v.size() >= 9 ? v[4] + " " + v[5] + ":" + v[6] + " config=" + v[7] : "missing";
  };
  EXPECT_EQ(fields("/etc/postspool/postspoold.conf"), "0100640 root:postspool config=1");
  EXPECT_EQ(fields("/var/spool/postspool"), "040755 root:root config=0");
  EXPECT_EQ(fields("/var/spool/postspool/incoming"), "043733 postspool:postspool config=0");
  EXPECT_EQ(fields("/var/spool/postspool/quarantine"), "040700 postspool:postspool config=0");
  EXPECT_EQ(fields("/var/lib/postspool"), "040700 postspool:postspool config=0");
  EXPECT_EQ(fields("/var/lib/postspool/journal"), "040700 postspool:postspool config=0");

  const std::string lib_files = Sh("rpm -qlp " + lib_rpm).output;
  EXPECT_NE(lib_files.find("/usr/lib64/libpostspool.so.0"), std::string::npos) << lib_files;
  const std::string shim_files = Sh("rpm -qlp " + shim_rpm).output;
  for (const char* f : {"/usr/lib64/postspool/libpostspool-shim.so",
                        "/usr/share/man/man7/libpostspool-shim.7"}) {
    EXPECT_NE(shim_files.find(f), std::string::npos) << f << " not in " << shim_rpm << ":\n"
                                                     << shim_files;
  }
  const std::string devel_files = Sh("rpm -qlp " + devel_rpm).output;
  for (const char* f : {"/usr/include/postspool.h", "/usr/lib64/libpostspool.so",
                        "/usr/lib64/pkgconfig/libpostspool.pc", "/usr/share/man/man3/libpostspool.3"}) {
    EXPECT_NE(devel_files.find(f), std::string::npos) << f << " not in:\n" << devel_files;
  }

  // Scriptlets: the user before the files are unpacked (so that they get
  // their owner), the directories and the unit after, restart on upgrade.
  const std::string scripts = Sh("rpm -qp --scripts " + daemon_rpm).output;
  for (const char* s : {"preinstall scriptlet", "useradd", "groupadd", "postinstall scriptlet",
                        "systemd-tmpfiles --create /usr/lib/tmpfiles.d/postspool.conf",
                        "preuninstall scriptlet", "postspoold.service", "postuninstall scriptlet"}) {
    EXPECT_NE(scripts.find(s), std::string::npos) << "'" << s << "' not in the scriptlets:\n"
                                                  << scripts;
  }
  const std::string lib_scripts = Sh("rpm -qp --scripts " + lib_rpm).output;
  EXPECT_NE(lib_scripts.find("ldconfig"), std::string::npos) << lib_scripts;

  const std::string requires_ = Sh("rpm -qp --requires " + daemon_rpm).output;
  for (const char* r : {"libpostspool(x86-64) = 0.3.0-1", "librabbitmq.so.4()(64bit)",
                        "liburing.so.2()(64bit)"}) {
    EXPECT_NE(requires_.find(r), std::string::npos) << r << " not required:\n" << requires_;
  }
  const std::string lib_requires = Sh("rpm -qp --requires " + lib_rpm).output;
  // libpostspool links libstdc++ statically (packaging/README.md).
  EXPECT_EQ(lib_requires.find("libstdc++"), std::string::npos) << lib_requires;
  const std::string lib_provides = Sh("rpm -qp --provides " + lib_rpm).output;
  EXPECT_NE(lib_provides.find("libpostspool.so.0()(64bit)"), std::string::npos) << lib_provides;
  std::printf("[ rpm --requires postspool ]\n%s", requires_.c_str());
}

TEST_F(PackagingTest, DebsInstallPostAsTwoUsersUpgradeRemovePurge) {
  if (const std::string why = ExistingPostspool(); !why.empty()) GTEST_SKIP() << why;
  POSTSPOOL_REQUIRE_BROKER();
  BrokerProcess* broker = BrokerEnvironment::broker();
  const auto t_start = Clock::now();

  // Build and check.
  const std::string debs = BuildDebs();
  ASSERT_FALSE(HasFailure());
  for (const std::string& p : kDebs) ASSERT_FALSE(DebPath(debs, p).empty()) << p;
  const CmdResult lint = Sh("lintian --fail-on error " + debs + "/*.changes", 600);
  EXPECT_EQ(lint.status, 0) << lint.output;
  std::printf("[ lintian ]\n%s", lint.output.c_str());

  // Install: the maintainer scripts make the user and the directories.
  CmdResult r = InstallDebs(debs);
  ASSERT_EQ(r.status, 0) << r.output;
  const passwd* pw = ::getpwnam("postspool");
  ASSERT_NE(pw, nullptr) << "no user postspool after the install";
  EXPECT_LT(pw->pw_uid, 1000u) << "not a system user";
  EXPECT_STREQ(pw->pw_dir, "/var/lib/postspool");
  EXPECT_EQ(std::string(pw->pw_shell).find("nologin"), std::string(pw->pw_shell).size() - 7);
  auto expect_layout = [&](const std::string& when) {
    SCOPED_TRACE(when);
    EXPECT_EQ(OwnerMode("/run/postspool"), "postspool:postspool 755");
    EXPECT_EQ(OwnerMode("/var/spool/postspool"), "root:root 755");
    EXPECT_EQ(OwnerMode(kIncoming), "postspool:postspool 3733");
    EXPECT_EQ(OwnerMode(kQuarantine), "postspool:postspool 700");
    EXPECT_EQ(OwnerMode("/var/lib/postspool"), "postspool:postspool 700");
    EXPECT_EQ(OwnerMode(kJournal), "postspool:postspool 700");
    EXPECT_EQ(OwnerMode(kConf), "root:postspool 640");
  };
  expect_layout("after dpkg -i");
  for (const char* page : {"/usr/share/man/man1/postspool.1.gz", "/usr/share/man/man5/postspool.conf.5.gz",
                           "/usr/share/man/man8/postspoold.8.gz", "/usr/share/man/man3/libpostspool.3.gz",
                           "/usr/share/man/man7/libpostspool-shim.7.gz",
                           "/usr/lib/x86_64-linux-gnu/postspool/libpostspool-shim.so"}) {
    EXPECT_TRUE(Exists(page)) << page;
  }
  // As at boot (no systemd here to run them): /run is empty, then the
  // installed sysusers.d and tmpfiles.d files make it all again.
  Sh("rm -rf /run/postspool");
  r = Sh("systemd-sysusers /usr/lib/sysusers.d/postspool.conf && "
         "systemd-tmpfiles --create /usr/lib/tmpfiles.d/postspool.conf");
  EXPECT_EQ(r.status, 0) << r.output;
  expect_layout("after systemd-sysusers and systemd-tmpfiles");

  // The installed configuration, pointed at the test broker: a local edit
  // that the upgrade must keep.
  {
    std::ofstream conf(kConf, std::ios::app);
    conf << "\n# pkgtest\npost_broker = " << broker->url() << "\npost_exchange = " << kExchange
         << "\n";
  }
  r = Sh("setpriv --reuid=postspool --regid=postspool --clear-groups -- "
         "/usr/sbin/postspoold --config /etc/postspool/postspoold.conf --check-config");
  EXPECT_EQ(r.status, 0) << r.output;
  // A bad configuration exits 2, which the installed unit does not restart
  // (no restart loop on a configuration error; any other failure restarts).
  {
    std::ofstream(work_ + "/bad.conf") << "no_such_key = 1\n";
    EXPECT_EQ(Sh("/usr/sbin/postspoold --config " + work_ + "/bad.conf").status, 2);
    const std::string unit = Sh("cat /lib/systemd/system/postspoold.service").output;
    EXPECT_NE(unit.find("\nRestartPreventExitStatus=2\n"), std::string::npos);
    EXPECT_NE(unit.find("\nRestart=on-failure\n"), std::string::npos);
    // The hardening: systemd-analyze's exposure score (works without systemd
    // running) must not get worse than the 1.8 that packaging/README.md
    // explains.
    const CmdResult score = Sh("cd / && systemd-analyze security --offline=true --threshold=18 "
                               "/lib/systemd/system/postspoold.service");
    EXPECT_EQ(score.status, 0) << score.output;
    const size_t overall = score.output.find("Overall exposure level");
    if (overall != std::string::npos) {
      std::printf("[ figures ] systemd-analyze security: %s\n",
                  score.output.substr(overall, score.output.find('\n', overall) - overall).c_str());
    }
  }
  ASSERT_TRUE(consumer_.Connect(broker->url()).ok());
  ASSERT_TRUE(consumer_.DeclareExchange(kExchange).ok());
  ASSERT_TRUE(consumer_.DeclareBoundQueue("pkgtest", kExchange, "#").ok());

  TestUser a, b;
  std::string why;
  ASSERT_TRUE(CreateUser("pkga", &a, &why)) << why;
  users_.push_back(a);
  ASSERT_TRUE(CreateUser("pkgb", &b, &why)) << why;
  users_.push_back(b);

  // 1. Daemon up: posts over the socket arrive, stamped with their poster.
  daemon_ = std::make_unique<InstalledDaemon>(work_ + "/postspoold.log");
  ASSERT_TRUE(daemon_->Start()) << daemon_->Log();
  std::vector<std::string> all;
  for (const TestUser* u : {&a, &b}) {
    for (const std::string& id : Post(*u, "socket", 3, "socket")) all.push_back(id);
  }
  ASSERT_FALSE(HasFailure()) << daemon_->Log();
  EXPECT_TRUE(WaitArrived(all)) << daemon_->Log();
  ReadOrigins();
  ExpectOrigins(all);

  // 2. Broker down, daemon up: posts wait in the journal.
  consumer_.Disconnect();
  ASSERT_TRUE(broker->Stop().ok());
  std::vector<std::string> journaled;
  for (const TestUser* u : {&a, &b}) {
    for (const std::string& id : Post(*u, "journal", 3, "socket")) journaled.push_back(id);
  }
  ReadOrigins();
  ExpectOrigins(journaled);
  EXPECT_EQ(daemon_->Stop(), 0) << daemon_->Log();

  // 3. Daemon down: posts go to the spool. b first squats a's shared
  //    segment name with a segment of its own posts (forged: a file under
  //    a's uid), made in a private spool directory.
  const std::string b_private = work_ + "/b-spool";
  Sh("mkdir -m 700 " + b_private + " && chown " + b.name + " " + b_private);
  std::vector<std::string> forged;
  {
    const CmdResult f = ShAs(b, "/usr/bin/postspool post --rel-path pkgtest/forged --budget-ms 500 "
                                "--socket /nonexistent/sock --spool-dir " + b_private);
    ASSERT_EQ(f.status, 0) << f.output;
    forged.push_back(f.output.substr(0, 36));
    const CmdResult cp = ShAs(b, "cp " + b_private + "/" + std::to_string(b.uid) + ".current " +
                                     kIncoming + "/" + std::to_string(a.uid) + ".current");
    EXPECT_EQ(cp.status, 0) << cp.output;
  }
  std::vector<std::string> spooled;
  for (const TestUser* u : {&a, &b}) {
    for (const std::string& id : Post(*u, "spool", 3, "spool")) spooled.push_back(id);
  }
  // Neither can list, read, write, delete or replace the other's segments.
  std::map<std::string, std::string> before;  // file -> sha256
  for (const std::string& f : List(kIncoming)) {
    before[f] = Sh("sha256sum " + Quote(std::string(kIncoming) + "/" + f)).output;
  }
  for (auto [attacker, victim] : {std::pair{&a, &b}, std::pair{&b, &a}}) {
    SCOPED_TRACE(attacker->name + " against " + victim->name);
    std::string victim_file, own_file;
    for (const std::string& f : List(kIncoming)) {
      struct stat st;
      if (::stat((std::string(kIncoming) + "/" + f).c_str(), &st) != 0) continue;
      if (st.st_uid == victim->uid && f.find(std::to_string(victim->uid) + ".") == 0) victim_file = std::string(kIncoming) + "/" + f;
      if (st.st_uid == attacker->uid && f.find(std::to_string(attacker->uid) + ".") == 0) {
        own_file = std::string(kIncoming) + "/" + f;
      }
    }
    ASSERT_FALSE(victim_file.empty() || own_file.empty());
    EXPECT_NE(ShAs(*attacker, "ls " + std::string(kIncoming)).status, 0) << "listed";
    EXPECT_NE(ShAs(*attacker, "cat " + victim_file + " >/dev/null").status, 0) << "read";
    EXPECT_NE(ShAs(*attacker, "printf x >> " + victim_file).status, 0) << "appended";
    EXPECT_NE(ShAs(*attacker, ": > " + victim_file).status, 0) << "truncated";
    EXPECT_NE(ShAs(*attacker, "rm -f " + victim_file).status, 0) << "deleted";
    EXPECT_NE(ShAs(*attacker, "mv -f " + victim_file + " " + victim_file + ".x").status, 0)
        << "renamed";
    EXPECT_NE(ShAs(*attacker, "mv -f " + own_file + " " + victim_file).status, 0) << "replaced";
  }
  for (const auto& [f, sum] : before) {
    EXPECT_EQ(Sh("sha256sum " + Quote(std::string(kIncoming) + "/" + f)).output, sum)
        << f << " changed";
  }
  EXPECT_EQ(List(kIncoming).size(), before.size());

  // 4. Upgrade with posts in the journal and in the spool.
  const std::string journal_before = Sh("ls -l " + std::string(kJournal)).output;
  const std::string up1 = Repack(debs, "+pkgtest1");
  r = InstallDebs(up1);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(Trim(Sh("dpkg-query -W -f='${Version}' postspoold").output),
            Trim(Sh("dpkg-deb -f " + Quote(DebPath(debs, "postspoold")) + " Version").output) +
                "+pkgtest1");
  expect_layout("after the upgrade");
  EXPECT_EQ(Sh("grep -c '^post_exchange = xs_pkgtest' " + std::string(kConf)).output, "1\n")
      << "the local edit of the configuration was lost";
  EXPECT_EQ(List(kIncoming).size(), before.size()) << "the spool changed";
  EXPECT_EQ(Sh("ls -l " + std::string(kJournal)).output, journal_before) << "the journal changed";

  // The new daemon (broker still down) adopts the spool into its journal and
  // quarantines the forged segment.
  ASSERT_TRUE(daemon_->Start()) << daemon_->Log();
  {
    const auto deadline = Clock::now() + 60s;
    bool adopted = false;
    while (!adopted && Clock::now() < deadline) {
      ReadOrigins();
      adopted = true;
      for (const std::string& id : spooled) adopted = adopted && origins_.count(id);
      if (!adopted) std::this_thread::sleep_for(200ms);
    }
    EXPECT_TRUE(adopted) << daemon_->Log();
    ExpectOrigins(spooled);
    for (const std::string& id : forged) EXPECT_EQ(origins_.count(id), 0u) << "forged post journaled";
    EXPECT_FALSE(List(kQuarantine).empty()) << "the forged segment was not quarantined";
  }

  // 5. Upgrade again with this daemon running and posts in its journal, then
  //    restart it (postinst does this under systemd): journal replay.
  std::vector<std::string> running;
  for (const TestUser* u : {&a, &b}) {
    for (const std::string& id : Post(*u, "running", 2, "socket")) running.push_back(id);
  }
  ReadOrigins();
  ExpectOrigins(running);
  const std::string up2 = Repack(debs, "+pkgtest2");
  r = InstallDebs(up2);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(daemon_->Stop(), 0) << daemon_->Log();
  ASSERT_TRUE(daemon_->Start()) << daemon_->Log();
  ASSERT_TRUE(broker->Start().ok());
  ASSERT_TRUE(consumer_.Connect(broker->url()).ok());
  for (const std::string& id : journaled) all.push_back(id);
  for (const std::string& id : spooled) all.push_back(id);
  for (const std::string& id : running) all.push_back(id);
  EXPECT_TRUE(WaitArrived(all)) << daemon_->Log();
  size_t missing = 0;
  for (const std::string& id : all) missing += arrived_.count(id) == 0;
  EXPECT_EQ(missing, 0u) << "of " << all.size() << " posts";
  for (const std::string& id : forged) EXPECT_EQ(arrived_.count(id), 0u) << "forged post arrived";
  std::printf("[ figures ] %zu posts by two users arrived (%zu through the journal and %zu through "
              "the spool across upgrades)\n",
              all.size(), journaled.size() + running.size(), spooled.size());
  EXPECT_EQ(daemon_->Stop(), 0) << daemon_->Log();

  // 6. Remove: programs gone; configuration, data and user stay.
  r = Sh("dpkg --remove postspool-shim postspoold libpostspool-dev libpostspool0", 300);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_FALSE(Exists("/usr/sbin/postspoold"));
  EXPECT_FALSE(Exists("/usr/bin/postspool"));
  EXPECT_FALSE(Exists("/usr/share/man/man8/postspoold.8.gz"));
  EXPECT_EQ(OwnerMode(kConf), "root:postspool 640");
  EXPECT_EQ(Sh("grep -c '^post_exchange = xs_pkgtest' " + std::string(kConf)).output, "1\n");
  EXPECT_EQ(OwnerMode(kIncoming), "postspool:postspool 3733");
  EXPECT_EQ(OwnerMode(kJournal), "postspool:postspool 700");
  EXPECT_FALSE(List(kQuarantine).empty()) << "remove deleted data";
  EXPECT_NE(::getpwnam("postspool"), nullptr);

  // 7. Purge: configuration and data gone; the system user stays (Debian's
  //    rule for system users; the cleanup deletes it).
  r = Sh("dpkg --purge postspool-shim postspoold libpostspool-dev libpostspool0", 300);
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* gone : {"/etc/postspool", "/var/lib/postspool", "/var/spool/postspool",
                           "/run/postspool", "/etc/systemd/system/multi-user.target.wants/postspoold.service"}) {
    EXPECT_FALSE(Exists(gone)) << gone << " left after purge";
  }
  EXPECT_NE(Sh("dpkg-statoverride --list " + std::string(kConf)).status, 0)
      << "statoverride left after purge";
  EXPECT_NE(::getpwnam("postspool"), nullptr);
  EXPECT_EQ(Trim(Sh("dpkg-query -W -f='${db:Status-Abbrev}' postspoold 2>/dev/null").output), "")
      << "postspoold still known to dpkg";
  std::printf("[ figures ] deb test: %.0f s\n",
              std::chrono::duration<double>(Clock::now() - t_start).count());
}

}  // namespace
}  // namespace postspool::testing
