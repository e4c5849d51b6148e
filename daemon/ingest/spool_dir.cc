#include "spool_dir.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "segment_writer.h"

namespace postspool::daemon {
namespace {

// What a file costs the quarantine at least, however small: its inode and
// directory entry. Keeps a flood of empty files bounded by
// quarantine_bytes_max too.
constexpr uint64_t kFileCostMin = 4096;

SpoolEntry FromStat(const struct stat& st, const std::string& name) {
  SpoolEntry e;
  e.name = name;
  e.regular = S_ISREG(st.st_mode);
  e.owner = st.st_uid;
  e.group = st.st_gid;
  e.links = st.st_nlink;
  e.size = static_cast<uint64_t>(st.st_size);
  e.allocated_bytes = static_cast<uint64_t>(st.st_blocks) * 512;
  e.mtime_s = st.st_mtime;
  return e;
}

// A hole before the end: only possible when fewer bytes are allocated than
// the file is long; SEEK_HOLE then says where the first hole is (a
// compressed file system allocates less without a hole).
bool HasHole(int fd, const SpoolEntry& e) {
  if (!e.regular || e.allocated_bytes >= e.size) return false;
  const off_t hole = ::lseek(fd, 0, SEEK_HOLE);
  return hole >= 0 && static_cast<uint64_t>(hole) < e.size;
}

class RealSpoolFile final : public SpoolFile {
 public:
  RealSpoolFile(UniqueFd fd, SpoolEntry entry) : fd_(std::move(fd)), entry_(std::move(entry)) {}
  const SpoolEntry& entry() const override { return entry_; }
  Status TrySeal(bool sync) override {
    // A deadline in the past: one attempt at the lock, no waiting.
    return segment::SealSegment(fd_.get(), segment::Deadline{}, sync);
  }
  segment::Source* source() override {
    if (!source_) {
      if (!segment::FileSource::Open(fd_.get(), &source_).ok()) return nullptr;
    }
    return source_.get();
  }

 private:
  UniqueFd fd_;
  SpoolEntry entry_;
  std::unique_ptr<segment::FileSource> source_;
};

}  // namespace

SpoolEntry DescribeOpenFile(int fd, const std::string& name) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return SpoolEntry{name};
  SpoolEntry e = FromStat(st, name);
  e.has_hole = HasHole(fd, e);
  return e;
}

RealSpoolDir::~RealSpoolDir() {
  if (listing_ != nullptr) ::closedir(listing_);
}

