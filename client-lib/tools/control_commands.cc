#include "control_commands.h"

#include <getopt.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

namespace postspool::cli {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr char kDefaultControlSocket[] = "/run/postspool/control.sock";
// One request's whole budget: connect, send, the daemon's answer.
constexpr auto kRequestTimeout = std::chrono::seconds(5);
constexpr size_t kReplyBytesMax = 4u << 20;
// drain: how often the daemon is asked, and how often a plain line is printed.
constexpr auto kDrainPoll = std::chrono::milliseconds(500);
constexpr auto kDrainLineInterval = std::chrono::seconds(5);
// The drain's rate: confirmed posts over this last stretch of time.
constexpr auto kDrainRateWindow = std::chrono::seconds(10);

constexpr char kControlUsage[] =
    "usage: postspool status [--json] [--control-socket PATH]\n"
    "       postspool drain [--timeout DURATION] [--control-socket PATH]\n"
    "       postspool metrics [--control-socket PATH]\n"
    "       postspool reconnect [--control-socket PATH]\n"
    "       postspool log-level LEVEL [--control-socket PATH]\n"
    "The control socket is $POSTSPOOL_CONTROL_SOCKET, else /run/postspool/control.sock.\n"
    "DURATION: a number with ms, s, m or h (no unit: seconds). LEVEL: error, warning, info,\n"
    "debug. Exit codes: 0 ok (status: healthy), 1 failed (status: unhealthy; drain: timed\n"
    "out), 2 usage error, 3 the daemon cannot be reached.\n";

// A usage error: the one line that names the problem and where the usage
// is, not the whole usage.
int Usage(std::string_view command, const std::string& why) {
  std::fprintf(stderr, "postspool %.*s: %s\n(usage: postspool %.*s --help)\n",
               static_cast<int>(command.size()), command.data(), why.c_str(),
               static_cast<int>(command.size()), command.data());
  return kExitUsage;
}

std::string SocketPath(const std::optional<std::string>& option) {
  if (option) return *option;
  if (const char* env = std::getenv("POSTSPOOL_CONTROL_SOCKET"); env != nullptr && *env != '\0') {
    return env;
  }
  return kDefaultControlSocket;
}

// Sends one request and reads the one reply. False with *error (in the
// user's words) if the daemon cannot be reached or does not answer.
bool Ask(const std::string& path, const json& request, json* reply, std::string* error) {
  const Clock::time_point deadline = Clock::now() + kRequestTimeout;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    *error = "control socket path is too long: " + path;
    return false;
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    *error = std::string("socket: ") + std::strerror(errno);
    return false;
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 &&
      errno != EINPROGRESS && errno != EAGAIN) {
    const int e = errno;
    *error = "cannot reach postspoold at " + path + ": " + std::strerror(e);
    if (e == ENOENT) *error += " (is the daemon running? is control_socket_path set?)";
    return false;
  }
  const auto wait = [&](short events) {
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{fd, events, 0};
      const int r = ::poll(&p, 1, static_cast<int>(left));
      if (r > 0) return true;
      if (r < 0 && errno != EINTR) return false;
    }
  };
  const std::string line = request.dump() + "\n";
  size_t sent = 0;
  while (sent < line.size()) {
    const ssize_t n = ::send(fd, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!wait(POLLOUT)) {
        *error = "postspoold at " + path + " did not take the request in time";
        return false;
      }
    } else {
      *error = "cannot send to postspoold at " + path + ": " + std::strerror(errno);
      return false;
    }
  }
  std::string in;
  char buf[8192];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n > 0) {
      in.append(buf, static_cast<size_t>(n));
      if (in.size() > kReplyBytesMax) {
        *error = "postspoold at " + path + " sent a reply that is too long";
        return false;
      }
      continue;
    }
    if (n == 0) break;
    if (errno == EINTR) continue;
    if (errno == EAGAIN) {
      if (!wait(POLLIN)) {
        *error = "postspoold at " + path + " did not answer within " +
                 std::to_string(kRequestTimeout.count()) + " s";
        return false;
      }
      continue;
    }
    *error = "cannot read from postspoold at " + path + ": " + std::strerror(errno);
    return false;
  }
  *reply = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (reply->is_discarded() || !reply->is_object()) {
    *error = "postspoold at " + path + " sent a reply that is not a JSON object";
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------
// Formatting

std::string Bytes(double b) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, kUnits[u]);
  return buf;
}

