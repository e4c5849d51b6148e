// Real programs under libpostspool-shim (LD_PRELOAD), posting through a real
// postspoold to a real RabbitMQ (started once for the binary by the broker
// fixture). Each test runs a program twice, in a directory the shim watches
// and, without the shim, in one it does not, and checks:
//  - exactly the expected posts arrive at the broker (relPath, fileOp, size,
//    identity), the expectation being computed from the files the program
//    left, with coreutils' sha512sum for the checksums;
//  - the program's exit code, output and files are the same as without the
//    shim.
// Then the same programs with the daemon down, and with the broker down:
// they exit as promptly, and their posts reach the spool or the daemon.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nettle/base64.h>
#include <nlohmann/json.hpp>

#include "broker/broker_fixture.h"
#include "e2e/daemon_process.h"
#include "test_util.h"

extern char** environ;

namespace postspool::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct ProgramRun {
  int exit_code = -1;
  std::string out;
  std::string err;
  double seconds = 0;
};

// Runs `args` through /bin/sh -c when given one string, in `cwd`, with the
// test's environment plus `env`; stdin from /dev/null, stdout and stderr to
// files in `scratch`.
ProgramRun RunProgram(const std::vector<std::string>& args, const std::string& cwd,
               const std::vector<std::string>& env, const std::string& scratch) {
  const std::string out_path = scratch + "/run.stdout", err_path = scratch + "/run.stderr";
  std::vector<std::string> envs;
  // A variable `env` sets replaces the inherited one (getenv takes the
  // first: scripts/test.sh exports ASAN_OPTIONS with detect_leaks=1).
  auto set_here = [&env](const std::string& kv) {
    const std::string name = kv.substr(0, kv.find('=') + 1);
    for (const std::string& mine : env) {
      if (mine.rfind(name, 0) == 0) return true;
    }
    return false;
  };
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    if (kv.rfind("LD_PRELOAD=", 0) == 0 || kv.rfind("POSTSPOOL_", 0) == 0 || set_here(kv)) continue;
    envs.push_back(kv);
  }
  envs.insert(envs.end(), env.begin(), env.end());
  std::vector<char*> envp, argv;
  for (std::string& s : envs) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> a = args;
  for (std::string& s : a) argv.push_back(s.data());
  argv.push_back(nullptr);
  const auto start = Clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int in = ::open("/dev/null", O_RDONLY);
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (in < 0 || out < 0 || err < 0 || ::chdir(cwd.c_str()) != 0) ::_exit(126);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(err, 2);
    ::close_range(3, ~0U, 0);  // nothing of the test (the broker supervisor's pipe)
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  ProgramRun r;
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadWhole(out_path);
  r.err = ReadWhole(err_path);
  return r;
}

std::vector<std::string> Sh(const std::string& script) { return {"/bin/sh", "-c", script}; }

// A file tree as text: one line per entry (relative path, type, content or
// link target), sorted; for comparing what a program left with and without
// the shim.
std::string TreeText(const std::string& root) {
  std::vector<std::string> lines;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec); it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const std::string rel = fs::relative(it->path(), root).string();
    const auto st = it->symlink_status();
    if (fs::is_symlink(st)) {
      lines.push_back(rel + " -> " + fs::read_symlink(it->path()).string());
    } else if (fs::is_directory(st)) {
      lines.push_back(rel + "/");
    } else {
      const std::string content = ReadWhole(it->path().string());
      lines.push_back(rel + " = " + (content.size() <= 100 ? content
                                     : std::to_string(content.size()) + " bytes, hash " +
                                           std::to_string(std::hash<std::string>()(content))));
    }
  }
  std::sort(lines.begin(), lines.end());
  std::string text;
  for (const std::string& l : lines) text += l + "\n";
  return text;
}

std::string Base64(const std::string& bytes) {
  std::string out(BASE64_ENCODE_RAW_LENGTH(bytes.size()), '\0');
  base64_encode_raw(reinterpret_cast<char*>(out.data()), bytes.size(),
                    reinterpret_cast<const uint8_t*>(bytes.data()));
  return out;
}

// sha512sum's digest of a file, in base64 as v03 carries it.
std::string Sha512Base64(const std::string& path) {
  std::string out;
  FILE* p = ::popen(("sha512sum '" + path + "'").c_str(), "r");
  if (p == nullptr) return "";
  char buf[256];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  if (out.size() < 128) return "";
  std::string bytes;
  for (size_t i = 0; i < 128; i += 2) {
    bytes.push_back(static_cast<char>(std::stoi(out.substr(i, 2), nullptr, 16)));
  }
  return Base64(bytes);
}

