#include "daemon.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <dirent.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstring>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <algorithm>
#include <vector>

#include <nlohmann/json.hpp>

#include "control.h"
#include "forwarder.h"
#include "ingest.h"
#include "ring_files.h"
#include "io_loop.h"
#include "journal.h"
#include "journal_port.h"
#include "log.h"
#include "log_limiter.h"
#include "metrics.h"
#include "notify.h"
#include "post.h"
#include "recent_ids.h"
#include "segment_format.h"
#include "socket_protocol.h"
#include "spool_dir.h"
#include "unique_fd.h"

namespace postspool::daemon {
namespace {

using namespace std::chrono_literals;

constexpr int kRoundTimeoutMs = 50;
constexpr auto kPeriodicWork = 100ms;
// How often systemd's STATUS= line (the backlog) is refreshed.
constexpr auto kNotifyStatusInterval = 2s;
// Status: the uids listed by disk use, and the quarantine entries counted.
constexpr size_t kStatusUidsMax = 20;
constexpr size_t kQuarantineCountMax = 100000;
// Rates are over the last minute, from one sample of the counters a second.
constexpr auto kRateWindow = 60s;

using nlohmann::json;

int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch()).count();
}

// Entries in `dir` (not . and ..), at most `max`; *exact false if more.
uint64_t CountEntries(const std::string& dir, size_t max, bool* exact) {
  *exact = true;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  uint64_t n = 0;
  while (const dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    if (n == max) {
      *exact = false;
      break;
    }
    ++n;
  }
  ::closedir(d);
  return n;
}

// Posts received and journaled, every transport: ring, socket, spool.
uint64_t JournaledTotal(const Metrics& m) {
  return m.ring_posts_journaled_total.load(std::memory_order_relaxed) +
         m.socket_posts_journaled_total.load(std::memory_order_relaxed) +
         m.spool_posts_journaled_total.load(std::memory_order_relaxed);
}

json Position(JournalPosition p) { return json::array({p.segment_seq, p.offset}); }

// The journal bytes from `from` (the watermark) to `to` (the committed
// end): the records of the backlog, not the segment files' sizes (a
// segment stays until every record in it is confirmed, so the files hold
// confirmed posts too). Segments in between count from their header to
// their size; a segment that is gone (set aside as damaged) counts 0.
uint64_t BacklogBytes(const std::string& journal_dir, JournalPosition from, JournalPosition to) {
  if (from >= to) return 0;
  if (from.segment_seq == to.segment_seq) return to.offset - from.offset;
  UniqueFd dir(::open(journal_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  std::vector<uint64_t> seqs;
  if (!dir.valid() || !ListJournalSegments(dir.get(), &seqs).ok()) return 0;
  uint64_t bytes = 0;
  for (const uint64_t seq : seqs) {
    if (seq < from.segment_seq || seq > to.segment_seq) continue;
    const uint64_t start = seq == from.segment_seq ? from.offset : segment::kHeaderBytes;
    uint64_t end = to.offset;
    if (seq != to.segment_seq) {
      struct stat st {};
      if (::fstatat(dir.get(), JournalSegmentName(seq).c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
      end = static_cast<uint64_t>(st.st_size);
    }
    if (end > start) bytes += end - start;
  }
  return bytes;
}

Status MakeDirs(const std::string& path, mode_t mode) {
  std::string partial;
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      partial = path.substr(0, i);
      const mode_t m = i == path.size() ? mode : 0755;
      if (::mkdir(partial.c_str(), m) != 0) {
        if (errno == EEXIST) continue;
        return Status::FromErrno(errno, "create directory " + partial);
      }
      // mkdir applies the umask and ignores the setgid bit.
      if (::chmod(partial.c_str(), m) != 0) return Status::FromErrno(errno, "chmod " + partial);
    }
  }
  return Status::Ok();
}

Status ListenOn(const Config& config, UniqueFd* out) {
  const std::string& path = config.socket_path;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    return Status(StatusCode::kInvalidArgument, "socket_path is too long: " + path);
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const auto* sa = reinterpret_cast<const sockaddr*>(&addr);
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Status::FromErrno(errno, "socket");
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return Status(StatusCode::kAlreadyExists,
                    "socket_path " + path + " exists and is not a socket; not touching it");
    }
    // Stale, from a daemon that died: this one holds the journal lock, so
    // no live daemon of this journal owns it. (A connect() probe is no
    // test: io_uring releases a killed daemon's socket asynchronously.)
    ::unlink(path.c_str());
  }
  if (const size_t slash = path.rfind('/'); slash != std::string::npos && slash > 0) {
    if (Status s = MakeDirs(path.substr(0, slash), 0755); !s.ok()) return s;
  }
  if (::bind(fd.get(), sa, sizeof addr) != 0) return Status::FromErrno(errno, "bind " + path);
  if (::chmod(path.c_str(), config.socket_mode) != 0) {
    return Status::FromErrno(errno, "chmod " + path);
  }
  if (::listen(fd.get(), 1024) != 0) return Status::FromErrno(errno, "listen on " + path);
  *out = std::move(fd);
  return Status::Ok();
}

