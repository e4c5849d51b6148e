// Forwarder: the thread that publishes the journal's posts to the broker and
// moves the acked watermark. It owns the rabbitmq-c connection (a blocking
// API, kept off the ingest loop).
//
// Delivery contract (DESIGN.md): a post is published with publisher confirms
// and counts as delivered only once the broker acked it; a nack, a lost
// connection or a broker restart means it is published again, read again
// from the journal (the only copy: no payload is held in memory). The
// watermark is the journal position just after the longest confirmed
// prefix. It is written into the Checkpoint (a pwrite: the page cache keeps
// it across a crash of the process) whenever confirms moved it, before
// anything more is published, and synced every checkpoint_interval_ms (a
// power loss), after which the segments wholly before it are deleted. So
// after a crash of the daemon at most publish_window_max posts are
// published again (those in flight when it died); after a power loss, what
// was confirmed since the last sync as well. The checkpoint file is created
// at Start; on a full disk that fails, the forwarder goes on without it
// (trying again every checkpoint_interval_ms, logged once): it still
// publishes and deletes confirmed segments, which is safe without a stored
// checkpoint (journal.h, DeleteConfirmedSegments), but a restart then
// publishes again from the last stored watermark or the oldest segment.
//
// The journal side, reading, damaged segments, the checkpoint and deleting
// confirmed segments, is the JournalFeed's (journal_feed.h); the forwarder
// logs and counts what it reports (journal_segments_damaged_total,
// journal_records_lost_total, journal_bytes_skipped_total).
//
// The thread: reads records with a JournalReader from the watermark up to
// CommitChannel::committed(), encodes them (v03::Encode), publishes them
// (amqp_session.h) while the PublishWindow (publish_window.h: the pure
// bookkeeping of tags, confirms and the watermark) has room, and between
// batches handles what the broker sent (acks, nacks, returns,
// connection.blocked, heartbeats). It sleeps in poll() on the commit
// eventfd, the broker socket and its own wake-up eventfd, at most until the
// next heartbeat, checkpoint or retry is due.
//
// Connection failures: the brokers of post_broker are tried in turn, with
// exponential backoff and full jitter (backoff.h) between attempts, reset
// after a connection that worked (it got a confirm, or stayed up 10 s).
// Every failure is logged with the broker (without its password), the error
// and what happens next. A nacked post (and an unroutable one under the
// retry policy) waits per post, with exponential backoff and full jitter
// over republish_delay_initial_ms .. republish_delay_max_ms, before it is
// published again; the first ack after nacks ends those waits (the broker
// takes posts again). A connection that is up but refuses every post, or
// confirms nothing while posts wait, is a broken path (broker_path.h): the
// forwarder reconnects, then moves on to the next broker, with doubling
// waits, logs each step and counts it (broker_path_changes_total). A lost
// or dropped connection publishes again only the posts not confirmed
// (publish_window.h, Reset). With two or more brokers, a standby connection
// to another one (standby_session.h, broker_standby) takes over at once
// when the connection is lost or its path broken, before any of these steps.
//
// Bounded: at most publish_window_max posts in flight and as many entries
// in the window; the backlog stays on disk.
//
// Retry policy note: under unroutable_policy = retry, a post that no queue
// takes is published again (after a backoff delay) until one does; the
// watermark cannot pass it, so after publish_window_max more posts the
// forwarder waits for it. That is the policy: nothing is dropped.
//
// The ingest loop's side: it publishes the JournalWriter's end on the
// CommitChannel at startup (so that a backlog left by the last run is
// forwarded before the first new post) and after every commit.
//
// Metrics: published_total counts every basic.publish, republications
// (republished_total) included; confirmed_total counts posts acked as routed.
//
// Status (Snapshot, for the control socket): the broker connection's state
// and last error, and the backlog. The backlog count is kept by a third
// journal reader that counts records ahead of the watermark, a bounded
// number per round (kCountBatch), so that a backlog left by the last run is
// counted without a long pause; until it has reached the committed end the
// count is a lower bound (backlog_posts_exact false). The age of the oldest
// unconfirmed post is the publish time stamped in the post at the watermark
// (read again at most every kPeekInterval).
//
// Publishing writes: on a plain TCP connection a round's posts (at most
// kPublishBatch) are encoded into one buffer and written with one write at
// the end of the round (AmqpSession::AppendPublish, Flush); a post counts as
// published (in the window) once appended, and a failed flush is a lost
// connection, so it is published again like any unconfirmed post. A flush
// that the broker does not take within the heartbeat interval (TCP
// backpressure from a stalled broker) gives the connection up.
//
// Known limit: over TLS, rabbitmq-c 0.11 writes each post itself with no
// deadline, so a publish blocks while the broker does not read its socket
// and heartbeats are not checked meanwhile. connection.blocked normally stops
// publishing before that; StopAndDrain (after its deadline) and the
// destructor shut the socket down under a blocked write.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "amqp_session.h"
#include "amqp_url.h"
#include "backoff.h"
#include "broker_path.h"
#include "config.h"
#include "flatbuffers/flatbuffers.h"
#include "journal.h"
#include "journal_feed.h"
#include "metrics.h"
#include "publish_window.h"
#include "standby_session.h"
#include "status.h"
#include "unique_fd.h"
#include "v03_encoder.h"

