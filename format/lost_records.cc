#include "lost_records.h"

#include <algorithm>
#include <span>
#include <vector>

#include "little_endian.h"
#include "segment_format.h"

namespace postspool::segment {

uint64_t CountLostRecords(Source* source, uint64_t offset, uint64_t bytes) {
  uint64_t found = 0;
  std::vector<std::byte> buf(64 * 1024 + kRecordHeaderBytes);
  const uint64_t end = std::min(offset + bytes, source->size());
  uint64_t at = (offset + kRecordAlign - 1) / kRecordAlign * kRecordAlign;
  while (at + 12 <= end) {
    const uint64_t want = std::min<uint64_t>(buf.size(), end - at);
    size_t got = 0;
    if (!source->ReadAt(at, std::span(buf.data(), want), &got).ok() || got == 0) break;
    uint64_t i = 0;
    for (; i + 12 <= got; i += kRecordAlign) {
      if (LoadLe32(buf.data() + i + 8) == kRecordMarker) ++found;
    }
    if (got < want) break;
    at += std::max<uint64_t>(i, kRecordAlign);
  }
  return found;
}

}  // namespace postspool::segment
