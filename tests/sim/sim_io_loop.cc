#include "sim_io_loop.h"

#include "socket_protocol.h"

#include <cassert>
#include <algorithm>
#include <cerrno>

namespace postspool::sim {

SimSocket* SimIoLoop::SocketOf(int fd) {
  const SimNode::FdEntry* e = node_->Fd(fd);
  if (e == nullptr || e->kind != SimNode::FdEntry::kSocket) return nullptr;
  return node_->Socket(e->socket);
}

Status SimIoLoop::Listen(int listen_fd) {
  (void)listen_fd;
  node_->listening = true;
  return Status::Ok();
}

void SimIoLoop::StopListening() { node_->listening = false; }

Status SimIoLoop::AddConnection(int fd) {
  SimSocket* s = SocketOf(fd);
  assert(s != nullptr);
  s->receiving = true;
  return Status::Ok();
}

void SimIoLoop::RemoveConnection(int fd) {
  SimSocket* s = SocketOf(fd);
  assert(s != nullptr && !s->close_reported);
  s->receiving = false;
  s->remove_requested = true;
}

void SimIoLoop::Send(int fd, std::span<const std::byte> packet, uint64_t cookie) {
  assert(packet.size() <= kSendBytesMax);
  if (node_->fs.daemon_dead()) return;  // a dead process sends nothing, and hears nothing
  SimSocket* s = SocketOf(fd);
  assert(s != nullptr);
  ++work_.sends;
  // The client closed, or does not read; or a fault: its buffer is full.
  const bool refused = s->client_closed || s->to_client.size() >= s->to_client_max;
  const bool full = !refused && rng_.Ppm(options_.send_full_ppm);
  if (full) stats_->Fault("loop.send.buffer_full");
  const bool sent = !refused && !full;
  if (sent) s->to_client.emplace_back(packet.begin(), packet.end());
  sent_.push_back({cookie, sent});
}

void SimIoLoop::ReportSent() {
  while (!sent_.empty() && !node_->fs.daemon_dead()) {
    const auto [cookie, sent] = sent_.front();
    sent_.pop_front();
    callbacks_->OnSent(cookie, sent);
  }
}

void SimIoLoop::Close(int fd) {
  const SimNode::FdEntry* e = node_->Fd(fd);
  assert(e != nullptr && e->kind == SimNode::FdEntry::kSocket);
  const uint64_t id = e->socket;
  node_->CloseFd(fd);
  if (SimSocket* s = node_->Socket(id)) {
    s->daemon_closed = true;
    s->daemon_fd = -1;
    s->to_daemon.clear();
    node_->Forget(id);
  }
}

Status SimIoLoop::Watch(int fd) {
  (void)fd;
  return Status::Ok();
}

void SimIoLoop::SubmitWrite(int fd, const std::byte* data, size_t bytes, uint64_t offset,
                            uint64_t cookie) {
  const SimNode::FdEntry* e = node_->Fd(fd);
  assert(e != nullptr && e->kind == SimNode::FdEntry::kFile);
  ++work_.writes;
  io_.push_back(Io{false, fd, e->ino, data, bytes, offset, cookie,
                   round_ + 1 + rng_.Below(options_.io_delay_rounds_max + 1), {}});
}

void SimIoLoop::SubmitSync(int fd, uint64_t cookie) {
  const SimNode::FdEntry* e = node_->Fd(fd);
  assert(e != nullptr && e->kind == SimNode::FdEntry::kFile);
  ++work_.syncs;
  io_.push_back(Io{true, fd, e->ino, nullptr, 0, 0, cookie,
                   round_ + 1 + rng_.Below(options_.io_delay_rounds_max + 1), {}});
}

void SimIoLoop::SubmitTask(std::function<int64_t()> task, uint64_t cookie) {
  Io io;
  io.cookie = cookie;
  io.due_round = round_ + 1 + rng_.Below(options_.io_delay_rounds_max + 1);
  io.task = std::move(task);
  io_.push_back(std::move(io));
}

void SimIoLoop::CrashInFlight() {
  for (const Io& io : io_) {
    if (io.task || io.sync || !rng_.OneIn(2)) continue;
    // The kernel finishes a write the dead process submitted, possibly in
    // part. Nobody is told.
    SimFs::Inode* in = node_->fs.Get(io.ino);
    if (in == nullptr) continue;
    const size_t n = rng_.OneIn(2) ? io.bytes : rng_.Below(io.bytes + 1);
    // Written as the kernel, not as the dead process.
    (void)node_->fs.Write(Actor::kClient, io.ino, io.offset, std::span(io.data, n));
  }
  io_.clear();
  sent_.clear();
}

bool SimIoLoop::HasEvents() const {
  if (!io_.empty() || !sent_.empty() || (!node_->backlog.empty() && node_->listening)) return true;
  for (const auto& [id, s] : node_->sockets) {
    if (s.daemon_fd < 0 || s.close_reported) continue;
    if (s.remove_requested) return true;
    if (s.receiving && (!s.to_daemon.empty() || s.client_closed)) return true;
  }
  return false;
}

Status SimIoLoop::RunOnce(int timeout_ms) {
  (void)timeout_ms;  // the world moves the clock
  ++round_;
  work_ = RoundWork{};
  SimFs& fs = node_->fs;
  // The sends of earlier rounds are reported before this round's events or
  // after them (the real loop's completions come in no fixed order).
  const bool sent_first = rng_.OneIn(2);
  if (sent_first) ReportSent();
  // Accepts.
  if (!node_->backlog.empty() && rng_.Ppm(options_.accept_error_ppm)) {
    stats_->Fault("loop.accept.emfile");
    callbacks_->OnAcceptError(EMFILE);
  } else {
    while (!node_->backlog.empty() && !fs.daemon_dead()) {
      const uint64_t id = node_->backlog.front();
      node_->backlog.pop_front();
      SimSocket* s = node_->Socket(id);
      if (s == nullptr) continue;
      s->daemon_fd = node_->AllocFd(SimNode::FdEntry{SimNode::FdEntry::kSocket, id, 0});
      callbacks_->OnAccept(s->daemon_fd, s->peer);
    }
  }
  // Packets and ends of connections, in descriptor order.
  std::vector<std::pair<int, uint64_t>> conns;
  for (const auto& [id, s] : node_->sockets) {
    if (s.daemon_fd >= 0 && !s.close_reported) conns.emplace_back(s.daemon_fd, id);
  }
  std::sort(conns.begin(), conns.end());
  for (const auto& [fd, id] : conns) {
    if (fs.daemon_dead()) break;
    SimSocket* s = node_->Socket(id);
    if (s == nullptr || s->daemon_fd != fd) continue;
    if (s->receiving) {
      const uint64_t n = 1 + rng_.Below(options_.packets_per_round_max);
      for (uint64_t i = 0; i < n && !s->to_daemon.empty() && s->receiving; ++i) {
        std::vector<std::byte> packet = std::move(s->to_daemon.front());
        s->to_daemon.pop_front();
        // The loop receives at most packet_bytes_max; longer is truncated.
        const bool truncated = packet.size() > wire::kRequestBytesMax;
        if (truncated) packet.resize(wire::kRequestBytesMax);
        callbacks_->OnPacket(fd, packet, truncated);
        s = node_->Socket(id);
        if (s == nullptr || s->daemon_fd != fd) break;
      }
      if (s == nullptr || s->daemon_fd != fd) continue;
      if (s->receiving && s->client_closed && s->to_daemon.empty()) {
        s->receiving = false;
        s->close_reported = true;
        callbacks_->OnConnectionClosed(fd, 0);
        continue;
      }
    }
    if (s->remove_requested && !s->close_reported) {
      s->close_reported = true;
      callbacks_->OnConnectionClosed(fd, 0);
    }
  }
  if (!sent_first) ReportSent();
  // I/O completions.
  std::deque<Io> later;
  while (!io_.empty() && !fs.daemon_dead()) {
    Io io = std::move(io_.front());
    io_.pop_front();
    if (io.due_round > round_) {
      later.push_back(std::move(io));
      continue;
    }
    int64_t result;
    if (io.task) {
      result = io.task();
    } else if (io.sync) {
      SimNode::FdEntry* e = node_->MutableFd(io.fd);
      result = -fs.Sync(Actor::kDaemon, io.ino, e != nullptr ? &e->wb_err_seen : nullptr);
    } else {
      result = fs.Write(Actor::kDaemon, io.ino, io.offset, std::span(io.data, io.bytes));
    }
    if (fs.daemon_dead()) break;
    callbacks_->OnIoDone(io.cookie, result);
  }
  while (!later.empty()) {
    io_.push_front(std::move(later.back()));
    later.pop_back();
  }
  if (!fs.daemon_dead()) callbacks_->OnRoundEnd();
  return Status::Ok();
}

}  // namespace postspool::sim
