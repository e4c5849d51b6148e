// The small system calls both IoLoop backends share: reading the peer's
// credentials of an accepted connection, sending a packet without waiting,
// writing a journal batch, and pausing accept after an error such as EMFILE.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>

#include "io_loop.h"

namespace postspool::daemon {

// SO_PEERCRED of a connected Unix socket.
bool ReadPeerCred(int fd, PeerCred* out);

// sendmsg(MSG_DONTWAIT | MSG_NOSIGNAL), EINTR retried, passing `pass_fd`
// (SCM_RIGHTS) unless it is -1; true if all was sent.
bool SendPacket(int fd, std::span<const std::byte> packet);

// pwrite until all of `bytes` is written at `offset`, EINTR retried: the
// byte count, or -errno (-ENOSPC for a write that makes no progress), as
// IoCallbacks::OnIoDone reports a write.
int64_t WriteWholeAt(int fd, const std::byte* data, size_t bytes, uint64_t offset);

// accept() failing with EMFILE, ENFILE, ENOBUFS or ENOMEM fails again at once
// until something changes: re-arming at once spins a core and floods the
// log. The loop pauses accepting for a while instead, and logs once when an
// episode starts and once when it ends.
class AcceptPause {
 public:
  using Clock = std::chrono::steady_clock;
  explicit AcceptPause(uint32_t pause_ms) : pause_(pause_ms) {}
  // An accept error: starts (or extends) the pause.
  void Failed(int error, Clock::time_point now);
  // An accept worked: ends the episode.
  void Succeeded();
  bool paused(Clock::time_point now) const { return now < resume_at_; }
  Clock::time_point resume_at() const { return resume_at_; }

 private:
  std::chrono::milliseconds pause_;
  Clock::time_point resume_at_{};
  bool in_episode_ = false;
  unsigned long long failures_ = 0;
};

}  // namespace postspool::daemon
