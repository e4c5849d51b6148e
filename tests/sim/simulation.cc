#include "simulation.h"

#include <algorithm>
#include <cassert>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "config.h"
#include "ingest.h"
#include "little_endian.h"
#include "log.h"
#include "metrics.h"
#include "post.h"
#include "recent_ids.h"
#include "segment_format.h"
#include "segment_writer.h"
#include "sim_forwarder.h"
#include "sim_io_loop.h"
#include "sim_journal.h"
#include "sim_node.h"
#include "sim_spool.h"
#include "socket_protocol.h"

namespace postspool::sim {
namespace {

using namespace std::chrono_literals;
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
  // A journal copy was hit by injected disk damage: the contract holds only
  // while the disk survives, so the post is exempt (and counted).
  bool damaged = false;
  uint32_t epoch = 0;  // when acknowledged
};

// One process of the running daemon: what a crash destroys.
struct DaemonProcess {
  daemon::Metrics metrics;
  daemon::JournalUsage usage;
  SimCommits commits;
  std::unique_ptr<SimJournal> journal;
  std::unique_ptr<SimSpoolDir> spool;
  std::unique_ptr<daemon::Ingest> ingest;
  std::unique_ptr<SimForwarder> forwarder;
  std::unique_ptr<SimIoLoop> loop;
  bool stopping = false;
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
    spool.reset();
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
  uint64_t request_id_ = 0;
  Clock::time_point socket_deadline_{};
  Clock::time_point append_done_at_{};
  Clock::time_point next_post_at_{};
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
  std::set<uint32_t> checkpoint_fault_epochs_;  // ... with a checkpoint write failed
  bool faults_on_ = true;
  uint32_t client_kill_ppm_ = 0;
  uint32_t slow_writer_ppm_ = 0;
  uint32_t stopped_writer_ppm_ = 0;
  uint64_t spool_segment_bytes_max_ = 16 << 10;

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

  SimOptions options_;
  SimResult result_;
  FakeBroker broker_;
  std::unique_ptr<DaemonProcess> dp_;
  std::vector<std::unique_ptr<Client>> clients_;
  Clock::time_point restart_at_{};
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
    spool_->Abort(records_, torn);
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
  flatbuffers::FlatBufferBuilder builder(512);
  for (uint32_t i = 0; i < n; ++i) {
    PostData p;
    p.id = PostId{(uint64_t{index_} << 32) | 0x5151, ++seq_};
    p.pub_time_ns = 1700000000000000000 + static_cast<int64_t>(seq_);
    if (!rng_.OneIn(4)) p.base_url = "sftp://node/";
    p.rel_path = "u" + std::to_string(uid_) + "/c" + std::to_string(index_) + "/p" +
                 std::to_string(seq_);
    if (invalid) p.rel_path += std::string(1, '\0');  // ValidatePost refuses a NUL
    p.size = static_cast<int64_t>(rng_.Below(1 << 20));
    p.mode = 0644;
    if (rng_.OneIn(3)) p.extras.emplace_back("pad", std::string(rng_.Range(1, 900), 'x'));
    if (rng_.OneIn(4)) p.extras.emplace_back("pad2", std::string(rng_.Range(1, 1000), 'y'));
    BuildPost(p, &builder);
    const auto span = builder.GetBufferSpan();
    if (!segment::AppendRecord(std::as_bytes(std::span(span.data(), span.size())), &out).ok()) {
      std::abort();
    }
    PostInfo& info = w_->posts_[p.id];
    info.client = index_;
    info.uid = uid_;
    info.rel_path = p.rel_path;
    info.hostile = hostile_;
    posts_.push_back(p.id);
    ++w_->stats_.posts_made;
  }
  return out;
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
  if (spool_->Commit(records_).ok()) {
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
        if (spool_->Commit(records_).ok()) {
          Acknowledge(true);
        } else {
          FailPosts();
        }
      }
      return;
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

