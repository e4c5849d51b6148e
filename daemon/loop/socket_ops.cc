#include "socket_ops.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "log.h"

namespace postspool::daemon {

bool ReadPeerCred(int fd, PeerCred* out) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
  out->uid = cred.uid;
  out->gid = cred.gid;
  out->pid = cred.pid;
  return true;
}

bool SendPacket(int fd, std::span<const std::byte> packet) {
  ssize_t n;
  do {
    n = ::send(fd, packet.data(), packet.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(packet.size());
}

int64_t WriteWholeAt(int fd, const std::byte* data, size_t bytes, uint64_t offset) {
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pwrite(fd, data + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    if (n == 0) return -ENOSPC;
    done += static_cast<size_t>(n);
  }
  return static_cast<int64_t>(done);
}

void AcceptPause::Failed(int error, Clock::time_point now) {
  ++failures_;
  if (!in_episode_) {
    in_episode_ = true;
    PS_LOG_WARNING("accept on the listening socket failed: %s; pausing accepts for %lld ms at a "
                   "time until it works again (new clients use their spool meanwhile)",
                   std::strerror(error), static_cast<long long>(pause_.count()));
  }
  resume_at_ = now + pause_;
}

void AcceptPause::Succeeded() {
  if (!in_episode_) return;
  PS_LOG_INFO("accepting connections again after %llu failed accepts", failures_);
  in_episode_ = false;
  failures_ = 0;
}

}  // namespace postspool::daemon