class RealClock final : public ClockPort {
 public:
  Clock::time_point Now() override { return Clock::now(); }
  int64_t WallSeconds() override {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch()).count();
  }
};

uint64_t RandomU64() {
  uint64_t v = 0;
  while (::getrandom(&v, sizeof v, 0) != static_cast<ssize_t>(sizeof v)) {
  }
  return v;
}

// The wiring: real ports, the real loop, the forwarder thread, signals,
// metrics and the systemd watchdog around the Ingest.
class Daemon {
 public:
  explicit Daemon(const Config& config) : config_(config) {}

  Status Start();
  Status Run();

 private:
  void OnSignal();
  // Feeds the ids of the newest journal segments to the dedupe set, so that
  // a spool segment the previous daemon was adopting when it died is not
  // journaled twice. Reads at most kRememberSegments segments.
  void RememberJournaledIds();
  void Periodic(Clock::time_point now);
  void WriteMetrics();
  // Refreshes the gauges that are copies (journal bytes, backlog) and
  // renders the metrics. Any thread.
  std::string RenderMetrics();
  // The control socket's side (control thread).
  json HandleControl(const json& request, const ControlPeer& peer);
  json StatusReply() const;
  void SampleRates();
  void NotifyStatus();

  const Config& config_;
  Metrics metrics_;
  JournalUsage usage_;
  CommitChannel commits_;
  RealClock clock_;
  RealSpoolDir spool_dir_;
  UniqueFd journal_lock_;  // before the journal and forwarder: released last
  std::unique_ptr<JournalWriter> journal_;
  std::unique_ptr<WriterJournalPort> journal_port_;
  std::unique_ptr<Forwarder> forwarder_;
  std::unique_ptr<RealRings> rings_;
  std::unique_ptr<Ingest> ingest_;
  std::unique_ptr<IoLoop> loop_;
  UniqueFd listen_fd_;
  UniqueFd signal_fd_;
  std::unique_ptr<ControlServer> control_;
  std::string io_backend_name_;
  int64_t started_unix_ms_ = 0;
  std::atomic<bool> stopping_{false};

  // The ingest thread's usage figures for status, copied at its periodic
  // work when the lock is free (the ingest thread never waits for it).
  mutable std::mutex usage_mu_;
  Ingest::Usage usage_snapshot_;  // guarded by usage_mu_

  // Samples of the counters, one a second (control thread only).
  struct RateSample {
    Clock::time_point at;
    uint64_t received, journaled, published, confirmed;
  };
  std::deque<RateSample> rate_samples_;
  mutable std::mutex rates_mu_;  // rate_samples_ is read by the handler on the same thread,
                                 // but also by nothing else; the lock keeps it simple to extend
  Clock::time_point last_notify_{};
  LogLimiter denied_limiter_;  // the control thread's

  Clock::time_point last_periodic_{};
  Clock::time_point last_metrics_{};
  Clock::time_point last_watchdog_{};
  uint64_t watchdog_usec_ = 0;
  bool metrics_warned_ = false;
};

