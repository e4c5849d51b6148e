#include "forwarder.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>

#include <algorithm>
#include <cassert>
#include <cinttypes>
#include <random>

#include "amqp_properties.h"
#include "forwarder_internal.h"
#include "log.h"
#include "post.h"

namespace postspool::daemon {

using namespace forwarder_internal;

namespace {

// Records published between two looks at what the broker sent: keeps the
// reaction to acks and connection.blocked prompt while the backlog drains
// (256 posts are about 0.15 ms of encoding). 64 cost the forwarder 1.95 µs
// of CPU per post in a drain against 1.78 µs with 256 (medians of 7), at
// the same rate: the round's system calls are shared by more posts.
constexpr int kPublishBatch = 256;
// Per-message warnings (nacks, returns) are logged at most this often.
constexpr auto kMessageLogInterval = std::chrono::seconds(10);
// The longest poll() when nothing else is due.
constexpr auto kIdleWake = std::chrono::seconds(1);
// While posts wait for the broker, the path is judged at least this often.
constexpr auto kPathCheckInterval = milliseconds(200);
// After a round that published new posts without filling its batch, new
// posts are published no sooner than this: while posts come one by one (one
// client posting in a loop), each round would otherwise publish one, and
// cost a wake-up, a write to the broker and a confirm to read per post. A
// post that comes after a pause is published at once; one in a stream waits
// at most this long. Only commits that came within the gap are waited for
// (a timer for its end); with none, the next commit wakes the forwarder, so
// that a post on its own costs no wake-up at the end of the gap.
constexpr auto kRoundGap = std::chrono::microseconds(500);
// With posts in flight and room in the window, the broker's socket is not
// watched: its confirms are read with the next round, at most this long
// after the last (or a quarter of path_refused_ms / path_silent_ms, if
// less). Posts that come one at a time, a few ms apart (processes that each
// post once), then cost the forwarder one wake-up each (its commit's) rather
// than two (its commit's and its confirm's). WatchesBroker says when the
// socket is watched all the same.
constexpr auto kConfirmReadDelay = milliseconds(20);
// How long shutdown spends counting what is left unconfirmed.
constexpr auto kStopCountBudget = milliseconds(1000);

uint64_t RandomSeed() {
  uint64_t seed = 0;
  if (::getrandom(&seed, sizeof seed, GRND_NONBLOCK) != sizeof seed) {
    seed = std::random_device{}();
  }
  return seed;
}

}  // namespace


Forwarder::Forwarder(const Config& config, int journal_dirfd, CommitChannel* commits,
                     JournalUsage* usage, Metrics* metrics)
    : config_(config),
      dirfd_(journal_dirfd),
      commits_(commits),
      usage_(usage),
      metrics_(metrics),
      seed_(RandomSeed()),
      wake_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
      feed_(SystemStorage(), journal_dirfd, usage, milliseconds(config.checkpoint_interval_ms),
            this),
      count_reader_(journal_dirfd),
      peek_reader_(journal_dirfd),
      connect_backoff_(config.reconnect_delay_initial_ms, config.reconnect_delay_max_ms, seed_),
      path_(BrokerPath::Options{config.path_refused_ms, config.path_silent_ms,
                                config.path_wait_max_ms}),
      confirm_read_delay_(std::clamp<milliseconds>(
          milliseconds(std::min(config.path_refused_ms, config.path_silent_ms) / 4),
          milliseconds(1), kConfirmReadDelay)) {
  for (const std::string& url : config_.post_broker) {
    BrokerUrl b;
    if (Status s = ParseBrokerUrl(url, &b); !s.ok()) {
      brokers_status_ = s;
      continue;
    }
    brokers_.push_back(std::move(b));
  }
  if (brokers_status_.ok() && brokers_.empty()) {
    brokers_status_ = Status(StatusCode::kInvalidArgument, "post_broker names no broker");
  }
}

Forwarder::~Forwarder() {
  if (!thread_.joinable()) return;
  mode_.store(Mode::kStop);
  Wake();
  AbortSocket();
  thread_.join();
}

Status Forwarder::Start() {
  assert(!thread_.joinable());
  if (!brokers_status_.ok()) return brokers_status_;
  if (!wake_fd_.valid()) return Status::FromErrno(errno, "eventfd for the forwarder");
  JournalPosition start;
  Status s = Checkpoint::Load(dirfd_, &start);
  if (s.code() == StatusCode::kCorruption) {
    PS_LOG_ERROR("forwarder: %s; forwarding the whole journal again from its oldest segment "
                 "(subscribers may see duplicates; nothing is lost)",
                 s.ToString().c_str());
    start = JournalPosition{};
  } else if (!s.ok()) {
    return s;
  }
  PublishWindow::Options window_options;
  window_options.window_max = config_.publish_window_max;
  window_options.unroutable_policy = config_.unroutable_policy;
  window_options.retry_delay_initial_ms = config_.republish_delay_initial_ms;
  window_options.retry_delay_max_ms = config_.republish_delay_max_ms;
  window_options.seed = seed_ ^ 0x9e3779b97f4a7c15ull;
  window_ = std::make_unique<PublishWindow>(window_options, start);
  done_when_written_ = 0;
  count_reader_.Seek(start);
  counted_ = 0;
  count_caught_up_ = false;
  oldest_pub_ns_ = 0;
  peeked_at_ = JournalPosition{};
  peeked_limit_ = JournalPosition{};
  next_peek_ = Clock::time_point{};
  conn_state_ = "connecting";
  unconfirmed_at_stop_ = 0;
  unconfirmed_at_stop_exact_ = true;
  UpdateSnapshot();
  // Creates the checkpoint file (a failure on a full disk is not fatal:
  // see the class comment).
  feed_.Start(start);
  idle_at_limit_ = JournalPosition{};
  encode_error_high_ = start;
  reconnect_at_ = Clock::time_point{};
  PublishWatermark();
  {
    std::lock_guard lock(socket_mu_);
    aborted_ = false;
  }
  {
    std::lock_guard lock(control_mu_);
    exited_ = false;
  }
  drained_.store(false);
  drain_probed_ = false;
  mode_.store(Mode::kRun);
  thread_ = std::thread([this] {
    ::pthread_setname_np(::pthread_self(), "ps-forwarder");
    Run();
  });
  return Status::Ok();
}

bool Forwarder::StopAndDrain(milliseconds timeout) {
  if (!thread_.joinable()) return watermark() >= commits_->committed();
  const Clock::time_point deadline = Clock::now() + timeout;
  {
    std::lock_guard lock(control_mu_);
    drain_target_ = commits_->committed();
    drain_deadline_ = deadline;
  }
  mode_.store(Mode::kDrain);
  Wake();
  {
    // The thread leaves at the deadline, unless a write to the broker
    // blocks it (a broker that stopped reading): then the socket is shut
    // down under it.
    std::unique_lock lock(control_mu_);
    const auto grace = milliseconds(config_.connect_timeout_ms) + std::chrono::seconds(1);
    if (!exited_cv_.wait_until(lock, deadline + grace, [this] { return exited_; })) {
      lock.unlock();
      PS_LOG_WARNING("forwarder: still busy %s after the drain deadline; closing the broker "
                     "connection under it",
                     FormatSeconds(std::chrono::duration_cast<milliseconds>(grace)).c_str());
      AbortSocket();
    }
  }
  thread_.join();
  return drained_.load();
}

void Forwarder::set_journal_source_factory(const JournalReader::SourceFactory& factory) {
  assert(!thread_.joinable());
  feed_.set_source_factory(factory);
  peek_reader_.set_source_factory(factory);
  count_reader_.set_source_factory(factory);
}

JournalPosition Forwarder::watermark() const {
  std::lock_guard lock(watermark_mu_);
  return watermark_;
}

void Forwarder::PublishWatermark() {
  const JournalPosition w = window_->watermark();
  std::lock_guard lock(watermark_mu_);
  watermark_ = w;
}

void Forwarder::Wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof one);
}