std::string Seconds(double s) {
  char buf[48];
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%.1f s", s);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%dm %02ds", static_cast<int>(s / 60), static_cast<int>(s) % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%dh %02dm", static_cast<int>(s / 3600),
                  static_cast<int>(s / 60) % 60);
  }
  return buf;
}

uint64_t U(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
}
double D(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}
std::string S(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}
bool B(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}
const json& O(const json& j, const char* key) {
  static const json kEmpty = json::object();
  const auto it = j.find(key);
  return it != j.end() && it->is_object() ? *it : kEmpty;
}

void PrintStatus(const json& r) {
  const json& d = O(r, "daemon");
  const json& b = O(r, "broker");
  const json& p = O(r, "posts");
  const json& bl = O(r, "backlog");
  const json& sp = O(r, "spool");
  const json& disk = O(r, "disk");
  const json& rates = O(r, "rates");
  const bool healthy = r.value("healthy", false);
  std::printf("postspoold  pid %llu, %s, up %s, %s, durability %s, log level %s\n",
              static_cast<unsigned long long>(U(d, "pid")), S(d, "state").c_str(),
              Seconds(D(d, "uptime_s")).c_str(), S(d, "io_backend").c_str(),
              S(d, "durability").c_str(), S(d, "log_level").c_str());
  if (healthy) {
    std::printf("health      healthy\n");
  } else {
    std::string reasons;
    if (const auto it = r.find("unhealthy_reasons"); it != r.end() && it->is_array()) {
      for (const json& x : *it) {
        if (!reasons.empty()) reasons += "; ";
        reasons += x.is_string() ? x.get<std::string>() : x.dump();
      }
    }
    std::printf("health      UNHEALTHY: %s\n", reasons.c_str());
  }
  std::printf("broker      %s  %s\n", S(b, "url").c_str(), S(b, "state").c_str());
  if (!S(b, "last_error").empty()) {
    std::printf("            last error %s ago: %s\n", Seconds(D(b, "last_error_age_s")).c_str(),
                S(b, "last_error").c_str());
  }
  if (!S(b, "standby").empty()) {
    std::printf("            standby %s (%s)\n", S(b, "standby").c_str(),
                B(b, "standby_ready") ? "ready to take over" : "warming up");
  }
  if (S(b, "state") == "waiting") {
    std::printf("            next attempt in %s (back-off %s, %llu failures in a row)\n",
                Seconds(D(b, "next_attempt_in_ms") / 1000).c_str(),
                Seconds(D(b, "reconnect_delay_ms") / 1000).c_str(),
                static_cast<unsigned long long>(U(b, "connect_failures_in_row")));
  }
  const json& recv = O(p, "received");
  const json& skip = O(p, "skipped_damaged");
  const json& ref = O(p, "refused");
  std::printf("posts       received %llu (ring %llu, socket %llu, spool %llu), journaled %llu\n",
              static_cast<unsigned long long>(U(recv, "ring") + U(recv, "socket") + U(recv, "spool")),
              static_cast<unsigned long long>(U(recv, "ring")),
              static_cast<unsigned long long>(U(recv, "socket")),
              static_cast<unsigned long long>(U(recv, "spool")),
              static_cast<unsigned long long>(U(p, "journaled")));
  std::printf("            published %llu, confirmed %llu, nacked %llu, unroutable %llu, "
              "republished %llu\n",
              static_cast<unsigned long long>(U(p, "published")),
              static_cast<unsigned long long>(U(p, "confirmed")),
              static_cast<unsigned long long>(U(p, "nacked")),
              static_cast<unsigned long long>(U(p, "unroutable")),
              static_cast<unsigned long long>(U(p, "republished")));
  std::printf("            unroutable dropped %llu; skipped as damaged: %llu unencodable "
              "posts, %s of journal (%llu records lost), %s of spool (%llu records lost)\n",
              static_cast<unsigned long long>(U(p, "unroutable_dropped")),
              static_cast<unsigned long long>(U(skip, "posts_unencodable")),
              Bytes(static_cast<double>(U(skip, "journal_bytes"))).c_str(),
              static_cast<unsigned long long>(U(skip, "journal_records_lost")),
              Bytes(static_cast<double>(U(skip, "spool_bytes"))).c_str(),
              static_cast<unsigned long long>(U(skip, "spool_records_lost")));
  std::printf("            not made by the shim (its processes' count): %llu\n",
              static_cast<unsigned long long>(U(p, "shim_posts_dropped")));
  std::printf("            refused: %llu full, %llu busy, %llu malformed, %llu invalid\n",
              static_cast<unsigned long long>(U(ref, "full")),
              static_cast<unsigned long long>(U(ref, "busy")),
              static_cast<unsigned long long>(U(ref, "malformed")),
              static_cast<unsigned long long>(U(ref, "invalid")));
  std::string age = "none";
  if (const auto it = bl.find("oldest_unconfirmed_age_s"); it != bl.end() && it->is_number()) {
    age = Seconds(it->get<double>()) + " old";
  }
  std::printf("backlog     %s%llu posts (%s), oldest unconfirmed %s, %llu in flight; "
              "journal files %s\n",
              bl.value("posts_exact", true) ? "" : "at least ",
              static_cast<unsigned long long>(U(bl, "posts")),
              Bytes(static_cast<double>(U(bl, "bytes"))).c_str(), age.c_str(),
              static_cast<unsigned long long>(U(bl, "in_flight")),
              Bytes(static_cast<double>(U(bl, "journal_bytes"))).c_str());
  std::printf("spool       %llu segments waiting (%s), %s%llu files quarantined (%s)\n",
              static_cast<unsigned long long>(U(sp, "segments_waiting")),
              Bytes(static_cast<double>(U(sp, "bytes"))).c_str(),
              sp.value("files_quarantined_exact", true) ? "" : "at least ",
              static_cast<unsigned long long>(U(sp, "files_quarantined")),
              Bytes(static_cast<double>(U(sp, "quarantine_bytes"))).c_str());
  const double used = static_cast<double>(U(disk, "bytes"));
  const double max = static_cast<double>(U(disk, "bytes_max"));
  std::printf("disk        %s of %s (%.1f%%); at most %s per uid\n", Bytes(used).c_str(),
              Bytes(max).c_str(), max > 0 ? 100.0 * used / max : 0.0,
              Bytes(static_cast<double>(U(disk, "per_uid_bytes_max"))).c_str());
  if (const auto it = disk.find("uids"); it != disk.end() && it->is_array()) {
    for (const json& u : *it) {
      std::printf("            uid %llu: %s\n", static_cast<unsigned long long>(U(u, "uid")),
                  Bytes(static_cast<double>(U(u, "bytes"))).c_str());
    }
  }
  if (rates.contains("window_s")) {
    std::printf("rates       last %s: received %.1f/s, published %.1f/s, confirmed %.1f/s\n",
                Seconds(D(rates, "window_s")).c_str(), D(rates, "received_per_s"),
                D(rates, "published_per_s"), D(rates, "confirmed_per_s"));
  } else {
    std::printf("rates       not measured yet\n");
  }
}

