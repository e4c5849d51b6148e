#include "spool_adopter.h"

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>

#include "log.h"
#include "lost_records.h"
#include "segment_writer.h"

namespace postspool::daemon {
namespace {

using namespace std::chrono_literals;

// A burst of spool writes makes one scan, not one per write.
constexpr auto kScanDebounce = 50ms;
// A segment taken from the writers is read only after this delay: a client
// whose acknowledgement came late spooled its post just now, and the socket
// copy of it, still in the daemon's queue, is then journaled first, so that
// adoption recognises the spooled copy (RecentIds) instead of journaling it
// twice.
constexpr auto kSettle = 50ms;
// Sealing a segment whose lock a writer holds is retried after this delay,
// doubling up to kSealRetryMax: a writer mid-append holds it for
// microseconds; a user who holds it on purpose only delays their own file.
constexpr auto kSealRetryInitial = 10ms;
constexpr auto kSealRetryMax = 5s;
// A temporary left by a writer that died while creating a segment.
constexpr int64_t kStaleTemporaryS = 3600;
// A segment shorter than its header younger than this is given time.
constexpr int64_t kYoungFileS = 10;
// Segments opened (and checked, sealed) per call of OpenNext: bounds the
// work of a round when many are busy or bad.
constexpr int kOpenAttemptsPerCall = 16;

}  // namespace

SpoolAdopter::SpoolAdopter(const Config& config, Metrics* metrics, SpoolDir* dir, ClockPort* clock)
    : config_(config), metrics_(metrics), dir_(dir), clock_(clock), warn_limiter_(1s) {}

void SpoolAdopter::Warn(const char* format, ...) {
  uint64_t suppressed = 0;
  if (!warn_limiter_.Allow(clock_->Now(), &suppressed)) return;
  char buf[1024];
  va_list ap;
  va_start(ap, format);
  std::vsnprintf(buf, sizeof buf, format, ap);
  va_end(ap);
  if (suppressed > 0) {
    PS_LOG_WARNING("spool: %s (and %llu more spool warnings in the last second)", buf,
                   static_cast<unsigned long long>(suppressed));
  } else {
    PS_LOG_WARNING("spool: %s", buf);
  }
}

uint64_t SpoolAdopter::spool_bytes_of(uid_t uid) const {
  const auto it = bytes_of_.find(uid);
  return it == bytes_of_.end() ? 0 : it->second;
}

void SpoolAdopter::Tick() {
  if (dir_->TakeChanges()) changed_ = true;
  const auto now = clock_->Now();
  if (!scanning_) {
    const auto since = now - last_scan_start_;
    if (!(changed_ && since >= kScanDebounce) &&
        since < std::chrono::milliseconds(config_.spool_rescan_interval_ms)) {
      return;
    }
    changed_ = false;
    scanning_ = true;
    last_scan_start_ = now;
    pass_bytes_ = 0;
    pass_bytes_of_.clear();
  }
  ScanSome();
}

void SpoolAdopter::ScanSome() {
  std::vector<SpoolEntry> entries;
  bool pass_done = false;
  if (Status s = dir_->List(config_.spool_scan_entries_max, &entries, &pass_done); !s.ok()) {
    Warn("cannot list %s: %s; trying again at the next scan", config_.spool_dir.c_str(),
         s.ToString().c_str());
    scanning_ = false;
    return;
  }
  const auto now = clock_->Now();
  for (const SpoolEntry& e : entries) Examine(e, now);
  if (pass_done) {
    scanning_ = false;
    // The segment being adopted was counted when it was listed, or is
    // counted now if it was renamed after the pass went by it.
    spool_bytes_ = pass_bytes_;
    bytes_of_ = std::move(pass_bytes_of_);
    pass_bytes_of_.clear();
    metrics_->spool_bytes.store(spool_bytes_, std::memory_order_relaxed);
  }
}

void SpoolAdopter::Examine(const SpoolEntry& e, Clock::time_point now) {
  const auto parsed = segment::ParseSpoolName(e.name);
  if (!parsed) {
    if (e.name.rfind(".tmp.", 0) == 0 && e.regular) {
      // A writer creating a segment (the name exists for a moment), or one
      // that died doing it.
      if (clock_->WallSeconds() - e.mtime_s > kStaleTemporaryS) {
        Quarantine(e.name, e.allocated_bytes, "stale temporary of a writer that died");
      }
      return;
    }
    Quarantine(e.name, e.allocated_bytes, "not a spool segment name");
    return;
  }
  if (!e.regular) {
    Quarantine(e.name, e.allocated_bytes, "not a regular file");
    return;
  }
  if (e.owner != parsed->uid) {
    Quarantine(e.name, e.allocated_bytes,
               "owned by uid " + std::to_string(e.owner) + ", not the uid in its name");
    return;
  }
  if (e.links != 1) {
    Quarantine(e.name, e.allocated_bytes,
               "has " + std::to_string(e.links) + " hard links (spool segments have one)");
    return;
  }
  if (e.has_hole) {
    Quarantine(e.name, e.allocated_bytes,
               "sparse (" + std::to_string(e.size) + " bytes, " +
                   std::to_string(e.allocated_bytes) +
                   " allocated): a spool writer only appends and never leaves a hole");
    return;
  }
  pass_bytes_ += e.allocated_bytes;
  pass_bytes_of_[parsed->uid] += e.allocated_bytes;
  if (known_.count(e.name) != 0) return;
  if (parsed->current) {
    if (e.size <= segment::kHeaderBytes) return;  // nothing in it yet
    // Take it out of the writers' way; they create a new current segment.
    for (int attempt = 0; attempt < 2; ++attempt) {
      const std::string sealed = segment::SpoolSealedName(parsed->uid, segment::NewSegmentId());
      const Status s = dir_->Rename(e.name, sealed);
      if (s.ok()) {
        Enqueue(parsed->uid, sealed, now + kSettle);
        return;
      }
      if (s.code() != StatusCode::kAlreadyExists) {
        if (s.code() != StatusCode::kNotFound) {
          Warn("cannot rename %s to %s: %s; trying again at the next scan", e.name.c_str(),
               sealed.c_str(), s.ToString().c_str());
        }
        return;
      }
    }
    return;
  }
  Enqueue(parsed->uid, e.name, now);
}

void SpoolAdopter::Enqueue(uid_t uid, const std::string& name, Clock::time_point ready_at) {
  if (!known_.insert(name).second) return;
  waiting_[uid].push_back(Waiting{name, ready_at, 0});
}

bool SpoolAdopter::Quarantine(const std::string& name, uint64_t bytes, const std::string& why) {
  if (dir_->quarantine_bytes() + bytes > config_.quarantine_bytes_max) {
    Warn("%s/%s %s, but the quarantine is full (quarantine_bytes_max %llu); leaving it where "
         "it is", config_.spool_dir.c_str(), name.c_str(), why.c_str(),
         static_cast<unsigned long long>(config_.quarantine_bytes_max));
    return false;
  }
  // <name>.<wall seconds>.<n>: never replaces an earlier file of the same
  // name (the port refuses to), so nothing in the quarantine is lost.
  const std::string stamp = std::to_string(clock_->WallSeconds());
  for (int attempt = 0; attempt < 64; ++attempt) {
    const std::string target = name + "." + stamp + "." + std::to_string(quarantine_seq_++);
    const Status s = dir_->Quarantine(name, target);
    if (s.ok()) {
      metrics_->spool_files_quarantined_total.fetch_add(1, std::memory_order_relaxed);
      metrics_->quarantine_bytes.store(dir_->quarantine_bytes(), std::memory_order_relaxed);
      Warn("moved %s to %s/%s: %s", name.c_str(), config_.quarantine_dir.c_str(), target.c_str(),
           why.c_str());
      return true;
    }
    if (s.code() == StatusCode::kNotFound) return false;  // gone meanwhile
    if (s.code() != StatusCode::kAlreadyExists) {
      Warn("cannot move %s/%s to the quarantine directory %s (%s): %s; leaving it",
           config_.spool_dir.c_str(), name.c_str(), config_.quarantine_dir.c_str(), why.c_str(),
           s.ToString().c_str());
      return false;
    }
  }
  return false;
}

Status SpoolAdopter::OpenCurrent(const std::string& name, uid_t uid) {
  auto c = std::make_unique<Current>();
  c->name = name;
  c->uid = uid;
  if (Status s = dir_->Open(name, &c->file); !s.ok()) return s;
  // The checks again, on the file that is read: the name may have been
  // replaced since it was listed.
  const SpoolEntry& e = c->file->entry();
  if (!e.regular || e.owner != uid || e.links != 1 || e.has_hole) {
    return Status(StatusCode::kPermissionDenied,
                  "not a regular, unlinked, non-sparse file owned by uid " + std::to_string(uid));
  }
  if (e.size < segment::kHeaderBytes && clock_->WallSeconds() - e.mtime_s < kYoungFileS) {
    // Shorter than a header: a writer that creates segments without
    // postspool's atomic create may still be writing it. Later; only an old
    // one is damaged.
    return Status(StatusCode::kTimedOut, "shorter than a segment header, and new");
  }
  // Wait for nothing: a writer holding the lock means "later".
  if (Status s = c->file->TrySeal(config_.durability == Durability::kSynced); !s.ok()) return s;
  segment::ReaderOptions options;
  options.verify_payload = VerifyPostPayload;
  options.step_bytes_max = config_.spool_read_bytes_max;
  Current* raw = c.get();
  options.on_skip = [this, raw](uint64_t offset, uint64_t bytes, segment::SkipReason reason) {
    raw->damaged_bytes += bytes;
    const uint64_t lost = segment::CountLostRecords(raw->file->source(), offset, bytes);
    metrics_->spool_bytes_damaged_total.fetch_add(bytes, std::memory_order_relaxed);
    metrics_->spool_records_lost_total.fetch_add(lost, std::memory_order_relaxed);
    Warn("%s: skipped %llu damaged bytes at offset %llu (%s): %llu record(s) lost; the other "
         "posts in it are kept",
         raw->name.c_str(), static_cast<unsigned long long>(bytes),
         static_cast<unsigned long long>(offset), segment::SkipReasonName(reason),
         static_cast<unsigned long long>(lost));
  };
  if (Status s = segment::SegmentReader::Open(c->file->source(), options, &c->reader); !s.ok()) {
    if (s.code() == StatusCode::kCorruption || s.code() == StatusCode::kUnsupported) {
      // The whole segment goes to the quarantine: count what it held.
      const uint64_t lost =
          segment::CountLostRecords(c->file->source(), 0, c->file->source()->size());
      metrics_->spool_records_lost_total.fetch_add(lost, std::memory_order_relaxed);
      return Status(s.code(), s.message() + " (" + std::to_string(lost) + " record(s) lost)",
                    s.sys_errno());
    }
    return s;
  }
  current_ = std::move(c);
  return Status::Ok();
}

bool SpoolAdopter::OpenNext() {
  const auto now = clock_->Now();
  for (int attempt = 0; attempt < kOpenAttemptsPerCall && !waiting_.empty(); ++attempt) {
    // Round-robin: the first uid at or after the cursor with a segment
    // ready, wrapping around once.
    auto it = waiting_.lower_bound(next_uid_);
    Waiting* pick = nullptr;
    uid_t uid = 0;
    for (size_t n = 0; n < waiting_.size(); ++n, ++it) {
      if (it == waiting_.end()) it = waiting_.begin();
      Waiting& w = it->second.front();
      if (w.ready_at <= now && (!uid_admitted_ || uid_admitted_(it->first))) {
        pick = &w;
        uid = it->first;
        break;
      }
    }
    if (pick == nullptr) return false;
    Waiting w = std::move(*pick);
    auto& queue = waiting_[uid];
    queue.pop_front();
    next_uid_ = uid + 1;  // the next pick starts with the next uid
    const Status s = OpenCurrent(w.name, uid);
    if (s.ok()) {
      if (queue.empty()) waiting_.erase(uid);
      return true;
    }
    // A symlink, directory or device planted under the name since the scan
    // (ELOOP, EISDIR, ENXIO) is no I/O error: it goes to the quarantine.
    const int err = s.sys_errno();
    const bool io_error = s.code() == StatusCode::kNoSpace ||
                          (s.code() == StatusCode::kIoError && err != ELOOP && err != EISDIR &&
                           err != ENXIO && err != ENODEV);
    if (s.code() == StatusCode::kTimedOut || io_error) {
      // A writer holds the lock, or opening, sealing or reading the header
      // failed with an I/O error (EIO, ENOSPC): retry later, behind this
      // uid's other segments, with a back-off; other uids go on meanwhile.
      // Never the quarantine for an I/O error: it is never read again, and
      // the segment holds acknowledged posts.
      if (io_error) {
        Warn("cannot open or seal %s: %s; trying again later", w.name.c_str(),
             s.ToString().c_str());
      } else {
        metrics_->spool_seal_busy_total.fetch_add(1, std::memory_order_relaxed);
      }
      ++w.seal_attempts;
      const auto delay = std::min<Clock::duration>(
          kSealRetryInitial * (1u << std::min<uint32_t>(w.seal_attempts, 16)), kSealRetryMax);
      w.ready_at = now + delay;
      queue.push_back(std::move(w));
      continue;
    }
    if (queue.empty()) waiting_.erase(uid);
    known_.erase(w.name);
    if (s.code() == StatusCode::kNotFound) continue;
    Quarantine(w.name, 0, "unreadable: " + s.ToString());
  }
  return false;
}

bool SpoolAdopter::Next(Adopted* out) {
  if (read_budget_spent_) return false;
  if (!current_ && !OpenNext()) return false;
  if (current_->at_end) return false;
  segment::Record rec;
  switch (current_->reader->Next(&rec)) {
    case segment::SegmentReader::Result::kRecord:
      out->payload = rec.payload;
      out->uid = current_->uid;
      return true;
    case segment::SegmentReader::Result::kYield:
      read_budget_spent_ = true;
      return false;
    case segment::SegmentReader::Result::kEnd:
      current_->at_end = true;
      if (const uint64_t torn = current_->reader->torn_tail_bytes(); torn > 0) {
        Warn("%s ends with %llu bytes of an unfinished record (a writer died mid-write)",
             current_->name.c_str(), static_cast<unsigned long long>(torn));
        current_->damaged_bytes += torn;
        metrics_->spool_bytes_torn_total.fetch_add(torn, std::memory_order_relaxed);
      }
      return false;
    case segment::SegmentReader::Result::kIoError:
      Warn("reading %s failed: %s; will read it again", current_->name.c_str(),
           current_->reader->io_status().ToString().c_str());
      Restart();
      return false;
  }
  return false;
}

void SpoolAdopter::MarkRejected(const std::string& why) {
  if (current_ && current_->rejected.empty()) current_->rejected = why;
}

void SpoolAdopter::Finish() {
  if (!current_) return;
  metrics_->spool_segments_adopted_total.fetch_add(1, std::memory_order_relaxed);
  const std::string name = current_->name;
  const uint64_t bytes = current_->file->entry().allocated_bytes;
  std::string keep_why;
  if (!current_->rejected.empty()) {
    keep_why = "adopted, but a post in it was refused: " + current_->rejected;
  } else if (current_->damaged_bytes > 0) {
    keep_why = "adopted, but " + std::to_string(current_->damaged_bytes) +
               " bytes of it were damaged";
  }
  current_.reset();
  known_.erase(name);
  if (!keep_why.empty()) {
    // Keep what was not journaled for an operator to look at; the good
    // records are journaled, and the quarantine is never read again. If
    // the quarantine is full the file stays in the spool and is adopted
    // again later (duplicates of its good records, never loss).
    Quarantine(name, bytes, keep_why);
    return;
  }
  if (Status s = dir_->Unlink(name); !s.ok() && s.code() != StatusCode::kNotFound) {
    Warn("cannot delete adopted segment %s: %s; its posts are journaled and would be adopted "
         "again", name.c_str(), s.ToString().c_str());
  }
}

void SpoolAdopter::Restart() {
  if (!current_) return;
  const uid_t uid = current_->uid;
  const std::string name = current_->name;
  current_.reset();
  waiting_[uid].push_front(Waiting{name, clock_->Now() + kSettle, 0});
}

size_t SpoolAdopter::segments_waiting() const {
  size_t n = current_ ? 1 : 0;
  for (const auto& [uid, q] : waiting_) n += q.size();
  return n;
}

}  // namespace postspool::daemon
