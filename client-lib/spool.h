// The client's side of the spool directory: appends framed records to this
// user's current spool segment (format/segment_writer.h, SegmentAppender).
#pragma once

#include <sys/types.h>

#include <optional>
#include <span>
#include <string>

#include "segment_writer.h"
#include "status.h"
#include "unique_fd.h"

namespace postspool::client {

// The directory is opened O_PATH | O_DIRECTORY, which needs search but not
// read permission, so that the usual mode-1733 spool directory (users may
// create files in it but not list it) works. Before each append the path is
// checked to still name the directory that is open, so that a spool
// directory that was removed or replaced is noticed at once (a post written
// into a directory the daemon no longer watches would be lost).
//
// Owned by one process and used by one thread at a time (the Client
// serialises and replaces it after a fork).
class Spool {
 public:
  Spool(std::string dir, bool sync) : dir_(std::move(dir)), sync_(sync) {}

  // Appends whole framed records to <euid>.current with one write. Lock
  // waits end at `deadline` (kTimedOut). The other codes are as
  // Status::FromErrno maps errno; a path that is not a directory is
  // kNotFound with sys_errno ENOTDIR.
  Status Append(std::span<const std::byte> records, segment::Deadline deadline);

  // The segment the last successful Append wrote to (0 before any).
  uint64_t segment_id() const { return appender_ ? appender_->segment_id() : 0; }

 private:
  Status OpenDirectory();

  std::string dir_;
  bool sync_;
  UniqueFd dirfd_;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  // Borrows dirfd_, so it is declared after it (and destroyed before it).
  std::optional<segment::SegmentAppender> appender_;
};

}  // namespace postspool::client
