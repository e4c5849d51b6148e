// SegmentReader: yields the valid records of one segment, in file order.
//
// Contract (FORMAT.md, "Reading"):
//  - a torn tail (bytes after the last valid record that no valid record
//    follows) is the end of data; it is not reported as damage, only
//    measured (torn_tail_bytes());
//  - damage in the middle is skipped by resynchronising to the next valid
//    record (searched at every byte offset), and every skipped byte range is
//    reported to on_skip with a reason;
//  - every payload passes the payload verifier (the FlatBuffers verifier for
//    a Post, by default) before it is handed out;
//  - memory is bounded (one window of a few hundred KiB) and the work is
//    bounded (scan_bytes_max), whatever the input.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "segment_format.h"
#include "status.h"

namespace postspool::segment {

// Random-access bytes of one segment.
class Source {
 public:
  virtual ~Source() = default;
  // The number of bytes the reader may look at (a snapshot: bytes appended
  // later are not read).
  virtual uint64_t size() const = 0;
  // Reads up to out.size() bytes at `offset`; *got is smaller only at the end.
  virtual Status ReadAt(uint64_t offset, std::span<std::byte> out, size_t* got) = 0;
  // Takes a new snapshot of the size, capped at `size_max`, for a segment
  // that is still written to: true if size() is now that snapshot, false
  // (and size() unchanged) where the source cannot grow or would shrink.
  virtual bool Grow(uint64_t size_max) {
    (void)size_max;
    return false;
  }
};

// Reads a file through pread. The descriptor is borrowed and must remain open
// while the source is used; its size is taken once, at Open, and capped at
// `size_max` (a reader must not look past what is known to be complete).
class FileSource final : public Source {
 public:
  static Status Open(int fd, std::unique_ptr<FileSource>* out, uint64_t size_max = UINT64_MAX);
  uint64_t size() const override { return size_; }
  Status ReadAt(uint64_t offset, std::span<std::byte> out, size_t* got) override;
  bool Grow(uint64_t size_max) override;

 private:
  FileSource(int fd, uint64_t size) : fd_(fd), size_(size) {}
  int fd_;
  uint64_t size_;
};

// Reads bytes in memory, which must outlive the source: the first `size` of
// them (all by default), as a file being written shows its first bytes;
// Grow shows more of them.
class MemorySource final : public Source {
 public:
  explicit MemorySource(std::span<const std::byte> bytes, uint64_t size = UINT64_MAX)
      : bytes_(bytes), size_(std::min<uint64_t>(bytes.size(), size)) {}
  uint64_t size() const override { return size_; }
  Status ReadAt(uint64_t offset, std::span<std::byte> out, size_t* got) override;
  bool Grow(uint64_t size_max) override;

 private:
  std::span<const std::byte> bytes_;
  uint64_t size_;
};

enum class SkipReason {
  kBadMarker,           // bytes where a record should start are not a record
  kBadLength,           // a record header claims more than the payload maximum
  kTruncated,           // a record header claims more bytes than follow it
  kChecksumMismatch,    // a record's bytes do not match its checksum
  kInvalidPayload,      // the framing is intact but the payload fails the verifier
  kScanBudgetExhausted, // resynchronisation work exceeded scan_bytes_max
};
const char* SkipReasonName(SkipReason reason);

struct Position {
  uint64_t segment_id = 0;
  uint64_t offset = 0;  // of the record's first byte in the segment file
  friend bool operator==(const Position&, const Position&) = default;
};

struct Record {
  Position position;
  // Valid until the next call to Next(). 8-byte aligned in memory.
  std::span<const std::byte> payload;
  uint64_t next_offset = 0;  // offset just past this record
};

using PayloadVerifier = bool (*)(std::span<const std::byte> payload);

struct ReaderOptions {
  // Required: checks a payload before it is handed out (VerifyPostPayload).
  PayloadVerifier verify_payload = nullptr;
  // Called once for every skipped byte range, in file order.
  std::function<void(uint64_t offset, uint64_t bytes, SkipReason reason)> on_skip;
  // Where to start (a record boundary, such as a Record::next_offset); 0
  // means the first record after the header.
  uint64_t start_offset = 0;
  uint32_t payload_max = kRecordPayloadMax;
  // Upper bound on the work of the whole read: bytes examined while
  // resynchronising plus bytes hashed while checking records; 0 means
  // 2 * size + 64 MiB, which valid data never reaches.
  uint64_t scan_bytes_max = 0;
  // Upper bound on the work of one Next() call (same units); when it is
  // reached, Next() returns kYield and the next call goes on where it
  // stopped. 0: no bound. A caller that must not stall (the daemon's ingest
  // loop) sets it.
  uint64_t step_bytes_max = 0;
};

class SegmentReader {
 public:
  // Reads and checks the header. `source` must outlive the reader.
  // kCorruption for a damaged or truncated header, kUnsupported for a newer
  // format version: the whole file is unreadable and should be quarantined.
  static Status Open(Source* source, ReaderOptions options,
                     std::unique_ptr<SegmentReader>* out);

