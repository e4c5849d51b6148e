#include "base64.h"

#include <nettle/base64.h>

#include <cstdint>

namespace postspool::cli {

std::string Base64Encode(std::string_view bytes) {
  std::string out(BASE64_ENCODE_RAW_LENGTH(bytes.size()), '\0');
  base64_encode_raw(out.data(), bytes.size(), reinterpret_cast<const uint8_t*>(bytes.data()));
  return out;
}

bool Base64Decode(std::string_view text, std::string* bytes) {
  // nettle's decoder is lenient (it skips whitespace, takes missing
  // padding); the canonical form is checked by encoding the result again.
  if (text.size() % 4 != 0) return false;
  base64_decode_ctx ctx;
  base64_decode_init(&ctx);
  std::string out(BASE64_DECODE_LENGTH(text.size()), '\0');
  size_t n = out.size();
  if (base64_decode_update(&ctx, &n, reinterpret_cast<uint8_t*>(out.data()), text.size(),
                           text.data()) == 0 ||
      base64_decode_final(&ctx) == 0) {
    return false;
  }
  out.resize(n);
  if (Base64Encode(out) != text) return false;
  *bytes = std::move(out);
  return true;
}

}  // namespace postspool::cli
