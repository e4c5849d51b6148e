// SimStorage: the journal's Storage port (daemon/journal/storage.h) on SimFs, so
// that the real JournalWriter, JournalReader, Checkpoint,
// SetAsideDamagedSegment and DeleteConfirmedSegments run on the simulated
// disk: page cache vs durable state, power loss, torn and short writes,
// ENOSPC and EIO at the calls the seed picks, renames and links that are
// not durable before a directory fsync, and crash points in every mutation.
//
// Descriptors are the daemon's (SimNode's table). One SimStorage per daemon
// process: when the process died (SimNode::DaemonDied closed its
// descriptors), Close() of a descriptor it handed out is a no-op, so that
// objects torn down after the crash cannot close a later process's.
//
// The directories are SimFs's fixed ones: OpenDirectory of the journal path
// is kJournalDir, OpenAt(kJournalDir, "damaged", kDirectory) is kDamagedDir,
// which always exists (MakeDirectory says kAlreadyExists).
//
// An `oracle` storage (the invariant checks' view of the disk) injects no
// fault and is never a crash point; it still only reads.
#pragma once

#include <string>

#include "sim_node.h"
#include "storage.h"

namespace postspool::sim {

class SimStorage final : public daemon::Storage {
 public:
  static constexpr char kJournalPath[] = "/sim/journal";

  SimStorage(SimNode* node, bool oracle = false)
      : node_(node), oracle_(oracle), incarnation_(node->incarnation()) {}

  Status OpenDirectory(const std::string& path, int* fd) override;
  Status OpenAt(int dirfd, const std::string& name, OpenMode mode, int* fd) override;
  void Close(int fd) override;
  Status CreateComplete(int dirfd, const std::string& name, std::span<const std::byte> contents,
                        mode_t mode, bool sync, int* fd) override;
  Status MakeDirectory(int dirfd, const std::string& name, mode_t mode) override;
  Status ReadAt(int fd, uint64_t offset, std::span<std::byte> out, size_t* done) override;
  Status WriteAt(int fd, uint64_t offset, std::span<const std::byte> bytes,
                 size_t* done) override;
  Status SyncData(int fd) override;
  Status SyncDirectory(int dirfd) override;
  Status Truncate(int fd, uint64_t size) override;
  Status Stat(int fd, daemon::FileInfo* info) override;
  Status StatAt(int dirfd, const std::string& name, daemon::FileInfo* info) override;
  Status List(int dirfd, std::vector<std::string>* names) override;
  Status Rename(int from_dirfd, const std::string& from, int to_dirfd, const std::string& to,
                bool noreplace) override;
  Status Unlink(int dirfd, const std::string& name) override;

 private:
  bool Alive() const { return node_->incarnation() == incarnation_; }
  // The file or directory behind a descriptor of this process, or EBADF.
  int File(int fd, SimFs::Ino* ino, SimNode::FdEntry** entry = nullptr);
  int Dir(int fd, DirId* dir);

  SimNode* node_;
  bool oracle_;
  uint64_t incarnation_;
};

}  // namespace postspool::sim
