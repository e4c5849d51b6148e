#include "segment_writer.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <thread>

#include "little_endian.h"

namespace postspool::segment {
namespace {

constexpr int kReopenAttemptsMax = 8;

Status WriteAll(int fd, const std::byte* data, size_t n, std::string_view what) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, what);
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

// flock with a deadline: non-blocking attempts with a short, growing sleep.
Status LockUntil(int fd, int op, Deadline deadline) {
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    if (::flock(fd, op | LOCK_NB) == 0) return Status::Ok();
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) return Status::FromErrno(errno, "flock segment");
    const auto now = Clock::now();
    if (now >= deadline) return Status(StatusCode::kTimedOut, "segment lock not had in time");
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

void Unlock(int fd) { ::flock(fd, LOCK_UN); }

Status ReadFlags(int fd, uint32_t* flags) {
  std::byte raw[4];
  for (;;) {
    const ssize_t n = ::pread(fd, raw, sizeof raw, kFlagsOffset);
    if (n == sizeof raw) break;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, "read segment flags");
    return Status(StatusCode::kCorruption, "segment shorter than its header");
  }
  *flags = LoadLe32(raw);
  return Status::Ok();
}

bool SameFile(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

}  // namespace

NewNameSync NewNameSyncFor(int dirfd) {
  const int flags = ::fcntl(dirfd, F_GETFL);
  if (flags < 0 || (flags & O_PATH) != 0) return NewNameSync::kFile;
  return NewNameSync::kFileAndDirectory;
}

uint64_t NewSegmentId() {
  uint64_t id = 0;
  while (::getrandom(&id, sizeof id, 0) != static_cast<ssize_t>(sizeof id)) {
    assert(errno == EINTR);  // 8 bytes never block once the pool is ready
  }
  return id;
}

Status CreateSegment(int dirfd, const std::string& name, const Header& header, mode_t mode,
                     bool sync, UniqueFd* out) {
  std::array<std::byte, kHeaderBytes> raw;
  EncodeHeader(header, raw);
  return CreateFileComplete(dirfd, name, raw, mode, sync, out);
}

Status CreateFileComplete(int dirfd, const std::string& name, std::span<const std::byte> raw,
                          mode_t mode, bool sync, UniqueFd* out) {
  // An unnamed file (O_TMPFILE) linked into place through /proc; where the
  // filesystem or a missing /proc does not allow that, a uniquely named
  // temporary. Either way the name is made with link(), which fails if it
  // exists: an existing segment is never replaced.
  std::string tmp_name;
  UniqueFd fd;
  if (::access("/proc/self/fd", F_OK) == 0) {
    fd.reset(::openat(dirfd, ".", O_TMPFILE | O_RDWR | O_APPEND | O_CLOEXEC, mode));
  }
  if (!fd.valid()) {
    if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL && errno != ENOENT) {
      return Status::FromErrno(errno, "create segment " + name);
    }
    char buf[64];
    std::snprintf(buf, sizeof buf, ".tmp.%d.%016llx", static_cast<int>(::getpid()),
                  static_cast<unsigned long long>(NewSegmentId()));
    tmp_name = buf;
    fd.reset(::openat(dirfd, tmp_name.c_str(),
                      O_CREAT | O_EXCL | O_RDWR | O_APPEND | O_NOFOLLOW | O_CLOEXEC, mode));
    if (!fd.valid()) return Status::FromErrno(errno, "create segment " + name);
  }
  auto fail = [&](Status s) {
    if (!tmp_name.empty()) ::unlinkat(dirfd, tmp_name.c_str(), 0);
    return s;
  };
  if (::fchmod(fd.get(), mode) != 0) return fail(Status::FromErrno(errno, "chmod " + name));
  if (Status s = WriteAll(fd.get(), raw.data(), raw.size(), "write segment header " + name);
      !s.ok()) {
    return fail(std::move(s));
  }
  if (sync && ::fdatasync(fd.get()) != 0) return fail(Status::FromErrno(errno, "sync " + name));

  int rc;
  if (tmp_name.empty()) {
    char proc[64];
    std::snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd.get());
    rc = ::linkat(AT_FDCWD, proc, dirfd, name.c_str(), AT_SYMLINK_FOLLOW);
  } else {
    rc = ::linkat(dirfd, tmp_name.c_str(), dirfd, name.c_str(), 0);
    ::unlinkat(dirfd, tmp_name.c_str(), 0);
  }
  if (rc != 0) return Status::FromErrno(errno, "link segment " + name);
  Status synced = Status::Ok();
  if (sync) {
    // The new name must survive a power loss. fsync of the file after the
    // link commits the journal transaction that holds the link (the inode's
    // link count changed in the same transaction as the directory entry) on
    // journaling filesystems (ext4, xfs; btrfs logs new names on fsync).
    // That is all a user who may not read the spool directory can do: its
    // O_PATH descriptor cannot be fsync'ed, and a directory cannot be opened
    // for reading without read permission. Where the descriptor allows it,
    // the directory is fsync'ed as well, as POSIX asks. Never syncfs: it
    // would write out every dirty page of the filesystem, anyone's.
    // If either fails the name is there but may not survive a power loss:
    // the file is handed back with the error, for the caller to move aside.
    if (::fsync(fd.get()) != 0) {
      synced = Status::FromErrno(errno, "sync segment " + name);
    } else if (NewNameSyncFor(dirfd) == NewNameSync::kFileAndDirectory && ::fsync(dirfd) != 0) {
      synced = Status::FromErrno(errno, "sync spool directory");
    }
  }
  *out = std::move(fd);
  return synced;
}