  enum class Result { kRecord, kEnd, kIoError, kYield };
  // The next valid record, or kEnd, or kIoError (see io_status()), or
  // kYield (step_bytes_max reached; call again).
  Result Next(Record* record);

  // The source grew (Source::Grow): reading goes on up to its new size
  // instead of ending at the old one, as a reader opened on the grown
  // source at this reader's position would. Only where the old size ended
  // cleanly (no torn tail, no resynchronisation in progress); false
  // otherwise, and the caller opens a new reader.
  bool Grow();

  const Header& header() const { return header_; }
  const Status& io_status() const { return io_status_; }
  // Offset just past the last valid record read so far.
  uint64_t data_end() const { return data_end_; }
  // After kEnd: bytes after the last valid record that no record follows.
  uint64_t torn_tail_bytes() const { return torn_tail_bytes_; }
  uint64_t skipped_bytes() const { return skipped_bytes_; }
  // A read found less than the source's size snapshot promised: the file
  // was cut short while it was read (what is missing shows as damage).
  bool source_shrank() const { return source_shrank_; }

 private:
  SegmentReader(Source* source, ReaderOptions options, Header header);
  // Up to `n` bytes at `offset` (fewer at the end of data), through the window.
  Status Fetch(uint64_t offset, size_t n, std::span<const std::byte>* out);
  // Checks the record framing at `offset`, charging the scan budget.
  Status Check(uint64_t offset, FrameCheck* check, uint32_t* payload_bytes);
  void Skip(uint64_t offset, uint64_t bytes, SkipReason reason);
  // Damage starts at pos_: finds the next valid record and reports the gap,
  // or takes the rest as the torn tail. Resumable after kYield.
  Result Resync(FrameCheck first_failure);
  // Where the zero bytes at the end of the record at `record` (which ends
  // at pos_) begin; pos_ + 1 if it ends with no zero byte.
  uint64_t TrailingZeros(uint64_t record);
  bool StepBudgetSpent() const {
    return options_.step_bytes_max != 0 && scan_bytes_ - step_start_ >= options_.step_bytes_max;
  }

  Source* source_;
  ReaderOptions options_;
  bool scan_budget_from_size_ = false;  // scan_bytes_max was 0: it follows size_
  Header header_;
  uint64_t size_;
  uint64_t pos_;
  uint64_t data_end_;
  // Where the last valid record starts (UINT64_MAX: none yet).
  uint64_t last_record_ = UINT64_MAX;
  uint64_t scan_bytes_ = 0;
  uint64_t step_start_ = 0;  // scan_bytes_ when the current Next() call began
  // A resynchronisation in progress (after kYield): where the damage
  // started, why, and the next offset to try.
  bool resyncing_ = false;
  uint64_t resync_damaged_ = 0;
  FrameCheck resync_failure_ = FrameCheck::kValid;
  uint64_t resync_next_ = 0;
  uint64_t torn_tail_bytes_ = 0;
  uint64_t skipped_bytes_ = 0;
  bool done_ = false;
  bool source_shrank_ = false;
  Status io_status_;
  std::vector<std::byte> window_;
  uint64_t window_offset_ = 0;
  size_t window_bytes_ = 0;
};

}  // namespace postspool::segment
