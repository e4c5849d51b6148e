// The names Sarracenia gives a meaning in a v03 message: the one list that
// ValidatePost (what a post may say) and the v03 encoder both use, so that
// the client library, the daemon's ingest and the encoder give one answer.
//
// An extra field must not use one of them: a subscriber would take it for
// the standard field (or for its own bookkeeping) rather than for free text.
// Sources: Sarracenia's sr_post(7) manual (the v03 message format) and
// sarracenia/postformat/v03.py (the earlier names it still reads), plus the
// names sr3's in-memory Message keeps next to the body fields, which a body
// member of the same name would be confused with.
#pragma once

#include <string_view>

namespace postspool::v03 {

inline constexpr std::string_view kReservedFieldNames[] = {
    // The body fields this project writes (FORMAT.md, "v03 encoding").
    "pubTime", "baseUrl", "relPath", "retrievePath", "fileOp", "identity", "size", "mode",
    "mtime", "atime", "source",
    // The other fields sr_post(7) defines for a v03 body.
    "blocks", "content", "contentType", "rename", "from_cluster", "to_clusters", "topic",
    "subtopic", "report", "type", "geometry",
    // Earlier names that v03.py reads as a standard field: integrity is
    // identity, retPath is retrievePath, parts becomes size or blocks.
    "integrity", "retPath", "parts",
    // sr3's in-memory bookkeeping of a received message (where it came
    // from, where it goes next): a body member with one of these names
    // would steer the subscriber.
    "exchange", "local_offset", "ack_id", "subscription_index", "post_format", "post_baseUrl",
    "new_dir", "new_file", "new_relPath", "new_baseUrl", "new_subtopic",
};

// True for a name in kReservedFieldNames and for any name that starts with
// '_', the prefix of sr3's private message fields (_format, _deleteOnPost,
// ...). Case-sensitive, as JSON member names are.
constexpr bool IsReservedFieldName(std::string_view name) {
  if (name.starts_with('_')) return true;
  for (const std::string_view reserved : kReservedFieldNames) {
    if (name == reserved) return true;
  }
  return false;
}

}  // namespace postspool::v03