// One post as the test compares it: relPath, fileOp, then size and identity
// when the post has them ("" when not).
std::string Describe(const std::string& rel, const nlohmann::json& file_op, const std::string& size,
                     const std::string& identity) {
  return rel + " " + (file_op.is_null() ? "{}" : file_op.dump()) + " size=" + size +
         " identity=" + identity;
}

std::string DescribeBody(const std::string& body) {
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded()) return "unparseable: " + body;
  std::string identity;
  if (j.contains("identity")) {
    identity = j["identity"]["method"].get<std::string>() + ":" +
               j["identity"]["value"].get<std::string>();
  }
  return Describe(j.value("relPath", ""), j.contains("fileOp") ? j["fileOp"] : nlohmann::json(),
                  j.contains("size") ? std::to_string(j["size"].get<int64_t>()) : "", identity);
}

class ShimPrograms : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!BrokerEnvironment::skip_reason().empty() || !BrokerEnvironment::start_status().ok()) {
      return;
    }
    base_ = new TempDir;
    exchange_ = "xs_shim_" + std::to_string(::getpid());
    AmqpTestClient admin;
    if (!admin.Connect(BrokerEnvironment::broker()->url()).ok() ||
        !admin.DeclareExchange(exchange_).ok()) {
      return;
    }
    DaemonProcess::Options o;
    o.broker_url = BrokerEnvironment::broker()->url();
    o.exchange = exchange_;
    daemon_ = new DaemonProcess(o);
    if (!daemon_->Start()) {
      delete daemon_;
      daemon_ = nullptr;
    }
  }
  static void TearDownTestSuite() {
    if (daemon_ != nullptr) daemon_->Stop();
    delete daemon_;
    daemon_ = nullptr;
    delete base_;
    base_ = nullptr;
  }

  void SetUp() override {
    if (POSTSPOOL_SANITIZED && std::string(POSTSPOOL_SANITIZER_PRELOAD).empty()) {
      GTEST_SKIP() << "sanitizer build without shared sanitizer runtimes (clang): the "
                      "instrumented shim cannot be loaded into uninstrumented programs, whose "
                      "first library must then be the runtime";
    }
    POSTSPOOL_REQUIRE_BROKER();
    ASSERT_NE(daemon_, nullptr) << "postspoold did not start";
    static int n = 0;
    const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    tag_ = "t" + std::to_string(++n) + "_" + name;
    work_ = base_->path() + "/" + tag_;
    plain_ = plain_dir_.path() + "/" + tag_;
    ASSERT_TRUE(fs::create_directories(work_));
    ASSERT_TRUE(fs::create_directories(plain_));
    queue_ = "q_shim_" + tag_ + "_" + std::to_string(::getpid());
    ASSERT_TRUE(consumer_.Connect(BrokerEnvironment::broker()->url()).ok());
    ASSERT_TRUE(consumer_.DeclareBoundQueue(queue_, exchange_).ok());
  }
  void TearDown() override {
    if (!queue_.empty()) (void)consumer_.DeleteQueue(queue_);
  }

  // The environment of a program under the shim.
  std::vector<std::string> ShimEnv(const std::string& socket, const std::string& spool) const {
    std::string options = "post_baseDir " + base_->path();
    for (const std::string& o : extra_options_) options += ";" + o;
    std::vector<std::string> env = {Preload(), "POSTSPOOL_SHIM_OPTIONS=" + options,
                                    "POSTSPOOL_SOCKET=" + socket, "POSTSPOOL_SPOOL_DIR=" + spool};
    // These tests pin down what is posted, not how fast: on a loaded 2-core
    // machine (and more so in the sanitizer build) a post takes longer
    // than the default 5 ms budget at times, and a post over its budget is
    // not made (counted, and said on stderr, which RunBoth compares). A
    // budget no load reaches keeps timing out of the result.
    env.push_back("POSTSPOOL_BUDGET_MS=" + std::to_string(budget_ms_));
    if (POSTSPOOL_SANITIZED) {
      // The host programs' own leaks are not the shim's (and end them with
      // an error status).
      env.push_back("ASAN_OPTIONS=detect_leaks=0");
    }
    return env;
  }
  // LD_PRELOAD: the shim, after the sanitizer runtimes in a sanitizer build.
  static std::string Preload() {
    const std::string runtimes = POSTSPOOL_SANITIZER_PRELOAD;
    return "LD_PRELOAD=" + (runtimes.empty() ? "" : runtimes + " ") + POSTSPOOL_SHIM_PATH;
  }

  // Runs `setup` (without the shim) then `args` in both directories, the
  // watched one under the shim; expects the same result and files.
  ProgramRun RunBoth(const std::vector<std::string>& args, const std::string& setup = "") {
    if (!setup.empty()) {
      for (const std::string& dir : {work_, plain_}) {
        const ProgramRun s = RunProgram(Sh(setup), dir, {}, scratch_.path());
        EXPECT_EQ(s.exit_code, 0) << setup << ": " << s.err;
      }
    }
    const ProgramRun plain = RunProgram(args, plain_, {}, scratch_.path());
    const ProgramRun shim = RunProgram(args, work_, ShimEnv(daemon_->socket_path(), daemon_->spool_dir()),
                                scratch_.path());
    EXPECT_EQ(shim.exit_code, plain.exit_code) << shim.err;
    EXPECT_EQ(shim.out, plain.out);
    EXPECT_EQ(shim.err, plain.err);
    EXPECT_EQ(TreeText(work_), TreeText(plain_));
    return shim;
  }

  // The posts of this test (relPath under its directory) that arrive
  // until `count` came (at most `timeout`), and whatever else comes in the
  // next half second.
  std::vector<std::string> Posts(size_t count, std::chrono::seconds timeout = 60s) {
    std::vector<std::string> posts;
    const auto deadline = Clock::now() + timeout;
    auto drain = [&]() {
      std::vector<ReceivedMessage> got;
      EXPECT_TRUE(consumer_.GetAll(queue_, &got).ok());
      for (const ReceivedMessage& m : got) {
        const std::string d = DescribeBody(m.body);
        if (d.rfind(tag_ + "/", 0) == 0 || d.rfind(tag_ + " ", 0) == 0) posts.push_back(d);
      }
      return got.size();
    };
    while (posts.size() < count && Clock::now() < deadline) {
      if (drain() == 0) std::this_thread::sleep_for(50ms);
    }
    std::this_thread::sleep_for(500ms);
    drain();
    std::sort(posts.begin(), posts.end());
    return posts;
  }

  std::string Rel(const std::string& name) const { return tag_ + "/" + name; }

  // The post a written (or renamed, linked) regular file should have.
  std::string FilePost(const std::string& name, const nlohmann::json& op = nullptr) const {
    const std::string path = work_ + "/" + name;
    return Describe(Rel(name), op, std::to_string(fs::file_size(path)),
                    "sha512:" + Sha512Base64(path));
  }
  std::string OpPost(const std::string& name, const nlohmann::json& op) const {
    return Describe(Rel(name), op, "", "");
  }
  std::string DirPost(const std::string& name) const {
    return OpPost(name, {{"directory", ""}});
  }
  std::string RemovePost(const std::string& name, bool directory = false) const {
    return directory ? OpPost(name, {{"remove", ""}, {"directory", ""}})
                     : OpPost(name, {{"remove", ""}});
  }

  // Every directory and regular file under work_/sub, as mkdir and a write
  // post them.
  std::vector<std::string> TreePosts(const std::string& sub, bool include_root) const {
    std::vector<std::string> want;
    if (include_root) want.push_back(DirPost(sub));
    for (const auto& e : fs::recursive_directory_iterator(work_ + "/" + sub)) {
      const std::string name = sub + "/" + fs::relative(e.path(), work_ + "/" + sub).string();
      want.push_back(e.is_directory() ? DirPost(name) : FilePost(name));
    }
    return want;
  }

  void ExpectPosts(std::vector<std::string> want) {
    std::sort(want.begin(), want.end());
    const std::vector<std::string> got = Posts(want.size());
    if (want.size() <= 40) {
      EXPECT_EQ(got, want);
    } else {
      // Large trees: report only the differences.
      std::vector<std::string> missing, extra;
      std::set_difference(want.begin(), want.end(), got.begin(), got.end(),
                          std::back_inserter(missing));
      std::set_difference(got.begin(), got.end(), want.begin(), want.end(),
                          std::back_inserter(extra));
      EXPECT_EQ(got.size(), want.size());
      EXPECT_TRUE(missing.empty()) << missing.size() << " missing, e.g. " << missing.front();
      EXPECT_TRUE(extra.empty()) << extra.size() << " unexpected, e.g. " << extra.front();
    }
  }

  static TempDir* base_;  // post_baseDir: every test's watched directory is under it
  static std::string exchange_;
  static DaemonProcess* daemon_;
  TempDir plain_dir_;  // where programs run without the shim
  TempDir scratch_;    // stdout, stderr
  std::string tag_, work_, plain_, queue_;
  std::vector<std::string> extra_options_;
  int budget_ms_ = 2000;
  AmqpTestClient consumer_;
};

