#include "spool.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace postspool::client {
namespace {

Status NotADirectory(const std::string& dir) {
  return Status(StatusCode::kNotFound, dir + " is not a directory", ENOTDIR);
}

}  // namespace

Status Spool::OpenDirectory() {
  appender_.reset();
  dirfd_.reset(::open(dir_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!dirfd_.valid()) {
    const int err = errno;
    if (err == ENOTDIR) return NotADirectory(dir_);
    return Status::FromErrno(err, "open " + dir_);
  }
  struct stat st;
  if (::fstat(dirfd_.get(), &st) != 0) {
    const Status s = Status::FromErrno(errno, "stat " + dir_);
    dirfd_.reset();
    return s;
  }
  dev_ = st.st_dev;
  ino_ = st.st_ino;
  segment::SegmentAppender::Options options;
  options.sync = sync_;
  appender_.emplace(dirfd_.get(), ::geteuid(), options);
  return Status::Ok();
}

Status Spool::Append(std::span<const std::byte> records, segment::Deadline deadline) {
  if (dirfd_.valid()) {
    struct stat st;
    if (::stat(dir_.c_str(), &st) != 0) {
      const int err = errno;
      appender_.reset();
      dirfd_.reset();
      if (err == ENOTDIR) return NotADirectory(dir_);
      return Status::FromErrno(err, "stat " + dir_);
    }
    if (st.st_dev != dev_ || st.st_ino != ino_) {  // replaced: reopen
      appender_.reset();
      dirfd_.reset();
    }
  }
  if (!dirfd_.valid()) {
    if (Status s = OpenDirectory(); !s.ok()) return s;
  }
  return appender_->Append(records, deadline);
}

}  // namespace postspool::client
