// JournalFeed: the forwarder's side of the journal (forwarder.h). It reads
// the posts to publish, new ones from the watermark on and single posts
// again for a republish; it gives up damaged segments; and it keeps the
// checkpoint: the watermark written into it (when the caller says so, see
// PublishWindow::WatermarkWriteDue), written and synced every
// checkpoint_interval_ms, after which the confirmed segments are deleted.
// It knows nothing of the broker: the caller says where the watermark is.
//
// The forwarder and the simulation (tests/sim) both run this code: every
// file system call goes through the Storage, and what happens is told to
// Events (the forwarder logs and counts; the simulation traces and checks).
//
// Damaged segments (DESIGN.md, "Faults the daemon survives by itself"): a
// segment that cannot be read (a damaged or truncated header, such as a
// zero-length file after a power loss, or read errors that persist over
// kReadAttempts tries, the n-th after kReadRetryDelay * 2^(n-1)) is reported
// once and skipped: reading goes on with the next segment. If it is the
// segment the ingest loop is writing (the committed end is in it), the feed
// waits until the committed end moves to a later segment, then skips it.
// Once the watermark is past it, it is moved to damaged/ in the journal
// directory (SetAsideDamagedSegment) instead of being deleted; if that move
// fails it stays where it is, is never deleted, and the move is tried again
// at every checkpoint (remembered in memory only: a restart that finds it
// behind the stored watermark deletes it with the confirmed segments). Until
// then the checkpoint stays before the damage (StorableCheckpoint).
//
// The checkpoint file is created at Start; on a full disk that fails and is
// tried again at every checkpoint: publishing and deleting confirmed
// segments go on without it (journal.h, DeleteConfirmedSegments).
//
// Not thread-safe: the forwarder thread's own.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "journal.h"
#include "post.h"
#include "status.h"
#include "storage.h"

namespace postspool::daemon {

class JournalFeed {
 public:
  using Clock = std::chrono::steady_clock;
  // A read that fails (EIO, ...) is tried this many times in all, the delays
  // between doubling from kReadRetryDelay (0.1 + 0.2 + 0.4 + 0.8 s: the
  // segment is declared damaged about 1.5 s after the first failure). A
  // disk's transient errors clear within that; a bad sector does not, and
  // then waiting longer would only hold back every later post.
  static constexpr int kReadAttempts = 5;
  static constexpr std::chrono::milliseconds kReadRetryDelay{100};

  // What happens, for logs and counters. Each is called on the feed's
  // thread, from inside the call that found it.
  class Events {
   public:
    virtual ~Events() = default;
    // Reading new posts at `at` failed; tried again in `delay` (the next
    // attempt is `attempt` of kReadAttempts).
    virtual void OnReadFailed(JournalPosition at, const Status& why, int attempt,
                              std::chrono::milliseconds delay) = 0;
    // Reading at `at` works again after failures.
    virtual void OnReadRecovered(JournalPosition at) = 0;
    // Damaged bytes skipped inside a segment after `before`, and the records
    // they held; told once, however often a reconnect reads them again.
    virtual void OnBytesSkipped(JournalPosition before, uint64_t bytes, uint64_t records) = 0;
    // A segment is damaged from `at` on; `records` were found past it.
    // Told once per segment.
    virtual void OnSegmentDamaged(JournalPosition at, const Status& why, uint64_t records) = 0;
    virtual void OnSegmentSetAside(uint64_t seq, const std::string& moved_to) = 0;
    // Moving a damaged segment aside failed; told once per segment.
    virtual void OnSetAsideFailed(uint64_t seq, const Status& why) = 0;
    // Reading post `id` again at `at` failed; tried again in `delay`.
    virtual void OnRereadFailed(PostId id, JournalPosition at, const Status& why,
                                std::chrono::milliseconds delay) = 0;
    // Post `id` can no longer be read: it is given up.
    virtual void OnUnreadable(PostId id, JournalPosition at, const std::string& why) = 0;
    enum class CheckpointStep { kCreate, kStore };
    // The first failure of a run of them (kStore: the write or the sync).
    virtual void OnCheckpointFailed(CheckpointStep step, const Status& why) = 0;
    // The checkpoint file exists at last (after a failure to create it).
    virtual void OnCheckpointCreated() = 0;
    virtual void OnDeleteFailed(const Status& why) = 0;
    virtual void OnDeleted(int segments, JournalPosition before) = 0;
  };

  // All borrowed; they must outlive the feed. `dirfd` is the journal
  // directory, open on `storage`.
  JournalFeed(Storage* storage, int dirfd, JournalUsage* usage,
              std::chrono::milliseconds checkpoint_interval, Events* events);

