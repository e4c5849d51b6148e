// Ingest: the daemon's decisions between a post arriving and its
// acknowledgement. request → framing and verifier → validation (the one
// ValidatePost shared with the client library) → origin stamped from the
// socket credentials or the spool file's owner → group-commit batch →
// journal write (and fdatasync) → acknowledgement; spool adoption; the disk
// quota and the per-uid shares; the dedupe set.
//
// It makes no system call itself: events come from an IoLoop (io_loop.h),
// and everything it does goes through the IoLoop (acks, journal writes and
// syncs, closing connections) and the ports (ports.h: clock, journal, spool
// directory). The daemon wires it to real ones (daemon.cc); the simulation
// (tests/sim) to simulated ones that inject faults.
//
// Never blocks, never does unbounded work in one round: a request is
// handled in time linear in its size; adoption hands out at most one
// batch per round and reads at most spool_read_bytes_max bytes; the
// directory scan examines at most spool_scan_entries_max entries.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "backoff.h"
#include "config.h"
#include "flatbuffers/flatbuffers.h"
#include "io_loop.h"
#include "log.h"
#include "log_limiter.h"
#include "metrics.h"
#include "ports.h"
#include "post.h"
#include "recent_ids.h"
#include "socket_protocol.h"
#include "spool_adopter.h"

namespace postspool::daemon {

class Ingest final : public IoCallbacks {
 public:
  struct Ports {
    ClockPort* clock = nullptr;
    JournalPort* journal = nullptr;
    SpoolDir* spool = nullptr;
    RingPort* rings = nullptr;  // null: no rings
  };
  // Everything borrowed must outlive the Ingest. `hostname` is stamped into
  // every post; `dedupe_key` keys the dedupe set's hash (random per start,
  // so that nobody can choose ids that collide); `seed` drives the
  // back-off jitter.
  Ingest(const Config& config, Metrics* metrics, Ports ports, std::string hostname,
         const RecentIds::Key& dedupe_key, uint64_t seed);

  // The loop must be attached before it runs.
  void Attach(IoLoop* loop) { loop_ = loop; }
  // Remembers ids journaled before this start (see RecentIds).
  void RememberJournaled(const PostId& id) { recent_ids_.Add(id); }
  // Calls `handler` when `fd` is readable (the loop watches it).
  Status WatchReadable(int fd, std::function<void()> handler);
  // Called at the end of every round with the time, after the ingest
  // work: the wiring's periodic work (metrics file, watchdog).
  void set_round_hook(std::function<void(Clock::time_point)> hook) { round_hook_ = std::move(hook); }

  // Stops accepting; what arrived is journaled and acknowledged, then
  // done() turns true.
  void Stop();
  bool stopping() const { return stopping_; }
  // True while the rings are busy: the next round must not wait for events
  // (RunOnce(0)), since producers do not ring the doorbell while the loop
  // is awake.
  bool wants_poll() const { return poll_; }
  bool done() const { return done_; }

  // The disk the quota counts (journal + spool + quarantine + batches).
  uint64_t DiskBytes() const;
  uint64_t UidBytes(uid_t uid) const;
  // For status: the uids using the most disk (at most `uids_max`, largest
  // first, as UidBytes counts them) and the spool segments not yet adopted.
  struct Usage {
    std::vector<std::pair<uid_t, uint64_t>> uids;
    size_t uids_total = 0;
    size_t spool_segments_waiting = 0;
  };
  void GetUsage(size_t uids_max, Usage* out) const;

  // IoCallbacks.
  void OnAccept(int fd, const PeerCred& peer) override;
  void OnAcceptError(int error) override;
  void OnPacket(int fd, std::span<const std::byte> packet, bool truncated) override;
  void OnConnectionClosed(int fd, int error) override;
  void OnReadable(int fd) override;
  void OnIoDone(uint64_t cookie, int64_t result) override;
  void OnSent(uint64_t cookie, bool sent) override;
  void OnRoundEnd() override;

