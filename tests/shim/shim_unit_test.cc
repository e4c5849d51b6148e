// libpostspool-shim's parts on their own: the configuration (Sarracenia's
// option names), path matching, the identity digests, and what the .so
// exports.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <string>

#include "file_identity.h"
#include "shim_config.h"
#include "test_util.h"

namespace postspool::shim {
namespace {

using postspool::testing::TempDir;

std::string Hex(const uint8_t* p, size_t n) {
  std::string s;
  char b[3];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(b, sizeof b, "%02x", p[i]);
    s += b;
  }
  return s;
}

std::string RunAndRead(const std::string& command) {
  std::string out;
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

TEST(ShimConfigTest, NoOptionsMeansNotConfigured) {
  Config c;
  std::string error;
  ASSERT_TRUE(ParseOptions("# only a comment\n\n", false, &c, &error)) << error;
  EXPECT_FALSE(c.configured);
}

TEST(ShimConfigTest, ReadsSarraceniasOptionNames) {
  Config c;
  std::string error;
  ASSERT_TRUE(ParseOptions("post_baseUrl sftp://host/\n"
                           "post_baseDir /data//incoming/\n"
                           "reject .*\\.tmp$\n"
                           "accept .*\n"
                           "realpathPost on\n"
                           "shim_post_minterval 1.5\n"
                           "identity md5\n",
                           false, &c, &error))
      << error;
  EXPECT_TRUE(c.configured);
  EXPECT_EQ(c.post_baseUrl, "sftp://host/");
  EXPECT_EQ(c.post_baseDir, "/data/incoming");
  ASSERT_EQ(c.patterns.size(), 2u);
  EXPECT_FALSE(c.patterns[0].accept);
  EXPECT_TRUE(c.realpathPost);
  EXPECT_EQ(c.shim_post_minterval_ns, 1500000000);
  EXPECT_EQ(c.identity, Identity::kMd5);
}

TEST(ShimConfigTest, EnvironmentFormSeparatesOptionsWithSemicolons) {
  Config c;
  std::string error;
  ASSERT_TRUE(ParseOptions("post_baseDir /d; identity cod,sha512;shim_post_minterval 2m", true,
                           &c, &error))
      << error;
  EXPECT_EQ(c.post_baseDir, "/d");
  EXPECT_EQ(c.identity, Identity::kCod);
  EXPECT_EQ(c.shim_post_minterval_ns, 120000000000);
}

TEST(ShimConfigTest, RefusesWhatItDoesNotKnow) {
  for (const char* bad : {"no_such_option 1", "post_baseDir relative/dir", "accept (", "identity sha1",
                          "realpathPost maybe", "shim_post_minterval -1", "post_baseUrl"}) {
    Config c;
    std::string error;
    EXPECT_FALSE(ParseOptions(bad, false, &c, &error)) << bad;
    EXPECT_FALSE(error.empty()) << bad;
  }
}

TEST(ShimConfigTest, FirstMatchingPatternDecidesAndBaseDirBounds) {
  Config c;
  std::string error;
  ASSERT_TRUE(ParseOptions("post_baseDir /data\nreject .*/\\.[^/]*$\naccept .*\\.nc$\n"
                           "acceptUnmatched off",
                           false, &c, &error))
      << error;
  EXPECT_TRUE(Accepts(c, "/data/a/x.nc"));
  EXPECT_FALSE(Accepts(c, "/data/a/.x.nc"));   // rejected first
  EXPECT_FALSE(Accepts(c, "/data/a/x.txt"));   // unmatched
  EXPECT_FALSE(Accepts(c, "/elsewhere/x.nc"));  // outside post_baseDir
  EXPECT_FALSE(Accepts(c, "/data"));            // the base itself names no file
  EXPECT_FALSE(Accepts(c, "/database/x.nc"));
  EXPECT_STREQ(RelPathOf(c, "/data/a/x.nc"), "/a/x.nc");
}

TEST(ShimConfigTest, NormalisesPathsLexically) {
  char out[64];
  ASSERT_TRUE(NormalisePath("//a/./b/../c//d/", out, sizeof out));
  EXPECT_STREQ(out, "/a/c/d");
  ASSERT_TRUE(NormalisePath("/../..", out, sizeof out));
  EXPECT_STREQ(out, "/");
  EXPECT_FALSE(NormalisePath("relative", out, sizeof out));
  EXPECT_FALSE(NormalisePath(("/" + std::string(100, 'x')).c_str(), out, sizeof out));
}

// Compared with coreutils' sha512sum and md5sum, another implementation, on
// a file larger than the stack buffer and not a multiple of any block.
TEST(ShimIdentityTest, DigestsMatchCoreutils) {
  TempDir dir;
  const std::string path = dir.File("data");
  {
    std::ofstream out(path, std::ios::binary);
    for (int i = 0; i < 300001; ++i) out.put(static_cast<char>(i * 7 + i / 251));
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  uint8_t sha[kSha512Bytes];
  uint8_t md5[kMd5Bytes];
  ASSERT_TRUE(Sha512OfFd(fd, sha));
  ASSERT_TRUE(Md5OfFd(fd, md5));
  ::close(fd);
  EXPECT_EQ(Hex(sha, sizeof sha), RunAndRead("sha512sum " + path).substr(0, 128));
  EXPECT_EQ(Hex(md5, sizeof md5), RunAndRead("md5sum " + path).substr(0, 32));
}

TEST(ShimAbiTest, ExportsOnlyTheInterposedFunctions) {
  const std::string out =
      RunAndRead(std::string(POSTSPOOL_NM) + " -D --defined-only " + POSTSPOOL_SHIM_PATH);
  std::set<std::string> names;
  size_t start = 0;
  while (start < out.size()) {
    size_t end = out.find('\n', start);
    if (end == std::string::npos) end = out.size();
    const std::string line = out.substr(start, end - start);
    start = end + 1;
    if (!line.empty()) names.insert(line.substr(line.rfind(' ') + 1));
  }
  const std::set<std::string> interposed = {
      "__libc_start_main", "_Exit",     "_exit",     "close",     "close_range", "closefrom",
      "dup",               "dup2",      "dup3",      "fclose",    "link",        "linkat",
      "mkdir",             "mkdirat",   "open",      "open64",    "openat",      "openat64",
      "remove",            "rename",    "renameat",  "renameat2", "rmdir",       "socket",
      "symlink",           "symlinkat", "truncate",  "truncate64", "unlink",     "unlinkat",
      "execl",             "execle",    "execlp",    "execv",     "execve",      "execveat",
      "execvp",            "execvpe",   "fexecve",
  };
  EXPECT_EQ(names, interposed) << out;
}

TEST(ShimAbiTest, NeedsNeitherNettleNorTheHostsCxxRuntime) {
  const std::string out = RunAndRead(std::string(POSTSPOOL_READELF) + " -d " + POSTSPOOL_SHIM_PATH);
  ASSERT_NE(out.find("libpostspool.so.0"), std::string::npos) << out;
  EXPECT_EQ(out.find("libnettle"), std::string::npos) << out;
#if !POSTSPOOL_SANITIZED
  EXPECT_EQ(out.find("libstdc++"), std::string::npos) << out;
  EXPECT_EQ(out.find("libgcc_s"), std::string::npos) << out;
#endif
}

}  // namespace
}  // namespace postspool::shim
