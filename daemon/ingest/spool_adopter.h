// Adopting the spool: the posts clients wrote to the spool directory while
// the daemon was down, busy or full. Decisions only: every file operation
// goes through the SpoolDir port (ports.h), every moment through the
// ClockPort, so that the simulation runs this code unchanged.
//
// Scan (incremental, at most spool_scan_entries_max entries per round): a
// current segment (<uid>.current or a writer's private <uid>.<id>.current)
// that holds records is renamed to a sealed name (writers move on to a new
// current segment); every sealed segment is queued under its uid. Anything
// that is not a spool segment name, not a regular file, not owned by the
// uid in its name, hard-linked (st_nlink != 1) or sparse (a writer that
// appends never leaves a hole) is moved to the quarantine directory, counted
// and logged. Nothing is deleted unless its records were journaled.
//
// Adoption (Next, Finish): one segment at a time, taken round-robin over
// the uids that have segments waiting (one user's 50,000 files do not delay
// another's one), skipping uids above their disk share; a segment whose lock
// a writer holds is retried later with a back-off, never waited for.
// Reading is bounded per call (spool_read_bytes_max bytes examined), so a
// huge or crafted segment is read over many rounds.
//
// Not thread-safe: the ingest loop's own.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>

#include "config.h"
#include "log_limiter.h"
#include "metrics.h"
#include "ports.h"
#include "post.h"
#include "segment_reader.h"
#include "status.h"

namespace postspool::daemon {

class SpoolAdopter {
 public:
  // All pointers are borrowed and must outlive the adopter.
  SpoolAdopter(const Config& config, Metrics* metrics, SpoolDir* dir, ClockPort* clock);

  // Does a bounded piece of the directory scan when one is due (something
  // changed, or spool_rescan_interval_ms passed).
  void Tick();

  // The next record of the segment being adopted, with the trusted origin
  // (the file owner). False when there is nothing to hand out right now
  // (no segment ready, the read budget of this round is spent, or the
  // segment is read to its end: see AtEnd).
  struct Adopted {
    std::span<const std::byte> payload;  // valid until the next call
    uid_t uid;
  };
  bool Next(Adopted* out);
  // The segment being adopted was read to its end: once the records handed
  // out are journaled, call Finish().
  bool AtEnd() const { return current_ != nullptr && current_->at_end; }
  // The records handed out are journaled: delete the file (or quarantine it
  // when part of it was damaged).
  void Finish();
  // The records handed out were not journaled: read the file again later
  // from its start (its records may be journaled twice: duplicates, never
  // loss).
  void Restart();
  // A record of the segment being adopted may not be journaled (it fails
  // validation): the file goes to the quarantine once the rest is journaled,
  // never to unlink.
  void MarkRejected(const std::string& why);
  // Starts a new read budget (called once per ingest round).
  void NewRound() { read_budget_spent_ = false; }

  // Allocated bytes of spool segments (total, and of one uid), from the
  // last complete scan.
  uint64_t spool_bytes() const { return spool_bytes_; }
  uint64_t spool_bytes_of(uid_t uid) const;
  const std::unordered_map<uid_t, uint64_t>& spool_bytes_by_uid() const { return bytes_of_; }
  // Segments known and not yet adopted (waiting, and the one being read).
  size_t segments_waiting() const;
  // Asked before a uid's segment is adopted: false if that uid is above its
  // share of the disk (its segments wait).
  void set_uid_admission(std::function<bool(uid_t)> f) { uid_admitted_ = std::move(f); }

 private:
  struct Waiting {
    std::string name;
    Clock::time_point ready_at;  // not before (see kSettle), and the seal back-off
    uint32_t seal_attempts = 0;
  };
  struct Current {
    std::string name;
    uid_t uid = 0;
    std::unique_ptr<SpoolFile> file;
    std::unique_ptr<segment::SegmentReader> reader;
    uint64_t damaged_bytes = 0;
    std::string rejected;  // why a record was refused; non-empty: quarantine
    bool at_end = false;
  };

  void ScanSome();
  void Examine(const SpoolEntry& e, Clock::time_point now);
  void Enqueue(uid_t uid, const std::string& name, Clock::time_point ready_at);
  // Moves a file to the quarantine under a name that never replaces one
  // there; false (and the file stays) if the quarantine is full or the move
  // failed.
  bool Quarantine(const std::string& name, uint64_t bytes, const std::string& why);
  // Opens, checks and seals the next waiting segment, fairly over uids.
  bool OpenNext();
  Status OpenCurrent(const std::string& name, uid_t uid);
  void Warn(const char* format, ...) __attribute__((format(printf, 2, 3)));

  const Config& config_;
  Metrics* metrics_;
  SpoolDir* dir_;
  ClockPort* clock_;
  std::function<bool(uid_t)> uid_admitted_;

  bool changed_ = true;
  bool scanning_ = false;
  Clock::time_point last_scan_start_{};
  // Totals of the pass in progress, and of the last complete one.
  uint64_t pass_bytes_ = 0;
  std::unordered_map<uid_t, uint64_t> pass_bytes_of_;
  uint64_t spool_bytes_ = 0;
  std::unordered_map<uid_t, uint64_t> bytes_of_;

  std::map<uid_t, std::deque<Waiting>> waiting_;  // sealed segments, per uid, oldest first
  std::set<std::string> known_;                   // names in waiting_ or current_
  uid_t next_uid_ = 0;                            // round-robin cursor
  std::unique_ptr<Current> current_;
  bool read_budget_spent_ = false;
  uint32_t quarantine_seq_ = 0;
  LogLimiter warn_limiter_;
};

}  // namespace postspool::daemon
