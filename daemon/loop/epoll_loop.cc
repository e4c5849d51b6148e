// The epoll backend of IoLoop: readiness plus plain system calls. Writes and
// syncs run synchronously when submitted; their completions are delivered in
// the next round, as io_uring would deliver them; sends are reported the
// same way.
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <deque>
#include <unordered_set>
#include <vector>

#include "io_loop.h"
#include "socket_ops.h"
#include "unique_fd.h"

namespace postspool::daemon {
namespace {

enum Kind : uint64_t { kListen = 1, kConnection = 2, kWatched = 3 };

uint64_t Key(Kind kind, int fd) { return (uint64_t{kind} << 32) | static_cast<uint32_t>(fd); }

// Bounds on the work of one round, so that one busy connection cannot
// starve the others or the group commit.
constexpr int kEventsPerRound = 256;
constexpr int kAcceptsPerRound = 64;
constexpr int kPacketsPerConnectionPerRound = 64;

class EpollLoop final : public IoLoop {
 public:
  EpollLoop(const IoLoopOptions& options, IoCallbacks* callbacks, UniqueFd epfd)
      : options_(options),
        callbacks_(callbacks),
        epfd_(std::move(epfd)),
        buffer_(options.packet_bytes_max + 8),
        accept_pause_(options.accept_pause_ms) {}

  const char* name() const override { return "epoll"; }

  Status Listen(int listen_fd) override {
    listen_fd_ = listen_fd;
    return Add(kListen, listen_fd);
  }

  void StopListening() override {
    if (listen_fd_ < 0) return;
    if (!accept_paused_) ::epoll_ctl(epfd_.get(), EPOLL_CTL_DEL, listen_fd_, nullptr);
    listen_fd_ = -1;
  }

  Status AddConnection(int fd) override { return Add(kConnection, fd); }

  void RemoveConnection(int fd) override {
    if (!removed_.insert(fd).second) return;
    ::epoll_ctl(epfd_.get(), EPOLL_CTL_DEL, fd, nullptr);
    closed_.push_back({fd, 0});
  }

  Status Watch(int fd) override { return Add(kWatched, fd); }

  // At once, with send(2); reported by RunOnce after its events.
  void Send(int fd, std::span<const std::byte> packet, uint64_t cookie) override {
    sent_.push_back({cookie, SendPacket(fd, packet)});
  }

  void Close(int fd) override { ::close(fd); }

  void SubmitWrite(int fd, const std::byte* data, size_t bytes, uint64_t offset,
                   uint64_t cookie) override {
    done_.push_back({cookie, WriteWholeAt(fd, data, bytes, offset)});
  }

  void SubmitSync(int fd, uint64_t cookie) override {
    done_.push_back({cookie, ::fdatasync(fd) == 0 ? 0 : -errno});
  }

  // Inline, as the writes and syncs: this backend is the fallback where
  // io_uring is refused.
  void SubmitTask(std::function<int64_t()> task, uint64_t cookie) override {
    done_.push_back({cookie, task()});
  }

  Status RunOnce(int timeout_ms) override {
    epoll_event events[kEventsPerRound];
    if (!done_.empty() || !closed_.empty() || !sent_.empty()) timeout_ms = 0;
    if (accept_paused_) {
      const auto now = std::chrono::steady_clock::now();
      if (!accept_pause_.paused(now)) {
        accept_paused_ = false;
        if (listen_fd_ >= 0) (void)Add(kListen, listen_fd_);
      } else {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(accept_pause_.resume_at() - now);
        if (timeout_ms < 0 || left.count() < timeout_ms) timeout_ms = static_cast<int>(left.count());
      }
    }
    const int n = ::epoll_wait(epfd_.get(), events, kEventsPerRound, timeout_ms);
    if (n < 0 && errno != EINTR) return Status::FromErrno(errno, "epoll_wait");
    for (int i = 0; i < n; ++i) {
      const Kind kind = static_cast<Kind>(events[i].data.u64 >> 32);
      const int fd = static_cast<int>(events[i].data.u64 & 0xffffffffu);
      switch (kind) {
        case kListen: AcceptSome(fd); break;
        case kConnection: ReceiveSome(fd); break;
        case kWatched: callbacks_->OnReadable(fd); break;
      }
    }
    // Completions of writes submitted in earlier rounds or in this one.
    while (!done_.empty()) {
      const auto d = done_.front();
      done_.pop_front();
      callbacks_->OnIoDone(d.cookie, d.result);
    }
    while (!sent_.empty()) {
      const auto d = sent_.front();
      sent_.pop_front();
      callbacks_->OnSent(d.cookie, d.sent);
    }
    while (!closed_.empty()) {
      const auto c = closed_.front();
      closed_.pop_front();
      removed_.erase(c.fd);
      callbacks_->OnConnectionClosed(c.fd, c.error);
    }
    callbacks_->OnRoundEnd();
    return Status::Ok();
  }

