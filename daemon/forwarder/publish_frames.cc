#include "publish_frames.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include "amqp_properties.h"

namespace postspool::daemon {
namespace {

constexpr uint8_t kFrameMethod = 1;
constexpr uint8_t kFrameHeader = 2;
constexpr uint8_t kFrameBody = 3;
constexpr uint8_t kFrameEnd = 0xCE;
// Type u8, channel u16, payload size u32 before the payload; the end octet
// after it.
constexpr size_t kFrameHeaderSize = 7;
constexpr size_t kFrameOverhead = kFrameHeaderSize + 1;
constexpr uint16_t kBasicClass = 60;
constexpr uint16_t kBasicPublishMethod = 40;
constexpr size_t kShortStrMax = 255;
// rabbitmq-c's flag bits for basic properties (amqp_framing.h), in the order
// their values follow the flags.
constexpr uint16_t kContentTypeFlag = 1u << 15;
constexpr uint16_t kContentEncodingFlag = 1u << 14;
constexpr uint16_t kDeliveryModeFlag = 1u << 12;
constexpr uint16_t kMessageIdFlag = 1u << 7;
constexpr uint16_t kPostPropertyFlags =
    kContentTypeFlag | kContentEncodingFlag | kDeliveryModeFlag | kMessageIdFlag;

// Writes through a cursor into space already sized: no per-field capacity
// checks (the total was computed first).
class Writer {
 public:
  explicit Writer(char* p) : p_(p) {}
  void U8(uint8_t v) { *p_++ = static_cast<char>(v); }
  void U16(uint16_t v) {
    U8(static_cast<uint8_t>(v >> 8));
    U8(static_cast<uint8_t>(v));
  }
  void U32(uint32_t v) {
    U16(static_cast<uint16_t>(v >> 16));
    U16(static_cast<uint16_t>(v));
  }
  void U64(uint64_t v) {
    U32(static_cast<uint32_t>(v >> 32));
    U32(static_cast<uint32_t>(v));
  }
  void Bytes(std::string_view s) {
    if (!s.empty()) std::memcpy(p_, s.data(), s.size());
    p_ += s.size();
  }
  void ShortStr(std::string_view s) {
    U8(static_cast<uint8_t>(s.size()));
    Bytes(s);
  }
  void FrameStart(uint8_t type, uint16_t channel, size_t payload_size) {
    U8(type);
    U16(channel);
    U32(static_cast<uint32_t>(payload_size));
  }
  char* position() const { return p_; }

 private:
  char* p_;
};

}  // namespace

Status AppendPublishFrames(const PublishFrame& m, uint32_t frame_max, std::string* out) {
  if (m.exchange.size() > kShortStrMax || m.routing_key.size() > kShortStrMax ||
      m.message_id.size() > kShortStrMax) {
    return Status(StatusCode::kInvalidArgument,
                  "basic.publish: exchange (" + std::to_string(m.exchange.size()) +
                      " bytes), routing key (" + std::to_string(m.routing_key.size()) +
                      " bytes) and message_id (" + std::to_string(m.message_id.size()) +
                      " bytes) must be at most 255 bytes each");
  }
  if (frame_max < kAmqpFrameMinSize) {
    return Status(StatusCode::kInvalidArgument,
                  "basic.publish: frame_max " + std::to_string(frame_max) + " is below " +
                      std::to_string(kAmqpFrameMinSize));
  }
  // class, method, ticket, exchange, routing key, bits.
  const size_t method_size = 2 + 2 + 2 + 1 + m.exchange.size() + 1 + m.routing_key.size() + 1;
  // class, weight, body size, flags, then the properties.
  const size_t header_size = 2 + 2 + 8 + 2 + 1 + kPostContentType.size() + 1 +
                             kPostContentEncoding.size() + 1 + 1 + m.message_id.size();
  const size_t chunk_max = frame_max - kFrameOverhead;
  const size_t body_frames = (m.body.size() + chunk_max - 1) / chunk_max;
  const size_t total = kFrameOverhead + method_size + kFrameOverhead + header_size +
                       body_frames * kFrameOverhead + m.body.size();

  const size_t old_size = out->size();
  out->resize(old_size + total);
  Writer w(out->data() + old_size);

  w.FrameStart(kFrameMethod, m.channel, method_size);
  w.U16(kBasicClass);
  w.U16(kBasicPublishMethod);
  w.U16(0);  // reserved (ticket)
  w.ShortStr(m.exchange);
  w.ShortStr(m.routing_key);
  w.U8(m.mandatory ? 1 : 0);  // immediate (bit 1) is never set: RabbitMQ refuses it
  w.U8(kFrameEnd);

  w.FrameStart(kFrameHeader, m.channel, header_size);
  w.U16(kBasicClass);
  w.U16(0);  // weight
  w.U64(m.body.size());
  w.U16(kPostPropertyFlags);  // no flag past bit 1: no continuation word
  w.ShortStr(kPostContentType);
  w.ShortStr(kPostContentEncoding);
  w.U8(kPostDeliveryMode);
  w.ShortStr(m.message_id);
  w.U8(kFrameEnd);

  for (size_t offset = 0; offset < m.body.size();) {
    const size_t n = std::min(chunk_max, m.body.size() - offset);
    w.FrameStart(kFrameBody, m.channel, n);
    w.Bytes(m.body.substr(offset, n));
    w.U8(kFrameEnd);
    offset += n;
  }
  // Both sides of the write agree (the size computed is the size written).
  assert(w.position() == out->data() + out->size());
  return Status::Ok();
}

}  // namespace postspool::daemon
