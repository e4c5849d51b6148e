#include "amqp_properties.h"

namespace postspool::daemon {
namespace {

constexpr char kHex[] = "0123456789abcdef";
// Where the dashes go in the 36 characters.
constexpr bool IsDash(size_t i) { return i == 8 || i == 13 || i == 18 || i == 23; }

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

MessageId FormatMessageId(PostId id) {
  MessageId out;
  size_t nibble = 0;  // 0..31: hi's 16 nibbles, then lo's
  for (size_t i = 0; i < kMessageIdChars; ++i) {
    if (IsDash(i)) {
      out[i] = '-';
      continue;
    }
    const uint64_t word = nibble < 16 ? id.hi : id.lo;
    const unsigned shift = static_cast<unsigned>(60 - 4 * (nibble % 16));
    out[i] = kHex[(word >> shift) & 0xf];
    ++nibble;
  }
  return out;
}

bool ParseMessageId(std::string_view text, PostId* id) {
  if (text.size() != kMessageIdChars) return false;
  uint64_t words[2] = {0, 0};
  size_t nibble = 0;
  for (size_t i = 0; i < kMessageIdChars; ++i) {
    if (IsDash(i)) {
      if (text[i] != '-') return false;
      continue;
    }
    const int v = HexValue(text[i]);
    if (v < 0) return false;
    words[nibble / 16] = words[nibble / 16] << 4 | static_cast<uint64_t>(v);
    ++nibble;
  }
  *id = PostId{words[0], words[1]};
  return true;
}

}  // namespace postspool::daemon
