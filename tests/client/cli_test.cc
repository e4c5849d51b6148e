// The postspool command-line tool, run as a program.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "base64.h"
#include "client_test_util.h"
#include "fake_daemon.h"
#include "sha512.h"

namespace postspool::testing {
namespace {

struct ToolRun {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class CliTest : public ::testing::Test {
 protected:
  std::string SocketPath() const { return dir_.File("d.sock"); }
  std::string SpoolDir() const { return spool_.path(); }

  // Runs the tool with `args` and `input` on stdin; the output through files.
  // In directory `cwd` when given.
  ToolRun Postspool(std::vector<std::string> args, const std::string& input = "",
                    const std::string& cwd = "") {
    const std::string in_path = dir_.File("stdin"), out_path = dir_.File("stdout"),
                      err_path = dir_.File("stderr");
    std::ofstream(in_path, std::ios::binary) << input;
    args.insert(args.begin(), POSTSPOOL_CLI_PATH);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int in = ::open(in_path.c_str(), O_RDONLY);
      const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (in < 0 || out < 0 || err < 0) ::_exit(126);
      if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) ::_exit(125);
      ::dup2(in, 0);
      ::dup2(out, 1);
      ::dup2(err, 2);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    ToolRun r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = Slurp(out_path);
    r.err = Slurp(err_path);
    for (const std::string& p : {in_path, out_path, err_path}) ::unlink(p.c_str());
    return r;
  }

  std::vector<std::string> Transport() const {
    return {"--socket", SocketPath(), "--spool-dir", SpoolDir(), "--budget-ms", "2000"};
  }

  static std::vector<std::string> Lines(const std::string& text) {
    std::vector<std::string> lines;
    std::stringstream s(text);
    for (std::string line; std::getline(s, line);) lines.push_back(line);
    return lines;
  }

  // "<uuid> <transport>" lines as ids.
  static PostId IdOfLine(const std::string& line) {
    std::string hex;
    for (char c : line.substr(0, 36)) {
      if (c != '-') hex += c;
    }
    PostId id;
    id.hi = std::stoull(hex.substr(0, 16), nullptr, 16);
    id.lo = std::stoull(hex.substr(16, 16), nullptr, 16);
    return id;
  }

  TempDir dir_;
  TempDir spool_;
};

TEST_F(CliTest, PostWithNoDaemonWritesEveryFieldToTheSpool) {
  std::vector<std::string> args = {"post", "--rel-path", "a/b.txt", "--base-url", "file:/",
                                   "--retrieve-path", "r/b.txt", "--rename", "a/old.txt",
                                   "--size", "12", "--mode", "0644", "--mtime-ns", "1700000000000000001",
                                   "--atime-ns", "-3", "--identity", "cod:sha512",
                                   "--extra", "k1=v1", "--extra=k2=v=2"};
  for (const std::string& a : Transport()) args.push_back(a);
  const ToolRun r = Postspool(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].size(), 36u + 6u);
  EXPECT_EQ(lines[0].substr(36), " spool");

