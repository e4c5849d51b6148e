// An unmodified Sarracenia sr3 subscriber applies what postspool publishes.
//
// One tree scenario (every fileOp; names with spaces, '#', '%', unicode,
// bytes that are not UTF-8 and a leading '-'; posts from the CLI through the
// spool with the daemon down and through the socket, and from real programs
// under the shim through the ring and the socket) runs once per subscriber
// setting. After every step the test waits (polling, generous deadline)
// until the subscriber's tree equals the source tree as sr3 is expected to
// make it: same names, types, file contents and modes, symbolic link
// targets (an absolute target under the source directory is mapped onto the
// subscriber's directory, as sr3 does). At the end it scans sr3's log for
// errors and for "fall back to copy" (a rename sr3 could not apply as a
// rename), which must be exactly the known sr3 limits (format/FORMAT.md,
// "fileOp values").
//
// sr3 is run as a separate program, as users run it: Debian's
// /usr/bin/python3 with PYTHONPATH at the sarracenia sources next to this
// project (../shared/third_party/sarracenia, passed by meson), its own HOME.
// A missing sarracenia directory or python module is a failure, not a skip:
// this suite is the only check of the wire format against its consumer.
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "broker/broker_fixture.h"
#include "daemon_process.h"

namespace postspool::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr char kSarraceniaDir[] = POSTSPOOL_SARRACENIA_DIR;
constexpr char kPython[] = "/usr/bin/python3";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Runs argv with exactly `env` in `cwd`; stdout and stderr to `log`
// (appended). Returns the pid; the child leads a process group of its own.
pid_t Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
            const std::string& cwd, const std::string& log) {
  std::vector<char*> a;
  for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  std::vector<char*> e;
  for (const auto& s : env) e.push_back(const_cast<char*>(s.c_str()));
  e.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    // Ends with the test binary even if it is killed (a timeout).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, 0);
    if (::chdir(cwd.c_str()) != 0) ::_exit(126);
    ::execve(a[0], a.data(), e.data());
    ::_exit(127);
  }
  return pid;
}

// Waits for `pid` at most `timeout`; kills its group then. The exit status
// (-1 if it had to be killed or did not exit normally).
int WaitFor(pid_t pid, std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  int status = 0;
  while (Clock::now() < deadline) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (r < 0) return -1;
    std::this_thread::sleep_for(20ms);
  }
  ::kill(-pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return -1;
}

// A process group that is ended (SIGTERM, then SIGKILL) when this goes out
// of scope, whatever happened.
class Sr3Process {
 public:
  Sr3Process() = default;
  ~Sr3Process() { Stop(); }
  Sr3Process(const Sr3Process&) = delete;
  Sr3Process& operator=(const Sr3Process&) = delete;
  void Start(pid_t pid) { pid_ = pid; }
  void Stop() {
    if (pid_ <= 0) return;
    ::kill(-pid_, SIGTERM);
    int status = 0;
    const auto deadline = Clock::now() + 20s;
    while (Clock::now() < deadline && ::waitpid(pid_, &status, WNOHANG) == 0) {
      std::this_thread::sleep_for(50ms);
    }
    ::kill(-pid_, SIGKILL);  // the group: any helper it left
    ::waitpid(pid_, &status, WNOHANG);
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  bool Exited() {
    int status = 0;
    return pid_ > 0 && ::waitpid(pid_, &status, WNOHANG) == pid_ && ((pid_ = -1), true);
  }

 private:
  pid_t pid_ = -1;
};

// A tree as text: one line per entry, sorted, in bytes (names may not be
// UTF-8): "d NAME", "f NAME MODE CONTENT", "l NAME -> TARGET". With `from`
// (the source tree, as sr3 is expected to copy it): symbolic link targets
// starting with `from` + '/' are shown with `to` instead (sr3 maps them onto
// its tree, as intended), and a relative target that is a bare name (no
// '/') of a link N directories deep is shown with N "../" before it: sr3
// 3.00 treats a bare name as relative to its base directory and adds them
// (a known upstream limit, format/FORMAT.md "fileOp values").
std::map<std::string, std::string> Snapshot(const std::string& root, const std::string& from = "",
                                            const std::string& to = "", bool strip = false) {
  std::map<std::string, std::string> out;
  std::error_code ec;
  if (!fs::exists(root, ec)) return out;
  for (auto it = fs::recursive_directory_iterator(root, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const std::string path = it->path().string();
    const std::string rel = path.substr(root.size() + 1);
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) continue;
    char mode[16];
    std::snprintf(mode, sizeof mode, "%o", st.st_mode & 07777);
    if (S_ISDIR(st.st_mode)) {
      out[rel] = "d";
    } else if (S_ISLNK(st.st_mode)) {
      std::string target = fs::read_symlink(path, ec).string();
      std::string up;  // from the link's directory to the top of the tree
      for (char c : rel) {
        if (c == '/') up += "../";
      }
      if (!from.empty() && target.starts_with(from + "/")) {
        // With strip, sr3 makes it relative to the link's directory.
        target = strip ? up + target.substr(from.size() + 1) : to + target.substr(from.size());
      } else if (!from.empty() && target.find('/') == std::string::npos) {
        for (char c : rel) {
          if (c == '/') target = "../" + target;
        }
      }
      out[rel] = "l -> " + target;
    } else if (S_ISREG(st.st_mode)) {
      out[rel] = std::string("f ") + mode + " " + ReadFile(path);
    } else {
      out[rel] = "other";
    }
  }
  return out;
}

std::string Diff(const std::map<std::string, std::string>& want,
                 const std::map<std::string, std::string>& got) {
  std::string s;
  for (const auto& [k, v] : want) {
    auto it = got.find(k);
    if (it == got.end()) s += "  missing: " + k + " (" + v + ")\n";
    else if (it->second != v) s += "  differs: " + k + ": want (" + v + ") got (" + it->second + ")\n";
  }
  for (const auto& [k, v] : got) {
    if (!want.contains(k)) s += "  extra:   " + k + " (" + v + ")\n";
  }
  return s;
}

size_t CountLines(const std::string& text, const std::string& needle) {
  size_t n = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.find(needle) != std::string::npos) ++n;
  }
  return n;
}

