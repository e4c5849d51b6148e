// The forwarder's side of the simulation.
//
// FakeBroker: one AMQP channel with publisher confirms at a time. Each
// publication is routed (enqueued, then acked), nacked, or returned
// (mandatory, unroutable: basic.return, then its ack); confirms come after a
// delay (sometimes a long one), sometimes out of order, sometimes several at
// once (`multiple`). Faults: the connection drops (unconfirmed tags are
// void; what was enqueued stays enqueued), the broker is down for a while
// (connects are refused), connection.blocked for a while. The broker keeps
// the ledger the checker reads: how often each post id was enqueued, and in
// which crash epoch, and which ids were confirmed.
//
// SimForwarder: the loop of daemon/forwarder/forwarder.cc and forwarder_connection.cc
// (Run, Connect, Pump, Republish, LoseConnection) on one thread with virtual time, over the real
// PublishWindow, the real v03 encoder and the real JournalFeed (reading,
// damaged segments, the checkpoint and deleting confirmed segments, on the
// simulated disk). Keep its connection loop in step with the forwarder: it is
// a mirror, not a model of a better forwarder.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "backoff.h"
#include "config.h"
#include "flatbuffers/flatbuffers.h"
#include "post.h"
#include "publish_window.h"
#include "journal.h"
#include "journal_feed.h"
#include "sim_node.h"
#include "storage.h"
#include "v03_encoder.h"

namespace postspool::sim {

using daemon::JournalPosition;

// Where the Ingest publishes the committed end (the daemon's CommitChannel,
// without its eventfd: the simulation steps the forwarder itself).
struct SimCommits {
  JournalPosition end;
  void Publish(JournalPosition e) {
    if (e > end) end = e;
  }
};

struct BrokerRates {  // ppm
  uint32_t disconnect_per_step = 0;
  uint32_t down_per_step = 0;       // the broker goes down for a while
  uint32_t blocked_per_step = 0;    // connection.blocked for a while
  uint32_t nack_per_publish = 0;
  uint32_t return_per_publish = 0;
  uint32_t slow_confirm_per_publish = 0;
};

class FakeBroker {
 public:
  class Handler {
   public:
    virtual ~Handler() = default;
    virtual void OnAck(uint64_t tag, bool multiple) = 0;
    virtual void OnNack(uint64_t tag, bool multiple) = 0;
    virtual void OnReturn(PostId id) = 0;
    virtual void OnBlocked() = 0;
    virtual void OnUnblocked() = 0;
  };
  struct Ledger {
    uint32_t enqueued = 0;
    uint32_t first_epoch = 0;  // the crash epoch of the first enqueue
    uint32_t counted_epoch = 0;  // the last epoch that counted it as a duplicate of a crash
    uint32_t last_epoch = 0;   // the crash epoch of the latest enqueue
    bool confirmed = false;    // an ack of a routed publication reached the forwarder
    bool dropped = false;      // returned, then acked under unroutable_policy = drop
    std::vector<JournalPosition> positions;  // the journal records it was enqueued from
  };

  FakeBroker(SimRng rng, SimStats* stats) : rng_(rng), stats_(stats) {}
  void set_rates(const BrokerRates& r) { rates_ = r; }
  // Faults stop: the broker comes back up and unblocks.
  void Heal(Clock::time_point now);

  // The crash epoch (how many daemon crashes so far), for the ledger.
  void set_epoch(uint32_t e) { epoch_ = e; }

  bool Connect(Clock::time_point now);
  // The forwarder closes (or dies): unconfirmed tags are void.
  void Disconnect();
  bool connected() const { return connected_; }
  // basic.publish of the record at `pos`; false if the connection is gone.
  bool Publish(PostId id, JournalPosition pos, Clock::time_point now);
  // Delivers the confirms and notices due at `now`; false if the connection
  // is gone.
  bool ReadFrames(Clock::time_point now, Handler* h);
  // Faults that come with time.
  void Step(Clock::time_point now);

  const std::map<PostId, Ledger>& ledger() const { return ledger_; }
  // Posts enqueued before a crash and again after it, per epoch (each post
  // once per epoch, however often disconnects republish it): all,
  // and those of a second journal record of the post (it was journaled
  // twice: socket and spool, or a spool segment adopted twice); the rest
  // republish a record the broker had (the checkpoint was behind).
  const std::map<uint32_t, uint64_t>& cross_epoch_duplicates() const { return cross_dups_; }
  const std::map<uint32_t, uint64_t>& cross_epoch_journaled_twice() const { return cross_twice_; }
  // Per epoch, the earliest epoch in which one of its duplicates had last
  // been enqueued: the duplicates of epoch e go back to the crashes after it.
  const std::map<uint32_t, uint32_t>& cross_epoch_since() const { return cross_since_; }
  uint64_t enqueued_total() const { return enqueued_total_; }
  uint64_t duplicates_total() const { return dups_total_; }

 private:
  struct Pending {
    uint64_t tag;
    PostId id;
    bool ack;       // false: nack
    bool returned;  // basic.return before the ack
    Clock::time_point ready_at;
  };
  void Deliver(const Pending& p, bool multiple, Handler* h);

  SimRng rng_;
  SimStats* stats_;
  BrokerRates rates_;
  uint32_t epoch_ = 0;
  bool connected_ = false;
  bool broken_ = false;  // the connection dropped; the forwarder has not noticed yet
  Clock::time_point down_until_{};
  Clock::time_point blocked_until_{};
  bool blocked_sent_ = false;
  uint64_t next_tag_ = 1;
  std::vector<Pending> pending_;  // by tag
  std::map<PostId, Ledger> ledger_;
  std::map<uint32_t, uint64_t> cross_dups_;
  std::map<uint32_t, uint64_t> cross_twice_;
  std::map<uint32_t, uint32_t> cross_since_;
  uint64_t enqueued_total_ = 0;
  uint64_t dups_total_ = 0;