  const auto spooled = ReadSpool(SpoolDir());
  ASSERT_EQ(spooled.size(), 1u);
  PostData want;
  want.id = IdOfLine(lines[0]);
  want.pub_time_ns = spooled[0].pub_time_ns;
  want.base_url = "file:/";
  want.rel_path = "a/b.txt";
  want.retrieve_path = "r/b.txt";
  want.rename = "a/old.txt";
  want.size = 12;
  want.mode = 0644;
  want.mtime_ns = 1700000000000000001;
  want.atime_ns = -3;
  want.identity_method = fb::IdentityMethod::Cod;
  want.identity_value = "sha512";
  want.extras = {{"k1", "v1"}, {"k2", "v=2"}};
  EXPECT_EQ(spooled[0], want);
}

TEST_F(CliTest, PostReachesTheDaemon) {
  FakeDaemon daemon(SocketPath());
  ASSERT_TRUE(daemon.ok());
  std::vector<std::string> args = {"post", "--rel-path", "x", "--remove", "--directory"};
  for (const std::string& a : Transport()) args.push_back(a);
  const ToolRun r = Postspool(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.substr(36), " socket\n");
  const auto received = daemon.received();
  ASSERT_EQ(received.size(), 1u);
  EXPECT_EQ(received[0].post.id, IdOfLine(r.out));
  EXPECT_TRUE(received[0].post.remove);
  EXPECT_TRUE(received[0].post.directory);
  EXPECT_NE(received[0].peer_pid, ::getpid());
}

TEST_F(CliTest, FileFillsMetadataAndSha512) {
  const std::string file = dir_.File("data.txt");
  std::ofstream(file) << "abc";
  ASSERT_EQ(::chmod(file.c_str(), 0640), 0);
  struct stat st;
  ASSERT_EQ(::lstat(file.c_str(), &st), 0);
  std::vector<std::string> args = {"post", "--file", file};
  for (const std::string& a : Transport()) args.push_back(a);
  const ToolRun r = Postspool(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto spooled = ReadSpool(SpoolDir());
  ASSERT_EQ(spooled.size(), 1u);
  const PostData& p = spooled[0];
  EXPECT_EQ(p.rel_path, file.substr(1));  // the absolute path without its '/'
  EXPECT_EQ(p.size, 3);
  EXPECT_EQ(p.mode, 0640u);
  EXPECT_EQ(p.mtime_ns, int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec);
  EXPECT_EQ(p.identity_method, fb::IdentityMethod::Sha512);
  // FIPS 180-2 example: SHA-512("abc").
  EXPECT_EQ(cli::Base64Encode(p.identity_value),
            "3a81oZNherrMQXNJriBBMRLm+k6JqX6iCp7u5ktV05ohkpkqJ0/BqDa6PCOj/uu9RU1EI2Q86A4qmslPpUyknw==");
}

TEST_F(CliTest, FileGivenWithDotDotComponentsPostsTheNormalisedAbsolutePath) {
  const std::string sub = dir_.File("sub");
  ASSERT_EQ(::mkdir(sub.c_str(), 0700), 0);
  std::ofstream(dir_.File("data.txt")) << "abc";
  // Relative to a working directory, and absolute with "." and "//".
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"../data.txt", sub}, {".//sub/./../data.txt", dir_.path()}, {sub + "/../data.txt", ""}};
  for (const auto& [path, cwd] : cases) {
    std::vector<std::string> args = {"post", "--file", path};
    for (const std::string& a : Transport()) args.push_back(a);
    const ToolRun r = Postspool(args, "", cwd);
    ASSERT_EQ(r.exit_code, 0) << path << ": " << r.err;
  }
  const auto spooled = ReadSpool(SpoolDir());
  ASSERT_EQ(spooled.size(), cases.size());
  for (const PostData& p : spooled) EXPECT_EQ(p.rel_path, dir_.File("data.txt").substr(1));
  ::rmdir(sub.c_str());
}

TEST_F(CliTest, RelPathThatIsNotNormalisedIsRefusedWithTheFieldNamed) {
  for (const char* bad : {"a//b", "../etc/passwd", "a/./b", "a/"}) {
    std::vector<std::string> args = {"post", "--rel-path", bad};
    for (const std::string& a : Transport()) args.push_back(a);
    const ToolRun r = Postspool(args);
    EXPECT_EQ(r.exit_code, 2) << bad;  // bad input
    EXPECT_NE(r.err.find("relPath"), std::string::npos) << r.err;
  }
  EXPECT_TRUE(ReadSpool(SpoolDir()).empty());
}

TEST_F(CliTest, JsonWithAReservedOrRepeatedNameOrANegativeSizeIsRefused) {
  const std::string input =
      "{\"relPath\": \"j/1\", \"integrity\": \"x\"}\n"
      "{\"relPath\": \"j/2\", \"from_cluster\": \"x\"}\n"
      "{\"relPath\": \"j/3\", \"size\": -1}\n"
      "{\"relPath\": \"j/../4\"}\n"
      "{\"relPath\": \"j/5\", \"fileOp\": {\"rename\": \"j//old\"}}\n"
      "{\"relPath\": \"j/6\", \"flavour\": \"ok\"}\n";
  std::vector<std::string> args = {"post", "--json"};
  for (const std::string& a : Transport()) args.push_back(a);
  const ToolRun r = Postspool(args, input);
  EXPECT_EQ(r.exit_code, 2);  // bad input
  EXPECT_EQ(Lines(r.out).size(), 1u) << r.out;
  for (const char* named : {"integrity", "from_cluster", "size", "relPath", "rename"}) {
    EXPECT_NE(r.err.find(named), std::string::npos) << named << " in " << r.err;
  }
  const auto spooled = ReadSpool(SpoolDir());
  ASSERT_EQ(spooled.size(), 1u);
  EXPECT_EQ(spooled[0].rel_path, "j/6");
}

