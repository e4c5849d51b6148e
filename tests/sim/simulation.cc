#include "simulation.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "config.h"
#include "ingest.h"
#include "journal.h"
#include "journal_port.h"
#include "little_endian.h"
#include "log.h"
#include "metrics.h"
#include "post.h"
#include "recent_ids.h"
#include "segment_format.h"
#include "segment_writer.h"
#include "sim_forwarder.h"
#include "sim_io_loop.h"
#include "sim_storage.h"
#include "sim_node.h"
#include "sim_rings.h"
#include "sim_spool.h"
#include "socket_protocol.h"

namespace postspool::sim {
namespace {

using namespace std::chrono_literals;

// The checker's view of the journal: the real code, on a storage that
// injects no fault and is no crash point.
std::vector<uint64_t> ListJournalSegments(SimNode* node) {
  SimStorage oracle(node, /*oracle=*/true);
  std::vector<uint64_t> seqs;
  int dirfd = -1;
  if (!oracle.OpenDirectory(SimStorage::kJournalPath, &dirfd).ok()) return seqs;
  daemon::StorageFd dir(&oracle, dirfd);
  daemon::ListJournalSegments(dir.get(), &seqs, &oracle).IgnoreError();
  return seqs;
}

// What a restart would load.
Status LoadCheckpoint(SimNode* node, JournalPosition* pos) {
  SimStorage oracle(node, /*oracle=*/true);
  int dirfd = -1;
  if (Status s = oracle.OpenDirectory(SimStorage::kJournalPath, &dirfd); !s.ok()) return s;
  daemon::StorageFd dir(&oracle, dirfd);
  return daemon::Checkpoint::Load(dir.get(), pos, &oracle);
}

// Every valid record of a file's current bytes (from `offset`), as the
// real reader yields them, with where it starts and ends. False if the
// header is unreadable.
bool ReadRecords(const std::vector<std::byte>& bytes, uint64_t offset,
                 const std::function<void(const fb::Post&, uint64_t at, uint64_t next)>& f) {
  segment::MemorySource source(bytes);
  segment::ReaderOptions options;
  options.verify_payload = VerifyPostPayload;
  options.start_offset = std::max<uint64_t>(offset, segment::kHeaderBytes);
  std::unique_ptr<segment::SegmentReader> reader;
  if (!segment::SegmentReader::Open(&source, options, &reader).ok()) return false;
  segment::Record rec;
  while (reader->Next(&rec) == segment::SegmentReader::Result::kRecord) {
    f(PostFromPayload(rec.payload), rec.position.offset, rec.next_offset);
  }
  return true;
}
using std::chrono::milliseconds;

// Once faults stop, everything must be delivered within this (virtual) time:
// it covers the longest back-offs (adoption 10 s, sealing 5 s, the broker's
// reconnects and nack retries at most reconnect_delay_max_ms) several times.
constexpr auto kDrainMsMax = 120s;
// SpoolAdopter opens at most this many segments per round
// (kOpenAttemptsPerCall in spool_adopter.cc).
constexpr uint64_t kOpensPerRoundMax = 16;
// A SegmentReader reads through a window of four largest records.
constexpr uint64_t kReaderWindowBytes = 4 * segment::RecordBytes(segment::kRecordPayloadMax);
constexpr gid_t kSpoolGid = 50;
// The real loop's timeout (daemon.cc kRoundTimeoutMs): a loop that sleeps
// runs a round at the latest this long after its last one.
constexpr auto kRoundTimeout = 50ms;
// After a refused ring, posts skip the ring this long (RingClient::kRetryAfter
// is 5 s; shorter here so that a run asks again).
constexpr auto kRingRetryAfter = 300ms;
constexpr uid_t kHostileUid = 2000;

// The client library's socket back-off (client-lib/daemon_socket.h).
constexpr auto kBackOffInitial = 1000ms;
constexpr auto kBackOffMax = 5000ms;

struct PostInfo {
  uint32_t client = 0;
  uid_t uid = 0;
  std::string rel_path;
  bool hostile = false;
  bool acknowledged = false;
  bool via_spool = false;
  bool failed = false;
  // How the daemon could have come by it: its socket request was sent whole
  // (and not refused by the daemon's answer), its spool record was written
  // whole, or its ring record's tail was stored (`ring`). A post published
  // without one of these was never handed over, and must not be published:
  // a torn record, a refused request, a record copied into a lane but never
  // committed.
  bool sent = false;
  bool refused = false;
  bool spool_written = false;
  // A journal copy was hit by injected disk damage: the contract holds only
  // while the disk survives, so the post is exempt (and counted).
  bool damaged = false;
  uint32_t epoch = 0;  // when acknowledged
  // Ring posts: published (the lane's tail stored over the record), by
  // which process incarnation, and whether a fault excuses its loss (its
  // lane was scribbled over, or tmpfs went with a power loss).
  bool ring = false;
  bool ring_excused = false;
  // Its lane's header was scribbled over after it was published: the
  // daemon may take what is left of the lane's old records for new ones
  // (a lane reset while its producer still writes, a tail moved forward)
  // and journal it again. Exempt from ring_journaled_once only.
  bool ring_reread_excused = false;
  uint64_t incarnation = 0;
};

// A lane of a ring: (uid, lane index).
using LaneKey = std::pair<uid_t, uint32_t>;

// One process of the running daemon: what a crash destroys.
struct DaemonProcess {
  daemon::Metrics metrics;
  daemon::JournalUsage usage;
  SimCommits commits;
  // The journal: the real JournalWriter on this process's SimStorage.
  std::unique_ptr<SimStorage> storage;
  std::unique_ptr<daemon::JournalWriter> writer;
  std::unique_ptr<daemon::WriterJournalPort> journal;
  std::unique_ptr<SimSpoolDir> spool;
  std::unique_ptr<daemon::Ingest> ingest;
  std::unique_ptr<SimForwarder> forwarder;
  std::unique_ptr<SimIoLoop> loop;
  std::unique_ptr<SimRingPort> rings;
  bool stopping = false;
  uint64_t journal_errors_at_stop = 0;  // the Ingest's, at SIGTERM
  bool draining = false;  // the ingest is done; the forwarder drains
  Clock::time_point drain_deadline{};
  JournalPosition drain_target;

  ~DaemonProcess() {
    // The Ingest (and its adopter's open spool file) first, then what it
    // borrowed.
    ingest.reset();
    forwarder.reset();
    loop.reset();
    journal.reset();
    writer.reset();
    spool.reset();
    rings.reset();
    storage.reset();
  }
};

class World;

class Client {
 public:
  Client(World* w, uint32_t index, uid_t uid, bool hostile, SimRng rng);
  void Step(Clock::time_point now, bool producing);
  bool idle() const { return state_ == State::kIdle; }
  // The process dies (kill -9, or the node lost power).
  void Die(bool power_loss);

 private:
  enum class State { kIdle, kAwaitAck, kSlowAppend };
  void StartPost(Clock::time_point now);
  void StartHostile(Clock::time_point now);
  void HandleAck(const std::vector<std::byte>& raw, Clock::time_point now);
  void SocketFailed(bool back_off, Clock::time_point now);
  void ToSpool(Clock::time_point now);
  void Acknowledge(bool via_spool);
  void FailPosts();
  // The first `bytes` of records_ are in the spool segment: the posts whose
  // records they hold whole were handed over (PostInfo::spool_written).
  void SpoolWritten(size_t bytes);
  void CloseSocket();
  std::vector<std::byte> MakeRecords(uint32_t n, bool invalid);

  World* w_;
  uint32_t index_;
  uid_t uid_;
  pid_t pid_;
  bool hostile_;
  SimRng rng_;
  // Parameters of the process (ClientOptions).
  uint32_t budget_ms_;
  uint32_t socket_share_pct_;
  uint32_t interval_ms_;
  uint32_t batch_max_;
  size_t receive_max_;
  bool sync_spool_;
  // DaemonSocket.
  uint64_t sock_ = 0;
  uint64_t next_request_id_ = 1;
  Clock::time_point retry_after_{};
  Clock::duration back_off_{0};
  // Spool.
  std::unique_ptr<SimSpoolWriter> spool_;
  // The post in progress.
  State state_ = State::kIdle;
  std::vector<PostId> posts_;
  std::vector<std::byte> records_;
  std::vector<size_t> record_ends_;  // where each of records_ ends in it
  uint64_t request_id_ = 0;
  Clock::time_point socket_deadline_{};
  Clock::time_point append_done_at_{};
  Clock::time_point next_post_at_{};
  uint64_t seq_ = 0;
};

// A process of a benign uid that posts through its uid's shared-memory ring
// as client-lib's RingClient does: it asks the daemon for the ring over the
// socket once, claims a lane, and then posts one record per call through
// the real ring::ClaimLane / Append / TakeDoorbell, one step per round, so
// that it can die between any two of them (after the claim, in the middle
// of copying the record, after the tail store but before the doorbell,
// while it waits for the head at `synced`). A post is published when the
// tail is stored; at `accepted` that is its acknowledgement, at `synced`
// the lane's head passing it is.
class RingProducer {
 public:
  RingProducer(World* w, uint32_t index, uid_t uid, SimRng rng);
  void Step(Clock::time_point now, bool producing);
  // Runs while the daemon is in the middle of a round (the processes are
  // concurrent): a copy and its doorbell, or a pending doorbell, at once.
  void Preempt(Clock::time_point now);
  bool idle() const { return state_ == State::kIdle; }
  // The process dies (kill -9, or the node lost power).
  void Die(bool power_loss);
  uint32_t index() const { return index_; }
  bool holds(LaneKey k) const { return have_lane_ && k.first == uid_ && k.second == lane_; }
  // Between its tail store and its doorbell: it is about to ring.
  bool ringing(LaneKey k) const { return holds(k) && state_ == State::kDoorbell; }

 private:
  enum class State { kIdle, kAttachWait, kClaim, kCopy, kDoorbell, kAwaitHead };
  void NewIncarnation();
  void FailPost(const char* why);
  void DieMidCopy();
  void LetGoOfLane();
  void Published(Clock::time_point now);
  void Acknowledge();

  World* w_;
  uint32_t index_;
  uid_t uid_;
  pid_t pid_;
  SimRng rng_;
  uint32_t interval_ms_;
  uint32_t budget_ms_;
  uint64_t start_ticks_ = 0;
  uint64_t identity_ = 0;
  uint64_t incarnation_ = 0;
  ring::Ring ring_;
  bool have_lane_ = false;
  uint32_t lane_ = 0;
  uint64_t tail_ = 0;
  uint64_t end_ = 0;  // the post's end in the lane, once published
  int attempt_ = 0;
  uint64_t sock_ = 0;
  uint64_t next_request_id_ = 1;
  Clock::time_point retry_after_{};
  Clock::time_point deadline_{};
  Clock::time_point next_post_at_{};
  State state_ = State::kIdle;
  PostId post_{};
  std::vector<std::byte> record_;
  uint64_t seq_ = 0;
};

class World {
 public:
  explicit World(const SimOptions& options);
  SimResult Run();

