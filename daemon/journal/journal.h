// The daemon's journal: every accepted post is appended here before it is
// acknowledged, and stays until the broker confirmed it.
//
// Layout of the journal directory (FORMAT.md, "The journal directory"):
//   journal-<seq, 16 hex digits>.seg   segments (FORMAT.md), segment_id == seq
//   checkpoint                         the acked watermark (see Checkpoint)
//   lock                               held by the daemon using the directory
//                                      (LockJournalDir)
//   damaged/                           segments that could not be read, kept
//                                      aside for a person to look at
//                                      (SetAsideDamagedSegment); never deleted
//
// Every file system call goes through a Storage (storage.h): the daemon's is
// SystemStorage(), the simulation's a simulated disk. `storage` arguments
// default to SystemStorage() and must outlive what they are given to.
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
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "segment_reader.h"
#include "status.h"
#include "storage.h"
#include "unique_fd.h"

namespace postspool::daemon {

struct JournalPosition {
  uint64_t segment_seq = 0;
  uint64_t offset = 0;  // of a record's first byte (or the end) in that segment
  friend auto operator<=>(const JournalPosition&, const JournalPosition&) = default;
};

std::string JournalSegmentName(uint64_t seq);
// Sorted sequence numbers of the segments in the journal directory.
Status ListJournalSegments(int dirfd, std::vector<uint64_t>* seqs,
                           Storage* storage = SystemStorage());

// Makes sure that only one daemon uses `journal_dir`: takes a non-blocking
// exclusive flock on `journal_dir/lock` (created 0600, opened O_NOFOLLOW)
// and writes this process's pid into it. The lock lasts as long as *lock
// stays open, and the kernel drops it when the process dies in any way, so a
// restart after a crash never waits. kAlreadyExists, naming the directory
// and the holder's pid, when another process (or another open of the file in
// this one: flock locks belong to the open file description) holds it.
Status LockJournalDir(const std::string& journal_dir, UniqueFd* lock);

// Bytes of the segments in the journal directory (damaged/ is not counted);
// the writer adds, the forwarder subtracts when it deletes confirmed segments
// or sets a damaged one aside.
struct JournalUsage {
  std::atomic<uint64_t> bytes{0};
};

// The committed end of the journal, published by the ingest loop after a
// write (and, at durability `synced`, its fdatasync) completed; the
// forwarder reads up to it. Wakes the forwarder through an eventfd, written
// once until the forwarder drains it (not once per commit).
class CommitChannel {
 public:
  CommitChannel();
  void Publish(JournalPosition end);
  JournalPosition committed() const;
  // Readable when something was published since the last Drain(). Drain,
  // then read committed(): a commit after the Drain makes it readable.
  int event_fd() const { return event_fd_.get(); }
  void Drain();

