// How many records a damaged byte range of a segment held: what damage cost
// in posts, which byte ranges alone do not say. One function for every
// reader that reports damage (postspool verify and scan, the daemon's
// journal reader and spool adoption), so that they count alike.
#pragma once

#include <cstdint>

#include "segment_reader.h"

namespace postspool::segment {

// The record markers found in the `bytes` at `offset` of `source` where a
// record can start (8-byte aligned, the marker after the 8-byte checksum).
// A record whose marker itself was hit is not seen, so this is a lower
// bound; garbage between records costs none. Reads at most `bytes` (in
// 64 KiB steps); a read error ends the count there.
uint64_t CountLostRecords(Source* source, uint64_t offset, uint64_t bytes);

}  // namespace postspool::segment