std::string LinesWith(const std::string& text, const std::vector<std::string>& needles) {
  std::string out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    for (const auto& n : needles) {
      if (line.find(n) != std::string::npos) {
        out += line + "\n";
        break;
      }
    }
  }
  return out;
}

// How the posts are made in a step.
enum class Poster {
  kCliSpool,   // the postspool tool, daemon down: the spool; the daemon then starts
  kCliSocket,  // the postspool tool, daemon up (no ring): the socket
  kShimRing,   // programs under the shim: the ring
  kShimSocket  // programs under the shim with POSTSPOOL_RING=0: the socket
};

struct Step {
  std::string name;
  Poster poster;
  std::string script;  // /bin/bash, run in the source directory
};

// The scenario. Each step's posts that depend on each other are made by one
// process, or through the socket (acknowledged once journaled, so in order
// across processes): the ring keeps order per process only. `p` is the
// postspool tool's post command with the base options of the setting.
const std::vector<Step>& Scenario() {
  static const std::vector<Step> steps = {
      {"cli: mkdir and writes with hostile names, spooled", Poster::kCliSpool,
       "set -e\n"
       "mkdir c && p --file c\n"
       "printf one > 'c/sp ace #1 %41.txt' && p --file 'c/sp ace #1 %41.txt'\n"
       "printf uni > 'c/é ü.txt' && chmod 640 'c/é ü.txt' && p --file 'c/é ü.txt'\n"
       "n=\"c/raw$(printf '\\377\\376')\"; printf raw > \"$n\" && p --file \"$n\"\n"
       "printf dash > ./-lead && p --file ./-lead\n"
       "mkdir c/d1 && p --file c/d1 && printf f > c/d1/f && p --file c/d1/f\n"
       "printf hl > c/h0 && p --file c/h0\n"},
      {"cli: rename of a file, symbolic links, a hard link, spooled", Poster::kCliSpool,
       "set -e\n"
       "mv 'c/sp ace #1 %41.txt' 'c/renamed #1.txt'\n"
       "p --file 'c/renamed #1.txt' --rename 'c/sp ace #1 %41.txt'\n"
       "ln -s 'é ü.txt' c/bare-link && p --file c/bare-link\n"
       "ln -s './é ü.txt' c/rel-link && p --file c/rel-link\n"
       "ln -s \"$PWD/c/é ü.txt\" c/abs-link && p --file c/abs-link\n"
       "ln c/h0 c/hard && p --file c/hard\n"},
      {"cli: rename of a directory and a symbolic link, remove, rmdir", Poster::kCliSocket,
       "set -e\n"
       "mv c/d1 c/d2 && p --file c/d2 --rename c/d1\n"
       "mv c/rel-link c/rel-link2 && p --file c/rel-link2 --rename c/rel-link\n"
       "mv ./-lead ./-lead2 && p --file ./-lead2 --rename ./-lead\n"
       "rm c/h0 && p --file c/h0 --remove\n"
       "mkdir c/e && p --file c/e && rmdir c/e && p --file c/e --remove --directory\n"},
      {"shim: tar x", Poster::kShimRing, "set -e; mkdir s; tar xf \"$TARBALL\" -C s\n"},
      {"shim: cp -r", Poster::kShimRing, "cp -r s/src s/copy\n"},
      {"shim: rsync -a", Poster::kShimRing, "rsync -a s/src/ s/rsynced\n"},
      {"shim: mv of a directory", Poster::kShimRing, "mv s/copy s/moved\n"},
      {"shim: mv of a file across directories", Poster::kShimRing,
       "mv 's/moved/a #1.txt' 's/moved/sub dir/-moved %.txt'\n"},
      {"shim: ln -s, relative and absolute", Poster::kShimRing,
       "ln -s '../src/é.txt' s/moved/rel && ln -s \"$PWD/s/src/é.txt\" s/moved/abs\n"},
      {"shim: mv of a symbolic link", Poster::kShimRing, "mv s/moved/rel s/moved/rel2\n"},
      {"shim: ln (hard link)", Poster::kShimRing, "ln 's/src/é.txt' s/moved/hard\n"},
      {"shim: rm -r", Poster::kShimRing, "rm -r s/rsynced\n"},
      {"shim: tar x, for the shell script", Poster::kShimRing,
       "mkdir 'j #1' && tar xf \"$TARBALL\" -C 'j #1'\n"},
      // Within one step, nothing a program writes is renamed or removed by a
      // later one: the subscriber fetches a file's content from the source
      // when it gets the post, and a name gone by then cannot be fetched (as
      // with any poster; the renames and removals act on what earlier steps
      // made, which the subscriber already has).
      {"shim: a shell script doing all of these", Poster::kShimSocket,
       "set -e\n"
       "cd 'j #1'\n"
       "mv src/-dash 'src/-dash %2F'; mv 'src/sub dir/x' src/x2\n"
       "cp -r 'src/sub dir' copied; rsync -a 'src/sub dir/' 'r s'\n"
       "ln src/é.txt h; ln -s ./é.txt src/l; ln -s \"$PWD/src/x2\" labs\n"
       "printf 'x\\377' > \"$(printf 'b\\377')\"; echo w > w\n"
       "rm -r 'src/sub dir'; mkdir t; tar xf \"$TARBALL\" -C t\n"},
  };
  return steps;
}