namespace postspool::daemon {

class Forwarder final : private AmqpSession::Handler, private JournalFeed::Events {
 public:
  using Clock = std::chrono::steady_clock;

  // All pointers are borrowed and must outlive the forwarder; `config` is
  // copied. `journal_dirfd` is the journal directory (journal.h).
  Forwarder(const Config& config, int journal_dirfd, CommitChannel* commits, JournalUsage* usage,
            Metrics* metrics);
  // Stops the thread if it runs, without waiting for a drain: whatever is
  // unconfirmed is published again by the next forwarder.
  ~Forwarder() override;
  Forwarder(const Forwarder&) = delete;
  Forwarder& operator=(const Forwarder&) = delete;

  // Loads the Checkpoint (a damaged one is logged and treated as "from the
  // start": duplicates, never loss), seeks the reader there and starts the
  // thread. kInvalidArgument if a broker URL does not parse or there is none.
  // May be called again after StopAndDrain.
  Status Start();

  // Publishes everything committed so far and waits for its confirms, at
  // most `timeout`; then stops the thread (closing the connection) and
  // stores the final checkpoint. True if everything committed when it was
  // called was confirmed (or could never be published: encoding errors,
  // unroutable posts under the drop policy).
  bool StopAndDrain(std::chrono::milliseconds timeout);

  // The acked watermark (possibly not stored yet). Thread-safe.
  JournalPosition watermark() const;

  // What `postspool status` shows of the forwarder. Thread-safe.
  struct Snapshot {
    std::string broker;           // the URL in use or next, without its password
    std::string state = "stopped";  // connecting, connected, blocked, waiting (back-off), stopped
    std::string last_error;       // empty if none since start
    int64_t last_error_unix_ms = 0;
    int64_t next_attempt_in_ms = 0;  // state waiting: when the next connect is tried
    uint64_t reconnect_delay_ms = 0;   // the back-off delay last chosen
    uint32_t connect_failures_in_row = 0;
    uint64_t backlog_posts = 0;        // journaled and not confirmed (nor dropped)
    bool backlog_posts_exact = false;  // false: still counting, a lower bound
    int64_t oldest_unconfirmed_pub_unix_ns = 0;  // 0: no backlog (or not read yet)
    uint64_t in_flight = 0;
    uint64_t waiting = 0;  // refused (or returned) posts waiting to be published again
    // With posts in flight or waiting: how long since the broker last
    // confirmed anything (or since they were published, if later); 0 with none.
    int64_t confirm_wait_ms = 0;
    // The broken path seen now ("refused", "silent"; empty if none), the
    // steps taken for broken paths since start, and the last one in words.
    std::string path_fault;
    uint64_t path_changes = 0;
    std::string last_path_change;
    int64_t last_unroutable_drop_unix_ms = 0;
    // The standby connection's broker (broker_standby; empty if none), and
    // whether it is ready (warm: it can take over at once).
    std::string standby;
    bool standby_ready = false;
  };
  Snapshot snapshot() const;
  // The same without waiting: false (and *out untouched) if the forwarder
  // holds the lock right now. For the ingest thread, which never waits.
  bool TrySnapshot(Snapshot* out) const;

  // Ends the back-off wait: the next connect is tried at once; while
  // connected, the connection is dropped and made again to the same broker
  // (unconfirmed posts are published again). Thread-safe.
  void RequestReconnect();

  // After StopAndDrain: the journaled posts still unconfirmed (counted from
  // the watermark to the committed end; `*exact` false if the count ran out
  // of its time budget, then it is a lower bound).
  uint64_t unconfirmed_at_stop(bool* exact) const {
    *exact = unconfirmed_at_stop_exact_;
    return unconfirmed_at_stop_;
  }

