// The configuration file: defaults, every kind of value, clear errors.
#include "config.h"
#include "socket_protocol.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <algorithm>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "segment_format.h"

namespace postspool::daemon {
namespace {

TEST(Config, DefaultsWorkAgainstALocalBroker) {
  Config c;
  ASSERT_TRUE(ParseConfig("", "test", &c).ok());
  ASSERT_EQ(c.post_broker.size(), 1u);
  EXPECT_EQ(c.post_broker[0], "amqp://guest:guest@localhost/");
  EXPECT_EQ(c.post_topicPrefix, "v03");
  EXPECT_EQ(c.durability, Durability::kAccepted);
  EXPECT_EQ(c.io_backend, IoBackend::kAuto);
}

TEST(Config, ParsesEveryKindOfValue) {
  Config c;
  const Status s = ParseConfig(R"(
# comment
socket_path = /tmp/x.sock   # trailing comment
socket_mode = 0660
durability = synced
io_backend = epoll
journal_segment_bytes_max = 16 MiB
disk_bytes_max = 2GiB
post_broker = amqp://a/, amqps://b/
post_broker = amqp://c/
post_exchange = xs_test
exchange_declare = no
publish_window_max = 50
unroutable_policy = retry
log_level = debug
)", "test.conf", &c);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(c.socket_path, "/tmp/x.sock");
  EXPECT_EQ(c.socket_mode, 0660u);
  EXPECT_EQ(c.durability, Durability::kSynced);
  EXPECT_EQ(c.io_backend, IoBackend::kEpoll);
  EXPECT_EQ(c.journal_segment_bytes_max, 16ull << 20);
  EXPECT_EQ(c.disk_bytes_max, 2ull << 30);
  EXPECT_EQ(c.post_broker, (std::vector<std::string>{"amqp://a/", "amqps://b/", "amqp://c/"}));
  EXPECT_EQ(c.post_exchange, "xs_test");
  EXPECT_FALSE(c.exchange_declare);
  EXPECT_EQ(c.publish_window_max, 50u);
  EXPECT_EQ(c.unroutable_policy, UnroutablePolicy::kRetry);
  EXPECT_EQ(c.log_level, "debug");
}

TEST(Config, UnknownKeyIsAnErrorNamingFileAndLine) {
  Config c;
  const Status s = ParseConfig("durability = synced\nbroker = amqp://x/\n", "/etc/p.conf", &c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("/etc/p.conf:2"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("broker"), std::string::npos) << s.message();
}

TEST(Config, BadValuesAreErrors) {
  for (const char* text : {"durability = fast", "socket_mode = 999", "disk_bytes_max = lots",
                           "publish_window_max = 0", "exchange_declare = maybe",
                           "journal_segment_bytes_max = 10", "no equals sign",
                           "reconnect_delay_initial_ms = 5000\nreconnect_delay_max_ms = 10",
                           "disk_bytes_max = 99999999999999 TiB"}) {
    Config c;
    EXPECT_EQ(ParseConfig(text, "t", &c).code(), StatusCode::kInvalidArgument) << text;
  }
}

TEST(Config, RepublishDelayIsItsOwnSettingNotTheReconnectDelay) {
  Config defaults;
  ASSERT_TRUE(ParseConfig("", "t", &defaults).ok());
  EXPECT_EQ(defaults.republish_delay_initial_ms, 100u);
  EXPECT_EQ(defaults.republish_delay_max_ms, 30000u);
  Config c;
  const Status s = ParseConfig(
      "reconnect_delay_initial_ms = 1000\nreconnect_delay_max_ms = 60000\n"
      "republish_delay_initial_ms = 20\nrepublish_delay_max_ms = 500\n",
      "t", &c);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(c.republish_delay_initial_ms, 20u);
  EXPECT_EQ(c.republish_delay_max_ms, 500u);
  EXPECT_EQ(c.reconnect_delay_initial_ms, 1000u);
  EXPECT_EQ(c.reconnect_delay_max_ms, 60000u);
  for (const char* text : {"republish_delay_initial_ms = 0", "republish_delay_max_ms = 0",
                           "republish_delay_initial_ms = 5000\nrepublish_delay_max_ms = 10"}) {
    Config bad;
    const Status b = ParseConfig(text, "t", &bad);
    EXPECT_EQ(b.code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(b.message().find("republish_delay"), std::string::npos) << b.message();
  }
}

TEST(Config, MissingFileIsAnErrorNamingIt) {
  Config c;
  const Status s = LoadConfig("/nonexistent/postspoold.conf", &c);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/nonexistent/postspoold.conf"), std::string::npos);
}

// A configuration that passes CheckConfig on this machine: the defaults, with
// connections_max within the open files limit the test runs under.
Config CheckableDefaults() {
  Config c;
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_max != RLIM_INFINITY &&
      nofile.rlim_max < uint64_t{c.connections_max} + kDaemonFdsReserve) {
    c.connections_max = static_cast<uint32_t>(nofile.rlim_max / 2);
  }
  return c;
}

void ExpectCheckFailsNaming(const Config& c, const std::string& key) {
  const Status s = CheckConfig(c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << key;
  EXPECT_NE(s.message().find(key), std::string::npos) << s.message();
}

TEST(CheckConfig, TheDefaultsPass) {
  const Status s = CheckConfig(CheckableDefaults());
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(CheckConfig, ASocketPathTooLongForAUnixSocketAddressFails) {
  Config c = CheckableDefaults();
  // Parses (any non-empty path does), but bind() could never take it.
  ASSERT_TRUE(ParseConfig("socket_path = /" + std::string(107, 's'), "t", &c).ok());
  ExpectCheckFailsNaming(c, "socket_path");
  c.socket_path = "/" + std::string(106, 's');  // 107 bytes and the NUL: the most there is
  EXPECT_TRUE(CheckConfig(c).ok()) << CheckConfig(c).ToString();
}

TEST(CheckConfig, RelativePathsFail) {
  for (const char* key : {"socket_path", "spool_dir", "quarantine_dir", "journal_dir",
                          "metrics_file"}) {
    Config c = CheckableDefaults();
    ASSERT_TRUE(ParseConfig(std::string(key) + " = relative/path", "t", &c).ok()) << key;
    ExpectCheckFailsNaming(c, key);
  }
  Config c = CheckableDefaults();
  c.metrics_file.clear();  // off
  EXPECT_TRUE(CheckConfig(c).ok());
}

TEST(CheckConfig, TheControlSocketMustBeAbsoluteShortAndNotThePostSocket) {
  Config c = CheckableDefaults();
  ASSERT_TRUE(ParseConfig("control_socket_path = run/control.sock\n"
                          "control_connections_max = 4\ncontrol_timeout_ms = 500\n"
                          "health_confirm_stall_ms = 1000",
                          "t", &c)
                  .ok());
  EXPECT_EQ(c.control_connections_max, 4u);
  EXPECT_EQ(c.control_timeout_ms, 500u);
  EXPECT_EQ(c.health_confirm_stall_ms, 1000u);
  ExpectCheckFailsNaming(c, "control_socket_path");
  c.control_socket_path = "/" + std::string(107, 'c');
  ExpectCheckFailsNaming(c, "control_socket_path");
  c.control_socket_path = c.socket_path;
  ExpectCheckFailsNaming(c, "control_socket_path");
  c.control_socket_path.clear();  // off
  EXPECT_TRUE(CheckConfig(c).ok()) << CheckConfig(c).ToString();
  EXPECT_FALSE(ParseConfig("control_connections_max = 0", "t", &c).ok());
  EXPECT_FALSE(ParseConfig("control_timeout_ms = 0", "t", &c).ok());
}

TEST(CheckConfig, ABrokerUrlThatDoesNotParseFailsWithoutShowingItsPassword) {
  for (const char* url : {"http://u:secret@host/", "amqp://u:secret@host:notaport/"}) {
    Config c = CheckableDefaults();
    ASSERT_TRUE(ParseConfig(std::string("post_broker = amqp://ok/, ") + url, "t", &c).ok());
    const Status s = CheckConfig(c);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << url;
    EXPECT_NE(s.message().find("post_broker"), std::string::npos) << s.message();
    EXPECT_EQ(s.message().find("secret"), std::string::npos) << s.message();
  }
}

TEST(CheckConfig, TlsFilesThatCannotBeReadFail) {
  for (const char* key : {"tls_ca_file", "tls_cert_file", "tls_key_file"}) {
    Config c = CheckableDefaults();
    c.tls_cert_file = "/dev/null";  // readable: a key needs a certificate
    ASSERT_TRUE(ParseConfig(std::string(key) + " = /nonexistent/postspool.pem", "t", &c).ok());
    ExpectCheckFailsNaming(c, key);
  }
  Config c = CheckableDefaults();
  c.tls_key_file = "/dev/null";
  ExpectCheckFailsNaming(c, "tls_cert_file");
  c.tls_cert_file = "/dev/null";
  c.tls_ca_file = "/dev/null";
  EXPECT_TRUE(CheckConfig(c).ok()) << CheckConfig(c).ToString();
}

TEST(CheckConfig, ConnectionsMaxMustLeaveRoomBelowTheOpenFilesHardLimit) {
  rlimit nofile{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &nofile), 0);
  if (nofile.rlim_max == RLIM_INFINITY || nofile.rlim_max > UINT32_MAX) {
    GTEST_SKIP() << "no finite open files limit to exceed";
  }
  ASSERT_GT(nofile.rlim_max, uint64_t{kDaemonFdsReserve});
  Config c = CheckableDefaults();
  c.connections_max = static_cast<uint32_t>(nofile.rlim_max - kDaemonFdsReserve);
  EXPECT_TRUE(CheckConfig(c).ok()) << CheckConfig(c).ToString();
  c.connections_max += 1;
  ExpectCheckFailsNaming(c, "connections_max");
}

TEST(CheckConfig, SizesThatContradictEachOtherFail) {
  Config c = CheckableDefaults();
  // Each accepted alone by ParseConfig.
  ASSERT_TRUE(ParseConfig("batch_bytes_max = 8 MiB\njournal_segment_bytes_max = 4 MiB", "t", &c)
                  .ok());
  ExpectCheckFailsNaming(c, "journal_segment_bytes_max");
  c = CheckableDefaults();
  // A request is taken while the batch has room for twice its size: a
  // smaller batch would answer the largest requests "busy" forever.
  c.batch_bytes_max = 2 * wire::kRequestBytesMax - 1;
  ExpectCheckFailsNaming(c, "batch_bytes_max");
  c.batch_bytes_max += 1;
  EXPECT_TRUE(CheckConfig(c).ok()) << CheckConfig(c).ToString();
}

TEST(CheckConfig, RangesParseConfigEnforcesAreCheckedForAConfigBuiltInCode) {
  Config c = CheckableDefaults();
  c.reconnect_delay_initial_ms = c.reconnect_delay_max_ms + 1;
  ExpectCheckFailsNaming(c, "reconnect_delay_initial_ms");
  c = CheckableDefaults();
  c.publish_window_max = 0;
  ExpectCheckFailsNaming(c, "publish_window_max");
  c = CheckableDefaults();
  c.log_level = "loud";
  ExpectCheckFailsNaming(c, "log_level");
}

TEST(RaiseOpenFilesLimit, LiftsTheSoftLimitToTheHardLimit) {
  // In a child: the test process keeps its limits.
  const pid_t pid = ::fork();
  if (pid == 0) {
    rlimit nofile{};
    if (::getrlimit(RLIMIT_NOFILE, &nofile) != 0) ::_exit(2);
    nofile.rlim_cur = std::min<rlim_t>(64, nofile.rlim_max);
    if (::setrlimit(RLIMIT_NOFILE, &nofile) != 0) ::_exit(3);
    if (!RaiseOpenFilesLimit().ok()) ::_exit(4);
    rlimit after{};
    if (::getrlimit(RLIMIT_NOFILE, &after) != 0) ::_exit(5);
    ::_exit(after.rlim_cur == after.rlim_max ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

// postspoold --check-config runs CheckConfig: a socket path that start
// could not bind exits 2 (not restarted by the unit), naming the key.
TEST(CheckConfigCommand, ASocketPathTooLongExitsTwoNamingTheKey) {
  char dir_template[] = "/tmp/postspool-config-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::string conf = dir + "/p.conf", err = dir + "/stderr";
  std::ofstream(conf) << "socket_path = /" << std::string(120, 's') << "\n";
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 2);
    ::execl(POSTSPOOLD_PATH, POSTSPOOLD_PATH, "--config", conf.c_str(), "--check-config",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  std::ifstream in(err);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 2) << text;
  EXPECT_NE(text.find("socket_path"), std::string::npos) << text;
  ::unlink(conf.c_str());
  ::unlink(err.c_str());
  ::rmdir(dir.c_str());
}

// Issue 19: a per-uid share of 1 GiB under a 2 MiB quota was no share.
TEST(Config, TheDefaultDiskShareIsAQuarterOfTheQuotaWhateverTheQuota) {
  Config c;
  EXPECT_EQ(c.DiskBytesPerUidMax(), 1ull << 30);  // of the default 4 GiB
  ASSERT_TRUE(ParseConfig("disk_bytes_max = 2 MiB\n", "test", &c).ok());
  EXPECT_EQ(c.DiskBytesPerUidMax(), 512u << 10);
  EXPECT_TRUE(ConfigWarnings(c).empty());
  ASSERT_TRUE(ParseConfig("disk_bytes_per_uid_max = 1 MiB\n", "test", &c).ok());
  EXPECT_EQ(c.DiskBytesPerUidMax(), 1u << 20);
}

TEST(Config, AShareNotBelowTheQuotaIsWarnedAbout) {
  Config c;
  ASSERT_TRUE(ParseConfig("disk_bytes_max = 2 MiB\ndisk_bytes_per_uid_max = 1 GiB\n", "test", &c).ok());
  const auto warnings = ConfigWarnings(c);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("disk_bytes_per_uid_max"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("not below disk_bytes_max"), std::string::npos) << warnings[0];
  c.disk_bytes_per_uid_max = c.disk_bytes_max;
  EXPECT_EQ(ConfigWarnings(c).size(), 1u) << "equal to the total is no share either";
  c.disk_bytes_per_uid_max = c.disk_bytes_max - 1;
  EXPECT_TRUE(ConfigWarnings(c).empty());
}

// postspoold --check-config prints the warning on stderr and still exits 0.
TEST(CheckConfigCommand, AShareNotBelowTheQuotaWarnsAndExitsZero) {
  char dir_template[] = "/tmp/postspool-config-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::string conf = dir + "/p.conf", err = dir + "/stderr";
  std::ofstream(conf) << "disk_bytes_max = 2 MiB\ndisk_bytes_per_uid_max = 2 MiB\n";
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 2);
    const int null_fd = ::open("/dev/null", O_WRONLY);
    ::dup2(null_fd, 1);
    ::execl(POSTSPOOLD_PATH, POSTSPOOLD_PATH, "--config", conf.c_str(), "--check-config",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  std::ifstream in(err);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << text;
  EXPECT_NE(text.find("warning: disk_bytes_per_uid_max"), std::string::npos) << text;
  ::unlink(conf.c_str());
  ::unlink(err.c_str());
  ::rmdir(dir.c_str());
}

}  // namespace
}  // namespace postspool::daemon