 private:
  mutable std::mutex mu_;
  JournalPosition end_;
  bool signalled_ = false;  // the eventfd was written since the last Drain
  UniqueFd event_fd_;
};

// A new journal segment, made by CreateJournalSegment (on any thread) for
// JournalWriter::Install (on the writer's).
struct NewJournalSegment {
  uint64_t seq = 0;
  StorageFd fd;  // open O_RDWR, not O_APPEND (the loop writes at offsets)
  Status status;
  // The name exists (even if a later step failed): its seq is used up, and
  // its bytes count.
  bool name_used = false;
  uint64_t bytes_on_disk = 0;
};
// Creates segment `seq` in the journal directory `dirfd` holding only its
// header (segment::CreateSegment: the name never shows a partial header;
// with `sync` the header and the name are durable). Touches nothing but the
// file system: the io_uring backend runs it on its worker thread, so that
// the ingest loop never waits for it.
NewJournalSegment CreateJournalSegment(int dirfd, uint64_t seq, bool sync,
                                       Storage* storage = SystemStorage());

// Appends records to the newest journal segment; starts a new segment for
// its first write (an older segment's tail may be torn) and when a segment
// would exceed segment_bytes_max. Not thread-safe: the ingest loop's own.
//
// Segments are created lazily, by the first Reserve() after Open() (or after
// Abandon() or a roll-over), so that Open() needs no free space: a daemon
// starts on a full disk, forwards and frees space. A segment that cannot be
// created fails that Reserve() (kNoSpace for ENOSPC/EDQUOT); the next
// Reserve() tries again.
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
    Storage* storage = SystemStorage();
  };
  // `usage` must outlive the writer.
  static Status Open(const Options& options, JournalUsage* usage,
                     std::unique_ptr<JournalWriter>* out);

  struct Slot {
    int fd = -1;               // valid until the next Reserve()
    JournalPosition position;  // where the first byte goes
  };
  // Reserves `bytes` at the end of the current segment, creating the segment
  // first if there is none yet or it is full (NeedsSegment). Only one
  // reservation may be outstanding: call Committed() or Abandon() before the
  // next.
  Status Reserve(uint64_t bytes, Slot* slot);
  // True when Reserve(bytes) would create a segment first. The ingest loop
  // has CreateJournalSegment(dirfd(), next_seq(), sync()) run off its
  // thread, Install()s the result, and then reserves.
  bool NeedsSegment(uint64_t bytes) const;
  uint64_t next_seq() const { return next_seq_; }
  bool sync() const { return options_.sync; }
  Storage* storage() const { return options_.storage; }
  // Makes `segment` (created for next_seq()) the current one, or records
  // its failure (a name left behind uses up its seq and counts); returns
  // its status (kNoSpace for ENOSPC/EDQUOT): the next batch tries again.
  Status Install(NewJournalSegment segment);
  // The reserved bytes are written; returns the new end.
  JournalPosition Committed();
  // The write of the reserved bytes failed: the segment is finished (its
  // tail may be torn) and the next Reserve starts a new one. What the write
  // left past the committed end is cut off first; while that fails, the
  // segment stays the current one and every Reserve tries the cut again
  // (and fails while it fails).
  void Abandon();

  // Synchronous convenience for tests and the epoll backend: Reserve,
  // pwrite, optional fdatasync, Committed.
  Status Append(std::span<const std::byte> records, bool sync, JournalPosition* first);

  // The committed end. Before the first segment of this writer exists it is
  // {seq of that segment, kHeaderBytes}: after every segment already in the
  // directory, so publishing it on the CommitChannel at start covers a
  // backlog left by an earlier run. That segment's seq is above every
  // existing segment and above the stored checkpoint's segment. Never
  // decreases.
  JournalPosition end() const { return end_; }
  int dirfd() const { return dirfd_.get(); }

 private:
  JournalWriter(Options options, StorageFd dirfd, JournalUsage* usage, uint64_t next_seq);

  Options options_;
  StorageFd dirfd_;
  JournalUsage* usage_;
  uint64_t next_seq_;
  StorageFd fd_;
  JournalPosition end_;
  uint64_t reserved_ = 0;
  bool reservation_open_ = false;
  // Abandon() could not cut the failed write off: fd_ is kept for the cut.
  bool uncut_ = false;
};

// Reads journal records in order from a position up to a limit, moving from
// segment to segment. The forwarder's own.
class JournalReader {
 public:
  // `dirfd` is borrowed and must stay open while the reader is used.
  explicit JournalReader(int dirfd, Storage* storage = SystemStorage());

  // How a segment file is read: by default through the Storage (pread on
  // `fd`), capped at `size_max`. A seam for tests, which inject read errors (EIO)
  // that a real disk cannot be made to produce on demand.
  using SourceFactory = std::function<Status(int fd, uint64_t seq, uint64_t size_max,
                                             std::unique_ptr<segment::Source>* out)>;
  void set_source_factory(SourceFactory factory) { source_factory_ = std::move(factory); }

  struct Entry {
    JournalPosition position;
    JournalPosition next;  // where the next record starts
    std::span<const std::byte> payload;  // valid until the next call
  };
  // Moves to `pos` (a record boundary: a watermark or an Entry::next).
  void Seek(JournalPosition pos);
  // The next record before `limit`: true and *entry, or false when there is
  // none yet. `limit` is a committed end: every byte before it was written
  // (the reader trusts it rather than stat the file). Damage inside a
  // segment is skipped and counted (skipped_bytes()). A segment that cannot
  // be read at all is a status, and the reader stays where it was
  // (position() is in that segment): kCorruption or kUnsupported when its
  // header is damaged, truncated or of a newer version (a zero-length file
  // after a power loss), which no retry changes; another code (kIoError:
  // EIO, ...) when reading failed, which a retry may get past. The message
  // names the segment file. Whether to retry or SkipSegment() is the
  // caller's decision.
  Status Next(JournalPosition limit, Entry* entry, bool* got);
  // Gives up on the rest of the segment at position(): moves to the start of
  // the next one. For a segment that cannot be read.
  void SkipSegment();
  JournalPosition position() const { return pos_; }
  uint64_t skipped_bytes() const { return skipped_bytes_; }
  // The records those skipped bytes held (segment::CountLostRecords; a torn
  // tail of a finished segment is at least one).
  uint64_t lost_records() const { return lost_records_; }

 private:
  Status OpenSegment(uint64_t seq, uint64_t offset, JournalPosition limit);

