// The spool directory on SimFs, from both sides.
//
// SimSpoolDir / SimSpoolFile: the SpoolDir port (ports.h) the daemon's
// SpoolAdopter uses, as RealSpoolDir implements it (no replacing renames,
// seal tried once, never waiting), counting the work each round asks of it.
//
// SimSpoolWriter: a client's side of the spool protocol
// (segment::SegmentAppender on SimFs): append under a shared lock to
// <uid>.current after checking the sealed flag and that the name still
// names the open file; create a segment atomically; roll over a full one.
// An append may be split in two (Prepare takes the lock and checks, Commit
// writes) so that a slow or stopped writer holds the lock across rounds,
// and a writer killed in between leaves a torn record (Abort).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ports.h"
#include "sim_node.h"

namespace postspool::sim {

// What the daemon asked of the spool directory in one round.
struct SpoolWork {
  uint64_t lists = 0;
  uint64_t entries = 0;  // listed
  uint64_t renames = 0;
  uint64_t opens = 0;
  uint64_t seals = 0;
  uint64_t unlinks = 0;
  uint64_t quarantines = 0;
  uint64_t bytes_read = 0;
};

class SimSpoolDir final : public daemon::SpoolDir {
 public:
  explicit SimSpoolDir(SimNode* node) : node_(node) {}
  // As RealSpoolDir::Open: counts what the quarantine holds.
  void Open();

  Status List(size_t max, std::vector<daemon::SpoolEntry>* out, bool* pass_done) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status Open(const std::string& name, std::unique_ptr<daemon::SpoolFile>* out) override;
  Status Unlink(const std::string& name) override;
  Status Quarantine(const std::string& name, const std::string& target) override;
  uint64_t quarantine_bytes() const override { return quarantine_bytes_; }
  bool TakeChanges() override;

  SpoolWork& work() { return work_; }

 private:
  SimNode* node_;
  std::vector<std::string> pass_;  // the names of the pass in progress
  size_t pass_pos_ = 0;
  bool in_pass_ = false;
  uint64_t quarantine_bytes_ = 0;
  SpoolWork work_;
};

// What fstat says about an inode, as a SpoolEntry.
daemon::SpoolEntry DescribeInode(const SimFs::Inode& in, const std::string& name);

class SimSpoolWriter {
 public:
  struct Options {
    uint64_t segment_bytes_max = 16 << 10;
    bool sync = false;  // sync_spool
  };
  SimSpoolWriter(SimNode* node, uid_t uid, gid_t spool_gid, Options options, SimRng* rng)
      : node_(node), uid_(uid), spool_gid_(spool_gid), options_(options), rng_(rng) {}
  ~SimSpoolWriter() { Close(); }
  SimSpoolWriter(const SimSpoolWriter&) = delete;
  SimSpoolWriter& operator=(const SimSpoolWriter&) = delete;

  // Finds the current segment, takes its shared lock and checks it is
  // writable; ok: the lock is held until Commit or Abort. `bytes` is the
  // size of the append (for the roll-over).
  Status Prepare(size_t bytes);
  // Writes the records with one O_APPEND write (and fdatasync with sync),
  // then unlocks.
  // *written: the bytes that reached the file (all of them; fewer, or a
  // torn prefix, on a failed write), whether or not the sync then failed.
  Status Commit(std::span<const std::byte> records, size_t* written = nullptr);
  // The writer dies with the lock held, after writing `torn` bytes of the
  // records (maybe none).
  // Returns the bytes that reached the file.
  size_t Abort(std::span<const std::byte> records, size_t torn);
  // Prepare + Commit.
  Status Append(std::span<const std::byte> records);
  // The process dies between appends.
  void Close();
  SimFs::Ino ino() const { return ino_; }
  bool open() const { return open_; }

 private:
  Status OpenCurrent();
  Status RollOver();
  Status CreateSegment(const std::string& name, SimFs::Ino* ino);
  bool StillCurrent() const;

  SimNode* node_;
  uid_t uid_;
  gid_t spool_gid_;
  Options options_;
  SimRng* rng_;
  bool open_ = false;
  bool locked_ = false;
  SimFs::Ino ino_ = 0;
  uint32_t wb_err_seen_ = 0;
  uint64_t open_segment_id_ = 0;
};

}  // namespace postspool::sim