  char buf[768];
  std::snprintf(
      buf, sizeof buf,
      "durability=%s batch_records_max=%u batch_bytes_max=%llu scan_entries_max=%u "
      "read_bytes_max=%llu segment_bytes_max=%llu disk_bytes_max=%llu per_uid=%llu "
      "quarantine_max=%llu dedupe=%u window=%u policy=%s checkpoint_interval_ms=%u "
      "connections_max=%u/%u fs_faults=x%u broker_faults=x%u crash_ppm=%u kill_ppm=%u "
      "clients=%u+%u hostile fault_ms=%llu",
      daemon::DurabilityName(c.durability), c.batch_records_max,
      static_cast<unsigned long long>(c.batch_bytes_max), c.spool_scan_entries_max,
      static_cast<unsigned long long>(c.spool_read_bytes_max),
      static_cast<unsigned long long>(c.journal_segment_bytes_max),
      static_cast<unsigned long long>(c.disk_bytes_max),
      static_cast<unsigned long long>(c.disk_bytes_per_uid_max),
      static_cast<unsigned long long>(c.quarantine_bytes_max), c.dedupe_window_posts,
      c.publish_window_max, c.unroutable_policy == daemon::UnroutablePolicy::kDrop ? "drop" : "retry",
      c.checkpoint_interval_ms, c.connections_max, c.connections_per_uid_max, k, b, crash_ppm_,
      kill_per_round_ppm_, benign, hostile, static_cast<unsigned long long>(fault_ms_));
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
  SimJournal::Options jo;
  jo.segment_bytes_max = config_.journal_segment_bytes_max;
  jo.sync = config_.durability == daemon::Durability::kSynced;
  if (Status s = SimJournal::Open(&node_, jo, &dp->usage, &dp->commits, &dp->journal); !s.ok()) {
    Trace("daemon start failed: journal: %s", s.ToString().c_str());
    ++stats_.start_failures;
    dp.reset();
    node_.DaemonDied();
    fs.ReviveDaemon();
    fs.Collect();
    restart_at_ = node_.clock.Now() + 100ms;  // systemd's RestartSec
    return;
  }
  dp->commits.Publish(dp->journal->end());
  dp->spool = std::make_unique<SimSpoolDir>(&node_);
  dp->spool->Open();
  daemon::RecentIds::Key key;
  for (auto& b : key) b = static_cast<unsigned char>(rng_.Next());
  dp->ingest = std::make_unique<daemon::Ingest>(
      config_, &dp->metrics,
      daemon::Ingest::Ports{&node_.clock, dp->journal.get(), dp->spool.get()}, "simhost", key,
      rng_.Next());
  // Daemon::RememberJournaledIds: the two newest segments before the new one.
  if (config_.dedupe_window_posts != 0) {
    std::vector<uint64_t> seqs = ListJournalSegments(fs);
    std::erase(seqs, dp->journal->end().segment_seq);
    const size_t first = seqs.size() > 2 ? seqs.size() - 2 : 0;
    for (size_t i = first; i < seqs.size(); ++i) {
      SimFs::Ino ino;
      if (!fs.Lookup(kJournalDir, daemon::JournalSegmentName(seqs[i]), &ino)) continue;
      if (fs.Sync(Actor::kDaemon, ino) != 0) continue;  // as daemon.cc: fdatasync first
      ReadRecords(fs.Get(ino)->data, 0, [&](const fb::Post& p, uint64_t, uint64_t) {
        dp->ingest->RememberJournaled(PostId{p.id()->hi(), p.id()->lo()});
      });
    }
  }
  dp->forwarder = std::make_unique<SimForwarder>(
      config_, SimForwarder::Options{options_.checkpoint_every_move}, &node_, &broker_,
      &dp->commits, &dp->usage, rng_.Next(), [this](const fb::Post& p) { CheckPublished(p); });
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
  if (dp_) {
    dp_->loop->CrashInFlight();
    dp_.reset();
  }
  node_.DaemonDied();
  const bool power_loss = config_.durability == daemon::Durability::kSynced && rng_.OneIn(2);
  if (power_loss) {
    ++stats_.power_losses;
    for (auto& c : clients_) c->Die(true);  // the whole node went down
    fs.PowerLoss();
  }
  fs.ReviveDaemon();
  fs.Collect();
  ++epoch_;
  // The bound on duplicates is for a process crash: a power loss also
  // loses the checkpoint writes since its last sync (checkpoint_interval_ms).
  if (power_loss) power_loss_epochs_.insert(epoch_);
  if (checkpoint_faulted) checkpoint_fault_epochs_.insert(epoch_);
  broker_.set_epoch(epoch_);
  Trace("daemon crashed at %s%s (crash %" PRIu64 ")", point.c_str(),
        power_loss ? " with a power loss" : "", stats_.crashes);
  CheckRecoverable("crash " + std::to_string(stats_.crashes) + " at " + point +
                   (power_loss ? " with a power loss" : ""));
  restart_at_ = node_.clock.Now() + milliseconds(rng_.Range(0, 300));
}

void World::FinishCleanStop() {
  dp_->forwarder->Stop(node_.clock.Now());
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
  if (!LoadCheckpoint(&fs, &cp).ok()) cp = JournalPosition{};
  for (uint64_t seq : ListJournalSegments(fs)) {
    if (seq < cp.segment_seq) continue;
    SimFs::Ino ino;
    if (!fs.Lookup(kJournalDir, daemon::JournalSegmentName(seq), &ino)) continue;
    ReadRecords(fs.Get(ino)->data, seq == cp.segment_seq ? cp.offset : 0,
                [&](const fb::Post& p, uint64_t, uint64_t) { ids.insert(PostId{p.id()->hi(), p.id()->lo()}); });
  }
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
  static const char* kDirNames[] = {"journal", "spool", "quarantine"};
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
  if (JournalPosition cp; LoadCheckpoint(&fs, &cp).ok()) {
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

void World::CheckRecoverable(const std::string& when) {
  const std::set<PostId> ids = Recoverable(nullptr);
  const auto& ledger = broker_.ledger();
  for (const auto& [id, p] : posts_) {
    if (!p.acknowledged || p.hostile || p.damaged) continue;
    auto l = ledger.find(id);
    if (l != ledger.end() && (l->second.confirmed || l->second.dropped)) continue;
    if (ids.count(id) != 0) continue;
    Fail("acknowledged_is_recoverable",
         "after " + when + ": post " + Hex(id) + " (client " + std::to_string(p.client) + ", " +
             (p.via_spool ? "spooled" : "socket") + ", acknowledged in epoch " +
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
  std::vector<uint64_t> seqs = ListJournalSegments(fs);
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
  ReadRecords(in->data, 0, [&](const fb::Post& p, uint64_t at, uint64_t next) {
    if (at > hi || next <= lo) return;
    auto it = posts_.find(PostId{p.id()->hi(), p.id()->lo()});
    if (it != posts_.end()) it->second.damaged = true;
    ++hit;
  });
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
  const auto& ledger = broker_.ledger();
  for (const auto& [id, p] : posts_) {
    if (!p.acknowledged || p.hostile || p.damaged) continue;
    auto l = ledger.find(id);
    if (l == ledger.end() || !(l->second.confirmed || l->second.dropped)) {
      *why = "acknowledged post " + Hex(id) + " (" + (p.via_spool ? "spooled" : "socket") +
             ") is not confirmed; copies:" + Locate(id);
      return false;
    }
  }
  if (dp_->forwarder->watermark() < dp_->commits.end) {
    *why = "the forwarder's watermark is behind the committed end of the journal";
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
  }
  broker_.Step(now);
  for (auto& c : clients_) c->Step(now, producing);

  if (!dp_) {
    if (now >= restart_at_) StartDaemon();
    return;
  }
  SimFs& fs = node_.fs;
  if (!dp_->draining) {
    // After the Ingest is done the daemon runs no more rounds; only its
    // forwarder drains.
    if (Status s = dp_->loop->RunOnce(0); !s.ok()) std::abort();
    if (!fs.daemon_dead()) CheckBoundedWork();
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
    if (dp_->draining && (dp_->forwarder->watermark() >= dp_->drain_target ||
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
  // The final word on every acknowledged post (Drained checked it too).
  const auto& ledger = broker_.ledger();
  uint64_t dropped = 0;
  for (const auto& [id, p] : posts_) {
    auto l = ledger.find(id);
    if (l != ledger.end() && l->second.confirmed) ++stats_.posts_confirmed;
    if (!p.acknowledged || p.hostile || p.damaged) continue;
    if (l != ledger.end() && l->second.dropped && !l->second.confirmed) {
      ++dropped;
      continue;
    }
    if (l == ledger.end() || !l->second.confirmed) {
      Fail("acknowledged_is_confirmed", "post " + Hex(id) + " (client " + std::to_string(p.client) +
                                            ", " + (p.via_spool ? "spooled" : "socket") +
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
    } else if (republished > config_.publish_window_max) {
      Fail(kDuplicatesInvariant,
           "restart " + std::to_string(e) + " caused " + std::to_string(d) + " duplicates (" +
               std::to_string(d - twice) + " records republished, " + std::to_string(twice) +
               " posts journaled twice); publish_window_max is " +
               std::to_string(config_.publish_window_max) +
               (config_.dedupe_window_posts == 0 ? "; dedupe_window_posts is 0" : ""));
    }
  }
  stats_.virtual_ms = static_cast<uint64_t>(
      std::chrono::duration_cast<milliseconds>(node_.clock.Now() - start).count());
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