 private:
  Status Add(Kind kind, int fd) {
    epoll_event ev{};
    ev.events = kind == kConnection ? uint32_t{EPOLLIN | EPOLLRDHUP} : uint32_t{EPOLLIN};
    ev.data.u64 = Key(kind, fd);
    if (::epoll_ctl(epfd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      return Status::FromErrno(errno, "epoll_ctl add");
    }
    return Status::Ok();
  }

  void AcceptSome(int listen_fd) {
    for (int i = 0; i < kAcceptsPerRound && listen_fd_ == listen_fd && !accept_paused_; ++i) {
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) {
          return;
        }
        // EMFILE and friends: readiness stays, so retrying at once spins.
        // Stop watching the socket for a while.
        callbacks_->OnAcceptError(errno);
        accept_pause_.Failed(errno, std::chrono::steady_clock::now());
        accept_paused_ = true;
        ::epoll_ctl(epfd_.get(), EPOLL_CTL_DEL, listen_fd, nullptr);
        return;
      }
      accept_pause_.Succeeded();
      PeerCred peer;
      if (!ReadPeerCred(fd, &peer)) {
        ::close(fd);
        continue;
      }
      callbacks_->OnAccept(fd, peer);
    }
  }

  void ReceiveSome(int fd) {
    for (int i = 0; i < kPacketsPerConnectionPerRound; ++i) {
      if (removed_.count(fd) != 0) return;
      // MSG_TRUNC: the return value is the packet's real length, so that an
      // oversized packet is recognised rather than silently cut.
      const ssize_t n = ::recv(fd, buffer_.data(), options_.packet_bytes_max, MSG_DONTWAIT | MSG_TRUNC);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n <= 0) {
        removed_.insert(fd);
        ::epoll_ctl(epfd_.get(), EPOLL_CTL_DEL, fd, nullptr);
        closed_.push_back({fd, n < 0 ? errno : 0});
        return;
      }
      const bool truncated = static_cast<size_t>(n) > options_.packet_bytes_max;
      const size_t len = truncated ? options_.packet_bytes_max : static_cast<size_t>(n);
      callbacks_->OnPacket(fd, std::span<const std::byte>(buffer_.data(), len), truncated);
    }
  }

  struct Done {
    uint64_t cookie;
    int64_t result;
  };
  struct Closed {
    int fd;
    int error;
  };

  IoLoopOptions options_;
  IoCallbacks* callbacks_;
  UniqueFd epfd_;
  int listen_fd_ = -1;
  std::vector<std::byte> buffer_;
  std::deque<Done> done_;
  std::deque<Closed> closed_;
  struct Sent {
    uint64_t cookie;
    bool sent;
  };
  std::deque<Sent> sent_;
  std::unordered_set<int> removed_;
  AcceptPause accept_pause_;
  bool accept_paused_ = false;
};

}  // namespace

Status NewEpollLoop(const IoLoopOptions& options, IoCallbacks* callbacks,
                    std::unique_ptr<IoLoop>* out) {
  UniqueFd epfd(::epoll_create1(EPOLL_CLOEXEC));
  if (!epfd.valid()) return Status::FromErrno(errno, "epoll_create1");
  out->reset(new EpollLoop(options, callbacks, std::move(epfd)));
  return Status::Ok();
}

}  // namespace postspool::daemon
