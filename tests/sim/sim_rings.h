// The per-uid shared-memory rings on a SimNode: the ring memory (what tmpfs
// holds: it survives a daemon crash, not a power loss), the process table
// that answers whether a lane's owner still runs, and SimRingPort, the
// RingPort (daemon/ports.h) one daemon process sees.
//
// The doorbell is modelled so that a lost wake-up shows: SimRingPort::Sleep
// says the ingest loop sleeps, and the simulation then runs no daemon round
// until a producer rang (Ring(), after ring::TakeDoorbell returned true),
// another event arrives, or the loop's timeout passes; a round that only
// the timeout woke first checks that no published record was left behind
// (World::CheckRingsNotStranded).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <vector>

#include "config.h"
#include "ports.h"
#include "ring_format.h"

namespace postspool::sim {

// Ring memory by uid, and the live processes (tmpfs and /proc).
class SimRingStore {
 public:
  // The ring of `uid`, or an invalid Ring if it has none.
  ring::Ring Get(uid_t uid) const;
  // Creates (and formats) the ring of `uid` if it has none.
  ring::Ring Create(uid_t uid, uint32_t lane_count, uint32_t lane_bytes, uint32_t durability);
  std::vector<uid_t> uids() const;  // ascending, as RealRings::Open reads ring_dir
  // Raw memory (the scribbler's view).
  std::span<std::byte> Memory(uid_t uid);
  // A power loss: tmpfs is gone.
  void Wipe() { rings_.clear(); }

  // The process table: identities (ring::MakeIdentity) of running processes.
  void Started(uint64_t identity) { alive_.insert(identity); }
  void Exited(uint64_t identity) { alive_.erase(identity); }
  bool Alive(uint64_t identity) const { return alive_.count(identity) != 0; }

 private:
  struct Mem {
    std::unique_ptr<uint64_t[]> words;  // 8-byte aligned, as a mapping is
    size_t bytes = 0;
  };
  std::map<uid_t, Mem> rings_;
  std::set<uint64_t> alive_;
};

// One daemon process's RingPort: opens the rings already in the store when
// it starts (as RealRings::Open does), creates them on ForUid.
class SimRingPort final : public daemon::RingPort {
 public:
  SimRingPort(const daemon::Config& config, SimRingStore* store);

  Status ForUid(uid_t uid, int* shm_id) override;
  // Each call is also a point where the producers, which run concurrently
  // with the daemon, may act (set_on_entries).
  const std::vector<Entry>& entries() const override {
    if (on_entries_) on_entries_();
    return entries_;
  }
  // The same, for the simulation's own looks (no producer acts).
  const std::vector<Entry>& rings() const { return entries_; }
  bool OwnerAlive(uint64_t identity) override { return store_->Alive(identity); }
  void Sleep() override;
  void Awake() override {
    if (asleep_) ++awakenings_;
    asleep_ = false;
  }
  bool Rang() const override { return asleep_ && rung_; }

  // A producer took a doorbell (ring::TakeDoorbell returned true) and
  // FUTEX_WAKEs it: the loop wakes if it sleeps.
  void Ring() {
    if (asleep_) rung_ = true;
  }
  // True while the loop sleeps and nobody rang since.
  bool asleep_unrung() const { return asleep_ && !rung_; }
  bool asleep() const { return asleep_; }
  uint64_t sleeps() const { return sleeps_; }
  // How often the loop woke the rings (and walked their lanes) after a Sleep.
  uint64_t awakenings() const { return awakenings_; }
  // Called in Sleep(): what the simulation notes about the moment (the uids
  // whose quota holds their lanes back).
  void set_on_sleep(std::function<void()> f) { on_sleep_ = std::move(f); }
  // Called whenever the Ingest looks at the rings: a producer may publish
  // right then, between two of the daemon's reads (a lost wake-up hides in
  // such a gap: after the last drain and before the doorbell is set).
  void set_on_entries(std::function<void()> f) { on_entries_ = std::move(f); }

 private:
  const daemon::Config& config_;
  SimRingStore* store_;
  std::vector<Entry> entries_;
  bool asleep_ = false;
  bool rung_ = false;
  uint64_t sleeps_ = 0;
  uint64_t awakenings_ = 0;
  std::function<void()> on_sleep_;
  std::function<void()> on_entries_;
};

}  // namespace postspool::sim
