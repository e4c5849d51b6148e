#include "daemon.h"

#include <fcntl.h>
#include <signal.h>
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
#include "io_loop.h"
#include "journal.h"
#include "log.h"
#include "metrics.h"
#include "notify.h"
#include "post.h"
#include "recent_ids.h"
#include "segment_format.h"
#include "socket_protocol.h"
#include "spool_adopter.h"
#include "unique_fd.h"

namespace postspool::daemon {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr uint64_t kCookieWrite = 1;
constexpr uint64_t kCookieSync = 2;
constexpr int kRoundTimeoutMs = 50;
constexpr auto kPeriodicWork = 100ms;
// Warnings about bad input are rate-limited: the first few, then one in many.
constexpr uint64_t kWarnFirst = 20;
constexpr uint64_t kWarnEvery = 1000;

bool ShouldWarn(uint64_t count) { return count <= kWarnFirst || count % kWarnEvery == 0; }

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
    UniqueFd probe(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    if (::connect(probe.get(), sa, sizeof addr) == 0) {
      return Status(StatusCode::kAlreadyExists,
                    "another postspoold is already listening on " + path);
    }
    ::unlink(path.c_str());  // stale, from a daemon that died
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

struct Conn {
  uint32_t gen = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  pid_t pid = 0;
};

struct PendingAck {
  int fd;
  uint32_t gen;
  uint64_t request_id;
  uint32_t records;
};

// One group-commit write: the framed records and whom to acknowledge.
struct Batch {
  std::vector<std::byte> bytes;
  std::vector<PendingAck> acks;
  uint32_t records = 0;
  uint32_t adopted = 0;  // of the records, how many came from the spool
  std::vector<PostId> ids;  // of the records, for RecentIds
  void Clear() {
    bytes.clear();
    acks.clear();
    records = 0;
    adopted = 0;
    ids.clear();
  }
};

class Daemon final : public IoCallbacks {
 public:
  explicit Daemon(const Config& config)
      : config_(config), adopter_(config, &metrics_), recent_ids_(config.dedupe_window_posts) {}

  Status Start();
  Status Run();

  // IoCallbacks.
  void OnAccept(int fd) override;
  void OnPacket(int fd, std::span<const std::byte> packet, bool truncated) override;
  void OnConnectionClosed(int fd, int error) override;
  void OnReadable(int fd) override;
  void OnIoDone(uint64_t cookie, int64_t result) override;
  void OnRoundEnd() override;

 private:
  void HandleRequest(int fd, const Conn& conn, std::span<const std::byte> packet, bool truncated);
  void Reject(int fd, const Conn& conn, const wire::RequestHeader* header, wire::AckStatus status,
              const char* why);
  void SendAck(int fd, uint32_t gen, const wire::Ack& ack);
  // Stamps the trusted origin (and the default base URL) into a verified
  // post and appends it, framed, to `batch`. False if the post is not valid.
  bool Stamp(std::span<const std::byte> payload, uid_t uid, gid_t gid, std::optional<pid_t> pid,
             Batch* batch);
  void FeedAdoption();
  void StartWrite();
  void BatchCommitted();
  void BatchFailed(const std::string& why);
  void OnSignal();
  // Fills RecentIds from the newest journal segments, so that a spool
  // segment the previous daemon was adopting when it died is not journaled
  // twice. Reads at most kRememberSegments segments.
  void RememberJournaledIds();
  void Periodic(Clock::time_point now);
  void WriteMetrics();
  uint64_t DiskBytes() const;

  const Config& config_;
  Metrics metrics_;
  JournalUsage usage_;
  CommitChannel commits_;
  std::unique_ptr<JournalWriter> journal_;
  std::unique_ptr<Forwarder> forwarder_;
  SpoolAdopter adopter_;
  RecentIds recent_ids_;  // of socket posts journaled; see recent_ids.h
  std::unique_ptr<IoLoop> loop_;
  UniqueFd listen_fd_;
  UniqueFd signal_fd_;
  std::unordered_map<int, Conn> conns_;
  uint32_t next_gen_ = 0;
  std::string hostname_;
  flatbuffers::FlatBufferBuilder builder_;

  Batch filling_;
  Batch writing_;
  bool write_in_flight_ = false;
  JournalWriter::Slot slot_;
  uint64_t adopted_uncommitted_ = 0;

  bool stopping_ = false;
  bool stop_ = false;
  Clock::time_point last_periodic_{};
  Clock::time_point last_metrics_{};
  Clock::time_point last_watchdog_{};
  uint64_t watchdog_usec_ = 0;
};

Status Daemon::Start() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  hostname_ = host;

  if (Status s = MakeDirs(config_.journal_dir, 0700); !s.ok()) return s;
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
  RememberJournaledIds();
  if (Status s = adopter_.Open(); !s.ok()) return Status(s.code(), "spool: " + s.message());

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

  IoLoopOptions lo;
  lo.packet_bytes_max = wire::kRequestBytesMax;
  lo.connections_max = config_.connections_max;
  std::string why_not_uring;
  if (config_.io_backend != IoBackend::kEpoll) {
    Status s = NewUringLoop(lo, this, &loop_);
    if (!s.ok()) {
      if (config_.io_backend == IoBackend::kIoUring) {
        return Status(s.code(), "io_backend = io_uring, but " + s.message());
      }
      why_not_uring = s.message();
    }
  }
  if (!loop_) {
    if (Status s = NewEpollLoop(lo, this, &loop_); !s.ok()) return s;
  }
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
  if (Status s = loop_->Watch(signal_fd_.get()); !s.ok()) return s;
  if (Status s = loop_->Watch(adopter_.inotify_fd()); !s.ok()) return s;
  watchdog_usec_ = WatchdogUsec();
  PS_LOG_INFO("listening on %s (mode %o); durability %s; journal %s; spool %s; brokers: %zu",
              config_.socket_path.c_str(), config_.socket_mode,
              DurabilityName(config_.durability), config_.journal_dir.c_str(),
              config_.spool_dir.c_str(), config_.post_broker.size());
  NotifySystemd("READY=1\nSTATUS=accepting posts");
  return Status::Ok();
}

Status Daemon::Run() {
  while (!stop_) {
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
  ::unlink(config_.socket_path.c_str());
  return Status::Ok();
}

void Daemon::OnAccept(int fd) {
  if (stopping_ || conns_.size() >= config_.connections_max) {
    metrics_.connections_refused_total.fetch_add(1, std::memory_order_relaxed);
    ::close(fd);  // the client falls back to the spool
    return;
  }
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    ::close(fd);
    return;
  }
  Conn c;
  c.gen = ++next_gen_;
  c.uid = cred.uid;
  c.gid = cred.gid;
  c.pid = cred.pid;
  if (!loop_->AddConnection(fd).ok()) {
    ::close(fd);
    return;
  }
  conns_[fd] = c;
  metrics_.connections_accepted_total.fetch_add(1, std::memory_order_relaxed);
}

void Daemon::OnConnectionClosed(int fd, int error) {
  if (error != 0) PS_LOG_DEBUG("connection %d closed: %s", fd, std::strerror(error));
  conns_.erase(fd);
  ::close(fd);
}

void Daemon::OnPacket(int fd, std::span<const std::byte> packet, bool truncated) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  HandleRequest(fd, it->second, packet, truncated);
}

