// AppendPublishFrames: the bytes of basic.publish are exactly those
// rabbitmq-c's amqp_basic_publish writes for the same post.
#include "publish_frames.h"

#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>

#include "amqp_properties.h"
#include "test_util.h"

namespace postspool::daemon {
namespace {

amqp_bytes_t Bytes(std::string_view s) {
  return amqp_bytes_t{s.size(), const_cast<char*>(s.data())};
}

// What amqp_basic_publish writes for `m` on a connection tuned to
// `frame_max`: the connection's socket is one end of a socketpair, a thread
// reads the other end until rabbitmq-c closes it.
std::string RabbitmqBytes(const PublishFrame& m, uint32_t frame_max) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    ADD_FAILURE() << "socketpair: " << std::strerror(errno);
    return {};
  }
  amqp_connection_state_t conn = amqp_new_connection();
  amqp_socket_t* socket = amqp_tcp_socket_new(conn);
  amqp_tcp_socket_set_sockfd(socket, sv[0]);
  // rabbitmq-c tunes only a connection that has read something from the
  // broker (a login would have). The simplest thing it takes in its
  // initial state is a protocol header, read as a pseudo-frame.
  static constexpr char kProtocolHeader[8] = {'A', 'M', 'Q', 'P', 0, 0, 9, 1};
  EXPECT_EQ(::write(sv[1], kProtocolHeader, sizeof kProtocolHeader), 8);
  amqp_frame_t frame;
  EXPECT_EQ(amqp_simple_wait_frame(conn, &frame), AMQP_STATUS_OK);
  EXPECT_EQ(frame.frame_type, 'A');  // rabbitmq-c's AMQP_PSEUDOFRAME_PROTOCOL_HEADER
  std::string got;
  std::thread reader([&got, fd = sv[1]] {
    char buf[65536];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
  });
  // What the login's tune negotiates on a real connection.
  EXPECT_EQ(amqp_tune_connection(conn, 0, static_cast<int>(frame_max), 0), AMQP_STATUS_OK);
  amqp_basic_properties_t props;
  std::memset(&props, 0, sizeof props);
  props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_CONTENT_ENCODING_FLAG |
                 AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG;
  props.content_type = Bytes(kPostContentType);
  props.content_encoding = Bytes(kPostContentEncoding);
  props.delivery_mode = kPostDeliveryMode;
  props.message_id = Bytes(m.message_id);
  EXPECT_EQ(amqp_basic_publish(conn, m.channel, Bytes(m.exchange), Bytes(m.routing_key),
                               m.mandatory ? 1 : 0, 0, &props, Bytes(m.body)),
            AMQP_STATUS_OK);
  amqp_destroy_connection(conn);  // closes sv[0]: the reader sees the end
  reader.join();
  return got;
}

std::string Ours(const PublishFrame& m, uint32_t frame_max) {
  std::string out;
  EXPECT_TRUE(AppendPublishFrames(m, frame_max, &out).ok());
  return out;
}

constexpr std::string_view kId = "01234567-89ab-cdef-fedc-ba9876543210";

PublishFrame Post(std::string_view body, bool mandatory) {
  PublishFrame m;
  m.exchange = "xs_tsource";
  m.routing_key = "v03.some.dir";
  m.body = body;
  m.message_id = kId;
  m.mandatory = mandatory;
  return m;
}

TEST(PublishFrames, SmallPostIsByteForByteWhatRabbitmqCWrites) {
  const std::string body = R"({"pubTime":"20260101T000000.0","baseUrl":"file:/","relPath":"a"})";
  for (bool mandatory : {false, true}) {
    SCOPED_TRACE(mandatory ? "mandatory" : "not mandatory");
    const PublishFrame m = Post(body, mandatory);
    EXPECT_EQ(Ours(m, 131072), RabbitmqBytes(m, 131072));
  }
}

TEST(PublishFrames, EmptyBodyHasNoBodyFrame) {
  const PublishFrame m = Post("", false);
  const std::string ours = Ours(m, 131072);
  EXPECT_EQ(ours, RabbitmqBytes(m, 131072));
  // Method and header frames only: the last frame is the header (type 2).
  size_t frames = 0;
  for (size_t at = 0; at < ours.size(); ++frames) {
    const uint32_t size = (uint32_t{static_cast<uint8_t>(ours[at + 3])} << 24) |
                          (uint32_t{static_cast<uint8_t>(ours[at + 4])} << 16) |
                          (uint32_t{static_cast<uint8_t>(ours[at + 5])} << 8) |
                          uint32_t{static_cast<uint8_t>(ours[at + 6])};
    ASSERT_EQ(static_cast<uint8_t>(ours[at + 7 + size]), 0xCE);
    at += 8 + size;
  }
  EXPECT_EQ(frames, 2u);
}