void Forwarder::AbortSocket() {
  std::lock_guard lock(socket_mu_);
  aborted_ = true;
  if (socket_fd_ >= 0) ::shutdown(socket_fd_, SHUT_RDWR);
}

bool Forwarder::Drained() const {
  JournalPosition target;
  {
    std::lock_guard lock(control_mu_);
    target = drain_target_;
  }
  // Everything read is done, and the reader found nothing more before a
  // limit at or past the target (a torn tail there does not count).
  return window_->size() == 0 && (window_->watermark() >= target || idle_at_limit_ >= target);
}

void Forwarder::ProbeDrain() {
  drain_probed_ = true;
  if (window_->size() != 0) return;
  JournalPosition target;
  {
    std::lock_guard lock(control_mu_);
    target = drain_target_;
  }
  peek_reader_.Seek(window_->watermark());
  JournalReader::Entry entry;
  bool got = false;
  if (Status s = peek_reader_.Next(target, &entry, &got); !s.ok() || got) return;
  // Nothing to publish (an empty journal, or only damage): drained.
  window_->OnReaderIdle(peek_reader_.position());
  idle_at_limit_ = std::max(idle_at_limit_, target);
}

// ---------------------------------------------------------------------------
// The thread

void Forwarder::Run() {
  PS_LOG_INFO("forwarder: starting at journal position %s; brokers: %zu, first %s",
              FormatPosition(window_->watermark()).c_str(), brokers_.size(),
              brokers_[broker_index_].display.c_str());
  for (;;) {
    const Mode mode = mode_.load();
    if (mode == Mode::kStop) break;
    const Clock::time_point now = Clock::now();
    if (mode == Mode::kDrain) {
      if (!session_ && !drain_probed_) ProbeDrain();
      if (Drained()) {
        drained_.store(true);
        break;
      }
      Clock::time_point deadline;
      {
        std::lock_guard lock(control_mu_);
        deadline = drain_deadline_;
      }
      if (now >= deadline) break;  // counted and logged below
    }
    bool busy = false;
    if (!session_) {
      if (now >= reconnect_at_) {
        Connect(now);
        busy = session_ != nullptr;
      }
    } else {
      busy = Pump(now);
    }
    if (session_ && !blocked_) {
      const Clock::time_point t = Clock::now();
      const BrokerPath::Verdict v =
          path_.Check(t, window_->in_flight() + window_->waiting() > 0);
      if (v.step != BrokerPath::Step::kNone) {
        const std::string why =
            v.fault == BrokerPath::Fault::kRefused
                ? "refused every post (basic.nack) for " + FormatSeconds(v.fault_for)
                : "confirmed nothing for " + FormatSeconds(v.fault_for) + " while " +
                      std::to_string(window_->in_flight() + window_->waiting()) +
                      " posts wait";
        if (TakeOverStandby(why, t)) {
          CountPathChange(last_error_);
        } else {
          ChangePath(why + " (next step no sooner than in " + FormatSeconds(v.hold) + ")",
                     v.step == BrokerPath::Step::kNextBroker, t);
        }
        busy = true;
      }
    }
    MaintainStandby(Clock::now());
    MaybeCheckpoint(Clock::now(), false);
    if (reconnect_requested_.exchange(false)) {
      if (session_) {
        ChangePath("reconnect requested through the control socket", false, Clock::now());
      } else {
        PS_LOG_INFO("forwarder: reconnect requested through the control socket; connecting to "
                    "%s now", brokers_[broker_index_].display.c_str());
        connect_backoff_.Reset();
        reconnect_at_ = Clock::time_point{};
      }
      busy = true;
    }
    const bool counting = CountBacklog();
    PeekOldest(Clock::now());
    UpdateSnapshot();
    Wait(Clock::now(), busy || counting);
  }
  if (mode_.load() == Mode::kDrain && !drained_.load()) {
    // Every journaled post not confirmed, not only those in flight: the
    // whole rest of the journal up to what was committed.
    JournalPosition target;
    {
      std::lock_guard lock(control_mu_);
      target = drain_target_;
    }
    target = std::max(target, commits_->committed());
    bool complete = true;
    unconfirmed_at_stop_ = CountRecords(window_->watermark(), target,
                                        Clock::now() + kStopCountBudget, &complete);
    unconfirmed_at_stop_exact_ = complete;
    PS_LOG_WARNING("forwarder: drain deadline passed with %s%" PRIu64
                   " journaled posts unconfirmed after journal position %s; they stay in the "
                   "journal and are published at the next start",
                   complete ? "" : "at least ", unconfirmed_at_stop_,
                   FormatPosition(window_->watermark()).c_str());
  }
  if (drops_unlogged_ > 0) {
    PS_LOG_WARNING("forwarder: dropped %" PRIu64 " more unroutable posts (%" PRIu64
                   " since start)",
                   drops_unlogged_, metrics_->unroutable_dropped_total.load());
    drops_unlogged_ = 0;
  }
  CloseSession(/*polite=*/drained_.load());
  if (std::unique_ptr<AmqpSession> standby = standby_.Take(); standby && drained_.load()) {
    standby->Close();
  }
  metrics_->broker_standby_connected.store(0, std::memory_order_relaxed);
  metrics_->broker_connected.store(0, std::memory_order_relaxed);
  metrics_->publish_in_flight.store(0, std::memory_order_relaxed);
  MaybeCheckpoint(Clock::now(), true);
  conn_state_ = "stopped";
  UpdateSnapshot();
  PS_LOG_INFO("forwarder: stopped at journal position %s%s",
              FormatPosition(window_->watermark()).c_str(),
              drained_.load() ? " (everything committed is confirmed)" : "");
  {
    std::lock_guard lock(control_mu_);
    exited_ = true;
  }
  exited_cv_.notify_all();
}

