// Invariants of a Post payload that VerifyPostPayload accepted, shared by
// all fuzz targets: whatever the bytes, reading it and encoding it as v03 is
// safe, and the encoder's output is always something a broker and a
// Sarracenia subscriber can take.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

namespace postspool::fuzz {

// Runs ReadPost and v03::Encode over `payload` (which VerifyPostPayload
// accepted and which is 8-byte aligned in memory) and traps unless:
//  - Encode returns ok or kInvalidArgument;
//  - a post that ValidatePost accepts is encoded (ok), and its rel_path,
//    hlink and rename are normalised, its size is not negative and its
//    extra keys are unique and not v03 field names;
//  - on ok: the routing key is at most v03::kRoutingKeyBytesMax bytes and
//    starts with the topic prefix; the body is pure ASCII and one
//    well-formed JSON object;
//  - encoding again into a reused Encoded gives the same bytes.
void CheckVerifiedPost(std::span<const std::byte> payload);

// True if `text` is exactly one JSON object (RFC 8259), with nothing but
// whitespace around it. Nesting deeper than 32 levels counts as malformed.
bool IsJsonObject(std::string_view text);

}  // namespace postspool::fuzz