 private:
  struct Conn {
    uint32_t gen = 0;
    PeerCred peer;
  };
  // Where the records a batch took from a lane end: the lane's head moves
  // there once the batch is journaled.
  struct LaneEnd {
    uint32_t ring;
    uint32_t lane;
    uint64_t end;
  };
  // The daemon's own view of a lane (shared memory is never trusted).
  struct LaneCursor {
    uint64_t head = 0;     // journaled up to here (mirrored to the ring)
    uint64_t read = 0;     // taken into a batch up to here
    bool in_filling = false;
    bool in_writing = false;
    bool broken = false;
    Clock::time_point next_owner_check{};
    // Set by Stop(): what was published when the daemon was asked to stop,
    // and is journaled before it exits (0: nothing).
    uint64_t stop_tail = 0;
    // Records before this position may have been journaled by an earlier
    // run of the daemon (it died before moving the head): they are checked
    // against the ids it journaled. Later ones cannot be, at `accepted`.
    uint64_t recheck_until = 0;
    // The lane is set back to empty (damaged, or freed with a header that
    // someone wrote over): what it held is dropped, and with it what
    // Stop() was waiting for.
    void Reset() {
      head = read = recheck_until = stop_tail = 0;
      broken = false;
    }
  };
  struct PendingAck {
    int fd;
    uint32_t gen;
    uint64_t request_id;
    uint32_t records;   // in the request
    uint32_t first_id;  // the ids of those journaled are Batch::ids[first_id, first_id + taken)
    uint32_t taken;     // records less those journaled already (deduplicated)
  };
  // One group-commit write: the framed records and whom to acknowledge.
  struct Batch {
    std::vector<std::byte> bytes;
    std::vector<PendingAck> acks;
    uint32_t records = 0;
    uint32_t adopted = 0;     // of the records, how many came from the spool
    uint32_t ringed = 0;      // of the records, how many came from rings
    std::vector<PostId> ids;  // of the records, for RecentIds
    std::unordered_map<uid_t, uint64_t> bytes_of;  // per origin uid
    std::vector<LaneEnd> lane_ends;
    void Clear();
  };

  void HandleRequest(int fd, const Conn& conn, std::span<const std::byte> packet, bool truncated);
  void Refuse(int fd, const Conn& conn, const wire::RequestHeader* header, wire::AckStatus status,
              Metrics::Counter* counter, const char* why);
  // Hands an acknowledgement to the loop, which sends it with the round's
  // others and reports it (OnSent). `journaled`: the ids of the posts it
  // acknowledges as journaled, remembered in late_ids_ if it does not reach
  // the client's socket (the client is gone, or gave up on it:
  // DaemonSocket::AwaitAck), which then spools them.
  void SendAck(int fd, uint32_t gen, const wire::Ack& ack,
               std::span<const PostId> journaled = {});
  // An acknowledgement that did not reach its client.
  struct SentAck;
  void AckUndelivered(const SentAck& s);
  // Sends the accepted acknowledgements of writing_ (journaled, or all of
  // its records were already).
  void AcknowledgeWriting();
  // Stamps the trusted origin (and the default base URL) into a verified
  // post, validates it and appends it, framed, to `batch`. Not ok (with
  // the reason) if the post may not be accepted.
  Status Stamp(std::span<const std::byte> payload, uid_t uid, std::optional<gid_t> gid,
               std::optional<pid_t> pid, Batch* batch, bool remember_id = true);
  void FeedAdoption(Clock::time_point now);
  // Rings (ingest_ring.cc).
  void HandleRingRequest(int fd, const Conn& conn, const wire::RequestHeader& h);
  void SyncRingCursors();
  // Takes what the lanes hold into filling_, fairly; true if it took any.
  bool DrainRings(Clock::time_point now);
  bool DrainLane(uint32_t r, uint32_t l, uid_t uid, Clock::time_point now);
  void LaneDamaged(uint32_t r, uint32_t l, const char* why);
  void MaybeReclaimLane(uint32_t r, uint32_t l, uint64_t owner, Clock::time_point now);
  void MaybeTidyFreeLane(uint32_t r, uint32_t l, Clock::time_point now);
  bool RingAdmits(uid_t uid) const;
  // Counts the posts the uid's processes reported they could not make.
  void TakeDroppedPosts(const ring::Ring& ring, uid_t uid);
  void RingsToWriting();
  void RingsCommitted();
  void RingsFailed();
  void WakeRings();
  // Stop(): notes each lane's tail; RingsFlushed() once all is read up to it.
  void NoteRingTailsAtStop();
  bool RingsFlushed() const;
  void MaybeSleep(Clock::time_point now, bool ring_work);
  void StartWrite();
  // Reserves the journal slot of writing_ and submits its write.
  void SubmitBatchWrite();
  void BatchCommitted();
  void BatchFailed(const std::string& why);
  void ForgetConfirmed();
  void LogLimited(LogLimiter* limiter, LogLevel level, const char* format, ...)
      __attribute__((format(printf, 4, 5)));