TempDir* ShimPrograms::base_ = nullptr;
std::string ShimPrograms::exchange_;
DaemonProcess* ShimPrograms::daemon_ = nullptr;

// A tree of `files` small files in `dirs` directories, made by a shell loop
// without the shim.
std::string MakeTreeScript(const std::string& root, int dirs, int files) {
  return "mkdir -p " + root + " && cd " + root + " && for d in $(seq 0 " +
         std::to_string(dirs - 1) + "); do mkdir d$d; done && for i in $(seq 0 " +
         std::to_string(files - 1) + "); do echo \"file $i\" > d$((i % " + std::to_string(dirs) +
         "))/f$i; done";
}

TEST_F(ShimPrograms, CpOfOneFile) {
  RunBoth({"/bin/cp", "src", "dst"}, "seq 1 30000 > src");
  ExpectPosts({FilePost("dst")});
}

TEST_F(ShimPrograms, CpWithReflinkAuto) {
  RunBoth({"/bin/cp", "--reflink=auto", "src", "dst"}, "seq 1 50000 > src");
  ExpectPosts({FilePost("dst")});
}

TEST_F(ShimPrograms, CpRecursiveOfATree) {
  RunBoth({"/bin/cp", "-r", "/proc/self/cwd/../" + tag_ + "_src", "tree"},
          MakeTreeScript("../" + tag_ + "_src", 3, 20));
  ExpectPosts(TreePosts("tree", true));
}

