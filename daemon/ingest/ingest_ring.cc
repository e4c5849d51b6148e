// The Ingest's side of the per-uid shared-memory rings (ring_format.h):
// handing a process its uid's ring, draining the lanes fairly into the
// group-commit batch, moving a lane's head once its records are journaled,
// resetting damaged lanes, reclaiming the lanes of processes that are gone,
// and the doorbell protocol that lets the loop sleep.
//
// Ring memory is written by every process of the ring's uid: the Ingest
// keeps its own cursors (LaneCursor) and only ever writes a lane's head and
// state (and the whole lane header when it frees the lane).
#include <algorithm>
#include <array>

#include "ingest.h"
#include "post.h"
#include "segment_format.h"

namespace postspool::daemon {
namespace {

// How often a lane's idle owner is checked for being alive.
constexpr auto kOwnerCheckInterval = std::chrono::seconds(1);

}  // namespace

void Ingest::HandleRingRequest(int fd, const Conn& conn, const wire::RequestHeader& h) {
  metrics_->ring_requests_total.fetch_add(1, std::memory_order_relaxed);
  int shm_id = -1;
  Status s = ports_.rings == nullptr ? Status(StatusCode::kUnsupported, "rings are off")
             : stopping_             ? Status(StatusCode::kUnsupported, "stopping")
                                     : ports_.rings->ForUid(conn.peer.uid, &shm_id);
  if (!s.ok()) {
    metrics_->ring_requests_refused_total.fetch_add(1, std::memory_order_relaxed);
    LogLimited(&ring_limiter_, LogLevel::kInfo, "ring: none for pid %d (uid %u): %s",
               static_cast<int>(conn.peer.pid), static_cast<unsigned>(conn.peer.uid),
               s.message().c_str());
    SendAck(fd, conn.gen, wire::Ack{wire::AckStatus::kUnavailable, h.request_id, 0});
    return;
  }
  SyncRingCursors();
  for (const auto& e : ports_.rings->entries()) {
    if (e.uid == conn.peer.uid) e.ring.RepairHeader(e.uid);
  }
  // A new ring's doorbell says "awake" until its lanes were walked and the
  // loop went to sleep again: this round walks them.
  rings_changed_ = true;
  SendAck(fd, conn.gen,
          wire::Ack{wire::AckStatus::kAccepted, h.request_id, 0, static_cast<uint32_t>(shm_id)});
}

void Ingest::SyncRingCursors() {
  if (ports_.rings == nullptr) return;
  const auto& entries = ports_.rings->entries();
  while (cursors_.size() < entries.size()) {
    const ring::Ring& r = entries[cursors_.size()].ring;
    std::vector<LaneCursor> lanes(r.lane_count());
    for (uint32_t l = 0; l < r.lane_count(); ++l) {
      // What an earlier run journaled; anything after it is read again
      // (and dropped as a duplicate if it was journaled after all).
      lanes[l].head = lanes[l].read = r.head(l).load(std::memory_order_acquire);
      lanes[l].recheck_until = r.tail(l).load(std::memory_order_acquire);
    }
    cursors_.push_back(std::move(lanes));
  }
}

bool Ingest::RingAdmits(uid_t uid) const {
  return DiskBytes() < config_.disk_bytes_max && UidBytes(uid) < config_.DiskBytesPerUidMax();
}

void Ingest::NoteRingTailsAtStop() {
  if (ports_.rings == nullptr) return;
  SyncRingCursors();
  const auto& entries = ports_.rings->entries();
  for (size_t r = 0; r < cursors_.size(); ++r) {
    for (uint32_t l = 0; l < cursors_[r].size(); ++l) {
      LaneCursor& c = cursors_[r][l];
      uint64_t tail = 0;
      if (!c.broken && entries[r].ring.owner(l).load(std::memory_order_acquire) != 0 &&
          ring::LoadTail(entries[r].ring, l, c.head, c.read, &tail)) {
        c.stop_tail = tail;
      }
    }
  }
}

bool Ingest::RingsFlushed() const {
  for (const auto& lanes : cursors_) {
    for (const LaneCursor& c : lanes) {
      if (!c.broken && c.read < c.stop_tail) return false;
    }
  }
  return true;
}

bool Ingest::DrainRings(Clock::time_point now) {
  // Stopping: what was in the lanes when SIGTERM came is journaled before
  // the daemon exits (posts after it wait in the ring for the next start).
  if (ports_.rings == nullptr || (stopping_ && RingsFlushed())) return false;
  const auto& entries = ports_.rings->entries();
  // The quotas apply where a post enters the ring: a uid at its share (or a
  // full disk) has its ring marked full and its producers take the socket,
  // which refuses with `full`. What is already in its lanes was accepted:
  // it waits there (shared memory, kept across restarts) until the share frees, so
  // one uid's ring (ring_lanes × ring_lane_bytes, 4 MiB by default) never
  // overruns its share and takes the room of the others. Stopping journals
  // it anyway, so SIGTERM never waits on the quota. Every round, asleep or
  // not: a uid's share changes with its socket posts and the confirms too.
  bool admitted_again = false;
  for (size_t r = 0; r < entries.size(); ++r) {
    const auto& e = entries[r];
    const bool admits = RingAdmits(e.uid);
    const uint32_t full = admits ? 0 : 1;
    if (e.ring.full().load(std::memory_order_relaxed) != full) {
      e.ring.full().store(full, std::memory_order_relaxed);
    }
    if (admits && r < held_at_sleep_.size() && held_at_sleep_[r]) admitted_again = true;
    TakeDroppedPosts(e.ring, e.uid);
  }
  if (sleeping_) {
    // Asleep, the lanes are walked again only when something can have
    // changed them for the daemon: a producer rang, a ring was handed out,
    // a write of lane records ended, a uid that its share held back has
    // room again, or the lanes' owners are due to be looked at.
    if (!ports_.rings->Rang() && !rings_changed_ && !admitted_again && !stopping_ &&
        now < next_ring_walk_) {
      return false;
    }
    WakeRings();
  }
  rings_changed_ = false;
  SyncRingCursors();
  // Every lane of every ring in one walk, starting one lane further each
  // round: no lane and no uid is always first. A lane gives at most
  // ring_lane_records_per_round records per round.
  size_t total = 0;
  for (const auto& c : cursors_) total += c.size();
  if (total == 0) return false;
  bool took = false;
  size_t r = 0, l = 0;
  {
    size_t start = ring_turn_++ % total;
    while (start >= cursors_[r].size()) start -= cursors_[r++].size();
    l = start;
  }
  for (size_t k = 0; k < total; ++k, ++l) {
    if (l == cursors_[r].size()) {
      l = 0;
      r = (r + 1) % cursors_.size();
    }
    const uint32_t ri = static_cast<uint32_t>(r), li = static_cast<uint32_t>(l);
    const uint64_t owner = entries[r].ring.owner(li).load(std::memory_order_acquire);
    if (owner == 0) {
      MaybeTidyFreeLane(ri, li, now);
      continue;
    }
    if (DrainLane(ri, li, entries[r].uid, now)) took = true;
    MaybeReclaimLane(ri, li, owner, now);
  }
  if (took) last_ring_record_ = now;
  return took;
}

bool Ingest::DrainLane(uint32_t r, uint32_t l, uid_t uid, Clock::time_point now) {
  (void)now;
  LaneCursor& c = cursors_[r][l];
  if (c.broken || c.in_writing) return false;
  const ring::Ring& ring = ports_.rings->entries()[r].ring;
  uint64_t tail = 0;
  if (!ring::LoadTail(ring, l, c.head, c.read, &tail)) {
    LaneDamaged(r, l, "its tail is outside the lane");
    return false;
  }
  if (stopping_) tail = std::min(tail, std::max(c.stop_tail, c.read));
  if (tail == c.read) return false;
  const uint64_t owner = ring.owner(l).load(std::memory_order_relaxed);
  const pid_t pid = ring::IdentityPid(owner);
  bool took = false;
  // The room this uid has (its share, and the disk): records past it wait
  // in the lane until the share frees (DrainRings). Not when stopping.
  const uint64_t disk = DiskBytes(), mine = UidBytes(uid);
  const uint64_t room =
      stopping_ ? UINT64_MAX
                : std::min(config_.disk_bytes_max - std::min(disk, config_.disk_bytes_max),
                           config_.DiskBytesPerUidMax() - std::min(mine, config_.DiskBytesPerUidMax()));
  const size_t filling_at_start = filling_.bytes.size();
  for (uint32_t n = 0; n < config_.ring_lane_records_per_round; ++n) {
    if (filling_.bytes.size() - filling_at_start >= room) break;
    if (filling_.records >= config_.batch_records_max ||
        filling_.bytes.size() + 2 * segment::RecordBytes(segment::kRecordPayloadMax) >
            config_.batch_bytes_max) {
      break;
    }
    std::span<const std::byte> payload;
    const char* why = nullptr;
    const uint64_t at = c.read;
    const ring::ReadResult rr = ring::ReadRecord(ring, l, &c.read, tail, &ring_buffer_, &payload, &why);
    if (rr == ring::ReadResult::kEmpty) break;
    if (rr == ring::ReadResult::kDamaged) {
      LaneDamaged(r, l, why);
      break;
    }
    if (!VerifyPostPayload(payload)) {
      LaneDamaged(r, l, "a record is not a valid Post");
      break;
    }
    took = true;
    // A ring post can have been journaled already only if an earlier run of
    // the daemon read it, or, at `synced`, if its producer timed out waiting
    // and spooled a copy that was adopted first. Otherwise neither the
    // look-up nor remembering its id is needed (a third of the ingest's
    // time at 500,000 ring posts a second).
    const bool synced = config_.durability == Durability::kSynced;
    bool duplicate = false;
    if (synced || at < c.recheck_until) {
      const fb::PostId* fid = PostFromPayload(payload).id();
      duplicate = recent_ids_.Contains(PostId{fid->hi(), fid->lo()});
    }
    if (duplicate && !c.in_filling) {
      // Nothing of this lane waits in a batch: the head moves past the
      // duplicate now, not with the next batch. Its first copy is journaled
      // (committed, or synced by RememberJournaledIds), as a head move
      // needs; and the batch may fail (a full disk), and the segments that
      // hold the first copies be confirmed and deleted before the next
      // start, which then remembers none of these ids and journals the
      // lane's records again.
      metrics_->ring_posts_deduplicated_total.fetch_add(1, std::memory_order_relaxed);
      c.head = c.read;
      ring.head(l).store(c.head, std::memory_order_release);
      continue;
    }
    // The lane's records up to here belong to this batch, even when this
    // one is dropped below.
    if (!c.in_filling) {
      c.in_filling = true;
      filling_.lane_ends.push_back(LaneEnd{r, l, c.read});
    } else {
      for (LaneEnd& e : filling_.lane_ends) {
        if (e.ring == r && e.lane == l) e.end = c.read;
      }
    }
    if (duplicate) {
      metrics_->ring_posts_deduplicated_total.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    // The pid is the lane owner's (a process of this uid says so; the ring
    // is only that uid's). The gid is not known.
    if (Status s = Stamp(payload, uid, std::nullopt, pid > 0 ? std::optional<pid_t>(pid) : std::nullopt,
                         &filling_, synced);
        !s.ok()) {
      metrics_->ring_posts_invalid_total.fetch_add(1, std::memory_order_relaxed);
      LogLimited(&invalid_limiter_, LogLevel::kWarning,
                 "ring: a post of pid %d (uid %u) fails validation (%s); dropped",
                 static_cast<int>(pid), static_cast<unsigned>(uid), s.message().c_str());
      continue;
    }
    ++filling_.records;
    ++filling_.ringed;
  }
  return took;
}

void Ingest::TakeDroppedPosts(const ring::Ring& ring, uid_t uid) {
  const uint64_t n = ring::TakeDropped(ring);
  if (n == 0) return;
  // Saturating: the word is whatever the uid's processes wrote there. (The
  // ingest thread is the counter's only writer.)
  auto& total = metrics_->shim_posts_dropped_total;
  const uint64_t old = total.load(std::memory_order_relaxed);
  total.store(old > UINT64_MAX - n ? UINT64_MAX : old + n, std::memory_order_relaxed);
  LogLimited(&dropped_limiter_, LogLevel::kWarning,
             "uid %u: %llu post(s) its processes could not make (the shim over its budget, or the "
             "client failed; %llu so far)",
             static_cast<unsigned>(uid), static_cast<unsigned long long>(n),
             static_cast<unsigned long long>(total.load(std::memory_order_relaxed)));
}

void Ingest::LaneDamaged(uint32_t r, uint32_t l, const char* why) {
  LaneCursor& c = cursors_[r][l];
  const auto& e = ports_.rings->entries()[r];
  c.broken = true;
  // Producers stop using the lane; it is reset once its owner lets go.
  e.ring.state(l).store(ring::kLaneBroken, std::memory_order_release);
  const uint64_t n = metrics_->ring_lanes_damaged_total.fetch_add(1, std::memory_order_relaxed) + 1;
  LogLimited(&ring_limiter_, LogLevel::kWarning,
             "ring of uid %u, lane %u (pid %d): %s; what follows in the lane is dropped and the lane "
             "reset once its process lets go of it (%llu damaged lanes so far)",
             static_cast<unsigned>(e.uid), l,
             static_cast<int>(ring::IdentityPid(e.ring.owner(l).load(std::memory_order_relaxed))),
             why, static_cast<unsigned long long>(n));
}

void Ingest::MaybeReclaimLane(uint32_t r, uint32_t l, uint64_t owner, Clock::time_point now) {
  LaneCursor& c = cursors_[r][l];
  if (c.in_filling || c.in_writing) return;
  const ring::Ring& ring = ports_.rings->entries()[r].ring;
  if (!c.broken) {
    // Only a drained lane: what its owner published is journaled first.
    if (c.read != c.head) return;
    uint64_t tail = 0;
    if (!ring::LoadTail(ring, l, c.head, c.read, &tail) || tail != c.read) return;
  }
  if ((owner & ring::kReleasedBit) == 0) {
    if (now < c.next_owner_check) return;
    c.next_owner_check = now + kOwnerCheckInterval;
    if (ports_.rings->OwnerAlive(owner)) return;
  }
  // Free it: a clean header, then the owner word last (a producer claims a
  // lane only when its owner is 0 and its head equals its tail).
  if (c.broken) {
    ring.tail(l).store(0, std::memory_order_relaxed);
    ring.head(l).store(0, std::memory_order_relaxed);
    c.Reset();
  } else {
    // The head word is the daemon's, but every process of the uid can
    // write it. Drained, the lane's tail equals the daemon's own head: so
    // the head word is set from it, or one scribble over it would make
    // every later claim hand the lane back (ClaimLane wants head == tail)
    // and the lane would be lost until the daemon restarts.
    ring.head(l).store(c.head, std::memory_order_relaxed);
  }
  ring.state(l).store(ring::kLaneOk, std::memory_order_relaxed);
  uint64_t expected = owner;
  if (ring.owner(l).compare_exchange_strong(expected, 0, std::memory_order_acq_rel)) {
    metrics_->ring_lanes_reclaimed_total.fetch_add(1, std::memory_order_relaxed);
  }
}

void Ingest::MaybeTidyFreeLane(uint32_t r, uint32_t l, Clock::time_point now) {
  LaneCursor& c = cursors_[r][l];
  if (now < c.next_owner_check || c.in_filling || c.in_writing) return;
  c.next_owner_check = now + kOwnerCheckInterval;
  const ring::Ring& ring = ports_.rings->entries()[r].ring;
  if (!c.broken && ring.head(l).load(std::memory_order_relaxed) == c.head &&
      ring.tail(l).load(std::memory_order_relaxed) == c.head && c.read == c.head &&
      ring.state(l).load(std::memory_order_relaxed) == ring::kLaneOk) {
    return;
  }
  // A free lane whose header someone wrote over: the next producer would
  // start where the daemon does not read. Held (owner: the released bit
  // alone, which no producer claims) while it is set right.
  uint64_t expected = 0;
  if (!ring.owner(l).compare_exchange_strong(expected, ring::kReleasedBit, std::memory_order_acq_rel)) {
    return;
  }
  c.Reset();
  ring.tail(l).store(0, std::memory_order_relaxed);
  ring.head(l).store(0, std::memory_order_relaxed);
  ring.state(l).store(ring::kLaneOk, std::memory_order_relaxed);
  ring.owner(l).store(0, std::memory_order_release);
  metrics_->ring_lanes_damaged_total.fetch_add(1, std::memory_order_relaxed);
}

void Ingest::RingsToWriting() {
  for (const LaneEnd& e : writing_.lane_ends) {
    LaneCursor& c = cursors_[e.ring][e.lane];
    c.in_filling = false;
    c.in_writing = true;
  }
}

void Ingest::RingsCommitted() {
  if (!writing_.lane_ends.empty()) rings_changed_ = true;
  for (const LaneEnd& e : writing_.lane_ends) {
    LaneCursor& c = cursors_[e.ring][e.lane];
    c.in_writing = false;
    c.in_filling = false;
    c.head = e.end;
    // What a producer waiting for `synced` looks at.
    ports_.rings->entries()[e.ring].ring.head(e.lane).store(e.end, std::memory_order_release);
  }
}

void Ingest::RingsFailed() {
  // The records stay in their lanes and are read again (by the next start,
  // if this one is stopping: it does not retry a failing journal).
  if (!writing_.lane_ends.empty()) rings_changed_ = true;
  for (const LaneEnd& e : writing_.lane_ends) {
    LaneCursor& c = cursors_[e.ring][e.lane];
    c.in_writing = false;
    c.read = c.head;
  }
  if (stopping_) {
    for (auto& lanes : cursors_) {
      for (LaneCursor& c : lanes) c.stop_tail = 0;
    }
  }
}

void Ingest::WakeRings() {
  if (!sleeping_) return;
  sleeping_ = false;
  for (const auto& e : ports_.rings->entries()) e.ring.doorbell().store(0, std::memory_order_relaxed);
  ports_.rings->Awake();
}

void Ingest::MaybeSleep(Clock::time_point now, bool ring_work) {
  if (sleeping_) return;  // and stays so: DrainRings found no reason to walk the lanes
  poll_ = false;
  if (ports_.rings == nullptr || stopping_ || cursors_.empty()) return;
  if (ring_work || now - last_ring_record_ < std::chrono::microseconds(config_.ring_poll_us)) {
    poll_ = true;
    return;
  }
  // Say "asleep" in every ring, then look at every lane once more: a
  // producer that published before seeing the doorbell set is found here;
  // one that published after sees it and rings (ring::TakeDoorbell).
  const auto& entries = ports_.rings->entries();
  for (const auto& e : entries) e.ring.doorbell().store(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  held_at_sleep_.assign(entries.size(), false);
  for (size_t r = 0; r < entries.size() && r < cursors_.size(); ++r) {
    for (uint32_t l = 0; l < cursors_[r].size(); ++l) {
      const LaneCursor& c = cursors_[r][l];
      if (c.broken || c.in_writing) continue;  // the write's end has the lanes walked (RingsCommitted)
      if (entries[r].ring.owner(l).load(std::memory_order_relaxed) == 0) continue;
      if (!RingAdmits(entries[r].uid)) {
        held_at_sleep_[r] = true;  // over its share: walked again once it has room (DrainRings)
        continue;
      }
      if (entries[r].ring.tail(l).load(std::memory_order_acquire) != c.read) {
        for (const auto& e : entries) e.ring.doorbell().store(0, std::memory_order_relaxed);
        poll_ = true;
        return;
      }
    }
  }
  sleeping_ = true;
  next_ring_walk_ = now + kOwnerCheckInterval;
  ports_.rings->Sleep();
}

}  // namespace postspool::daemon