bool Forwarder::Pump(Clock::time_point now) {
  if (Status s = session_->ReadFrames(this); !s.ok()) {
    LoseConnection(s, now);
    return false;
  }
  // The confirms just read moved the watermark: record it before publishing
  // anything more when needed, so that what a crash leaves unconfirmed
  // after the stored watermark is at most one window (publish_window_max).
  WriteWatermark();
  bool more = false;
  if (!blocked_) {
    int budget = kPublishBatch;
    // Posts to publish again first: they are the oldest.
    PublishWindow::Due due;
    while (budget > 0 && !warming_ && feed_.CanRead(now) && window_->CanRepublish() &&
           window_->NextDue(now, &due)) {
      if (Status s = Republish(due, now); !s.ok()) {
        LoseConnection(s, now);
        return false;
      }
      --budget;
    }
    // Then new ones, not within the gap after a round that published some
    // (kRoundGap). Drain the eventfd before reading the committed end, so
    // that a commit after the read wakes the next poll.
    commits_->Drain();
    const JournalPosition limit = commits_->committed();
    const bool new_ones = now >= new_round_at_;
    bool published_new = false;
    while (new_ones && budget > 0 && !warming_ && window_->CanPublishNew()) {
      JournalReader::Entry entry;
      const JournalFeed::Read r = feed_.Next(limit, now, &entry);
      if (r == JournalFeed::Read::kWait) break;
      if (r == JournalFeed::Read::kIdle) {
        window_->OnReaderIdle(feed_.position());
        idle_at_limit_ = std::max(idle_at_limit_, limit);
        break;
      }
      bool published = false;
      if (Status s = PublishNew(entry, &published); !s.ok()) {
        LoseConnection(s, now);
        return false;
      }
      if (published) {
        --budget;
        published_new = true;
      }
    }
    more = budget == 0;
    // A full round goes on at once: that is a backlog, not a stream.
    if (published_new) new_round_at_ = more ? now : now + kRoundGap;
  }
  // One write for the round's posts (AmqpSession::AppendPublish).
  if (Status s = session_->Flush(); !s.ok()) {
    LoseConnection(s, now);
    return false;
  }
  metrics_->publish_in_flight.store(window_->in_flight(), std::memory_order_relaxed);
  PublishWatermark();
  return more || session_->HasBufferedInput();
}

