// Client: one postspool_client. Builds a post's record and hands it to the
// daemon's socket, else to the spool, within the post's time budget.
#pragma once

#include <pthread.h>
#include <sys/types.h>

#include <atomic>
#include <memory>

#include "daemon_socket.h"
#include "options.h"
#include "ring_client.h"
#include "postspool.h"
#include "spool.h"

namespace postspool::client {

// Thread safety: posts on one client are serialised by one mutex, and a
// thread's wait for it counts against that post's budget. A post that cannot
// have the mutex within the socket's share of its budget (another thread's
// post is waiting for a slow daemon) skips the socket and appends to the
// spool on its own descriptors, so contention costs a detour, not a failure.
//
// Fork safety: the socket and the spool descriptors belong to the process
// that opened them (ProcessState). The first post in a child replaces them;
// closing the child's copies does not affect the parent's connection or its
// spool locks. If another thread of the parent held the mutex at the fork,
// its state may be half-updated: the child abandons it (a small leak) and
// re-initialises the mutex rather than wait for a thread that does not exist.
class Client {
 public:
  explicit Client(ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // postspool_post: POSTSPOOL_OK, or an error code with the thread's last
  // error set. May throw std::bad_alloc (the C ABI layer turns it into
  // POSTSPOOL_ENOMEM).
  int Post(const struct postspool_post* post, postspool_post_result* result);
  // postspool_report_dropped: POSTSPOOL_OK once the count is in the ring,
  // else an error code with the thread's last error set.
  int ReportDropped(uint32_t count);

 private:
  struct ProcessState {
    explicit ProcessState(const ClientOptions& options)
        : socket(options.socket_path), spool(options.spool_dir, options.sync_spool) {}
    DaemonSocket socket;
    RingClient ring;
    Spool spool;
  };

  // Makes the calling process the owner of the per-process state.
  void AdoptIfForked();
  int Fail(int error, const std::string& detail, const char* rel_path) const;

  const ClientOptions options_;
  pthread_mutex_t mutex_;
  // The pid whose ProcessState state_ is; -pid while that process's first
  // post is adopting it.
  std::atomic<pid_t> owner_pid_;
  // The process's fork count (an atfork handler's) when owner_pid_ was
  // last confirmed: a post notices a fork without calling getpid(). A
  // child made by vfork or a raw clone runs no atfork handler; it must not
  // post (it may only exec or _exit).
  std::atomic<uint32_t> forks_seen_;
  ProcessState* state_;  // owned, except when abandoned after a fork
};

// The error code for a failed spool append (after the daemon failed too).
int SpoolErrorCode(const Status& status);

}  // namespace postspool::client