  // The seeds of the random delays (for tests that want to print them).
  uint64_t backoff_seed() const { return seed_; }

  // For tests: how the journal readers read a segment (they inject read
  // errors through it). Call before Start.
  void set_journal_source_factory(const JournalReader::SourceFactory& factory);

 private:
  enum class Mode : int { kRun, kDrain, kStop };

  void Run();
  // Connection.
  void Connect(Clock::time_point now);
  void LoseConnection(const Status& why, Clock::time_point now);
  // Drops a connection that is up and connects at once, to the next broker
  // if `next_broker`; `why` is logged and shown in the status.
  void ChangePath(const std::string& why, bool next_broker, Clock::time_point now);
  // A step for a broken path, `what` in words (metrics, status).
  void CountPathChange(const std::string& what);
  void CloseSession(bool polite);
  void ScheduleReconnect(Clock::time_point now);
  AmqpSession::Options SessionOptions(const BrokerUrl& url) const;
  // Publishes on `session` (to broker `index`) from now on; false if the
  // forwarder is stopping (the session is dropped).
  // `error`, if any, is shown as the last error (why it moved).
  bool UseSession(std::unique_ptr<AmqpSession> session, size_t index, bool blocked,
                  Clock::time_point now, const std::string* error = nullptr);
  // The standby connection (standby_session.h): opens it, keeps it alive,
  // warms it by swapping once nothing is in flight.
  void MaintainStandby(Clock::time_point now);
  void OpenStandby(Clock::time_point now);
  void SwapWithStandby(Clock::time_point now);
  // The connection broke (`why`): moves to the standby at once if it is
  // warm; false if there is none.
  bool TakeOverStandby(const std::string& why, Clock::time_point now);
  std::string ExchangeFor(const BrokerUrl& url) const;
  // Reads frames and publishes a batch; true if more work is ready at once.
  bool Pump(Clock::time_point now);
  // Whether Wait watches the broker's socket (kConfirmReadDelay).
  bool WatchesBroker() const;
  // Publishing. A non-ok status is a connection error.
  Status PublishNew(const JournalReader::Entry& entry, bool* published);
  Status Republish(const PublishWindow::Due& due, Clock::time_point now);
  Status EncodePost(const fb::Post& post, v03::Encoded* out);
  // Checkpoint and watermark (JournalFeed).
  void WriteWatermark();
  void MaybeCheckpoint(Clock::time_point now, bool force);
  void PublishWatermark();
  bool Drained() const;
  // Backlog counting (see the class comment); true if more is left to count.
  bool CountBacklog();
  void PeekOldest(Clock::time_point now);
  void UpdateSnapshot();
  void SetConnectionState(const char* state, const std::string* error);
  // Counts the records in [from, limit) with retry_reader_, until `deadline`.
  uint64_t CountRecords(JournalPosition from, JournalPosition limit, Clock::time_point deadline,
                        bool* complete);
  // Draining while disconnected: finds out whether anything committed is
  // left to publish at all (if not, the drain is complete).
  void ProbeDrain();
  void Wait(Clock::time_point now, bool busy);
  // Interrupts a write blocked on the broker socket (any thread).
  void AbortSocket();
  void Wake();

  // AmqpSession::Handler.
  void OnAck(uint64_t delivery_tag, bool multiple) override;
  void OnNack(uint64_t delivery_tag, bool multiple) override;
  void OnReturn(std::string_view message_id, int reply_code, std::string_view reply_text) override;
  void OnBlocked(std::string_view reason) override;
  void OnUnblocked() override;

  // JournalFeed::Events: logs and metrics.
  void OnReadFailed(JournalPosition at, const Status& why, int attempt,
                    std::chrono::milliseconds delay) override;
  void OnReadRecovered(JournalPosition at) override;
  void OnBytesSkipped(JournalPosition before, uint64_t bytes, uint64_t records) override;
  void OnSegmentDamaged(JournalPosition at, const Status& why, uint64_t records) override;
  void OnSegmentSetAside(uint64_t seq, const std::string& moved_to) override;
  void OnSetAsideFailed(uint64_t seq, const Status& why) override;
  void OnRereadFailed(PostId id, JournalPosition at, const Status& why,
                      std::chrono::milliseconds delay) override;
  void OnUnreadable(PostId id, JournalPosition at, const std::string& why) override;
  void OnCheckpointFailed(CheckpointStep step, const Status& why) override;
  void OnCheckpointCreated() override;
  void OnDeleteFailed(const Status& why) override;
  void OnDeleted(int segments, JournalPosition before) override;

