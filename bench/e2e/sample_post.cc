#include "sample_post.h"

#include <time.h>

#include <cassert>
#include <cstdio>

namespace postspool::bench {
namespace {

// A fixed modification time (2024-05-01T12:00:00.123456789Z): the body's
// length then does not depend on when the harness runs.
constexpr int64_t kMtimeNs = 1714564800123456789;

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool IsDash(size_t i) { return i == 8 || i == 13 || i == 18 || i == 23; }

}  // namespace

SamplePost MakeSamplePost(int process, int index) {
  SamplePost s;
  char path[96];
  std::snprintf(path, sizeof path, "data/job%04d/run%02d/output/file%06d.nc", process % 10000,
                index % 8, index % 1000000);
  s.rel_path = path;
  uint64_t state = (static_cast<uint64_t>(process) << 32) ^ static_cast<uint64_t>(index);
  s.size = static_cast<int64_t>(4096 + SplitMix64(&state) % (64u << 20));
  s.mode = 0644;
  s.mtime_ns = kMtimeNs;
  for (size_t i = 0; i < s.sha512.size(); i += 8) {
    const uint64_t word = SplitMix64(&state);
    for (size_t b = 0; b < 8; ++b) s.sha512[i + b] = static_cast<uint8_t>(word >> (8 * b));
  }
  return s;
}

void ToClientPost(const SamplePost& sample, struct postspool_post* post) {
  post->rel_path = sample.rel_path.c_str();
  post->identity_method = POSTSPOOL_IDENTITY_SHA512;
  post->identity_value = sample.sha512.data();
  post->identity_size = sample.sha512.size();
  post->has_size = 1;
  post->size = sample.size;
  post->has_mode = 1;
  post->mode = sample.mode;
  post->has_mtime = 1;
  post->mtime_ns = sample.mtime_ns;
}

v03::Encoded EncodeV03(const SamplePost& sample, PostId id, std::string_view source) {
  PostData data;
  data.id = id;
  timespec now;
  ::clock_gettime(CLOCK_REALTIME, &now);
  data.pub_time_ns = int64_t{now.tv_sec} * 1000000000 + now.tv_nsec;
  data.base_url = "file:/";
  data.rel_path = sample.rel_path;
  data.identity_method = fb::IdentityMethod::Sha512;
  data.identity_value.assign(reinterpret_cast<const char*>(sample.sha512.data()),
                             sample.sha512.size());
  data.size = sample.size;
  data.mode = sample.mode;
  data.mtime_ns = sample.mtime_ns;
  flatbuffers::FlatBufferBuilder builder(1024);
  BuildPost(data, &builder);
  v03::EncodeOptions options;
  options.source = source;
  v03::Encoded out;
  const Status s = v03::Encode(*fb::GetPost(builder.GetBufferPointer()), options, &out);
  assert(s.ok() && "the sample post is a valid v03 post");
  s.IgnoreError();
  return out;
}

std::string MessageIdText(PostId id) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(36);
  for (int nibble = 0; nibble < 32; ++nibble) {
    if (IsDash(out.size())) out += '-';
    const uint64_t word = nibble < 16 ? id.hi : id.lo;
    out += kHex[(word >> (60 - 4 * (nibble % 16))) & 0xf];
  }
  return out;
}

PostId PostIdFromBytes(const uint8_t bytes[16]) {
  PostId id;
  for (int i = 0; i < 8; ++i) {
    id.hi = (id.hi << 8) | bytes[i];
    id.lo = (id.lo << 8) | bytes[8 + i];
  }
  return id;
}

void PostIdToBytes(PostId id, uint8_t bytes[16]) {
  for (int i = 0; i < 8; ++i) {
    bytes[i] = static_cast<uint8_t>(id.hi >> (56 - 8 * i));
    bytes[8 + i] = static_cast<uint8_t>(id.lo >> (56 - 8 * i));
  }
}

bool ParseMessageIdText(std::string_view text, PostId* id) {
  if (text.size() != 36) return false;
  PostId out;
  int nibble = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (IsDash(i)) {
      if (text[i] != '-') return false;
      continue;
    }
    const int v = HexValue(text[i]);
    if (v < 0) return false;
    uint64_t& word = nibble < 16 ? out.hi : out.lo;
    word = (word << 4) | static_cast<uint64_t>(v);
    ++nibble;
  }
  *id = out;
  return true;
}

}  // namespace postspool::bench