// A tarball (made outside the watched tree) for `tar x` and the others.
void MakeTarball(const std::string& dir, const std::string& tarball) {
  const std::string src = dir + "/src";
  fs::create_directories(src + "/sub dir/deeper");
  WriteFile(src + "/a #1.txt", "a1");
  WriteFile(src + "/é.txt", "unicode");
  WriteFile(src + "/%41 100%", "percent");
  WriteFile(src + "/-dash", "dash");
  WriteFile(src + "/" + std::string("n\xff\xfe"), "not utf-8");
  WriteFile(src + "/sub dir/x", "x");
  WriteFile(src + "/sub dir/deeper/y", std::string(70000, 'y'));
  ::chmod((src + "/sub dir/x").c_str(), 0600);
  ::chmod((src + "/-dash").c_str(), 0755);
  const pid_t pid = Spawn({"/bin/tar", "cf", tarball, "-C", dir, "src"}, {"PATH=/usr/bin:/bin"},
                          dir, dir + "/tar.log");
  ASSERT_EQ(WaitFor(pid, 60s), 0) << ReadFile(dir + "/tar.log");
  fs::remove_all(src);
}

// A subscriber setting, and the posting side that goes with it.
struct Setting {
  std::string name;
  std::string sr3_options;     // lines for the sr3 configuration (@SRC@, @N@ replaced)
  bool post_base_dir;          // posting side: post_baseDir (and baseUrl file:SRC) set
  bool strip;                  // sr3's strip: absolute link targets become relative
};

void PrintTo(const Setting& s, std::ostream* os) { *os << s.name; }

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
    s.replace(at, from.size(), to);
  }
  return s;
}