  // For clients.
  SimNode node_;
  SimStats stats_;
  daemon::Config config_;
  SimRng rng_;
  std::map<PostId, PostInfo> posts_;
  std::vector<uid_t> benign_uids_;
  uint32_t epoch_ = 0;
  std::set<uint32_t> power_loss_epochs_;  // epochs that began with a power loss
  std::set<uint32_t> checkpoint_held_epochs_;   // ... while a damaged segment held the checkpoint
  std::set<uint32_t> checkpoint_fault_epochs_;  // ... with a checkpoint write failed
  bool faults_on_ = true;
  uint32_t client_kill_ppm_ = 0;
  uint32_t slow_writer_ppm_ = 0;
  uint32_t stopped_writer_ppm_ = 0;
  uint64_t spool_segment_bytes_max_ = 16 << 10;
  // The rings: their memory and the process table, which outlive a daemon
  // process (tmpfs, /proc).
  SimRingStore ring_store_;
  uint64_t next_start_ticks_ = 1;
  uint32_t producer_kill_ppm_ = 0;
  uint32_t mid_copy_kill_ppm_ = 0;
  // Lanes scribbled over: the producers that held them then or claimed them
  // since; a post published into such a lane may be lost (excused). The
  // taint ends when the last of them lets go.
  std::map<LaneKey, std::set<uint32_t>> tainted_;
  // Lanes ever scribbled over: their head word is no longer the daemon's
  // cursor, so the stranded check leaves them out.
  std::set<LaneKey> scribbled_;
  // Journal segments DamageJournal made unreadable (a zero-length file, a
  // damaged header) while they held a post the broker had not confirmed:
  // inode -> seq and those posts. The daemon must set them aside, never
  // delete them while one of those posts is unconfirmed (the forwarder may
  // have read them before the damage: confirmed, the segment may go).
  struct Unreadable {
    uint64_t seq = 0;
    std::vector<PostId> unconfirmed;
  };
  std::map<SimFs::Ino, Unreadable> unreadable_segments_;
  // Journal segments whose fdatasync failed at a start: the ids in them
  // were not remembered (Daemon::RememberJournaledIds).
  std::set<uint64_t> unremembered_segments_;
  void CheckDamagedSegmentsKept(const std::string& when);
  // Posts published into a lane and maybe not journaled yet (end, id), and
  // the last ids published into each lane, journaled or not
  // (ring_reread_excused): at most kLanePostsKept per lane.
  static constexpr size_t kLanePostsKept = 4096;
  std::map<LaneKey, std::deque<std::pair<uint64_t, PostId>>> lane_posts_;
  std::map<LaneKey, std::deque<PostId>> lane_history_;
  // Lanes where a producer died after its tail store and before its
  // doorbell, since the daemon last walked the lanes: nothing wakes the
  // loop for them (rings that sleep stay so across rounds that no doorbell
  // woke; their lanes are walked again within a second, kOwnerCheckInterval).
  std::set<LaneKey> quiet_lanes_;
  // At the last Sleep(): the uids whose quota held their lanes back.
  std::set<uid_t> unadmitted_at_sleep_;
  SimRingPort* ring_port() { return dp_ ? dp_->rings.get() : nullptr; }
  void TaintHolderLeft(LaneKey k, uint32_t producer);
  void TaintHolderCame(LaneKey k, uint32_t producer);
  void NotePublished(LaneKey k, uint64_t end, PostId id);
  // One more post from `client`, framed, appended to *out.
  PostId MakePost(uint32_t client, uid_t uid, bool hostile, bool invalid, SimRng* rng, uint64_t* seq,
                  std::vector<std::byte>* out);

  void Fail(const std::string& invariant, const std::string& detail);
  void Trace(const char* format, ...) __attribute__((format(printf, 2, 3)));

 private:
  void ChooseConfig();
  void Round(bool producing);
  void StartDaemon();
  void Crash();
  void FinishCleanStop();
  void CheckBoundedWork();
  // Disk damage in a journal segment the daemon is not writing: a flipped
  // byte in a record, a flipped byte in the header, or the file cut to zero
  // length (what a power loss leaves of an unsynced new file).
  void DamageJournal();
  void CheckPublished(const fb::Post& post);
  void CheckRecoverable(const std::string& when);
  // The ids a restarted daemon would still deliver: journal records at or
  // after the stored checkpoint, records of spool segments it adopts.
  std::set<PostId> Recoverable(bool* spool_pending_benign);
  bool Drained(std::string* why);
  // Where the copies of a post are now (for failure reports).
  std::string Locate(PostId id);
  void SetFaults(bool on);
  // Random bytes over a lane (header or data) of some uid's ring, as a
  // process of that uid may write.
  void ScribbleRing();
  // Before a round that only the loop's timeout woke while the ingest
  // sleeps: no lane may hold a published record that nothing will wake the
  // loop for.
  void CheckRingsNotStranded();
  // Ids the lanes hold between their head and tail (what a restarted
  // daemon reads again).
  void RingIds(std::set<PostId>* ids);
  // Lanes owned by a process that is gone or let go of them.
  bool DeadLane(std::string* which);
  // The running daemon's quota holds the uid's lanes back (Ingest::RingAdmits:
  // room for the largest record, on the disk and in the uid's share).
  bool RingHeldByQuota(uid_t uid);
  void CheckRingPosts();
  void NoteRingMetrics(const daemon::Metrics& m);

