// Stamping a post's origin (and a default base URL) without rebuilding it.
//
// The daemon stamps every post it journals with the origin it trusts (the
// socket credentials, or the spool file's owner) and its host name. Reading a
// post into PostData and building it again would drop every field that a
// newer schema added and this daemon does not know (FORMAT.md, "Schema
// evolution"). Instead the client's bytes are kept as they are: a new
// Origin table (and, for an empty base URL, a new string) is appended after
// them, and the post's field offset is pointed at it. The old origin, if
// any, stays behind unreferenced. This needs the post's `origin` slot to be
// present in its vtable (BuildPost always writes one, possibly empty, for
// that reason); without it nothing can be pointed anywhere, and the caller
// rebuilds the post instead.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace postspool {

struct StampedOrigin {
  std::optional<uint32_t> uid;
  std::optional<uint32_t> gid;
  std::optional<int32_t> pid;
  std::string_view host;
};

// `payload` must have passed VerifyPostPayload. On success *out holds the
// stamped payload (which also passes it) and true is returned; false when
// the post has no origin slot (or no room for the result in one record),
// *out is then unspecified. `default_base_url` replaces an empty base URL.
bool StampPostInPlace(std::span<const std::byte> payload, const StampedOrigin& origin,
                      std::string_view default_base_url, std::vector<std::byte>* out);

// True if the post's vtable has slots this build's schema does not know:
// rebuilding it through PostData would lose them.
bool PostHasUnknownFields(std::span<const std::byte> payload);

}  // namespace postspool
