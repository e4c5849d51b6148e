#include "daemon_socket.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstring>

#include "socket_protocol.h"

namespace postspool::client {
namespace {

std::string ErrnoText(std::string_view what, int err) {
  std::string s(what);
  s += ": ";
  s += std::strerror(err);
  return s;
}

// Waits until `fd` reports one of `events` (or an error or hang-up, which the
// next call on it then reports) or `deadline` passes. False on the deadline.
bool WaitFor(int fd, short events, Deadline deadline) {
  for (;;) {
    const auto now = Clock::now();
    if (now >= deadline) return false;
    const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now).count();
    const timespec timeout{static_cast<time_t>(left / 1000000000),
                           static_cast<long>(left % 1000000000)};
    pollfd p{fd, events, 0};
    const int n = ::ppoll(&p, 1, &timeout, nullptr);
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return true;  // let the next call report the fd's error
    // n == 0 or EINTR: the loop rechecks the deadline.
  }
}

std::string Milliseconds(Clock::duration d) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(d).count();
  std::string s = std::to_string(us / 1000);
  if (us < 10000) {  // keep one decimal for the few-millisecond budgets
    s += '.';
    s += static_cast<char>('0' + (us / 100) % 10);
  }
  return s + " ms";
}

}  // namespace

DaemonSocket::Result DaemonSocket::RequestRing(Deadline deadline, int* ring_id) {
  return Exchange({}, 0, deadline, ring_id);
}

DaemonSocket::Result DaemonSocket::Post(std::span<const std::byte> records,
                                        uint16_t record_count, Deadline deadline) {
  return Exchange(records, record_count, deadline, nullptr);
}

DaemonSocket::Result DaemonSocket::Exchange(std::span<const std::byte> records,
                                            uint16_t record_count, Deadline deadline,
                                            int* ring_id) {
  const auto now = Clock::now();
  if (now < retry_after_) {
    return Result{false,
                  "not tried for another " + Milliseconds(retry_after_ - now) +
                      " after: " + back_off_reason_,
                  false};
  }
  const uint64_t request_id = next_request_id_++;
  std::array<std::byte, wire::kRequestHeaderBytes> header;
  wire::EncodeRequestHeader(
      wire::RequestHeader{wire::kProtocolVersion, record_count, request_id}, header);

  for (int attempt = 0;; ++attempt) {
    bool fresh = false;
    if (!fd_.valid()) {
      std::string reason;
      if (!Connect(deadline, &reason)) return Fail(std::move(reason), /*back_off=*/true);
      fresh = true;
    }
    std::string reason;
    switch (Send(header, records, deadline, &reason)) {
      case SendOutcome::kSent:
        return AwaitAck(request_id, record_count, deadline, ring_id);
      case SendOutcome::kStale:
        // A kept connection that the daemon closed (it restarted, say): once
        // more on a new one.
        fd_.reset();
        if (!fresh && attempt == 0) continue;
        return Fail(std::move(reason), /*back_off=*/false);
      case SendOutcome::kFailed:
        return Fail(std::move(reason), /*back_off=*/true);
    }
  }
}

bool DaemonSocket::Connect(Deadline deadline, std::string* reason) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) {
    *reason = ErrnoText("socket", errno);
    return false;
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path_.size() >= sizeof addr.sun_path) {  // CopyOptions refuses these already
    *reason = ErrnoText("connect " + path_, ENAMETOOLONG);
    return false;
  }
  std::memcpy(addr.sun_path, path_.data(), path_.size());
  const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path_.size() + 1);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), length) != 0) {
    int err = errno;
    // A Unix socket connects at once or fails (EAGAIN: the daemon's backlog
    // is full); should a connect still complete asynchronously (or be
    // interrupted, after which it goes on), wait for it within the deadline.
    if (err != EINPROGRESS && err != EINTR) {
      *reason = ErrnoText("connect " + path_, err);
      return false;
    }
    if (!WaitFor(fd.get(), POLLOUT, deadline)) {
      *reason = "connect " + path_ + ": not connected within the budget";
      return false;
    }
    socklen_t err_bytes = sizeof err;
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &err_bytes) != 0) err = errno;
    if (err != 0) {
      *reason = ErrnoText("connect " + path_, err);
      return false;
    }
  }
  fd_ = std::move(fd);
  return true;
}

DaemonSocket::SendOutcome DaemonSocket::Send(std::span<const std::byte> header,
                                             std::span<const std::byte> records,
                                             Deadline deadline, std::string* reason) {
  iovec iov[2] = {
      {const_cast<std::byte*>(header.data()), header.size()},
      {const_cast<std::byte*>(records.data()), records.size()},
  };
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 2;
  for (;;) {
    // MSG_NOSIGNAL: a daemon that went away must not kill the host program
    // with SIGPIPE.
    const ssize_t n = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      if (static_cast<size_t>(n) == header.size() + records.size()) return SendOutcome::kSent;
      // SOCK_SEQPACKET sends whole packets; anything else is not the daemon.
      *reason = "send to " + path_ + ": short send of a packet";
      return SendOutcome::kFailed;
    }
    const int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      if (WaitFor(fd_.get(), POLLOUT, deadline)) continue;
      *reason = "send to " + path_ + ": the daemon did not read within the budget";
      return SendOutcome::kFailed;
    }
    *reason = ErrnoText("send to " + path_, err);
    // A request the socket cannot take is not a dead connection.
    if (err == EMSGSIZE || err == ENOBUFS || err == ENOMEM) return SendOutcome::kFailed;
    return SendOutcome::kStale;
  }
}

