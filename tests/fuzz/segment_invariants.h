// Reads a whole segment image through SegmentReader and traps on any
// violation of the reader's contract (segment_reader.h, FORMAT.md
// "Reading"). Shared by fuzz_segment_reader and fuzz_segment_records.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace postspool::fuzz {

// The ReaderOptions that a target may vary (0: the reader's default).
struct SegmentReadOptions {
  uint64_t start_offset = 0;
  uint32_t payload_max = 0;
  uint64_t scan_bytes_max = 0;
};

struct SegmentReadSummary {
  bool opened = false;
  std::vector<uint64_t> record_offsets;       // of the records handed out, in order
  std::vector<uint64_t> record_next_offsets;  // their next_offset
  bool budget_exhausted = false;              // a kScanBudgetExhausted skip ended the read
};

// Opens `file` (a MemorySource) with VerifyPostPayload and an on_skip
// callback, reads to the end and checks:
//  - Open fails only with kCorruption or kUnsupported, and exactly when the
//    file is shorter than a header or DecodeHeader rejects its header;
//  - Next() terminates: at most file.size() / 8 + 2 calls, then kEnd (again
//    on a further call), never kIoError;
//  - records come in strictly increasing offset order, at or after
//    kHeaderBytes (and the start offset), with payloads that are 8-byte aligned in memory, equal to
//    the file's bytes, within payload_max, and accepted by the verifier; each
//    verified Post passes CheckVerifiedPost;
//  - skipped ranges are reported in file order, never empty, and never
//    overlap each other or a record;
//  - header (or everything before the start offset) + records + skipped
//    ranges + torn tail cover the file exactly (no byte is both, none is
//    silently dropped), and the torn tail starts at data_end().
SegmentReadSummary ReadSegmentChecked(std::span<const std::byte> file,
                                      const SegmentReadOptions& read_options);

}  // namespace postspool::fuzz
