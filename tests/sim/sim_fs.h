// SimFs: the node's disk as byte arrays, in the manner of LevelDB's
// fault-injection Env (db/fault_injection_test.cc), with faults drawn from
// the run's seed.
//
// Two layers of state:
//  - what reads see (the page cache): every write and directory change that
//    returned success;
//  - what survives a power loss: per file, the bytes as of its last
//    successful fdatasync (a failed fdatasync discards the writes it was
//    meant to make durable, as Linux does: they stay readable but never
//    reach the disk); per directory, the entries as of the last directory
//    fsync (one metadata journal for the whole file system, as ext4 has:
//    any directory fsync commits every pending change).
// A crash of the daemon *process* keeps everything (the page cache
// survives): durability `accepted`. A power loss (PowerLoss) keeps, per
// file, its durable bytes plus a random prefix of its later writes (the last
// one possibly torn), and a random prefix of the pending directory changes:
// durability `synced`.
//
// Faults (per operation, from FaultRates): EIO and ENOSPC from writes,
// short writes (a prefix lands, the count says so), torn writes (a prefix
// lands and EIO is returned), EIO from fdatasync and directory fsync, EIO
// and ENOSPC from create/link/rename/unlink, EIO from reads, and a full disk
// (set_full) during which nothing grows.
//
// Crash points: every mutation the daemon makes may be the one during which
// it dies (crash_ppm); the operation then lands or not (a write possibly
// torn), and every later daemon operation has no effect until the world
// tears the daemon down at the end of the round.
//
// Directory listings are in inode order, never in name order: names hold
// random segment ids (segment::NewSegmentId) that must not steer a run.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "sim_rng.h"
#include "sim_stats.h"

namespace postspool::sim {

enum class Actor : uint8_t { kDaemon, kClient };
// kDamagedDir: the journal's damaged/ (SetAsideDamagedSegment), always there.
enum DirId : int {
  kJournalDir = 0,
  kSpoolDir = 1,
  kQuarantineDir = 2,
  kDamagedDir = 3,
  kDirCount = 4
};

struct FaultRates {  // per operation, parts per million
  uint32_t write_eio = 0;
  uint32_t write_enospc = 0;
  uint32_t write_short = 0;
  uint32_t write_torn = 0;
  uint32_t sync_eio = 0;
  uint32_t meta_eio = 0;
  uint32_t meta_enospc = 0;
  uint32_t read_eio = 0;
};

class SimFs {
 public:
  using Ino = uint64_t;
  static constexpr uint64_t kAppend = UINT64_MAX;
  static constexpr uint64_t kBlockBytes = 4096;

  struct PendingWrite {
    uint64_t offset;
    std::vector<std::byte> bytes;
  };
  struct Inode {
    Ino ino = 0;
    bool regular = true;
    bool sparse = false;  // a hole before its end (only squatters make one)
    uid_t owner = 0;
    gid_t group = 0;
    int64_t mtime_s = 0;
    std::vector<std::byte> data;     // what reads see
    std::vector<std::byte> durable;  // what a power loss keeps
    std::vector<PendingWrite> pending;  // writes since the last successful fdatasync
    uint32_t links = 0;         // entries naming it in the (page-cache) directories
    uint32_t refs = 0;          // open descriptors
    uint32_t shared_locks = 0;  // flock(LOCK_SH) holders
    uint32_t wb_err = 0;        // writeback errors so far (Linux's errseq_t)
    uint64_t allocated() const { return (data.size() + kBlockBytes - 1) / kBlockBytes * kBlockBytes; }
  };

  SimFs(SimRng rng, SimStats* stats) : rng_(rng), stats_(stats) {}

  void set_rates(const FaultRates& rates) { rates_ = rates; }
  void set_full(bool full) { full_ = full; }
  void set_capacity(uint64_t bytes) { capacity_ = bytes; }
  void set_wall_seconds(int64_t s) { wall_s_ = s; }
  // Sees every fault injected (verbose runs).
  void set_trace(std::function<void(const std::string&)> f) { trace_ = std::move(f); }
  // Probability that a daemon mutation is where the daemon dies.
  void set_crash_ppm(uint32_t ppm) { crash_ppm_ = ppm; }
  bool daemon_dead() const { return daemon_dead_; }
  const std::string& crash_point() const { return crash_point_; }
  // Kills the daemon between operations (the world's own crash points).
  void KillDaemon(const std::string& point) {
    daemon_dead_ = true;
    crash_point_ = point;
  }
  void ReviveDaemon() {
    daemon_dead_ = false;
    crash_point_.clear();
  }