Status Forwarder::EncodePost(const fb::Post& post, v03::Encoded* out) {
  v03::EncodeOptions options;
  options.topic_prefix = config_.post_topicPrefix;
  options.source = source_;
  // The ingest loop fills in post_baseUrl; a post that reached the journal
  // without one gets it here, so that it is still a valid v03 message.
  options.base_url_default = config_.post_baseUrl;
  return v03::Encode(post, options, out);
}

Status Forwarder::PublishNew(const JournalReader::Entry& entry, bool* published) {
  *published = false;
  const fb::Post& post = PostFromPayload(entry.payload);
  const PostId id{post.id()->hi(), post.id()->lo()};
  if (Status es = EncodePost(post, &encoded_); !es.ok()) {
    // It can never be published: done, so that it does not hold the
    // watermark back forever. Counted and logged once, however often it
    // is read again after reconnects.
    if (entry.position >= encode_error_high_) {
      encode_error_high_ = entry.next;
      metrics_->encode_errors_total.fetch_add(1, std::memory_order_relaxed);
      PS_LOG_ERROR("forwarder: post %s at journal position %s cannot be encoded as v03 (%s); "
                   "it is skipped",
                   IdString(id).c_str(), FormatPosition(entry.position).c_str(),
                   es.message().c_str());
    }
    window_->OnSkipped(entry.position, entry.next);
    return Status::Ok();
  }
  const MessageId message_id = FormatMessageId(id);
  if (Status s = session_->AppendPublish(exchange_, encoded_.routing_key, encoded_.body,
                                         View(message_id), config_.publish_mandatory);
      !s.ok()) {
    // It is not in the window, and the window (not a seek to the
    // watermark) is what a reconnect publishes again: the reader must read
    // this record again on the next connection.
    feed_.Rewind(entry.position);
    return s;
  }
  // In the window once appended, before Pump's Flush wrote it: its delivery
  // tag is counted in append order. If the flush fails, the connection is
  // lost and the window's Reset makes it due again like any post sent and
  // not confirmed; only a broker ack takes it out of the window.
  window_->OnPublished(entry.position, entry.next, id);
  metrics_->published_total.fetch_add(1, std::memory_order_relaxed);
  *published = true;
  return Status::Ok();
}