  // How the readers read a segment (tests inject read errors).
  void set_source_factory(const JournalReader::SourceFactory& factory);

  // Starts reading at `start` (the loaded checkpoint) and opens the
  // checkpoint file, creating it holding `start` if missing.
  void Start(JournalPosition start);

  // The next new post before `limit` (the committed end).
  enum class Read {
    kEntry,  // *entry is the next post
    kIdle,   // nothing more before `limit`
    kWait,   // not now: a read is to be tried again (retry_at()), or the
             // damaged segment that the committed end is in holds the reader
  };
  Read Next(JournalPosition limit, Clock::time_point now, JournalReader::Entry* entry);
  // Where the next new post is read from.
  JournalPosition position() const { return reader_.position(); }
  // Reads from `p` again (a post read by Next that could not be published).
  void Rewind(JournalPosition p) { reader_.Seek(p); }

  // Post `id`, read again from [at, next) to publish it again.
  enum class Again {
    kEntry,       // *entry is the post
    kRetryLater,  // a read failed; try again at retry_at()
    kUnreadable,  // given up (OnUnreadable told why)
  };
  Again ReadAgain(PostId id, JournalPosition at, JournalPosition next, Clock::time_point now,
                  JournalReader::Entry* entry);

  // No read is tried before this (after a failure).
  Clock::time_point retry_at() const { return retry_at_; }
  bool CanRead(Clock::time_point now) const { return now >= retry_at_; }

  // What the checkpoint may hold for watermark `w`: w, or the position of
  // the oldest damage not yet set aside if that is earlier.
  JournalPosition Storable(JournalPosition w) const;
  // Writes Storable(w) into the checkpoint (no sync) if it moved: call it
  // before publishing more when a crash could otherwise publish again more
  // than a window (PublishWindow::WatermarkWriteDue).
  void WriteWatermark(JournalPosition w);
  // Every checkpoint_interval (at once with `force`): sets damaged segments
  // before `w` aside, stores and syncs the checkpoint, deletes the segments
  // wholly confirmed.
  void MaybeCheckpoint(JournalPosition w, Clock::time_point now, bool force);
  // When MaybeCheckpoint has work for watermark `w`; Clock::time_point::max()
  // if none.
  Clock::time_point checkpoint_due(JournalPosition w) const;

  JournalPosition stored_checkpoint() const { return stored_; }
  // The last attempt to create or write the checkpoint failed.
  bool checkpoint_faulted() const { return checkpoint_faulted_; }

 private:
  // A read of the main reader failed: true if it may go on at once (the
  // segment is known damaged now), false to wait until retry_at_.
  bool OnReadError(const Status& why, Clock::time_point now);
  void ReportDamaged(JournalPosition at, const Status& why);
  void AccountSkipped(JournalPosition before);
  void SetAsideDamaged(JournalPosition w);
  // Tells the first failure of a run of them (create_failing_, store_failing_).
  void CheckpointFailed(Events::CheckpointStep step, const Status& why);
  static bool Permanent(const Status& s) {
    return s.code() == StatusCode::kCorruption || s.code() == StatusCode::kUnsupported;
  }
  static std::chrono::milliseconds RetryDelay(int attempt) {
    return kReadRetryDelay * (1 << std::min(attempt - 1, 10));
  }

  Storage* const storage_;
  const int dirfd_;
  JournalUsage* const usage_;
  const std::chrono::milliseconds checkpoint_interval_;
  Events* const events_;

  JournalReader reader_;  // new posts
  JournalReader again_;   // posts to publish again
  Clock::time_point retry_at_;
  int read_attempts_ = 0;  // failed reads in a row at reader_'s position
  JournalPosition again_failed_at_;
  int again_attempts_ = 0;
  // The furthest reader_ got: damage before it was told already.
  JournalPosition read_high_;
  uint64_t skipped_seen_ = 0;
  uint64_t lost_seen_ = 0;
  struct Damage {
    JournalPosition at;  // where reading failed; the rest of the segment is skipped
    bool move_failure_told = false;
  };
  // Segments known to be damaged and not set aside yet, by seq.
  std::map<uint64_t, Damage> damaged_;

  // nullptr while the checkpoint file could not be created (a full disk).
  std::unique_ptr<Checkpoint> checkpoint_;
  JournalPosition written_;     // written, maybe not synced
  JournalPosition stored_;      // synced
  JournalPosition cleaned_at_;  // the watermark of the last deletion
  Clock::time_point next_checkpoint_at_;
  bool create_failing_ = false;
  bool store_failing_ = false;
  bool checkpoint_faulted_ = false;
};

}  // namespace postspool::daemon
