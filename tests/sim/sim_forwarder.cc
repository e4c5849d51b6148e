#include "sim_forwarder.h"

#include <algorithm>
#include <cassert>

namespace postspool::sim {
namespace {

using std::chrono::milliseconds;

constexpr int kPublishBatch = 256;                             // forwarder.cc
constexpr auto kStableConnection = std::chrono::seconds(10);   // forwarder_connection.cc

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
      seed_(seed),
      on_publish_(std::move(on_publish)),
      storage_(storage),
      dirfd_(dirfd),
      feed_(storage, dirfd, usage, milliseconds(config.checkpoint_interval_ms), this),
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
  done_when_written_ = 0;
  feed_.Start(start);
  reconnect_at_ = Clock::time_point{};
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
  if (!node_->fs.daemon_dead() && window_->WatermarkWriteDue(done_when_written_, kPublishBatch)) {
    feed_.WriteWatermark(window_->watermark());
    done_when_written_ = window_->done_total();
  }
  bool more = false;
  if (!blocked_) {
    int budget = kPublishBatch;
    daemon::PublishWindow::Due due;
    while (budget > 0 && feed_.CanRead(now) && window_->CanRepublish() &&
           window_->NextDue(now, &due)) {
      if (!Republish(due, now)) {
        LoseConnection(now);
        return false;
      }
      --budget;
    }
    const JournalPosition limit = commits_->end;
    while (budget > 0 && window_->CanPublishNew()) {
      daemon::JournalReader::Entry entry;
      const daemon::JournalFeed::Read r = feed_.Next(limit, now, &entry);
      if (r == daemon::JournalFeed::Read::kWait) break;
      if (r == daemon::JournalFeed::Read::kIdle) {
        window_->OnReaderIdle(feed_.position());
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
  v03::EncodeOptions options;
  options.topic_prefix = config_.post_topicPrefix;
  options.source = "sim";
  options.base_url_default = config_.post_baseUrl;
  return v03::Encode(post, options, &encoded_);
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
    feed_.Rewind(entry.position);
    return false;
  }
  window_->OnPublished(entry.position, entry.next, id);
  *published = true;
  return true;
}

bool SimForwarder::Republish(const daemon::PublishWindow::Due& due, Clock::time_point now) {
  daemon::JournalReader::Entry entry;
  switch (feed_.ReadAgain(due.id, due.position, due.next, now, &entry)) {
    case daemon::JournalFeed::Again::kRetryLater:
      return true;
    case daemon::JournalFeed::Again::kUnreadable:
      window_->OnUnreadable(due.handle);
      return true;
    case daemon::JournalFeed::Again::kEntry:
      break;
  }
  if (Status es = EncodePost(PostFromPayload(entry.payload)); !es.ok()) {
    OnUnreadable(due.id, due.position, es.message());
    window_->OnUnreadable(due.handle);
    return true;
  }
  if (on_publish_) on_publish_(PostFromPayload(entry.payload));
  if (!broker_->Publish(due.id, due.position, now)) return false;
  window_->OnRepublished(due.handle);
  return true;
}

void SimForwarder::MaybeCheckpoint(Clock::time_point now, bool force) {
  if (node_->fs.daemon_dead()) return;
  feed_.MaybeCheckpoint(window_->watermark(), now, force);
}

namespace {

std::string Where(JournalPosition p) {
  return std::to_string(p.segment_seq) + ":" + std::to_string(p.offset);
}

}  // namespace

void SimForwarder::OnReadFailed(JournalPosition at, const Status& why, int attempt,
                                std::chrono::milliseconds) {
  node_->Trace("forwarder: cannot read the journal at " + Where(at) + ": " + why.ToString() +
               " (attempt " + std::to_string(attempt) + " next)");
}

void SimForwarder::OnBytesSkipped(JournalPosition before, uint64_t bytes, uint64_t records) {
  node_->Trace("forwarder: skipped " + std::to_string(bytes) + " damaged bytes (" +
               std::to_string(records) + " records) after " + Where(before));
}

void SimForwarder::OnSegmentDamaged(JournalPosition at, const Status& why, uint64_t records) {
  ++damaged_reported_;
  node_->Trace("forwarder: journal segment " + std::to_string(at.segment_seq) +
               " is damaged from " + Where(at) + " (" + std::to_string(records) +
               " records): " + why.ToString());
}

void SimForwarder::OnSegmentSetAside(uint64_t, const std::string& moved_to) {
  node_->Trace("forwarder: moved a damaged journal segment to " + moved_to);
}

void SimForwarder::OnSetAsideFailed(uint64_t seq, const Status& why) {
  node_->Trace("forwarder: cannot move damaged segment " + std::to_string(seq) +
               " aside: " + why.ToString());
}

void SimForwarder::OnRereadFailed(PostId, JournalPosition at, const Status& why,
                                  std::chrono::milliseconds) {
  node_->Trace("forwarder: cannot read the post at " + Where(at) + " again: " + why.ToString());
}

void SimForwarder::OnUnreadable(PostId, JournalPosition at, const std::string& why) {
  node_->Trace("forwarder: the post at " + Where(at) + " can no longer be read: " + why);
}

void SimForwarder::OnCheckpointFailed(CheckpointStep step, const Status& why) {
  node_->Trace(std::string("forwarder: cannot ") +
               (step == CheckpointStep::kCreate ? "create" : "store") +
               " the checkpoint: " + why.ToString());
}

void SimForwarder::OnDeleteFailed(const Status& why) {
  node_->Trace("forwarder: cannot delete confirmed segments: " + why.ToString());
}

void SimForwarder::OnAck(uint64_t tag, bool multiple) {
  const auto r = window_->OnAck(tag, multiple, now_);
  confirms_this_connection_ += r.confirmed;
}

void SimForwarder::OnNack(uint64_t tag, bool multiple) { (void)window_->OnNack(tag, multiple, now_); }

void SimForwarder::OnReturn(PostId id) { (void)window_->OnReturn(id); }

}  // namespace postspool::sim