// ---------------------------------------------------------------------------
// Options

struct CommonOptions {
  std::optional<std::string> socket;
  bool json = false;
  std::optional<std::chrono::milliseconds> timeout;
  std::vector<std::string> operands;
};

// "90", "90s", "500ms", "5m", "1h", "1.5s".
bool ParseDuration(const char* text, std::chrono::milliseconds* out) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text, &end);
  if (end == text || errno != 0 || !std::isfinite(v) || v < 0) return false;
  const std::string unit = end;
  double ms;
  if (unit.empty() || unit == "s") {
    ms = v * 1000;
  } else if (unit == "ms") {
    ms = v;
  } else if (unit == "m") {
    ms = v * 60000;
  } else if (unit == "h") {
    ms = v * 3600000;
  } else {
    return false;
  }
  if (ms > 1e12) return false;
  *out = std::chrono::milliseconds(static_cast<int64_t>(ms));
  return true;
}

// Parses argv; returns an exit code (usage error) or -1 to go on.
int ParseOptions(std::string_view name, int argc, char** argv, CommonOptions* o) {
  const bool takes_json = name == "status";
  const bool takes_timeout = name == "drain";
  static const option kLong[] = {
      {"control-socket", required_argument, nullptr, 'S'},
      {"json", no_argument, nullptr, 'j'},
      {"timeout", required_argument, nullptr, 't'},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  optind = 0;  // a full re-initialisation of GNU getopt
  opterr = 0;
  for (;;) {
    // The leading ':': a missing value is ':' ("needs a value"), not '?'.
    const int c = ::getopt_long(argc, argv, ":h", kLong, nullptr);
    if (c == -1) break;
    switch (c) {
      case 'S':
        o->socket = optarg;
        break;
      case 'j':
        if (!takes_json) return Usage(name, "does not take --json");
        o->json = true;
        break;
      case 't': {
        if (!takes_timeout) return Usage(name, "does not take --timeout");
        std::chrono::milliseconds t;
        if (!ParseDuration(optarg, &t)) {
          return Usage(name, "--timeout takes a duration such as 30s, 500ms, 5m or 1h, not \"" +
                       std::string(optarg) + "\"");
        }
        o->timeout = t;
        break;
      }
      case 'h':
        std::fputs(kControlUsage, stdout);
        return kExitOk;
      case ':':
        return Usage(name, std::string(argv[optind - 1]) + " needs a value");
      default:
        return Usage(name, "unknown option \"" + std::string(argv[optind - 1]) + "\"");
    }
  }
  for (int i = optind; i < argc; ++i) o->operands.emplace_back(argv[i]);
  return -1;
}

// ---------------------------------------------------------------------------
// Commands

int Unreachable(const std::string& error) {
  std::fprintf(stderr, "postspool: %s\n", error.c_str());
  return kExitNoDaemon;
}

// A reply with ok false: says why, exit 1.
int Refused(const json& reply) {
  std::fprintf(stderr, "postspool: postspoold refused: %s\n", S(reply, "error").c_str());
  return kExitFailed;
}

int RunStatus(const CommonOptions& o) {
  json reply;
  std::string error;
  if (!Ask(SocketPath(o.socket), {{"request", "status"}}, &reply, &error)) return Unreachable(error);
  if (!reply.value("ok", false)) return Refused(reply);
  if (o.json) {
    std::printf("%s\n", reply.dump(2, ' ', false, json::error_handler_t::replace).c_str());
  } else {
    PrintStatus(reply);
  }
  return reply.value("healthy", false) ? kExitOk : kExitFailed;
}

int RunMetrics(const CommonOptions& o) {
  json reply;
  std::string error;
  if (!Ask(SocketPath(o.socket), {{"request", "metrics"}}, &reply, &error)) return Unreachable(error);
  if (!reply.value("ok", false)) return Refused(reply);
  std::fputs(S(reply, "text").c_str(), stdout);
  return kExitOk;
}

int RunSimple(const json& request, const CommonOptions& o, const char* done) {
  json reply;
  std::string error;
  if (!Ask(SocketPath(o.socket), request, &reply, &error)) return Unreachable(error);
  if (!reply.value("ok", false)) return Refused(reply);
  std::printf("%s\n", done);
  return kExitOk;
}

bool PositionAtLeast(const json& a, const json& b) {
  if (!a.is_array() || !b.is_array() || a.size() != 2 || b.size() != 2) return false;
  const auto pa = std::pair{a[0].get<uint64_t>(), a[1].get<uint64_t>()};
  const auto pb = std::pair{b[0].get<uint64_t>(), b[1].get<uint64_t>()};
  return pa >= pb;
}

// The drain: waits until the broker confirmed (or the daemon dropped, as
// unroutable) everything journaled when it started, i.e. until the
// daemon's watermark reaches the committed end seen at the start. New
// posts that keep arriving do not hold it up.
int RunDrain(const CommonOptions& o) {
  const std::string path = SocketPath(o.socket);
  const bool tty = ::isatty(STDOUT_FILENO) == 1;
  const Clock::time_point start = Clock::now();
  json reply;
  std::string error;
  if (!Ask(path, {{"request", "status"}}, &reply, &error)) return Unreachable(error);
  if (!reply.value("ok", false)) return Refused(reply);
  const json target = O(reply, "backlog").value("committed", json());
  const auto settled = [](const json& r) {
    const json& p = O(r, "posts");
    return U(p, "confirmed") + U(p, "unroutable_dropped");
  };
  // The rate is measured over the last kDrainRateWindow, not since the
  // drain started: after a broker outage it is the broker's pace now.
  std::deque<std::pair<Clock::time_point, uint64_t>> samples{{start, settled(reply)}};
  uint64_t total = std::max<uint64_t>(U(O(reply, "backlog"), "posts"), 1);
  Clock::time_point next_line = start;
  for (;;) {
    const json& bl = O(reply, "backlog");
    const uint64_t left = U(bl, "posts");
    // While the daemon is still counting a large backlog, a lower bound.
    const char* at_least = bl.value("posts_exact", true) ? "" : "at least ";
    const bool done = PositionAtLeast(bl.value("watermark", json()), target);
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    const Clock::time_point now = Clock::now();
    samples.emplace_back(now, settled(reply));
    while (samples.size() > 2 && now - samples[1].first >= kDrainRateWindow) samples.pop_front();
    const double span = std::chrono::duration<double>(now - samples.front().first).count();
    const double rate =
        span > 0 ? static_cast<double>(samples.back().second - samples.front().second) / span : 0;
    total = std::max(total, left);
    std::string eta = "unknown";
    if (done) {
      eta = "0 s";
    } else if (rate > 0) {
      eta = Seconds(static_cast<double>(left) / rate);
    }
    const std::string broker = S(O(reply, "broker"), "state");
    if (tty) {
      constexpr int kWidth = 30;
      const double frac = done ? 1.0 : 1.0 - static_cast<double>(left) / static_cast<double>(total);
      const int filled = std::clamp(static_cast<int>(frac * kWidth), 0, kWidth);
      std::printf("\r[%s%s] %3d%%  %s%llu posts left  %.1f posts/s  %s to go  broker %s\x1b[K",
                  std::string(static_cast<size_t>(filled), '#').c_str(),
                  std::string(static_cast<size_t>(kWidth - filled), '.').c_str(),
                  static_cast<int>(frac * 100), at_least, static_cast<unsigned long long>(left), rate,
                  eta.c_str(), broker.c_str());
      std::fflush(stdout);
    } else if (done || Clock::now() >= next_line) {
      std::printf("drain: %s%llu posts left, %.1f posts/s, %s to go, broker %s\n", at_least,
                  static_cast<unsigned long long>(left), rate, eta.c_str(), broker.c_str());
      std::fflush(stdout);
      next_line = Clock::now() + kDrainLineInterval;
    }
    if (done) {
      if (tty) std::printf("\n");
      std::printf("drained: everything journaled when the drain started is confirmed (%.1f s)\n",
                  elapsed);
      return kExitOk;
    }
    if (o.timeout && Clock::now() - start >= *o.timeout) {
      if (tty) std::printf("\n");
      std::fprintf(stderr, "postspool: drain timed out after %s with %llu posts left (broker %s)\n",
                   Seconds(elapsed).c_str(), static_cast<unsigned long long>(left),
                   broker.c_str());
      return kExitFailed;
    }
    std::this_thread::sleep_for(kDrainPoll);
    if (!Ask(path, {{"request", "status"}}, &reply, &error)) {
      if (tty) std::printf("\n");
      return Unreachable(error);
    }
    if (!reply.value("ok", false)) return Refused(reply);
  }
}

}  // namespace

