#include "segment_invariants.h"

#include <cstring>
#include <memory>

#include "fuzz_check.h"
#include "post.h"
#include "post_invariants.h"
#include "segment_format.h"
#include "segment_reader.h"
#include "status.h"

namespace postspool::fuzz {
namespace {

using segment::kHeaderBytes;
using segment::kRecordHeaderBytes;

// Everything the reader has accounted for so far is [start, covered):
// records and skipped ranges, reported in file order, each starting where
// the previous one ended.
struct Coverage {
  uint64_t file_bytes = 0;
  uint64_t covered = 0;
  uint64_t record_bytes = 0;
  uint64_t skipped_bytes = 0;
  bool budget_exhausted = false;

  void Skipped(uint64_t offset, uint64_t bytes, segment::SkipReason reason) {
    FUZZ_CHECK(std::strcmp(segment::SkipReasonName(reason), "unknown") != 0);
    FUZZ_CHECK(bytes > 0);
    FUZZ_CHECK(offset >= covered);   // in order, no overlap with what came before
    FUZZ_CHECK(offset == covered);   // and no byte dropped in between
    FUZZ_CHECK(offset + bytes > offset && offset + bytes <= file_bytes);
    FUZZ_CHECK(!budget_exhausted);   // exhausting the budget ends the read
    if (reason == segment::SkipReason::kScanBudgetExhausted) {
      FUZZ_CHECK(offset + bytes == file_bytes);
      budget_exhausted = true;
    }
    covered = offset + bytes;
    skipped_bytes += bytes;
  }
};

}  // namespace

SegmentReadSummary ReadSegmentChecked(std::span<const std::byte> file,
                                      const SegmentReadOptions& read_options) {
  SegmentReadSummary summary;
  segment::MemorySource source(file);
  const uint64_t start = read_options.start_offset != 0 ? read_options.start_offset : kHeaderBytes;
  Coverage coverage;
  coverage.file_bytes = file.size();
  coverage.covered = start;

  segment::ReaderOptions options;
  options.verify_payload = VerifyPostPayload;
  options.on_skip = [&coverage](uint64_t offset, uint64_t bytes, segment::SkipReason reason) {
    coverage.Skipped(offset, bytes, reason);
  };
  options.start_offset = read_options.start_offset;
  if (read_options.payload_max != 0) options.payload_max = read_options.payload_max;
  options.scan_bytes_max = read_options.scan_bytes_max;

  std::unique_ptr<segment::SegmentReader> reader;
  const Status open = segment::SegmentReader::Open(&source, options, &reader);
  bool header_ok = false;
  segment::Header header;
  if (file.size() >= kHeaderBytes) {
    header_ok = segment::DecodeHeader(file.first<kHeaderBytes>(), &header).ok();
  }
  FUZZ_CHECK(open.ok() == header_ok);
  if (!open.ok()) {
    FUZZ_CHECK(open.code() == StatusCode::kCorruption ||
               open.code() == StatusCode::kUnsupported);
    return summary;
  }
  summary.opened = true;
  FUZZ_CHECK(reader != nullptr);
  FUZZ_CHECK(reader->header().segment_id == header.segment_id);
  FUZZ_CHECK(reader->header().flags == header.flags);

  // Every record takes at least kRecordHeaderBytes, every skip at least one
  // byte of a scan step: this bound is loose, and only an endless loop
  // exceeds it.
  const uint64_t calls_max = file.size() / 8 + 2;
  uint64_t calls = 0;
  segment::Record record;
  for (;;) {
    FUZZ_CHECK(++calls <= calls_max);
    const segment::SegmentReader::Result r = reader->Next(&record);
    FUZZ_CHECK(r != segment::SegmentReader::Result::kIoError);  // memory never fails
    if (r == segment::SegmentReader::Result::kEnd) break;

    const uint64_t at = record.position.offset;
    const auto payload = record.payload;
    FUZZ_CHECK(!coverage.budget_exhausted);
    FUZZ_CHECK(record.position.segment_id == header.segment_id);
    FUZZ_CHECK(at >= kHeaderBytes && at >= start);
    FUZZ_CHECK(summary.record_offsets.empty() || at > summary.record_offsets.back());
    FUZZ_CHECK(at == coverage.covered);  // after any skip reported for the gap
    FUZZ_CHECK(payload.size() <= options.payload_max);
    FUZZ_CHECK(record.next_offset == at + segment::RecordBytes(payload.size()));
    FUZZ_CHECK(record.next_offset <= file.size());
    FUZZ_CHECK(reader->data_end() == record.next_offset);
    FUZZ_CHECK(reinterpret_cast<uintptr_t>(payload.data()) % 8 == 0);
    FUZZ_CHECK(payload.empty() ||
               std::memcmp(payload.data(), file.data() + at + kRecordHeaderBytes,
                           payload.size()) == 0);
    FUZZ_CHECK(VerifyPostPayload(payload));
    CheckVerifiedPost(payload);

    summary.record_offsets.push_back(at);
    summary.record_next_offsets.push_back(record.next_offset);
    coverage.covered = record.next_offset;
    coverage.record_bytes += record.next_offset - at;
  }
  // The end is sticky.
  FUZZ_CHECK(reader->Next(&record) == segment::SegmentReader::Result::kEnd);

  const uint64_t torn = reader->torn_tail_bytes();
  FUZZ_CHECK(reader->skipped_bytes() == coverage.skipped_bytes);
  FUZZ_CHECK(reader->data_end() <= file.size());
  // Nothing counted twice; and, since every byte after the header is a
  // record, a reported skip or the torn tail, nothing lost either.
  FUZZ_CHECK(start + coverage.record_bytes + coverage.skipped_bytes + torn <= file.size());
  FUZZ_CHECK(coverage.covered + torn == file.size());
  if (torn > 0) FUZZ_CHECK(reader->data_end() + torn == file.size());
  summary.budget_exhausted = coverage.budget_exhausted;
  return summary;
}

}  // namespace postspool::fuzz