TEST(PublishFrames, BodyLargerThanFrameMaxIsSplitAsRabbitmqCSplitsIt) {
  constexpr uint32_t kFrameMax = 4096;
  constexpr size_t kChunk = kFrameMax - 8;
  for (size_t size : {kChunk - 1, kChunk, kChunk + 1, 2 * kChunk, size_t{10000}, size_t{100000}}) {
    SCOPED_TRACE("body " + std::to_string(size) + " bytes");
    std::string body(size, '\0');
    for (size_t i = 0; i < size; ++i) body[i] = static_cast<char>('a' + i % 26);
    const PublishFrame m = Post(body, true);
    EXPECT_EQ(Ours(m, kFrameMax), RabbitmqBytes(m, kFrameMax));
    EXPECT_EQ(Ours(m, 131072), RabbitmqBytes(m, 131072));
  }
}

TEST(PublishFrames, LongestShortStringsAndOtherChannelsMatch) {
  const std::string exchange(255, 'x');
  const std::string routing_key(255, 'k');
  const std::string message_id(255, 'm');
  PublishFrame m = Post("{}", false);
  m.exchange = exchange;
  m.routing_key = routing_key;
  m.message_id = message_id;
  m.channel = 7;
  EXPECT_EQ(Ours(m, 131072), RabbitmqBytes(m, 131072));
  m.exchange = "";
  m.routing_key = "";
  m.message_id = "";
  m.channel = 65535;
  EXPECT_EQ(Ours(m, 131072), RabbitmqBytes(m, 131072));
}

TEST(PublishFrames, AppendsAfterWhatTheBufferHolds) {
  const PublishFrame a = Post("first", false);
  const PublishFrame b = Post("", true);
  std::string out = "prefix";
  ASSERT_TRUE(AppendPublishFrames(a, 4096, &out).ok());
  ASSERT_TRUE(AppendPublishFrames(b, 4096, &out).ok());
  EXPECT_EQ(out, "prefix" + RabbitmqBytes(a, 4096) + RabbitmqBytes(b, 4096));
}

TEST(PublishFrames, OverlongShortStringIsRefusedAndNothingIsAppended) {
  const std::string long_key(256, 'k');
  std::string out = "kept";
  PublishFrame m = Post("{}", false);
  m.routing_key = long_key;
  Status s = AppendPublishFrames(m, 131072, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(out, "kept");
  m = Post("{}", false);
  m.exchange = long_key;
  EXPECT_EQ(AppendPublishFrames(m, 131072, &out).code(), StatusCode::kInvalidArgument);
  m = Post("{}", false);
  m.message_id = long_key;
  EXPECT_EQ(AppendPublishFrames(m, 131072, &out).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(out, "kept");
}

TEST(PublishFrames, FrameMaxBelowTheProtocolMinimumIsRefused) {
  std::string out;
  EXPECT_EQ(AppendPublishFrames(Post("{}", false), kAmqpFrameMinSize - 1, &out).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(out.empty());
}

TEST(PublishFrames, RandomPostsMatchRabbitmqC) {
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::printf("seed %llu (POSTSPOOL_TEST_SEED=%llu reruns it)\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const auto below = [&rng](size_t n) { return static_cast<size_t>(rng() % n); };
  for (int i = 0; i < 50; ++i) {
    const uint32_t frame_max = below(2) == 0 ? 4096 : static_cast<uint32_t>(4096 + below(200000));
    std::string exchange(below(256), 'e');
    std::string routing_key(below(256), '.');
    std::string message_id(below(256), 'i');
    std::string body(below(3 * frame_max), '\0');
    for (char& c : body) c = static_cast<char>(rng());
    for (char& c : routing_key) c = static_cast<char>(rng());
    PublishFrame m;
    m.channel = static_cast<uint16_t>(rng());
    m.exchange = exchange;
    m.routing_key = routing_key;
    m.message_id = message_id;
    m.body = body;
    m.mandatory = below(2) == 0;
    SCOPED_TRACE("post " + std::to_string(i));
    ASSERT_EQ(Ours(m, frame_max), RabbitmqBytes(m, frame_max));
  }
}

}  // namespace
}  // namespace postspool::daemon
