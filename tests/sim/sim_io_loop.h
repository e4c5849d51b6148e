// SimIoLoop: the IoLoop (daemon/loop/io_loop.h) on a SimNode. One RunOnce is one
// round: accepted connections, then packets (a few per connection, in
// descriptor order), then connections that ended, then the writes and
// syncs submitted in earlier rounds (applied to SimFs now, with its faults),
// then OnRoundEnd. Callbacks are made only from RunOnce, never from inside
// another call, as the real loops promise.
//
// Send() puts the ack in the client's receive buffer, or fails when the
// client closed or its buffer is full (a client that does not read); a
// RunOnce reports it later (OnSent), before or after that round's events.
//
// Counts what the Ingest asks of it per round, for the bounded-work check.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "io_loop.h"
#include "sim_node.h"

namespace postspool::sim {

struct RoundWork {
  uint64_t sends = 0;
  uint64_t writes = 0;
  uint64_t syncs = 0;
};

class SimIoLoop final : public daemon::IoLoop {
 public:
  struct Options {
    uint32_t accept_error_ppm = 0;   // an accept fails (EMFILE) this round
    uint32_t send_full_ppm = 0;      // a client's receive buffer is full
    uint32_t packets_per_round_max = 4;
    uint32_t io_delay_rounds_max = 2;  // a submitted write completes 1..this+1 rounds later
  };
  SimIoLoop(SimNode* node, daemon::IoCallbacks* callbacks, SimRng rng, SimStats* stats)
      : node_(node), callbacks_(callbacks), rng_(rng), stats_(stats) {}

  void set_options(const Options& o) { options_ = o; }

  const char* name() const override { return "sim"; }
  Status Listen(int listen_fd) override;
  void StopListening() override;
  Status AddConnection(int fd) override;
  void RemoveConnection(int fd) override;
  void Send(int fd, std::span<const std::byte> packet, uint64_t cookie) override;
  void Close(int fd) override;
  Status Watch(int fd) override;
  void SubmitWrite(int fd, const std::byte* data, size_t bytes, uint64_t offset,
                   uint64_t cookie) override;
  void SubmitSync(int fd, uint64_t cookie) override;
  // Runs the task as a completion, rounds later (as the worker thread
  // would); a crash before then drops it.
  void SubmitTask(std::function<int64_t()> task, uint64_t cookie) override;
  Status RunOnce(int timeout_ms) override;

  // The daemon dies: writes in flight land (whole or torn) or not.
  void CrashInFlight();
  const RoundWork& round_work() const { return work_; }
  // Something would wake the real loop before its timeout: a connection to
  // accept, a packet, a connection that ended or is to be closed, an I/O
  // completion (the simulated ones advance by rounds, so one in flight
  // counts).
  bool HasEvents() const;
  // A write, sync or task is in flight.
  bool HasIo() const { return !io_.empty(); }

 private:
  struct Io {
    bool sync = false;
    int fd = -1;
    SimFs::Ino ino = 0;
    const std::byte* data = nullptr;
    size_t bytes = 0;
    uint64_t offset = 0;
    uint64_t cookie = 0;
    uint64_t due_round = 0;
    std::function<int64_t()> task;  // set: a task, not a write or sync
  };
  SimSocket* SocketOf(int fd);
  void ReportSent();

  SimNode* node_;
  daemon::IoCallbacks* callbacks_;
  SimRng rng_;
  SimStats* stats_;
  Options options_;
  uint64_t round_ = 0;
  std::deque<Io> io_;
  std::deque<std::pair<uint64_t, bool>> sent_;  // sends to report: cookie, whether it went out
  RoundWork work_;
};

}  // namespace postspool::sim
