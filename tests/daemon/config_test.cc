// The configuration file: defaults, every kind of value, clear errors.
#include "config.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace postspool::daemon