  SimOptions options_;
  SimResult result_;
  FakeBroker broker_;
  std::unique_ptr<DaemonProcess> dp_;
  std::vector<std::unique_ptr<Client>> clients_;
  std::vector<std::unique_ptr<RingProducer>> producers_;
  Clock::time_point restart_at_{};
  Clock::time_point last_daemon_round_{};
  Clock::time_point full_until_{};
  // Per seed.
  FaultRates fs_rates_;
  BrokerRates broker_rates_;
  SimIoLoop::Options loop_options_;
  uint32_t crash_ppm_ = 0;
  uint32_t kill_per_round_ppm_ = 0;
  uint32_t clean_stop_per_round_ppm_ = 0;
  uint32_t disk_full_per_round_ppm_ = 0;
  uint32_t journal_damage_per_round_ppm_ = 0;
  uint32_t scribble_per_round_ppm_ = 0;
  uint64_t fault_ms_ = 0;
  std::set<std::string> failed_invariants_;
};

// --- Client -------------------------------------------------------------------------

Client::Client(World* w, uint32_t index, uid_t uid, bool hostile, SimRng rng)
    : w_(w), index_(index), uid_(uid), pid_(static_cast<pid_t>(10000 + index)), hostile_(hostile),
      rng_(rng) {
  static constexpr uint32_t kBudgets[] = {1, 2, 5, 10, 50, 200};
  budget_ms_ = kBudgets[rng_.Below(6)];
  static constexpr uint32_t kShares[] = {0, 50, 80, 80, 90};
  socket_share_pct_ = kShares[rng_.Below(5)];
  interval_ms_ = static_cast<uint32_t>(rng_.Range(1, 40));
  batch_max_ = rng_.OneIn(4) ? static_cast<uint32_t>(rng_.Range(2, 4)) : 1;
  receive_max_ = rng_.Range(1, 8);
  sync_spool_ = w_->config_.durability == daemon::Durability::kSynced || rng_.OneIn(4);
  SimSpoolWriter::Options so;
  so.segment_bytes_max = w_->spool_segment_bytes_max_;
  so.sync = sync_spool_;
  spool_ = std::make_unique<SimSpoolWriter>(&w_->node_, uid_, kSpoolGid, so, &rng_);
}

void Client::CloseSocket() {
  if (sock_ != 0) w_->node_.ClientClose(sock_);
  sock_ = 0;
}

void Client::Die(bool power_loss) {
  if (state_ == State::kSlowAppend) {
    // Killed mid-append: part of the record may be in the file.
    const size_t torn = power_loss || rng_.OneIn(2) ? 0 : rng_.Below(records_.size());
    SpoolWritten(spool_->Abort(records_, torn));
  }
  CloseSocket();
  SimSpoolWriter::Options so;
  so.segment_bytes_max = w_->spool_segment_bytes_max_;
  so.sync = sync_spool_;
  spool_ = std::make_unique<SimSpoolWriter>(&w_->node_, uid_, kSpoolGid, so, &rng_);
  state_ = State::kIdle;
  posts_.clear();
  records_.clear();
  retry_after_ = Clock::time_point{};
  back_off_ = Clock::duration{0};
  pid_ += 1000;
}

std::vector<std::byte> Client::MakeRecords(uint32_t n, bool invalid) {
  std::vector<std::byte> out;
  record_ends_.clear();
  for (uint32_t i = 0; i < n; ++i) {
    posts_.push_back(w_->MakePost(index_, uid_, hostile_, invalid, &rng_, &seq_, &out));
    record_ends_.push_back(out.size());
  }
  return out;
}

void Client::SpoolWritten(size_t bytes) {
  for (size_t i = 0; i < posts_.size() && i < record_ends_.size(); ++i) {
    if (record_ends_[i] <= bytes) w_->posts_[posts_[i]].spool_written = true;
  }
}

void Client::Acknowledge(bool via_spool) {
  if (w_->node_.trace) {
    w_->Trace("client %u acknowledged %zu posts from %" PRIu64 " via %s (ino %" PRIu64 ")", index_,
              posts_.size(), posts_.empty() ? 0 : posts_.front().lo, via_spool ? "spool" : "socket",
              via_spool ? spool_->ino() : 0);
  }
  for (const PostId& id : posts_) {
    PostInfo& p = w_->posts_[id];
    p.acknowledged = true;
    p.via_spool = via_spool;
    p.epoch = w_->epoch_;
    ++w_->stats_.posts_acknowledged;
    ++(via_spool ? w_->stats_.posts_acknowledged_spool : w_->stats_.posts_acknowledged_socket);
  }
  posts_.clear();
  records_.clear();
  state_ = State::kIdle;
}

void Client::FailPosts() {
  for (const PostId& id : posts_) {
    w_->posts_[id].failed = true;
    ++w_->stats_.posts_failed;
  }
  posts_.clear();
  records_.clear();
  state_ = State::kIdle;
}

void Client::SocketFailed(bool back_off, Clock::time_point now) {
  CloseSocket();
  if (back_off) {
    back_off_ = back_off_ == Clock::duration{0}
                    ? Clock::duration(kBackOffInitial)
                    : std::min<Clock::duration>(back_off_ * 2, kBackOffMax);
    retry_after_ = now + back_off_;
  }
  ToSpool(now);
}

void Client::ToSpool(Clock::time_point now) {
  if (Status s = spool_->Prepare(records_.size()); !s.ok()) {
    FailPosts();
    return;
  }
  if (w_->faults_on_ && rng_.Ppm(w_->slow_writer_ppm_)) {
    w_->stats_.Fault("spool.slow_writer");
    state_ = State::kSlowAppend;
    append_done_at_ = now + milliseconds(rng_.Range(1, 20));
    return;
  }
  if (w_->faults_on_ && rng_.Ppm(w_->stopped_writer_ppm_)) {
    w_->stats_.Fault("spool.stopped_writer");
    state_ = State::kSlowAppend;
    append_done_at_ = now + milliseconds(rng_.Range(500, 3000));
    return;
  }
  size_t written = 0;
  const Status committed = spool_->Commit(records_, &written);
  SpoolWritten(written);
  if (committed.ok()) {
    Acknowledge(true);
  } else {
    FailPosts();
  }
}

void Client::StartPost(Clock::time_point now) {
  const uint32_t n = static_cast<uint32_t>(rng_.Range(1, batch_max_));
  records_ = MakeRecords(n, false);
  if (socket_share_pct_ == 0 || now < retry_after_) {
    ToSpool(now);
    return;
  }
  SimNode& node = w_->node_;
  std::array<std::byte, wire::kRequestHeaderBytes> header;
  request_id_ = next_request_id_++;
  wire::EncodeRequestHeader(wire::RequestHeader{wire::kProtocolVersion, static_cast<uint16_t>(n),
                                                request_id_},
                            header);
  for (int attempt = 0;; ++attempt) {
    bool fresh = false;
    if (sock_ == 0) {
      const int err = node.Connect(daemon::PeerCred{uid_, uid_, pid_}, receive_max_, &sock_);
      if (err != 0) {
        sock_ = 0;
        SocketFailed(true, now);
        return;
      }
      fresh = true;
    }
    SimSocket* s = node.Socket(sock_);
    if (s->daemon_closed) {  // EPIPE: a kept connection the daemon closed
      CloseSocket();
      if (!fresh && attempt == 0) continue;
      SocketFailed(false, now);
      return;
    }
    if (s->to_daemon.size() >= s->to_daemon_max) {  // EAGAIN, and no room within the budget
      SocketFailed(true, now);
      return;
    }
    std::vector<std::byte> packet(header.begin(), header.end());
    packet.insert(packet.end(), records_.begin(), records_.end());
    s->to_daemon.push_back(std::move(packet));
    for (const PostId& id : posts_) w_->posts_[id].sent = true;
    break;
  }
  state_ = State::kAwaitAck;
  socket_deadline_ = now + std::chrono::microseconds(uint64_t{budget_ms_} * 1000 *
                                                     socket_share_pct_ / 100);
}

void Client::HandleAck(const std::vector<std::byte>& raw, Clock::time_point now) {
  wire::Ack ack;
  if (!wire::DecodeAck(raw, &ack) || ack.request_id != request_id_) {
    SocketFailed(false, now);  // malformed: spooled
    return;
  }
  if (ack.status != wire::AckStatus::kAccepted) {
    // Taken whole or not at all (FORMAT.md): none of them was taken.
    for (const PostId& id : posts_) w_->posts_[id].refused = true;
  }
  switch (ack.status) {
    case wire::AckStatus::kAccepted:
      if (ack.records != posts_.size()) {
        SocketFailed(false, now);
        return;
      }
      back_off_ = Clock::duration{0};
      retry_after_ = Clock::time_point{};
      Acknowledge(false);
      return;
    case wire::AckStatus::kMalformed:
    case wire::AckStatus::kBusy:
      SocketFailed(false, now);
      return;
    case wire::AckStatus::kFull:
      CloseSocket();
      FailPosts();  // not spooled: the spool counts against the same limit
      return;
    case wire::AckStatus::kShuttingDown:
    case wire::AckStatus::kUnavailable:
      SocketFailed(true, now);
      return;
  }
  SocketFailed(false, now);
}

void Client::StartHostile(Clock::time_point now) {
  SimNode& node = w_->node_;
  SimFs& fs = node.fs;
  const uint64_t action = rng_.Below(11);
  const uid_t victim = w_->benign_uids_[rng_.Below(w_->benign_uids_.size())];
  switch (action) {
    case 0:
    case 1: {  // garbage, a damaged record or an invalid post on the socket
      uint64_t id = 0;
      if (node.Connect(daemon::PeerCred{uid_, uid_, pid_}, 1, &id) != 0) return;
      std::vector<std::byte> packet;
      if (action == 0) {
        packet.resize(rng_.Range(1, 64));
        for (auto& b : packet) b = static_cast<std::byte>(rng_.Next());
      } else {
        std::array<std::byte, wire::kRequestHeaderBytes> header;
        wire::EncodeRequestHeader(wire::RequestHeader{wire::kProtocolVersion, 1, 7}, header);
        packet.assign(header.begin(), header.end());
        std::vector<std::byte> rec = MakeRecords(1, rng_.OneIn(2));
        if (rng_.OneIn(2)) rec[rng_.Range(8, rec.size() - 1)] ^= std::byte{0x40};
        packet.insert(packet.end(), rec.begin(), rec.end());
        if (rng_.OneIn(8)) packet.resize(wire::kRequestBytesMax + rng_.Range(1, 4096));  // too long
        posts_.clear();
      }
      node.Socket(id)->to_daemon.push_back(std::move(packet));
      w_->stats_.Fault("hostile.socket_garbage");
      node.ClientClose(id);
      return;
    }
    case 2: {  // a squatter under another uid's current name
      SimFs::Ino ino;
      if (fs.Create(Actor::kClient, kSpoolDir, segment::SpoolCurrentName(victim), uid_, kSpoolGid,
                    true, true, &ino) == 0) {
        w_->stats_.Fault("hostile.squat_current");
        node.spool_changed = true;
      }
      return;
    }
    case 3: {  // a FIFO
      SimFs::Ino ino;
      const std::string name = rng_.OneIn(2) ? segment::SpoolCurrentName(victim)
                                             : segment::SpoolSealedName(uid_, rng_.Next());
      if (fs.Create(Actor::kClient, kSpoolDir, name, uid_, kSpoolGid, true, false, &ino) == 0) {
        w_->stats_.Fault("hostile.fifo");
        node.spool_changed = true;
      }
      return;
    }
    case 4: {  // a hard link to its own segment
      if (!spool_->open()) break;
      if (fs.Link(Actor::kClient, kSpoolDir, segment::SpoolSealedName(uid_, rng_.Next()),
                  spool_->ino()) == 0) {
        w_->stats_.Fault("hostile.hard_link");
        node.spool_changed = true;
      }
      return;
    }
    case 5: {  // a sparse file, and junk under a name that is no segment's
      SimFs::Ino ino;
      const bool sparse = rng_.OneIn(2);
      const std::string name = sparse ? segment::SpoolSealedName(uid_, rng_.Next())
                                      : "junk." + std::to_string(rng_.Below(1000));
      if (fs.Create(Actor::kClient, kSpoolDir, name, uid_, kSpoolGid, true, true, &ino) == 0) {
        fs.Get(ino)->sparse = sparse;
        std::vector<std::byte> junk(rng_.Range(1, 9000), std::byte{0x5a});
        (void)fs.Write(Actor::kClient, ino, 0, junk);
        w_->stats_.Fault(sparse ? "hostile.sparse" : "hostile.junk_name");
        node.spool_changed = true;
      }
      return;
    }
    case 6: {  // garbage bytes in its own segment
      std::vector<std::byte> junk(rng_.Range(1, 300));
      for (auto& b : junk) b = static_cast<std::byte>(rng_.Next());
      if (spool_->Append(junk).ok()) w_->stats_.Fault("hostile.spool_garbage");
      return;
    }
    case 7: {  // a damaged record, or an invalid post, in its own segment
      const bool invalid = rng_.OneIn(2);
      std::vector<std::byte> rec = MakeRecords(1, invalid);
      posts_.clear();
      if (!invalid) rec[rng_.Range(16, rec.size() - 1)] ^= std::byte{0x01};
      if (spool_->Append(rec).ok()) {
        w_->stats_.Fault(invalid ? "hostile.spool_invalid_post" : "hostile.spool_damaged_record");
      }
      return;
    }
    default:
      break;
  }
  StartPost(now);  // an ordinary post (its own files may be quarantined)
}

void Client::Step(Clock::time_point now, bool producing) {
  if (w_->faults_on_ && rng_.Ppm(w_->client_kill_ppm_)) {
    w_->stats_.Fault(state_ == State::kSlowAppend ? "client.killed_mid_append" : "client.killed");
    Die(false);
  }
  switch (state_) {
    case State::kIdle:
      if (producing && now >= next_post_at_) {
        next_post_at_ = now + milliseconds(rng_.Range(0, 2 * interval_ms_));
        if (hostile_) {
          StartHostile(now);
        } else {
          StartPost(now);
        }
      }
      return;
    case State::kAwaitAck: {
      SimSocket* s = w_->node_.Socket(sock_);
      if (!s->to_client.empty()) {
        std::vector<std::byte> raw = std::move(s->to_client.front());
        s->to_client.pop_front();
        HandleAck(raw, now);
      } else if (s->daemon_closed) {
        SocketFailed(false, now);  // closed before the acknowledgement
      } else if (now >= socket_deadline_) {
        SocketFailed(false, now);  // no acknowledgement within the budget
      }
      return;
    }
    case State::kSlowAppend:
      if (now >= append_done_at_) {
        size_t written = 0;
        const Status committed = spool_->Commit(records_, &written);
        SpoolWritten(written);
        if (committed.ok()) {
          Acknowledge(true);
        } else {
          FailPosts();
        }
      }
      return;
  }
}


// --- RingProducer ---------------------------------------------------------------------

RingProducer::RingProducer(World* w, uint32_t index, uid_t uid, SimRng rng)
    : w_(w), index_(index), uid_(uid), pid_(static_cast<pid_t>(20000 + index)), rng_(rng) {
  interval_ms_ = static_cast<uint32_t>(rng_.Range(1, 20));
  static constexpr uint32_t kBudgets[] = {1, 5, 20, 200};
  budget_ms_ = kBudgets[rng_.Below(4)];
  NewIncarnation();
}

void RingProducer::NewIncarnation() {
  start_ticks_ = w_->next_start_ticks_++;
  // Sometimes the same pid again: only the start time tells the owners apart.
  if (!rng_.OneIn(2)) pid_ += 1000;
  identity_ = ring::MakeIdentity(pid_, start_ticks_);
  w_->ring_store_.Started(identity_);
  incarnation_ = (uint64_t{index_} << 32) | start_ticks_;
}

void RingProducer::LetGoOfLane() {
  if (have_lane_) w_->TaintHolderLeft(LaneKey{uid_, lane_}, index_);
  have_lane_ = false;
}

void RingProducer::FailPost(const char* why) {
  // The real client takes the socket or the spool next; those paths are
  // the socket clients' to test. This post is not the ring's.
  w_->stats_.Fault(std::string("ring.unavailable.") + why);
  w_->posts_[post_].failed = true;
  ++w_->stats_.posts_failed;
  record_.clear();
  state_ = State::kIdle;
}

void RingProducer::Die(bool power_loss) {
  if (state_ == State::kDoorbell && have_lane_ && !power_loss) {
    w_->quiet_lanes_.insert(LaneKey{uid_, lane_});
  }
  LetGoOfLane();
  if (sock_ != 0) w_->node_.ClientClose(sock_);
  sock_ = 0;
  w_->ring_store_.Exited(identity_);
  ring_ = ring::Ring();
  state_ = State::kIdle;
  record_.clear();
  retry_after_ = Clock::time_point{};
  NewIncarnation();
}

void RingProducer::DieMidCopy() {
  // The record's bytes (and a wrap marker) are partly in the lane, the
  // tail is not stored: Append does all of it, then the part the process
  // did not get to, and the tail store, are undone.
  const uint64_t size = ring_.lane_bytes();
  const std::vector<std::byte> before(ring_.data(lane_), ring_.data(lane_) + size);
  const uint64_t t0 = tail_;
  if (ring::Append(ring_, lane_, &tail_, record_) == ring::AppendResult::kAppended) {
    const uint64_t cut = t0 + rng_.Below(tail_ - t0);
    for (uint64_t x = cut; x < tail_; ++x) ring_.data(lane_)[x % size] = before[x % size];
    ring_.tail(lane_).store(t0, std::memory_order_release);
    tail_ = t0;
  }
  w_->stats_.Fault("ring.producer_killed_mid_copy");
  Die(false);
}

void RingProducer::Published(Clock::time_point now) {
  (void)now;
  PostInfo& p = w_->posts_[post_];
  p.ring = true;
  p.incarnation = incarnation_;
  ++w_->stats_.ring["posts_published"];
  w_->Trace("producer %u published %" PRIu64 " in lane %u of uid %u (tail %" PRIu64 ")", index_,
            post_.lo, lane_, static_cast<unsigned>(uid_), end_);
  w_->NotePublished(LaneKey{uid_, lane_}, end_, post_);
  if (ring_.durability().load(std::memory_order_relaxed) != ring::kDurabilitySynced) Acknowledge();
}

void RingProducer::Acknowledge() {
  PostInfo& p = w_->posts_[post_];
  if (p.acknowledged) return;
  p.acknowledged = true;
  p.epoch = w_->epoch_;
  ++w_->stats_.posts_acknowledged;
  ++w_->stats_.ring["posts_acknowledged"];
}

void RingProducer::Preempt(Clock::time_point now) {
  if (state_ == State::kCopy) {
    ++w_->stats_.ring["producer_steps_within_a_round"];
    Step(now, false);
  }
  if (state_ == State::kDoorbell) Step(now, false);
}

void RingProducer::Step(Clock::time_point now, bool producing) {
  if (w_->faults_on_ && producing && rng_.Ppm(w_->producer_kill_ppm_)) {
    static const char* kWhere[] = {"idle",        "awaiting_ring",   "before_claim",
                                   "after_claim", "before_doorbell", "awaiting_head"};
    w_->stats_.Fault(std::string("ring.producer_killed_") + kWhere[static_cast<int>(state_)]);
    Die(false);
    return;
  }
  SimNode& node = w_->node_;
  switch (state_) {
    case State::kIdle: {
      if (!producing || now < next_post_at_) return;
      next_post_at_ = now + milliseconds(rng_.Range(0, 2 * interval_ms_));
      // The ring was refused a moment ago: this post would take the socket
      // (the socket clients' path), so none is made.
      if (!ring_.valid() && now < retry_after_) return;
      record_.clear();
      post_ = w_->MakePost(index_, uid_, false, false, &rng_, &seq_, &record_);
      attempt_ = 0;
      if (ring_.valid()) {
        state_ = State::kClaim;
        return;
      }
      // Ask the daemon for the ring (a request with no records).
      if (node.Connect(daemon::PeerCred{uid_, uid_, pid_}, 2, &sock_) != 0) {
        sock_ = 0;
        retry_after_ = now + kRingRetryAfter;
        return FailPost("no_daemon");
      }
      std::array<std::byte, wire::kRequestHeaderBytes> header;
      wire::EncodeRequestHeader(wire::RequestHeader{wire::kProtocolVersion, 0, next_request_id_++},
                                header);
      node.Socket(sock_)->to_daemon.emplace_back(header.begin(), header.end());
      deadline_ = now + milliseconds(budget_ms_);
      state_ = State::kAttachWait;
      return;
    }
    case State::kAttachWait: {
      SimSocket* s = node.Socket(sock_);
      bool accepted = false;
      if (!s->to_client.empty()) {
        wire::Ack ack;
        accepted = wire::DecodeAck(s->to_client.front(), &ack) &&
                   ack.status == wire::AckStatus::kAccepted;
      } else if (!s->daemon_closed && now < deadline_) {
        return;
      }
      node.ClientClose(sock_);
      sock_ = 0;
      if (accepted) ring_ = w_->ring_store_.Get(uid_);  // the descriptor the daemon passed
      if (!ring_.valid()) {
        retry_after_ = now + kRingRetryAfter;
        return FailPost("refused");
      }
      state_ = State::kClaim;
      return;
    }
    case State::kClaim:
      if (!have_lane_) {
        if (!ring::ClaimLane(ring_, identity_, static_cast<uint32_t>(pid_), &lane_, &tail_)) {
          return FailPost("no_free_lane");
        }
        have_lane_ = true;
        w_->TaintHolderCame(LaneKey{uid_, lane_}, index_);
      }
      state_ = State::kCopy;
      return;
    case State::kCopy: {
      if (w_->faults_on_ && producing && rng_.Ppm(w_->mid_copy_kill_ppm_)) return DieMidCopy();
      switch (ring::Append(ring_, lane_, &tail_, record_)) {
        case ring::AppendResult::kAppended:
          end_ = tail_;
          Published(now);
          state_ = State::kDoorbell;
          return;
        case ring::AppendResult::kFull:
          return FailPost("lane_full");
        case ring::AppendResult::kTooBig:
          return FailPost("too_big");
        case ring::AppendResult::kBroken:
          w_->stats_.Fault("ring.lane_broken_seen_by_producer");
          ring::ReleaseLane(ring_, lane_, identity_);
          LetGoOfLane();
          if (attempt_++ == 0) {
            state_ = State::kClaim;
            return;
          }
          return FailPost("lanes_damaged");
      }
      return;
    }
    case State::kDoorbell: {
      SimRingPort* port = w_->ring_port();
      const bool rang = ring::TakeDoorbell(ring_);
      w_->Trace("producer %u: doorbell %s", index_, rang ? "rung" : "not set");
      if (rang) {
        ++w_->stats_.ring["doorbells_rung"];
        if (port != nullptr) port->Ring();  // FUTEX_WAKE
      } else if (port != nullptr && port->asleep_unrung()) {
        w_->Fail("ring_no_lost_wakeup",
                 "producer " + std::to_string(index_) + " published into lane " +
                     std::to_string(lane_) + " of uid " + std::to_string(uid_) +
                     " while the ingest sleeps, and found the doorbell not set");
      }
      if (ring_.durability().load(std::memory_order_relaxed) == ring::kDurabilitySynced) {
        deadline_ = now + milliseconds(budget_ms_);
        state_ = State::kAwaitHead;
        return;
      }
      state_ = State::kIdle;
      return;
    }
    case State::kAwaitHead: {
      const uint64_t head = ring_.head(lane_).load(std::memory_order_acquire);
      if (head >= end_ && head - end_ < ring_.lane_bytes()) {
        Acknowledge();
        state_ = State::kIdle;
      } else if (now >= deadline_) {
        // kNotSynced: the real client spools a copy; this one leaves it to
        // the ring (it was published, so it must arrive all the same).
        w_->stats_.Fault("ring.not_synced_within_budget");
        state_ = State::kIdle;
      }
      return;
    }
  }
}

// --- World ----------------------------------------------------------------------------

std::string Hex(PostId id) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%016" PRIx64 "-%" PRIu64, id.hi, id.lo);
  return buf;
}

World::World(const SimOptions& options)
    : node_(SimRng(options.seed ^ 0x6a09e667f3bcc908ull), &stats_),
      rng_(options.seed),
      options_(options),
      broker_(SimRng(options.seed ^ 0xbb67ae8584caa73bull), &stats_) {
  result_.seed = options.seed;
}

PostId World::MakePost(uint32_t client, uid_t uid, bool hostile, bool invalid, SimRng* rng,
                       uint64_t* seq, std::vector<std::byte>* out) {
  flatbuffers::FlatBufferBuilder builder(512);
  PostData p;
  p.id = PostId{(uint64_t{client} << 32) | 0x5151, ++*seq};
  p.pub_time_ns = 1700000000000000000 + static_cast<int64_t>(*seq);
  if (!rng->OneIn(4)) p.base_url = "sftp://node/";
  p.rel_path = "u" + std::to_string(uid) + "/c" + std::to_string(client) + "/p" + std::to_string(*seq);
  if (invalid) p.rel_path += std::string(1, '\0');  // ValidatePost refuses a NUL
  p.size = static_cast<int64_t>(rng->Below(1 << 20));
  p.mode = 0644;
  if (rng->OneIn(3)) p.extras.emplace_back("pad", std::string(rng->Range(1, 900), 'x'));
  if (rng->OneIn(4)) p.extras.emplace_back("pad2", std::string(rng->Range(1, 1000), 'y'));
  BuildPost(p, &builder);
  const auto span = builder.GetBufferSpan();
  if (!segment::AppendRecord(std::as_bytes(std::span(span.data(), span.size())), out).ok()) {
    std::abort();
  }
  PostInfo& info = posts_[p.id];
  info.client = client;
  info.uid = uid;
  info.rel_path = p.rel_path;
  info.hostile = hostile;
  ++stats_.posts_made;
  return p.id;
}

void World::TaintHolderCame(LaneKey k, uint32_t producer) {
  auto it = tainted_.find(k);
  if (it != tainted_.end()) it->second.insert(producer);
}

void World::TaintHolderLeft(LaneKey k, uint32_t producer) {
  auto it = tainted_.find(k);
  if (it == tainted_.end()) return;
  it->second.erase(producer);
  if (it->second.empty()) tainted_.erase(it);
}

void World::NotePublished(LaneKey k, uint64_t end, PostId id) {
  auto& q = lane_posts_[k];
  const ring::Ring r = ring_store_.Get(k.first);
  const uint64_t head = r.valid() ? r.head(k.second).load(std::memory_order_relaxed) : 0;
  while (!q.empty() && (q.front().first <= head || q.size() > kLanePostsKept)) q.pop_front();
  q.emplace_back(end, id);
  auto& h = lane_history_[k];
  if (h.size() == kLanePostsKept) h.pop_front();
  h.push_back(id);
  if (tainted_.count(k) != 0) posts_[id].ring_excused = true;
}

void World::ScribbleRing() {
  const std::vector<uid_t> uids = ring_store_.uids();
  if (uids.empty()) return;
  const uid_t uid = uids[rng_.Below(uids.size())];
  const ring::Ring r = ring_store_.Get(uid);
  if (!r.valid()) return;
  const std::span<std::byte> mem = ring_store_.Memory(uid);
  const uint32_t lane = static_cast<uint32_t>(rng_.Below(r.lane_count()));
  const uint64_t lane_off = r.data(lane) - mem.data() - ring::kLaneHeaderBytes;
  const bool header = rng_.OneIn(3);
  uint64_t off, len;
  if (header) {
    // Mostly the words the two sides read: owner, tail, state, head.
    static constexpr uint64_t kWords[] = {ring::kLaneOwner, ring::kLaneTail, ring::kLaneState,
                                          ring::kLaneHead};
    off = lane_off + (rng_.OneIn(4) ? rng_.Below(ring::kLaneHeaderBytes - 8) : kWords[rng_.Below(4)]);
    len = rng_.Range(1, 8);
  } else {
    off = lane_off + ring::kLaneHeaderBytes + rng_.Below(r.lane_bytes());
    len = std::min<uint64_t>(rng_.Range(1, 64), lane_off + ring::kLaneHeaderBytes + r.lane_bytes() - off);
  }
  for (uint64_t i = 0; i < len; ++i) mem[off + i] = static_cast<std::byte>(rng_.Next());
  const LaneKey k{uid, lane};
  scribbled_.insert(k);
  // The lane's posts not yet journaled may be lost, and so may those of
  // whoever holds it until the last of them lets go.
  uint64_t hit = 0;
  for (const auto& [end, id] : lane_posts_[k]) {
    PostInfo& p = posts_[id];
    if (!p.ring_excused) ++hit;
    p.ring_excused = true;
  }
  lane_posts_[k].clear();
  if (header) {
    for (const PostId& id : lane_history_[k]) posts_[id].ring_reread_excused = true;
  }
  std::set<uint32_t> holders;
  for (const auto& pr : producers_) {
    if (pr->holds(k)) holders.insert(pr->index());
  }
  if (!holders.empty()) tainted_[k].insert(holders.begin(), holders.end());
  stats_.Fault(header ? "ring.scribble_lane_header" : "ring.scribble_lane_data");
  stats_.Fault("exempt.ring_posts_in_scribbled_lanes", hit);
  Trace("scribbled %" PRIu64 " bytes over lane %u of uid %u's ring (%s)", len, lane,
        static_cast<unsigned>(uid), header ? "header" : "data");
}

void World::CheckRingsNotStranded() {
  SimRingPort* port = ring_port();
  for (const auto& e : port->rings()) {
    if (unadmitted_at_sleep_.count(e.uid) != 0) continue;  // the quota holds them back
    for (uint32_t l = 0; l < e.ring.lane_count(); ++l) {
      const LaneKey k{e.uid, l};
      if (e.ring.owner(l).load(std::memory_order_relaxed) == 0) continue;
      if (e.ring.state(l).load(std::memory_order_relaxed) != ring::kLaneOk) continue;
      if (tainted_.count(k) != 0 || quiet_lanes_.count(k) != 0 || scribbled_.count(k) != 0) continue;
      bool ringing = false;
      for (const auto& pr : producers_) ringing = ringing || pr->ringing(k);
      if (ringing) continue;
      const uint64_t tail = e.ring.tail(l).load(std::memory_order_relaxed);
      const uint64_t head = e.ring.head(l).load(std::memory_order_relaxed);
      if (tail != head) {
        Fail("ring_no_lost_wakeup",
             "the ingest sleeps, nobody rang, and lane " + std::to_string(l) + " of uid " +
                 std::to_string(e.uid) + " holds published records it has not read (head " +
                 std::to_string(head) + ", tail " + std::to_string(tail) + ")");
        return;
      }
    }
  }
}

void World::RingIds(std::set<PostId>* ids) {
  std::vector<std::byte> buffer;
  for (uid_t uid : ring_store_.uids()) {
    const ring::Ring r = ring_store_.Get(uid);
    for (uint32_t l = 0; r.valid() && l < r.lane_count(); ++l) {
      if (r.owner(l).load(std::memory_order_relaxed) == 0) continue;
      const uint64_t head = r.head(l).load(std::memory_order_relaxed);
      uint64_t read = head;
      uint64_t tail = 0;
      if (!ring::LoadTail(r, l, head, read, &tail)) continue;
      for (int n = 0; n < 100000; ++n) {
        std::span<const std::byte> payload;
        const char* why = nullptr;
        if (ring::ReadRecord(r, l, &read, tail, &buffer, &payload, &why) != ring::ReadResult::kRecord) {
          break;
        }
        if (!VerifyPostPayload(payload)) break;
        const fb::PostId* id = PostFromPayload(payload).id();
        ids->insert(PostId{id->hi(), id->lo()});
      }
    }
  }
}

bool World::RingHeldByQuota(uid_t uid) {
  if (!dp_) return false;
  const uint64_t largest = segment::RecordBytes(segment::kRecordPayloadMax);
  return dp_->ingest->DiskBytes() + largest > config_.disk_bytes_max ||
         dp_->ingest->UidBytes(uid) + largest > config_.DiskBytesPerUidMax();
}

bool World::DeadLane(std::string* which) {
  for (uid_t uid : ring_store_.uids()) {
    if (RingHeldByQuota(uid)) continue;  // cannot drain, so cannot be freed
    const ring::Ring r = ring_store_.Get(uid);
    for (uint32_t l = 0; r.valid() && l < r.lane_count(); ++l) {
      const uint64_t owner = r.owner(l).load(std::memory_order_relaxed);
      const uint64_t head = r.head(l).load(std::memory_order_relaxed);
      const uint64_t tail = r.tail(l).load(std::memory_order_relaxed);
      if (owner == 0 && (head != tail || tail % segment::kRecordAlign != 0 ||
                         r.state(l).load(std::memory_order_relaxed) != ring::kLaneOk)) {
        // Free, but a producer's claim hands it back (a scribbled word).
        // The daemon must then repair it: a probe claims as a producer
        // would, and lets go of whatever lane it got.
        *which = "lane " + std::to_string(l) + " of uid " + std::to_string(uid) +
                 " is free but never claimable (head " + std::to_string(head) + ", tail " +
                 std::to_string(tail) + ", state " +
                 std::to_string(r.state(l).load(std::memory_order_relaxed)) + ")";
        const uint64_t probe = ring::MakeIdentity(30000, next_start_ticks_++);
        uint32_t got = 0;
        uint64_t at = 0;
        if (ring::ClaimLane(r, probe, l, &got, &at)) ring::ReleaseLane(r, got, probe);
        ++stats_.ring["claim_probes_of_unclaimable_lanes"];
        return true;
      }
      if (owner == 0 || ((owner & ring::kReleasedBit) == 0 && ring_store_.Alive(owner))) continue;
      *which = "lane " + std::to_string(l) + " of uid " + std::to_string(uid) + " is owned by " +
               ((owner & ring::kReleasedBit) != 0 ? "a process that released it" : "a dead process") +
               " (pid " + std::to_string(ring::IdentityPid(owner)) + ", state " +
               std::to_string(r.state(l).load(std::memory_order_relaxed)) + ", head " +
               std::to_string(r.head(l).load(std::memory_order_relaxed)) + ", tail " +
               std::to_string(r.tail(l).load(std::memory_order_relaxed)) + ")";
      return true;
    }
  }
  return false;
}

void World::CheckRingPosts() {
  // Exactly once, and in order per producer process, in what the
  // forwarder published.
  const auto& ledger = broker_.ledger();
  std::map<uint64_t, std::pair<PostId, JournalPosition>> last_of;  // by incarnation
  uint64_t twice = 0;
  for (const auto& [id, p] : posts_) {  // ids ascend with the producer's sequence
    // A post whose journal copy the disk damaged may come again from its
    // lane after the posts that followed it (a crash before the head moved,
    // and the damaged copy's id could not be read back into the dedupe
    // set): exempt, as from the rest of the contract (Post::damaged).
    if (!p.ring || p.ring_excused || p.damaged) continue;
    auto l = ledger.find(id);
    if (l == ledger.end() || l->second.positions.empty()) continue;  // drains reports it
    if (l->second.positions.size() > 1) {
      // A crash between the journal write and the head's move reads the
      // lane again; the dedupe set (its window and the two newest segments
      // a restart remembers) must catch it.
      const bool unremembered = std::any_of(
          l->second.positions.begin(), l->second.positions.end(),
          [this](const JournalPosition& q) { return unremembered_segments_.contains(q.segment_seq); });
      if (p.ring_reread_excused) {
        stats_.Fault("exempt.ring_journaled_again_after_header_scribble");
      } else if (unremembered) {
        // Its first copy is in a segment whose fdatasync failed at a start:
        // its id was not remembered, so as not to acknowledge the post on a
        // copy that may not be on disk (Daemon::RememberJournaledIds).
        stats_.Fault("exempt.ring_journaled_again_after_sync_fault");
      } else if (config_.dedupe_window_posts < 2 * config_.batch_records_max) {
        ++twice;
      } else {
        Fail("ring_journaled_once",
             "ring post " + Hex(id) + " (producer " + std::to_string(p.client) +
                 ") was journaled " + std::to_string(l->second.positions.size()) +
                 " times (published from" + [&] {
                   std::string at;
                   for (const JournalPosition& q : l->second.positions) {
                     at += " " + std::to_string(q.segment_seq) + ":" + std::to_string(q.offset);
                   }
                   return at;
                 }() + "); copies:" + Locate(id));
      }
      continue;
    }
    const JournalPosition pos = l->second.positions.front();
    auto it = last_of.find(p.incarnation);
    if (it != last_of.end() && !(it->second.second < pos)) {
      Fail("ring_order_per_producer",
           "ring post " + Hex(id) + " of producer " + std::to_string(p.client) +
               " was journaled at " + std::to_string(pos.segment_seq) + ":" +
               std::to_string(pos.offset) + ", before its earlier post " + Hex(it->second.first) +
               " at " + std::to_string(it->second.second.segment_seq) + ":" +
               std::to_string(it->second.second.offset));
    }
    last_of[p.incarnation] = {id, pos};
  }
  if (twice > 0) stats_.Fault("exempt.ring_posts_journaled_twice_small_dedupe_window", twice);
  std::string which;
  if (DeadLane(&which)) Fail("ring_dead_lanes_reclaimed", which);
}

void World::NoteRingMetrics(const daemon::Metrics& m) {
  auto add = [this](const char* k, const daemon::Metrics::Counter& c) {
    stats_.ring[k] += c.load(std::memory_order_relaxed);
  };
  add("daemon.posts_journaled", m.ring_posts_journaled_total);
  add("daemon.posts_deduplicated", m.ring_posts_deduplicated_total);
  add("daemon.posts_invalid", m.ring_posts_invalid_total);
  add("daemon.lanes_damaged", m.ring_lanes_damaged_total);
  add("daemon.lanes_reclaimed", m.ring_lanes_reclaimed_total);
  add("daemon.requests", m.ring_requests_total);
  add("daemon.requests_refused", m.ring_requests_refused_total);
}

void World::Trace(const char* format, ...) {
  if (!options_.verbose) return;
  char buf[1024];
  va_list ap;
  va_start(ap, format);
  std::vsnprintf(buf, sizeof buf, format, ap);
  va_end(ap);
  const auto ms = std::chrono::duration_cast<milliseconds>(node_.clock.Now().time_since_epoch() -
                                                           std::chrono::hours(1))
                      .count();
  std::fprintf(stderr, "[sim %" PRIu64 " t=%lldms] %s\n", options_.seed,
               static_cast<long long>(ms), buf);
}

void World::Fail(const std::string& invariant, const std::string& detail) {
  Trace("FAIL %s: %s", invariant.c_str(), detail.c_str());
  // One report per invariant and kind of detail is enough to replay.
  if (!failed_invariants_.insert(invariant).second) return;
  result_.failures.push_back(SimFailure{invariant, detail});
}

void World::ChooseConfig() {
  // Through the daemon's own parser, so that every run's configuration is
  // one the daemon accepts.
  std::string text;
  auto set = [&text](const char* key, const std::string& value) {
    text += std::string(key) + " = " + value + "\n";
  };
  auto num = [](uint64_t v) { return std::to_string(v); };
  set("durability", rng_.OneIn(2) ? "synced" : "accepted");
  set("connections_max", num(rng_.OneIn(6) ? rng_.Range(1, 6) : 4096));
  set("connections_per_uid_max", num(rng_.OneIn(6) ? rng_.Range(1, 3) : 256));
  set("batch_records_max", num(rng_.Range(1, 256)));
  set("batch_bytes_max", num(rng_.Range(512 << 10, 1 << 20)));  // CheckConfig: twice the largest request
  set("spool_rescan_interval_ms", num(rng_.Range(20, 1000)));
  set("spool_scan_entries_max", num(rng_.Range(1, 32)));
  set("spool_read_bytes_max", num(rng_.Range(64 << 10, 256 << 10)));
  set("quarantine_bytes_max", num(rng_.OneIn(4) ? rng_.Range(8 << 10, 64 << 10) : 256ull << 20));
  set("dedupe_window_posts", num(rng_.OneIn(8) ? 0 : rng_.Range(16, 100000)));
  set("journal_segment_bytes_max", num(rng_.Range(1 << 20, 2 << 20)));
  set("disk_bytes_max", num(rng_.OneIn(5) ? rng_.Range(1 << 20, 4 << 20) : 1ull << 30));
  set("disk_bytes_per_uid_max", num(rng_.OneIn(5) ? rng_.Range(256 << 10, 2 << 20) : 1ull << 30));
  set("publish_window_max", num(rng_.OneIn(6) ? 1000 : rng_.Range(1, 64)));
  set("unroutable_policy", rng_.OneIn(4) ? "drop" : "retry");
  set("reconnect_delay_initial_ms", num(rng_.Range(5, 100)));
  set("reconnect_delay_max_ms", num(rng_.Range(200, 2000)));
  set("checkpoint_interval_ms", num(rng_.OneIn(3) ? rng_.Range(10, 1000) : 200));
  // Small rings, so that lanes run out, fill, wrap and refuse big posts.
  set("ring_lanes", num(rng_.Range(1, 6)));
  set("ring_lane_bytes", num(4096u << rng_.Below(3)));
  set("ring_uids_max", num(rng_.OneIn(6) ? rng_.Range(1, 2) : 64));
  set("ring_lane_records_per_round", num(rng_.OneIn(3) ? rng_.Range(1, 4) : 256));
  set("ring_poll_us", num(rng_.Range(0, 3000)));
  if (Status s = daemon::ParseConfig(text, "simulation", &config_); !s.ok()) {
    std::fprintf(stderr, "the simulation made a configuration the daemon refuses: %s\n",
                 s.ToString().c_str());
    std::abort();
  }
  const daemon::Config& c = config_;
  broker_.policy = c.unroutable_policy;
  spool_segment_bytes_max_ = rng_.Range(1 << 10, 32 << 10);

  // Fault intensity: some seeds calm, some rough.
  static constexpr uint32_t kScale[] = {0, 1, 4, 10, 25};
  const uint32_t k = kScale[rng_.Below(5)];
  fs_rates_.write_eio = 100 * k;
  fs_rates_.write_enospc = 50 * k;
  fs_rates_.write_short = 50 * k;
  fs_rates_.write_torn = 50 * k;
  fs_rates_.sync_eio = 100 * k;
  fs_rates_.meta_eio = 100 * k;
  fs_rates_.meta_enospc = 30 * k;
  fs_rates_.read_eio = 50 * k;
  const uint32_t b = kScale[rng_.Below(5)];
  broker_rates_.disconnect_per_step = 20 * b;
  broker_rates_.down_per_step = 5 * b;
  broker_rates_.blocked_per_step = 10 * b;
  broker_rates_.nack_per_publish = 400 * b;
  broker_rates_.return_per_publish = 200 * b;
  broker_rates_.slow_confirm_per_publish = 300 * b;
  loop_options_.accept_error_ppm = static_cast<uint32_t>(rng_.Range(0, 2000));
  loop_options_.send_full_ppm = static_cast<uint32_t>(rng_.Range(0, 3000));
  loop_options_.packets_per_round_max = static_cast<uint32_t>(rng_.Range(1, 8));
  loop_options_.io_delay_rounds_max = static_cast<uint32_t>(rng_.Range(0, 3));
  crash_ppm_ = static_cast<uint32_t>(rng_.Range(0, 1500));
  kill_per_round_ppm_ = static_cast<uint32_t>(rng_.Range(0, 800));
  clean_stop_per_round_ppm_ = static_cast<uint32_t>(rng_.Range(0, 200));
  disk_full_per_round_ppm_ = static_cast<uint32_t>(rng_.Range(0, 300));
  journal_damage_per_round_ppm_ = rng_.OneIn(3) ? static_cast<uint32_t>(rng_.Range(0, 300)) : 0;
  client_kill_ppm_ = static_cast<uint32_t>(rng_.Range(0, 300));
  slow_writer_ppm_ = static_cast<uint32_t>(rng_.Range(0, 30000));
  stopped_writer_ppm_ = static_cast<uint32_t>(rng_.Range(0, 2000));
  fault_ms_ = rng_.Range(1000, 4000);
  producer_kill_ppm_ = static_cast<uint32_t>(rng_.Range(0, 3000));
  mid_copy_kill_ppm_ = static_cast<uint32_t>(rng_.Range(0, 20000));
  scribble_per_round_ppm_ = rng_.OneIn(3) ? static_cast<uint32_t>(rng_.Range(0, 3000)) : 0;

  const uint32_t uids = static_cast<uint32_t>(rng_.Range(1, 4));
  for (uint32_t i = 0; i < uids; ++i) benign_uids_.push_back(1000 + i);
  const uint32_t benign = static_cast<uint32_t>(rng_.Range(2, 10));
  for (uint32_t i = 0; i < benign; ++i) {
    clients_.push_back(std::make_unique<Client>(this, static_cast<uint32_t>(clients_.size()),
                                                benign_uids_[rng_.Below(uids)], false, rng_.Fork()));
  }
  const uint32_t hostile = rng_.OneIn(2) ? static_cast<uint32_t>(rng_.Range(1, 2)) : 0;
  for (uint32_t i = 0; i < hostile; ++i) {
    clients_.push_back(std::make_unique<Client>(this, static_cast<uint32_t>(clients_.size()),
                                                kHostileUid, true, rng_.Fork()));
  }
  const uint32_t ringed = rng_.OneIn(4) ? 0 : static_cast<uint32_t>(rng_.Range(1, 3));
  for (uint32_t i = 0; i < ringed; ++i) {
    producers_.push_back(std::make_unique<RingProducer>(
        this, static_cast<uint32_t>(clients_.size() + producers_.size()),
        benign_uids_[rng_.Below(uids)], rng_.Fork()));
  }

  char buf[1024];
  std::snprintf(
      buf, sizeof buf,
      "durability=%s batch_records_max=%u batch_bytes_max=%llu scan_entries_max=%u "
      "read_bytes_max=%llu segment_bytes_max=%llu disk_bytes_max=%llu per_uid=%llu "
      "quarantine_max=%llu dedupe=%u window=%u policy=%s checkpoint_interval_ms=%u "
      "connections_max=%u/%u fs_faults=x%u broker_faults=x%u crash_ppm=%u kill_ppm=%u "
      "clients=%u+%u hostile ring_producers=%u ring_lanes=%ux%u uids_max=%u "
      "lane_records_per_round=%u poll_us=%u producer_kill_ppm=%u mid_copy_kill_ppm=%u "
      "scribble_ppm=%u fault_ms=%llu",
      daemon::DurabilityName(c.durability), c.batch_records_max,
      static_cast<unsigned long long>(c.batch_bytes_max), c.spool_scan_entries_max,
      static_cast<unsigned long long>(c.spool_read_bytes_max),
      static_cast<unsigned long long>(c.journal_segment_bytes_max),
      static_cast<unsigned long long>(c.disk_bytes_max),
      static_cast<unsigned long long>(c.disk_bytes_per_uid_max),
      static_cast<unsigned long long>(c.quarantine_bytes_max), c.dedupe_window_posts,
      c.publish_window_max, c.unroutable_policy == daemon::UnroutablePolicy::kDrop ? "drop" : "retry",
      c.checkpoint_interval_ms, c.connections_max, c.connections_per_uid_max, k, b, crash_ppm_,
      kill_per_round_ppm_, benign, hostile, ringed, c.ring_lanes, c.ring_lane_bytes,
      c.ring_uids_max, c.ring_lane_records_per_round, c.ring_poll_us, producer_kill_ppm_,
      mid_copy_kill_ppm_, scribble_per_round_ppm_, static_cast<unsigned long long>(fault_ms_));
  result_.config = buf;
}

void World::SetFaults(bool on) {
  faults_on_ = on;
  node_.fs.set_rates(on ? fs_rates_ : FaultRates{});
  node_.fs.set_crash_ppm(on ? crash_ppm_ : 0);
  broker_.set_rates(on ? broker_rates_ : BrokerRates{});
  if (!on) {
    node_.fs.set_full(false);
    broker_.Heal(node_.clock.Now());
  }
  if (dp_) {
    SimIoLoop::Options lo = loop_options_;
    if (!on) {
      lo.accept_error_ppm = 0;
      lo.send_full_ppm = 0;
    }
    dp_->loop->set_options(lo);
  }
}

void World::StartDaemon() {
  SimFs& fs = node_.fs;
  fs.ReviveDaemon();
  auto dp = std::make_unique<DaemonProcess>();
  dp->storage = std::make_unique<SimStorage>(&node_);
  daemon::JournalWriter::Options jo;
  jo.dir = SimStorage::kJournalPath;
  jo.segment_bytes_max = config_.journal_segment_bytes_max;
  jo.sync = config_.durability == daemon::Durability::kSynced;
  jo.storage = dp->storage.get();
  if (Status s = daemon::JournalWriter::Open(jo, &dp->usage, &dp->writer); !s.ok()) {
    Trace("daemon start failed: journal: %s", s.ToString().c_str());
    ++stats_.start_failures;
    dp.reset();
    node_.DaemonDied();
    fs.ReviveDaemon();
    fs.Collect();
    restart_at_ = node_.clock.Now() + 100ms;  // systemd's RestartSec
    return;
  }
  {
    DaemonProcess* p = dp.get();
    dp->journal = std::make_unique<daemon::WriterJournalPort>(
        dp->writer.get(), &dp->usage, [p](JournalPosition end) { p->commits.Publish(end); });
  }
  dp->commits.Publish(dp->journal->end());
  dp->spool = std::make_unique<SimSpoolDir>(&node_);
  dp->spool->Open();
  daemon::RecentIds::Key key;
  for (auto& b : key) b = static_cast<unsigned char>(rng_.Next());
  dp->rings = std::make_unique<SimRingPort>(config_, &ring_store_);
  dp->rings->set_on_entries([this] {
    if (!producers_.empty() && rng_.OneIn(16)) {
      producers_[rng_.Below(producers_.size())]->Preempt(node_.clock.Now());
    }
  });
  dp->ingest = std::make_unique<daemon::Ingest>(
      config_, &dp->metrics,
      daemon::Ingest::Ports{&node_.clock, dp->journal.get(), dp->spool.get(), dp->rings.get()},
      "simhost", key, rng_.Next());
  {
    // What MaybeSleep's RingAdmits decided, noted when it sleeps.
    daemon::Ingest* ingest = dp->ingest.get();
    SimRingPort* port = dp->rings.get();
    dp->rings->set_on_sleep([this, ingest, port] {
      Trace("the ingest sleeps");
      unadmitted_at_sleep_.clear();
      const uint64_t largest = segment::RecordBytes(segment::kRecordPayloadMax);
      for (const auto& e : port->rings()) {
        if (ingest->DiskBytes() + largest > config_.disk_bytes_max ||
            ingest->UidBytes(e.uid) + largest > config_.DiskBytesPerUidMax()) {
          unadmitted_at_sleep_.insert(e.uid);
        }
      }
    });
  }
  // Daemon::RememberJournaledIds: the two newest segments before the new one.
  if (config_.dedupe_window_posts != 0) {
    std::vector<uint64_t> seqs = ListJournalSegments(&node_);
    std::erase(seqs, dp->journal->end().segment_seq);
    const size_t first = seqs.size() > 2 ? seqs.size() - 2 : 0;
    for (size_t i = first; i < seqs.size(); ++i) {
      SimFs::Ino ino;
      if (!fs.Lookup(kJournalDir, daemon::JournalSegmentName(seqs[i]), &ino)) continue;
      if (fs.Sync(Actor::kDaemon, ino) != 0) {  // as daemon.cc: fdatasync first
        unremembered_segments_.insert(seqs[i]);
        continue;
      }
      ReadRecords(fs.Get(ino)->data, 0, [&](const fb::Post& p, uint64_t, uint64_t) {
        dp->ingest->RememberJournaled(PostId{p.id()->hi(), p.id()->lo()});
      });
    }
  }
  dp->forwarder = std::make_unique<SimForwarder>(
      config_, SimForwarder::Options{options_.checkpoint_every_move}, &node_, &broker_,
      &dp->commits, &dp->usage, dp->storage.get(), dp->writer->dirfd(), rng_.Next(), [this](const fb::Post& p) { CheckPublished(p); });
  if (Status s = dp->forwarder->Start(); !s.ok()) {
    Trace("daemon start failed: forwarder: %s", s.ToString().c_str());
    ++stats_.start_failures;
    dp.reset();
    node_.DaemonDied();
    fs.ReviveDaemon();
    restart_at_ = node_.clock.Now() + 100ms;
    return;
  }
  SimForwarder* fwd = dp->forwarder.get();
  dp->journal->set_watermark([fwd] { return fwd->watermark(); });
  dp->loop = std::make_unique<SimIoLoop>(&node_, dp->ingest.get(), rng_.Fork(), &stats_);
  dp->ingest->Attach(dp->loop.get());
  if (!dp->loop->Listen(0).ok()) std::abort();
  dp_ = std::move(dp);
  SetFaults(faults_on_);
  if (fs.daemon_dead()) {  // died while starting
    Crash();
    return;
  }
  Trace("daemon started (epoch %u, journal segment %" PRIu64 ", checkpoint %" PRIu64 ":%" PRIu64 ")",
        epoch_, dp_->journal->end().segment_seq, fwd->stored_checkpoint().segment_seq,
        fwd->stored_checkpoint().offset);
}

void World::Crash() {
  SimFs& fs = node_.fs;
  const std::string point = fs.crash_point().empty() ? "start" : fs.crash_point();
  ++stats_.crashes;
  ++stats_.crash_points[point];
  // A checkpoint write that failed (an injected fault) leaves the stored
  // watermark behind by more than a window: the bound holds only when the
  // last write worked.
  const bool checkpoint_faulted = dp_ && dp_->forwarder->checkpoint_faulted();
  const bool checkpoint_held = dp_ && dp_->forwarder->checkpoint_held_by_damage();
  if (dp_) {
    dp_->loop->CrashInFlight();
    NoteRingMetrics(dp_->metrics);
    dp_.reset();
  }
  node_.DaemonDied();
  const bool power_loss = config_.durability == daemon::Durability::kSynced && rng_.OneIn(2);
  if (power_loss) {
    ++stats_.power_losses;
    for (auto& c : clients_) c->Die(true);  // the whole node went down
    for (auto& p : producers_) p->Die(true);
    fs.PowerLoss();
    // A name the power loss took is not the daemon's doing.
    std::erase_if(unreadable_segments_, [&fs](const auto& e) {
      const SimFs::Inode* in = fs.Get(e.first);
      return in == nullptr || in->links == 0;
    });
    // tmpfs too: what the rings held and nobody saw journaled (at `synced`
    // no producer was told it was) is gone.
    ring_store_.Wipe();
    uint64_t lost = 0;
    for (auto& [id, p] : posts_) {
      if (p.ring && !p.acknowledged && !p.ring_excused) {
        p.ring_excused = true;
        ++lost;
      }
    }
    stats_.Fault("exempt.ring_posts_lost_with_power", lost);
    lane_posts_.clear();
    lane_history_.clear();
    tainted_.clear();
    scribbled_.clear();
    quiet_lanes_.clear();
  }
  fs.ReviveDaemon();
  fs.Collect();
  ++epoch_;
  // The bound on duplicates is for a process crash: a power loss also
  // loses the checkpoint writes since its last sync (checkpoint_interval_ms).
  if (power_loss) power_loss_epochs_.insert(epoch_);
  if (checkpoint_faulted) checkpoint_fault_epochs_.insert(epoch_);
  if (checkpoint_held) checkpoint_held_epochs_.insert(epoch_);
  broker_.set_epoch(epoch_);
  Trace("daemon crashed at %s%s (crash %" PRIu64 ")", point.c_str(),
        power_loss ? " with a power loss" : "", stats_.crashes);
  CheckRecoverable("crash " + std::to_string(stats_.crashes) + " at " + point +
                   (power_loss ? " with a power loss" : ""));
  restart_at_ = node_.clock.Now() + milliseconds(rng_.Range(0, 300));
}

void World::FinishCleanStop() {
  dp_->forwarder->Stop(node_.clock.Now());
  NoteRingMetrics(dp_->metrics);
  const bool died = node_.fs.daemon_dead();
  dp_.reset();
  node_.DaemonDied();
  node_.fs.ReviveDaemon();
  ++epoch_;
  broker_.set_epoch(epoch_);
  ++stats_.clean_restarts;
  Trace("daemon stopped cleanly%s", died ? " (died storing the final checkpoint)" : "");
  if (died) ++stats_.crashes;
  restart_at_ = node_.clock.Now() + milliseconds(rng_.Range(0, 100));
}

std::set<PostId> World::Recoverable(bool* spool_pending_benign) {
  SimFs& fs = node_.fs;
  std::set<PostId> ids;
  JournalPosition cp;
  // What a restart would load (a damaged file: from the start).
  if (!LoadCheckpoint(&node_, &cp).ok()) cp = JournalPosition{};
  for (uint64_t seq : ListJournalSegments(&node_)) {
    if (seq < cp.segment_seq) continue;
    SimFs::Ino ino;
    if (!fs.Lookup(kJournalDir, daemon::JournalSegmentName(seq), &ino)) continue;
    ReadRecords(fs.Get(ino)->data, seq == cp.segment_seq ? cp.offset : 0,
                [&](const fb::Post& p, uint64_t, uint64_t) { ids.insert(PostId{p.id()->hi(), p.id()->lo()}); });
  }
  RingIds(&ids);  // ring memory survives a daemon crash
  if (spool_pending_benign != nullptr) *spool_pending_benign = false;
  for (const auto& [name, ino] : fs.List(kSpoolDir)) {
    const auto parsed = segment::ParseSpoolName(name);
    const SimFs::Inode* in = fs.Get(ino);
    if (!parsed || !in->regular || in->owner != parsed->uid || in->links != 1 || in->sparse) continue;
    ReadRecords(in->data, 0, [&](const fb::Post& p, uint64_t, uint64_t) {
      const PostId id{p.id()->hi(), p.id()->lo()};
      ids.insert(id);
      if (spool_pending_benign != nullptr) {
        auto it = posts_.find(id);
        auto l = broker_.ledger().find(id);
        const bool delivered = l != broker_.ledger().end() && (l->second.confirmed || l->second.dropped);
        if (it != posts_.end() && !it->second.hostile && !it->second.damaged && !delivered) {
          *spool_pending_benign = true;
        }
      }
    });
  }
  return ids;
}

std::string World::Locate(PostId id) {
  SimFs& fs = node_.fs;
  std::string out;
  static const char* kDirNames[] = {"journal", "spool", "quarantine", "journal/damaged"};
  for (int d = 0; d < kDirCount; ++d) {
    for (const auto& entry : fs.List(static_cast<DirId>(d))) {
      const std::string& name = entry.first;  // clang 14 cannot capture a structured binding
      const SimFs::Inode* in = fs.Get(entry.second);
      ReadRecords(in->data, 0, [&](const fb::Post& p, uint64_t at, uint64_t) {
        if (PostId{p.id()->hi(), p.id()->lo()} != id) return;
        out += std::string(" [") + kDirNames[d] + "/" + name + " @" + std::to_string(at) +
               " size " + std::to_string(in->data.size()) + " links " +
               std::to_string(in->links) + " owner " + std::to_string(in->owner) +
               (in->shared_locks > 0 ? " locked" : "") + "]";
      });
    }
  }
  if (JournalPosition cp; LoadCheckpoint(&node_, &cp).ok()) {
    out += " checkpoint " + std::to_string(cp.segment_seq) + ":" + std::to_string(cp.offset);
  }
  if (dp_) {
    out += " watermark " + std::to_string(dp_->forwarder->watermark().segment_seq) + ":" +
           std::to_string(dp_->forwarder->watermark().offset) + " committed " +
           std::to_string(dp_->commits.end.segment_seq) + ":" +
           std::to_string(dp_->commits.end.offset);
    auto it = posts_.find(id);
    if (it != posts_.end()) {
      out += " uid " + std::to_string(it->second.uid) + " bytes " +
             std::to_string(dp_->ingest->UidBytes(it->second.uid)) + " disk bytes " +
             std::to_string(dp_->ingest->DiskBytes());
    }
  }
  auto l = broker_.ledger().find(id);
  if (l != broker_.ledger().end()) {
    out += " broker: enqueued " + std::to_string(l->second.enqueued) +
           (l->second.confirmed ? " confirmed" : "");
  }
  return out.empty() ? " nowhere" : out;
}

void World::CheckDamagedSegmentsKept(const std::string& when) {
  for (auto it = unreadable_segments_.begin(); it != unreadable_segments_.end();) {
    const SimFs::Inode* in = node_.fs.Get(it->first);
    if (in != nullptr && in->links > 0) {
      ++it;
      continue;
    }
    const auto& ledger = broker_.ledger();
    const bool lost = std::any_of(it->second.unconfirmed.begin(), it->second.unconfirmed.end(),
                                  [&ledger](const PostId& id) {
                                    auto l = ledger.find(id);
                                    return l == ledger.end() ||
                                           !(l->second.confirmed || l->second.dropped);
                                  });
    if (!lost) {
      it = unreadable_segments_.erase(it);
      continue;
    }
    Fail("damaged_segment_kept",
         "after " + when + ": journal segment " + std::to_string(it->second.seq) +
             " could not be read and held unconfirmed posts, and it was deleted instead of "
             "being set aside in damaged/");
    it = unreadable_segments_.erase(it);
  }
}

void World::CheckRecoverable(const std::string& when) {
  CheckDamagedSegmentsKept(when);
  const std::set<PostId> ids = Recoverable(nullptr);
  const auto& ledger = broker_.ledger();
  for (const auto& [id, p] : posts_) {
    if ((!p.acknowledged && !p.ring) || p.hostile || p.damaged || p.ring_excused) continue;
    auto l = ledger.find(id);
    if (l != ledger.end() && (l->second.confirmed || l->second.dropped)) continue;
    if (ids.count(id) != 0) continue;
    Fail("acknowledged_is_recoverable",
         "after " + when + ": post " + Hex(id) + " (client " + std::to_string(p.client) + ", " +
             (p.ring ? "ring" : p.via_spool ? "spooled" : "socket") + ", acknowledged in epoch " +
             std::to_string(p.epoch) +
             ") is neither confirmed, nor in the journal after the stored checkpoint, nor in "
             "the spool; copies:" + Locate(id));
    return;
  }
}

void World::CheckPublished(const fb::Post& post) {
  const PostId id{post.id()->hi(), post.id()->lo()};
  auto it = posts_.find(id);
  if (it == posts_.end()) {
    Fail("nothing_invented", "published post " + Hex(id) + " was made by no client");
    return;
  }
  const PostInfo& p = it->second;
  if (!p.hostile && !p.ring && !p.spool_written && !(p.sent && !p.refused)) {
    Fail("published_only_what_was_handed_over",
         "published post " + Hex(id) + " (client " + std::to_string(p.client) + ") was " +
             (p.sent ? "refused by the daemon's answer" : "never sent") +
             " and never written whole to the spool");
  }
  if (post.rel_path() == nullptr || post.rel_path()->str() != p.rel_path) {
    Fail("nothing_invented", "published post " + Hex(id) + " has relPath '" +
                                 (post.rel_path() ? post.rel_path()->str() : "") +
                                 "', its client made '" + p.rel_path + "'");
  }
  const std::optional<uint32_t> origin = ReadPost(post).origin_uid;
  if (origin != p.uid) {
    Fail("nothing_invented", "published post " + Hex(id) + " carries origin uid " +
                                 (origin ? std::to_string(*origin) : "none") + ", made by uid " +
                                 std::to_string(p.uid));
  }
}

void World::DamageJournal() {
  SimFs& fs = node_.fs;
  std::vector<uint64_t> seqs = ListJournalSegments(&node_);
  if (dp_) std::erase(seqs, dp_->journal->end().segment_seq);
  if (seqs.empty()) return;
  const uint64_t seq = seqs[rng_.Below(seqs.size())];
  SimFs::Ino ino;
  if (!fs.Lookup(kJournalDir, daemon::JournalSegmentName(seq), &ino)) return;
  SimFs::Inode* in = fs.Get(ino);
  if (in->data.size() <= segment::kHeaderBytes) return;
  const uint64_t kind = rng_.Below(3);
  uint64_t lo = 0;
  uint64_t hi = in->data.size();
  uint64_t off = 0;
  if (kind == 0) {
    off = rng_.Range(segment::kHeaderBytes, in->data.size() - 1);
    lo = hi = off;
  } else if (kind == 2) {
    off = rng_.Below(segment::kHeaderChecksumOffset);
  }
  uint64_t hit = 0;
  std::vector<PostId> unconfirmed;
  ReadRecords(in->data, 0, [&](const fb::Post& p, uint64_t at, uint64_t next) {
    if (at > hi || next <= lo) return;
    const PostId id{p.id()->hi(), p.id()->lo()};
    auto it = posts_.find(id);
    if (it != posts_.end()) it->second.damaged = true;
    auto l = broker_.ledger().find(id);
    if (l == broker_.ledger().end() || !l->second.confirmed) unconfirmed.push_back(id);
    ++hit;
  });
  if (kind != 0 && !unconfirmed.empty()) {
    unreadable_segments_[ino] = Unreadable{seq, std::move(unconfirmed)};
  }
  if (kind == 1) {
    in->data.clear();
    in->durable.clear();
    in->pending.clear();
  } else {
    in->data[off] ^= std::byte{0x20};
    if (in->durable.size() > off) in->durable[off] ^= std::byte{0x20};
  }
  static const char* kKinds[] = {"disk.journal_record_flip", "disk.journal_zero_length",
                                 "disk.journal_header_flip"};
  stats_.Fault(kKinds[kind]);
  stats_.Fault("exempt.posts_in_damaged_journal_records", hit);
  Trace("%s in journal segment %" PRIu64 " at %" PRIu64 " (%" PRIu64 " posts hit)", kKinds[kind],
        seq, off, hit);
}

void World::CheckBoundedWork() {
  const SpoolWork& s = dp_->spool->work();
  const RoundWork& l = dp_->loop->round_work();
  stats_.NoteRoundWork("spool.list_calls", s.lists);
  stats_.NoteRoundWork("spool.entries_listed", s.entries);
  stats_.NoteRoundWork("spool.opens", s.opens);
  stats_.NoteRoundWork("spool.renames", s.renames);
  stats_.NoteRoundWork("spool.quarantines", s.quarantines);
  stats_.NoteRoundWork("spool.bytes_read", s.bytes_read);
  stats_.NoteRoundWork("loop.journal_writes", l.writes);
  stats_.NoteRoundWork("loop.journal_syncs", l.syncs);
  stats_.NoteRoundWork("loop.sends", l.sends);
  std::string why;
  if (s.lists > 1 || s.entries > config_.spool_scan_entries_max) {
    why = "listed " + std::to_string(s.entries) + " entries in " + std::to_string(s.lists) +
          " calls (spool_scan_entries_max " + std::to_string(config_.spool_scan_entries_max) + ")";
  } else if (s.opens > kOpensPerRoundMax) {
    why = "opened " + std::to_string(s.opens) + " spool segments";
  } else if (s.renames > 2 * s.entries) {
    why = std::to_string(s.renames) + " renames for " + std::to_string(s.entries) + " entries";
  } else if (s.quarantines > 64 * (s.entries + s.opens + 1)) {
    why = std::to_string(s.quarantines) + " quarantine attempts";
  } else if (s.bytes_read > config_.spool_read_bytes_max + config_.batch_bytes_max +
                                2 * kReaderWindowBytes) {
    why = "read " + std::to_string(s.bytes_read) + " spool bytes (spool_read_bytes_max " +
          std::to_string(config_.spool_read_bytes_max) + ", batch_bytes_max " +
          std::to_string(config_.batch_bytes_max) + ")";
  } else if (l.writes > 1 || l.syncs > 1) {
    why = std::to_string(l.writes) + " journal writes and " + std::to_string(l.syncs) +
          " syncs submitted";
  }
  if (!why.empty()) Fail("bounded_work_per_round", "one round " + why);
  dp_->spool->work() = SpoolWork{};
}

bool World::Drained(std::string* why) {
  if (!dp_ || dp_->stopping) {
    *why = "the daemon is not running";
    return false;
  }
  for (const auto& c : clients_) {
    if (!c->idle()) {
      *why = "a client is still posting";
      return false;
    }
  }
  for (const auto& pr : producers_) {
    if (!pr->idle()) {
      *why = "a ring producer is still posting";
      return false;
    }
  }
  if (DeadLane(why)) return false;
  const auto& ledger = broker_.ledger();
  for (const auto& [id, p] : posts_) {
    if ((!p.acknowledged && !p.ring) || p.hostile || p.damaged || p.ring_excused) continue;
    auto l = ledger.find(id);
    if (l == ledger.end() || !(l->second.confirmed || l->second.dropped)) {
      if (p.ring && RingHeldByQuota(p.uid)) continue;  // counted at the end
      *why = "acknowledged post " + Hex(id) + " (" +
             (p.ring ? "ring" : p.via_spool ? "spooled" : "socket") +
             ") is not confirmed; copies:" + Locate(id);
      return false;
    }
  }
  if (!dp_->forwarder->Drained(dp_->commits.end)) {
    const auto pos = [](JournalPosition p) {
      return std::to_string(p.segment_seq) + ":" + std::to_string(p.offset);
    };
    *why = "the forwarder's watermark " + pos(dp_->forwarder->watermark()) +
           " is behind the committed end of the journal " + pos(dp_->commits.end);
    return false;
  }
  bool pending = false;
  (void)Recoverable(&pending);
  if (pending) {
    *why = "the spool holds posts that are not delivered";
    return false;
  }
  return true;
}

void World::Round(bool producing) {
  const auto step = std::chrono::microseconds(rng_.Range(100, 2000));
  node_.clock.Advance(step);
  const Clock::time_point now = node_.clock.Now();
  node_.fs.set_wall_seconds(node_.clock.WallSeconds());
  ++stats_.rounds;
  if (faults_on_) {
    if (now >= full_until_ && rng_.Ppm(disk_full_per_round_ppm_) && !options_.no_disk_full) {
      stats_.Fault("fs.disk_full_period");
      full_until_ = now + milliseconds(rng_.Range(10, 2000));
    }
    node_.fs.set_full(now < full_until_);
    if (rng_.Ppm(journal_damage_per_round_ppm_)) DamageJournal();
    if (rng_.Ppm(scribble_per_round_ppm_)) ScribbleRing();
  }
  broker_.Step(now);
  for (auto& c : clients_) c->Step(now, producing);
  for (auto& p : producers_) p->Step(now, producing);

  if (!dp_) {
    if (now >= restart_at_) StartDaemon();
    return;
  }
  SimFs& fs = node_.fs;
  if (!dp_->draining) {
    // After the Ingest is done the daemon runs no more rounds; only its
    // forwarder drains. While the ingest sleeps (it said so to the
    // RingPort), the loop waits for an event, a doorbell or its timeout.
    bool run = true;
    // With no write in flight, no lane is in a batch: every lane the
    // ingest may read is read to its tail and journaled to it.
    // Not once a journal write failed after SIGTERM: a stopping daemon does
    // not retry the journal, and leaves what the write held in the lanes
    // for the next start (Ingest::RingsFailed).
    if (dp_->rings->asleep_unrung() && !dp_->loop->HasIo() &&
        !(dp_->stopping &&
          dp_->metrics.journal_write_errors_total.load() > dp_->journal_errors_at_stop)) {
      CheckRingsNotStranded();
    }
    if (dp_->rings->asleep_unrung() && !dp_->loop->HasEvents() && !node_.spool_changed &&
        !dp_->stopping) {
      if (now - last_daemon_round_ < kRoundTimeout) {
        run = false;
        ++stats_.ring["rounds_slept"];
      } else {
        ++stats_.ring["timeout_rounds_while_asleep"];
      }
    }
    if (run) {
      const bool rings_asleep = dp_->rings->asleep();
      const uint64_t awakenings = dp_->rings->awakenings();
      if (Status s = dp_->loop->RunOnce(0); !s.ok()) std::abort();
      last_daemon_round_ = now;
      if (!rings_asleep || dp_->rings->awakenings() != awakenings) quiet_lanes_.clear();
      if (!fs.daemon_dead()) CheckBoundedWork();
    }
  }
  const int steps = 1 + static_cast<int>(rng_.Below(3));
  for (int i = 0; i < steps && !fs.daemon_dead(); ++i) {
    if (!dp_->forwarder->Step(now)) break;
  }
  if (!fs.daemon_dead() && dp_->stopping) {
    if (!dp_->draining && dp_->ingest->done()) {
      dp_->draining = true;
      dp_->drain_target = dp_->commits.end;
      dp_->drain_deadline = now + milliseconds(config_.shutdown_drain_ms);
    }
    if (dp_->draining && (dp_->forwarder->Drained(dp_->drain_target) ||
                          now >= dp_->drain_deadline)) {
      FinishCleanStop();
      return;
    }
  }
  if (!fs.daemon_dead() && faults_on_ && rng_.Ppm(kill_per_round_ppm_)) {
    fs.KillDaemon("between rounds");
  }
  if (fs.daemon_dead()) {
    Crash();
    return;
  }
  if (faults_on_ && !dp_->stopping && rng_.Ppm(clean_stop_per_round_ppm_)) {
    Trace("SIGTERM");
    dp_->stopping = true;
    dp_->journal_errors_at_stop = dp_->metrics.journal_write_errors_total.load();
    dp_->ingest->Stop();
  }
}

SimResult World::Run() {
  daemon::SetLogLevel(options_.verbose ? daemon::LogLevel::kWarning : static_cast<daemon::LogLevel>(0));
  ChooseConfig();
  if (options_.verbose) {
    node_.trace = [this](const std::string& line) { Trace("%s", line.c_str()); };
    node_.fs.set_trace(node_.trace);
  }
  Trace("config: %s", result_.config.c_str());
  SetFaults(true);
  StartDaemon();
  const Clock::time_point start = node_.clock.Now();
  while (node_.clock.Now() - start < milliseconds(fault_ms_)) Round(true);

  // Faults stop; a daemon that is stopping finishes; no new posts.
  SetFaults(false);
  Trace("faults stop");
  const Clock::time_point drain_start = node_.clock.Now();
  Clock::time_point next_check = drain_start;
  std::string why;
  bool drained = false;
  while (node_.clock.Now() - drain_start < kDrainMsMax) {
    Round(false);
    if (node_.clock.Now() >= next_check) {
      next_check = node_.clock.Now() + 50ms;
      if (Drained(&why)) {
        drained = true;
        break;
      }
    }
  }
  if (!drained) {
    Fail("drains", "not drained " +
                       std::to_string(std::chrono::duration_cast<milliseconds>(kDrainMsMax).count()) +
                       " ms after the faults stopped: " + why);
  }
  CheckDamagedSegmentsKept("the drain");
  // The final word on every acknowledged post (Drained checked it too).
  const auto& ledger = broker_.ledger();
  uint64_t dropped = 0;
  for (const auto& [id, p] : posts_) {
    auto l = ledger.find(id);
    if (l != ledger.end() && l->second.confirmed) ++stats_.posts_confirmed;
    if ((!p.acknowledged && !p.ring) || p.hostile || p.damaged || p.ring_excused) continue;
    if (l != ledger.end() && l->second.dropped && !l->second.confirmed) {
      ++dropped;
      continue;
    }
    if (l == ledger.end() || !l->second.confirmed) {
      if (p.ring && RingHeldByQuota(p.uid)) {
        // The disk is within the largest record of disk_bytes_max (the
        // current journal segment's confirmed bytes count until it rolls
        // over): the ring is not drained, its posts wait in it.
        stats_.Fault("exempt.ring_posts_held_by_full_disk");
        continue;
      }
      Fail("acknowledged_is_confirmed", "post " + Hex(id) + " (client " + std::to_string(p.client) +
                                            ", " +
                                            (p.ring ? "ring" : p.via_spool ? "spooled" : "socket") +
                                            ", acknowledged in epoch " + std::to_string(p.epoch) +
                                            ") was never confirmed by the broker; copies:" +
                                            Locate(id));
      break;
    }
  }
  if (dropped > 0) stats_.Fault("exempt.unroutable_dropped_by_policy", dropped);
  for (const auto& [id, l] : ledger) {
    if (posts_.count(id) == 0) Fail("nothing_invented", "the broker holds post " + Hex(id));
  }
  // Duplicates per crash.
  stats_.broker_enqueued = broker_.enqueued_total();
  stats_.duplicates_total = broker_.duplicates_total();
  for (uint32_t e = 1; e <= epoch_; ++e) {
    auto it = broker_.cross_epoch_duplicates().find(e);
    const uint64_t d = it == broker_.cross_epoch_duplicates().end() ? 0 : it->second;
    stats_.duplicates_per_crash.push_back(d);
    auto t = broker_.cross_epoch_journaled_twice().find(e);
    const uint64_t twice = t == broker_.cross_epoch_journaled_twice().end() ? 0 : t->second;
    stats_.journaled_twice_per_crash.push_back(twice);
    // The bound is on what the forwarder publishes again; posts journaled
    // twice (a late ack made the client spool its post too, and the dedupe
    // set did not catch it) are counted, not bounded.
    const uint64_t republished = d - twice;
    // Duplicates that go back over several crashes (a post last published
    // before crash e-1) are exempt if any of those crashes is.
    auto since_it = broker_.cross_epoch_since().find(e);
    const uint32_t since = since_it == broker_.cross_epoch_since().end() ? e - 1 : since_it->second;
    auto exempt = [&](const std::set<uint32_t>& epochs) {
      auto first_after = epochs.upper_bound(since);
      return first_after != epochs.end() && *first_after <= e;
    };
    if (exempt(power_loss_epochs_)) {
      stats_.Fault("exempt.duplicates_after_power_loss", d);
    } else if (exempt(checkpoint_fault_epochs_)) {
      stats_.Fault("exempt.duplicates_after_checkpoint_fault", d);
    } else if (exempt(checkpoint_held_epochs_)) {
      stats_.Fault("exempt.duplicates_after_checkpoint_held_by_damaged_segment", d);
    } else if (republished > config_.publish_window_max) {
      Fail(kDuplicatesInvariant,
           "restart " + std::to_string(e) + " caused " + std::to_string(d) + " duplicates (" +
               std::to_string(d - twice) + " records republished, " + std::to_string(twice) +
               " posts journaled twice); publish_window_max is " +
               std::to_string(config_.publish_window_max) +
               (config_.dedupe_window_posts == 0 ? "; dedupe_window_posts is 0" : ""));
    }
  }
  CheckRingPosts();
  stats_.virtual_ms = static_cast<uint64_t>(
      std::chrono::duration_cast<milliseconds>(node_.clock.Now() - start).count());
  if (dp_) NoteRingMetrics(dp_->metrics);
  dp_.reset();
  result_.stats = stats_;
  return result_;
}

}  // namespace

