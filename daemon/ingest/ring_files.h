// The RingPort (ports.h) on System V shared memory: one segment per uid,
// made by the daemon, whose size nobody can change afterwards (a file or an
// unsealed descriptor could be truncated under the daemon's mapping, which
// then faults, or grown to fill the filesystem). The segment's owner is the
// uid it serves (mode 0600), so only that uid's processes attach it; its
// creator stays the daemon. ring_dir (the daemon's own directory, mode 0700)
// keeps one small record per ring, `<uid>.shm` (key and id), so that a
// restarted daemon reads the posts still in its rings. A doorbell thread
// sleeps in futex_waitv on every ring's doorbell word while the ingest loop
// sleeps.
//
// A process gets its uid's ring id over the socket (after SO_PEERCRED).
// Whatever a user does to its own segment (shmctl IPC_RMID or IPC_SET,
// scribbling over it) costs only that user's posts: the daemon's mapping
// stays valid and of the same size.
#pragma once

#include <sys/ipc.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "config.h"
#include "metrics.h"
#include "ports.h"
#include "unique_fd.h"

namespace postspool::daemon {

class RealRings final : public RingPort {
 public:
  RealRings(const Config& config, Metrics* metrics);
  ~RealRings() override;
  RealRings(const RealRings&) = delete;
  RealRings& operator=(const RealRings&) = delete;

  // Creates ring_dir if needed (checking it is the daemon's own and no one
  // else's to enter), attaches every ring its records name (posts made
  // before a restart), starts the doorbell thread. Nothing to do when
  // ring_dir is empty.
  Status Open();
  // Readable when the doorbell thread saw a doorbell rung; the loop reads
  // it (Drain) and calls Awake.
  int wake_fd() const { return wake_fd_.get(); }
  void DrainWakeFd();

  Status ForUid(uid_t uid, int* shm_id) override;
  const std::vector<Entry>& entries() const override { return entries_; }
  bool OwnerAlive(uint64_t identity) override;
  void Sleep() override;
  void Awake() override;
  bool Rang() const override { return state_.load(std::memory_order_acquire) == 2; }

 private:
  struct Segment {
    int shm_id = -1;
    void* map = nullptr;
    size_t bytes = 0;
    // Removed by its user (IPC_RMID, or logind's RemoveIPC at logout): still
    // read until the daemon stops, never handed out again.
    bool retired = false;
  };
  // The config's durability, as the ring header says it.
  uint32_t RingDurability() const;
  Status CreateRing(uid_t uid);
  Status AttachRing(uid_t uid, key_t key, int shm_id);
  bool Removed(const Segment& s) const;
  Status WriteRecord(uid_t uid, key_t key, int shm_id);
  void DoorbellThread();
  void WakeLoop();
  // The least time between two wake-ups of the loop by one ring's doorbell.
  static constexpr std::chrono::milliseconds kDoorbellGap{1};

  const Config& config_;
  Metrics* metrics_;
  UniqueFd dir_fd_;
  UniqueFd wake_fd_;
  std::vector<Entry> entries_;  // the loop's thread only
  std::vector<Segment> segments_;  // parallel to entries_
  std::vector<uid_t> refused_;  // uids whose ring could not be made (logged once)

  // The doorbell thread: state_ 0 = the loop walks the lanes (the thread
  // waits on state_), 1 = the rings sleep, though the loop may still serve
  // the socket (the thread waits on every doorbell and on state_), 2 = the
  // thread woke the loop and waits for it to say so (Rang()).
  // 3: the daemon stops (set by the destructor only).
  //
  // Only a loop that goes to sleep while the thread waits on state_ alone
  // wakes it (parked_ says when): the loop waking up does not, nor does a
  // sleep while the thread still waits on the doorbells from an earlier
  // one. A thread left waiting on the doorbells of a loop that is awake is
  // harmless: a ring wakes it, and its wake of the loop finds state_ not 1
  // and does nothing. Each of the loop's rounds used to wake the thread
  // twice (two futex calls and two thread switches per socket post).
  static constexpr uint32_t kStateStop = 3;
  std::atomic<uint32_t> state_{0};
  std::atomic<uint32_t> parked_{0};  // 1: the thread waits on state_ alone
  std::mutex doorbells_mu_;
  std::vector<uint32_t*> doorbells_;  // guarded by doorbells_mu_
  std::thread thread_;
};

}  // namespace postspool::daemon
