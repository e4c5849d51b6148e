// The C ABI's contract on its own: the export list, option and post
// validation, error strings, the environment.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <set>

#include "client_test_util.h"
#include "fake_daemon.h"

namespace postspool::testing {
namespace {

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

TEST(ClientAbiTest, LibraryExportsOnlyPostspoolSymbols) {
  const std::string out =
      RunAndRead(std::string(POSTSPOOL_NM) + " -D --defined-only " + POSTSPOOL_LIB_PATH);
  std::set<std::string> names;
  size_t start = 0;
  while (start < out.size()) {
    size_t end = out.find('\n', start);
    if (end == std::string::npos) end = out.size();
    const std::string line = out.substr(start, end - start);
    start = end + 1;
    if (line.empty()) continue;
    const std::string name = line.substr(line.rfind(' ') + 1);
    names.insert(name);
    EXPECT_EQ(name.rfind("postspool_", 0), 0u) << "exported: " << line;
  }
  const std::set<std::string> api = {
      "postspool_options_init", "postspool_open",     "postspool_close",
      "postspool_post_init",    "postspool_post",     "postspool_strerror",
      "postspool_last_error",   "postspool_report_dropped",
  };
  EXPECT_EQ(names, api) << out;
}

TEST(ClientAbiTest, LibraryDoesNotNeedTheHostsCxxRuntime) {
#if POSTSPOOL_SANITIZED
  GTEST_SKIP() << "sanitizer builds link libstdc++ dynamically";
#else
  const std::string out = RunAndRead(std::string(POSTSPOOL_READELF) + " -d " + POSTSPOOL_LIB_PATH);
  ASSERT_NE(out.find("NEEDED"), std::string::npos) << out;
  EXPECT_EQ(out.find("libstdc++"), std::string::npos) << out;
  EXPECT_EQ(out.find("libgcc_s"), std::string::npos) << out;
  EXPECT_EQ(out.find("libxxhash"), std::string::npos) << out;
  EXPECT_EQ(out.find("libflatbuffers"), std::string::npos) << out;
#endif
}

TEST(ClientAbiTest, OpenIsCheapAndTouchesNothing) {
  TempDir dir;
  const std::string socket = dir.File("no/such.sock");
  const std::string spool = dir.File("no/spool");
  ScopedClient client(socket, spool);
  EXPECT_EQ(client.open_rc(), POSTSPOOL_OK);
  EXPECT_TRUE(dir.List().empty());
}

TEST(ClientAbiTest, OpenWithNullOptionsUsesTheDefaults) {
  postspool_client* client = nullptr;
  EXPECT_EQ(postspool_open(nullptr, &client), POSTSPOOL_OK);
  EXPECT_NE(client, nullptr);
  postspool_close(client);
  postspool_close(nullptr);  // harmless
}

// postspool_report_dropped (since 0.3): without a daemon there is no ring,
// and the count stays with the caller; it says so and returns at once.
TEST(ClientAbiTest, ReportDroppedWithoutADaemonSaysTheCountStaysLocal) {
  EXPECT_EQ(postspool_report_dropped(nullptr, 1), POSTSPOOL_EINVAL);
  postspool_options o;
  postspool_options_init(&o);
  o.socket_path = "/nonexistent/postspoold.sock";
  o.spool_dir = "/nonexistent/spool";
  postspool_client* client = nullptr;
  ASSERT_EQ(postspool_open(&o, &client), POSTSPOOL_OK);
  EXPECT_EQ(postspool_report_dropped(client, 0), POSTSPOOL_OK);  // nothing to report
  EXPECT_EQ(postspool_report_dropped(client, 3), POSTSPOOL_ENODAEMON);
  EXPECT_NE(std::string(postspool_last_error()), "");
  o.use_ring = 0;
  postspool_client* no_ring = nullptr;
  ASSERT_EQ(postspool_open(&o, &no_ring), POSTSPOOL_OK);
  EXPECT_EQ(postspool_report_dropped(no_ring, 1), POSTSPOOL_ENODAEMON);
  EXPECT_NE(std::string(postspool_last_error()).find("use_ring"), std::string::npos);
  postspool_close(no_ring);
  postspool_close(client);
}

TEST(ClientAbiTest, OpenRefusesBadOptions) {
  postspool_client* client = nullptr;
  EXPECT_EQ(postspool_open(nullptr, nullptr), POSTSPOOL_EINVAL);

  postspool_options o;
  postspool_options_init(&o);
  o.budget_ms = 0;
  EXPECT_EQ(postspool_open(&o, &client), POSTSPOOL_EINVAL);
  EXPECT_NE(std::string(postspool_last_error()).find("budget_ms"), std::string::npos);
  EXPECT_EQ(client, nullptr);

  postspool_options_init(&o);
  o.socket_share_pct = 101;
  EXPECT_EQ(postspool_open(&o, &client), POSTSPOOL_EINVAL);
  EXPECT_NE(std::string(postspool_last_error()).find("socket_share_pct"), std::string::npos);

  postspool_options_init(&o);
  const std::string long_path(200, 's');
  o.socket_path = long_path.c_str();
  EXPECT_EQ(postspool_open(&o, &client), POSTSPOOL_EINVAL);
  EXPECT_NE(std::string(postspool_last_error()).find("socket_path"), std::string::npos);

  postspool_options_init(&o);
  o.spool_dir = "";
  EXPECT_EQ(postspool_open(&o, &client), POSTSPOOL_EINVAL);

  postspool_options_init(&o);
  o.struct_size = 8;  // not initialised with postspool_options_init
  EXPECT_EQ(postspool_open(&o, &client), POSTSPOOL_EINVAL);
  EXPECT_NE(std::string(postspool_last_error()).find("struct_size"), std::string::npos);
}

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(ClientAbiTest, OptionsInitReadsTheEnvironment) {
  {
    ScopedEnv socket("POSTSPOOL_SOCKET", "/tmp/x.sock");
    ScopedEnv spool("POSTSPOOL_SPOOL_DIR", "/tmp/spool");
    ScopedEnv budget("POSTSPOOL_BUDGET_MS", "25");
    ScopedEnv share("POSTSPOOL_SOCKET_SHARE_PCT", "40");
    ScopedEnv sync("POSTSPOOL_SYNC_SPOOL", "1");
    ScopedEnv log("POSTSPOOL_LOG_STDERR", "yes");
    postspool_options o;
    postspool_options_init(&o);
    EXPECT_EQ(o.struct_size, sizeof o);
    EXPECT_STREQ(o.socket_path, "/tmp/x.sock");
    EXPECT_STREQ(o.spool_dir, "/tmp/spool");
    EXPECT_EQ(o.budget_ms, 25u);
    EXPECT_EQ(o.socket_share_pct, 40u);
    EXPECT_EQ(o.sync_spool, 1);
    EXPECT_EQ(o.log_stderr, 1);
  }
  {
    ScopedEnv budget("POSTSPOOL_BUDGET_MS", "5ms");  // not a number: the default
    ScopedEnv share("POSTSPOOL_SOCKET_SHARE_PCT", "250");
    ScopedEnv socket("POSTSPOOL_SOCKET", "");
    postspool_options o;
    postspool_options_init(&o);
    EXPECT_EQ(o.budget_ms, 5u);
    EXPECT_EQ(o.socket_share_pct, 60u);
    EXPECT_STREQ(o.socket_path, "/run/postspool/postspoold.sock");
  }
  ::unsetenv("POSTSPOOL_SPOOL_DIR");
  postspool_options o;
  postspool_options_init(&o);
  EXPECT_STREQ(o.spool_dir, "/var/spool/postspool/incoming");
  EXPECT_EQ(o.sync_spool, 0);
  EXPECT_EQ(o.log_stderr, 0);
}

TEST(ClientAbiTest, StrerrorDescribesEveryCode) {
  std::set<std::string> texts;
  for (int code = POSTSPOOL_ECLOSED; code <= POSTSPOOL_OK; ++code) {
    const char* text = postspool_strerror(code);
    ASSERT_NE(text, nullptr);
    EXPECT_NE(std::string(text), "unknown postspool error") << code;
    texts.insert(text);
  }
  EXPECT_EQ(texts.size(), 10u);
  EXPECT_STREQ(postspool_strerror(-100), "unknown postspool error");
  EXPECT_STREQ(postspool_strerror(5), "unknown postspool error");
}

TEST(ClientAbiTest, NullClientOrPostIsEinval) {
  struct postspool_post post = SimplePost("a");
  postspool_post_result result;
  EXPECT_EQ(postspool_post(nullptr, &post, &result), POSTSPOOL_EINVAL);
  EXPECT_EQ(result.transport, POSTSPOOL_TRANSPORT_NONE);
  ScopedClient client("/nonexistent/d.sock", "/nonexistent/spool");
  EXPECT_EQ(postspool_post(client.get(), nullptr, &result), POSTSPOOL_EINVAL);
  EXPECT_STREQ(postspool_last_error(), "post is NULL");
}

struct InvalidCase {
  const char* name;
  std::function<void(struct postspool_post*)> mutate;
  int error;
  const char* detail;  // a part of postspool_last_error()
};

TEST(ClientAbiTest, InvalidPostsAreRefusedAndNothingIsSent) {
  TempDir dir;
  TempDir spool;
  FakeDaemon daemon(dir.File("d.sock"));
  ASSERT_TRUE(daemon.ok());
  ScopedClient client(dir.File("d.sock"), spool.path());

  static const std::string long_path(kPathBytesMax + 1, 'p');
  static const std::string max_path(kPathBytesMax, 'p');
  static const std::string long_url(kBaseUrlBytesMax + 1, 'u');
  static const std::string long_value(kExtraBytesMax, 'v');
  static const unsigned char digest[64] = {};
  static postspool_extra too_many[kExtrasMax + 1];
  for (auto& e : too_many) e = {"k", "v"};
  static postspool_extra twice[2] = {{"k", "1"}, {"k", "2"}};
  static postspool_extra reserved[1] = {{"relPath", "x"}};
  static postspool_extra reserved_cluster[1] = {{"from_cluster", "x"}};
  static postspool_extra private_name[1] = {{"_format", "x"}};
  static postspool_extra null_value[1] = {{"k", nullptr}};
  static postspool_extra empty_key[1] = {{"", "v"}};
  static postspool_extra long_extra[1] = {{"k", long_value.c_str()}};

  const std::vector<InvalidCase> cases = {
      {"empty rel_path", [](auto* p) { p->rel_path = ""; }, POSTSPOOL_EINVAL, "rel_path is empty"},
      {"null rel_path", [](auto* p) { p->rel_path = nullptr; }, POSTSPOOL_EINVAL,
       "rel_path is NULL"},
      {"long rel_path", [](auto* p) { p->rel_path = long_path.c_str(); }, POSTSPOOL_ETOOBIG,
       "rel_path is longer than 4096 bytes"},
      {"long rename", [](auto* p) { p->rename = long_path.c_str(); }, POSTSPOOL_ETOOBIG,
       "rename is longer"},
      {"long link", [](auto* p) { p->link = long_path.c_str(); }, POSTSPOOL_ETOOBIG, "link is"},
      {"long retrieve_path", [](auto* p) { p->retrieve_path = long_path.c_str(); },
       POSTSPOOL_ETOOBIG, "retrieve_path is"},
      {"long base_url", [](auto* p) { p->base_url = long_url.c_str(); }, POSTSPOOL_ETOOBIG,
       "base_url is longer than 1024 bytes"},
      {"unknown op flag", [](auto* p) { p->op_flags = 0x10; }, POSTSPOOL_EINVAL, "op_flags"},
      {"unknown identity", [](auto* p) { p->identity_method = 9; }, POSTSPOOL_EINVAL,
       "identity_method 9"},
      {"short sha512",
       [](auto* p) {
         p->identity_method = POSTSPOOL_IDENTITY_SHA512;
         p->identity_value = digest;
         p->identity_size = 32;
       },
       POSTSPOOL_EINVAL, "a sha512 digest is 64 bytes"},
      {"md5 without value",
       [](auto* p) {
         p->identity_method = POSTSPOOL_IDENTITY_MD5;
         p->identity_size = 16;
       },
       POSTSPOOL_EINVAL, "identity_value is NULL"},
      {"long identity",
       [](auto* p) {
         p->identity_method = POSTSPOOL_IDENTITY_ARBITRARY;
         p->identity_value = long_value.data();
         p->identity_size = kIdentityBytesMax + 1;
       },
       POSTSPOOL_ETOOBIG, "identity_value is longer than 256 bytes"},
      {"value without method",
       [](auto* p) {
         p->identity_value = digest;
         p->identity_size = 4;
       },
       POSTSPOOL_EINVAL, "identity_method is NONE"},
      {"negative size",
       [](auto* p) {
         p->has_size = 1;
         p->size = -1;
       },
       POSTSPOOL_EINVAL, "size is negative"},
      {"too many extras",
       [](auto* p) {
         p->extras = too_many;
         p->extras_count = kExtrasMax + 1;
       },
       POSTSPOOL_ETOOBIG, "33 extra fields"},
      {"null extras", [](auto* p) { p->extras_count = 1; }, POSTSPOOL_EINVAL,
       "extras is NULL"},
      {"extra twice",
       [](auto* p) {
         p->extras = twice;
         p->extras_count = 2;
       },
       POSTSPOOL_EINVAL, "\"k\" is given twice"},
      {"reserved extra",
       [](auto* p) {
         p->extras = reserved;
         p->extras_count = 1;
       },
       POSTSPOOL_EINVAL, "\"relPath\" is a standard v03 field name"},
      {"reserved cluster extra",
       [](auto* p) {
         p->extras = reserved_cluster;
         p->extras_count = 1;
       },
       POSTSPOOL_EINVAL, "\"from_cluster\" is a standard v03 field name"},
      {"sarracenia private extra",
       [](auto* p) {
         p->extras = private_name;
         p->extras_count = 1;
       },
       POSTSPOOL_EINVAL, "\"_format\" is a standard v03 field name"},
      {"rel_path with ..", [](auto* p) { p->rel_path = "data/../../etc/passwd"; },
       POSTSPOOL_EINVAL, "rel_path is not normalised"},
      {"rel_path with //", [](auto* p) { p->rel_path = "data//x"; }, POSTSPOOL_EINVAL,
       "rel_path is not normalised"},
      {"rel_path ending in /", [](auto* p) { p->rel_path = "data/"; }, POSTSPOOL_EINVAL,
       "rel_path is not normalised"},
      {"hlink with ..", [](auto* p) { p->hlink = "../x"; }, POSTSPOOL_EINVAL,
       "hlink is not normalised"},
      {"rename with .", [](auto* p) { p->rename = "./x"; }, POSTSPOOL_EINVAL,
       "rename is not normalised"},
      {"null extra value",
       [](auto* p) {
         p->extras = null_value;
         p->extras_count = 1;
       },
       POSTSPOOL_EINVAL, "extras[0].value is NULL"},
      {"empty extra key",
       [](auto* p) {
         p->extras = empty_key;
         p->extras_count = 1;
       },
       POSTSPOOL_EINVAL, "extras[0].key is empty"},
      {"long extra",
       [](auto* p) {
         p->extras = long_extra;
         p->extras_count = 1;
       },
       POSTSPOOL_ETOOBIG, "extras[0] (key plus value) is longer than 1024 bytes"},
      {"uninitialised struct", [](auto* p) { p->struct_size = 0; }, POSTSPOOL_EINVAL,
       "struct_size"},
  };
  for (const InvalidCase& c : cases) {
    SCOPED_TRACE(c.name);
    struct postspool_post post = SimplePost("ok/path");
    c.mutate(&post);
    postspool_post_result result;
    EXPECT_EQ(postspool_post(client.get(), &post, &result), c.error);
    EXPECT_EQ(result.transport, POSTSPOOL_TRANSPORT_NONE);
    EXPECT_NE(std::string(postspool_last_error()).find(c.detail), std::string::npos)
        << postspool_last_error();
  }
  EXPECT_EQ(daemon.requests_seen(), 0u);
  EXPECT_TRUE(ReadSpool(spool.path()).empty());

  // The limits themselves are fine.
  struct postspool_post post = SimplePost(max_path.c_str());
  post.base_url = long_url.c_str() + 1;
  EXPECT_EQ(postspool_post(client.get(), &post, nullptr), POSTSPOOL_OK) << postspool_last_error();
  EXPECT_EQ(daemon.received().size(), 1u);
}

}  // namespace
}  // namespace postspool::testing