Status RealSpoolDir::Open(const std::string& spool_dir, const std::string& quarantine_dir) {
  dirfd_.reset(::open(spool_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dirfd_.valid()) return Status::FromErrno(errno, "open spool directory " + spool_dir);
  quarantine_fd_.reset(::open(quarantine_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!quarantine_fd_.valid()) {
    return Status::FromErrno(errno, "open quarantine directory " + quarantine_dir);
  }
  inotify_fd_.reset(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (!inotify_fd_.valid()) return Status::FromErrno(errno, "inotify_init1");
  // Not IN_CLOSE_WRITE: the daemon's own descriptors (opened O_RDWR to seal)
  // would raise it and wake the daemon for its own work.
  if (::inotify_add_watch(inotify_fd_.get(), spool_dir.c_str(),
                          IN_CREATE | IN_MOVED_TO | IN_MODIFY) < 0) {
    return Status::FromErrno(errno, "inotify_add_watch " + spool_dir);
  }
  // What the quarantine holds already counts against its bound.
  const int qfd = ::openat(quarantine_fd_.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (qfd < 0) return Status::FromErrno(errno, "list quarantine directory " + quarantine_dir);
  DIR* q = ::fdopendir(qfd);
  if (q == nullptr) {
    ::close(qfd);
    return Status::FromErrno(errno, "list quarantine directory " + quarantine_dir);
  }
  while (dirent* e = ::readdir(q)) {
    if (e->d_name[0] == '.' && (e->d_name[1] == '\0' || (e->d_name[1] == '.' && e->d_name[2] == '\0'))) {
      continue;
    }
    struct stat st;
    if (::fstatat(quarantine_fd_.get(), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
      quarantine_bytes_ += std::max<uint64_t>(static_cast<uint64_t>(st.st_blocks) * 512, kFileCostMin);
    }
  }
  ::closedir(q);
  return Status::Ok();
}

void RealSpoolDir::DrainNotifications() {
  alignas(inotify_event) char buf[4096];
  while (::read(inotify_fd_.get(), buf, sizeof buf) > 0) changed_ = true;
  // IN_Q_OVERFLOW lands here too: the scan finds everything anyway.
}

bool RealSpoolDir::TakeChanges() {
  // Not read here: the loop calls DrainNotifications when the descriptor
  // is readable, and a read that finds nothing would cost every round a
  // system call.
  const bool changed = changed_;
  changed_ = false;
  return changed;
}

Status RealSpoolDir::List(size_t max, std::vector<SpoolEntry>* out, bool* pass_done) {
  out->clear();
  *pass_done = false;
  if (listing_ == nullptr) {
    const int fd = ::openat(dirfd_.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, "open spool directory");
    listing_ = ::fdopendir(fd);
    if (listing_ == nullptr) {
      ::close(fd);
      return Status::FromErrno(errno, "list spool directory");
    }
  }
  while (out->size() < max) {
    errno = 0;
    dirent* d = ::readdir(listing_);
    if (d == nullptr) {
      const int err = errno;
      ::closedir(listing_);
      listing_ = nullptr;
      if (err != 0) return Status::FromErrno(err, "list spool directory");
      *pass_done = true;
      return Status::Ok();
    }
    const std::string name = d->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    if (::fstatat(dirfd_.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    SpoolEntry e = FromStat(st, name);
    if (e.regular && e.allocated_bytes < e.size) {
      UniqueFd fd(::openat(dirfd_.get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
      if (fd.valid()) e.has_hole = HasHole(fd.get(), e);
    }
    out->push_back(std::move(e));
  }
  return Status::Ok();
}

Status RealSpoolDir::Rename(const std::string& from, const std::string& to) {
  if (::renameat2(dirfd_.get(), from.c_str(), dirfd_.get(), to.c_str(), RENAME_NOREPLACE) != 0) {
    return Status::FromErrno(errno, "rename " + from + " to " + to);
  }
  return Status::Ok();
}

Status RealSpoolDir::Open(const std::string& name, std::unique_ptr<SpoolFile>* out) {
  // O_RDWR to set the sealed flag; O_NONBLOCK so that a FIFO never waits;
  // O_NOFOLLOW so that a symlink is refused.
  UniqueFd fd(::openat(dirfd_.get(), name.c_str(),
                       O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (!fd.valid()) return Status::FromErrno(errno, "open " + name);
  SpoolEntry e = DescribeOpenFile(fd.get(), name);
  *out = std::make_unique<RealSpoolFile>(std::move(fd), std::move(e));
  return Status::Ok();
}

Status RealSpoolDir::Unlink(const std::string& name) {
  if (::unlinkat(dirfd_.get(), name.c_str(), 0) != 0) {
    return Status::FromErrno(errno, "delete " + name);
  }
  return Status::Ok();
}

Status RealSpoolDir::Quarantine(const std::string& name, const std::string& target) {
  struct stat st;
  const uint64_t bytes = ::fstatat(dirfd_.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0
                             ? static_cast<uint64_t>(st.st_blocks) * 512 : 0;
  if (::renameat2(dirfd_.get(), name.c_str(), quarantine_fd_.get(), target.c_str(),
                  RENAME_NOREPLACE) != 0) {
    return Status::FromErrno(errno, "move " + name + " to the quarantine");
  }
  quarantine_bytes_ += std::max(bytes, kFileCostMin);
  return Status::Ok();
}

}  // namespace postspool::daemon
