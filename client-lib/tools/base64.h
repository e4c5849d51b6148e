// Base64 (RFC 4648, standard alphabet, with padding), as v03 carries
// identity digests.
#pragma once

#include <string>
#include <string_view>

namespace postspool::cli {

std::string Base64Encode(std::string_view bytes);
// Strict: the standard alphabet, '=' padding to a multiple of 4 characters,
// no whitespace, zero bits after the last byte. False for anything else.
bool Base64Decode(std::string_view text, std::string* bytes);

}  // namespace postspool::cli