Status ReadHeader(int fd, Header* header) {
  std::array<std::byte, kHeaderBytes> raw;
  size_t done = 0;
  while (done < raw.size()) {
    const ssize_t n = ::pread(fd, raw.data() + done, raw.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, "read segment header");
    if (n == 0) return Status(StatusCode::kCorruption, "segment header truncated");
    done += static_cast<size_t>(n);
  }
  return DecodeHeader(raw, header);
}

Status AppendToSegment(int fd, std::span<const std::byte> records, Deadline deadline, bool sync,
                       const std::function<bool()>& still_current) {
  if (Status s = LockUntil(fd, LOCK_SH, deadline); !s.ok()) return s;
  uint32_t flags = 0;
  Status s = ReadFlags(fd, &flags);
  if (s.ok() && ((flags & kFlagSealed) != 0 || (still_current && !still_current()))) {
    s = Status(StatusCode::kSealed, "segment is sealed");
  }
  if (s.ok()) {
    // One write() of whole records: O_APPEND makes the seek-and-write atomic
    // with respect to the other appenders. A short write is not continued,
    // since another process may already have appended after it.
    ssize_t w;
    do {
      w = ::write(fd, records.data(), records.size());
    } while (w < 0 && errno == EINTR);
    if (w < 0) {
      s = Status::FromErrno(errno, "append to segment");
    } else if (static_cast<size_t>(w) != records.size()) {
      s = Status(StatusCode::kNoSpace, "short write to segment (" + std::to_string(w) + " of " +
                                           std::to_string(records.size()) + " bytes)");
    } else if (sync && ::fdatasync(fd) != 0) {
      s = Status::FromErrno(errno, "sync segment");
    }
  }
  Unlock(fd);
  return s;
}

Status SealSegment(int fd, Deadline deadline, bool sync) {
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0) return Status::FromErrno(errno, "fcntl segment");
  if ((fl & O_APPEND) != 0 || (fl & O_ACCMODE) != O_RDWR) {
    return Status(StatusCode::kInvalidArgument,
                  "sealing needs a descriptor opened O_RDWR without O_APPEND");
  }
  if (Status s = LockUntil(fd, LOCK_EX, deadline); !s.ok()) return s;
  uint32_t flags = 0;
  Status s = ReadFlags(fd, &flags);
  if (s.ok() && (flags & kFlagSealed) == 0) {
    std::byte raw[4];
    StoreLe32(raw, flags | kFlagSealed);
    ssize_t w;
    do {
      w = ::pwrite(fd, raw, sizeof raw, kFlagsOffset);
    } while (w < 0 && errno == EINTR);
    if (w != sizeof raw) {
      s = w < 0 ? Status::FromErrno(errno, "seal segment")
                : Status(StatusCode::kIoError, "short write sealing segment");
    } else if (sync && ::fdatasync(fd) != 0) {
      s = Status::FromErrno(errno, "sync sealed segment");
    }
  }
  Unlock(fd);
  return s;
}

std::string SpoolCurrentName(uid_t uid) { return std::to_string(uid) + ".current"; }

std::string SpoolPrivateCurrentName(uid_t uid, uint64_t segment_id) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%u.%016llx.current", static_cast<unsigned>(uid),
                static_cast<unsigned long long>(segment_id));
  return buf;
}

std::string SpoolSealedName(uid_t uid, uint64_t segment_id) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%u.%016llx.sealed", static_cast<unsigned>(uid),
                static_cast<unsigned long long>(segment_id));
  return buf;
}

