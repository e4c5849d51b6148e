// SHA-512 (FIPS 180-4), for the sha512 identity of `postspool post --file`:
// nettle's, behind the small interface the tool uses.
#pragma once

#include <nettle/sha2.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace postspool::cli {

class Sha512 {
 public:
  static constexpr size_t kDigestBytes = SHA512_DIGEST_SIZE;
  using Digest = std::array<uint8_t, kDigestBytes>;

  Sha512();
  void Update(const void* data, size_t bytes);
  // Finishes the hash; the object must not be updated afterwards.
  Digest Finish();

 private:
  sha512_ctx ctx_;
};

// The digest of `bytes`, as raw bytes.
std::string Sha512Of(std::string_view bytes);

}  // namespace postspool::cli
