#include "config.h"

#include <cerrno>
#include <charconv>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

namespace postspool::daemon {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

bool ParseU64(std::string_view v, uint64_t* out, int base = 10) {
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), *out, base);
  return ec == std::errc() && p == v.data() + v.size();
}

bool ParseSize(std::string_view v, uint64_t* out) {
  uint64_t mult = 1;
  for (auto [suffix, m] : {std::pair{"KiB", 1ull << 10}, std::pair{"MiB", 1ull << 20},
                           std::pair{"GiB", 1ull << 30}, std::pair{"TiB", 1ull << 40}}) {
    if (v.ends_with(suffix)) {
      mult = m;
      v = Trim(v.substr(0, v.size() - 3));
      break;
    }
  }
  uint64_t n;
  if (!ParseU64(v, &n) || (n != 0 && mult > UINT64_MAX / n)) return false;
  *out = n * mult;
  return true;
}

bool ParseBool(std::string_view v, bool* out) {
  if (v == "true" || v == "yes" || v == "on" || v == "1") return *out = true, true;
  if (v == "false" || v == "no" || v == "off" || v == "0") return *out = false, true;
  return false;
}

template <typename T>
bool ParseU32(std::string_view v, T* out) {
  uint64_t n;
  if (!ParseU64(v, &n) || n > UINT32_MAX) return false;
  *out = static_cast<T>(n);
  return true;
}

}  // namespace