std::optional<SpoolName> ParseSpoolName(std::string_view name) {
  const size_t dot = name.find('.');
  if (dot == 0 || dot == std::string_view::npos || dot > 10) return std::nullopt;
  SpoolName out;
  uint32_t uid = 0;
  auto [p, ec] = std::from_chars(name.data(), name.data() + dot, uid);
  if (ec != std::errc() || p != name.data() + dot) return std::nullopt;
  if (name.substr(0, dot) != std::to_string(uid)) return std::nullopt;  // no leading zeros
  out.uid = uid;
  const std::string_view rest = name.substr(dot + 1);
  if (rest == "current") {
    out.current = true;
    return out;
  }
  // <16 hex>.sealed or <16 hex>.current
  if (rest.size() < 17 || rest[16] != '.') return std::nullopt;
  const std::string_view kind = rest.substr(17);
  if (kind != "sealed" && kind != "current") return std::nullopt;
  for (char c : rest.substr(0, 16)) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return std::nullopt;
  }
  std::from_chars(rest.data(), rest.data() + 16, out.segment_id, 16);
  out.current = kind == "current";
  return out;
}

SegmentAppender::SegmentAppender(int dirfd, uid_t uid, Options options)
    : dirfd_(dirfd), uid_(uid), options_(options), shared_name_(SpoolCurrentName(uid)) {}

bool SegmentAppender::Usable(const struct stat& st) const {
  return S_ISREG(st.st_mode) && st.st_uid == uid_ && st.st_nlink == 1;
}

