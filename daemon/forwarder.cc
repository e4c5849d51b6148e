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
#include "log.h"
#include "post.h"

namespace postspool::daemon {
namespace {

using std::chrono::milliseconds;

// Records published between two looks at what the broker sent: keeps the
// reaction to acks and connection.blocked prompt while the backlog drains.
constexpr int kPublishBatch = 64;
// A connection that lasted this long counts as working (resets the backoff).
constexpr auto kStableConnection = std::chrono::seconds(10);
// Per-message warnings (nacks, returns) are logged at most this often.
constexpr auto kMessageLogInterval = std::chrono::seconds(10);
// The longest poll() when nothing else is due.
constexpr auto kIdleWake = std::chrono::seconds(1);
// Backlog counting: records counted per round of the thread, and how often
// the post at the watermark is read again for its age.
constexpr int kCountBatch = 4096;
constexpr auto kPeekInterval = milliseconds(500);
// A connect failure that repeats the last one is logged at most this often.
constexpr auto kConnectErrorLogInterval = std::chrono::seconds(60);
// While posts wait for the broker, the path is judged at least this often.
constexpr auto kPathCheckInterval = milliseconds(200);
// After a round that published new posts without filling its batch, new
// commits wake the forwarder no sooner than this: while posts come one by
// one (one client posting in a loop), each round would otherwise publish
// one, and cost a wake-up, a write to the broker and a confirm to read per
// post. A post that comes after a pause is published at once; one in a
// stream waits at most this long.
constexpr auto kRoundGap = std::chrono::microseconds(500);
// How long shutdown spends counting what is left unconfirmed.
constexpr auto kStopCountBudget = milliseconds(1000);
// The connect timeout of a standby connection (it blocks the forwarder).
constexpr uint32_t kStandbyConnectMs = 1000;

int64_t UnixMsNow() {
  return std::chrono::duration_cast<milliseconds>(
             std::chrono::system_clock::now().time_since_epoch()).count();
}

uint64_t RandomSeed() {
  uint64_t seed = 0;
  if (::getrandom(&seed, sizeof seed, GRND_NONBLOCK) != sizeof seed) {
    seed = std::random_device{}();
  }
  return seed;
}

std::string FormatSeconds(milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

std::string FormatPosition(JournalPosition p) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%016" PRIx64 ":%" PRIu64, p.segment_seq, p.offset);
  return buf;
}

std::string IdString(PostId id) {
  const MessageId m = FormatMessageId(id);
  return std::string(m.data(), m.size());
}

void Add(Metrics::Counter& counter, uint64_t n) {
  if (n != 0) counter.fetch_add(n, std::memory_order_relaxed);
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
                                config.path_wait_max_ms}) {
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

std::string Forwarder::ExchangeFor(const BrokerUrl& url) const {
  return config_.post_exchange.empty() ? "xs_" + url.user : config_.post_exchange;
}

AmqpSession::Options Forwarder::SessionOptions(const BrokerUrl& url) const {
  AmqpSession::Options options;
  options.heartbeat_s = config_.heartbeat_s;
  options.connect_timeout_ms = config_.connect_timeout_ms;
  options.tls_ca_file = config_.tls_ca_file;
  options.tls_cert_file = config_.tls_cert_file;
  options.tls_key_file = config_.tls_key_file;
  options.tls_verify_peer = config_.tls_verify_peer;
  options.tls_verify_hostname = config_.tls_verify_hostname;
  options.exchange = ExchangeFor(url);
  options.exchange_declare = config_.exchange_declare;
  return options;
}

void Forwarder::Connect(Clock::time_point now) {
  const BrokerUrl& url = brokers_[broker_index_];
  const AmqpSession::Options options = SessionOptions(url);
  std::unique_ptr<AmqpSession> session;
  if (Status s = AmqpSession::Open(url, options, &session); !s.ok()) {
    metrics_->broker_connect_failures_total.fetch_add(1, std::memory_order_relaxed);
    const std::string failed = url.display;
    ScheduleReconnect(now);
    const milliseconds delay =
        std::chrono::duration_cast<milliseconds>(reconnect_at_ - now);
    const bool config_error =
        s.code() == StatusCode::kNotFound || s.code() == StatusCode::kInvalidArgument ||
        s.code() == StatusCode::kPermissionDenied;
    ++connect_failures_in_row_;
    const std::string error = failed + ": " + s.message();
    SetConnectionState("waiting", &error);
    // One line per change of state: the same failure again is logged at
    // most every kConnectErrorLogInterval, with the attempts in between.
    if (error != last_connect_error_ || now >= next_connect_error_log_) {
      Log(config_error ? LogLevel::kError : LogLevel::kWarning,
          "forwarder: cannot use broker %s: %s; trying %s in %s (%u failed attempts in a row"
          "%s)",
          failed.c_str(), s.message().c_str(), brokers_[broker_index_].display.c_str(),
          FormatSeconds(delay).c_str(), connect_failures_in_row_,
          connect_errors_unlogged_ > 0 ? ", the same failures in between not logged" : "");
      last_connect_error_ = error;
      next_connect_error_log_ = now + kConnectErrorLogInterval;
      connect_errors_unlogged_ = 0;
    } else {
      ++connect_errors_unlogged_;
    }
    return;
  }
  metrics_->broker_connects_total.fetch_add(1, std::memory_order_relaxed);
  connect_failures_in_row_ = 0;
  last_connect_error_.clear();
  connect_errors_unlogged_ = 0;
  // The window kept what earlier channels confirmed: the posts not
  // confirmed are due at once, and the reader goes on where it was.
  assert(window_->in_flight() == 0);
  if (!UseSession(std::move(session), broker_index_, /*blocked=*/false, now)) return;
  PS_LOG_INFO("forwarder: connected to %s (exchange '%s', heartbeat %d s); publishing again "
              "%zu unconfirmed posts after journal position %s, then new ones",
              url.display.c_str(), exchange_.c_str(), session_->heartbeat_s(),
              window_->waiting(), FormatPosition(window_->watermark()).c_str());
}

bool Forwarder::UseSession(std::unique_ptr<AmqpSession> session, size_t index, bool blocked,
                           Clock::time_point now, const std::string* error) {
  {
    std::lock_guard lock(socket_mu_);
    if (aborted_) return false;  // stopping: drop the new session
    socket_fd_ = session->fd();
  }
  session_ = std::move(session);
  broker_index_ = index;
  metrics_->broker_connected.store(1, std::memory_order_relaxed);
  exchange_ = ExchangeFor(brokers_[index]);
  source_ = brokers_[index].user;
  blocked_ = blocked;
  connected_at_ = now;
  confirms_this_connection_ = 0;
  warming_ = false;
  SetConnectionState(blocked ? "blocked" : "connected", error);
  path_.OnConnected(now);
  idle_at_limit_ = JournalPosition{};
  return true;
}

// ---------------------------------------------------------------------------
// The standby connection (standby_session.h)

void Forwarder::MaintainStandby(Clock::time_point now) {
  if (!config_.broker_standby || brokers_.size() < 2) return;
  if (standby_.open() && (standby_readable_ || now >= standby_.next_tick())) {
    standby_readable_ = false;
    const std::string broker = brokers_[standby_.broker_index()].display;
    if (Status s = standby_.Tend(now); !s.ok()) {
      PS_LOG_WARNING("forwarder: lost the standby connection to %s: %s; opening one again in "
                     "%s",
                     broker.c_str(), s.message().c_str(),
                     FormatSeconds(std::chrono::duration_cast<milliseconds>(
                                       standby_.open_at() - now))
                         .c_str());
    }
  }
  // Only next to a connection that works (it had a confirm) and publishes.
  if (!session_ || blocked_ || confirms_this_connection_ == 0) {
    warming_ = false;
  } else if (!standby_.open()) {
    if (now >= standby_.open_at()) OpenStandby(now);
  } else if (!standby_.warm()) {
    // Warm it: publishing stops until nothing is in flight, then the two
    // connections swap, so that both channels have published.
    warming_ = true;
    if (window_->in_flight() == 0) SwapWithStandby(now);
  }
  metrics_->broker_standby_connected.store(standby_.open() ? (standby_.warm() ? 2 : 1) : 0,
                                           std::memory_order_relaxed);
}

void Forwarder::OpenStandby(Clock::time_point now) {
  // The broker after the one in use, past the one that last failed.
  size_t index = (broker_index_ + 1) % brokers_.size();
  if (index == failed_index_ && brokers_.size() > 2) index = (index + 1) % brokers_.size();
  const BrokerUrl& url = brokers_[index];
  AmqpSession::Options options = SessionOptions(url);
  // It blocks the forwarder while it connects: briefly, even to a node that
  // does not answer.
  options.connect_timeout_ms = std::min<uint32_t>(options.connect_timeout_ms, kStandbyConnectMs);
  if (Status s = standby_.Open(url, index, options, now); !s.ok()) {
    metrics_->broker_connect_failures_total.fetch_add(1, std::memory_order_relaxed);
    PS_LOG_WARNING("forwarder: cannot open a standby connection to %s: %s; trying again in %s",
                   url.display.c_str(), s.message().c_str(),
                   FormatSeconds(std::chrono::duration_cast<milliseconds>(
                                     standby_.open_at() - Clock::now()))
                       .c_str());
    return;
  }
  metrics_->broker_connects_total.fetch_add(1, std::memory_order_relaxed);
  PS_LOG_INFO("forwarder: opened a standby connection to %s; publishing moves to it once to "
              "make it ready, then it waits",
              url.display.c_str());
}

void Forwarder::SwapWithStandby(Clock::time_point now) {
  const size_t index = standby_.broker_index();
  const bool blocked = standby_.blocked();
  std::unique_ptr<AmqpSession> next = standby_.Take();
  const std::string from = brokers_[broker_index_].display;
  {
    std::lock_guard lock(socket_mu_);
    socket_fd_ = -1;
  }
  standby_.Put(std::move(session_), broker_index_, /*warm=*/true, blocked_, now);
  // Nothing is in flight; the window counts on from that channel's next
  // tag (it published before, when it was in use).
  (void)window_->Reset(now, next->next_delivery_tag());
  if (!UseSession(std::move(next), index, blocked, now)) return;
  PS_LOG_INFO("forwarder: publishing on the connection to %s now, and keeping the one to %s as "
              "the standby (ready: its channel has published)",
              brokers_[index].display.c_str(), from.c_str());
}

bool Forwarder::TakeOverStandby(const std::string& why, Clock::time_point now) {
  if (!standby_.open() || !standby_.warm() || !session_) return false;
  const std::string from = brokers_[broker_index_].display;
  failed_index_ = broker_index_;
  CloseSession(/*polite=*/false);
  const size_t index = standby_.broker_index();
  const bool blocked = standby_.blocked();
  std::unique_ptr<AmqpSession> next = standby_.Take(/*took_over=*/true, now);
  const size_t unconfirmed = window_->Reset(now, next->next_delivery_tag());
  const std::string error = from + ": " + why;
  if (!UseSession(std::move(next), index, blocked, now, &error)) return true;
  metrics_->broker_standby_takeovers_total.fetch_add(1, std::memory_order_relaxed);
  metrics_->broker_standby_connected.store(0, std::memory_order_relaxed);
  PS_LOG_WARNING("forwarder: broker %s %s; moved to the standby connection to %s at once "
                 "(%zu unconfirmed posts will be published again)",
                 from.c_str(), why.c_str(), brokers_[index].display.c_str(), unconfirmed);
  return true;
}

void Forwarder::ScheduleReconnect(Clock::time_point now) {
  const milliseconds delay = connect_backoff_.Next();
  broker_index_ = (broker_index_ + 1) % brokers_.size();
  reconnect_at_ = now + delay;
  reconnect_delay_ms_ = static_cast<uint64_t>(delay.count());
}

void Forwarder::CloseSession(bool polite) {
  if (!session_) return;
  if (polite) session_->Close();
  {
    std::lock_guard lock(socket_mu_);
    socket_fd_ = -1;
  }
  session_.reset();
}

void Forwarder::LoseConnection(const Status& why, Clock::time_point now) {
  const std::string lost = brokers_[broker_index_].display;
  metrics_->broker_connection_lost_total.fetch_add(1, std::memory_order_relaxed);
  if (TakeOverStandby("lost the connection: " + why.message(), now)) return;
  metrics_->broker_connected.store(0, std::memory_order_relaxed);
  metrics_->publish_in_flight.store(0, std::memory_order_relaxed);
  CloseSession(/*polite=*/false);
  if (confirms_this_connection_ > 0 || now - connected_at_ >= kStableConnection) {
    connect_backoff_.Reset();
  }
  const size_t unconfirmed = window_->Reset(now);
  idle_at_limit_ = JournalPosition{};
  blocked_ = false;
  ScheduleReconnect(now);
  const milliseconds delay = std::chrono::duration_cast<milliseconds>(reconnect_at_ - now);
  const std::string error = lost + ": " + why.message();
  SetConnectionState("waiting", &error);
  PS_LOG_WARNING("forwarder: lost the connection to %s: %s; %zu unconfirmed posts will be "
                 "published again; connecting to %s in %s",
                 lost.c_str(), why.message().c_str(), unconfirmed,
                 brokers_[broker_index_].display.c_str(), FormatSeconds(delay).c_str());
}

void Forwarder::CountPathChange(const std::string& what) {
  metrics_->broker_path_changes_total.fetch_add(1, std::memory_order_relaxed);
  ++path_changes_;
  last_path_change_ = what;
}

void Forwarder::ChangePath(const std::string& why, bool next_broker, Clock::time_point now) {
  const std::string from = brokers_[broker_index_].display;
  metrics_->broker_connected.store(0, std::memory_order_relaxed);
  metrics_->publish_in_flight.store(0, std::memory_order_relaxed);
  CloseSession(/*polite=*/false);
  const size_t unconfirmed = window_->Reset(now);
  idle_at_limit_ = JournalPosition{};
  blocked_ = false;
  if (next_broker) broker_index_ = (broker_index_ + 1) % brokers_.size();
  reconnect_at_ = now;
  const std::string error = from + ": " + why;
  CountPathChange(error);
  SetConnectionState("connecting", &error);
  PS_LOG_WARNING("forwarder: broker %s %s; dropping the connection and connecting to %s now "
                 "(%zu unconfirmed posts will be published again; path change %" PRIu64 ")",
                 from.c_str(), why.c_str(), brokers_[broker_index_].display.c_str(), unconfirmed,
                 path_changes_);
}

bool Forwarder::Pump(Clock::time_point now) {
  if (Status s = session_->ReadFrames(this); !s.ok()) {
    LoseConnection(s, now);
    return false;
  }
  // The confirms just read moved the watermark: record it before publishing
  // anything more, so that what a crash leaves unconfirmed after the stored
  // watermark is at most one window (publish_window_max).
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
    // Then new ones. Drain the eventfd before reading the committed end, so
    // that a commit after the read wakes the next poll.
    commits_->Drain();
    const JournalPosition limit = commits_->committed();
    while (budget > 0 && !warming_ && window_->CanPublishNew()) {
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
        last_new_round_ = now;
      }
    }
    more = budget == 0;
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
  feed_.WriteWatermark(window_->watermark());
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
    fds[n++] = pollfd{session_->fd(), POLLIN, 0};
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
      // New commits matter only when there is room to publish them, and
      // no sooner than kRoundGap after the last round that published some.
      if (window_->CanPublishNew()) {
        if (now < last_new_round_ + kRoundGap) {
          earlier(last_new_round_ + kRoundGap);
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