Status ParseConfig(const std::string& text, const std::string& origin, Config* c) {
  using Setter = std::function<bool(std::string_view)>;
  bool broker_seen = false;
  const std::map<std::string_view, Setter> keys = {
      {"socket_path", [&](auto v) { c->socket_path = v; return !v.empty(); }},
      {"socket_mode", [&](auto v) {
         uint64_t m;
         if (!ParseU64(v, &m, 8) || m > 0777) return false;
         c->socket_mode = static_cast<uint32_t>(m);
         return true;
       }},
      {"spool_dir", [&](auto v) { c->spool_dir = v; return !v.empty(); }},
      {"quarantine_dir", [&](auto v) { c->quarantine_dir = v; return !v.empty(); }},
      {"journal_dir", [&](auto v) { c->journal_dir = v; return !v.empty(); }},
      {"durability", [&](auto v) {
         if (v == "accepted") c->durability = Durability::kAccepted;
         else if (v == "synced") c->durability = Durability::kSynced;
         else return false;
         return true;
       }},
      {"io_backend", [&](auto v) {
         if (v == "auto") c->io_backend = IoBackend::kAuto;
         else if (v == "io_uring") c->io_backend = IoBackend::kIoUring;
         else if (v == "epoll") c->io_backend = IoBackend::kEpoll;
         else return false;
         return true;
       }},
      {"connections_max", [&](auto v) { return ParseU32(v, &c->connections_max) && c->connections_max > 0; }},
      {"connections_per_uid_max", [&](auto v) { return ParseU32(v, &c->connections_per_uid_max) && c->connections_per_uid_max > 0; }},
      {"spool_scan_entries_max", [&](auto v) { return ParseU32(v, &c->spool_scan_entries_max) && c->spool_scan_entries_max > 0; }},
      {"spool_read_bytes_max", [&](auto v) { return ParseSize(v, &c->spool_read_bytes_max) && c->spool_read_bytes_max >= (64u << 10); }},
      {"quarantine_bytes_max", [&](auto v) { return ParseSize(v, &c->quarantine_bytes_max); }},
      {"disk_bytes_per_uid_max", [&](auto v) { return ParseSize(v, &c->disk_bytes_per_uid_max) && c->disk_bytes_per_uid_max > 0; }},
      {"batch_records_max", [&](auto v) { return ParseU32(v, &c->batch_records_max) && c->batch_records_max > 0; }},
      {"batch_bytes_max", [&](auto v) { return ParseSize(v, &c->batch_bytes_max) && c->batch_bytes_max >= (256u << 10); }},
      {"dedupe_window_posts", [&](auto v) { return ParseU32(v, &c->dedupe_window_posts) && c->dedupe_window_posts <= (1u << 24); }},
      {"spool_rescan_interval_ms", [&](auto v) { return ParseU32(v, &c->spool_rescan_interval_ms) && c->spool_rescan_interval_ms > 0; }},
      {"journal_segment_bytes_max", [&](auto v) { return ParseSize(v, &c->journal_segment_bytes_max) && c->journal_segment_bytes_max >= (1u << 20); }},
      {"disk_bytes_max", [&](auto v) { return ParseSize(v, &c->disk_bytes_max) && c->disk_bytes_max > 0; }},
      {"post_broker", [&](std::string_view v) {
         if (!broker_seen) c->post_broker.clear();
         broker_seen = true;
         while (!v.empty()) {
           const size_t comma = v.find(',');
           const std::string_view one = Trim(v.substr(0, comma));
           if (one.empty()) return false;
           c->post_broker.emplace_back(one);
           if (comma == std::string_view::npos) break;
           v.remove_prefix(comma + 1);
         }
         return !c->post_broker.empty();
       }},
      {"post_exchange", [&](auto v) { c->post_exchange = v; return true; }},
      {"post_topicPrefix", [&](auto v) { c->post_topicPrefix = v; return !v.empty() && v.size() < 200; }},
      {"post_baseUrl", [&](auto v) { c->post_baseUrl = v; return !v.empty(); }},
      {"exchange_declare", [&](auto v) { return ParseBool(v, &c->exchange_declare); }},
      {"publish_window_max", [&](auto v) { return ParseU32(v, &c->publish_window_max) && c->publish_window_max > 0 && c->publish_window_max <= 65535; }},
      {"publish_mandatory", [&](auto v) { return ParseBool(v, &c->publish_mandatory); }},
      {"unroutable_policy", [&](auto v) {
         if (v == "drop") c->unroutable_policy = UnroutablePolicy::kDrop;
         else if (v == "retry") c->unroutable_policy = UnroutablePolicy::kRetry;
         else return false;
         return true;
       }},
      {"heartbeat_s", [&](auto v) { return ParseU32(v, &c->heartbeat_s); }},
      {"connect_timeout_ms", [&](auto v) { return ParseU32(v, &c->connect_timeout_ms) && c->connect_timeout_ms > 0; }},
      {"reconnect_delay_initial_ms", [&](auto v) { return ParseU32(v, &c->reconnect_delay_initial_ms) && c->reconnect_delay_initial_ms > 0; }},
      {"reconnect_delay_max_ms", [&](auto v) { return ParseU32(v, &c->reconnect_delay_max_ms) && c->reconnect_delay_max_ms > 0; }},
      {"republish_delay_initial_ms", [&](auto v) { return ParseU32(v, &c->republish_delay_initial_ms) && c->republish_delay_initial_ms > 0; }},
      {"republish_delay_max_ms", [&](auto v) { return ParseU32(v, &c->republish_delay_max_ms) && c->republish_delay_max_ms > 0; }},
      {"checkpoint_interval_ms", [&](auto v) { return ParseU32(v, &c->checkpoint_interval_ms) && c->checkpoint_interval_ms > 0; }},
      {"tls_ca_file", [&](auto v) { c->tls_ca_file = v; return true; }},
      {"tls_cert_file", [&](auto v) { c->tls_cert_file = v; return true; }},
      {"tls_key_file", [&](auto v) { c->tls_key_file = v; return true; }},
      {"tls_verify_peer", [&](auto v) { return ParseBool(v, &c->tls_verify_peer); }},
      {"tls_verify_hostname", [&](auto v) { return ParseBool(v, &c->tls_verify_hostname); }},
      {"shutdown_drain_ms", [&](auto v) { return ParseU32(v, &c->shutdown_drain_ms); }},
      {"metrics_file", [&](auto v) { c->metrics_file = v; return true; }},
      {"metrics_interval_ms", [&](auto v) { return ParseU32(v, &c->metrics_interval_ms) && c->metrics_interval_ms > 0; }},
      {"log_level", [&](auto v) {
         c->log_level = v;
         return v == "error" || v == "warning" || v == "info" || v == "debug";
       }},
  };
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    std::string_view l = line;
    if (const size_t hash = l.find('#'); hash != std::string_view::npos) l = l.substr(0, hash);
    l = Trim(l);
    if (l.empty()) continue;
    const size_t eq = l.find('=');
    const std::string where = origin + ":" + std::to_string(lineno);
    if (eq == std::string_view::npos) {
      return Status(StatusCode::kInvalidArgument, where + ": expected 'key = value'");
    }
    const std::string_view key = Trim(l.substr(0, eq));
    const std::string_view value = Trim(l.substr(eq + 1));
    auto it = keys.find(key);
    if (it == keys.end()) {
      return Status(StatusCode::kInvalidArgument, where + ": unknown key '" + std::string(key) + "'");
    }
    if (!it->second(value)) {
      return Status(StatusCode::kInvalidArgument,
                    where + ": bad value '" + std::string(value) + "' for " + std::string(key));
    }
  }
  if (c->reconnect_delay_initial_ms > c->reconnect_delay_max_ms) {
    return Status(StatusCode::kInvalidArgument,
                  origin + ": reconnect_delay_initial_ms is above reconnect_delay_max_ms");
  }
  if (c->republish_delay_initial_ms > c->republish_delay_max_ms) {
    return Status(StatusCode::kInvalidArgument,
                  origin + ": republish_delay_initial_ms is above republish_delay_max_ms");
  }
  return Status::Ok();
}

Status LoadConfig(const std::string& path, Config* config) {
  std::ifstream f(path);
  if (!f) return Status::FromErrno(errno, "open configuration " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ParseConfig(ss.str(), path, config);
}

const char* DurabilityName(Durability d) {
  return d == Durability::kSynced ? "synced" : "accepted";
}

const char* IoBackendName(IoBackend b) {
  switch (b) {
    case IoBackend::kAuto: return "auto";
    case IoBackend::kIoUring: return "io_uring";
    case IoBackend::kEpoll: return "epoll";
  }
  return "?";
}

}  // namespace postspool::daemon