Status Forwarder::Republish(const PublishWindow::Due& due, Clock::time_point now) {
  JournalReader::Entry entry;
  switch (feed_.ReadAgain(due.id, due.position, due.next, now, &entry)) {
    case JournalFeed::Again::kRetryLater:
      return Status::Ok();
    case JournalFeed::Again::kUnreadable:
      window_->OnUnreadable(due.handle);
      return Status::Ok();
    case JournalFeed::Again::kEntry:
      break;
  }
  if (Status es = EncodePost(PostFromPayload(entry.payload), &encoded_); !es.ok()) {
    OnUnreadable(due.id, due.position, es.message());
    window_->OnUnreadable(due.handle);
    return Status::Ok();
  }
  const MessageId message_id = FormatMessageId(due.id);
  if (Status s = session_->AppendPublish(exchange_, encoded_.routing_key, encoded_.body,
                                         View(message_id), config_.publish_mandatory);
      !s.ok()) {
    return s;
  }
  window_->OnRepublished(due.handle);
  metrics_->published_total.fetch_add(1, std::memory_order_relaxed);
  metrics_->republished_total.fetch_add(1, std::memory_order_relaxed);
  return Status::Ok();
}

void Forwarder::WriteWatermark() {
  PublishWatermark();
  // Not every round: a pwrite per round was a tenth of a serial stream's
  // system calls. The checkpoint's own write and sync (checkpoint_interval_ms)
  // come on top.
  if (!window_->WatermarkWriteDue(done_when_written_, kPublishBatch)) return;
  feed_.WriteWatermark(window_->watermark());
  done_when_written_ = window_->done_total();
}

void Forwarder::MaybeCheckpoint(Clock::time_point now, bool force) {
  PublishWatermark();
  feed_.MaybeCheckpoint(window_->watermark(), now, force);
  metrics_->journal_bytes.store(usage_->bytes.load(), std::memory_order_relaxed);
}

