// Storage: the file system as the journal sees it (journal.h: the writer,
// the reader, the checkpoint, setting damaged segments aside, deleting
// confirmed ones). The journal makes no file system call itself; it calls
// this port, which the daemon implements over POSIX (SystemStorage(), in
// storage.cc) and the simulation (tests/sim) over a simulated disk that
// keeps the page cache apart from what survives a power loss and injects
// faults, the way TigerBeetle's storage and LevelDB's fault-injection Env do.
//
// Descriptors are ints that only the Storage that returned them knows what
// they mean: pass them to nothing else (not to close(), not to a real
// system call). StorageFd closes them through their Storage.
//
// Every call returns a Status made by Status::FromErrno, so that the caller
// can tell ENOENT (kNotFound), EEXIST (kAlreadyExists), ENOSPC (kNoSpace)
// and the rest apart, and sys_errno() is the errno. Names are single path
// components relative to a directory descriptor; symlinks are never
// followed. Thread-safe as far as the file system is: the ingest loop, its
// worker thread and the forwarder each call it on their own descriptors.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "status.h"

namespace postspool::daemon {

struct FileInfo {
  bool regular = false;
  uint64_t size = 0;  // apparent
};

class Storage {
 public:
  virtual ~Storage() = default;

  enum class OpenMode {
    kRead,               // O_RDONLY
    kReadWrite,          // O_RDWR
    kCreateReadWrite,    // O_RDWR | O_CREAT | O_TRUNC, mode 0600
    kDirectory,          // O_RDONLY | O_DIRECTORY
  };
  // The directory at `path` (an absolute or relative path, not a name).
  [[nodiscard]] virtual Status OpenDirectory(const std::string& path, int* fd) = 0;
  [[nodiscard]] virtual Status OpenAt(int dirfd, const std::string& name, OpenMode mode,
                                      int* fd) = 0;
  virtual void Close(int fd) = 0;

  // Creates `name` in `dirfd` holding `contents`, mode `mode`, and returns it
  // open O_RDWR (not O_APPEND). The name never shows a partial file and never
  // replaces an existing one (kAlreadyExists). With `sync`, the contents and
  // the name are durable when it returns. On failure *fd is -1; the name
  // may exist nevertheless (a failure after it was linked: syncing).
  [[nodiscard]] virtual Status CreateComplete(int dirfd, const std::string& name,
                                              std::span<const std::byte> contents, mode_t mode,
                                              bool sync, int* fd) = 0;
  // Makes directory `name` in `dirfd` with mode `mode` whatever the umask;
  // kAlreadyExists if it is there.
  [[nodiscard]] virtual Status MakeDirectory(int dirfd, const std::string& name, mode_t mode) = 0;

  // One pread / pwrite (EINTR retried): *done may be short; 0 at the end of
  // the file for a read.
  [[nodiscard]] virtual Status ReadAt(int fd, uint64_t offset, std::span<std::byte> out,
                                      size_t* done) = 0;
  [[nodiscard]] virtual Status WriteAt(int fd, uint64_t offset, std::span<const std::byte> bytes,
                                       size_t* done) = 0;
  // fdatasync: the file's bytes survive a power loss.
  [[nodiscard]] virtual Status SyncData(int fd) = 0;
  // fsync of a directory: the changes to its entries survive a power loss.
  // A rename, link or unlink is not durable before it.
  [[nodiscard]] virtual Status SyncDirectory(int dirfd) = 0;
  [[nodiscard]] virtual Status Truncate(int fd, uint64_t size) = 0;
  [[nodiscard]] virtual Status Stat(int fd, FileInfo* info) = 0;
  [[nodiscard]] virtual Status StatAt(int dirfd, const std::string& name, FileInfo* info) = 0;

  // The names in the directory (without . and ..), in no particular order.
  [[nodiscard]] virtual Status List(int dirfd, std::vector<std::string>* names) = 0;
  // renameat; with `noreplace` it never replaces `to` (kAlreadyExists).
  [[nodiscard]] virtual Status Rename(int from_dirfd, const std::string& from, int to_dirfd,
                                      const std::string& to, bool noreplace) = 0;
  [[nodiscard]] virtual Status Unlink(int dirfd, const std::string& name) = 0;
};

// The real file system. Lives as long as the process.
Storage* SystemStorage();

// A descriptor of a Storage, closed through it: the RAII owner, as UniqueFd
// is for real descriptors. The Storage must outlive it.
class StorageFd {
 public:
  StorageFd() = default;
  StorageFd(Storage* storage, int fd) : storage_(storage), fd_(fd) {}
  ~StorageFd() { reset(); }
  StorageFd(StorageFd&& o) noexcept : storage_(o.storage_), fd_(o.fd_) { o.fd_ = -1; }
  StorageFd& operator=(StorageFd&& o) noexcept {
    if (this != &o) {
      reset();
      storage_ = o.storage_;
      fd_ = o.fd_;
      o.fd_ = -1;
    }
    return *this;
  }
  StorageFd(const StorageFd&) = delete;
  StorageFd& operator=(const StorageFd&) = delete;

  bool valid() const { return fd_ >= 0; }
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) storage_->Close(fd_);
    fd_ = -1;
  }

 private:
  Storage* storage_ = nullptr;
  int fd_ = -1;
};

}  // namespace postspool::daemon
