// The control socket: `postspool status|drain|metrics` and the few requests
// that change the daemon's state, on a Unix stream socket of its own
// (control_socket_path).
//
// Protocol: one request, one reply. The client sends one JSON object on one
// line ({"request": "status"}), at most kRequestBytesMax bytes; the daemon
// answers with one JSON object on one line ({"ok": true, ...} or
// {"ok": false, "error": "..."}) and closes the connection.
//
// Who may do what: the peer's credentials come from the kernel
// (SO_PEERCRED, and SO_PEERGROUPS for its supplementary groups), never from
// the request. Every user may read (status, metrics); requests that change
// state are for root, the daemon's own uid and members of the daemon's
// group (its effective gid, as primary or supplementary group): the
// handler is told which one the peer is (ControlPeer::may_change).
//
// Threading: the server runs on a thread of its own, so that nothing it does
// (JSON, listing the quarantine, a slow client) ever touches the ingest
// loop, and the ingest logic and the IoLoop interface (which the simulation
// implements) stay as they are. The handler and the tick run on that thread
// and may only read what is safe to read from another thread (atomics,
// snapshots under a mutex that the owner only try-locks or holds briefly).
//
// Bounded: at most connections_max clients at once (one more is told
// "busy" and closed), kRequestBytesMax per request, a reply of at most
// kReplyBytesMax, and client_timeout_ms per connection from accept to the
// last byte of the reply (a client that does not read its reply is closed).
// All socket I/O is non-blocking, multiplexed by one poll().
#pragma once

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "metrics.h"
#include "status.h"
#include "unique_fd.h"

namespace postspool::daemon {

struct ControlPeer {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  bool may_change = false;  // root, the daemon's uid, or in the daemon's group
};

class ControlServer {
 public:
  static constexpr size_t kRequestBytesMax = 4096;
  static constexpr size_t kReplyBytesMax = 1 << 20;

  struct Options {
    std::string path;
    uint32_t mode = 0666;
    uint32_t connections_max = 16;
    uint32_t client_timeout_ms = 2000;
  };
  // Runs on the control thread for each well-formed request (a JSON object
  // with a string "request"); returns the reply object.
  using Handler = std::function<nlohmann::json(const nlohmann::json& request, const ControlPeer&)>;
  // Runs on the control thread about once a second (rates).
  using Tick = std::function<void()>;

  // `metrics` (borrowed, must outlive the server) gets the control_*
  // counters.
  explicit ControlServer(Metrics* metrics) : metrics_(metrics) {}
  ~ControlServer();  // Stop()
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  // Binds the socket (a stale socket file there is replaced; anything else
  // is an error) and starts the thread.
  Status Start(const Options& options, Handler handler, Tick tick);
  // Stops the thread, closes every connection and removes the socket file
  // (if it is still the one it bound).
  void Stop();

 private:
  struct Client {
    UniqueFd fd;
    ControlPeer peer;
    std::chrono::steady_clock::time_point deadline;
    std::string in;
    std::string out;
    size_t out_sent = 0;
    bool replying = false;
  };
  void Run();
  void Accept();
  // Reads what is there; returns false when the client is to be closed.
  bool OnReadable(Client* c);
  bool OnWritable(Client* c);
  void Reply(Client* c, const nlohmann::json& reply);
  void HandleRequest(Client* c, std::string_view line);

  Metrics* const metrics_;
  Options options_;
  Handler handler_;
  Tick tick_;
  UniqueFd listen_fd_;
  UniqueFd stop_fd_;  // eventfd
  dev_t socket_dev_ = 0;  // the socket file this server bound: Stop removes
  ino_t socket_ino_ = 0;  // only that one, never a successor's
  std::thread thread_;
  std::vector<Client> clients_;
  // accept() failed (EMFILE...): the listening socket is not polled until
  // then, so that the thread does not spin on it.
  std::chrono::steady_clock::time_point accept_paused_until_{};
};

}  // namespace postspool::daemon