void Forwarder::Wait(Clock::time_point now, bool busy) {
  Clock::time_point until = now + kIdleWake;
  const auto earlier = [&until](Clock::time_point t) { until = std::min(until, t); };
  earlier(feed_.checkpoint_due(window_->watermark()));
  if (feed_.retry_at() > now) earlier(feed_.retry_at());
  if (mode_.load() == Mode::kDrain) {
    std::lock_guard lock(control_mu_);
    earlier(drain_deadline_);
  }
  pollfd fds[4];
  nfds_t n = 0;
  fds[n++] = pollfd{wake_fd_.get(), POLLIN, 0};
  const nfds_t standby_at = n;
  if (standby_.open()) {
    fds[n++] = pollfd{standby_.fd(), POLLIN, 0};
    earlier(standby_.next_tick());
  }
  if (!session_) {
    earlier(reconnect_at_);
  } else {
    if (WatchesBroker()) {
      fds[n++] = pollfd{session_->fd(), POLLIN, 0};
    } else {
      earlier(now + confirm_read_delay_);
    }
    // Wake in time to send a heartbeat (rabbitmq-c sends one when we call
    // it and one is due).
    const int heartbeat_s = session_->heartbeat_s();
    if (heartbeat_s > 0) earlier(now + milliseconds(heartbeat_s * 1000 / 2));
    if (!blocked_) {
      // A post due again needs a free tag; without one, the ack that frees
      // it wakes the poll.
      if (window_->CanRepublish()) earlier(window_->next_retry_at());
      // Posts wait: look at the path again soon (broker_path.h).
      if (window_->in_flight() + window_->waiting() > 0) earlier(now + kPathCheckInterval);
      // New commits matter only when there is room to publish them. Within
      // the gap (kRoundGap), those that came wait for its end; with none,
      // the next one wakes the poll (and then waits for the gap's end).
      if (window_->CanPublishNew()) {
        if (now < new_round_at_ && commits_->committed() > idle_at_limit_) {
          earlier(new_round_at_);
        } else {
          fds[n++] = pollfd{commits_->event_fd(), POLLIN, 0};
        }
      }
    }
  }
  timespec timeout{0, 0};
  if (!busy) {
    const auto wait = std::chrono::duration_cast<std::chrono::nanoseconds>(until - now);
    if (wait.count() > 0) {
      timeout.tv_sec = static_cast<time_t>(wait.count() / 1000000000);
      timeout.tv_nsec = static_cast<long>(wait.count() % 1000000000);
    }
  }
  const int ready = ::ppoll(fds, n, &timeout, nullptr);
  if (ready > 0 && (fds[0].revents & POLLIN) != 0) {
    uint64_t v;
    [[maybe_unused]] ssize_t r = ::read(wake_fd_.get(), &v, sizeof v);
  }
  if (ready > 0 && standby_.open() && fds[standby_at].revents != 0) standby_readable_ = true;
}

bool Forwarder::WatchesBroker() const {
  // Anything the broker sends matters at once when nothing is in flight (a
  // close or a block comes unannounced), while publishing is blocked or
  // waits for nothing in flight (to swap with the standby), while draining,
  // and when the window needs its confirms to make room.
  return window_->in_flight() == 0 || blocked_ || warming_ || mode_.load() == Mode::kDrain ||
         !window_->CanPublishNew() || window_->in_flight() >= window_->window_max() / 2;
}

// ---------------------------------------------------------------------------
// What the broker sends

void Forwarder::OnAck(uint64_t delivery_tag, bool multiple) {
  const PublishWindow::ConfirmResult r = window_->OnAck(delivery_tag, multiple, Clock::now());
  Add(metrics_->confirmed_total, r.confirmed);
  Add(metrics_->unroutable_dropped_total, r.dropped);
  confirms_this_connection_ += r.confirmed;
  if (r.confirmed > 0 || r.dropped > 0) last_progress_ = Clock::now();
  if (r.confirmed > 0 || r.dropped > 0 || r.retried > 0) path_.OnAck(Clock::now());
  if (r.dropped > 0) {
    // Logged here, when they are dropped (at their ack), with exact counts.
    drops_unlogged_ += r.dropped;
    last_drop_unix_ms_ = UnixMsNow();
    const Clock::time_point now = Clock::now();
    if (now >= next_drop_log_) {
      PS_LOG_WARNING("forwarder: dropped %" PRIu64 " unroutable posts (%" PRIu64
                     " since start): broker %s returned them, no queue is bound to exchange "
                     "'%s' for their routing keys, and unroutable_policy = drop",
                     drops_unlogged_, metrics_->unroutable_dropped_total.load(),
                     brokers_[broker_index_].display.c_str(), exchange_.c_str());
      drops_unlogged_ = 0;
      next_drop_log_ = now + kMessageLogInterval;
    }
  }
  if (r.unknown > 0) {
    PS_LOG_WARNING("forwarder: broker %s acked delivery tag %" PRIu64
                   "%s, which is not awaiting a confirm; ignored",
                   brokers_[broker_index_].display.c_str(), delivery_tag,
                   multiple ? " (multiple)" : "");
  }
}

