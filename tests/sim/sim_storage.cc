#include "sim_storage.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

namespace postspool::sim {
namespace {

constexpr char kDamagedName[] = "damaged";

Status Errno(int err, const std::string& what) {
  return err == 0 ? Status::Ok() : Status::FromErrno(err, what);
}

}  // namespace

int SimStorage::File(int fd, SimFs::Ino* ino, SimNode::FdEntry** entry) {
  if (!oracle_ && !Alive()) return EBADF;
  SimNode::FdEntry* e = node_->MutableFd(fd);
  if (e == nullptr || e->kind != SimNode::FdEntry::kFile) return EBADF;
  *ino = e->ino;
  if (entry != nullptr) *entry = e;
  return 0;
}

int SimStorage::Dir(int fd, DirId* dir) {
  if (!oracle_ && !Alive()) return EBADF;
  const SimNode::FdEntry* e = node_->Fd(fd);
  if (e == nullptr || e->kind != SimNode::FdEntry::kDir) return EBADF;
  *dir = e->dir;
  return 0;
}

Status SimStorage::OpenDirectory(const std::string& path, int* fd) {
  *fd = -1;
  if (!oracle_ && !Alive()) return Errno(EBADF, "open directory " + path);
  if (path != kJournalPath) return Errno(ENOENT, "open directory " + path);
  SimNode::FdEntry e;
  e.kind = SimNode::FdEntry::kDir;
  e.dir = kJournalDir;
  *fd = node_->AllocFd(e);
  return Status::Ok();
}

Status SimStorage::OpenAt(int dirfd, const std::string& name, OpenMode mode, int* fd) {
  *fd = -1;
  DirId dir;
  if (int err = Dir(dirfd, &dir); err != 0) return Errno(err, "open " + name);
  if (mode == OpenMode::kDirectory) {
    if (dir != kJournalDir || name != kDamagedName) return Errno(ENOENT, "open " + name);
    SimNode::FdEntry e;
    e.kind = SimNode::FdEntry::kDir;
    e.dir = kDamagedDir;
    *fd = node_->AllocFd(e);
    return Status::Ok();
  }
  SimFs& fs = node_->fs;
  SimFs::Ino ino;
  if (mode == OpenMode::kCreateReadWrite) {
    // O_CREAT | O_TRUNC: SimFs replaces an existing file by an empty one.
    if (int err = fs.Create(Actor::kDaemon, dir, name, 0, 0, false, true, &ino); err != 0) {
      fs.Collect();
      return Errno(err, "create " + name);
    }
  } else {
    if (!fs.Lookup(dir, name, &ino)) return Errno(ENOENT, "open " + name);
    // Reading a file may fail from its first block on (the reader's EIO).
    if (!oracle_ && mode == OpenMode::kRead) {
      if (int err = fs.ReadFault(Actor::kDaemon); err != 0) return Errno(err, "open " + name);
    }
  }
  SimNode::FdEntry e;
  e.kind = SimNode::FdEntry::kFile;
  e.ino = ino;
  *fd = node_->AllocFd(e);
  return Status::Ok();
}

void SimStorage::Close(int fd) {
  if (!oracle_ && !Alive()) return;  // closed when the process died
  node_->CloseFd(fd);
}

// segment::CreateFileComplete on SimFs: an unnamed file, its contents
// written (and synced), linked into place (and the name synced).
Status SimStorage::CreateComplete(int dirfd, const std::string& name,
                                  std::span<const std::byte> contents, mode_t mode, bool sync,
                                  int* fd) {
  (void)mode;
  *fd = -1;
  DirId dir;
  if (int err = Dir(dirfd, &dir); err != 0) return Errno(err, "create " + name);
  SimFs& fs = node_->fs;
  SimFs::Ino ino;
  if (int err = fs.CreateUnnamed(Actor::kDaemon, 0, 0, &ino); err != 0) {
    return Errno(err, "create " + name);
  }
  size_t done = 0;
  while (done < contents.size()) {
    const int64_t w = fs.Write(Actor::kDaemon, ino, done, contents.subspan(done));
    if (w < 0) {
      fs.Collect();
      return Errno(static_cast<int>(-w), "write " + name);
    }
    done += static_cast<size_t>(w);
  }
  if (sync) {
    if (int err = fs.Sync(Actor::kDaemon, ino); err != 0) {
      fs.Collect();
      return Errno(err, "sync " + name);
    }
  }
  if (int err = fs.Link(Actor::kDaemon, dir, name, ino); err != 0) {
    fs.Collect();
    return Errno(err, "link " + name);
  }
  SimNode::FdEntry e;
  e.kind = SimNode::FdEntry::kFile;
  e.ino = ino;
  const int made = node_->AllocFd(e);
  if (sync) {
    if (int err = fs.SyncDir(Actor::kDaemon); err != 0) {
      node_->CloseFd(made);
      return Errno(err, "sync directory");
    }
  }
  *fd = made;
  return Status::Ok();
}

Status SimStorage::MakeDirectory(int dirfd, const std::string& name, mode_t mode) {
  (void)mode;
  DirId dir;
  if (int err = Dir(dirfd, &dir); err != 0) return Errno(err, "create " + name + "/");
  if (dir == kJournalDir && name == kDamagedName) return Errno(EEXIST, "create " + name + "/");
  return Errno(EPERM, "create " + name + "/");
}

Status SimStorage::ReadAt(int fd, uint64_t offset, std::span<std::byte> out, size_t* done) {
  *done = 0;
  SimFs::Ino ino;
  if (int err = File(fd, &ino); err != 0) return Errno(err, "read");
  const std::vector<std::byte>& data = node_->fs.Get(ino)->data;
  if (offset >= data.size()) return Status::Ok();
  *done = std::min<size_t>(out.size(), data.size() - offset);
  std::memcpy(out.data(), data.data() + offset, *done);
  return Status::Ok();
}

Status SimStorage::WriteAt(int fd, uint64_t offset, std::span<const std::byte> bytes,
                           size_t* done) {
  *done = 0;
  SimFs::Ino ino;
  if (int err = File(fd, &ino); err != 0) return Errno(err, "write");
  const int64_t n = node_->fs.Write(Actor::kDaemon, ino, offset, bytes);
  if (n < 0) return Errno(static_cast<int>(-n), "write");
  *done = static_cast<size_t>(n);
  return Status::Ok();
}

Status SimStorage::SyncData(int fd) {
  SimFs::Ino ino;
  SimNode::FdEntry* e = nullptr;
  if (int err = File(fd, &ino, &e); err != 0) return Errno(err, "fdatasync");
  return Errno(node_->fs.Sync(Actor::kDaemon, ino, &e->wb_err_seen), "fdatasync");
}

Status SimStorage::SyncDirectory(int dirfd) {
  DirId dir;
  if (int err = Dir(dirfd, &dir); err != 0) return Errno(err, "fsync directory");
  // One metadata journal for the whole file system (sim_fs.h).
  return Errno(node_->fs.SyncDir(Actor::kDaemon), "fsync directory");
}

Status SimStorage::Truncate(int fd, uint64_t size) {
  SimFs::Ino ino;
  if (int err = File(fd, &ino); err != 0) return Errno(err, "ftruncate");
  return Errno(node_->fs.Truncate(Actor::kDaemon, ino, size), "ftruncate");
}

Status SimStorage::Stat(int fd, daemon::FileInfo* info) {
  SimFs::Ino ino;
  if (int err = File(fd, &ino); err != 0) return Errno(err, "fstat");
  const SimFs::Inode* in = node_->fs.Get(ino);
  *info = daemon::FileInfo{in->regular, in->data.size()};
  return Status::Ok();
}

Status SimStorage::StatAt(int dirfd, const std::string& name, daemon::FileInfo* info) {
  DirId dir;
  if (int err = Dir(dirfd, &dir); err != 0) return Errno(err, "stat " + name);
  SimFs::Ino ino;
  if (!node_->fs.Lookup(dir, name, &ino)) return Errno(ENOENT, "stat " + name);
  const SimFs::Inode* in = node_->fs.Get(ino);
  *info = daemon::FileInfo{in->regular, in->data.size()};
  return Status::Ok();
}

Status SimStorage::List(int dirfd, std::vector<std::string>* names) {
  names->clear();
  DirId dir;
  if (int err = Dir(dirfd, &dir); err != 0) return Errno(err, "list directory");
  for (const auto& entry : node_->fs.List(dir)) names->push_back(entry.first);
  return Status::Ok();
}

Status SimStorage::Rename(int from_dirfd, const std::string& from, int to_dirfd,
                          const std::string& to, bool noreplace) {
  DirId from_dir;
  DirId to_dir;
  if (int err = Dir(from_dirfd, &from_dir); err != 0) return Errno(err, "rename " + from);
  if (int err = Dir(to_dirfd, &to_dir); err != 0) return Errno(err, "rename " + from);
  return Errno(node_->fs.Rename(Actor::kDaemon, from_dir, from, to_dir, to, noreplace),
               "rename " + from + " to " + to);
}

Status SimStorage::Unlink(int dirfd, const std::string& name) {
  DirId dir;
  if (int err = Dir(dirfd, &dir); err != 0) return Errno(err, "unlink " + name);
  const int err = node_->fs.Unlink(Actor::kDaemon, dir, name);
  node_->fs.Collect();
  return Errno(err, "unlink " + name);
}

}  // namespace postspool::sim
