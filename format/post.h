// A Post in plain C++ (PostData), its FlatBuffers encoding, and the payload
// verifier that every reader runs before it trusts a record. The schema is
// post.fbs; post_generated.h is generated from it at build time.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "post_generated.h"
#include "status.h"

namespace postspool {

struct PostId {
  uint64_t hi = 0;
  uint64_t lo = 0;
  friend bool operator==(const PostId&, const PostId&) = default;
  friend auto operator<=>(const PostId&, const PostId&) = default;
};

// A random (version 4 layout) 128-bit id from getrandom.
PostId NewPostId();

struct PostData {
  PostId id;
  int64_t pub_time_ns = 0;
  std::string base_url;
  std::string rel_path;
  std::optional<std::string> retrieve_path;
  // fileOp
  std::optional<std::string> link;
  std::optional<std::string> hlink;
  std::optional<std::string> rename;
  bool remove = false;
  bool directory = false;
  // identity
  fb::IdentityMethod identity_method = fb::IdentityMethod::None;
  std::string identity_value;  // raw digest bytes or text, see post.fbs
  std::optional<int64_t> size;
  std::optional<uint32_t> mode;
  std::optional<int64_t> mtime_ns;
  std::optional<int64_t> atime_ns;
  std::vector<std::pair<std::string, std::string>> extras;
  // origin (stamped by the daemon)
  std::optional<uint32_t> origin_uid;
  std::optional<uint32_t> origin_gid;
  std::optional<int32_t> origin_pid;
  std::optional<std::string> origin_host;

  friend bool operator==(const PostData&, const PostData&) = default;
};

// Field limits checked by ValidatePost; a Post that passes always fits in one
// record (kRecordPayloadMax).
inline constexpr size_t kPathBytesMax = 4096;      // rel_path, retrieve_path, link, ...
inline constexpr size_t kBaseUrlBytesMax = 1024;
inline constexpr size_t kExtrasMax = 32;
inline constexpr size_t kExtraBytesMax = 1024;     // key + value of one extra
inline constexpr size_t kIdentityBytesMax = 256;

// What a post may say: the one check that the client library applies before
// it sends or spools a post and the daemon applies to every post it takes,
// whatever the transport. kInvalidArgument, with the field named, for:
//  - an empty rel_path, a field above its limit, a NUL byte in a path or an
//    extra field;
//  - a rel_path, hlink or rename that is not normalised: an empty component
//    ("a//b", a trailing '/'), or a "." or ".." component. One leading '/'
//    is allowed and means the same path without it (FORMAT.md, "Post
//    limits");
//  - an identity value of the wrong length for its digest (sha512: 64
//    bytes, md5: 16), or empty;
//  - a negative size; a mode with bits outside 07777;
//  - an extra field whose key is empty, a Sarracenia v03 field name
//    (v03_fields.h), or the key of an earlier extra field.
// An empty base_url is valid: the daemon fills in its post_baseUrl.
Status ValidatePost(const PostData& post);

// Serialises `post` into `builder` (cleared first) and finishes the buffer
// with the file identifier. builder.GetBufferSpan() is then the payload.
void BuildPost(const PostData& post, flatbuffers::FlatBufferBuilder* builder);

// Reads a verified Post back into plain data.
PostData ReadPost(const fb::Post& post);

// The payload verifier for records that carry a Post: the FlatBuffers
// verifier (with the file identifier) plus the required fields. Never reads
// outside `payload`. The payload must be 8-byte aligned in memory (records
// from SegmentReader are); a misaligned one is rejected.
bool VerifyPostPayload(std::span<const std::byte> payload);

// The Post in a payload that VerifyPostPayload accepted.
inline const fb::Post& PostFromPayload(std::span<const std::byte> payload) {
  return *fb::GetPost(payload.data());
}

}  // namespace postspool
