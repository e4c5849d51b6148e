// FakeDaemon: a SOCK_SEQPACKET server thread that speaks the daemon's side of
// the socket protocol (format/socket_protocol.h) just well enough for the
// client library's tests, and can misbehave on request.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "post.h"
#include "unique_fd.h"

namespace postspool::testing {

class FakeDaemon {
 public:
  enum class Mode {
    kAccept,        // journal (record) the posts and ack kAccepted
    kNeverAnswer,   // read requests, never answer
    kFull,          // ack kFull (nothing taken)
    kBusy,          // ack kBusy (nothing taken)
    kShuttingDown,  // ack kShuttingDown (nothing taken)
    kClose,         // close the connection on receiving a request
    kGarbageAck,    // answer with a packet that is not an ack
    kWrongRequestId,  // ack kAccepted, but for another request id
    kSlowAck,       // like kAccept, after slow_ack_delay (the server stalls)
  };

  struct Received {
    PostData post;
    pid_t peer_pid = 0;      // SO_PEERCRED of the connection
    uint64_t connection = 0; // 1, 2, ... in accept order
    uint64_t request_id = 0;
  };

  // Binds and listens on `socket_path` and starts serving. Check ok().
  explicit FakeDaemon(std::string socket_path, Mode mode = Mode::kAccept);
  ~FakeDaemon();  // stops the thread, closes everything, unlinks the socket
  FakeDaemon(const FakeDaemon&) = delete;
  FakeDaemon& operator=(const FakeDaemon&) = delete;

  bool ok() const { return listen_fd_.valid(); }
  void set_mode(Mode mode) { mode_.store(mode); }
  void set_slow_ack_delay(std::chrono::milliseconds delay) { slow_ack_delay_ms_.store(delay.count()); }

  // Posts taken (mode kAccept), in arrival order.
  std::vector<Received> received() const;
  // Requests seen in any mode (valid or not).
  size_t requests_seen() const;
  size_t malformed_requests() const;
  size_t connections_accepted() const;
  // Waits until requests_seen() >= n; false on timeout.
  bool WaitForRequests(size_t n, std::chrono::milliseconds timeout) const;
  // Closes every client connection (as a daemon restart would) and waits
  // until the server thread did.
  void CloseAllConnections();

 private:
  struct Connection {
    UniqueFd fd;
    pid_t peer_pid = 0;
    uint64_t number = 0;
  };
  void Run();
  void Accept();
  // False when the connection is to be closed.
  bool Serve(Connection* c);
  void Wake();

  std::string path_;
  std::atomic<Mode> mode_;
  std::atomic<int64_t> slow_ack_delay_ms_{100};
  UniqueFd listen_fd_;
  UniqueFd wake_fd_;  // eventfd
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> close_all_requests_{0};
  std::atomic<uint64_t> close_all_done_{0};
  std::vector<Connection> connections_;  // server thread only
  std::vector<std::byte> packet_;        // server thread only
  uint64_t connections_accepted_ = 0;    // guarded by mutex_

  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  std::vector<Received> received_;
  size_t requests_seen_ = 0;
  size_t malformed_requests_ = 0;
  std::thread thread_;
};

}  // namespace postspool::testing