  // Directory operations; 0 or an errno.
  int CreateUnnamed(Actor actor, uid_t owner, gid_t group, Ino* out);  // O_TMPFILE
  // O_CREAT (| O_EXCL): with `excl`, EEXIST if the name exists; without it
  // an existing file is replaced by a new, empty one (O_TRUNC as far as
  // anybody can tell).
  int Create(Actor actor, DirId dir, const std::string& name, uid_t owner, gid_t group, bool excl,
             bool regular, Ino* out);
  int Link(Actor actor, DirId dir, const std::string& name, Ino ino);
  int Rename(Actor actor, DirId from_dir, const std::string& from, DirId to_dir,
             const std::string& to, bool noreplace);
  int Unlink(Actor actor, DirId dir, const std::string& name);
  int SyncDir(Actor actor);

  // File operations. Write returns the bytes written or -errno.
  int64_t Write(Actor actor, Ino ino, uint64_t offset, std::span<const std::byte> bytes);
  // fdatasync through a descriptor that last saw `*seen` writeback errors
  // (null: one opened just now). As Linux (errseq_t, 4.13 and later): a
  // failed writeback is reported once to every descriptor open at the
  // time, whoever made the write.
  int Sync(Actor actor, Ino ino, uint32_t* seen = nullptr);
  // ftruncate to a smaller size: the bytes past it are gone, from the page
  // cache and the disk alike.
  int Truncate(Actor actor, Ino ino, uint64_t size);
  // A read of `ino` fails with EIO (0: it works; the caller reads data).
  int ReadFault(Actor actor);

  bool Lookup(DirId dir, const std::string& name, Ino* ino) const;
  Inode* Get(Ino ino);
  const Inode* Get(Ino ino) const;
  // Entries in inode order.
  std::vector<std::pair<std::string, Ino>> List(DirId dir) const;
  void Ref(Ino ino);
  void Unref(Ino ino);
  // Drops every open descriptor and lock (all processes died).
  void DropAllRefs();
  uint64_t UsedBytes() const;

  // Whole node loses power.
  void PowerLoss();
  // Frees inodes nobody can reach any more.
  void Collect();

  // A daemon operation that has no effect: the daemon is dead, or dies in
  // it. *lands: the operation still takes effect (the kernel finished it).
  bool DaemonDies(Actor actor, const char* op, bool* lands);

 private:
  struct MetaOp {
    enum Kind { kLink, kUnlink, kRename } kind;
    DirId dir;
    std::string name;
    DirId to_dir;
    std::string to;
    Ino ino;
  };
  using Dirs = std::map<std::string, Ino>[kDirCount];
  static void Apply(const MetaOp& op, std::map<std::string, Ino>* dirs);
  void Record(MetaOp op);
  void Recount();
  bool Fault(uint32_t ppm, const char* kind);
  Ino NewInode(uid_t owner, gid_t group, bool regular);
  void ApplyWrite(Inode* in, uint64_t offset, std::span<const std::byte> bytes);

  SimRng rng_;
  SimStats* stats_;
  std::function<void(const std::string&)> trace_;
  FaultRates rates_;
  bool full_ = false;
  uint64_t capacity_ = UINT64_MAX;
  int64_t wall_s_ = 0;
  uint32_t crash_ppm_ = 0;
  bool daemon_dead_ = false;
  std::string crash_point_;
  Ino next_ino_ = 100;
  std::map<Ino, Inode> inodes_;
  std::map<std::string, Ino> dirs_[kDirCount];
  std::map<std::string, Ino> durable_dirs_[kDirCount];
  std::vector<MetaOp> meta_pending_;
};

// errno to the Status the real code makes of it (Status::FromErrno).
const char* ErrnoName(int err);

}  // namespace postspool::sim
