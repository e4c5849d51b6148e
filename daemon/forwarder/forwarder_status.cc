// The forwarder's status and what its journal feed reports: the
// connection state, the backlog count, the age of the oldest post, the
// snapshot for `postspool status`, and the feed's events in the log and
// the metrics.
#include "forwarder.h"

#include <cinttypes>

#include "forwarder_internal.h"
#include "log.h"

namespace postspool::daemon {

using namespace forwarder_internal;

namespace {

// Backlog counting: records counted per round of the thread, and how often
// the post at the watermark is read again for its age.
constexpr int kCountBatch = 4096;
constexpr auto kPeekInterval = milliseconds(500);

}  // namespace

// ---------------------------------------------------------------------------
// What the journal feed reports

void Forwarder::OnReadFailed(JournalPosition at, const Status& why, int attempt,
                             milliseconds delay) {
  PS_LOG_WARNING("forwarder: cannot read the journal at %s: %s; trying again in %s "
                 "(attempt %d of %d)",
                 FormatPosition(at).c_str(), why.ToString().c_str(),
                 FormatSeconds(delay).c_str(), attempt, JournalFeed::kReadAttempts);
}

void Forwarder::OnReadRecovered(JournalPosition at) {
  PS_LOG_INFO("forwarder: reading the journal at %s works again", FormatPosition(at).c_str());
}

void Forwarder::OnBytesSkipped(JournalPosition before, uint64_t bytes, uint64_t records) {
  Add(metrics_->journal_bytes_skipped_total, bytes);
  Add(metrics_->journal_records_lost_total, records);
  PS_LOG_WARNING("forwarder: skipped %" PRIu64 " damaged bytes in the journal after %s: %" PRIu64
                 " record(s) lost",
                 bytes, FormatPosition(before).c_str(), records);
}

void Forwarder::OnSegmentDamaged(JournalPosition at, const Status& why, uint64_t records) {
  metrics_->journal_segments_damaged_total.fetch_add(1, std::memory_order_relaxed);
  Add(metrics_->journal_records_lost_total, records);
  PS_LOG_ERROR("forwarder: journal segment %s/%s is damaged (%s); its posts after offset "
               "%" PRIu64 " (%" PRIu64 " record(s) found there) cannot be published. Publishing "
               "goes on with the next segment; this one is kept in %s/damaged/ once the "
               "forwarder is past it",
               config_.journal_dir.c_str(), JournalSegmentName(at.segment_seq).c_str(),
               why.ToString().c_str(), at.offset, records, config_.journal_dir.c_str());
}

void Forwarder::OnSegmentSetAside(uint64_t seq, const std::string& moved_to) {
  PS_LOG_WARNING("forwarder: moved the damaged journal segment %s to %s/%s",
                 JournalSegmentName(seq).c_str(), config_.journal_dir.c_str(), moved_to.c_str());
}

void Forwarder::OnSetAsideFailed(uint64_t seq, const Status& why) {
  PS_LOG_ERROR("forwarder: cannot move the damaged journal segment %s/%s aside: %s; it "
               "stays where it is and is not deleted; trying again every %u ms",
               config_.journal_dir.c_str(), JournalSegmentName(seq).c_str(),
               why.ToString().c_str(), config_.checkpoint_interval_ms);
}

void Forwarder::OnRereadFailed(PostId id, JournalPosition at, const Status& why,
                               milliseconds delay) {
  PS_LOG_WARNING("forwarder: cannot read post %s again from the journal at %s: %s; trying "
                 "again in %s",
                 IdString(id).c_str(), FormatPosition(at).c_str(), why.ToString().c_str(),
                 FormatSeconds(delay).c_str());
}

void Forwarder::OnUnreadable(PostId id, JournalPosition at, const std::string& why) {
  PS_LOG_ERROR("forwarder: post %s at journal position %s can no longer be read from the "
               "journal (%s); it is skipped",
               IdString(id).c_str(), FormatPosition(at).c_str(), why.c_str());
}

void Forwarder::OnCheckpointFailed(CheckpointStep step, const Status& why) {
  if (step == CheckpointStep::kCreate) {
    PS_LOG_ERROR("forwarder: cannot create the journal checkpoint file in %s: %s; publishing "
                 "and deleting confirmed segments go on without it (a restart publishes again "
                 "from the oldest segment); trying again every %u ms",
                 config_.journal_dir.c_str(), why.ToString().c_str(),
                 config_.checkpoint_interval_ms);
    return;
  }
  PS_LOG_ERROR("forwarder: cannot store the journal checkpoint: %s; trying again every %u ms "
               "(a crash now publishes more than one window again)",
               why.ToString().c_str(), config_.checkpoint_interval_ms);
}

void Forwarder::OnCheckpointCreated() {
  PS_LOG_INFO("forwarder: created the journal checkpoint file");
}

void Forwarder::OnDeleteFailed(const Status& why) {
  PS_LOG_ERROR("forwarder: cannot delete confirmed journal segments: %s; trying again at the "
               "next checkpoint",
               why.ToString().c_str());
}

void Forwarder::OnDeleted(int segments, JournalPosition before) {
  PS_LOG_DEBUG("forwarder: deleted %d confirmed journal segments before %s", segments,
               FormatPosition(before).c_str());
}

// ---------------------------------------------------------------------------
// Status

void Forwarder::SetConnectionState(const char* state, const std::string* error) {
  conn_state_ = state;
  if (error != nullptr) {
    last_error_ = *error;
    last_error_unix_ms_ = UnixMsNow();
  }
  UpdateSnapshot();
}

bool Forwarder::CountBacklog() {
  // Behind the watermark (publishing outran counting): the records before
  // it are the done ones, the segments there may be deleted already.
  if (count_reader_.position() < window_->watermark()) {
    count_reader_.Seek(window_->watermark());
    counted_ = window_->done_total();
  }
  const JournalPosition limit = commits_->committed();
  for (int i = 0; i < kCountBatch; ++i) {
    JournalReader::Entry entry;
    bool got = false;
    if (Status s = count_reader_.Next(limit, &entry, &got); !s.ok()) {
      // Only counting: the main reader decides about damage and reports it.
      count_reader_.SkipSegment();
      continue;
    }
    if (!got) {
      count_caught_up_ = true;
      return false;
    }
    ++counted_;
  }
  count_caught_up_ = false;
  return true;
}

void Forwarder::PeekOldest(Clock::time_point now) {
  const JournalPosition at = window_->watermark();
  const JournalPosition limit = commits_->committed();
  if (now < next_peek_ || (at == peeked_at_ && (oldest_pub_ns_ != 0 || limit == peeked_limit_))) {
    return;
  }
  next_peek_ = now + kPeekInterval;
  peeked_at_ = at;
  peeked_limit_ = limit;
  oldest_pub_ns_ = 0;
  peek_reader_.Seek(at);
  JournalReader::Entry entry;
  bool got = false;
  if (Status s = peek_reader_.Next(limit, &entry, &got); s.ok() && got) {
    oldest_pub_ns_ = PostFromPayload(entry.payload).pub_time_ns();
  }
}

void Forwarder::UpdateSnapshot() {
  Snapshot s;
  s.broker = brokers_.empty() ? std::string() : brokers_[broker_index_].display;
  s.state = conn_state_;
  s.last_error = last_error_;
  s.last_error_unix_ms = last_error_unix_ms_;
  if (!session_ && conn_state_ == "waiting") {
    const auto left = std::chrono::duration_cast<milliseconds>(reconnect_at_ - Clock::now());
    s.next_attempt_in_ms = std::max<int64_t>(0, left.count());
  }
  s.reconnect_delay_ms = reconnect_delay_ms_;
  s.connect_failures_in_row = connect_failures_in_row_;
  const uint64_t done = window_ ? window_->done_total() : 0;
  s.backlog_posts = counted_ > done ? counted_ - done : 0;
  s.backlog_posts_exact = count_caught_up_ && count_reader_.position() >= commits_->committed();
  // Everything committed is confirmed: nothing is old, whatever the last
  // peek (at most kPeekInterval ago) read.
  const bool empty = window_ && window_->watermark() >= commits_->committed();
  s.oldest_unconfirmed_pub_unix_ns = empty ? 0 : oldest_pub_ns_;
  s.in_flight = window_ ? window_->in_flight() : 0;
  s.waiting = window_ ? window_->waiting() : 0;
  if (session_ && !blocked_) {
    const BrokerPath::Fault fault = path_.fault(Clock::now(), s.in_flight + s.waiting > 0);
    if (fault != BrokerPath::Fault::kNone) s.path_fault = FaultName(fault);
  }
  s.path_changes = path_changes_;
  s.last_path_change = last_path_change_;
  // Waiting posts count: a refusal that never ends is a stall too.
  if (s.in_flight + s.waiting == 0) {
    last_progress_ = Clock::time_point{};
  } else {
    // The first look with posts in flight starts the clock.
    if (last_progress_ == Clock::time_point{}) last_progress_ = Clock::now();
    s.confirm_wait_ms = std::chrono::duration_cast<milliseconds>(Clock::now() - last_progress_).count();
  }
  s.last_unroutable_drop_unix_ms = last_drop_unix_ms_;
  if (standby_.open()) {
    s.standby = brokers_[standby_.broker_index()].display;
    s.standby_ready = standby_.warm();
  }
  std::lock_guard lock(snapshot_mu_);
  snapshot_ = std::move(s);
}

Forwarder::Snapshot Forwarder::snapshot() const {
  std::lock_guard lock(snapshot_mu_);
  return snapshot_;
}

bool Forwarder::TrySnapshot(Snapshot* out) const {
  std::unique_lock lock(snapshot_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  *out = snapshot_;
  return true;
}

void Forwarder::RequestReconnect() {
  reconnect_requested_.store(true);
  Wake();
}

uint64_t Forwarder::CountRecords(JournalPosition from, JournalPosition limit,
                                 Clock::time_point deadline, bool* complete) {
  peek_reader_.Seek(from);
  uint64_t n = 0;
  *complete = false;
  for (;;) {
    if ((n & 1023) == 0 && Clock::now() >= deadline) return n;
    JournalReader::Entry entry;
    bool got = false;
    if (Status s = peek_reader_.Next(limit, &entry, &got); !s.ok()) {
      peek_reader_.SkipSegment();
      if (peek_reader_.position() >= limit) break;
      continue;
    }
    if (!got) break;
    ++n;
  }
  *complete = true;
  return n;
}

}  // namespace postspool::daemon
