#include "storage.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "segment_writer.h"
#include "unique_fd.h"

namespace postspool::daemon {
namespace {

class PosixStorage final : public Storage {
 public:
  Status OpenDirectory(const std::string& path, int* fd) override {
    *fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    return *fd < 0 ? Status::FromErrno(errno, "open directory " + path) : Status::Ok();
  }

  Status OpenAt(int dirfd, const std::string& name, OpenMode mode, int* fd) override {
    int flags = O_NOFOLLOW | O_CLOEXEC;
    switch (mode) {
      case OpenMode::kRead: flags |= O_RDONLY; break;
      case OpenMode::kReadWrite: flags |= O_RDWR; break;
      case OpenMode::kCreateReadWrite: flags |= O_RDWR | O_CREAT | O_TRUNC; break;
      case OpenMode::kDirectory: flags |= O_RDONLY | O_DIRECTORY; break;
    }
    *fd = ::openat(dirfd, name.c_str(), flags, 0600);
    return *fd < 0 ? Status::FromErrno(errno, "open " + name) : Status::Ok();
  }

  void Close(int fd) override { ::close(fd); }

  Status CreateComplete(int dirfd, const std::string& name, std::span<const std::byte> contents,
                        mode_t mode, bool sync, int* fd) override {
    *fd = -1;
    UniqueFd made;
    if (Status s = segment::CreateFileComplete(dirfd, name, contents, mode, sync, &made);
        !s.ok()) {
      return s;
    }
    // Writes go through pwrite at offsets the caller tracks (and io_uring):
    // the descriptor must not be O_APPEND.
    if (::fcntl(made.get(), F_SETFL, 0) != 0) return Status::FromErrno(errno, "fcntl " + name);
    *fd = made.release();
    return Status::Ok();
  }

  Status MakeDirectory(int dirfd, const std::string& name, mode_t mode) override {
    if (::mkdirat(dirfd, name.c_str(), mode) != 0) {
      return Status::FromErrno(errno, "create " + name + "/");
    }
    UniqueFd dir(::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!dir.valid()) return Status::FromErrno(errno, "open " + name + "/");
    // Whatever the umask.
    if (::fchmod(dir.get(), mode) != 0) return Status::FromErrno(errno, "chmod " + name + "/");
    return Status::Ok();
  }

  Status ReadAt(int fd, uint64_t offset, std::span<std::byte> out, size_t* done) override {
    ssize_t n;
    do {
      n = ::pread(fd, out.data(), out.size(), static_cast<off_t>(offset));
    } while (n < 0 && errno == EINTR);
    *done = n < 0 ? 0 : static_cast<size_t>(n);
    return n < 0 ? Status::FromErrno(errno, "read") : Status::Ok();
  }

  Status WriteAt(int fd, uint64_t offset, std::span<const std::byte> bytes,
                 size_t* done) override {
    ssize_t n;
    do {
      n = ::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset));
    } while (n < 0 && errno == EINTR);
    *done = n < 0 ? 0 : static_cast<size_t>(n);
    return n < 0 ? Status::FromErrno(errno, "write") : Status::Ok();
  }

  Status SyncData(int fd) override {
    return ::fdatasync(fd) != 0 ? Status::FromErrno(errno, "fdatasync") : Status::Ok();
  }

  Status SyncDirectory(int dirfd) override {
    return ::fsync(dirfd) != 0 ? Status::FromErrno(errno, "fsync directory") : Status::Ok();
  }

  Status Truncate(int fd, uint64_t size) override {
    return ::ftruncate(fd, static_cast<off_t>(size)) != 0 ? Status::FromErrno(errno, "ftruncate")
                                                          : Status::Ok();
  }

  Status Stat(int fd, FileInfo* info) override {
    struct stat st;
    if (::fstat(fd, &st) != 0) return Status::FromErrno(errno, "fstat");
    *info = FileInfo{S_ISREG(st.st_mode), static_cast<uint64_t>(st.st_size)};
    return Status::Ok();
  }

  Status StatAt(int dirfd, const std::string& name, FileInfo* info) override {
    struct stat st;
    if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      return Status::FromErrno(errno, "stat " + name);
    }
    *info = FileInfo{S_ISREG(st.st_mode), static_cast<uint64_t>(st.st_size)};
    return Status::Ok();
  }

  Status List(int dirfd, std::vector<std::string>* names) override {
    names->clear();
    // A descriptor of its own: readdir moves the offset, closedir closes it.
    const int fd = ::openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, "open directory");
    DIR* d = ::fdopendir(fd);
    if (d == nullptr) {
      const int err = errno;
      ::close(fd);
      return Status::FromErrno(err, "list directory");
    }
    while (dirent* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
      names->push_back(e->d_name);
    }
    ::closedir(d);
    return Status::Ok();
  }

  Status Rename(int from_dirfd, const std::string& from, int to_dirfd, const std::string& to,
                bool noreplace) override {
    int rc = ::renameat2(from_dirfd, from.c_str(), to_dirfd, to.c_str(),
                         noreplace ? RENAME_NOREPLACE : 0);
    if (rc != 0 && errno == EINVAL && noreplace) {
      // A filesystem without RENAME_NOREPLACE: link() never replaces either.
      rc = ::linkat(from_dirfd, from.c_str(), to_dirfd, to.c_str(), 0);
      if (rc == 0 && ::unlinkat(from_dirfd, from.c_str(), 0) != 0) {
        const int err = errno;
        ::unlinkat(to_dirfd, to.c_str(), 0);
        return Status::FromErrno(err, "unlink " + from);
      }
    }
    return rc != 0 ? Status::FromErrno(errno, "rename " + from + " to " + to) : Status::Ok();
  }

  Status Unlink(int dirfd, const std::string& name) override {
    return ::unlinkat(dirfd, name.c_str(), 0) != 0 ? Status::FromErrno(errno, "unlink " + name)
                                                   : Status::Ok();
  }
};

}  // namespace

Storage* SystemStorage() {
  static PosixStorage storage;
  return &storage;
}

}  // namespace postspool::daemon
