// The AMQP basic properties of a published post, and the post id as the
// message_id property: a lower-case UUID string, 8-4-4-4-12 hex digits of
// the 128-bit id (hi then lo, big-endian), e.g.
//   PostId{0x0123456789abcdef, 0xfedcba9876543210}
//   -> "01234567-89ab-cdef-fedc-ba9876543210"
// Consumers drop duplicates by it; a basic.return is matched to its post by
// it.
#pragma once

#include <array>
#include <string_view>

#include "post.h"

namespace postspool::daemon {

inline constexpr std::string_view kPostContentType = "application/json";
inline constexpr std::string_view kPostContentEncoding = "utf-8";
inline constexpr uint8_t kPostDeliveryMode = 2;  // persistent

inline constexpr size_t kMessageIdChars = 36;
using MessageId = std::array<char, kMessageIdChars>;

MessageId FormatMessageId(PostId id);
inline std::string_view View(const MessageId& m) { return {m.data(), m.size()}; }
// Parses the form FormatMessageId writes (upper-case hex digits accepted);
// false for anything else.
bool ParseMessageId(std::string_view text, PostId* id);

}  // namespace postspool::daemon
