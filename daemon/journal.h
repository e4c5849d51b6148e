// The daemon's journal: every accepted post is appended here before it is
// acknowledged, and stays until the broker confirmed it.
//
// Layout of the journal directory:
//   journal-<seq, 16 hex digits>.seg   segments (FORMAT.md), segment_id == seq
//   checkpoint                         the acked watermark (see Checkpoint)
//
// Threads: one JournalWriter, used by the ingest loop; one JournalReader and
// the Checkpoint, used by the forwarder; CommitChannel and JournalUsage are
// shared between the two.
#pragma once

#include <atomic>
#include <compare>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "segment_reader.h"
#include "status.h"
#include "unique_fd.h"

namespace postspool::daemon {

struct JournalPosition {
  uint64_t segment_seq = 0;
  uint64_t offset = 0;  // of a record's first byte (or the end) in that segment
  friend auto operator<=>(const JournalPosition&, const JournalPosition&) = default;
};

std::string JournalSegmentName(uint64_t seq);
// Sorted sequence numbers of the segments in the journal directory.
Status ListJournalSegments(int dirfd, std::vector<uint64_t>* seqs);

// Bytes the journal holds on disk; the writer adds, the forwarder subtracts
// when it deletes confirmed segments.
struct JournalUsage {
  std::atomic<uint64_t> bytes{0};
};

// The committed end of the journal, published by the ingest loop after a
// write (and, at durability `synced`, its fdatasync) completed; the
// forwarder reads up to it. Wakes the forwarder through an eventfd.
class CommitChannel {
 public:
  CommitChannel();
  void Publish(JournalPosition end);
  JournalPosition committed() const;
  // Readable when something was published since the last Drain().
  int event_fd() const { return event_fd_.get(); }
  void Drain();

 private:
  mutable std::mutex mu_;
  JournalPosition end_;
  UniqueFd event_fd_;
};

// Appends records to the newest journal segment; starts a new segment at
// open (an older segment's tail may be torn) and when a segment would exceed
// segment_bytes_max. Not thread-safe: the ingest loop's own.
//
// Writing is split so that the loop can submit the write through io_uring:
// Reserve() says where the next batch goes (rolling over to a new segment
// first if needed); the loop writes it there (pwrite semantics); Committed()
// records that it landed.
class JournalWriter {
 public:
  struct Options {
    std::string dir;
    uint64_t segment_bytes_max = 64ull << 20;
    // Sync a new segment's header and directory entry (durability
    // `synced`); without it, starting a segment does not stall the loop.
    bool sync = true;
  };
  // `usage` must outlive the writer.
  static Status Open(const Options& options, JournalUsage* usage,
                     std::unique_ptr<JournalWriter>* out);

  struct Slot {
    int fd = -1;               // valid until the next Reserve()
    JournalPosition position;  // where the first byte goes
  };
  // Reserves `bytes` at the end of the current segment. Only one reservation
  // may be outstanding: call Committed() or Abandon() before the next.
  Status Reserve(uint64_t bytes, Slot* slot);
  // The reserved bytes are written; returns the new end.
  JournalPosition Committed();
  // The write of the reserved bytes failed: the segment is finished (its
  // tail may be torn) and the next Reserve starts a new one.
  void Abandon();

  // Synchronous convenience for tests and the epoll backend: Reserve,
  // pwrite, optional fdatasync, Committed.
  Status Append(std::span<const std::byte> records, bool sync, JournalPosition* first);

  JournalPosition end() const { return end_; }
  int dirfd() const { return dirfd_.get(); }

 private:
  JournalWriter(Options options, UniqueFd dirfd, JournalUsage* usage, uint64_t next_seq);
  Status StartSegment();

  Options options_;
  UniqueFd dirfd_;
  JournalUsage* usage_;
  uint64_t next_seq_;
  UniqueFd fd_;
  JournalPosition end_;
  uint64_t reserved_ = 0;
  bool reservation_open_ = false;
};

// Reads journal records in order from a position up to a limit, moving from
// segment to segment. The forwarder's own.
class JournalReader {
 public:
  // `dirfd` is borrowed and must stay open while the reader is used.
  explicit JournalReader(int dirfd);

  struct Entry {
    JournalPosition position;
    JournalPosition next;  // where the next record starts
    std::span<const std::byte> payload;  // valid until the next call
  };
  // Moves to `pos` (a record boundary: a watermark or an Entry::next).
  void Seek(JournalPosition pos);
  // The next record before `limit`: true and *entry, or false when there is
  // none yet. Damage is skipped and counted (skipped_bytes()). An I/O error
  // is returned as a status; the reader stays where it was.
  Status Next(JournalPosition limit, Entry* entry, bool* got);
  JournalPosition position() const { return pos_; }
  uint64_t skipped_bytes() const { return skipped_bytes_; }

 private:
  Status OpenSegment(uint64_t seq, uint64_t offset, JournalPosition limit);

  int dirfd_;
  JournalPosition pos_;
  UniqueFd fd_;
  std::unique_ptr<segment::FileSource> source_;
  std::unique_ptr<segment::SegmentReader> reader_;
  uint64_t open_seq_ = 0;
  uint64_t opened_limit_ = 0;  // the limit offset the reader was opened with
  uint64_t skipped_bytes_ = 0;
};

// The acked watermark: every record before it is confirmed by the broker.
// Stored as a small checksummed file, replaced atomically (temp file, fsync,
// rename, fsync of the directory).
class Checkpoint {
 public:
  // *pos is {0, 0} (the beginning) when there is no checkpoint yet.
  static Status Load(int dirfd, JournalPosition* pos);
  static Status Store(int dirfd, JournalPosition pos);
};

// Deletes the segments wholly before `watermark` (seq < watermark.segment_seq)
// and subtracts their sizes from `usage`. Returns how many were deleted.
Status DeleteConfirmedSegments(int dirfd, JournalPosition watermark, JournalUsage* usage,
                               int* deleted);

}  // namespace postspool::daemon