std::string Summarize(const std::vector<SimResult>& results) {
  SimStats total;
  uint64_t failed = 0;
  uint64_t failed_dups_only = 0;
  std::map<std::string, uint64_t> by_invariant;
  for (const SimResult& r : results) {
    total.Merge(r.stats);
    if (!r.ok()) ++failed;
    if (!r.ok() && r.ok_except_duplicates()) ++failed_dups_only;
    for (const SimFailure& f : r.failures) ++by_invariant[f.invariant];
  }
  uint64_t dup_max = 0;
  uint64_t dup_sum = 0;
  for (uint64_t d : total.duplicates_per_crash) {
    dup_max = std::max(dup_max, d);
    dup_sum += d;
  }
  const size_t restarts = total.duplicates_per_crash.size();
  uint64_t twice_max = 0;
  uint64_t twice_sum = 0;
  uint64_t republished_max = 0;
  for (size_t i = 0; i < total.journaled_twice_per_crash.size(); ++i) {
    twice_max = std::max(twice_max, total.journaled_twice_per_crash[i]);
    twice_sum += total.journaled_twice_per_crash[i];
    republished_max = std::max(republished_max,
                               total.duplicates_per_crash[i] - total.journaled_twice_per_crash[i]);
  }
  std::string out;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "seeds run: %zu (failed: %" PRIu64 ", of which only the duplicate bound: %" PRIu64
                ")\n"
                "rounds: %" PRIu64 ", virtual time: %.1f s\n"
                "crashes injected: %" PRIu64 " (power losses: %" PRIu64 "), clean restarts: %" PRIu64
                ", failed starts: %" PRIu64 "\n"
                "posts made: %" PRIu64 ", acknowledged: %" PRIu64 " (socket %" PRIu64 ", spool %" PRIu64
                "), failed: %" PRIu64 ", confirmed: %" PRIu64 ", broker enqueues: %" PRIu64 "\n"
                "duplicates per restart: max %" PRIu64 ", mean %.2f over %zu restarts; all duplicates: %" PRIu64
                "\n",
                results.size(), failed, failed_dups_only, total.rounds,
                static_cast<double>(total.virtual_ms) / 1000.0, total.crashes, total.power_losses,
                total.clean_restarts, total.start_failures, total.posts_made,
                total.posts_acknowledged, total.posts_acknowledged_socket,
                total.posts_acknowledged_spool, total.posts_failed, total.posts_confirmed,
                total.broker_enqueued, dup_max,
                restarts == 0 ? 0.0 : static_cast<double>(dup_sum) / static_cast<double>(restarts),
                restarts, total.duplicates_total);
  out += buf;
  std::snprintf(buf, sizeof buf,
                "  of which records republished (checkpoint behind): max %" PRIu64
                ", mean %.2f; posts journaled twice: max %" PRIu64 ", mean %.2f\n",
                republished_max,
                restarts == 0 ? 0.0 : static_cast<double>(dup_sum - twice_sum) / static_cast<double>(restarts),
                twice_max,
                restarts == 0 ? 0.0 : static_cast<double>(twice_sum) / static_cast<double>(restarts));
  out += buf;
  out += "crash points:";
  for (const auto& [k, v] : total.crash_points) out += " " + k + "=" + std::to_string(v);
  out += "\nmost work in one round:";
  for (const auto& [k, v] : total.round_work_max) out += " " + k + "=" + std::to_string(v);
  out += "\nrings:";
  for (const auto& [k, v] : total.ring) out += " " + k + "=" + std::to_string(v);
  out += "\nfaults injected:";
  for (const auto& [k, v] : total.faults) out += "\n  " + k + " " + std::to_string(v);
  out += "\n";
  if (!by_invariant.empty()) {
    out += "failed invariants (seeds):";
    for (const auto& [k, v] : by_invariant) out += " " + k + "=" + std::to_string(v);
    out += "\n";
  }
  return out;
}

std::string DescribeFailure(const SimResult& r, const SimOptions& options) {
  std::string out = "seed " + std::to_string(r.seed) + " failed (replay: " +
                    ReplayCommand(options) + ")\n  config: " + r.config + "\n";
  for (const SimFailure& f : r.failures) out += "  " + f.invariant + ": " + f.detail + "\n";
  return out;
}

bool SimResult::ok_except_duplicates() const {
  return std::all_of(failures.begin(), failures.end(),
                     [](const SimFailure& f) { return f.invariant == kDuplicatesInvariant; });
}

SimResult RunSimulation(const SimOptions& options) {
  World world(options);
  return world.Run();
}

std::string ReplayCommand(const SimOptions& options) {
  std::string cmd = "build/tests/sim/sim_run --seed " + std::to_string(options.seed);
  if (options.checkpoint_every_move) cmd += " --checkpoint-every-move";
  if (options.no_disk_full) cmd += " --no-disk-full";
  return cmd + " --verbose";
}

}  // namespace postspool::sim
