// The AMQP 0-9-1 frames of one basic.publish of a post, encoded by us so
// that a whole batch of posts goes to the socket in one write instead of
// three send() calls per post inside rabbitmq-c (amqp_basic_publish).
//
// The bytes are exactly those amqp_basic_publish of rabbitmq-c 0.11 writes
// for the properties AmqpSession::Publish sets (pinned by a test against
// rabbitmq-c itself, tests/daemon/publish_frames_test.cc):
//   method frame   type 1, channel, size, class 60 method 40 (basic.publish):
//                  reserved ticket u16 0, exchange shortstr, routing key
//                  shortstr, one octet of bits (mandatory 1, immediate 2);
//   header frame   type 2, channel, size, class 60, weight u16 0, body size
//                  u64, property flags u16 (content_type, content_encoding,
//                  delivery_mode, message_id: 0xD080), then those properties
//                  in that order (shortstr, shortstr, octet, shortstr);
//   body frames    type 3, channel, size, at most frame_max - 8 body bytes
//                  each (7 bytes of frame header, 1 of frame end); none for an
//                  empty body;
// every frame ended by 0xCE, all integers big-endian.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "status.h"

namespace postspool::daemon {

// AMQP 0-9-1's smallest frame_max a peer may negotiate (4.2.1): the method
// and header frames of a post (at most about 800 bytes) always fit.
inline constexpr uint32_t kAmqpFrameMinSize = 4096;

struct PublishFrame {
  uint16_t channel = 1;
  std::string_view exchange;
  std::string_view routing_key;
  std::string_view body;
  std::string_view message_id;  // the message_id property
  bool mandatory = false;
};

// Appends the frames of `m` to `*out`, with body frames split for a
// connection whose negotiated frame_max is `frame_max` (amqp_get_frame_max).
// kInvalidArgument, with `*out` unchanged, if a shortstr (exchange, routing
// key, message_id) is longer than 255 bytes or frame_max is below
// kAmqpFrameMinSize: the broker would close the connection over such bytes,
// so none are written.
Status AppendPublishFrames(const PublishFrame& m, uint32_t frame_max, std::string* out);

}  // namespace postspool::daemon
