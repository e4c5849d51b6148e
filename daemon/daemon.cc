#include "daemon.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <unordered_map>
#include <algorithm>
#include <vector>

#include "forwarder.h"
#include "ingest.h"
#include "io_loop.h"
#include "journal.h"
#include "log.h"
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

// The JournalPort on the real journal: the JournalWriter, the usage the
// forwarder shares, the commit channel to it, and its watermark.
class RealJournal final : public JournalPort {
 public:
  RealJournal(JournalWriter* writer, JournalUsage* usage, CommitChannel* commits)
      : writer_(writer), usage_(usage), commits_(commits) {}
  void set_forwarder(const Forwarder* f) { forwarder_ = f; }

  bool NeedsSegment(uint64_t bytes) const override { return writer_->NeedsSegment(bytes); }
  std::function<int64_t()> NewSegmentTask() override {
    // The task runs on the loop's worker thread: it gets copies, and leaves
    // its result where SegmentDone() (on the loop's thread, after the
    // loop's completion handoff) takes it.
    auto made = std::make_shared<NewJournalSegment>();
    made_ = made;
    return [made, dirfd = writer_->dirfd(), seq = writer_->next_seq(), sync = writer_->sync()] {
      *made = CreateJournalSegment(dirfd, seq, sync);
      return made->status.ok() ? int64_t{0} : int64_t{-1};
    };
  }
  Status SegmentDone() override {
    std::shared_ptr<NewJournalSegment> made = std::move(made_);
    return writer_->Install(std::move(*made));
  }
  Status Reserve(uint64_t bytes, Slot* slot) override {
    JournalWriter::Slot s;
    if (Status st = writer_->Reserve(bytes, &s); !st.ok()) return st;
    slot->fd = s.fd;
    slot->position = s.position;
    return Status::Ok();
  }
  JournalPosition Committed() override { return writer_->Committed(); }
  void Abandon() override { writer_->Abandon(); }
  JournalPosition end() const override { return writer_->end(); }
  uint64_t bytes() const override { return usage_->bytes.load(std::memory_order_relaxed); }
  JournalPosition watermark() const override {
    return forwarder_ != nullptr ? forwarder_->watermark() : JournalPosition{};
  }
  void Publish(JournalPosition committed) override { commits_->Publish(committed); }

 private:
  JournalWriter* writer_;
  JournalUsage* usage_;
  CommitChannel* commits_;
  const Forwarder* forwarder_ = nullptr;
  std::shared_ptr<NewJournalSegment> made_;  // of the segment task in flight
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

  const Config& config_;
  Metrics metrics_;
  JournalUsage usage_;
  CommitChannel commits_;
  RealClock clock_;
  RealSpoolDir spool_dir_;
  UniqueFd journal_lock_;  // before the journal and forwarder: released last
  std::unique_ptr<JournalWriter> journal_;
  std::unique_ptr<RealJournal> journal_port_;
  std::unique_ptr<Forwarder> forwarder_;
  std::unique_ptr<Ingest> ingest_;
  std::unique_ptr<IoLoop> loop_;
  UniqueFd listen_fd_;
  UniqueFd signal_fd_;

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
  journal_port_ = std::make_unique<RealJournal>(journal_.get(), &usage_, &commits_);

  RecentIds::Key key;
  for (size_t i = 0; i < key.size(); i += sizeof(uint64_t)) {
    const uint64_t v = RandomU64();
    std::memcpy(key.data() + i, &v, std::min(sizeof v, key.size() - i));
  }
  ingest_ = std::make_unique<Ingest>(
      config_, &metrics_, Ingest::Ports{&clock_, journal_port_.get(), &spool_dir_}, host, key,
      RandomU64());
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
  journal_port_->set_forwarder(forwarder_.get());

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
  ingest_->set_round_hook([this](Clock::time_point now) { Periodic(now); });
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
    if (Status s = loop_->RunOnce(kRoundTimeoutMs); !s.ok()) return s;
  }
  NotifySystemd("STOPPING=1\nSTATUS=publishing what is journaled");
  const bool drained = forwarder_->StopAndDrain(std::chrono::milliseconds(config_.shutdown_drain_ms));
  WriteMetrics();
  if (drained) {
    PS_LOG_INFO("stopped: every journaled post was confirmed by the broker");
  } else {
    PS_LOG_WARNING("stopped before the broker confirmed every journaled post; they stay in "
                   "%s and are published at the next start", config_.journal_dir.c_str());
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
    if (!fd.valid() || ::fdatasync(fd.get()) != 0 ||
        !segment::FileSource::Open(fd.get(), &source).ok() ||
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
}

void Daemon::WriteMetrics() {
  if (config_.metrics_file.empty()) return;
  metrics_.journal_bytes.store(usage_.bytes.load(std::memory_order_relaxed), std::memory_order_relaxed);
  const std::string text = metrics_.RenderPrometheus();
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