void Daemon::Reject(int fd, const Conn& conn, const wire::RequestHeader* header,
                    wire::AckStatus status, const char* why) {
  if (status == wire::AckStatus::kMalformed) {
    const uint64_t n = metrics_.requests_malformed_total.fetch_add(1, std::memory_order_relaxed) + 1;
    if (ShouldWarn(n)) {
      PS_LOG_WARNING("socket: malformed request from pid %d (uid %u): %s; refused (%llu so far)",
                     static_cast<int>(conn.pid), static_cast<unsigned>(conn.uid), why,
                     static_cast<unsigned long long>(n));
    }
  } else if (status == wire::AckStatus::kFull || status == wire::AckStatus::kBusy) {
    const uint64_t n = metrics_.requests_refused_full_total.fetch_add(1, std::memory_order_relaxed) + 1;
    if (ShouldWarn(n)) PS_LOG_WARNING("socket: refusing posts: %s (%llu so far)", why,
                                      static_cast<unsigned long long>(n));
  }
  if (header == nullptr) {
    // Not our protocol at all: there is no request id to answer to.
    loop_->RemoveConnection(fd);
    return;
  }
  SendAck(fd, conn.gen, wire::Ack{status, header->request_id, 0});
}

void Daemon::HandleRequest(int fd, const Conn& conn, std::span<const std::byte> packet,
                           bool truncated) {
  metrics_.requests_total.fetch_add(1, std::memory_order_relaxed);
  wire::RequestHeader h;
  if (!wire::DecodeRequestHeader(packet, &h)) {
    return Reject(fd, conn, nullptr, wire::AckStatus::kMalformed, "bad request header");
  }
  if (truncated) {
    return Reject(fd, conn, &h, wire::AckStatus::kMalformed, "request larger than the maximum");
  }
  if (stopping_) return Reject(fd, conn, &h, wire::AckStatus::kShuttingDown, "shutting down");
  if (h.record_count == 0 || h.record_count > wire::kRecordsPerRequestMax) {
    return Reject(fd, conn, &h, wire::AckStatus::kMalformed, "bad record count");
  }
  // Check every record before taking any: all or nothing.
  std::span<const std::byte> rest = packet.subspan(wire::kRequestHeaderBytes);
  for (uint16_t i = 0; i < h.record_count; ++i) {
    uint32_t len = 0;
    if (segment::CheckFrame(rest, segment::kRecordPayloadMax, &len) != segment::FrameCheck::kValid) {
      return Reject(fd, conn, &h, wire::AckStatus::kMalformed, "damaged record framing");
    }
    if (!VerifyPostPayload(rest.subspan(segment::kRecordHeaderBytes, len))) {
      return Reject(fd, conn, &h, wire::AckStatus::kMalformed, "record is not a valid Post");
    }
    rest = rest.subspan(segment::RecordBytes(len));
  }
  if (!rest.empty()) return Reject(fd, conn, &h, wire::AckStatus::kMalformed, "bytes after the records");
  if (DiskBytes() + packet.size() > config_.disk_bytes_max) {
    return Reject(fd, conn, &h, wire::AckStatus::kFull, "journal and spool reached disk_bytes_max");
  }
  if (filling_.records + h.record_count > config_.batch_records_max ||
      filling_.bytes.size() + 2 * packet.size() > config_.batch_bytes_max) {
    return Reject(fd, conn, &h, wire::AckStatus::kBusy, "group-commit batch full (journal slow)");
  }
  const size_t mark = filling_.bytes.size();
  rest = packet.subspan(wire::kRequestHeaderBytes);
  for (uint16_t i = 0; i < h.record_count; ++i) {
    uint32_t len = 0;
    (void)segment::CheckFrame(rest, segment::kRecordPayloadMax, &len);
    const auto payload = rest.subspan(segment::kRecordHeaderBytes, len);
    if (!Stamp(payload, conn.uid, conn.gid, conn.pid, &filling_)) {
      filling_.bytes.resize(mark);
      filling_.ids.resize(filling_.ids.size() - i);
      return Reject(fd, conn, &h, wire::AckStatus::kMalformed, "post fails validation");
    }
    const fb::PostId* id = PostFromPayload(payload).id();
    filling_.ids.push_back(PostId{id->hi(), id->lo()});
    rest = rest.subspan(segment::RecordBytes(len));
  }
  filling_.records += h.record_count;
  filling_.acks.push_back(PendingAck{fd, conn.gen, h.request_id, h.record_count});
}

