// SimNode: the simulated machine under the daemon and its clients — the
// virtual clock, the disk (SimFs), the daemon process's descriptor table and
// the Unix sockets between clients and the daemon. The daemon's ports
// (SimIoLoop, SimStorage, SimSpoolDir) and the simulated clients all act on
// one SimNode; a crash of the daemon closes its descriptors and sockets
// here, and a power loss also drops what SimFs did not make durable.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <map>
#include <vector>

#include "io_loop.h"
#include "ports.h"
#include "sim_fs.h"
#include "sim_rng.h"
#include "sim_stats.h"

namespace postspool::sim {

using daemon::Clock;

class SimClock final : public daemon::ClockPort {
 public:
  Clock::time_point Now() override { return now_; }
  int64_t WallSeconds() override {
    return kWallBaseS + std::chrono::duration_cast<std::chrono::seconds>(now_.time_since_epoch()).count();
  }
  void Advance(Clock::duration d) { now_ += d; }
  static constexpr int64_t kWallBaseS = 1700000000;

 private:
  Clock::time_point now_ = Clock::time_point{} + std::chrono::hours(1);
};

// One connection between a client and the daemon (SOCK_SEQPACKET).
struct SimSocket {
  uint64_t id = 0;
  daemon::PeerCred peer;
  int daemon_fd = -1;  // once accepted
  std::deque<std::vector<std::byte>> to_daemon;
  std::deque<std::vector<std::byte>> to_client;
  size_t to_daemon_max = 8;   // packets the socket buffers
  size_t to_client_max = 8;   // acks the client's receive buffer holds
  bool client_closed = false;
  bool daemon_closed = false;   // the daemon closed it (or died): the client reads EOF
  bool receiving = false;       // AddConnection
  bool remove_requested = false;
  bool close_reported = false;  // OnConnectionClosed delivered
};

class SimNode {
 public:
  SimNode(SimRng rng, SimStats* stats) : fs(rng.Fork(), stats), rng_(rng) {}

  SimClock clock;
  SimFs fs;

  // --- The daemon's descriptors --------------------------------------------
  struct FdEntry {
    enum Kind { kSocket, kFile, kListen, kDir } kind = kFile;
    uint64_t socket = 0;  // kSocket
    SimFs::Ino ino = 0;   // kFile
    uint32_t wb_err_seen = 0;  // kFile: writeback errors reported to it
    DirId dir = kJournalDir;   // kDir
  };
  int AllocFd(FdEntry e) {
    int fd = 3;
    while (fds_.count(fd) != 0) ++fd;  // the lowest free, as the kernel does
    if (e.kind == FdEntry::kFile) {
      fs.Ref(e.ino);
      e.wb_err_seen = fs.Get(e.ino)->wb_err;
    }
    fds_[fd] = e;
    return fd;
  }
  void CloseFd(int fd) {
    auto it = fds_.find(fd);
    if (it == fds_.end()) return;
    if (it->second.kind == FdEntry::kFile) fs.Unref(it->second.ino);
    fds_.erase(it);
  }
  const FdEntry* Fd(int fd) const {
    auto it = fds_.find(fd);
    return it == fds_.end() ? nullptr : &it->second;
  }
  FdEntry* MutableFd(int fd) {
    auto it = fds_.find(fd);
    return it == fds_.end() ? nullptr : &it->second;
  }

  // --- Sockets ---------------------------------------------------------------
  bool listening = false;
  size_t backlog_max = 16;
  std::deque<uint64_t> backlog;            // connected, not yet accepted
  std::map<uint64_t, SimSocket> sockets;   // by id

  // A client connects: ECONNREFUSED (nobody listens), EAGAIN (backlog full)
  // or 0 and *id.
  int Connect(const daemon::PeerCred& peer, size_t to_client_max, uint64_t* id) {
    if (!listening) return ECONNREFUSED;
    if (backlog.size() >= backlog_max) return EAGAIN;
    SimSocket s;
    s.id = next_socket_++;
    s.peer = peer;
    s.to_client_max = to_client_max;
    *id = s.id;
    sockets[s.id] = std::move(s);
    backlog.push_back(*id);
    return 0;
  }
  SimSocket* Socket(uint64_t id) {
    auto it = sockets.find(id);
    return it == sockets.end() ? nullptr : &it->second;
  }
  // The client side closed; forgotten once the daemon side is closed too.
  void ClientClose(uint64_t id) {
    SimSocket* s = Socket(id);
    if (s == nullptr) return;
    s->client_closed = true;
    s->to_client.clear();
    Forget(id);
  }
  void Forget(uint64_t id) {
    SimSocket* s = Socket(id);
    if (s != nullptr && s->client_closed && s->daemon_closed) sockets.erase(id);
  }

  // Which daemon process this is: DaemonDied starts a new one.
  uint64_t incarnation() const { return incarnation_; }

  // The daemon process died: every descriptor closes, every client reads EOF.
  void DaemonDied() {
    ++incarnation_;
    for (auto& [fd, e] : fds_) {
      if (e.kind == FdEntry::kFile) fs.Unref(e.ino);
    }
    fds_.clear();
    listening = false;
    backlog.clear();
    for (auto it = sockets.begin(); it != sockets.end();) {
      it->second.daemon_closed = true;
      it->second.daemon_fd = -1;
      it->second.to_daemon.clear();
      if (it->second.client_closed) {
        it = sockets.erase(it);
      } else {
        ++it;
      }
    }
  }

  SimRng& rng() { return rng_; }

  // Something changed in the spool directory (what inotify reports).
  bool spool_changed = true;

  // The run's event trace (verbose runs), or null.
  std::function<void(const std::string&)> trace;
  void Trace(const std::string& line) const {
    if (trace) trace(line);
  }

 private:
  std::map<int, FdEntry> fds_;
  uint64_t next_socket_ = 1;
  uint64_t incarnation_ = 0;
  SimRng rng_;
};

}  // namespace postspool::sim
