#include "sim_forwarder.h"

#include <algorithm>
#include <cassert>

namespace postspool::sim {
namespace {

using std::chrono::milliseconds;

constexpr int kPublishBatch = 64;                              // forwarder.cc
constexpr auto kStableConnection = std::chrono::seconds(10);   // forwarder.cc
constexpr auto kJournalRetryDelay = std::chrono::seconds(1);   // forwarder.cc
constexpr int kJournalReadAttempts = 5;                        // forwarder.cc

}  // namespace

// --- FakeBroker -------------------------------------------------------------------

void FakeBroker::Heal(Clock::time_point now) {
  down_until_ = now;
  blocked_until_ = now;
}

bool FakeBroker::Connect(Clock::time_point now) {
  assert(!connected_);
  if (now < down_until_) {
    stats_->Fault("broker.connect_refused");
    return false;
  }
  connected_ = true;
  broken_ = false;
  blocked_sent_ = false;
  next_tag_ = 1;
  pending_.clear();
  return true;
}

void FakeBroker::Disconnect() {
  connected_ = false;
  broken_ = false;
  pending_.clear();
}

bool FakeBroker::Publish(PostId id, JournalPosition pos, Clock::time_point now) {
  assert(connected_);
  if (broken_) return false;
  Pending p{next_tag_++, id, true, false, now + milliseconds(rng_.Below(4))};
  if (rng_.Ppm(rates_.nack_per_publish)) {
    stats_->Fault("broker.nack");
    p.ack = false;
  } else if (rng_.Ppm(rates_.return_per_publish)) {
    stats_->Fault("broker.return_unroutable");
    p.returned = true;
  }
  if (rng_.Ppm(rates_.slow_confirm_per_publish)) {
    stats_->Fault("broker.slow_confirm");
    p.ready_at = now + milliseconds(rng_.Range(100, 2000));
  }
  if (p.ack && !p.returned) {
    Ledger& l = ledger_[id];
    const bool again = std::find(l.positions.begin(), l.positions.end(), pos) != l.positions.end();
    if (l.enqueued == 0) {
      l.first_epoch = epoch_;
    } else {
      ++dups_total_;
      if (l.first_epoch < epoch_ && l.counted_epoch < epoch_) {
        l.counted_epoch = epoch_;
        ++cross_dups_[epoch_];
        if (!again) ++cross_twice_[epoch_];
        auto [since, added] = cross_since_.try_emplace(epoch_, l.last_epoch);
        if (!added) since->second = std::min(since->second, l.last_epoch);
      }
    }
    l.last_epoch = epoch_;
    if (!again && l.positions.size() < 8) l.positions.push_back(pos);
    ++l.enqueued;
    ++enqueued_total_;
  }
  pending_.push_back(p);
  return true;
}

void FakeBroker::Deliver(const Pending& p, bool multiple, Handler* h) {
  if (p.returned) h->OnReturn(p.id);
  if (!p.ack) {
    h->OnNack(p.tag, multiple);
    return;
  }
  if (!p.returned) {
    ledger_[p.id].confirmed = true;
  } else if (policy == daemon::UnroutablePolicy::kDrop) {
    ledger_[p.id].dropped = true;
  }
  h->OnAck(p.tag, multiple);
}

bool FakeBroker::ReadFrames(Clock::time_point now, Handler* h) {
  assert(connected_);
  if (broken_) return false;
  if (now < blocked_until_) {
    if (!blocked_sent_) {
      blocked_sent_ = true;
      h->OnBlocked();
    }
  } else if (blocked_sent_) {
    blocked_sent_ = false;
    h->OnUnblocked();
  }
  // Several confirms at once: the longest prefix of ready acks.
  if (pending_.size() >= 2 && rng_.OneIn(4)) {
    size_t n = 0;
    while (n < pending_.size() && pending_[n].ready_at <= now && pending_[n].ack) ++n;
    if (n >= 2) {
      for (size_t i = 0; i < n; ++i) {
        if (pending_[i].returned) h->OnReturn(pending_[i].id);
        if (!pending_[i].returned) {
          ledger_[pending_[i].id].confirmed = true;
        } else if (policy == daemon::UnroutablePolicy::kDrop) {
          ledger_[pending_[i].id].dropped = true;
        }
      }
      const uint64_t tag = pending_[n - 1].tag;
      pending_.erase(pending_.begin(), pending_.begin() + static_cast<ptrdiff_t>(n));
      h->OnAck(tag, true);
    }
  }
  // Then one at a time, sometimes out of order.
  std::vector<Pending> ready;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->ready_at <= now) {
      ready.push_back(*it);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  if (ready.size() >= 2 && rng_.OneIn(8)) {
    std::swap(ready[rng_.Below(ready.size())], ready[rng_.Below(ready.size())]);
  }
  for (const Pending& p : ready) Deliver(p, false, h);
  return true;
}

void FakeBroker::Step(Clock::time_point now) {
  if (connected_ && !broken_ && rng_.Ppm(rates_.disconnect_per_step)) {
    stats_->Fault("broker.disconnect");
    broken_ = true;
  }
  if (now >= down_until_ && rng_.Ppm(rates_.down_per_step)) {
    stats_->Fault("broker.down");
    down_until_ = now + milliseconds(rng_.Range(50, 3000));
    if (connected_) broken_ = true;
  }
  if (now >= blocked_until_ && rng_.Ppm(rates_.blocked_per_step)) {
    stats_->Fault("broker.blocked");
    blocked_until_ = now + milliseconds(rng_.Range(10, 1000));
  }
}

// --- SimForwarder ------------------------------------------------------------------

SimForwarder::SimForwarder(const daemon::Config& config, Options options, SimNode* node,
                           FakeBroker* broker, SimCommits* commits, daemon::JournalUsage* usage,
                           daemon::Storage* storage, int dirfd, uint64_t seed, std::function<void(const fb::Post&)> on_publish)
    : config_(config),
      options_(options),
      node_(node),
      broker_(broker),
      commits_(commits),
      usage_(usage),
      seed_(seed),
      on_publish_(std::move(on_publish)),
      storage_(storage),
      dirfd_(dirfd),
      reader_(dirfd, storage),
      retry_reader_(dirfd, storage),
      connect_backoff_(config.reconnect_delay_initial_ms, config.reconnect_delay_max_ms, seed) {}

SimForwarder::~SimForwarder() {
  if (connected_) broker_->Disconnect();
}

Status SimForwarder::Start() {
  JournalPosition start;
  Status s = daemon::Checkpoint::Load(dirfd_, &start, storage_);
  if (s.code() == StatusCode::kCorruption) {
    start = JournalPosition{};
  } else if (!s.ok()) {
    return s;
  }
  daemon::PublishWindow::Options wo;
  wo.window_max = config_.publish_window_max;
  wo.unroutable_policy = config_.unroutable_policy;
  wo.retry_delay_initial_ms = config_.republish_delay_initial_ms;
  wo.retry_delay_max_ms = config_.republish_delay_max_ms;
  wo.seed = seed_ ^ 0x9e3779b97f4a7c15ull;
  window_ = std::make_unique<daemon::PublishWindow>(wo, start);
  reader_.Seek(start);
  stored_checkpoint_ = start;
  written_checkpoint_ = start;
  cleaned_at_ = JournalPosition{};
  checkpoint_.reset();
  reconnect_at_ = Clock::time_point{};
  journal_retry_at_ = Clock::time_point{};
  next_checkpoint_at_ = Clock::time_point{};
  idle_at_limit_ = JournalPosition{};
  return Status::Ok();
}

bool SimForwarder::Step(Clock::time_point now) {
  now_ = now;
  bool busy = false;
  if (!connected_) {
    if (now >= reconnect_at_) {
      Connect(now);
      busy = connected_;
    }
  } else {
    busy = Pump(now);
  }
  MaybeCheckpoint(now, options_.checkpoint_every_move);  // every move: sync each time too
  return busy;
}

void SimForwarder::Stop(Clock::time_point now) {
  if (connected_) {
    broker_->Disconnect();
    connected_ = false;
  }
  MaybeCheckpoint(now, true);
}

void SimForwarder::Connect(Clock::time_point now) {
  if (!broker_->Connect(now)) {
    ScheduleReconnect(now);
    return;
  }
  connected_ = true;
  blocked_ = false;
  connected_at_ = now;
  confirms_this_connection_ = 0;
  // The window kept what the last channel confirmed; the reader goes on
  // where it was (publish_window.h, Reset).
  assert(window_->in_flight() == 0);
  idle_at_limit_ = JournalPosition{};
}

void SimForwarder::ScheduleReconnect(Clock::time_point now) {
  reconnect_at_ = now + connect_backoff_.Next();
}

void SimForwarder::LoseConnection(Clock::time_point now) {
  broker_->Disconnect();
  connected_ = false;
  if (confirms_this_connection_ > 0 || now - connected_at_ >= kStableConnection) {
    connect_backoff_.Reset();
  }
  window_->Reset(now);
  idle_at_limit_ = JournalPosition{};
  blocked_ = false;
  ScheduleReconnect(now);
}

bool SimForwarder::Pump(Clock::time_point now) {
  if (!broker_->ReadFrames(now, this)) {
    LoseConnection(now);
    return false;
  }
  WriteWatermark();
  bool more = false;
  if (!blocked_) {
    int budget = kPublishBatch;
    daemon::PublishWindow::Due due;
    while (budget > 0 && now >= journal_retry_at_ && window_->CanRepublish() &&
           window_->NextDue(now, &due)) {
      if (!Republish(due, now)) {
        LoseConnection(now);
        return false;
      }
      --budget;
    }
    const JournalPosition limit = commits_->end;
    while (budget > 0 && now >= journal_retry_at_ && window_->CanPublishNew()) {
      const JournalPosition before = reader_.position();
      if (auto it = damaged_.find(before.segment_seq);
          it != damaged_.end() && before >= it->second.at) {
        // As forwarder.cc: given up once the ingest loop writes elsewhere.
        if (before.segment_seq >= limit.segment_seq) break;
        reader_.SkipSegment();
        continue;
      }
      daemon::JournalReader::Entry entry;
      bool got = false;
      const uint64_t skipped_before = reader_.skipped_bytes();
      const Status rs = reader_.Next(limit, &entry, &got);
      if (reader_.skipped_bytes() != skipped_before) {
        node_->Trace("forwarder: skipped " +
                     std::to_string(reader_.skipped_bytes() - skipped_before) +
                     " damaged bytes after " + std::to_string(before.segment_seq) + ":" +
                     std::to_string(before.offset));
      }
      if (!rs.ok()) {
        node_->Trace("forwarder: cannot read the journal: " + rs.ToString());
        if (OnJournalReadError(rs, now)) continue;
        break;
      }
      read_attempts_ = 0;
      if (!got) {
        window_->OnReaderIdle(reader_.position());
        idle_at_limit_ = std::max(idle_at_limit_, limit);
        break;
      }
      bool published = false;
      if (!PublishNew(entry, now, &published)) {
        LoseConnection(now);
        return false;
      }
      if (published) --budget;
    }
    more = budget == 0;
  }
  return more;
}

Status SimForwarder::EncodePost(const fb::Post& post) {
  const fb::Post* p = &post;
  if (post.base_url() == nullptr || post.base_url()->size() == 0) {
    PostData data = ReadPost(post);
    data.base_url = config_.post_baseUrl;
    BuildPost(data, &builder_);
    p = fb::GetPost(builder_.GetBufferPointer());
  }
  v03::EncodeOptions options;
  options.topic_prefix = config_.post_topicPrefix;
  options.source = "sim";
  return v03::Encode(*p, options, &encoded_);
}

bool SimForwarder::PublishNew(const daemon::JournalReader::Entry& entry, Clock::time_point now,
                              bool* published) {
  *published = false;
  const fb::Post& post = PostFromPayload(entry.payload);
  const PostId id{post.id()->hi(), post.id()->lo()};
  if (Status es = EncodePost(post); !es.ok()) {
    window_->OnSkipped(entry.position, entry.next);
    return true;
  }
  if (on_publish_) on_publish_(post);
  if (!broker_->Publish(id, entry.position, now)) {
    // Not in the window: the reader reads it again on the next connection.
    reader_.Seek(entry.position);
    return false;
  }
  window_->OnPublished(entry.position, entry.next, id);
  *published = true;
  return true;
}

bool SimForwarder::Republish(const daemon::PublishWindow::Due& due, Clock::time_point now) {
  retry_reader_.Seek(due.position);
  daemon::JournalReader::Entry entry;
  bool got = false;
  if (Status rs = retry_reader_.Next(due.next, &entry, &got); !rs.ok()) {
    // As forwarder.cc: a damaged header (or a read failing kJournalReadAttempts
    // times) reports the segment damaged and gives the post up; retrying a
    // damaged header forever would stop forwarding for good.
    if (republish_failed_at_ != due.position) {
      republish_failed_at_ = due.position;
      republish_attempts_ = 0;
    }
    const bool damaged = rs.code() == StatusCode::kCorruption ||
                         rs.code() == StatusCode::kUnsupported ||
                         damaged_.contains(due.position.segment_seq);
    if (!damaged && ++republish_attempts_ < kJournalReadAttempts) {
      node_->Trace("forwarder: cannot read a post again: " + rs.ToString());
      journal_retry_at_ = now + kJournalRetryDelay;
      return true;
    }
    republish_attempts_ = 0;
    ReportDamagedSegment(due.position, rs);
    window_->OnUnreadable(due.handle);
    return true;
  }
  Status es;
  if (got && entry.position == due.position) es = EncodePost(PostFromPayload(entry.payload));
  if (!got || entry.position != due.position || !es.ok()) {
    node_->Trace("forwarder: post at " + std::to_string(due.position.segment_seq) + ":" +
                 std::to_string(due.position.offset) + " can no longer be read (got " +
                 std::to_string(got) + ")");
    window_->OnUnreadable(due.handle);
    return true;
  }
  if (on_publish_) on_publish_(PostFromPayload(entry.payload));
  if (!broker_->Publish(due.id, due.position, now)) return false;
  window_->OnRepublished(due.handle);
  return true;
}

void SimForwarder::WriteWatermark() {
  if (node_->fs.daemon_dead()) return;
  const JournalPosition w = CheckpointWatermark();
  if (!checkpoint_ || w == written_checkpoint_) return;
  if (Status s = checkpoint_->Store(w); !s.ok()) {
    node_->Trace("forwarder: cannot write the checkpoint: " + s.ToString());
    checkpoint_faulted_ = true;
    return;
  }
  checkpoint_faulted_ = false;
  written_checkpoint_ = w;
}

void SimForwarder::MaybeCheckpoint(Clock::time_point now, bool force) {
  if (node_->fs.daemon_dead()) return;
  const JournalPosition w = window_->watermark();
  if (w == stored_checkpoint_ && w == cleaned_at_) return;
  if (!force && now < next_checkpoint_at_) return;
  next_checkpoint_at_ = now + milliseconds(config_.checkpoint_interval_ms);
  // As forwarder.cc: damaged segments set aside first, then the checkpoint
  // bounded by those still in place.
  SetAsideDamagedSegments(w);
  const JournalPosition c = CheckpointWatermark();
  if (!checkpoint_) {
    if (Status s = daemon::Checkpoint::Open(dirfd_, c, &checkpoint_, storage_); s.ok()) {
      written_checkpoint_ = c;
      checkpoint_faulted_ = false;
    } else {
      node_->Trace("forwarder: cannot create the checkpoint: " + s.ToString());
      checkpoint_faulted_ = true;
    }
  }
  if (checkpoint_ && c != stored_checkpoint_) {
    WriteWatermark();
    if (written_checkpoint_ == c) {
      if (Status s = checkpoint_->Sync(); s.ok()) {
        stored_checkpoint_ = c;
      } else {
        node_->Trace("forwarder: cannot sync the checkpoint: " + s.ToString());
      }
    }
  }
  // As forwarder.cc: deleting does not wait for the checkpoint.
  std::vector<uint64_t> keep;
  for (const auto& [seq, damaged] : damaged_) keep.push_back(seq);
  int deleted = 0;
  if (daemon::DeleteConfirmedSegments(dirfd_, w, usage_, &deleted, keep, storage_).ok()) {
    cleaned_at_ = w;
  }
}

bool SimForwarder::OnJournalReadError(const Status& why, Clock::time_point now) {
  const JournalPosition at = reader_.position();
  if (auto it = damaged_.find(at.segment_seq); it != damaged_.end()) {
    it->second.at = std::min(it->second.at, at);
    read_attempts_ = 0;
    return true;
  }
  const bool damaged =
      why.code() == StatusCode::kCorruption || why.code() == StatusCode::kUnsupported;
  if (!damaged && ++read_attempts_ < kJournalReadAttempts) {
    journal_retry_at_ = now + kJournalRetryDelay;
    return false;
  }
  read_attempts_ = 0;
  ReportDamagedSegment(at, why);
  return true;
}

void SimForwarder::ReportDamagedSegment(JournalPosition at, const Status& why) {
  if (!damaged_.emplace(at.segment_seq, Damaged{at}).second) return;
  ++damaged_reported_;
  node_->Trace("forwarder: journal segment " + std::to_string(at.segment_seq) +
               " is damaged: " + why.ToString());
}

JournalPosition SimForwarder::CheckpointWatermark() const {
  return daemon::StorableCheckpoint(
      window_->watermark(),
      damaged_.empty() ? std::nullopt : std::optional(damaged_.begin()->second.at));
}

void SimForwarder::SetAsideDamagedSegments(JournalPosition watermark) {
  for (auto it = damaged_.begin(); it != damaged_.end() && it->first < watermark.segment_seq;) {
    std::string moved_to;
    const Status s = daemon::SetAsideDamagedSegment(dirfd_, it->first, usage_, &moved_to, storage_);
    if (s.ok() || s.code() == StatusCode::kNotFound) {
      if (s.ok()) node_->Trace("forwarder: moved a damaged journal segment to " + moved_to);
      it = damaged_.erase(it);
      continue;
    }
    ++it;
  }
}

void SimForwarder::OnAck(uint64_t tag, bool multiple) {
  const auto r = window_->OnAck(tag, multiple, now_);
  confirms_this_connection_ += r.confirmed;
}

void SimForwarder::OnNack(uint64_t tag, bool multiple) { (void)window_->OnNack(tag, multiple, now_); }

void SimForwarder::OnReturn(PostId id) { (void)window_->OnReturn(id); }

}  // namespace postspool::sim
