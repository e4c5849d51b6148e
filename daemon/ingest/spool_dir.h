// The SpoolDir port (ports.h) on the real spool and quarantine directories.
// Never follows a link (O_NOFOLLOW, AT_SYMLINK_NOFOLLOW), never opens a
// FIFO in a way that waits (O_NONBLOCK), never replaces a file by a rename
// (RENAME_NOREPLACE), and never waits for a lock (sealing tries once).
#pragma once

#include <dirent.h>

#include <string>

#include "ports.h"
#include "unique_fd.h"

namespace postspool::daemon {

class RealSpoolDir final : public SpoolDir {
 public:
  RealSpoolDir() = default;
  ~RealSpoolDir() override;

  // Opens both directories and the inotify watch on the spool directory,
  // and counts what the quarantine holds.
  Status Open(const std::string& spool_dir, const std::string& quarantine_dir);
  // Readable when the spool directory changed: call DrainNotifications()
  // (TakeChanges reports what it read and never reads itself).
  int inotify_fd() const { return inotify_fd_.get(); }
  void DrainNotifications();

  Status List(size_t max, std::vector<SpoolEntry>* out, bool* pass_done) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status Open(const std::string& name, std::unique_ptr<SpoolFile>* out) override;
  Status Unlink(const std::string& name) override;
  Status Quarantine(const std::string& name, const std::string& target) override;
  uint64_t quarantine_bytes() const override { return quarantine_bytes_; }
  bool TakeChanges() override;

 private:
  UniqueFd dirfd_;
  UniqueFd quarantine_fd_;
  UniqueFd inotify_fd_;
  DIR* listing_ = nullptr;  // the pass in progress
  uint64_t quarantine_bytes_ = 0;
  bool changed_ = true;
};

// What an open file is, from fstat (and SEEK_HOLE when it may be sparse).
SpoolEntry DescribeOpenFile(int fd, const std::string& name);

}  // namespace postspool::daemon