Status Daemon::Start() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);

  if (Status s = MakeDirs(config_.journal_dir, 0700); !s.ok()) return s;
  // One daemon per journal, for the daemon's whole life (released by the
  // kernel however it dies, so a restart never waits).
  if (Status s = LockJournalDir(config_.journal_dir, &journal_lock_); !s.ok()) return s;
  if (Status s = MakeDirs(config_.spool_dir, 03733); !s.ok()) return s;
  if (Status s = MakeDirs(config_.quarantine_dir, 0700); !s.ok()) return s;

  JournalWriter::Options jo;
  jo.dir = config_.journal_dir;
  jo.segment_bytes_max = config_.journal_segment_bytes_max;
  jo.sync = config_.durability == Durability::kSynced;
  if (Status s = JournalWriter::Open(jo, &usage_, &journal_); !s.ok()) {
    return Status(s.code(), "journal: " + s.message());
  }
  commits_.Publish(journal_->end());
  if (Status s = spool_dir_.Open(config_.spool_dir, config_.quarantine_dir); !s.ok()) {
    return Status(s.code(), "spool: " + s.message());
  }
  journal_port_ = std::make_unique<WriterJournalPort>(
      journal_.get(), &usage_, [this](JournalPosition end) { commits_.Publish(end); });

  RecentIds::Key key;
  for (size_t i = 0; i < key.size(); i += sizeof(uint64_t)) {
    const uint64_t v = RandomU64();
    std::memcpy(key.data() + i, &v, std::min(sizeof v, key.size() - i));
  }
  rings_ = std::make_unique<RealRings>(config_, &metrics_);
  if (!config_.ring_dir.empty()) {
    if (Status s = MakeDirs(config_.ring_dir, 0700); !s.ok()) return s;
    if (Status s = rings_->Open(); !s.ok()) return s;
  }
  ingest_ = std::make_unique<Ingest>(
      config_, &metrics_,
      Ingest::Ports{&clock_, journal_port_.get(), &spool_dir_,
                    config_.ring_dir.empty() ? nullptr : rings_.get()},
      host, key, RandomU64());
  RememberJournaledIds();

  // Signals arrive through a signalfd; block them before the forwarder
  // thread starts, so that it inherits the mask.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  ::pthread_sigmask(SIG_BLOCK, &mask, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  signal_fd_.reset(::signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!signal_fd_.valid()) return Status::FromErrno(errno, "signalfd");

  forwarder_ = std::make_unique<Forwarder>(config_, journal_->dirfd(), &commits_, &usage_, &metrics_);
  if (Status s = forwarder_->Start(); !s.ok()) return Status(s.code(), "forwarder: " + s.message());
  journal_port_->set_watermark(
      [forwarder = forwarder_.get()] { return forwarder->watermark(); });

  IoLoopOptions lo;
  lo.packet_bytes_max = wire::kRequestBytesMax;
  lo.connections_max = config_.connections_max;
  std::string why_not_uring;
  if (config_.io_backend != IoBackend::kEpoll) {
    Status s = NewUringLoop(lo, ingest_.get(), &loop_);
    if (!s.ok()) {
      if (config_.io_backend == IoBackend::kIoUring) {
        return Status(s.code(), "io_backend = io_uring, but " + s.message());
      }
      why_not_uring = s.message();
    }
  }
  if (!loop_) {
    if (Status s = NewEpollLoop(lo, ingest_.get(), &loop_); !s.ok()) return s;
  }
  ingest_->Attach(loop_.get());
  io_backend_name_ = why_not_uring.empty() && config_.io_backend != IoBackend::kEpoll ? "io_uring"
                                                                                     : "epoll";
  if (config_.io_backend == IoBackend::kEpoll) {
    PS_LOG_INFO("ingest backend: epoll (io_backend = epoll in the configuration)");
  } else if (!why_not_uring.empty()) {
    PS_LOG_WARNING("ingest backend: epoll, because io_uring is not available: %s",
                   why_not_uring.c_str());
  } else {
    PS_LOG_INFO("ingest backend: io_uring");
  }

  if (Status s = ListenOn(config_, &listen_fd_); !s.ok()) return s;
  if (Status s = loop_->Listen(listen_fd_.get()); !s.ok()) return s;
  if (Status s = ingest_->WatchReadable(signal_fd_.get(), [this] { OnSignal(); }); !s.ok()) return s;
  if (Status s = ingest_->WatchReadable(spool_dir_.inotify_fd(),
                                        [this] { spool_dir_.DrainNotifications(); });
      !s.ok()) {
    return s;
  }
  if (!config_.ring_dir.empty()) {
    if (Status s = ingest_->WatchReadable(rings_->wake_fd(), [this] {
          rings_->DrainWakeFd();
          metrics_.ring_wakeups_total.fetch_add(1, std::memory_order_relaxed);
        });
        !s.ok()) {
      return s;
    }
  }
  ingest_->set_round_hook([this](Clock::time_point now) { Periodic(now); });
  started_unix_ms_ = UnixMs();
  if (!config_.control_socket_path.empty()) {
    const std::string& cpath = config_.control_socket_path;
    if (const size_t slash = cpath.rfind('/'); slash != std::string::npos && slash > 0) {
      if (Status s = MakeDirs(cpath.substr(0, slash), 0755); !s.ok()) return s;
    }
    ControlServer::Options co;
    co.path = config_.control_socket_path;
    co.connections_max = config_.control_connections_max;
    co.client_timeout_ms = config_.control_timeout_ms;
    control_ = std::make_unique<ControlServer>(&metrics_);
    if (Status s = control_->Start(
            co, [this](const json& r, const ControlPeer& p) { return HandleControl(r, p); },
            [this] { SampleRates(); });
        !s.ok()) {
      return Status(s.code(), "control socket: " + s.message());
    }
  }
  watchdog_usec_ = WatchdogUsec();
  PS_LOG_INFO("listening on %s (mode %o); durability %s; journal %s; spool %s; brokers: %zu",
              config_.socket_path.c_str(), config_.socket_mode,
              DurabilityName(config_.durability), config_.journal_dir.c_str(),
              config_.spool_dir.c_str(), config_.post_broker.size());
  NotifySystemd("READY=1\nSTATUS=accepting posts");
  return Status::Ok();
}