class Sr3Interop : public ::testing::TestWithParam<Setting> {
 protected:
  void SetUp() override {
    POSTSPOOL_REQUIRE_BROKER();
    ASSERT_TRUE(fs::is_directory(std::string(kSarraceniaDir) + "/sarracenia"))
        << "the unmodified sr3 is not at " << kSarraceniaDir
        << " (../shared/third_party/sarracenia next to the source tree): this suite checks "
           "postspool's posts against it and cannot run without it";
    ASSERT_EQ(::access(kPython, X_OK), 0) << kPython << " is needed to run sr3";
    char tmpl[] = "/tmp/postspool-interop-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = fs::canonical(tmpl).string();
    src_ = root_ + "/src";
    dst_ = root_ + "/dst";
    home_ = root_ + "/home";
    fs::create_directories(src_);
    fs::create_directories(home_ + "/.config/sr3/subscribe");
    fs::create_directories(home_ + "/.cache/sr3/subscribe/interop");
    tarball_ = root_ + "/tree.tar";
    fs::create_directories(root_ + "/tar");
    MakeTarball(root_ + "/tar", tarball_);
    exchange_ = "xs_interop";
    AmqpTestClient admin;
    ASSERT_TRUE(admin.Connect(BrokerEnvironment::broker()->url()).ok());
    ASSERT_TRUE(admin.DeclareExchange(exchange_).ok());
    DaemonProcess::Options o;
    o.broker_url = BrokerEnvironment::broker()->url();
    o.exchange = exchange_;
    daemon_ = std::make_unique<DaemonProcess>(o);
    ASSERT_TRUE(daemon_->Start());
  }

  void TearDown() override {
    sr3_.Stop();
    if (daemon_) daemon_->Stop();
    daemon_.reset();
    if (!root_.empty() && std::getenv("POSTSPOOL_KEEP_TEST_DIRS") == nullptr) {
      RemoveTree(root_);
    }
  }

  std::string Sr3Log() const { return ReadFile(root_ + "/sr3.log"); }

  void StartSubscriber(const Setting& s) {
    const std::string url = BrokerEnvironment::broker()->url();
    size_t components = 0;
    for (char c : src_) components += c == '/';
    std::string conf = "broker " + url + "\nexchange " + exchange_ +
                       "\ntopicPrefix v03\nsubtopic #\ndirectory " + dst_ +
                       "\nlogLevel info\nacceptUnmatched on\n" + s.sr3_options + "\n";
    conf = Replace(Replace(conf, "@SRC@", src_), "@N@", std::to_string(components));
    WriteFile(home_ + "/.config/sr3/subscribe/interop.conf", conf);
    WriteFile(home_ + "/.config/sr3/credentials.conf", url + "\n");
    sr3_.Start(Spawn({kPython, "-m", "sarracenia.sr", "foreground", "subscribe/interop"},
                     {"PATH=/usr/bin:/bin", std::string("PYTHONPATH=") + kSarraceniaDir,
                      "HOME=" + home_, "LANG=C.UTF-8", "LC_ALL=C.UTF-8"},
                     root_, root_ + "/sr3.log"));
    // Bound to the exchange: posts published from now on reach its queue.
    const auto deadline = Clock::now() + 120s;
    while (Sr3Log().find("binding ") == std::string::npos) {
      ASSERT_FALSE(sr3_.Exited()) << "sr3 exited:\n" << Sr3Log();
      ASSERT_LT(Clock::now(), deadline) << "sr3 did not bind its queue:\n" << Sr3Log();
      std::this_thread::sleep_for(100ms);
    }
  }

