// The post the harness makes, the same for every transport so that the
// figures compare like with like: a file written in a job's output tree
// (relPath with four directories), with size, mode, mtime and a sha512
// identity (64 bytes). ToClientPost gives it to libpostspool; EncodeV03
// gives the routing key and message body postspoold publishes for it, for
// the publishers that talk to the broker directly.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "post.h"
#include "postspool.h"
#include "v03_encoder.h"

namespace postspool::bench {

struct SamplePost {
  std::string rel_path;  // e.g. data/job0007/run03/output/file000123.nc
  int64_t size = 0;
  uint32_t mode = 0644;
  int64_t mtime_ns = 0;
  std::array<uint8_t, 64> sha512{};  // not a real digest: varied bytes of the right length
};

// The `index`-th post of client process `process`. Deterministic.
SamplePost MakeSamplePost(int process, int index);

// Fills `*post` (after postspool_post_init) to point into `sample`, which
// must outlive it.
void ToClientPost(const SamplePost& sample, struct postspool_post* post);

// What postspoold publishes for `sample` with id `id`: its base URL default
// ("file:/"), topic prefix "v03" and the broker user as "source".
v03::Encoded EncodeV03(const SamplePost& sample, PostId id, std::string_view source);

// A post id as the AMQP message_id postspoold sets (lower-case UUID form).
std::string MessageIdText(PostId id);
// libpostspool's result id (16 bytes, big-endian hi then lo) as a PostId,
// and back.
PostId PostIdFromBytes(const uint8_t bytes[16]);
void PostIdToBytes(PostId id, uint8_t bytes[16]);
// The inverse of MessageIdText; false if `text` is not in that form.
bool ParseMessageIdText(std::string_view text, PostId* id);

}  // namespace postspool::bench