Status Daemon::Run() {
  while (!ingest_->done()) {
    if (Status s = loop_->RunOnce(ingest_->wants_poll() ? 0 : kRoundTimeoutMs); !s.ok()) return s;
  }
  NotifySystemd("STOPPING=1\nSTATUS=publishing what is journaled");
  const bool drained = forwarder_->StopAndDrain(std::chrono::milliseconds(config_.shutdown_drain_ms));
  if (control_) control_->Stop();
  WriteMetrics();
  const uint64_t dropped = metrics_.unroutable_dropped_total.load();
  if (drained) {
    PS_LOG_INFO("stopped: every journaled post was confirmed by the broker%s",
                dropped > 0 ? " or dropped as unroutable" : "");
  } else {
    bool exact = true;
    const uint64_t left = forwarder_->unconfirmed_at_stop(&exact);
    PS_LOG_WARNING("stopped before the broker confirmed every journaled post: %s%" PRIu64
                   " stay in %s and are published at the next start",
                   exact ? "" : "at least ", left, config_.journal_dir.c_str());
  }
  if (dropped > 0) {
    PS_LOG_WARNING("%" PRIu64 " posts were dropped as unroutable since start (no queue bound "
                   "for their routing keys; unroutable_policy = drop)",
                   dropped);
  }
  return Status::Ok();
}

