#include "segment_reader.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>

namespace postspool::segment {

Status FileSource::Open(int fd, std::unique_ptr<FileSource>* out, uint64_t size_max) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::FromErrno(errno, "fstat segment");
  out->reset(new FileSource(fd, std::min(static_cast<uint64_t>(st.st_size), size_max)));
  return Status::Ok();
}

bool FileSource::Grow(uint64_t size_max) {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return false;
  const uint64_t size = std::min(static_cast<uint64_t>(st.st_size), size_max);
  if (size < size_) return false;
  size_ = size;
  return true;
}

Status FileSource::ReadAt(uint64_t offset, std::span<std::byte> out, size_t* got) {
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd_, out.data() + done, out.size() - done,
                              static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      *got = done;
      return Status::FromErrno(errno, "read segment");
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  *got = done;
  return Status::Ok();
}

Status MemorySource::ReadAt(uint64_t offset, std::span<std::byte> out, size_t* got) {
  if (offset >= size_) {
    *got = 0;
    return Status::Ok();
  }
  const size_t n = static_cast<size_t>(std::min<uint64_t>(out.size(), size_ - offset));
  std::memcpy(out.data(), bytes_.data() + offset, n);
  *got = n;
  return Status::Ok();
}

bool MemorySource::Grow(uint64_t size_max) {
  const uint64_t size = std::min<uint64_t>(bytes_.size(), size_max);
  if (size < size_) return false;
  size_ = size;
  return true;
}

const char* SkipReasonName(SkipReason reason) {
  switch (reason) {
    case SkipReason::kBadMarker: return "bad record marker";
    case SkipReason::kBadLength: return "record length above maximum";
    case SkipReason::kTruncated: return "record extends past its successor";
    case SkipReason::kChecksumMismatch: return "record checksum mismatch";
    case SkipReason::kInvalidPayload: return "payload failed verification";
    case SkipReason::kScanBudgetExhausted: return "resynchronisation budget exhausted";
  }
  return "unknown";
}

Status SegmentReader::Open(Source* source, ReaderOptions options,
                           std::unique_ptr<SegmentReader>* out) {
  assert(options.verify_payload != nullptr);
  if (options.payload_max > kRecordPayloadMax) {
    return Status(StatusCode::kInvalidArgument, "payload_max above the format maximum");
  }
  std::array<std::byte, kHeaderBytes> raw;
  size_t got = 0;
  if (Status s = source->ReadAt(0, raw, &got); !s.ok()) return s;
  if (got < kHeaderBytes) {
    return Status(StatusCode::kCorruption, "segment header truncated (" + std::to_string(got) +
                                               " of " + std::to_string(kHeaderBytes) + " bytes)");
  }
  Header header;
  if (Status s = DecodeHeader(raw, &header); !s.ok()) return s;
  if (options.start_offset == 0) options.start_offset = kHeaderBytes;
  if (options.start_offset < kHeaderBytes) {
    return Status(StatusCode::kInvalidArgument,
                  "start offset " + std::to_string(options.start_offset) +
                      " is not a record boundary");
  }
  out->reset(new SegmentReader(source, std::move(options), std::move(header)));
  return Status::Ok();
}

SegmentReader::SegmentReader(Source* source, ReaderOptions options, Header header)
    : source_(source),
      options_(std::move(options)),
      header_(std::move(header)),
      size_(source->size()),
      pos_(options_.start_offset),
      data_end_(options_.start_offset),
      // Four largest records: a refill is needed only every few hundred KiB
      // while scanning.
      window_(4 * RecordBytes(options_.payload_max)) {
  if (options_.scan_bytes_max == 0) {
    scan_budget_from_size_ = true;
    options_.scan_bytes_max = 2 * size_ + (64u << 20);
  }
}

bool SegmentReader::Grow() {
  if (resyncing_ || torn_tail_bytes_ != 0 || source_shrank_ || !io_status_.ok()) return false;
  const uint64_t size = source_->size();
  if (size < size_) return false;
  size_ = size;
  done_ = false;
  if (scan_budget_from_size_) options_.scan_bytes_max = 2 * size_ + (64u << 20);
  return true;
}

Status SegmentReader::Fetch(uint64_t offset, size_t n, std::span<const std::byte>* out) {
  if (offset >= size_) {
    *out = {};
    return Status::Ok();
  }
  n = static_cast<size_t>(std::min<uint64_t>(n, size_ - offset));
  assert(n <= window_.size());
  if (offset < window_offset_ || offset + n > window_offset_ + window_bytes_) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(window_.size(), size_ - offset));
    size_t got = 0;
    window_offset_ = offset;
    window_bytes_ = 0;
    if (Status s = source_->ReadAt(offset, std::span(window_.data(), want), &got); !s.ok()) {
      return s;
    }
    window_bytes_ = got;
    if (got < want) source_shrank_ = true;
    n = std::min(n, got);
  }
  *out = std::span<const std::byte>(window_.data() + (offset - window_offset_), n);
  return Status::Ok();
}

Status SegmentReader::Check(uint64_t offset, FrameCheck* check, uint32_t* payload_bytes) {
  std::span<const std::byte> bytes;
  if (Status s = Fetch(offset, RecordBytes(options_.payload_max), &bytes); !s.ok()) return s;
  *check = CheckFrame(bytes, options_.payload_max, payload_bytes);
  // Charge the hashing that CheckFrame did, so that crafted input cannot make
  // resynchronisation quadratic.
  if (*check == FrameCheck::kValid) {
    scan_bytes_ += RecordBytes(*payload_bytes);
  } else if (*check == FrameCheck::kChecksumMismatch && bytes.size() >= kRecordHeaderBytes) {
    scan_bytes_ += std::min<size_t>(bytes.size(), RecordBytes(options_.payload_max));
  }
  return Status::Ok();
}

