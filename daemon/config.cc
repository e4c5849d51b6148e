#include "config.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <charconv>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "amqp_url.h"
#include "ring_format.h"
#include "segment_format.h"
#include "socket_protocol.h"

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
      {"ring_dir", [&](auto v) { c->ring_dir = v; return true; }},
      {"ring_lanes", [&](auto v) { return ParseU32(v, &c->ring_lanes) && c->ring_lanes >= ring::kLanesMin && c->ring_lanes <= ring::kLanesMax; }},
      {"ring_lane_bytes", [&](auto v) {
         uint64_t n;
         if (!ParseSize(v, &n) || n < ring::kLaneBytesMin || n > ring::kLaneBytesMax || (n & (n - 1)) != 0) return false;
         c->ring_lane_bytes = static_cast<uint32_t>(n);
         return true;
       }},
      {"ring_uids_max", [&](auto v) { return ParseU32(v, &c->ring_uids_max) && c->ring_uids_max <= kRingUidsLimit; }},
      {"ring_lane_records_per_round", [&](auto v) { return ParseU32(v, &c->ring_lane_records_per_round) && c->ring_lane_records_per_round > 0; }},
      {"ring_poll_us", [&](auto v) { return ParseU32(v, &c->ring_poll_us) && c->ring_poll_us <= 1000000; }},
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
      {"batch_bytes_max", [&](auto v) { return ParseSize(v, &c->batch_bytes_max) && c->batch_bytes_max >= (512u << 10); }},
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
      {"path_refused_ms", [&](auto v) { return ParseU32(v, &c->path_refused_ms) && c->path_refused_ms > 0; }},
      {"path_silent_ms", [&](auto v) { return ParseU32(v, &c->path_silent_ms) && c->path_silent_ms > 0; }},
      {"path_wait_max_ms", [&](auto v) { return ParseU32(v, &c->path_wait_max_ms) && c->path_wait_max_ms > 0; }},
      {"checkpoint_interval_ms", [&](auto v) { return ParseU32(v, &c->checkpoint_interval_ms) && c->checkpoint_interval_ms > 0; }},
      {"tls_ca_file", [&](auto v) { c->tls_ca_file = v; return true; }},
      {"tls_cert_file", [&](auto v) { c->tls_cert_file = v; return true; }},
      {"tls_key_file", [&](auto v) { c->tls_key_file = v; return true; }},
      {"tls_verify_peer", [&](auto v) { return ParseBool(v, &c->tls_verify_peer); }},
      {"tls_verify_hostname", [&](auto v) { return ParseBool(v, &c->tls_verify_hostname); }},
      {"broker_standby", [&](auto v) { return ParseBool(v, &c->broker_standby); }},
      {"shutdown_drain_ms", [&](auto v) { return ParseU32(v, &c->shutdown_drain_ms); }},
      {"metrics_file", [&](auto v) { c->metrics_file = v; return true; }},
      {"control_socket_path", [&](auto v) { c->control_socket_path = v; return true; }},
      {"control_connections_max", [&](auto v) { return ParseU32(v, &c->control_connections_max) && c->control_connections_max > 0; }},
      {"control_timeout_ms", [&](auto v) { return ParseU32(v, &c->control_timeout_ms) && c->control_timeout_ms > 0; }},
      {"health_confirm_stall_ms", [&](auto v) { return ParseU32(v, &c->health_confirm_stall_ms) && c->health_confirm_stall_ms > 0; }},
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