void Forwarder::OnNack(uint64_t delivery_tag, bool multiple) {
  const Clock::time_point now = Clock::now();
  const PublishWindow::ConfirmResult r = window_->OnNack(delivery_tag, multiple, now);
  Add(metrics_->nacked_total, r.nacked);
  if (r.nacked > 0) path_.OnNack(now);
  nacks_unlogged_ += r.nacked;
  if (nacks_unlogged_ > 0 && now >= next_nack_log_) {
    // RabbitMQ nacks when a queue could not take the message: a full queue
    // with overflow reject-publish, a quorum queue without a leader (a node
    // lost; in 3.10 also a channel that began publishing during the leader
    // election), or an internal error.
    PS_LOG_WARNING("forwarder: broker %s refused %" PRIu64
                   " posts (basic.nack: a queue could not take them, e.g. a quorum queue "
                   "without a leader or a full queue that rejects publishes); publishing them "
                   "again in up to %s, at once when the broker acks again",
                   brokers_[broker_index_].display.c_str(), nacks_unlogged_,
                   FormatSeconds(r.delay_max).c_str());
    nacks_unlogged_ = 0;
    next_nack_log_ = now + kMessageLogInterval;
  }
}

void Forwarder::OnReturn(std::string_view message_id, int reply_code,
                         std::string_view reply_text) {
  PostId id;
  if (!ParseMessageId(message_id, &id) || !window_->OnReturn(id)) {
    PS_LOG_WARNING("forwarder: broker %s returned a message (%d %.*s) with message_id '%.*s' "
                   "that is not awaiting a confirm; ignored",
                   brokers_[broker_index_].display.c_str(), reply_code,
                   static_cast<int>(reply_text.size()), reply_text.data(),
                   static_cast<int>(std::min<size_t>(message_id.size(), 64)), message_id.data());
    return;
  }
  metrics_->unroutable_total.fetch_add(1, std::memory_order_relaxed);
  // Under the drop policy the drop is logged at the ack (OnAck), counted.
  const bool drop = config_.unroutable_policy == UnroutablePolicy::kDrop;
  if (drop) return;
  ++returns_unlogged_;
  const Clock::time_point now = Clock::now();
  if (now >= next_return_log_) {
    PS_LOG_WARNING("forwarder: broker %s returned %" PRIu64
                   " posts as unroutable (%d %.*s): no queue is bound to exchange '%s' for "
                   "their routing keys; unroutable_policy = %s: %s",
                   brokers_[broker_index_].display.c_str(), returns_unlogged_, reply_code,
                   static_cast<int>(reply_text.size()), reply_text.data(), exchange_.c_str(),
                   drop ? "drop" : "retry",
                   drop ? "they are dropped" : "they are published again after a delay");
    returns_unlogged_ = 0;
    next_return_log_ = now + kMessageLogInterval;
  }
}

void Forwarder::OnBlocked(std::string_view reason) {
  if (blocked_) return;
  blocked_ = true;
  path_.OnBlocked();
  metrics_->broker_blocked_total.fetch_add(1, std::memory_order_relaxed);
  SetConnectionState("blocked", nullptr);
  PS_LOG_WARNING("forwarder: broker %s blocked publishing (%.*s); waiting until it unblocks "
                 "(confirms are still processed; posts stay in the journal)",
                 brokers_[broker_index_].display.c_str(), static_cast<int>(reason.size()),
                 reason.data());
}

void Forwarder::OnUnblocked() {
  if (!blocked_) return;
  blocked_ = false;
  path_.OnConnected(Clock::now());
  SetConnectionState("connected", nullptr);
  PS_LOG_INFO("forwarder: broker %s unblocked publishing; resuming",
              brokers_[broker_index_].display.c_str());
}

}  // namespace postspool::daemon
