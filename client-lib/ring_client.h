// The client's side of the per-uid shared-memory ring (format/ring_format.h,
// FORMAT.md "The shared-memory ring"): the ring is asked of the daemon once
// over the socket (it answers with the System V shared memory id of this
// uid's ring, after checking SO_PEERCRED), attached, and a lane claimed for
// this process. A post is then a copy into
// the lane and one release-store, with a system call only when the daemon
// said it sleeps (the futex doorbell).
//
// Owned by one process and used by one thread at a time (the Client
// serialises and replaces it after a fork: a child claims its own lane).
#pragma once

#include <sys/types.h>

#include <span>
#include <string>

#include "daemon_socket.h"
#include "ring_format.h"
#include "unique_fd.h"

namespace postspool::client {

class RingClient {
 public:
  // After the daemon refused a ring (or it could not be attached), how long
  // posts go straight to the socket before asking again: doubling from the
  // first to the last with each refusal in a row.
  static constexpr std::chrono::milliseconds kRetryFirst{50};
  static constexpr std::chrono::milliseconds kRetryMax{5000};
  // How often the ring is checked for having been removed (by its user, or
  // by logind at logout): a removed ring is read only until the daemon
  // stops, so the process asks for the new one.
  static constexpr std::chrono::milliseconds kCheckInterval{100};

  RingClient() = default;
  ~RingClient();
  RingClient(const RingClient&) = delete;
  RingClient& operator=(const RingClient&) = delete;

  enum class Outcome {
    kAppended,       // in the ring (and journaled, if the daemon is at `synced`)
    kNotSynced,      // in the ring, but not journaled within the budget (`synced`)
    kUnavailable,    // not taken: use the next transport (reason says why)
    kQuotaFull,      // not taken: the uid is at its disk share (the socket says so)
  };
  struct Result {
    Outcome outcome = Outcome::kUnavailable;
    std::string reason;
  };
  // `attach_deadline` bounds asking the daemon for the ring (first post);
  // `deadline` the wait for `synced`.
  // When the lane is full, waits until `deadline` for the daemon to make
  // room: a post that took another transport would overtake the ones
  // waiting in the lane.
  Result Post(std::span<const std::byte> record, DaemonSocket* socket, Deadline attach_deadline,
              Deadline deadline);

  // Before a post takes another transport: waits until `deadline` for the
  // daemon to have taken every post of this process from the lane, so that
  // the posts of one thread are journaled in the order it made them. False
  // if some are still waiting at the deadline.
  bool WaitDrained(Deadline deadline) const;

  // postspool_report_dropped: adds `count` to the ring's dropped-posts word,
  // asking the daemon for the ring first (within `deadline`) if this
  // process has none. False, with the reason, when there is no ring.
  bool AddDropped(uint64_t count, DaemonSocket* socket, Deadline deadline, std::string* reason);

 private:
  bool Attach(DaemonSocket* socket, Deadline deadline, std::string* reason);
  void Detach();
  bool WaitJournaled(uint64_t end, Deadline deadline) const;
  bool WaitForRoom(size_t bytes, Deadline deadline) const;
  bool Removed() const;

  int shm_id_ = -1;
  void* map_ = nullptr;
  size_t bytes_ = 0;
  ring::Ring ring_;
  pid_t pid_ = 0;            // the process that mapped it and owns the lane
  uint64_t identity_ = 0;
  bool have_lane_ = false;
  uint32_t lane_ = 0;
  uint64_t tail_ = 0;
  Clock::time_point retry_after_{};
  std::chrono::milliseconds retry_wait_{0};
  bool posted_ = false;  // a post came here before (the ring is asked for from the second)
  Clock::time_point next_check_{};
  std::string unavailable_;
};

}  // namespace postspool::client
