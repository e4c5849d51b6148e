#include "fake_daemon.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cstring>

#include "segment_format.h"
#include "socket_protocol.h"

namespace postspool::testing {

FakeDaemon::FakeDaemon(std::string socket_path, Mode mode)
    : path_(std::move(socket_path)), mode_(mode) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (!fd.valid() || path_.size() >= sizeof addr.sun_path) return;
  std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
  ::unlink(path_.c_str());
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(fd.get(), 128) != 0) {
    return;
  }
  wake_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_.valid()) return;
  listen_fd_ = std::move(fd);
  thread_ = std::thread([this] { Run(); });
}

FakeDaemon::~FakeDaemon() {
  stop_.store(true);
  Wake();
  if (thread_.joinable()) thread_.join();
  if (listen_fd_.valid()) ::unlink(path_.c_str());
}

void FakeDaemon::Wake() {
  if (!wake_fd_.valid()) return;
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_fd_.get(), &one, sizeof one);
}

std::vector<FakeDaemon::Received> FakeDaemon::received() const {
  std::lock_guard lock(mutex_);
  return received_;
}

size_t FakeDaemon::requests_seen() const {
  std::lock_guard lock(mutex_);
  return requests_seen_;
}

size_t FakeDaemon::malformed_requests() const {
  std::lock_guard lock(mutex_);
  return malformed_requests_;
}

size_t FakeDaemon::connections_accepted() const {
  std::lock_guard lock(mutex_);
  return connections_accepted_;
}

bool FakeDaemon::WaitForRequests(size_t n, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, timeout, [&] { return requests_seen_ >= n; });
}

void FakeDaemon::CloseAllConnections() {
  const uint64_t ticket = close_all_requests_.fetch_add(1) + 1;
  Wake();
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return close_all_done_.load() >= ticket; });
}

void FakeDaemon::Run() {
  std::vector<pollfd> fds;
  while (!stop_.load()) {
    if (const uint64_t want = close_all_requests_.load(); want > close_all_done_.load()) {
      connections_.clear();
      std::lock_guard lock(mutex_);
      close_all_done_.store(want);
      changed_.notify_all();
    }
    fds.clear();
    fds.push_back({wake_fd_.get(), POLLIN, 0});
    fds.push_back({listen_fd_.get(), POLLIN, 0});
    for (const Connection& c : connections_) fds.push_back({c.fd.get(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), 1000) < 0) continue;  // EINTR
    if (fds[0].revents != 0) {
      uint64_t v;
      [[maybe_unused]] const ssize_t n = ::read(wake_fd_.get(), &v, sizeof v);
    }
    if (fds[1].revents != 0) Accept();
    // Serve the connections polled (new ones are at the end, unpolled).
    std::vector<Connection> kept;
    for (size_t i = 0; i < connections_.size(); ++i) {
      const bool polled = i + 2 < fds.size();
      if (polled && fds[i + 2].revents != 0 && !Serve(&connections_[i])) continue;
      kept.push_back(std::move(connections_[i]));
    }
    connections_ = std::move(kept);
  }
}

void FakeDaemon::Accept() {
  for (;;) {
    UniqueFd fd(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd.valid()) return;
    ucred cred{};
    socklen_t len = sizeof cred;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len);
    std::lock_guard lock(mutex_);
    Connection c;
    c.fd = std::move(fd);
    c.peer_pid = cred.pid;
    c.number = ++connections_accepted_;
    connections_.push_back(std::move(c));
  }
}

bool FakeDaemon::Serve(Connection* c) {
  std::vector<std::byte>& packet = packet_;
  packet.resize(wire::kRequestBytesMax + 1);
  for (;;) {
    const ssize_t n = ::recv(c->fd.get(), packet.data(), packet.size(), MSG_DONTWAIT);
    if (n == 0) return false;  // the client closed
    if (n < 0) return errno == EAGAIN || errno == EINTR;
    const std::span<const std::byte> bytes(packet.data(), static_cast<size_t>(n));

    // Decode the request and its records.
    wire::RequestHeader header;
    std::vector<PostData> posts;
    bool valid = wire::DecodeRequestHeader(bytes, &header);
    if (valid && header.record_count == 0 && bytes.size() == wire::kRequestHeaderBytes) {
      // A ring request: this daemon has none (as with ring_dir empty).
      std::array<std::byte, wire::kAckBytes> raw;
      wire::EncodeAck(wire::Ack{wire::AckStatus::kUnavailable, header.request_id, 0}, raw);
      ::send(c->fd.get(), raw.data(), raw.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      continue;
    }
    if (valid) {
      std::span<const std::byte> rest = bytes.subspan(wire::kRequestHeaderBytes);
      for (uint16_t i = 0; valid && i < header.record_count; ++i) {
        uint32_t length = 0;
        if (segment::CheckFrame(rest, segment::kRecordPayloadMax, &length) !=
            segment::FrameCheck::kValid) {
          valid = false;
          break;
        }
        // An aligned copy of the payload for the verifier.
        std::vector<uint64_t> aligned((length + 7) / 8);
        std::memcpy(aligned.data(), rest.data() + segment::kRecordHeaderBytes, length);
        const std::span<const std::byte> payload(reinterpret_cast<const std::byte*>(aligned.data()),
                                                 length);
        if (!VerifyPostPayload(payload)) {
          valid = false;
          break;
        }
        posts.push_back(ReadPost(PostFromPayload(payload)));
        rest = rest.subspan(segment::RecordBytes(length));
      }
      valid = valid && rest.empty();
    }

    const Mode mode = mode_.load();
    wire::Ack ack;
    ack.request_id = header.request_id;
    bool answer = true;
    {
      std::lock_guard lock(mutex_);
      ++requests_seen_;
      if (!valid) {
        ++malformed_requests_;
        ack.status = wire::AckStatus::kMalformed;
      } else {
        switch (mode) {
          case Mode::kAccept:
          case Mode::kSlowAck:
          case Mode::kWrongRequestId:
            if (mode != Mode::kWrongRequestId) {
              for (PostData& p : posts) {
                received_.push_back(Received{std::move(p), c->peer_pid, c->number,
                                             header.request_id});
              }
            }
            ack.status = wire::AckStatus::kAccepted;
            ack.records = header.record_count;
            if (mode == Mode::kWrongRequestId) ack.request_id = header.request_id + 1000;
            break;
          case Mode::kFull: ack.status = wire::AckStatus::kFull; break;
          case Mode::kBusy: ack.status = wire::AckStatus::kBusy; break;
          case Mode::kShuttingDown: ack.status = wire::AckStatus::kShuttingDown; break;
          case Mode::kNeverAnswer:
          case Mode::kClose:
          case Mode::kGarbageAck:
            answer = false;
            break;
        }
      }
      changed_.notify_all();
    }
    if (valid && mode == Mode::kClose) return false;
    if (valid && mode == Mode::kGarbageAck) {
      const char garbage[] = "not an ack";
      ::send(c->fd.get(), garbage, sizeof garbage, MSG_NOSIGNAL);
      continue;
    }
    if (!answer) continue;
    if (mode == Mode::kSlowAck) {
      std::this_thread::sleep_for(std::chrono::milliseconds(slow_ack_delay_ms_.load()));
    }
    std::array<std::byte, wire::kAckBytes> raw;
    wire::EncodeAck(ack, raw);
    ::send(c->fd.get(), raw.data(), raw.size(), MSG_NOSIGNAL);
  }
}

}  // namespace postspool::testing