  void RunStep(const Setting& s, const Step& step) {
    const std::string cli = POSTSPOOL_CLI_PATH;
    const std::string base = s.post_base_dir
                                 ? " --base-dir '" + src_ + "' --base-url 'file:" + src_ + "'"
                                 : "";
    const std::string script =
        "p() { '" + cli + "' post \"$@\"" + base + " >/dev/null; }\n" + step.script;
    // LANG=C: the programs' regular expressions (the shim's reject, in their
    // locale) then match any byte, and names need not be UTF-8.
    std::vector<std::string> env = {"PATH=/usr/bin:/bin", "HOME=" + home_, "LANG=C",
                                    "TARBALL=" + tarball_,
                                    // A post over its budget (5 ms by default)
                                    // goes to the spool, and so out of order
                                    // with the socket's; on a loaded machine
                                    // that happens, and the subscriber would
                                    // then see an rmdir before the removal of
                                    // the directory's files.
                                    "POSTSPOOL_BUDGET_MS=60000",
                                    "POSTSPOOL_SOCKET=" + daemon_->socket_path(),
                                    "POSTSPOOL_SPOOL_DIR=" + daemon_->spool_dir()};
    if (step.poster == Poster::kCliSpool) {
      ASSERT_EQ(daemon_->Stop(), 0);
    }
    if (step.poster == Poster::kCliSocket || step.poster == Poster::kShimSocket) {
      env.push_back("POSTSPOOL_RING=0");
    }
    if (step.poster == Poster::kShimRing || step.poster == Poster::kShimSocket) {
      env.push_back(std::string("LD_PRELOAD=") + POSTSPOOL_SHIM_PATH);
      // rsync's temporary names (.NAME.XXXXXX) are rejected, as users of
      // sarrac's shim do: renamed before a subscriber could fetch them, they
      // would only fail to download; the rename of one is then posted as a
      // new file.
      const std::string reject_rsync = "reject .*/\\.[^/]+\\.[A-Za-z0-9]{6}$;";
      env.push_back(s.post_base_dir ? "POSTSPOOL_SHIM_OPTIONS=" + reject_rsync + "post_baseDir " +
                                          src_ + ";post_baseUrl file:" + src_
                                    : "POSTSPOOL_SHIM_OPTIONS=" + reject_rsync + "accept ^" +
                                          src_ + "/.*;acceptUnmatched off");
    }
    const std::string log = root_ + "/step.log";
    std::error_code ec;
    fs::remove(log, ec);
    const pid_t pid = Spawn({"/bin/bash", "-c", script}, env, src_, log);
    ASSERT_EQ(WaitFor(pid, 120s), 0) << step.name << ":\n" << ReadFile(log);
    if (step.poster == Poster::kCliSpool) {
      ASSERT_TRUE(daemon_->Start());
    }
  }

  // Waits until the subscriber's tree is the source's (as sr3 makes it).
  void WaitForSameTree(const Setting& s, const std::string& step) {
    const auto deadline = Clock::now() + 120s;
    for (;;) {
      const auto want = Snapshot(src_, src_, dst_, s.strip);
      const auto got = Snapshot(dst_);
      if (want == got) return;
      if (Clock::now() > deadline || sr3_.Exited()) {
        FAIL() << s.name << ", after step \"" << step << "\": the trees differ:\n"
               << Diff(want, got) << "sr3 log (tail):\n"
               << Sr3Log().substr(Sr3Log().size() > 6000 ? Sr3Log().size() - 6000 : 0);
      }
      std::this_thread::sleep_for(200ms);
    }
  }

  std::string root_, src_, dst_, home_, tarball_, exchange_;
  std::unique_ptr<DaemonProcess> daemon_;
  Sr3Process sr3_;
};

TEST_P(Sr3Interop, SubscriberTreeEndsIdenticalAndRenamesAreApplied) {
  const Setting& s = GetParam();
  StartSubscriber(s);
  for (const Step& step : Scenario()) {
    SCOPED_TRACE(step.name);
    ASSERT_NO_FATAL_FAILURE(RunStep(s, step));
    ASSERT_NO_FATAL_FAILURE(WaitForSameTree(s, step.name));
  }
  const std::string log = Sr3Log();
  const std::string errors =
      LinesWith(log, {"ERROR", "Traceback", "Error:", "KeyError", "CRITICAL"});
  EXPECT_EQ(errors, "") << s.name;
  const std::string fallbacks = LinesWith(log, {"fall back to copy"});
  EXPECT_EQ(fallbacks, "") << s.name;
  // Every rename of the scenario applied as a rename: 4 from the tool (a
  // file, a directory, a symbolic link, a leading '-'), 3 from single
  // programs under the shim, 2 from the script.
  EXPECT_EQ(CountLines(log, "renameOneItem renamed "), 9u) << s.name;
  std::printf("[ report ] %s: %zu renamed, %zu fall back to copy\n", s.name.c_str(),
              CountLines(log, "renameOneItem renamed "), CountLines(log, "fall back to copy"));
}

INSTANTIATE_TEST_SUITE_P(
    Settings, Sr3Interop,
    ::testing::Values(
        Setting{"MirrorBaseDir", "mirror on\nbaseDir @SRC@\n", false, false},
        Setting{"MirrorBaseDirPostBaseDir", "mirror on\nbaseDir @SRC@\n", true, false},
        Setting{"MirrorNoBaseDir", "mirror on\n", true, false},
        Setting{"Strip", "mirror on\nstrip @N@\n", false, true}),
    [](const ::testing::TestParamInfo<Setting>& p) { return p.param.name; });

}  // namespace
}  // namespace postspool::testing