DaemonSocket::Result DaemonSocket::AwaitAck(uint64_t request_id, uint16_t record_count,
                                            Deadline deadline, int* ring_id) {
  const auto sent_at = Clock::now();
  bool gave_up = false;
  // A connection whose reading side this call shut is not used again.
  struct CloseIfShut {
    DaemonSocket* socket;
    const bool* shut;
    ~CloseIfShut() {
      if (*shut) socket->fd_.reset();
    }
  } close_if_shut{this, &gave_up};
  // The caller spools this request's posts once the budget is spent.
  // Shutting the reading side first makes that unambiguous: from here on
  // the daemon's acknowledgement fails (EPIPE), so it knows the posts it
  // journaled will come again from the spool (socket_acks_undelivered_total),
  // and an acknowledgement that came just before is still read, once more.
  const auto give_up = [&] {
    ::shutdown(fd_.get(), SHUT_RD);
    gave_up = true;
  };
  // Wait first: the daemon was only just woken, so a receive now mostly
  // finds nothing and costs a system call per post (an ack that is there
  // already makes the poll return at once).
  if (!WaitFor(fd_.get(), POLLIN, deadline)) give_up();
  // Room for more than an ack, so that a longer packet shows as one (its
  // real length comes back through MSG_TRUNC).
  alignas(8) std::array<std::byte, 2 * wire::kAckBytes> buf;
  for (;;) {
    iovec iov{buf.data(), buf.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(fd_.get(), &msg, MSG_DONTWAIT | MSG_TRUNC | MSG_CMSG_CLOEXEC);
    UniqueFd passed;
    if (n >= 0) {
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
            c->cmsg_len >= CMSG_LEN(sizeof(int))) {
          int fd;
          std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
          passed.reset(fd);
        }
      }
    }
    if (n > 0) {
      wire::Ack ack;
      const auto bytes = static_cast<size_t>(n);
      if (bytes > buf.size() || !wire::DecodeAck(std::span(buf.data(), bytes), &ack)) {
        Result r = Fail("malformed acknowledgement (" + std::to_string(bytes) + " bytes)", false);
        r.malformed = true;
        return r;
      }
      if (ack.request_id != request_id) {
        Result r = Fail("acknowledgement for request " + std::to_string(ack.request_id) +
                            " while waiting for request " + std::to_string(request_id),
                        false);
        r.malformed = true;
        return r;
      }
      switch (ack.status) {
        case wire::AckStatus::kAccepted:
          if (ack.records != record_count) {
            Result r = Fail("daemon acknowledged " + std::to_string(ack.records) + " of " +
                                std::to_string(record_count) + " records",
                            false);
            r.malformed = true;
            return r;
          }
          if (ring_id != nullptr) {
            // A daemon of an earlier version passes a ring file, which its
            // holder could truncate under the daemon: not used.
            if (passed.valid()) {
              return Result{false, "the daemon hands out ring files (an earlier version): not used",
                            false};
            }
            *ring_id = static_cast<int>(ack.ring_id & 0x7fffffff);
          }
          back_off_ = Clock::duration{0};
          retry_after_ = Clock::time_point{};
          return Result{true, {}, false};
        case wire::AckStatus::kMalformed: {
          // A daemon from before rings: the connection is fine for posts.
          if (ring_id != nullptr) return Result{false, "the daemon does not hand out rings", false};
          Result r = Fail("daemon refused the request as malformed", false);
          r.malformed = true;
          return r;
        }
        case wire::AckStatus::kFull: {
          Result r = Fail(wire::AckStatusName(ack.status), false);
          r.full = true;
          return r;
        }
        case wire::AckStatus::kBusy:
          return Fail(wire::AckStatusName(ack.status), false);
        case wire::AckStatus::kShuttingDown:
        case wire::AckStatus::kUnavailable:
          // No ring for this user: the socket itself is fine.
          if (ring_id != nullptr) return Result{false, "the daemon has no ring for this user", false};
          return Fail(wire::AckStatusName(ack.status), true);
      }
      return Fail("unknown acknowledgement status", false);  // DecodeAck rules this out
    }
    const int err = n == 0 ? 0 : errno;
    if (n < 0 && err == EINTR) continue;
    if (gave_up && (n == 0 || err == EAGAIN || err == EWOULDBLOCK)) {
      // Dropping the connection makes sure that this request's late ack is
      // never read as the next request's.
      // No back-off: a daemon slow under load answers the next post in
      // time, and a hung one costs each post only the socket's share.
      return Fail("no acknowledgement after " + Milliseconds(Clock::now() - sent_at), false);
    }
    if (n == 0) return Fail("connection closed by the daemon before the acknowledgement", false);
    if (err == EAGAIN || err == EWOULDBLOCK) {
      if (!WaitFor(fd_.get(), POLLIN, deadline)) give_up();
      continue;
    }
    return Fail(ErrnoText("receive from " + path_, err), false);
  }
}

void DaemonSocket::BackOff(const std::string& reason) {
  back_off_ = back_off_ == Clock::duration{0}
                  ? Clock::duration(kBackOffInitial)
                  : std::min<Clock::duration>(back_off_ * 2, kBackOffMax);
  retry_after_ = Clock::now() + back_off_;
  back_off_reason_ = reason;
}

DaemonSocket::Result DaemonSocket::Fail(std::string reason, bool back_off) {
  fd_.reset();
  if (back_off) BackOff(reason);
  return Result{false, std::move(reason), false};
}

}  // namespace postspool::client