TEST_F(CliTest, FileThatIsASymlinkPostsItsTargetWithoutChecksum) {
  const std::string link = dir_.File("link");
  ASSERT_EQ(::symlink("some/target", link.c_str()), 0);
  std::vector<std::string> args = {"post", "--file", link, "--rel-path", "l"};
  for (const std::string& a : Transport()) args.push_back(a);
  const ToolRun r = Postspool(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto spooled = ReadSpool(SpoolDir());
  ASSERT_EQ(spooled.size(), 1u);
  EXPECT_EQ(spooled[0].rel_path, "l");
  EXPECT_EQ(spooled[0].link, "some/target");
  EXPECT_EQ(spooled[0].identity_method, fb::IdentityMethod::None);
  EXPECT_FALSE(spooled[0].size.has_value());
}

TEST_F(CliTest, JsonPostsEveryLine) {
  const std::string sha = cli::Base64Encode(cli::Sha512Of("abc"));
  const std::string input =
      "{\"relPath\": \"j/1\", \"baseUrl\": \"sftp://h/\", \"size\": 5, \"mode\": \"600\", "
      "\"mtime\": \"20240102T030405.5\", \"atime\": 7, \"pubTime\": \"20000101T000000\"}\n"
      "\n"
      "{\"relPath\": \"j/2\", \"fileOp\": {\"rename\": \"j/old\", \"link\": \"t\"}, "
      "\"identity\": {\"method\": \"sha512\", \"value\": \"" + sha + "\"}, "
      "\"flavour\": \"caf\\u00e9 \\ud83d\\ude00\"}\n"
      "{\"relPath\": \"j/3\", \"fileOp\": {\"remove\": \"\", \"directory\": true}}\n";
  std::vector<std::string> args = {"post", "--json"};
  for (const std::string& a : Transport()) args.push_back(a);
  const ToolRun r = Postspool(args, input);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 3u);
  const auto spooled = ReadSpool(SpoolDir());
  ASSERT_EQ(spooled.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(spooled[i].id, IdOfLine(lines[i]));

  EXPECT_EQ(spooled[0].rel_path, "j/1");
  EXPECT_EQ(spooled[0].base_url, "sftp://h/");
  EXPECT_EQ(spooled[0].size, 5);
  EXPECT_EQ(spooled[0].mode, 0600u);
  EXPECT_EQ(spooled[0].mtime_ns, 1704164645500000000);  // 2024-01-02T03:04:05.5Z
  EXPECT_EQ(spooled[0].atime_ns, 7);
  EXPECT_GT(spooled[0].pub_time_ns, 1704164645500000000);  // stamped now, not from the input
  EXPECT_TRUE(spooled[0].extras.empty());

  EXPECT_EQ(spooled[1].rename, "j/old");
  EXPECT_EQ(spooled[1].link, "t");
  EXPECT_EQ(spooled[1].identity_method, fb::IdentityMethod::Sha512);
  EXPECT_EQ(spooled[1].identity_value, cli::Sha512Of("abc"));
  ASSERT_EQ(spooled[1].extras.size(), 1u);
  EXPECT_EQ(spooled[1].extras[0].first, "flavour");
  EXPECT_EQ(spooled[1].extras[0].second, "caf\xc3\xa9 \xf0\x9f\x98\x80");

  EXPECT_TRUE(spooled[2].remove);
  EXPECT_TRUE(spooled[2].directory);
}

TEST_F(CliTest, MalformedJsonLineIsReportedWithItsLineNumberAndTheRestPosted) {
  const std::string input =
      "{\"relPath\": \"ok/1\"}\n"
      "{\"relPath\": \"bad\" \"size\": 1}\n"
      "{\"relPath\": \"ok/3\"}\n"
      "{\"size\": 3}\n";
  std::vector<std::string> args = {"post", "--json"};
  for (const std::string& a : Transport()) args.push_back(a);
  const ToolRun r = Postspool(args, input);
  EXPECT_EQ(r.exit_code, 2);  // bad input
  EXPECT_NE(r.err.find("stdin line 2, column 24: syntax error"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("stdin line 4: relPath is missing"), std::string::npos) << r.err;
  EXPECT_EQ(Lines(r.out).size(), 2u);
  const auto spooled = ReadSpool(SpoolDir());
  ASSERT_EQ(spooled.size(), 2u);
  EXPECT_EQ(spooled[0].rel_path, "ok/1");
  EXPECT_EQ(spooled[1].rel_path, "ok/3");
}

TEST_F(CliTest, OverlongJsonLineIsRefusedAndTheNextPosted) {
  const std::string input = "{\"relPath\": \"" + std::string(2 << 20, 'x') + "\"}\n" +
                            "{\"relPath\": \"ok\"}\n";
  std::vector<std::string> args = {"post", "--json"};
  for (const std::string& a : Transport()) args.push_back(a);
  const ToolRun r = Postspool(args, input);
  EXPECT_EQ(r.exit_code, 2);  // bad input
  EXPECT_NE(r.err.find("stdin line 1: longer than"), std::string::npos) << r.err;
  const auto spooled = ReadSpool(SpoolDir());
  ASSERT_EQ(spooled.size(), 1u);
  EXPECT_EQ(spooled[0].rel_path, "ok");
}

TEST_F(CliTest, FailedPostExitsOneWithTheReason) {
  const ToolRun r = Postspool({"post", "--rel-path", "x", "--socket", SocketPath(), "--spool-dir",
                           dir_.File("missing")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(r.out.empty());
  EXPECT_NE(r.err.find("daemon unreachable and no spool directory"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("spool: open " + dir_.File("missing")), std::string::npos) << r.err;
}

TEST_F(CliTest, RefusedPostExitsTwoAsBadInput) {
  std::vector<std::string> args = {"post", "--rel-path", "x", "--extra", "relPath=y"};
  for (const std::string& a : Transport()) args.push_back(a);
  const ToolRun r = Postspool(args);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("x: refused: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("relPath"), std::string::npos) << r.err;
  EXPECT_TRUE(ReadSpool(SpoolDir()).empty());
}

TEST_F(CliTest, UsageErrorsExitTwo) {
  const std::vector<std::vector<std::string>> cases = {
      {},
      {"frobnicate"},
      {"post"},
      {"post", "--bogus"},
      {"post", "--rel-path"},
      {"post", "--rel-path", "a", "--rel-path", "b"},
      {"post", "--rel-path", "a", "--size", "-1"},
      {"post", "--rel-path", "a", "--mode", "999"},
      {"post", "--rel-path", "a", "--identity", "crc:1"},
      {"post", "--rel-path", "a", "--identity", "sha512:not base64"},
      {"post", "--rel-path", "a", "--extra", "novalue"},
      {"post", "--rel-path", "a", "--budget-ms", "0"},
      {"post", "--json", "--rel-path", "a"},
      {"post", "--remove=yes", "--rel-path", "a"},
      {"post", "--rel-path", "a", "--identity", "md5:AAAA"},
      {"post", "--rel-path", "a", "stray"},
      {"post", "--json", "{\"relPath\": \"a\"}"},
      {"post", "--rel-path", "a", "--base-dir", "/"},
      {"inspect"},
      {"inspect", "--bogus", "f"},
      {"verify"},
      {"verify", "--force", "."},
  };
  for (const auto& args : cases) {
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    SCOPED_TRACE(joined);
    const ToolRun r = Postspool(args);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("usage:"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty());
  }
}

TEST_F(CliTest, HelpPrintsUsage) {
  for (const auto& args : std::vector<std::vector<std::string>>{{"--help"}, {"post", "--help"}}) {
    const ToolRun r = Postspool(args);
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_NE(r.out.find("--rel-path"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("--json"), std::string::npos) << r.out;
  }
}

}  // namespace
}  // namespace postspool::testing