bool IsControlCommand(std::string_view name) {
  return name == "status" || name == "drain" || name == "metrics" || name == "reconnect" ||
         name == "log-level";
}

int RunControlCommand(std::string_view name, int argc, char** argv) {
  CommonOptions o;
  if (const int rc = ParseOptions(name, argc, argv, &o); rc >= 0) return rc;
  const size_t operands = name == "log-level" ? 1 : 0;
  if (o.operands.size() != operands) {
    return Usage(name, operands == 0 ? "takes no operands"
                                     : "takes one level: error, warning, info or debug");
  }
  try {
    if (name == "status") return RunStatus(o);
    if (name == "metrics") return RunMetrics(o);
    if (name == "drain") return RunDrain(o);
    if (name == "reconnect") {
      return RunSimple({{"request", "reconnect"}}, o, "reconnecting to the broker now");
    }
    if (name == "log-level") {
      const std::string& level = o.operands[0];
      if (level != "error" && level != "warning" && level != "info" && level != "debug") {
        return Usage(name, "takes error, warning, info or debug, not \"" + level + "\"");
      }
      return RunSimple({{"request", "log-level"}, {"level", level}}, o,
                       ("log level set to " + level).c_str());
    }
  } catch (const json::exception& e) {
    // A reply of an unexpected shape (a daemon of another version).
    std::fprintf(stderr, "postspool: unexpected reply from postspoold: %s\n", e.what());
    return kExitFailed;
  }
  return Usage(name, "unknown command");
}

}  // namespace postspool::cli