TEST_F(ShimPrograms, MvInTheSameDirectory) {
  RunBoth({"/bin/mv", "a", "b"}, "echo moved > a");
  // The old name as its absolute path, which sr3 maps onto its tree.
  ExpectPosts({FilePost("b", {{"rename", work_ + "/a"}})});
}

TEST_F(ShimPrograms, MvAcrossDirectories) {
  RunBoth({"/bin/mv", "x/a", "y/b"}, "mkdir x y && echo moved > x/a");
  ExpectPosts({FilePost("y/b", {{"rename", work_ + "/x/a"}})});
}

TEST_F(ShimPrograms, LnMakesAHardLink) {
  RunBoth({"/bin/ln", "a", "b"}, "echo linked > a");
  // Posted as the file it is: sr3 subscribers do not apply fileOp hlink.
  ExpectPosts({FilePost("b")});
}

TEST_F(ShimPrograms, LnSymbolic) {
  RunBoth({"/bin/ln", "-s", "a", "b"}, "echo target > a");
  ExpectPosts({OpPost("b", {{"link", "a"}})});
}

TEST_F(ShimPrograms, RmOfAFile) {
  RunBoth({"/bin/rm", "a"}, "echo gone > a");
  ExpectPosts({RemovePost("a")});
}

TEST_F(ShimPrograms, RmRecursiveOfATree) {
  RunBoth({"/bin/rm", "-rf", "tree"}, MakeTreeScript("tree", 2, 6));
  std::vector<std::string> want = {RemovePost("tree", true), RemovePost("tree/d0", true),
                                   RemovePost("tree/d1", true)};
  for (int i = 0; i < 6; ++i) want.push_back(RemovePost("tree/d" + std::to_string(i % 2) + "/f" + std::to_string(i)));
  ExpectPosts(want);
}

TEST_F(ShimPrograms, MkdirParentsAndRmdir) {
  RunBoth(Sh("/bin/mkdir -p a/b/c && /bin/rmdir a/b/c"));
  ExpectPosts({DirPost("a"), DirPost("a/b"), DirPost("a/b/c"), RemovePost("a/b/c", true)});
}

TEST_F(ShimPrograms, TouchAndTruncate) {
  RunBoth(Sh("/usr/bin/touch t && /usr/bin/truncate -s 12345 u"));
  ExpectPosts({FilePost("t"), FilePost("u")});
}

TEST_F(ShimPrograms, BashRedirections) {
  RunBoth({"/bin/bash", "-c", "echo x > f; echo y >> f; echo z > g"});
  // f is written twice (two redirections, two last closes); the second post
  // has the final content.
  const std::vector<std::string> got = Posts(3);
  ASSERT_EQ(got.size(), 3u) << ::testing::PrintToString(got);
  EXPECT_NE(std::find(got.begin(), got.end(), FilePost("f")), got.end());
  EXPECT_NE(std::find(got.begin(), got.end(), FilePost("g")), got.end());
  // The other post of f: size 2 ("x\n").
  EXPECT_EQ(std::count_if(got.begin(), got.end(),
                          [&](const std::string& p) { return p.rfind(Rel("f") + " {} size=2 ", 0) == 0; }),
            1);
}

TEST_F(ShimPrograms, BashCommandRedirectionWithoutRestore) {
  // bash -c with one builtin command: the redirection is never undone, the
  // file is still open at exit (the case the old shim missed).
  RunBoth({"/bin/bash", "-c", "echo x > f"});
  ExpectPosts({FilePost("f")});
}

