// SHA-512 (FIPS 180-4), for the sha512 identity of `postspool post --file`.
// The project has no crypto library among its dependencies, and the tool
// needs only this one digest.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace postspool::cli {

class Sha512 {
 public:
  static constexpr size_t kDigestBytes = 64;
  using Digest = std::array<uint8_t, kDigestBytes>;

  Sha512();
  void Update(const void* data, size_t bytes);
  // Finishes the hash; the object must not be updated afterwards.
  Digest Finish();

 private:
  void Compress(const uint8_t* block);

  std::array<uint64_t, 8> state_;
  std::array<uint8_t, 128> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;  // messages above 2^64 bytes are not a concern here
};

// The digest of `bytes`, as raw bytes.
std::string Sha512Of(std::string_view bytes);

}  // namespace postspool::cli