 public:
  daemon::UnroutablePolicy policy = daemon::UnroutablePolicy::kRetry;
};

class SimForwarder final : private FakeBroker::Handler, private daemon::JournalFeed::Events {
 public:
  struct Options {
    // The checkpoint is stored at every move of the watermark (what
    // another change makes forwarder.cc do); false: every
    // checkpoint_interval_ms, as forwarder.cc does today.
    bool checkpoint_every_move = false;
  };
  // Everything borrowed must outlive the forwarder. `on_publish` sees every
  // post published (for the checker).
  // `storage` and `dirfd` (the journal directory, open on it) are the
  // daemon process's: the real JournalReader, Checkpoint and
  // DeleteConfirmedSegments run on them.
  SimForwarder(const daemon::Config& config, Options options, SimNode* node, FakeBroker* broker,
               SimCommits* commits, daemon::JournalUsage* usage, daemon::Storage* storage,
               int dirfd, uint64_t seed,
               std::function<void(const fb::Post&)> on_publish);
  ~SimForwarder() override;

  // Forwarder::Start: loads the checkpoint. A failure stops the daemon's start.
  Status Start();
  // One pass of Forwarder::Run's loop at `now`; true if more work is ready.
  bool Step(Clock::time_point now);
  // The end of StopAndDrain: the final checkpoint.
  void Stop(Clock::time_point now);

  JournalPosition watermark() const { return window_->watermark(); }
  // Forwarder::Drained: nothing in the window, and the watermark or the
  // limit at which the reader last found nothing more is at `target`. The
  // watermark alone may stay behind the committed end for good: after a
  // restart that journals nothing, the committed end is the start of a
  // segment the writer has not created (JournalWriter creates it at the
  // first Reserve), and the reader stops at the missing segment before it.
  bool Drained(JournalPosition target) const {
    return window_->size() == 0 && (window_->watermark() >= target || idle_at_limit_ >= target);
  }
  JournalPosition stored_checkpoint() const { return feed_.stored_checkpoint(); }
  // The last attempt to open or write the checkpoint failed.
  bool checkpoint_faulted() const { return feed_.checkpoint_faulted(); }
  // Damaged segments reported (found unreadable) so far.
  uint64_t damaged_reported() const { return damaged_reported_; }
  // A damaged segment not yet set aside holds the checkpoint back
  // (StorableCheckpoint): a crash now republishes more than a window.
  bool checkpoint_held_by_damage() const {
    return feed_.Storable(window_->watermark()) < window_->watermark();
  }

 private:
  void Connect(Clock::time_point now);
  void LoseConnection(Clock::time_point now);
  void ScheduleReconnect(Clock::time_point now);
  bool Pump(Clock::time_point now);
  bool PublishNew(const daemon::JournalReader::Entry& entry, Clock::time_point now, bool* published);
  bool Republish(const daemon::PublishWindow::Due& due, Clock::time_point now);
  Status EncodePost(const fb::Post& post);
  void MaybeCheckpoint(Clock::time_point now, bool force);

  void OnAck(uint64_t tag, bool multiple) override;
  void OnNack(uint64_t tag, bool multiple) override;
  void OnReturn(PostId id) override;
  void OnBlocked() override { blocked_ = true; }
  void OnUnblocked() override { blocked_ = false; }
  // JournalFeed::Events: traces, and the count of damaged segments.
  void OnReadFailed(JournalPosition at, const Status& why, int attempt,
                    std::chrono::milliseconds delay) override;
  void OnReadRecovered(JournalPosition) override {}
  void OnBytesSkipped(JournalPosition before, uint64_t bytes, uint64_t records) override;
  void OnSegmentDamaged(JournalPosition at, const Status& why, uint64_t records) override;
  void OnSegmentSetAside(uint64_t seq, const std::string& moved_to) override;
  void OnSetAsideFailed(uint64_t seq, const Status& why) override;
  void OnRereadFailed(PostId id, JournalPosition at, const Status& why,
                      std::chrono::milliseconds delay) override;
  void OnUnreadable(PostId id, JournalPosition at, const std::string& why) override;
  void OnCheckpointFailed(CheckpointStep step, const Status& why) override;
  void OnCheckpointCreated() override {}
  void OnDeleteFailed(const Status& why) override;
  void OnDeleted(int, JournalPosition) override {}

  const daemon::Config& config_;
  Options options_;
  SimNode* node_;
  FakeBroker* broker_;
  SimCommits* commits_;
  uint64_t seed_;
  std::function<void(const fb::Post&)> on_publish_;
  daemon::Storage* storage_;
  int dirfd_;
  daemon::JournalFeed feed_;
  std::unique_ptr<daemon::PublishWindow> window_;
  daemon::Backoff connect_backoff_;
  bool connected_ = false;
  bool blocked_ = false;
  Clock::time_point now_{};  // of the step in progress (for the handlers)
  Clock::time_point connected_at_{};
  uint64_t confirms_this_connection_ = 0;
  Clock::time_point reconnect_at_{};
  JournalPosition idle_at_limit_;
  uint64_t done_when_written_ = 0;  // as Forwarder's
  uint64_t damaged_reported_ = 0;
  v03::Encoded encoded_;
};

}  // namespace postspool::sim