TEST_F(ShimPrograms, TarExtractOfAThousandFiles) {
  const std::string src = "../" + tag_ + "_tarsrc";
  RunBoth({"/bin/tar", "xf", "../" + tag_ + ".tar"},
          MakeTreeScript(src, 10, 1000) + " && cd .. && tar cf " + tag_ + ".tar -C " + tag_ +
              "_tarsrc .");
  std::vector<std::string> want;
  for (const auto& e : fs::recursive_directory_iterator(work_)) {
    const std::string name = fs::relative(e.path(), work_).string();
    want.push_back(e.is_directory() ? DirPost(name) : FilePost(name));
  }
  ASSERT_EQ(want.size(), 1010u);
  ExpectPosts(want);
}

TEST_F(ShimPrograms, RsyncArchiveOfATree) {
  // rsync writes each file under a temporary dot name and renames it into
  // place: with Sarracenia's usual reject of dot files, one post per file.
  extra_options_ = {"reject .*/\\.[^/]*$"};
  RunBoth({"/usr/bin/rsync", "-a", "../" + tag_ + "_rsrc/", "copy/"},
          MakeTreeScript("../" + tag_ + "_rsrc", 3, 30));
  ExpectPosts(TreePosts("copy", true));
}

// dd's block size is a multiple of its buffer's alignment (4096): ASan, in the
// sanitizer build, refuses dd's aligned_alloc otherwise.
TEST_F(ShimPrograms, DdAndInstall) {
  RunBoth(Sh("/bin/dd if=/dev/zero of=zeros bs=4096 count=16 status=none && "
             "/usr/bin/install -m 0640 zeros installed"),
          "true");
  ExpectPosts({FilePost("zeros"), FilePost("installed")});
}

TEST_F(ShimPrograms, PythonWritesAndShutilCopy) {
  RunBoth({"/usr/bin/python3", "-c",
           "import shutil\n"
           "with open('a', 'w') as f: f.write('from python\\n' * 100)\n"
           "shutil.copy('a', 'b')\n"});
  ExpectPosts({FilePost("a"), FilePost("b")});
}

TEST_F(ShimPrograms, EightThreadsWriting) {
  RunBoth({POSTSPOOL_SHIM_WRITER, "threads", ".", "8", "25"});
  std::vector<std::string> want;
  for (int t = 0; t < 8; ++t) {
    for (int i = 0; i < 25; ++i) want.push_back(FilePost("t" + std::to_string(t) + "_" + std::to_string(i)));
  }
  ExpectPosts(want);
}

// Issue 20: threads that closed files while another thread was still
// initialising the shim posted nothing (8-39 of 640 lost). 20 processes, 5
// at a time, each 8 threads whose first calls into the shim are together.
TEST_F(ShimPrograms, ThreadsClosingTogetherAtStartUpPostEveryFile) {
  std::string dirs, script = "for b in 0 1 2 3; do for p in 0 1 2 3 4; do " +
                             std::string(POSTSPOOL_SHIM_WRITER) +
                             " threads p$b$p 8 4 & done; wait; done";
  std::vector<std::string> want;
  for (int b = 0; b < 4; ++b) {
    for (int p = 0; p < 5; ++p) {
      const std::string dir = "p" + std::to_string(b) + std::to_string(p);
      dirs += " " + dir;
      for (int t = 0; t < 8; ++t) {
        for (int i = 0; i < 4; ++i) want.push_back(dir + "/t" + std::to_string(t) + "_" + std::to_string(i));
      }
    }
  }
  RunBoth(Sh(script), "mkdir" + dirs);
  for (std::string& name : want) name = FilePost(name);
  ASSERT_EQ(want.size(), 640u);
  ExpectPosts(want);
}

// Issue 20: a file written through an O_CLOEXEC descriptor and never closed
// is closed by the kernel at exec, which the shim does not see as close().
// Every exec variant posts it before the exec (once: a fork child's exec of
// the parent's open file posts nothing); a file the new program inherits is
// posted by it.
TEST_F(ShimPrograms, FilesOpenAtExecArePostedOnce) {
  const std::vector<std::string> variants = {"execl",  "execle",  "execlp",   "execv",  "execve",
                                             "execvp", "execvpe", "execveat", "fexecve"};
  std::string dirs, script = "set -e";
  std::vector<std::string> want;
  for (const std::string& v : variants) {
    dirs += " " + v;
    script += "; " + std::string(POSTSPOOL_SHIM_WRITER) + " exec " + v + " " + v;
    want.push_back(v + "/cloexec");
    want.push_back(v + "/inherited");
  }
  RunBoth(Sh(script), "mkdir" + dirs);
  for (std::string& name : want) name = FilePost(name);
  ExpectPosts(want);
  EXPECT_EQ(ReadWhole(work_ + "/execve/cloexec"), "first\nsecond\n");
}

