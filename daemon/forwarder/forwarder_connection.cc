// The forwarder's connection to the broker: connecting and failing over,
// the standby connection, losing a connection and changing the path.
#include "forwarder.h"

#include <algorithm>
#include <cinttypes>

#include "forwarder_internal.h"
#include "log.h"

namespace postspool::daemon {

using namespace forwarder_internal;

namespace {

// A connection that lasted this long counts as working (resets the backoff).
constexpr auto kStableConnection = std::chrono::seconds(10);
// A connect failure that repeats the last one is logged at most this often.
constexpr auto kConnectErrorLogInterval = std::chrono::seconds(60);
// The connect timeout of a standby connection (it blocks the forwarder).
constexpr uint32_t kStandbyConnectMs = 1000;

}  // namespace

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

}  // namespace postspool::daemon