Status CheckConfig(const Config& c) {
  const auto invalid = [](const std::string& why) {
    return Status(StatusCode::kInvalidArgument, why);
  };
  constexpr size_t kSunPathBytesMax = sizeof(sockaddr_un{}.sun_path) - 1;  // and its NUL
  if (c.socket_path.empty() || c.socket_path.front() != '/') {
    return invalid("socket_path must be an absolute path, not '" + c.socket_path + "'");
  }
  if (c.socket_path.size() > kSunPathBytesMax) {
    return invalid("socket_path is " + std::to_string(c.socket_path.size()) +
                   " bytes, above the " + std::to_string(kSunPathBytesMax) +
                   " a Unix socket address holds: " + c.socket_path);
  }
  for (const auto& [key, path] : {std::pair{"spool_dir", &c.spool_dir},
                                  std::pair{"quarantine_dir", &c.quarantine_dir},
                                  std::pair{"journal_dir", &c.journal_dir}}) {
    if (path->empty() || path->front() != '/') {
      return invalid(std::string(key) + " must be an absolute path, not '" + *path + "'");
    }
  }
  if (!c.control_socket_path.empty() &&
      (c.control_socket_path.front() != '/' || c.control_socket_path.size() > kSunPathBytesMax)) {
    return invalid("control_socket_path must be an absolute path of at most " +
                   std::to_string(kSunPathBytesMax) + " bytes (or empty), not '" +
                   c.control_socket_path + "'");
  }
  if (c.control_socket_path == c.socket_path) {
    return invalid("control_socket_path must differ from socket_path");
  }
  if (c.control_connections_max == 0 || c.control_timeout_ms == 0) {
    return invalid("control_connections_max and control_timeout_ms must be above 0");
  }
  if (!c.metrics_file.empty() && c.metrics_file.front() != '/') {
    return invalid("metrics_file must be an absolute path (or empty), not '" + c.metrics_file +
                   "'");
  }

  if (c.post_broker.empty()) return invalid("post_broker names no broker");
  for (const std::string& url : c.post_broker) {
    BrokerUrl parsed;
    // The message names the URL without its password.
    if (Status s = ParseBrokerUrl(url, &parsed); !s.ok()) return invalid("post_broker: " + s.message());
  }
  for (const auto& [key, path] : {std::pair{"tls_ca_file", &c.tls_ca_file},
                                  std::pair{"tls_cert_file", &c.tls_cert_file},
                                  std::pair{"tls_key_file", &c.tls_key_file}}) {
    if (path->empty()) continue;
    const int fd = ::open(path->c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return invalid(std::string(key) + " " + *path + " cannot be read: " + std::strerror(errno));
    }
    ::close(fd);
  }
  if (!c.tls_key_file.empty() && c.tls_cert_file.empty()) {
    return invalid("tls_key_file is set but tls_cert_file is not");
  }

  if (c.connections_max == 0) return invalid("connections_max is 0");
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) != 0) {
    return Status::FromErrno(errno, "getrlimit RLIMIT_NOFILE");
  }
  if (nofile.rlim_max != RLIM_INFINITY &&
      uint64_t{c.connections_max} + kDaemonFdsReserve > nofile.rlim_max) {
    return invalid("connections_max is " + std::to_string(c.connections_max) +
                   ", but the open files limit (RLIMIT_NOFILE, hard) is " +
                   std::to_string(nofile.rlim_max) + " and the daemon needs " +
                   std::to_string(kDaemonFdsReserve) +
                   " for itself: lower connections_max or raise the limit (LimitNOFILE=)");
  }

  // A request is taken only while the batch has room for twice its size
  // (stamping may grow it), so the batch must hold twice the largest one.
  const uint64_t batch_bytes_min = 2 * uint64_t{wire::kRequestBytesMax};
  if (c.batch_bytes_max < batch_bytes_min) {
    return invalid("batch_bytes_max is " + std::to_string(c.batch_bytes_max) +
                   " bytes, below twice the largest request (" +
                   std::to_string(batch_bytes_min) + " bytes): such requests would be refused "
                   "as busy forever");
  }
  if (c.journal_segment_bytes_max < c.batch_bytes_max) {
    return invalid("journal_segment_bytes_max (" + std::to_string(c.journal_segment_bytes_max) +
                   ") is below batch_bytes_max (" + std::to_string(c.batch_bytes_max) +
                   "): a group-commit batch must fit in one journal segment");
  }
  if (c.batch_records_max == 0) return invalid("batch_records_max is 0");
  if (c.disk_bytes_max == 0) return invalid("disk_bytes_max is 0");
  if (c.publish_window_max == 0 || c.publish_window_max > 65535) {
    return invalid("publish_window_max is " + std::to_string(c.publish_window_max) +
                   ", outside 1..65535");
  }
  if (c.dedupe_window_posts > (1u << 24)) {
    return invalid("dedupe_window_posts is above " + std::to_string(1u << 24));
  }
  if (c.post_topicPrefix.empty() || c.post_topicPrefix.size() >= 200) {
    return invalid("post_topicPrefix must be 1 to 199 bytes");
  }
  if (c.post_baseUrl.empty()) return invalid("post_baseUrl is empty");
  if (c.connections_per_uid_max == 0) return invalid("connections_per_uid_max is 0");
  if (c.spool_scan_entries_max == 0) return invalid("spool_scan_entries_max is 0");
  if (c.spool_read_bytes_max < (64u << 10)) return invalid("spool_read_bytes_max is below 64 KiB");
  if (c.reconnect_delay_initial_ms == 0 || c.reconnect_delay_max_ms == 0 ||
      c.reconnect_delay_initial_ms > c.reconnect_delay_max_ms) {
    return invalid("reconnect_delay_initial_ms must be 1 to reconnect_delay_max_ms");
  }
  for (const auto& [key, value] :
       {std::pair{"spool_rescan_interval_ms", c.spool_rescan_interval_ms},
        std::pair{"connect_timeout_ms", c.connect_timeout_ms},
        std::pair{"checkpoint_interval_ms", c.checkpoint_interval_ms},
        std::pair{"path_refused_ms", c.path_refused_ms},
        std::pair{"path_silent_ms", c.path_silent_ms},
        std::pair{"path_wait_max_ms", c.path_wait_max_ms},
        std::pair{"metrics_interval_ms", c.metrics_interval_ms}}) {
    if (value == 0) return invalid(std::string(key) + " is 0");
  }
  if (!c.ring_dir.empty() && c.ring_dir[0] != '/') return invalid("ring_dir is not absolute");
  if (c.ring_lanes < ring::kLanesMin || c.ring_lanes > ring::kLanesMax) {
    return invalid("ring_lanes is outside 1..4096");
  }
  if (c.ring_lane_bytes < ring::kLaneBytesMin || c.ring_lane_bytes > ring::kLaneBytesMax ||
      (c.ring_lane_bytes & (c.ring_lane_bytes - 1)) != 0) {
    return invalid("ring_lane_bytes is not a power of two from 4 KiB to 16 MiB");
  }
  if (c.ring_uids_max > kRingUidsLimit) return invalid("ring_uids_max is above 127");
  if (c.ring_lane_records_per_round == 0) return invalid("ring_lane_records_per_round is 0");
  if (c.socket_mode > 0777) return invalid("socket_mode has bits outside 0777");
  if (c.log_level != "error" && c.log_level != "warning" && c.log_level != "info" &&
      c.log_level != "debug") {
    return invalid("log_level '" + c.log_level + "' is not error, warning, info or debug");
  }
  return Status::Ok();
}

std::vector<std::string> ConfigWarnings(const Config& c) {
  std::vector<std::string> out;
  if (c.DiskBytesPerUidMax() >= c.disk_bytes_max) {
    out.push_back("disk_bytes_per_uid_max (" + std::to_string(c.DiskBytesPerUidMax()) +
                  " bytes) is not below disk_bytes_max (" + std::to_string(c.disk_bytes_max) +
                  " bytes): one user can take the whole quota and others' posts are refused "
                  "as full; leave it unset (a quarter of disk_bytes_max) or lower it");
  }
  return out;
}

Status RaiseOpenFilesLimit() {
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) != 0) {
    return Status::FromErrno(errno, "getrlimit RLIMIT_NOFILE");
  }
  if (nofile.rlim_cur == nofile.rlim_max) return Status::Ok();
  nofile.rlim_cur = nofile.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &nofile) != 0) {
    return Status::FromErrno(errno, "setrlimit RLIMIT_NOFILE");
  }
  return Status::Ok();
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