// Issue 19: a post the shim cannot make is counted and said: one line on
// stderr per process, or with shim_debug one per post and the count at
// exit. Here every transport fails (no daemon, no spool directory).
TEST_F(ShimPrograms, PostsNotMadeAreSaidOncePerProcess) {
  const std::string no_socket = scratch_.File("no-daemon.sock");
  const std::string no_spool = scratch_.File("no-spool-dir");
  const std::vector<std::string> env = ShimEnv(no_socket, no_spool);
  const ProgramRun quiet =
      RunProgram({POSTSPOOL_SHIM_WRITER, "threads", ".", "1", "3"}, work_, env, scratch_.path());
  EXPECT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_TRUE(fs::exists(work_ + "/t0_2"));
  const auto lines = [](const std::string& text, const std::string& part) {
    size_t n = 0;
    for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(lines(quiet.err, "\n"), 1u) << quiet.err;
  EXPECT_EQ(quiet.err.rfind("libpostspool-shim: post of ", 0), 0u) << quiet.err;
  EXPECT_NE(quiet.err.find(Rel("t0_0") + " not made: "), std::string::npos) << quiet.err;
  EXPECT_NE(quiet.err.find("shim_debug on shows each"), std::string::npos) << quiet.err;

  extra_options_ = {"shim_debug on"};
  const ProgramRun debug = RunProgram({POSTSPOOL_SHIM_WRITER, "threads", ".", "1", "3"}, work_,
                                      ShimEnv(no_socket, no_spool), scratch_.path());
  EXPECT_EQ(debug.exit_code, 0) << debug.err;
  EXPECT_EQ(lines(debug.err, "libpostspool-shim: post of "), 3u) << debug.err;
  EXPECT_NE(debug.err.find("(3 in this process)"), std::string::npos) << debug.err;
  EXPECT_NE(debug.err.find("libpostspool-shim: 3 post(s) not made in this process, 0 of them counted by the "
                           "daemon\n"),
            std::string::npos)
      << debug.err;
}

// Issue 19: the posts a shim could not make reach the daemon's count
// (shim_posts_dropped_total, through the uid's ring), not only the
// process's stderr. A daemon with no broker and a small disk quota takes
// posts until the quota is reached and refuses the rest (full): the
// program's own count of posts not made, which it says at exit under
// shim_debug, is what the daemon must show.
TEST_F(ShimPrograms, PostsNotMadeAreCountedByTheDaemon) {
  DaemonProcess::Options o;
  o.broker_url = "amqp://guest:guest@127.0.0.1:" + std::to_string(UnusedPort()) + "/";
  o.exchange = exchange_;
  o.extra_config = {"disk_bytes_max = 256 KiB", "disk_bytes_per_uid_max = 256 KiB"};
  DaemonProcess full(o);
  ASSERT_TRUE(full.Start());
  extra_options_ = {"shim_debug on"};
  constexpr int kFiles = 2000;
  const ProgramRun run =
      RunProgram({POSTSPOOL_SHIM_WRITER, "threads", ".", "1", std::to_string(kFiles)}, work_,
                 ShimEnv(full.socket_path(), full.spool_dir()), scratch_.path());
  ASSERT_EQ(run.exit_code, 0) << run.err.substr(0, 2000);
  // "libpostspool-shim: N post(s) not made in this process, M of them
  // counted by the daemon"
  // (No std::regex: GCC 12 warns falsely inside it under ASan.)
  const std::string kSuffix = " post(s) not made in this process, ";
  const size_t at = run.err.find(kSuffix);
  ASSERT_NE(at, std::string::npos) << run.err.substr(run.err.size() > 2000 ? run.err.size() - 2000 : 0);
  const size_t line = run.err.rfind('\n', at);
  unsigned long long not_made_count = 0, reported_count = 0;
  ASSERT_EQ(std::sscanf(run.err.c_str() + (line == std::string::npos ? 0 : line + 1),
                        "libpostspool-shim: %llu post(s) not made in this process, %llu of them "
                        "counted by the daemon",
                        &not_made_count, &reported_count),
            2)
      << run.err.substr(line == std::string::npos ? 0 : line + 1, 300);
  const uint64_t not_made = not_made_count;
  const uint64_t reported = reported_count;
  EXPECT_GT(not_made, 0u) << "the quota was never reached";
  EXPECT_LT(not_made, static_cast<uint64_t>(kFiles)) << "nothing was taken before the quota";
  EXPECT_EQ(reported, not_made) << "with the daemon up, every count reaches its ring";
  uint64_t counted = 0;
  for (int i = 0; i < 50; ++i) {
    counted = full.Metrics()["shim_posts_dropped_total"];
    if (counted >= not_made) break;
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_EQ(counted, not_made);
  EXPECT_NE(full.LogText().find("post(s) its processes could not make"), std::string::npos);
  std::printf("[ report ] %llu of %d posts not made (quota), %llu counted by the daemon\n",
              static_cast<unsigned long long>(not_made), kFiles,
              static_cast<unsigned long long>(counted));
  extra_options_.clear();
}

TEST_F(ShimPrograms, ForkedChildrenWriting) {
  RunBoth({POSTSPOOL_SHIM_WRITER, "fork", ".", "4", "5"});
  std::vector<std::string> want = {FilePost("parent_before"), FilePost("parent_after")};
  for (int c = 0; c < 4; ++c) {
    want.push_back(FilePost("c" + std::to_string(c) + "_open"));
    for (int i = 0; i < 5; ++i) want.push_back(FilePost("c" + std::to_string(c) + "_" + std::to_string(i)));
  }
  ExpectPosts(want);
}

TEST_F(ShimPrograms, RemoveOfAFileAndADirectory) {
  RunBoth({POSTSPOOL_SHIM_WRITER, "remove", "f", "d"}, "echo f > f && mkdir d");
  ExpectPosts({RemovePost("f"), RemovePost("d", true)});
}

TEST_F(ShimPrograms, VforkChildPostsNothingAndBreaksNothing) {
  RunBoth({POSTSPOOL_SHIM_WRITER, "vfork", "."});
  ExpectPosts({FilePost("before_vfork"), FilePost("after_vfork")});
}

TEST_F(ShimPrograms, ProgramThatClosesEveryDescriptor) {
  // The shim's connection is closed under it and its numbers reused by the
  // program's files: those files must hold only what the program wrote
  // (RunBoth compares them), and every file is still posted.
  RunBoth({POSTSPOOL_SHIM_WRITER, "closeall", "."});
  ExpectPosts({FilePost("first"), FilePost("second"), FilePost("third"), FilePost("fourth"),
               FilePost("fifth"), FilePost("sixth")});
}

TEST_F(ShimPrograms, FilesLeftOpenAtExitAndUnderscoreExit) {
  RunBoth(Sh("mkdir r e && cd r && " POSTSPOOL_SHIM_WRITER " openexit . return && cd ../e && "
             POSTSPOOL_SHIM_WRITER " openexit . _exit"));
  ExpectPosts({DirPost("r"), DirPost("e"), FilePost("r/left_open"), FilePost("e/left_open")});
}

TEST_F(ShimPrograms, StaticallyLinkedProgramIsNotAffected) {
  if (std::string(POSTSPOOL_SHIM_STATIC_WRITER).empty()) {
    GTEST_SKIP() << "no statically linked test program in sanitizer builds";
  }
  RunBoth({POSTSPOOL_SHIM_STATIC_WRITER, "threads", ".", "2", "3"});
  EXPECT_TRUE(fs::exists(work_ + "/t1_2"));
  // A dynamically linked marker after it: the only post.
  RunBoth({POSTSPOOL_SHIM_WRITER, "remove", "t0_0"});
  EXPECT_EQ(Posts(1), std::vector<std::string>{RemovePost("t0_0")});
}

TEST_F(ShimPrograms, FortranProgramWritingAFile) {
  if (std::string(POSTSPOOL_GFORTRAN).empty()) GTEST_SKIP() << "gfortran is not installed";
  const ProgramRun built = RunProgram({POSTSPOOL_GFORTRAN, "-o", scratch_.File("write_file"),
                                POSTSPOOL_SHIM_TEST_SOURCE_DIR "/write_file.f90"},
                               scratch_.path(), {}, scratch_.path());
  ASSERT_EQ(built.exit_code, 0) << built.err;
  RunBoth({scratch_.File("write_file")});
  ExpectPosts({FilePost("fortran.dat")});
}

TEST_F(ShimPrograms, MinIntervalSkipsRepeatedPostsOfOnePath) {
  extra_options_ = {"shim_post_minterval 60"};
  RunBoth({"/bin/bash", "-c", "for i in 1 2 3 4 5; do echo $i >> f; done; echo once > g"});
  const std::vector<std::string> got = Posts(2);
  ASSERT_EQ(got.size(), 2u) << ::testing::PrintToString(got);
  EXPECT_EQ(got[0].rfind(Rel("f") + " {} size=2 ", 0), 0u) << got[0];  // the first of five
  EXPECT_EQ(got[1], FilePost("g"));
}

TEST_F(ShimPrograms, UnconfiguredShimPostsNothing) {
  const ProgramRun r = RunProgram({"/bin/cp", "/etc/hostname", "copy"}, work_,
                                  {Preload(), "ASAN_OPTIONS=detect_leaks=0",
                                   "POSTSPOOL_SOCKET=" + daemon_->socket_path(),
                                   "POSTSPOOL_SPOOL_DIR=" + daemon_->spool_dir()},
                                  scratch_.path());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(work_ + "/copy"));
  // Then a configured run: its post comes after any the first run made
  // (one daemon, posts in order), so when it arrived alone, there was none.
  const ProgramRun marker = RunProgram({"/bin/cp", "/etc/hostname", "marker"}, work_,
                                       ShimEnv(daemon_->socket_path(), daemon_->spool_dir()),
                                       scratch_.path());
  EXPECT_EQ(marker.exit_code, 0) << marker.err;
  EXPECT_EQ(Posts(1), std::vector<std::string>{FilePost("marker")});
}

// A job of many programs, as a user runs one.
constexpr char kJob[] =
    "set -e; seq 1 5000 > a; cp a b; mv b c; ln -s c d; ln c e; rm d; "
    "mkdir -p x/y; echo hi > x/y/z; bash -c 'echo w > w'; dd if=a of=f bs=4096 status=none; "
    "python3 -c \"open('p','w').write('p')\"; " POSTSPOOL_SHIM_WRITER " threads . 8 5; "
    "rm -rf x; touch done";
// a twice (sh keeps its redirection of the last command open while seq
// writes: both processes close the file, both post it), b, c (rename), d
// (link), e (a hard link: a file), d removed, x and x/y, x/y/z, w, f, p, 40 files of the
// threads, x/y/z, x/y and x removed, done.
constexpr size_t kJobPosts = 57;

TEST_F(ShimPrograms, JobRunsPromptlyWithTheDaemonDown) {
  TempDir spool;
  const std::string no_socket = scratch_.File("no-daemon.sock");
  const ProgramRun plain = RunProgram(Sh(kJob), plain_, {}, scratch_.path());
  const ProgramRun shim = RunProgram(Sh(kJob), work_, ShimEnv(no_socket, spool.path()), scratch_.path());
  EXPECT_EQ(shim.exit_code, 0) << shim.err;
  EXPECT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(shim.err, plain.err);
  EXPECT_EQ(TreeText(work_), TreeText(plain_));
  // How long the job takes is a benchmark's figure (bench/shim/run.sh), not
  // a test's: a threshold on a timing flakes under load. Only a hang fails.
  EXPECT_LT(shim.seconds, plain.seconds + 120) << "plain " << plain.seconds;
  // The posts are in the spool: the daemon adopts them and they arrive.
  EXPECT_FALSE(spool.List().empty());
  std::printf("[ report ] job: %.3f s without the shim, %.3f s with the daemon down\n",
              plain.seconds, shim.seconds);
  for (const std::string& name : spool.List()) {
    std::error_code ec;
    fs::copy_file(spool.File(name), daemon_->spool_dir() + "/" + name, ec);
    EXPECT_FALSE(ec) << ec.message();
  }
  const std::vector<std::string> got = Posts(kJobPosts);
  EXPECT_EQ(got.size(), kJobPosts) << ::testing::PrintToString(got);
  EXPECT_NE(std::find(got.begin(), got.end(), FilePost("c", {{"rename", work_ + "/b"}})), got.end())
      << ::testing::PrintToString(got);
  EXPECT_NE(std::find(got.begin(), got.end(), FilePost("done")), got.end());
}

TEST_F(ShimPrograms, JobRunsPromptlyWithTheBrokerDown) {
  DaemonProcess::Options o;
  o.broker_url = "amqp://guest:guest@127.0.0.1:" + std::to_string(UnusedPort()) + "/";
  o.exchange = exchange_;
  DaemonProcess brokerless(o);
  ASSERT_TRUE(brokerless.Start());
  const ProgramRun plain = RunProgram(Sh(kJob), plain_, {}, scratch_.path());
  const ProgramRun shim = RunProgram(Sh(kJob), work_,
                              ShimEnv(brokerless.socket_path(), brokerless.spool_dir()),
                              scratch_.path());
  EXPECT_EQ(shim.exit_code, 0) << shim.err;
  EXPECT_EQ(TreeText(work_), TreeText(plain_));
  EXPECT_LT(shim.seconds, plain.seconds + 120) << "plain " << plain.seconds;  // a hang only
  std::printf("[ report ] job: %.3f s without the shim, %.3f s with the broker down\n",
              plain.seconds, shim.seconds);
  // The daemon took them (journaled, waiting for the broker).
  uint64_t accepted = 0;
  for (int i = 0; i < 50 && accepted == 0; ++i) {
    for (const auto& [name, value] : brokerless.Metrics()) {
      if (name == "socket_posts_journaled_total") {
        accepted += value;
      }
    }
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_GT(accepted, 0u) << brokerless.LogText();
  (void)brokerless.Stop();
}

}  // namespace
}  // namespace postspool::testing