  int dirfd_;
  Storage* storage_;
  SourceFactory source_factory_;
  JournalPosition pos_;
  StorageFd fd_;
  std::unique_ptr<segment::Source> source_;
  std::unique_ptr<segment::SegmentReader> reader_;
  uint64_t open_seq_ = 0;
  uint64_t opened_limit_ = 0;  // the limit offset the reader was opened with
  uint64_t skipped_bytes_ = 0;
  uint64_t lost_records_ = 0;
};

// The acked watermark: every record before it is confirmed by the broker.
//
// Stored in one preallocated file, `checkpoint` (FORMAT.md, "Checkpoint"),
// created once and then only rewritten in place: two fixed slots, each a
// checksummed (generation, watermark) record, 4 KiB apart. A store
// overwrites the older slot and the newest valid slot wins when loading, so
// a torn write loses at most the value being written, never the one before.
// A store allocates nothing (no new block, file or directory entry, no
// rename), so it works on a full disk: the forwarder can always record what
// the broker confirmed and free the segments before it.
//
// Not thread-safe: the forwarder's own.
class Checkpoint {
 public:
  // The newest valid watermark; {0, 0} (the beginning) when there is no
  // checkpoint file. Also reads the version 1 file of earlier releases (32
  // bytes, replaced by rename), so an upgrade keeps its watermark.
  // kCorruption when the file holds no valid slot.
  static Status Load(int dirfd, JournalPosition* pos, Storage* storage = SystemStorage());

  // Opens the checkpoint file for storing, first creating it holding `pos`
  // if it is missing or not a version 2 file (version 1, or a file of the
  // wrong size; an existing version 2 file is used as it is, its newest
  // slot kept, `pos` ignored). It is written complete under a
  // temporary name, synced and renamed into place: the only rename in its
  // life. On a full disk that fails with kNoSpace and changes nothing; try
  // again later. `dirfd` is borrowed for this call only.
  static Status Open(int dirfd, JournalPosition pos, std::unique_ptr<Checkpoint>* out,
                     Storage* storage = SystemStorage());

  // Writes `pos` into the older slot (one pwrite). Once it returns, the
  // value survives a crash of the process (it is in the page cache); it
  // survives a power loss once Sync() returned. On a failed write the slot
  // may be torn; the other slot still holds the previous value, and the next
  // Store writes the same slot again.
  Status Store(JournalPosition pos);
  // fdatasync: makes the stored values durable.
  Status Sync();

 private:
  Checkpoint(Storage* storage, StorageFd fd, uint64_t generation)
      : storage_(storage), fd_(std::move(fd)), generation_(generation) {}
  Storage* storage_;
  StorageFd fd_;
  uint64_t generation_;  // of the newest slot written
};

// What the checkpoint may hold: `watermark`, but never beyond `damaged_at`
// (where reading failed in the oldest segment found damaged and not yet set
// aside, if any). A restart starts reading at the stored checkpoint: one
// past such a segment would never read it again, never find it damaged, and
// DeleteConfirmedSegments would delete it as confirmed.
JournalPosition StorableCheckpoint(JournalPosition watermark,
                                   std::optional<JournalPosition> damaged_at);

// The records in segment `seq` from `offset` to its end, as postspool verify
// counts them (segment::CountLostRecords): what a damaged segment loses past
// the point where reading failed. 0 if the segment cannot be opened.
uint64_t CountRecordsFrom(int dirfd, uint64_t seq, uint64_t offset,
                          Storage* storage = SystemStorage());

// Moves the damaged segment `seq` into the damaged/ subdirectory of the
// journal directory (created 0700 if missing), under its own name or, if a
// file of that name is there already, with a suffix (.1, .2, ...): it never
// replaces an earlier file. Subtracts its size from `usage` and syncs both
// directories (a move lost in a power loss would leave it where confirmed
// segments get deleted). *moved_to is the new name relative to the journal
// directory. kNotFound if the segment is not there.
Status SetAsideDamagedSegment(int dirfd, uint64_t seq, JournalUsage* usage,
                              std::string* moved_to, Storage* storage = SystemStorage());

// Deletes the segments wholly before `watermark` (seq < watermark.segment_seq)
// except those listed in `keep` (damaged segments that could not be moved
// aside: never deleted), and subtracts their sizes from `usage`. Returns how
// many were deleted. Deleting needs no stored checkpoint: everything in a
// deleted segment is confirmed, and a reader that starts before it moves on
// to the next segment that exists.
Status DeleteConfirmedSegments(int dirfd, JournalPosition watermark, JournalUsage* usage,
                               int* deleted, std::span<const uint64_t> keep = {},
                               Storage* storage = SystemStorage());

}  // namespace postspool::daemon
