// The client's side of the daemon's SOCK_SEQPACKET socket (format/
// socket_protocol.h): one request, one acknowledgement, every wait bounded
// by the caller's deadline.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>

#include "segment_writer.h"
#include "unique_fd.h"

namespace postspool::client {

using Clock = segment::Clock;
using Deadline = segment::Deadline;

// Connect lazily and keep the connection for later posts. After a failed
// connect (or a daemon that said it is going away or cannot write its
// journal) skip the socket for a back-off that starts at kBackOffInitial and
// doubles up to kBackOffMax (short: a restarted daemon is used again
// soon); an accepted post resets it. A connection whose
// request timed out is dropped, so a late ack is never taken for a later
// request's.
//
// Owned by one process and used by one thread at a time (the Client
// serialises and replaces it after a fork).
class DaemonSocket {
 public:
  static constexpr std::chrono::milliseconds kBackOffInitial{1000};
  static constexpr std::chrono::milliseconds kBackOffMax{5000};

  explicit DaemonSocket(std::string path) : path_(std::move(path)) {}

  struct Result {
    bool accepted = false;
    // Why the daemon did not take the post, e.g. "connect /run/x.sock: No
    // such file or directory" or "daemon journal full".
    std::string reason;
    // The daemon called the request malformed: a bug on one side, worth
    // reporting even though the spool then takes the post.
    bool malformed = false;
    // The daemon's disk quota (disk_bytes_max) is reached: the post must
    // fail with POSTSPOOL_ENOSPACE, not go to the spool, which shares it.
    bool full = false;
  };

  // Sends one request carrying `records` (`record_count` framed records) and
  // waits for its acknowledgement until `deadline`.
  Result Post(std::span<const std::byte> records, uint16_t record_count, Deadline deadline);

  // Asks the daemon for this uid's shared-memory ring (a request of no
  // records, FORMAT.md): on success *ring_id is the ring's System V shared
  // memory id.
  Result RequestRing(Deadline deadline, int* ring_id);

  // The connected descriptor (-1 if none), for diagnostics and tests.
  int descriptor() const { return fd_.get(); }

 private:
  enum class SendOutcome { kSent, kStale, kFailed };
  bool Connect(Deadline deadline, std::string* reason);
  SendOutcome Send(std::span<const std::byte> header, std::span<const std::byte> records,
                   Deadline deadline, std::string* reason);
  Result Exchange(std::span<const std::byte> records, uint16_t record_count, Deadline deadline,
                  int* ring_id);
  Result AwaitAck(uint64_t request_id, uint16_t record_count, Deadline deadline, int* ring_id);
  // Drops the connection and skips the socket for the next back-off period.
  void BackOff(const std::string& reason);
  Result Fail(std::string reason, bool back_off);

  std::string path_;
  UniqueFd fd_;
  uint64_t next_request_id_ = 1;
  Clock::time_point retry_after_{};
  Clock::duration back_off_{0};
  std::string back_off_reason_;
};

}  // namespace postspool::client
