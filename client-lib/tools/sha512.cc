#include "sha512.h"

namespace postspool::cli {

Sha512::Sha512() { sha512_init(&ctx_); }

void Sha512::Update(const void* data, size_t bytes) {
  sha512_update(&ctx_, bytes, static_cast<const uint8_t*>(data));
}

Sha512::Digest Sha512::Finish() {
  Digest d;
  sha512_digest(&ctx_, d.size(), d.data());
  return d;
}

std::string Sha512Of(std::string_view bytes) {
  Sha512 h;
  h.Update(bytes.data(), bytes.size());
  const Sha512::Digest d = h.Finish();
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

}  // namespace postspool::cli
