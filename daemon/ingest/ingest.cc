#include "ingest.h"

#include <algorithm>
#include <cassert>

#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "log.h"
#include "post_stamp.h"
#include "segment_format.h"

namespace postspool::daemon {
namespace {

constexpr uint64_t kCookieWrite = 1;
constexpr uint64_t kCookieSync = 2;
constexpr uint64_t kCookieSegment = 3;
// After a failed journal write adoption pauses, doubling from this to the
// maximum (full jitter).
constexpr uint32_t kAdoptionRetryInitialMs = 100;
constexpr uint32_t kAdoptionRetryMaxMs = 10000;

}  // namespace

void Ingest::Batch::Clear() {
  bytes.clear();
  acks.clear();
  records = 0;
  adopted = 0;
  ringed = 0;
  ids.clear();
  bytes_of.clear();
  lane_ends.clear();
}

Ingest::Ingest(const Config& config, Metrics* metrics, Ports ports, std::string hostname,
               const RecentIds::Key& dedupe_key, uint64_t seed)
    : config_(config),
      metrics_(metrics),
      ports_(ports),
      adopter_(config, metrics, ports.spool, ports.clock),
      recent_ids_(config.dedupe_window_posts, dedupe_key),
      late_ids_(config.dedupe_window_posts / 4, dedupe_key),
      hostname_(std::move(hostname)),
      adoption_backoff_(kAdoptionRetryInitialMs, kAdoptionRetryMaxMs, seed) {
  // Adoption moves a uid's posts from its spool segments into the journal
  // (and deletes the segments): its spool bytes must not hold its own
  // adoption back, or a uid whose spool alone exceeds its share waits
  // forever. Its unconfirmed journal bytes do.
  adopter_.set_uid_admission([this](uid_t uid) {
    return UidBytes(uid) - adopter_.spool_bytes_of(uid) <= config_.DiskBytesPerUidMax();
  });
}

void Ingest::LogLimited(LogLimiter* limiter, LogLevel level, const char* format, ...) {
  uint64_t suppressed = 0;
  if (!limiter->Allow(ports_.clock->Now(), &suppressed)) return;
  char buf[1024];
  va_list ap;
  va_start(ap, format);
  std::vsnprintf(buf, sizeof buf, format, ap);
  va_end(ap);
  if (suppressed > 0) {
    Log(level, "%s (%llu more like it not logged)", buf, static_cast<unsigned long long>(suppressed));
  } else {
    Log(level, "%s", buf);
  }
}

Status Ingest::WatchReadable(int fd, std::function<void()> handler) {
  if (Status s = loop_->Watch(fd); !s.ok()) return s;
  readable_[fd] = std::move(handler);
  return Status::Ok();
}

void Ingest::OnReadable(int fd) {
  if (auto it = readable_.find(fd); it != readable_.end()) it->second();
}

void Ingest::Stop() {
  if (stopping_) return;
  stopping_ = true;
  loop_->StopListening();
  NoteRingTailsAtStop();
}

uint64_t Ingest::DiskBytes() const {
  return ports_.journal->bytes() + adopter_.spool_bytes() + ports_.spool->quarantine_bytes() +
         filling_.bytes.size() + writing_.bytes.size();
}

uint64_t Ingest::UidBytes(uid_t uid) const {
  uint64_t n = adopter_.spool_bytes_of(uid);
  if (auto it = journal_bytes_of_.find(uid); it != journal_bytes_of_.end()) n += it->second;
  for (const Batch* b : {&filling_, &writing_}) {
    if (auto it = b->bytes_of.find(uid); it != b->bytes_of.end()) n += it->second;
  }
  return n;
}

void Ingest::GetUsage(size_t uids_max, Usage* out) const {
  out->uids.clear();
  std::vector<uid_t> uids;
  for (const auto& [uid, bytes] : journal_bytes_of_) uids.push_back(uid);
  for (const auto& [uid, bytes] : adopter_.spool_bytes_by_uid()) uids.push_back(uid);
  for (const Batch* b : {&filling_, &writing_}) {
    for (const auto& [uid, bytes] : b->bytes_of) uids.push_back(uid);
  }
  std::sort(uids.begin(), uids.end());
  uids.erase(std::unique(uids.begin(), uids.end()), uids.end());
  for (uid_t uid : uids) {
    if (const uint64_t bytes = UidBytes(uid); bytes > 0) out->uids.emplace_back(uid, bytes);
  }
  out->uids_total = out->uids.size();
  std::sort(out->uids.begin(), out->uids.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  if (out->uids.size() > uids_max) out->uids.resize(uids_max);
  out->spool_segments_waiting = adopter_.segments_waiting();
}

// ---------------------------------------------------------------------------
// Connections and requests

void Ingest::OnAccept(int fd, const PeerCred& peer) {
  uint32_t& of_uid = conns_of_[peer.uid];
  if (stopping_ || conns_.size() >= config_.connections_max ||
      of_uid >= config_.connections_per_uid_max) {
    if (of_uid == 0) conns_of_.erase(peer.uid);
    metrics_->connections_refused_total.fetch_add(1, std::memory_order_relaxed);
    loop_->Close(fd);  // the client falls back to the spool
    return;
  }
  if (!loop_->AddConnection(fd).ok()) {
    if (of_uid == 0) conns_of_.erase(peer.uid);
    loop_->Close(fd);
    return;
  }
  ++of_uid;
  conns_[fd] = Conn{++next_gen_, peer};
  metrics_->connections_accepted_total.fetch_add(1, std::memory_order_relaxed);
}

void Ingest::OnAcceptError(int error) {
  (void)error;  // the loop logs the episode
  metrics_->accept_errors_total.fetch_add(1, std::memory_order_relaxed);
}

void Ingest::OnConnectionClosed(int fd, int error) {
  if (error != 0) PS_LOG_DEBUG("connection %d closed: %s", fd, std::strerror(error));
  if (auto it = conns_.find(fd); it != conns_.end()) {
    auto c = conns_of_.find(it->second.peer.uid);
    if (c != conns_of_.end() && --c->second == 0) conns_of_.erase(c);
    conns_.erase(it);
  }
  loop_->Close(fd);
}

void Ingest::OnPacket(int fd, std::span<const std::byte> packet, bool truncated) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  HandleRequest(fd, it->second, packet, truncated);
}

void Ingest::Refuse(int fd, const Conn& conn, const wire::RequestHeader* header,
                    wire::AckStatus status, Metrics::Counter* counter, const char* why) {
  if (counter != nullptr) {
    const uint64_t n = counter->fetch_add(1, std::memory_order_relaxed) + 1;
    LogLimited(&refuse_limiter_, LogLevel::kWarning,
               "socket: refused a request of pid %d (uid %u): %s (%s; %llu such so far)",
               static_cast<int>(conn.peer.pid), static_cast<unsigned>(conn.peer.uid), why,
               wire::AckStatusName(status), static_cast<unsigned long long>(n));
  }
  if (header == nullptr) {
    // Not our protocol at all: there is no request id to answer to.
    loop_->RemoveConnection(fd);
    return;
  }
  SendAck(fd, conn.gen, wire::Ack{status, header->request_id, 0});
}

void Ingest::HandleRequest(int fd, const Conn& conn, std::span<const std::byte> packet,
                           bool truncated) {
  metrics_->requests_total.fetch_add(1, std::memory_order_relaxed);
  auto* malformed = &metrics_->requests_malformed_total;
  wire::RequestHeader h;
  if (!wire::DecodeRequestHeader(packet, &h)) {
    return Refuse(fd, conn, nullptr, wire::AckStatus::kMalformed, malformed, "bad request header");
  }
  if (truncated) {
    return Refuse(fd, conn, &h, wire::AckStatus::kMalformed, malformed,
                  "request larger than the maximum");
  }
  if (h.record_count == 0 && packet.size() == wire::kRequestHeaderBytes) {
    return HandleRingRequest(fd, conn, h);
  }
  if (stopping_) return Refuse(fd, conn, &h, wire::AckStatus::kShuttingDown, nullptr, "stopping");
  if (h.record_count == 0 || h.record_count > wire::kRecordsPerRequestMax) {
    return Refuse(fd, conn, &h, wire::AckStatus::kMalformed, malformed, "bad record count");
  }
  // Check every record before taking any: all or nothing.
  std::span<const std::byte> rest = packet.subspan(wire::kRequestHeaderBytes);
  for (uint16_t i = 0; i < h.record_count; ++i) {
    uint32_t len = 0;
    if (segment::CheckFrame(rest, segment::kRecordPayloadMax, &len) != segment::FrameCheck::kValid) {
      return Refuse(fd, conn, &h, wire::AckStatus::kMalformed, malformed, "damaged record framing");
    }
    if (!VerifyPostPayload(rest.subspan(segment::kRecordHeaderBytes, len))) {
      return Refuse(fd, conn, &h, wire::AckStatus::kMalformed, malformed,
                    "record is not a valid Post");
    }
    rest = rest.subspan(segment::RecordBytes(len));
  }
  if (!rest.empty()) {
    return Refuse(fd, conn, &h, wire::AckStatus::kMalformed, malformed, "bytes after the records");
  }
  if (DiskBytes() + packet.size() > config_.disk_bytes_max) {
    return Refuse(fd, conn, &h, wire::AckStatus::kFull, &metrics_->requests_refused_full_total,
                  "journal, spool and quarantine reached disk_bytes_max");
  }
  if (UidBytes(conn.peer.uid) + packet.size() > config_.DiskBytesPerUidMax()) {
    return Refuse(fd, conn, &h, wire::AckStatus::kFull, &metrics_->requests_refused_full_total,
                  "this uid's posts reached disk_bytes_per_uid_max");
  }
  if (filling_.records + h.record_count > config_.batch_records_max ||
      filling_.bytes.size() + 2 * packet.size() > config_.batch_bytes_max) {
    return Refuse(fd, conn, &h, wire::AckStatus::kBusy, &metrics_->requests_refused_busy_total,
                  "group-commit batch full (journal slow)");
  }
  const size_t mark = filling_.bytes.size();
  const size_t ids_mark = filling_.ids.size();
  rest = packet.subspan(wire::kRequestHeaderBytes);
  for (uint16_t i = 0; i < h.record_count; ++i) {
    uint32_t len = 0;
    (void)segment::CheckFrame(rest, segment::kRecordPayloadMax, &len);
    const auto payload = rest.subspan(segment::kRecordHeaderBytes, len);
    rest = rest.subspan(segment::RecordBytes(len));
    if (const fb::PostId* fid = PostFromPayload(payload).id();
        recent_ids_.Contains(PostId{fid->hi(), fid->lo()})) {
      // Journaled already: its client spooled it when this request's
      // budget ran out, and adoption got to the spooled copy first.
      // Acknowledged all the same.
      metrics_->socket_posts_deduplicated_total.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    if (Status s = Stamp(payload, conn.peer.uid, conn.peer.gid, conn.peer.pid, &filling_); !s.ok()) {
      const uint64_t taken = filling_.bytes.size() - mark;
      filling_.bytes.resize(mark);
      filling_.ids.resize(ids_mark);
      filling_.bytes_of[conn.peer.uid] -= taken;
      const std::string why = "post " + std::to_string(i) + " fails validation: " + s.message();
      return Refuse(fd, conn, &h, wire::AckStatus::kMalformed, &metrics_->requests_invalid_total,
                    why.c_str());
    }
  }
  const auto taken = static_cast<uint32_t>(filling_.ids.size() - ids_mark);
  filling_.records += taken;
  filling_.acks.push_back(
      PendingAck{fd, conn.gen, h.request_id, h.record_count, static_cast<uint32_t>(ids_mark), taken});
}

Status Ingest::Stamp(std::span<const std::byte> payload, uid_t uid, std::optional<gid_t> gid,
                     std::optional<pid_t> pid, Batch* batch, bool remember_id) {
  PostData p = ReadPost(PostFromPayload(payload));
  p.origin_uid = uid;
  p.origin_gid = gid ? std::optional<uint32_t>(*gid) : std::nullopt;
  p.origin_pid = pid ? std::optional<int32_t>(*pid) : std::nullopt;
  p.origin_host = hostname_;
  if (p.base_url.empty()) p.base_url = config_.post_baseUrl;
  if (Status s = ValidatePost(p); !s.ok()) return s;
  // In place, so that fields of a newer schema survive; a post without an
  // origin slot (an older writer) is rebuilt, which loses nothing unless
  // it also carries fields this daemon does not know.
  std::span<const std::byte> stamped;
  if (StampPostInPlace(payload, StampedOrigin{p.origin_uid, p.origin_gid, p.origin_pid, hostname_},
                       config_.post_baseUrl, &stamp_buffer_)) {
    stamped = stamp_buffer_;
  } else {
    if (PostHasUnknownFields(payload)) {
      metrics_->posts_fields_dropped_total.fetch_add(1, std::memory_order_relaxed);
    }
    BuildPost(p, &builder_);
    stamped = std::as_bytes(std::span(builder_.GetBufferSpan().data(), builder_.GetSize()));
  }
  const size_t before = batch->bytes.size();
  if (Status s = segment::AppendRecord(stamped, &batch->bytes); !s.ok()) return s;
  batch->bytes_of[uid] += batch->bytes.size() - before;
  if (remember_id) batch->ids.push_back(p.id);
  return Status::Ok();
}

void Ingest::SendAck(int fd, uint32_t gen, const wire::Ack& ack,
                     std::span<const PostId> journaled) {
  const uint64_t cookie = sent_first_ + sent_.size();
  sent_.push_back(SentAck{fd, gen, sent_ids_first_ + sent_ids_.size(),
                          static_cast<uint32_t>(journaled.size()), false});
  sent_ids_.insert(sent_ids_.end(), journaled.begin(), journaled.end());
  auto it = conns_.find(fd);
  // That client is gone: reported as not sent, at once.
  if (it == conns_.end() || it->second.gen != gen) return OnSent(cookie, false);
  std::array<std::byte, wire::kAckBytes> raw;
  wire::EncodeAck(ack, raw);
  loop_->Send(fd, raw, cookie);
}

void Ingest::OnSent(uint64_t cookie, bool sent) {
  assert(cookie - sent_first_ < sent_.size());
  SentAck& s = sent_[cookie - sent_first_];
  s.reported = true;
  if (!sent) AckUndelivered(s);
  while (!sent_.empty() && sent_.front().reported) {
    sent_ids_.erase(sent_ids_.begin(), sent_ids_.begin() + sent_.front().ids);
    sent_ids_first_ += sent_.front().ids;
    sent_.pop_front();
    ++sent_first_;
  }
}

void Ingest::AckUndelivered(const SentAck& s) {
  // The client does not read its acks, is gone, or gave up on this one (it
  // shut its reading side: EPIPE): drop it.
  if (auto it = conns_.find(s.fd); it != conns_.end() && it->second.gen == s.gen) {
    loop_->RemoveConnection(s.fd);
  }
  if (s.ids == 0) return;
  // Journaled, but the client did not get its acknowledgement: it spools
  // these posts (or did already), and their spooled copies may come long
  // after recent_ids_ forgot them.
  metrics_->socket_acks_undelivered_total.fetch_add(1, std::memory_order_relaxed);
  const auto first = sent_ids_.begin() + static_cast<ptrdiff_t>(s.ids_begin - sent_ids_first_);
  for (auto id = first; id != first + s.ids; ++id) late_ids_.Add(*id);
}

// ---------------------------------------------------------------------------
// Adoption

void Ingest::FeedAdoption(Clock::time_point now) {
  if (stopping_ || now < adoption_resume_at_) return;
  // A segment whose records this round's commit journaled is finished now,
  // so that the next one is read in this round, not after the loop's idle
  // timeout (which held adoption to one segment per kRoundTimeoutMs).
  if (adopter_.AtEnd() && adopted_uncommitted_ == 0 && !write_in_flight_) adopter_.Finish();
  adopter_.NewRound();
  SpoolAdopter::Adopted a;
  while (filling_.records < config_.batch_records_max &&
         filling_.bytes.size() + segment::RecordBytes(segment::kRecordPayloadMax) * 2 <
             config_.batch_bytes_max &&
         adopter_.Next(&a)) {
    const fb::PostId* fid = PostFromPayload(a.payload).id();
    const PostId id{fid->hi(), fid->lo()};
    if (late_ids_.Remove(id) || recent_ids_.Contains(id)) {
      // Journaled already: from the socket (the client spooled it too
      // because the acknowledgement came too late for it), or from this
      // spool segment before the daemon restarted mid-adoption.
      metrics_->spool_posts_deduplicated_total.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    // The gid is not stamped: the segment's group is the spool directory's
    // (setgid), not the poster's, and nothing else about the writer's gid
    // can be trusted.
    if (Status s = Stamp(a.payload, a.uid, std::nullopt, std::nullopt, &filling_); !s.ok()) {
      metrics_->spool_posts_invalid_total.fetch_add(1, std::memory_order_relaxed);
      LogLimited(&invalid_limiter_, LogLevel::kWarning,
                 "spool: a post of uid %u fails validation (%s); the segment goes to the "
                 "quarantine once its other posts are journaled",
                 static_cast<unsigned>(a.uid), s.message().c_str());
      adopter_.MarkRejected(s.message());
      continue;
    }
    ++filling_.records;
    ++filling_.adopted;
    ++adopted_uncommitted_;
  }
  if (adopter_.AtEnd() && adopted_uncommitted_ == 0 && !write_in_flight_) adopter_.Finish();
}

// ---------------------------------------------------------------------------
// Group commit

void Ingest::StartWrite() {
  if (write_in_flight_) return;
  if (filling_.records == 0) {
    // Records that were all dropped (duplicates, invalid ring posts):
    // nothing to journal, but their lanes' heads move on, and their
    // requests are acknowledged.
    if (!filling_.lane_ends.empty() || !filling_.acks.empty()) {
      std::swap(filling_, writing_);
      AcknowledgeWriting();
      RingsCommitted();
      writing_.Clear();
    }
    return;
  }
  std::swap(filling_, writing_);
  filling_.Clear();
  write_in_flight_ = true;
  RingsToWriting();
  if (ports_.journal->NeedsSegment(writing_.bytes.size())) {
    // The batch waits for its segment; the loop goes on meanwhile.
    loop_->SubmitTask(ports_.journal->NewSegmentTask(), kCookieSegment);
    return;
  }
  SubmitBatchWrite();
}

void Ingest::SubmitBatchWrite() {
  if (Status s = ports_.journal->Reserve(writing_.bytes.size(), &slot_); !s.ok()) {
    BatchFailed(s.ToString());
    return;
  }
  metrics_->journal_writes_total.fetch_add(1, std::memory_order_relaxed);
  loop_->SubmitWrite(slot_.fd, writing_.bytes.data(), writing_.bytes.size(),
                     slot_.position.offset, kCookieWrite);
}

void Ingest::OnIoDone(uint64_t cookie, int64_t result) {
  if (cookie == kCookieSegment) {
    if (Status s = ports_.journal->SegmentDone(); !s.ok()) {
      BatchFailed(s.ToString());
      return;
    }
    metrics_->journal_segments_created_total.fetch_add(1, std::memory_order_relaxed);
    SubmitBatchWrite();
  } else if (cookie == kCookieWrite) {
    if (result != static_cast<int64_t>(writing_.bytes.size())) {
      ports_.journal->Abandon();
      BatchFailed(result < 0 ? std::string("write: ") + std::strerror(static_cast<int>(-result))
                             : "short write (disk full?)");
      return;
    }
    // Spooled posts are synced before their spool file is deleted, at any
    // durability: the spool copy may have been synced by its writer
    // (sync_spool), and the journal copy must be no less durable.
    if (config_.durability == Durability::kSynced || writing_.adopted > 0) {
      loop_->SubmitSync(slot_.fd, kCookieSync);
      return;
    }
    BatchCommitted();
  } else if (cookie == kCookieSync) {
    if (result != 0) {
      ports_.journal->Abandon();
      BatchFailed(std::string("fdatasync: ") + std::strerror(static_cast<int>(-result)));
      return;
    }
    BatchCommitted();
  }
}

void Ingest::AcknowledgeWriting() {
  for (const PendingAck& a : writing_.acks) {
    SendAck(a.fd, a.gen, wire::Ack{wire::AckStatus::kAccepted, a.request_id, a.records},
            std::span(writing_.ids).subspan(a.first_id, a.taken));
  }
}

void Ingest::BatchCommitted() {
  const JournalPosition end = ports_.journal->Committed();
  ports_.journal->Publish(end);
  adoption_backoff_.Reset();
  auto& of_segment = segment_bytes_of_[slot_.position.segment_seq];
  for (const auto& [uid, bytes] : writing_.bytes_of) {
    of_segment[uid] += bytes;
    journal_bytes_of_[uid] += bytes;
  }
  recent_ids_.AddAll(writing_.ids);
  AcknowledgeWriting();
  RingsCommitted();
  metrics_->socket_posts_journaled_total.fetch_add(
      writing_.records - writing_.adopted - writing_.ringed, std::memory_order_relaxed);
  metrics_->ring_posts_journaled_total.fetch_add(writing_.ringed, std::memory_order_relaxed);
  metrics_->spool_posts_journaled_total.fetch_add(writing_.adopted, std::memory_order_relaxed);
  adopted_uncommitted_ -= writing_.adopted;
  write_in_flight_ = false;
  writing_.Clear();
}

void Ingest::BatchFailed(const std::string& why) {
  const uint64_t n = metrics_->journal_write_errors_total.fetch_add(1, std::memory_order_relaxed) + 1;
  const auto now = ports_.clock->Now();
  const auto delay = adoption_backoff_.Next();
  adoption_resume_at_ = now + delay;
  LogLimited(&journal_limiter_, LogLevel::kError,
             "journal %s: %s; %zu requests refused (their clients use the spool), the next write "
             "starts a new segment; adoption paused for %lld ms (%llu journal errors so far)",
             config_.journal_dir.c_str(), why.c_str(), writing_.acks.size(),
             static_cast<long long>(delay.count()), static_cast<unsigned long long>(n));
  metrics_->requests_unavailable_total.fetch_add(writing_.acks.size(), std::memory_order_relaxed);
  for (const PendingAck& a : writing_.acks) {
    SendAck(a.fd, a.gen, wire::Ack{wire::AckStatus::kUnavailable, a.request_id, 0});
  }
  if (writing_.adopted > 0) {
    adopted_uncommitted_ -= writing_.adopted;
    adopter_.Restart();
  }
  RingsFailed();
  write_in_flight_ = false;
  writing_.Clear();
}

void Ingest::ForgetConfirmed() {
  // Segments wholly before the watermark are confirmed: give their bytes
  // back to their uids' shares.
  const JournalPosition w = ports_.journal->watermark();
  // Everything journaled is confirmed: the segment being written too. Else
  // a uid whose confirmed posts fill the current segment's share stays
  // above its share until someone else's posts roll the segment over.
  const bool all_confirmed = w >= ports_.journal->end();
  while (!segment_bytes_of_.empty() &&
         (all_confirmed || segment_bytes_of_.begin()->first < w.segment_seq)) {
    for (const auto& [uid, bytes] : segment_bytes_of_.begin()->second) {
      auto it = journal_bytes_of_.find(uid);
      if (it == journal_bytes_of_.end()) continue;
      it->second -= std::min(it->second, bytes);
      if (it->second == 0) journal_bytes_of_.erase(it);
    }
    segment_bytes_of_.erase(segment_bytes_of_.begin());
  }
}

void Ingest::OnRoundEnd() {
  const auto now = ports_.clock->Now();
  ForgetConfirmed();
  if (!stopping_) adopter_.Tick();
  FeedAdoption(now);
  const bool ring_work = DrainRings(now);
  StartWrite();
  MaybeSleep(now, ring_work);
  if (stopping_ && !write_in_flight_ && filling_.records == 0 && RingsFlushed()) {
    // Everything that arrived is journaled and acknowledged.
    for (const auto& [fd, conn] : conns_) loop_->RemoveConnection(fd);
    if (conns_.empty()) done_ = true;
  }
  metrics_->disk_bytes.store(DiskBytes(), std::memory_order_relaxed);
  if (round_hook_) round_hook_(now);
}

}  // namespace postspool::daemon