  // Fixed at construction.
  const Config config_;
  const int dirfd_;
  CommitChannel* const commits_;
  JournalUsage* const usage_;
  Metrics* const metrics_;
  std::vector<BrokerUrl> brokers_;
  Status brokers_status_;
  const uint64_t seed_;
  UniqueFd wake_fd_;  // eventfd: the mode changed

  // Control, shared with the caller's thread.
  std::thread thread_;
  std::atomic<Mode> mode_{Mode::kRun};
  mutable std::mutex control_mu_;
  std::condition_variable exited_cv_;
  bool exited_ = true;                     // guarded by control_mu_
  JournalPosition drain_target_;           // guarded by control_mu_
  Clock::time_point drain_deadline_;       // guarded by control_mu_
  std::atomic<bool> drained_{false};
  std::mutex socket_mu_;
  int socket_fd_ = -1;   // guarded by socket_mu_: the session's socket, -1 if none
  bool aborted_ = false; // guarded by socket_mu_
  mutable std::mutex watermark_mu_;
  JournalPosition watermark_;  // guarded by watermark_mu_

  mutable std::mutex snapshot_mu_;
  Snapshot snapshot_;                 // guarded by snapshot_mu_
  std::atomic<bool> reconnect_requested_{false};
  uint64_t unconfirmed_at_stop_ = 0;  // written by the thread before it exits
  bool unconfirmed_at_stop_exact_ = true;

  // The forwarder thread's own.
  JournalFeed feed_;
  JournalReader count_reader_;  // counts the backlog ahead of the watermark
  uint64_t counted_ = 0;        // records from the start position to count_reader_
  bool count_caught_up_ = false;
  int64_t oldest_pub_ns_ = 0;
  JournalPosition peeked_at_;
  JournalPosition peeked_limit_;
  Clock::time_point next_peek_;
  std::string conn_state_ = "connecting";
  std::string last_error_;
  int64_t last_error_unix_ms_ = 0;
  uint64_t reconnect_delay_ms_ = 0;
  uint32_t connect_failures_in_row_ = 0;
  std::string last_connect_error_;
  Clock::time_point next_connect_error_log_;
  uint64_t connect_errors_unlogged_ = 0;
  uint64_t drops_unlogged_ = 0;
  Clock::time_point next_drop_log_;
  int64_t last_drop_unix_ms_ = 0;
  Clock::time_point last_progress_;  // last confirm, or the first publish after none in flight
  JournalReader peek_reader_;  // the oldest post, the drain probe, the count at stop
  std::unique_ptr<PublishWindow> window_;
  Backoff connect_backoff_;
  BrokerPath path_;
  uint64_t path_changes_ = 0;
  std::string last_path_change_;
  std::unique_ptr<AmqpSession> session_;
  StandbySession standby_;
  bool standby_readable_ = false;  // poll() saw input on the standby
  // Publishing waits for nothing in flight, to swap with a cold standby.
  bool warming_ = false;
  size_t failed_index_ = SIZE_MAX;  // the broker whose connection broke last
  size_t broker_index_ = 0;
  std::string exchange_;
  std::string source_;
  bool blocked_ = false;
  Clock::time_point connected_at_;
  uint64_t confirms_this_connection_ = 0;
  Clock::time_point reconnect_at_;
  // New posts are published no sooner than this (kRoundGap in forwarder.cc).
  Clock::time_point new_round_at_;
  // The longest a confirm waits to be read while the socket is not watched.
  const std::chrono::milliseconds confirm_read_delay_;
  // window_->done_total() when the watermark was last written (WriteWatermark).
  uint64_t done_when_written_ = 0;
  // The reader found nothing more before this limit (since the last seek).
  JournalPosition idle_at_limit_;
  bool drain_probed_ = false;
  // Encoding errors before this position were counted and logged already.
  JournalPosition encode_error_high_;
  // Log throttling for per-message events.
  Clock::time_point next_nack_log_;
  uint64_t nacks_unlogged_ = 0;
  Clock::time_point next_return_log_;
  uint64_t returns_unlogged_ = 0;
  v03::Encoded encoded_;
};

}  // namespace postspool::daemon
