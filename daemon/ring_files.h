// The RingPort (ports.h) on real files: one ring file per uid in ring_dir
// (tmpfs, the daemon's own directory, mode 0700; files 0600), mapped
// MAP_SHARED, and a doorbell thread that sleeps in futex_waitv on every
// ring's doorbell word while the ingest loop sleeps.
//
// Nobody but the daemon opens a ring file by name: a process gets its uid's
// ring as a descriptor over the socket (SCM_RIGHTS, after SO_PEERCRED), so a
// user can map only their own ring and no name can be squatted.
#pragma once

#include <sys/types.h>

#include <atomic>
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
  // else's to enter), opens every ring file already there (posts made
  // before a restart), starts the doorbell thread. Nothing to do when
  // ring_dir is empty.
  Status Open();
  // Readable when the doorbell thread saw a doorbell rung; the loop reads
  // it (Drain) and calls Awake.
  int wake_fd() const { return wake_fd_.get(); }
  void DrainWakeFd();

  Status ForUid(uid_t uid, int* fd) override;
  const std::vector<Entry>& entries() const override { return entries_; }
  bool OwnerAlive(uint64_t identity) override;
  void Sleep() override;
  void Awake() override;

 private:
  struct File {
    UniqueFd fd;
    void* map = nullptr;
    size_t bytes = 0;
  };
  Status OpenRing(uid_t uid, bool create);
  void DoorbellThread();

  const Config& config_;
  Metrics* metrics_;
  UniqueFd dir_fd_;
  UniqueFd wake_fd_;
  std::vector<Entry> entries_;  // the loop's thread only
  std::vector<File> files_;
  std::vector<uid_t> refused_;  // uids whose ring file could not be made (logged once)

  // The doorbell thread: state_ 0 = the loop is awake (the thread waits on
  // state_), 1 = the loop sleeps (the thread waits on every doorbell and
  // on state_), 2 = the thread woke the loop and waits for it to say so.
  // 3: the daemon stops (set by the destructor only).
  static constexpr uint32_t kStateStop = 3;
  std::atomic<uint32_t> state_{0};
  std::mutex doorbells_mu_;
  std::vector<uint32_t*> doorbells_;  // guarded by doorbells_mu_
  std::thread thread_;
};

}  // namespace postspool::daemon
