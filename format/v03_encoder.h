// The Sarracenia v03 encoding of a Post: the AMQP routing key and the JSON
// message body, as Sarracenia's own posters produce them (FORMAT.md, "v03
// encoding", is the specification, with every choice where Sarracenia's
// implementations differ). Runs once per post published: no allocation once
// the output strings have grown to size.
#pragma once

#include <string>
#include <string_view>

#include "post_generated.h"
#include "status.h"

namespace postspool::v03 {

// The AMQP short-string limit.
inline constexpr size_t kRoutingKeyBytesMax = 255;

struct EncodeOptions {
  // Words before the directories of relPath (Sarracenia's post_topicPrefix),
  // already dot-separated, e.g. "v03".
  std::string_view topic_prefix = "v03";
  // The body's "source" field (Sarracenia sets the broker user); omitted
  // when empty.
  std::string_view source;
  // The baseUrl of a post that has none (or an empty one): the daemon's
  // post_baseUrl, for a post that reached the journal without it.
  std::string_view base_url_default;
};

struct Encoded {
  std::string routing_key;
  std::string body;
};

// Encodes a verified Post. `out`'s strings are overwritten, their capacity
// reused. kInvalidArgument if an extra field's key is a Sarracenia v03 field
// name (v03_fields.h, the list ValidatePost uses): it would make the body
// ambiguous.
Status Encode(const fb::Post& post, const EncodeOptions& options, Encoded* out);

// The v03 time format: "YYYYMMDDTHHMMSS.fraction", UTC, the fraction in
// nanoseconds with trailing zeros dropped (no '.' when it is zero). Appends
// to `out`.
void AppendV03Time(int64_t unix_ns, std::string* out);

}  // namespace postspool::v03