  const Config& config_;
  Metrics* metrics_;
  Ports ports_;
  IoLoop* loop_ = nullptr;
  SpoolAdopter adopter_;
  RecentIds recent_ids_;
  // The ids of socket posts journaled whose acknowledgement did not reach
  // the client: it spools them. Few, so they are remembered far longer
  // than recent_ids_ would (a quarter of dedupe_window_posts of them), and
  // each is forgotten once its spooled copy is dropped.
  RecentIds late_ids_;
  std::string hostname_;
  flatbuffers::FlatBufferBuilder builder_;
  std::vector<std::byte> stamp_buffer_;
  std::function<void(Clock::time_point)> round_hook_;
  std::unordered_map<int, std::function<void()>> readable_;

  // Acknowledgements handed to the loop and not yet reported, in the order
  // they were sent (the cookie of sent_[i] is sent_first_ + i), and the ids
  // of the posts they acknowledge as journaled (sent_ids_[k] is the
  // (sent_ids_first_ + k)-th such id): a round's worth.
  struct SentAck {
    int fd;
    uint32_t gen;
    uint64_t ids_begin;
    uint32_t ids;
    bool reported;
  };
  std::deque<SentAck> sent_;
  uint64_t sent_first_ = 0;
  std::deque<PostId> sent_ids_;
  uint64_t sent_ids_first_ = 0;

  std::unordered_map<int, Conn> conns_;
  std::unordered_map<uid_t, uint32_t> conns_of_;
  uint32_t next_gen_ = 0;

  Batch filling_;
  Batch writing_;
  bool write_in_flight_ = false;  // writing_ is written, synced, or waits for its segment
  JournalPort::Slot slot_;
  uint64_t adopted_uncommitted_ = 0;
  // Adoption pauses after a failed journal write, with a back-off, so that
  // a full or broken disk is not hammered.
  Backoff adoption_backoff_;
  Clock::time_point adoption_resume_at_{};

  // Bytes of unconfirmed posts in the journal, per origin uid: per journal
  // segment, so that they are given back when the forwarder's watermark
  // passes the segment.
  std::map<uint64_t, std::unordered_map<uid_t, uint64_t>> segment_bytes_of_;
  std::unordered_map<uid_t, uint64_t> journal_bytes_of_;

  bool stopping_ = false;
  bool done_ = false;

  std::vector<std::vector<LaneCursor>> cursors_;  // per ring, per lane
  size_t ring_turn_ = 0;  // where the next round's fair walk over the lanes starts
  std::vector<std::byte> ring_buffer_;
  Clock::time_point last_ring_record_{};
  bool poll_ = false;
  // The rings sleep (doorbells set: a producer that publishes rings) across
  // rounds until DrainRings has a reason to walk their lanes again.
  bool sleeping_ = false;
  bool rings_changed_ = false;  // a reason: a ring handed out, a write of lane records ended
  Clock::time_point next_ring_walk_{};  // a reason: the lanes' owners are due to be looked at
  std::vector<bool> held_at_sleep_;  // per ring: its uid's share held its lanes back
  LogLimiter ring_limiter_;
  LogLimiter dropped_limiter_;

  LogLimiter refuse_limiter_;
  LogLimiter journal_limiter_;
  LogLimiter invalid_limiter_;
};

}  // namespace postspool::daemon