void Daemon::RememberJournaledIds() {
  constexpr size_t kRememberSegments = 2;
  std::vector<uint64_t> seqs;
  if (config_.dedupe_window_posts == 0 || !ListJournalSegments(journal_->dirfd(), &seqs).ok()) {
    return;
  }
  std::erase(seqs, journal_->end().segment_seq);  // the new, empty one
  const size_t first = seqs.size() > kRememberSegments ? seqs.size() - kRememberSegments : 0;
  for (size_t i = first; i < seqs.size(); ++i) {
    UniqueFd fd(::openat(journal_->dirfd(), JournalSegmentName(seqs[i]).c_str(), O_RDONLY | O_CLOEXEC));
    std::unique_ptr<segment::FileSource> source;
    std::unique_ptr<segment::SegmentReader> reader;
    segment::ReaderOptions options;
    options.verify_payload = VerifyPostPayload;
    // The last process may have died before syncing its last write. An id
    // remembered from it makes adoption delete the spooled copy of that
    // post, so the journal copy must first be as durable as the spooled one.
    if (fd.valid() && ::fdatasync(fd.get()) != 0) {
      PS_LOG_WARNING("journal: %s: fdatasync failed at start (%s): the ids of its posts are not "
                     "remembered, so a ring post among them that is still in its lane is "
                     "journaled (and published) again rather than acknowledged on a copy that "
                     "may not be on disk",
                     JournalSegmentName(seqs[i]).c_str(), std::strerror(errno));
      continue;
    }
    if (!fd.valid() || !segment::FileSource::Open(fd.get(), &source).ok() ||
        !segment::SegmentReader::Open(source.get(), options, &reader).ok()) {
      continue;  // the forwarder reports damaged segments
    }
    segment::Record rec;
    while (reader->Next(&rec) == segment::SegmentReader::Result::kRecord) {
      const fb::PostId* id = PostFromPayload(rec.payload).id();
      ingest_->RememberJournaled(PostId{id->hi(), id->lo()});
    }
  }
}

