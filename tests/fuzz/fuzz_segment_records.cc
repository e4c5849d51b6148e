// Fuzz target: the input is everything after the header of a segment. A
// fixed, valid header is put in front of it, so that every input reaches the
// record framing, resynchronisation and payload verification.
//
// Each input is read four times under all the invariants of
// ReadSegmentChecked, and once more through a growing source, and the reads
// are compared:
//  - with the default options;
//  - with a small scan budget: running out of it may only cut the read
//    short, so its records are a prefix of the first read's;
//  - resumed at the next_offset of the middle record (as the daemon resumes
//    from its watermark): the same records follow as in the first read;
//  - with a small payload_max, which shrinks the reader's window to a few
//    KiB, so that small inputs cross window refills;
//  - cut at the next_offset of the middle record (a commit, as the daemon's
//    forwarder sees the journal), read to its end, then grown to the whole
//    file (MemorySource::Grow, SegmentReader::Grow) and read on: the same records
//    as the first read.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "fuzz_check.h"
#include "post.h"
#include "segment_format.h"
#include "segment_invariants.h"
#include "segment_reader.h"

namespace {

namespace segment = postspool::segment;
using postspool::fuzz::ReadSegmentChecked;
using postspool::fuzz::SegmentReadOptions;

constexpr uint64_t kSmallScanBytesMax = 4096;
constexpr uint32_t kSmallPayloadMax = 512;

// Offsets of the records `reader` hands out until kEnd.
void ReadOffsets(segment::SegmentReader* reader, size_t calls_max, std::vector<uint64_t>* out) {
  segment::Record rec;
  for (size_t calls = 0;; ++calls) {
    FUZZ_CHECK(calls <= calls_max);
    const auto r = reader->Next(&rec);
    if (r != segment::SegmentReader::Result::kRecord) {
      FUZZ_CHECK(r == segment::SegmentReader::Result::kEnd);
      return;
    }
    out->push_back(rec.position.offset);
  }
}

std::array<std::byte, segment::kHeaderBytes> FixedHeader() {
  segment::Header header;
  header.segment_id = 0x5053'5345'4746'555aULL;
  header.created_unix_ns = 1'700'000'000'000'000'000;
  header.creator_uid = 1000;
  header.creator_gid = 1000;
  header.creator_pid = 4242;
  header.host = "fuzzhost";
  std::array<std::byte, segment::kHeaderBytes> raw;
  segment::EncodeHeader(header, raw);
  return raw;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::array<std::byte, segment::kHeaderBytes> header = FixedHeader();
  static std::vector<std::byte> file;
  file.assign(header.begin(), header.end());
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  file.insert(file.end(), bytes, bytes + size);

  const auto full = ReadSegmentChecked(file, SegmentReadOptions{});
  FUZZ_CHECK(full.opened);
  FUZZ_CHECK(!full.budget_exhausted);  // the default budget is never reached

  SegmentReadOptions small_budget;
  small_budget.scan_bytes_max = kSmallScanBytesMax;
  const auto cut = ReadSegmentChecked(file, small_budget);
  FUZZ_CHECK(cut.opened);
  FUZZ_CHECK(cut.record_offsets.size() <= full.record_offsets.size());
  FUZZ_CHECK(std::equal(cut.record_offsets.begin(), cut.record_offsets.end(),
                        full.record_offsets.begin()));
  if (!cut.budget_exhausted) FUZZ_CHECK(cut.record_offsets == full.record_offsets);

  if (!full.record_offsets.empty()) {
    const size_t middle = full.record_offsets.size() / 2;
    SegmentReadOptions resume;
    resume.start_offset = full.record_next_offsets[middle];
    const auto rest = ReadSegmentChecked(file, resume);
    FUZZ_CHECK(rest.opened);
    FUZZ_CHECK(std::equal(rest.record_offsets.begin(), rest.record_offsets.end(),
                          full.record_offsets.begin() + static_cast<ptrdiff_t>(middle) + 1,
                          full.record_offsets.end()));
  }

  if (!full.record_offsets.empty()) {
    const uint64_t commit = full.record_next_offsets[full.record_offsets.size() / 2];
    segment::MemorySource source(file, commit);
    segment::ReaderOptions options;
    options.verify_payload = postspool::VerifyPostPayload;
    std::unique_ptr<segment::SegmentReader> reader;
    FUZZ_CHECK(segment::SegmentReader::Open(&source, options, &reader).ok());
    std::vector<uint64_t> offsets;
    ReadOffsets(reader.get(), file.size() / 8 + 2, &offsets);
    FUZZ_CHECK(reader->torn_tail_bytes() == 0);  // it ended at a record's end
    FUZZ_CHECK(source.Grow(file.size()));
    FUZZ_CHECK(reader->Grow());
    ReadOffsets(reader.get(), file.size() / 8 + 2, &offsets);
    FUZZ_CHECK(offsets == full.record_offsets);
  }

  SegmentReadOptions narrow;
  narrow.payload_max = kSmallPayloadMax;
  FUZZ_CHECK(ReadSegmentChecked(file, narrow).opened);
  return 0;
}
