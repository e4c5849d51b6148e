#include "journal_feed.h"

#include <algorithm>
#include <optional>
#include <vector>

namespace postspool::daemon {

JournalFeed::JournalFeed(Storage* storage, int dirfd, JournalUsage* usage,
                         std::chrono::milliseconds checkpoint_interval, Events* events)
    : storage_(storage),
      dirfd_(dirfd),
      usage_(usage),
      checkpoint_interval_(checkpoint_interval),
      events_(events),
      reader_(dirfd, storage),
      again_(dirfd, storage) {}

void JournalFeed::set_source_factory(const JournalReader::SourceFactory& factory) {
  reader_.set_source_factory(factory);
  again_.set_source_factory(factory);
}

void JournalFeed::Start(JournalPosition start) {
  reader_.Seek(start);
  retry_at_ = Clock::time_point{};
  read_attempts_ = 0;
  again_failed_at_ = JournalPosition{};
  again_attempts_ = 0;
  read_high_ = start;
  skipped_seen_ = reader_.skipped_bytes();
  lost_seen_ = reader_.lost_records();
  // Created here once; after that every store is in place.
  checkpoint_.reset();
  create_failing_ = false;
  store_failing_ = false;
  checkpoint_faulted_ = false;
  if (Status s = Checkpoint::Open(dirfd_, start, &checkpoint_, storage_); !s.ok()) {
    checkpoint_faulted_ = true;
    CheckpointFailed(Events::CheckpointStep::kCreate, s);
  }
  written_ = start;
  stored_ = start;
  cleaned_at_ = JournalPosition{};
  next_checkpoint_at_ = Clock::time_point{};
}

JournalFeed::Read JournalFeed::Next(JournalPosition limit, Clock::time_point now,
                                    JournalReader::Entry* entry) {
  for (;;) {
    if (now < retry_at_) return Read::kWait;
    const JournalPosition before = reader_.position();
    if (auto it = damaged_.find(before.segment_seq);
        it != damaged_.end() && before >= it->second.at) {
      // Past the damage the segment is given up, but only once the ingest
      // loop writes elsewhere: while the committed end is in it, skipping
      // would put the reader (and the watermark) beyond the committed end.
      if (before.segment_seq >= limit.segment_seq) return Read::kWait;
      reader_.SkipSegment();
      continue;
    }
    bool got = false;
    const Status rs = reader_.Next(limit, entry, &got);
    AccountSkipped(before);
    if (!rs.ok()) {
      if (OnReadError(rs, now)) continue;
      return Read::kWait;
    }
    if (read_attempts_ > 0) {
      events_->OnReadRecovered(before);
      read_attempts_ = 0;
    }
    return got ? Read::kEntry : Read::kIdle;
  }
}

bool JournalFeed::OnReadError(const Status& why, Clock::time_point now) {
  const JournalPosition at = reader_.position();
  if (auto it = damaged_.find(at.segment_seq); it != damaged_.end()) {
    // Known already (read again after a reconnect): no retries, no report.
    it->second.at = std::min(it->second.at, at);
    read_attempts_ = 0;
    return true;
  }
  // A damaged header is the same on every read; an I/O error may pass.
  if (!Permanent(why) && ++read_attempts_ < kReadAttempts) {
    const std::chrono::milliseconds delay = RetryDelay(read_attempts_);
    retry_at_ = now + delay;
    events_->OnReadFailed(at, why, read_attempts_ + 1, delay);
    return false;
  }
  read_attempts_ = 0;
  ReportDamaged(at, why);
  return true;
}

JournalFeed::Again JournalFeed::ReadAgain(PostId id, JournalPosition at, JournalPosition next,
                                          Clock::time_point now, JournalReader::Entry* entry) {
  again_.Seek(at);
  bool got = false;
  if (Status rs = again_.Next(next, entry, &got); !rs.ok()) {
    if (again_failed_at_ != at) {
      again_failed_at_ = at;
      again_attempts_ = 0;
    }
    if (!Permanent(rs) && !damaged_.contains(at.segment_seq) &&
        ++again_attempts_ < kReadAttempts) {
      const std::chrono::milliseconds delay = RetryDelay(again_attempts_);
      retry_at_ = now + delay;
      events_->OnRereadFailed(id, at, rs, delay);
      return Again::kRetryLater;
    }
    // It cannot be read any more: the segment is damaged. Holding the
    // watermark for it would stop forwarding for good.
    again_attempts_ = 0;
    ReportDamaged(at, rs);
    events_->OnUnreadable(id, at, rs.ToString());
    return Again::kUnreadable;
  }
  if (!got || entry->position != at) {
    // The journal is immutable below the committed end, so this is damage
    // that appeared since the post was first read.
    events_->OnUnreadable(id, at, "the record is damaged");
    return Again::kUnreadable;
  }
  return Again::kEntry;
}

void JournalFeed::ReportDamaged(JournalPosition at, const Status& why) {
  if (!damaged_.emplace(at.segment_seq, Damage{at}).second) return;
  events_->OnSegmentDamaged(at, why, CountRecordsFrom(dirfd_, at.segment_seq, at.offset, storage_));
}

void JournalFeed::AccountSkipped(JournalPosition before) {
  const uint64_t bytes = reader_.skipped_bytes() - skipped_seen_;
  skipped_seen_ = reader_.skipped_bytes();
  const uint64_t records = reader_.lost_records() - lost_seen_;
  lost_seen_ = reader_.lost_records();
  // After a reconnect the same damage is skipped again: tell it once.
  if (bytes != 0 && before >= read_high_) events_->OnBytesSkipped(before, bytes, records);
  read_high_ = std::max(read_high_, reader_.position());
}

JournalPosition JournalFeed::Storable(JournalPosition w) const {
  return StorableCheckpoint(
      w, damaged_.empty() ? std::nullopt : std::optional(damaged_.begin()->second.at));
}

void JournalFeed::WriteWatermark(JournalPosition watermark) {
  const JournalPosition w = Storable(watermark);
  if (!checkpoint_ || w == written_) return;
  if (Status s = checkpoint_->Store(w); !s.ok()) {
    checkpoint_faulted_ = true;
    CheckpointFailed(Events::CheckpointStep::kStore, s);
    return;
  }
  checkpoint_faulted_ = false;
  written_ = w;
}

JournalFeed::Clock::time_point JournalFeed::checkpoint_due(JournalPosition w) const {
  return w != stored_ || w != cleaned_at_ ? next_checkpoint_at_ : Clock::time_point::max();
}

void JournalFeed::MaybeCheckpoint(JournalPosition w, Clock::time_point now, bool force) {
  if (w == stored_ && w == cleaned_at_) return;
  if (!force && now < next_checkpoint_at_) return;
  next_checkpoint_at_ = now + checkpoint_interval_;
  // Damaged segments are set aside first: one still in place bounds the
  // checkpoint (Storable).
  SetAsideDamaged(w);
  const JournalPosition c = Storable(w);
  if (!checkpoint_) {
    if (Status s = Checkpoint::Open(dirfd_, c, &checkpoint_, storage_); s.ok()) {
      events_->OnCheckpointCreated();
      create_failing_ = false;
      checkpoint_faulted_ = false;
      written_ = c;
    } else {
      checkpoint_faulted_ = true;
      CheckpointFailed(Events::CheckpointStep::kCreate, s);
    }
  }
  if (checkpoint_ && c != stored_) {
    WriteWatermark(w);
    const Status s =
        written_ == c ? checkpoint_->Sync() : Status(StatusCode::kIoError, "not written");
    if (s.ok()) {
      store_failing_ = false;
      stored_ = c;
    } else {
      CheckpointFailed(Events::CheckpointStep::kStore, s);
    }
  }
  // Deleting does not wait for the checkpoint (journal.h): on a full disk
  // with no checkpoint file, deleting is what makes room for one. With one,
  // it comes after the sync, so that a power loss rarely finds a stored
  // watermark in a deleted segment (which costs duplicates, not posts).
  std::vector<uint64_t> keep;
  for (const auto& [seq, damage] : damaged_) keep.push_back(seq);
  int deleted = 0;
  if (Status s = DeleteConfirmedSegments(dirfd_, w, usage_, &deleted, keep, storage_); !s.ok()) {
    events_->OnDeleteFailed(s);
  } else {
    cleaned_at_ = w;
  }
  if (deleted > 0) events_->OnDeleted(deleted, w);
}

void JournalFeed::CheckpointFailed(Events::CheckpointStep step, const Status& why) {
  bool& failing = step == Events::CheckpointStep::kCreate ? create_failing_ : store_failing_;
  if (!failing) events_->OnCheckpointFailed(step, why);
  failing = true;
}

void JournalFeed::SetAsideDamaged(JournalPosition w) {
  for (auto it = damaged_.begin(); it != damaged_.end() && it->first < w.segment_seq;) {
    std::string moved_to;
    const Status s = SetAsideDamagedSegment(dirfd_, it->first, usage_, &moved_to, storage_);
    if (s.ok() || s.code() == StatusCode::kNotFound) {
      if (s.ok()) events_->OnSegmentSetAside(it->first, moved_to);
      it = damaged_.erase(it);
      continue;
    }
    if (!it->second.move_failure_told) {
      events_->OnSetAsideFailed(it->first, s);
      it->second.move_failure_told = true;
    }
    ++it;
  }
}

}  // namespace postspool::daemon