void SegmentReader::Skip(uint64_t offset, uint64_t bytes, SkipReason reason) {
  skipped_bytes_ += bytes;
  if (options_.on_skip) options_.on_skip(offset, bytes, reason);
}

SegmentReader::Result SegmentReader::Next(Record* record) {
  step_start_ = scan_bytes_;
  if (resyncing_) {
    const Result r = Resync(resync_failure_);
    if (r != Result::kRecord) return r;
  }
  while (!done_) {
    if (StepBudgetSpent()) return Result::kYield;
    if (pos_ >= size_) {
      done_ = true;
      break;
    }
    FrameCheck check;
    uint32_t len = 0;
    if (Status s = Check(pos_, &check, &len); !s.ok()) {
      io_status_ = std::move(s);
      return Result::kIoError;
    }
    if (check != FrameCheck::kValid) {
      const Result r = Resync(check);
      if (r != Result::kRecord) return r;
      continue;  // pos_ is now at a valid record
    }
    const uint64_t at = pos_;
    const uint64_t next = at + RecordBytes(len);
    if ((at - window_offset_) % kRecordAlign != 0) {
      window_bytes_ = 0;  // refill at `at`, so that the payload is aligned in memory
    }
    std::span<const std::byte> bytes;
    if (Status s = Fetch(at, RecordBytes(len), &bytes); !s.ok()) {
      io_status_ = std::move(s);
      return Result::kIoError;
    }
    pos_ = next;
    data_end_ = next;
    last_record_ = at;
    const auto payload = bytes.subspan(kRecordHeaderBytes, len);
    if (!options_.verify_payload(payload)) {
      Skip(at, next - at, SkipReason::kInvalidPayload);
      continue;
    }
    record->position = Position{header_.segment_id, at};
    record->payload = payload;
    record->next_offset = next;
    return Result::kRecord;
  }
  return Result::kEnd;
}

uint64_t SegmentReader::TrailingZeros(uint64_t record) {
  const uint64_t from = record + kRecordHeaderBytes;
  std::span<const std::byte> bytes;
  if (pos_ <= from || !Fetch(from, pos_ - from, &bytes).ok() || bytes.size() != pos_ - from) {
    return pos_ + 1;
  }
  size_t n = bytes.size();
  while (n > 0 && bytes[n - 1] == std::byte{0}) --n;
  scan_bytes_ += bytes.size() - n;
  return n == bytes.size() ? pos_ + 1 : from + n;
}

SegmentReader::Result SegmentReader::Resync(FrameCheck first_failure) {
  if (!resyncing_) {
    resyncing_ = true;
    resync_damaged_ = pos_;
    resync_failure_ = first_failure;
    resync_next_ = pos_ + 1;
    // Damage right after a valid record: the next record may start inside
    // that record's trailing zero bytes (its writer stopped short there, and
    // the next writer's first bytes, zero too, completed a valid frame).
    if (pos_ == data_end_ && last_record_ != UINT64_MAX) resync_next_ = TrailingZeros(last_record_);
  }
  const uint64_t damaged = resync_damaged_;
  // Every byte offset, not only the 8-byte grid: a failed (short) append
  // leaves a partial record of any length, and the records other writers
  // appended after it are then off the grid. Every offset examined is
  // charged to the budgets, so that no input makes this unbounded.
  for (uint64_t q = resync_next_; q + kRecordHeaderBytes <= size_; ++q) {
    if (scan_bytes_ > options_.scan_bytes_max) {
      resyncing_ = false;
      Skip(damaged, size_ - damaged, SkipReason::kScanBudgetExhausted);
      pos_ = size_;
      done_ = true;
      return Result::kEnd;
    }
    if (StepBudgetSpent()) {
      resync_next_ = q;
      return Result::kYield;
    }
    ++scan_bytes_;
    FrameCheck check;
    uint32_t len = 0;
    if (Status s = Check(q, &check, &len); !s.ok()) {
      resync_next_ = q;
      io_status_ = std::move(s);
      return Result::kIoError;
    }
    if (check != FrameCheck::kValid) continue;
    SkipReason reason = SkipReason::kChecksumMismatch;
    switch (resync_failure_) {
      case FrameCheck::kBadMarker: reason = SkipReason::kBadMarker; break;
      case FrameCheck::kBadLength: reason = SkipReason::kBadLength; break;
      case FrameCheck::kTruncated: reason = SkipReason::kTruncated; break;
      case FrameCheck::kChecksumMismatch: reason = SkipReason::kChecksumMismatch; break;
      case FrameCheck::kValid: assert(false); break;
    }
    resyncing_ = false;
    if (q > damaged) Skip(damaged, q - damaged, reason);
    pos_ = q;
    return Result::kRecord;
  }
  // No valid record follows: a writer died mid-write (or the damage is in
  // the last record, which looks the same). End of data.
  resyncing_ = false;
  torn_tail_bytes_ = size_ - damaged;
  pos_ = size_;
  done_ = true;
  return Result::kEnd;
}

}  // namespace postspool::segment