bool Daemon::Stamp(std::span<const std::byte> payload, uid_t uid, gid_t gid,
                   std::optional<pid_t> pid, Batch* batch) {
  PostData p = ReadPost(PostFromPayload(payload));
  p.origin_uid = uid;
  p.origin_gid = gid;
  p.origin_pid = pid ? std::optional<int32_t>(*pid) : std::nullopt;
  p.origin_host = hostname_;
  if (p.base_url.empty()) p.base_url = config_.post_baseUrl;
  if (!ValidatePost(p).ok()) return false;
  BuildPost(p, &builder_);
  const auto span = builder_.GetBufferSpan();
  return segment::AppendRecord(std::as_bytes(std::span(span.data(), span.size())), &batch->bytes).ok();
}

void Daemon::SendAck(int fd, uint32_t gen, const wire::Ack& ack) {
  auto it = conns_.find(fd);
  if (it == conns_.end() || it->second.gen != gen) return;  // that client is gone
  std::array<std::byte, wire::kAckBytes> raw;
  wire::EncodeAck(ack, raw);
  ssize_t n;
  do {
    n = ::send(fd, raw.data(), raw.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(raw.size())) {
    // The client does not read its acks (or is gone): drop it. Its posts are
    // journaled; it may spool them too, which makes duplicates, not loss.
    loop_->RemoveConnection(fd);
  }
}

uint64_t Daemon::DiskBytes() const {
  return usage_.bytes.load(std::memory_order_relaxed) + adopter_.spool_bytes() +
         filling_.bytes.size() + writing_.bytes.size();
}

void Daemon::FeedAdoption() {
  if (stopping_) return;
  SpoolAdopter::Adopted a;
  while (filling_.records < config_.batch_records_max &&
         filling_.bytes.size() + segment::RecordBytes(segment::kRecordPayloadMax) * 2 <
             config_.batch_bytes_max &&
         adopter_.Next(&a)) {
    const fb::PostId* fid = PostFromPayload(a.payload).id();
    const PostId id{fid->hi(), fid->lo()};
    if (recent_ids_.Contains(id)) {
      // Journaled already: from the socket (the client spooled it too
      // because the acknowledgement came too late for it), or from this
      // spool segment before the daemon restarted mid-adoption.
      metrics_.spool_posts_deduplicated_total.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    if (!Stamp(a.payload, a.uid, a.gid, std::nullopt, &filling_)) {
      metrics_.spool_bytes_skipped_total.fetch_add(a.payload.size(), std::memory_order_relaxed);
      PS_LOG_WARNING("spool: a post of uid %u fails validation; skipped", static_cast<unsigned>(a.uid));
      continue;
    }
    filling_.ids.push_back(id);
    ++filling_.records;
    ++filling_.adopted;
    ++adopted_uncommitted_;
  }
  if (adopter_.AtEnd() && adopted_uncommitted_ == 0) adopter_.Finish();
}

void Daemon::StartWrite() {
  if (write_in_flight_ || filling_.records == 0) return;
  std::swap(filling_, writing_);
  filling_.Clear();
  if (Status s = journal_->Reserve(writing_.bytes.size(), &slot_); !s.ok()) {
    BatchFailed(s.ToString());
    return;
  }
  write_in_flight_ = true;
  metrics_.journal_writes_total.fetch_add(1, std::memory_order_relaxed);
  loop_->SubmitWrite(slot_.fd, writing_.bytes.data(), writing_.bytes.size(),
                     slot_.position.offset, kCookieWrite);
}

void Daemon::OnIoDone(uint64_t cookie, int64_t result) {
  if (cookie == kCookieWrite) {
    if (result != static_cast<int64_t>(writing_.bytes.size())) {
      journal_->Abandon();
      BatchFailed(result < 0 ? std::string("write: ") + std::strerror(static_cast<int>(-result))
                             : "short write (disk full?)");
      return;
    }
    if (config_.durability == Durability::kSynced) {
      loop_->SubmitSync(slot_.fd, kCookieSync);
      return;
    }
    BatchCommitted();
  } else if (cookie == kCookieSync) {
    if (result != 0) {
      journal_->Abandon();
      BatchFailed(std::string("fdatasync: ") + std::strerror(static_cast<int>(-result)));
      return;
    }
    BatchCommitted();
  }
}

void Daemon::BatchCommitted() {
  commits_.Publish(journal_->Committed());
  for (const PostId& id : writing_.ids) recent_ids_.Add(id);
  for (const PendingAck& a : writing_.acks) {
    SendAck(a.fd, a.gen, wire::Ack{wire::AckStatus::kAccepted, a.request_id, a.records});
  }
  metrics_.posts_accepted_total.fetch_add(writing_.records - writing_.adopted, std::memory_order_relaxed);
  metrics_.spool_posts_adopted_total.fetch_add(writing_.adopted, std::memory_order_relaxed);
  adopted_uncommitted_ -= writing_.adopted;
  write_in_flight_ = false;
  writing_.Clear();
}

void Daemon::BatchFailed(const std::string& why) {
  const uint64_t n = metrics_.journal_write_errors_total.fetch_add(1, std::memory_order_relaxed) + 1;
  if (ShouldWarn(n)) {
    PS_LOG_ERROR("journal %s: %s; %zu requests refused (clients fall back to their spool), "
                 "the next write starts a new segment", config_.journal_dir.c_str(), why.c_str(),
                 writing_.acks.size());
  }
  for (const PendingAck& a : writing_.acks) {
    SendAck(a.fd, a.gen, wire::Ack{wire::AckStatus::kUnavailable, a.request_id, 0});
  }
  if (writing_.adopted > 0) {
    adopted_uncommitted_ -= writing_.adopted;
    adopter_.Restart();
  }
  write_in_flight_ = false;
  writing_.Clear();
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
    if (!fd.valid() || !segment::FileSource::Open(fd.get(), &source).ok() ||
        !segment::SegmentReader::Open(source.get(), options, &reader).ok()) {
      continue;  // the forwarder reports damaged segments
    }
    segment::Record rec;
    while (reader->Next(&rec) == segment::SegmentReader::Result::kRecord) {
      const fb::PostId* id = PostFromPayload(rec.payload).id();
      recent_ids_.Add(PostId{id->hi(), id->lo()});
    }
  }
}

void Daemon::OnReadable(int fd) {
  if (fd == signal_fd_.get()) {
    OnSignal();
  } else if (fd == adopter_.inotify_fd()) {
    adopter_.OnInotify();
  }
}

void Daemon::OnSignal() {
  signalfd_siginfo si;
  while (::read(signal_fd_.get(), &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
    if (si.ssi_signo == SIGHUP) {
      PS_LOG_INFO("SIGHUP: logs go to stderr (the journal), nothing to reopen");
      continue;
    }
    if (!stopping_) {
      PS_LOG_INFO("%s: no longer accepting; journaling and acknowledging what arrived, then "
                  "publishing what is journaled for up to %u ms",
                  si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT", config_.shutdown_drain_ms);
      stopping_ = true;
      loop_->StopListening();
      ::unlink(config_.socket_path.c_str());
    }
  }
}

void Daemon::OnRoundEnd() {
  const auto now = Clock::now();
  if (now - last_periodic_ >= kPeriodicWork) Periodic(now);
  FeedAdoption();
  StartWrite();
  if (stopping_ && !write_in_flight_ && filling_.records == 0) {
    // Everything that arrived is journaled and acknowledged.
    for (const auto& [fd, conn] : conns_) loop_->RemoveConnection(fd);
    if (conns_.empty()) stop_ = true;
  }
}

void Daemon::Periodic(Clock::time_point now) {
  last_periodic_ = now;
  adopter_.MaybeScan(now);
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
    static bool warned = false;
    if (!warned) {
      warned = true;
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