void Daemon::OnSignal() {
  signalfd_siginfo si;
  while (::read(signal_fd_.get(), &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
    if (si.ssi_signo == SIGHUP) {
      PS_LOG_INFO("SIGHUP: logs go to stderr (the journal), nothing to reopen");
      continue;
    }
    if (!ingest_->stopping()) {
      PS_LOG_INFO("%s: no longer accepting; journaling and acknowledging what arrived, then "
                  "publishing what is journaled for up to %u ms",
                  si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT", config_.shutdown_drain_ms);
      ingest_->Stop();
      stopping_.store(true);
      ::unlink(config_.socket_path.c_str());
    }
  }
}

void Daemon::Periodic(Clock::time_point now) {
  if (now - last_periodic_ < kPeriodicWork) return;
  last_periodic_ = now;
  if (!config_.metrics_file.empty() &&
      now - last_metrics_ >= std::chrono::milliseconds(config_.metrics_interval_ms)) {
    last_metrics_ = now;
    WriteMetrics();
  }
  if (watchdog_usec_ != 0 && now - last_watchdog_ >= std::chrono::microseconds(watchdog_usec_ / 2)) {
    last_watchdog_ = now;
    NotifySystemd("WATCHDOG=1");
  }
  {
    // Never waits: if the control thread holds the lock, next time.
    std::unique_lock lock(usage_mu_, std::try_to_lock);
    if (lock.owns_lock()) {
      ingest_->GetUsage(kStatusUidsMax, &usage_snapshot_);
      metrics_.spool_segments_waiting.store(usage_snapshot_.spool_segments_waiting,
                                            std::memory_order_relaxed);
    }
  }
  if (now - last_notify_ >= kNotifyStatusInterval) {
    last_notify_ = now;
    NotifyStatus();
  }
}

void Daemon::NotifyStatus() {
  if (ingest_->stopping()) return;
  Forwarder::Snapshot f;
  if (!forwarder_->TrySnapshot(&f)) return;  // the next time
  char line[256];
  std::snprintf(line, sizeof line, "STATUS=accepting posts; backlog %s%" PRIu64
                " posts, %" PRIu64 " journal bytes; broker %s",
                f.backlog_posts_exact ? "" : ">=", f.backlog_posts,
                usage_.bytes.load(std::memory_order_relaxed), f.state.c_str());
  NotifySystemd(line);
}

std::string Daemon::RenderMetrics() {
  metrics_.journal_bytes.store(usage_.bytes.load(std::memory_order_relaxed), std::memory_order_relaxed);
  Forwarder::Snapshot f;
  // Called on the ingest thread too, which never waits for a lock: if the
  // forwarder holds it, the backlog gauges keep their last values.
  if (!forwarder_->TrySnapshot(&f)) return metrics_.RenderPrometheus();
  metrics_.backlog_posts.store(f.backlog_posts, std::memory_order_relaxed);
  uint64_t age_s = 0;
  if (f.oldest_unconfirmed_pub_unix_ns > 0) {
    const int64_t age_ms = UnixMs() - f.oldest_unconfirmed_pub_unix_ns / 1000000;
    age_s = age_ms > 0 ? static_cast<uint64_t>(age_ms / 1000) : 0;
  }
  metrics_.backlog_oldest_age_seconds.store(age_s, std::memory_order_relaxed);
  return metrics_.RenderPrometheus();
}

void Daemon::SampleRates() {
  RateSample s;
  s.at = Clock::now();
  s.received = JournaledTotal(metrics_);
  s.journaled = s.received;
  s.published = metrics_.published_total.load();
  s.confirmed = metrics_.confirmed_total.load();
  std::lock_guard lock(rates_mu_);
  rate_samples_.push_back(s);
  while (rate_samples_.size() > 2 && s.at - rate_samples_.front().at > kRateWindow) {
    rate_samples_.pop_front();
  }
}

json Daemon::HandleControl(const json& request, const ControlPeer& peer) {
  const std::string& what = request["request"].get_ref<const std::string&>();
  if (what == "status") return StatusReply();
  if (what == "metrics") return json{{"ok", true}, {"text", RenderMetrics()}};
  const bool changes = what == "reconnect" || what == "log-level";
  if (!changes) {
    metrics_.control_requests_malformed_total.fetch_add(1, std::memory_order_relaxed);
    return json{{"ok", false},
                {"error", "unknown request \"" + what +
                              "\"; known: status, metrics, reconnect, log-level"}};
  }
  if (!peer.may_change) {
    metrics_.control_requests_denied_total.fetch_add(1, std::memory_order_relaxed);
    uint64_t unlogged = 0;
    if (denied_limiter_.Allow(LogLimiter::Clock::now(), &unlogged)) {
      PS_LOG_WARNING("control socket: refused \"%s\" from uid %u (pid %d): only root and the "
                     "daemon's group may change its state (%" PRIu64 " more refused since the "
                     "last such line)",
                     what.c_str(), static_cast<unsigned>(peer.uid), static_cast<int>(peer.pid),
                     unlogged);
    }
    return json{{"ok", false}, {"denied", true},
                {"error", "permission denied: \"" + what +
                              "\" changes the daemon's state; only root and members of the "
                              "daemon's group may"}};
  }
  if (what == "reconnect") {
    PS_LOG_INFO("control socket: reconnect requested by uid %u (pid %d)",
                static_cast<unsigned>(peer.uid), static_cast<int>(peer.pid));
    forwarder_->RequestReconnect();
    return json{{"ok", true}};
  }
  const auto level = request.find("level");
  LogLevel l;
  if (level == request.end() || !level->is_string() ||
      !ParseLogLevel(level->get_ref<const std::string&>().c_str(), &l)) {
    metrics_.control_requests_malformed_total.fetch_add(1, std::memory_order_relaxed);
    return json{{"ok", false}, {"error", "log-level needs \"level\": error, warning, info or debug"}};
  }
  SetLogLevel(l);
  PS_LOG_INFO("control socket: log level set to %s by uid %u (pid %d)",
              level->get_ref<const std::string&>().c_str(), static_cast<unsigned>(peer.uid),
              static_cast<int>(peer.pid));
  return json{{"ok", true}, {"level", *level}};
}

json Daemon::StatusReply() const {
  const Forwarder::Snapshot f = forwarder_->snapshot();
  const Metrics& m = metrics_;
  const auto v = [](const Metrics::Counter& c) { return c.load(std::memory_order_relaxed); };
  const bool stopping = stopping_.load();
  const int64_t now_ms = UnixMs();

  std::vector<std::string> unhealthy;
  if (stopping) unhealthy.push_back("the daemon is stopping");
  if (f.state != "connected") unhealthy.push_back("the broker connection is " + f.state);
  // Posts in flight or waiting to be published again, and no confirm for a
  // while: a broker that froze or refuses everything, or a network that
  // black-holes, before the heartbeat notices.
  if (f.confirm_wait_ms >= static_cast<int64_t>(config_.health_confirm_stall_ms)) {
    unhealthy.push_back("the broker confirmed nothing for " +
                        std::to_string(f.confirm_wait_ms / 1000) + " s with " +
                        std::to_string(f.in_flight) + " posts in flight and " +
                        std::to_string(f.waiting) + " waiting to be published again" +
                        (f.path_fault.empty() ? "" : " (path " + f.path_fault + ")"));
  }

  json broker = {{"url", f.broker}, {"state", f.state},
                 {"connect_failures_in_row", f.connect_failures_in_row},
                 {"reconnect_delay_ms", f.reconnect_delay_ms},
                 {"path_fault", f.path_fault},
                 {"path_changes", f.path_changes},
                 {"standby", f.standby},
                 {"standby_ready", f.standby_ready}};
  if (!f.last_path_change.empty()) broker["last_path_change"] = f.last_path_change;
  if (f.state == "waiting") broker["next_attempt_in_ms"] = f.next_attempt_in_ms;
  if (!f.last_error.empty()) {
    broker["last_error"] = f.last_error;
    broker["last_error_unix_ms"] = f.last_error_unix_ms;
    broker["last_error_age_s"] = static_cast<double>(now_ms - f.last_error_unix_ms) / 1000.0;
  }

  // No record between the watermark and the committed end: the backlog is
  // exactly empty, also before the forwarder's counter first caught up (a
  // fresh daemon, whose watermark is before its first segment).
  const JournalPosition watermark = forwarder_->watermark();
  const JournalPosition committed = commits_.committed();
  const uint64_t backlog_bytes = BacklogBytes(config_.journal_dir, watermark, committed);
  const bool empty = backlog_bytes == 0;
  json backlog = {{"posts", empty ? 0 : f.backlog_posts},
                  {"posts_exact", empty || f.backlog_posts_exact},
                  {"bytes", backlog_bytes},
                  {"journal_bytes", usage_.bytes.load(std::memory_order_relaxed)},
                  {"in_flight", f.in_flight},
                  {"waiting", f.waiting},
                  {"confirm_wait_s", static_cast<double>(f.confirm_wait_ms) / 1000.0},
                  {"watermark", Position(watermark)},
                  {"committed", Position(committed)}};
  if (f.oldest_unconfirmed_pub_unix_ns > 0) {
    const int64_t age_ms = now_ms - f.oldest_unconfirmed_pub_unix_ns / 1000000;
    backlog["oldest_unconfirmed_age_s"] = static_cast<double>(std::max<int64_t>(age_ms, 0)) / 1000.0;
  } else {
    backlog["oldest_unconfirmed_age_s"] = nullptr;
  }

  bool quarantine_exact = true;
  const uint64_t quarantined = CountEntries(config_.quarantine_dir, kQuarantineCountMax, &quarantine_exact);
  json uids = json::array();
  size_t uids_total = 0;
  size_t segments_waiting = 0;
  {
    std::lock_guard lock(usage_mu_);
    for (const auto& [uid, bytes] : usage_snapshot_.uids) uids.push_back({{"uid", uid}, {"bytes", bytes}});
    uids_total = usage_snapshot_.uids_total;
    segments_waiting = usage_snapshot_.spool_segments_waiting;
  }
  const uint64_t disk = usage_.bytes.load(std::memory_order_relaxed) + v(m.spool_bytes) +
                        v(m.quarantine_bytes);

  json rates = json::object();
  {
    std::lock_guard lock(rates_mu_);
    if (rate_samples_.size() >= 2) {
      const RateSample& a = rate_samples_.front();
      const RateSample& b = rate_samples_.back();
      const double secs = std::chrono::duration<double>(b.at - a.at).count();
      rates["window_s"] = secs;
      rates["received_per_s"] = static_cast<double>(b.received - a.received) / secs;
      rates["journaled_per_s"] = static_cast<double>(b.journaled - a.journaled) / secs;
      rates["published_per_s"] = static_cast<double>(b.published - a.published) / secs;
      rates["confirmed_per_s"] = static_cast<double>(b.confirmed - a.confirmed) / secs;
    }
  }

  json posts = {
      // Accepted and journaled, per transport; a spooled copy of a post that
      // came through the socket too (its ack was late) is counted once, under
      // the socket, and under spool_duplicates_dropped.
      {"received", {{"ring", v(m.ring_posts_journaled_total)},
                    {"socket", v(m.socket_posts_journaled_total)},
                    {"spool", v(m.spool_posts_journaled_total)}}},
      {"spool_duplicates_dropped", v(m.spool_posts_deduplicated_total)},
      // Posts that processes could not make at all (never received), as
      // their clients reported them (shim_posts_dropped_total).
      {"shim_posts_dropped", v(m.shim_posts_dropped_total)},
      {"journaled", JournaledTotal(m)},
      {"published", v(m.published_total)},
      {"confirmed", v(m.confirmed_total)},
      {"nacked", v(m.nacked_total)},
      {"unroutable", v(m.unroutable_total)},
      {"republished", v(m.republished_total)},
      {"unroutable_dropped", v(m.unroutable_dropped_total)},
      {"skipped_damaged", {{"posts_unencodable", v(m.encode_errors_total)},
                           {"journal_bytes", v(m.journal_bytes_skipped_total)},
                           {"journal_segments", v(m.journal_segments_damaged_total)},
                           {"journal_records_lost", v(m.journal_records_lost_total)},
                           {"spool_bytes", v(m.spool_bytes_damaged_total)},
                           {"spool_records_lost", v(m.spool_records_lost_total)},
                           {"spool_posts_invalid", v(m.spool_posts_invalid_total)}}},
      {"refused", {{"full", v(m.requests_refused_full_total)},
                   {"busy", v(m.requests_refused_busy_total)},
                   {"malformed", v(m.requests_malformed_total)},
                   {"invalid", v(m.requests_invalid_total)}}}};
  if (f.last_unroutable_drop_unix_ms > 0) {
    posts["last_unroutable_drop_unix_ms"] = f.last_unroutable_drop_unix_ms;
  }

  return json{
      {"ok", true},
      {"healthy", unhealthy.empty()},
      {"unhealthy_reasons", unhealthy},
      {"daemon", {{"state", stopping ? "stopping" : "running"},
                  {"pid", ::getpid()},
                  {"io_backend", io_backend_name_},
                  {"durability", DurabilityName(config_.durability)},
                  {"uptime_s", static_cast<double>(now_ms - started_unix_ms_) / 1000.0},
                  {"log_level", LogEnabled(LogLevel::kDebug) ? "debug"
                                : LogEnabled(LogLevel::kInfo) ? "info"
                                : LogEnabled(LogLevel::kWarning) ? "warning" : "error"}}},
      {"broker", broker},
      {"posts", posts},
      {"backlog", backlog},
      {"spool", {{"segments_waiting", segments_waiting},
                 {"bytes", v(m.spool_bytes)},
                 {"files_quarantined", quarantined},
                 {"files_quarantined_exact", quarantine_exact},
                 {"quarantine_bytes", v(m.quarantine_bytes)}}},
      {"disk", {{"bytes", disk},
                {"bytes_max", config_.disk_bytes_max},
                {"per_uid_bytes_max", config_.DiskBytesPerUidMax()},
                {"uids", uids},
                {"uids_total", uids_total}}},
      {"rates", rates}};
}

void Daemon::WriteMetrics() {
  if (config_.metrics_file.empty()) return;
  const std::string text = RenderMetrics();
  const std::string tmp = config_.metrics_file + ".tmp";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  // Readable by a metrics collector running as another user, whatever the
  // service's umask.
  if (fd.valid()) ::fchmod(fd.get(), 0644);
  if (!fd.valid() || ::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) ||
      ::rename(tmp.c_str(), config_.metrics_file.c_str()) != 0) {
    if (!metrics_warned_) {
      metrics_warned_ = true;
      PS_LOG_WARNING("cannot write metrics to %s: %s", config_.metrics_file.c_str(), std::strerror(errno));
    }
  }
}

}  // namespace

Status RunDaemon(const Config& config) {
  Daemon d(config);
  if (Status s = d.Start(); !s.ok()) return s;
  return d.Run();
}

}  // namespace postspool::daemon