Status SegmentAppender::OpenCurrent() {
  fd_.reset();
  for (int attempt = 0; attempt < kReopenAttemptsMax; ++attempt) {
    // O_NOFOLLOW: a symbolic link fails (ELOOP) instead of leading us to the
    // file it names. O_NONBLOCK: a FIFO opens at once instead of hanging.
    UniqueFd fd(::openat(dirfd_, shared_name_.c_str(),
                         O_RDWR | O_APPEND | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
    if (!fd.valid()) {
      // Anything but a missing name is someone else's object under our name
      // (ELOOP: a symbolic link, EISDIR: a directory, EACCES: a file we may
      // not write, ENXIO, ...) or a directory problem that creating a file
      // of our own reports just as well.
      if (errno != ENOENT) return OpenPrivate();
      const uint64_t id = NewSegmentId();
      Status s = CreateSegment(dirfd_, shared_name_, NewHeader(id), options_.file_mode,
                               options_.sync, &fd);
      if (s.code() == StatusCode::kAlreadyExists) continue;  // another process won
      if (!s.ok()) {
        MoveAsideUnsynced(fd, shared_name_, id);
        return s;
      }
    }
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(errno, "stat " + shared_name_);
    // Only a regular file of our own with no other name: a squatter's file
    // would let its owner read our posts, a hard link to a file of ours
    // would be written through (or adopted) under a name we do not control.
    if (!Usable(st)) return OpenPrivate();
    Header header;
    Status s = ReadHeader(fd.get(), &header);
    if (s.ok() && !header.sealed()) {
      fd_ = std::move(fd);
      current_name_ = shared_name_;
      opened_by_ = ::getpid();
      open_segment_id_ = header.segment_id;
      return Status::Ok();
    }
    // Sealed but still under the current name, or damaged: move it out of
    // the way under a sealed name (the daemon adopts or quarantines it) and
    // start a new one.
    const uint64_t id = s.ok() ? header.segment_id : NewSegmentId();
    struct stat named;
    if (::fstatat(dirfd_, shared_name_.c_str(), &named, AT_SYMLINK_NOFOLLOW) == 0 &&
        SameFile(named, st)) {
      ::renameat(dirfd_, shared_name_.c_str(), dirfd_, SpoolSealedName(uid_, id).c_str());
    }
  }
  // The shared name kept changing under us (segments sealed as fast as we
  // opened them, or another user racing to take the name): a name of our
  // own cannot be taken.
  return OpenPrivate();
}

void SegmentAppender::MoveAsideUnsynced(const UniqueFd& fd, const std::string& name,
                                        uint64_t segment_id) {
  // CreateSegment made the name but could not make it durable. Posts synced
  // into the file would be acknowledged, and lost with the name in a power
  // loss: no writer may find it under a current name. Sealed, the daemon
  // adopts it (a later directory sync, anyone's, makes both names durable).
  struct stat mine, named;
  if (!fd.valid() || ::fstat(fd.get(), &mine) != 0) return;
  if (::fstatat(dirfd_, name.c_str(), &named, AT_SYMLINK_NOFOLLOW) == 0 &&
      SameFile(named, mine)) {
    ::renameat(dirfd_, name.c_str(), dirfd_, SpoolSealedName(uid_, segment_id).c_str());
  }
}

Status SegmentAppender::OpenPrivate() {
  fd_.reset();
  for (int attempt = 0; attempt < kReopenAttemptsMax; ++attempt) {
    // 64 random bits: nobody can guess the name in advance, and the spool
    // directory cannot be listed by users. The segment id is the same
    // number, so the sealed name the daemon gives it matches.
    const uint64_t id = NewSegmentId();
    const std::string name = SpoolPrivateCurrentName(uid_, id);
    UniqueFd fd;
    Status s = CreateSegment(dirfd_, name, NewHeader(id), options_.file_mode, options_.sync, &fd);
    if (s.code() == StatusCode::kAlreadyExists) continue;
    if (!s.ok()) {
      MoveAsideUnsynced(fd, name, id);
      return s;
    }
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(errno, "stat " + name);
    if (!Usable(st)) continue;  // linked to in the instant since: not ours alone
    fd_ = std::move(fd);
    current_name_ = name;
    opened_by_ = ::getpid();
    open_segment_id_ = id;
    return Status::Ok();
  }
  return Status(StatusCode::kIoError,
                "could not create a spool segment of uid " + std::to_string(uid_));
}

Status SegmentAppender::RollOver(Deadline deadline) {
  struct stat mine, named;
  if (::fstat(fd_.get(), &mine) != 0) return Status::FromErrno(errno, "stat spool segment");
  const std::string sealed_name = SpoolSealedName(uid_, open_segment_id_);
  fd_.reset();
  if (::fstatat(dirfd_, current_name_.c_str(), &named, AT_SYMLINK_NOFOLLOW) != 0 ||
      !SameFile(mine, named)) {
    return Status::Ok();  // someone else rolled it over already
  }
  if (::renameat(dirfd_, current_name_.c_str(), dirfd_, sealed_name.c_str()) != 0) {
    return Status::FromErrno(errno, "rename spool segment to " + sealed_name);
  }
  UniqueFd seal_fd(::openat(dirfd_, sealed_name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC));
  if (!seal_fd.valid()) return Status::FromErrno(errno, "open " + sealed_name);
  struct stat reopened;
  if (::fstat(seal_fd.get(), &reopened) != 0 || !SameFile(mine, reopened)) {
    return Status::Ok();  // not ours any more; the daemon seals before reading
  }
  // If sealing times out the segment is still out of the writers' way; the
  // daemon seals every segment before reading it.
  return SealSegment(seal_fd.get(), deadline);
}

Status SegmentAppender::Append(std::span<const std::byte> records, Deadline deadline) {
  // No deadline check of its own: every step either waits for nothing
  // (open, create, rename) or waits at most until the deadline (the locks,
  // which are tried once even past it), and the attempts are bounded. So a
  // caller that was descheduled past its deadline, or whose segment the
  // daemon just took, still gets its post spooled rather than failed.
  for (int attempt = 0; attempt < kReopenAttemptsMax; ++attempt) {
    if (!fd_.valid() || opened_by_ != ::getpid()) {
      // A forked child must not share its parent's open file description:
      // flock locks belong to it, and the child's unlock would drop the
      // parent's lock.
      fd_.reset();  // closes only the child's copy; the parent's lock is unaffected
      if (Status s = OpenCurrent(); !s.ok()) return s;
    }
    struct stat st, named;
    if (::fstat(fd_.get(), &st) != 0) return Status::FromErrno(errno, "stat spool segment");
    if (!Usable(st) ||
        ::fstatat(dirfd_, current_name_.c_str(), &named, AT_SYMLINK_NOFOLLOW) != 0 ||
        !SameFile(st, named)) {
      // The daemon renamed it away and is about to seal it: move on now, so
      // that the seal's exclusive lock is not starved by our appends.
      fd_.reset();
      continue;
    }
    if (static_cast<uint64_t>(st.st_size) > kHeaderBytes &&
        static_cast<uint64_t>(st.st_size) + records.size() > options_.segment_bytes_max) {
      if (Status s = RollOver(deadline); !s.ok() && s.code() != StatusCode::kTimedOut) return s;
      continue;
    }
    // The name is checked again under the lock: once the daemon renamed the
    // segment and took its exclusive lock, no append can slip in, even where
    // the daemon could not set the sealed flag. So are the owner and the link
    // count: a hard link made since the open (another name for our posts)
    // sends us to a new segment rather than writing through it.
    Status s = AppendToSegment(fd_.get(), records, deadline, options_.sync, [&] {
      struct stat now, mine;
      return ::fstat(fd_.get(), &mine) == 0 && Usable(mine) &&
             ::fstatat(dirfd_, current_name_.c_str(), &now, AT_SYMLINK_NOFOLLOW) == 0 &&
             SameFile(st, now);
    });
    if (s.code() == StatusCode::kSealed) {
      fd_.reset();
      continue;
    }
    if (s.ok()) segment_id_ = open_segment_id_;
    return s;
  }
  return Status(StatusCode::kSealed, "current spool segment kept being sealed; gave up");
}

}  // namespace postspool::segment
