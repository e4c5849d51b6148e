// The ingest loop's I/O interface. The ingest logic (Ingest, ingest.h) is
// written against it and makes no system call of its own; two backends
// implement it: io_uring (UringLoop: multishot
// accept and recv with a provided-buffer ring, syncs submitted through the
// ring, journal writes inline) and epoll (EpollLoop: the same events from readiness and
// plain system calls), for kernels or sandboxes without io_uring.
//
// Single-threaded: every call and every callback happens on the loop's
// thread. Callbacks are never made from inside a call of this interface;
// they are made from RunOnce(). The simulation (tests/sim) implements it too.
#pragma once

#include <sys/types.h>


#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "status.h"

namespace postspool::daemon {

// Who is at the other end of a connection (SO_PEERCRED, taken by the loop
// when it accepted the connection: the kernel's word, not the client's).
struct PeerCred {
  uid_t uid = 0;
  gid_t gid = 0;
  pid_t pid = 0;
};

class IoCallbacks {
 public:
  virtual ~IoCallbacks() = default;
  // A new connection on the listening socket. The callee owns `fd`: it calls
  // AddConnection to receive on it, or Close to refuse it.
  virtual void OnAccept(int fd, const PeerCred& peer) = 0;
  // accept failed with something other than EAGAIN (EMFILE, ENFILE,
  // ENOMEM...): the loop stops accepting for accept_pause_ms and logs once
  // per episode; the callee counts it.
  virtual void OnAcceptError(int error) = 0;
  // One packet from a connection. `truncated` when it was longer than the
  // largest packet the loop receives (packet_bytes_max). The bytes are valid
  // only during the call and 8-byte aligned.
  virtual void OnPacket(int fd, std::span<const std::byte> packet, bool truncated) = 0;
  // The connection ended (EOF, error, or RemoveConnection). After this call
  // the loop does not touch `fd` any more; the callee closes it.
  virtual void OnConnectionClosed(int fd, int error) = 0;
  // A watched descriptor (inotify, signalfd, timerfd, eventfd) is readable.
  virtual void OnReadable(int fd) = 0;
  // A write or sync submitted with `cookie` completed: `result` is the byte
  // count (writes), 0 (syncs) or -errno.
  virtual void OnIoDone(uint64_t cookie, int64_t result) = 0;
  // The packet given to Send with `cookie` went out whole (`sent`), or not:
  // the client does not read (its receive buffer is full), is gone, or shut
  // its reading side. Every Send is reported once, from RunOnce (never from
  // inside Send).
  virtual void OnSent(uint64_t cookie, bool sent) = 0;
  // Every event of one round has been delivered: the group-commit point.
  virtual void OnRoundEnd() = 0;
};

class IoLoop {
 public:
  virtual ~IoLoop() = default;
  virtual const char* name() const = 0;

  // Starts accepting on a listening socket (non-blocking, SOCK_SEQPACKET).
  virtual Status Listen(int listen_fd) = 0;
  // Stops accepting; the caller may close the socket after the next round.
  virtual void StopListening() = 0;
  // Starts receiving packets on a connection.
  virtual Status AddConnection(int fd) = 0;
  // Stops receiving; OnConnectionClosed(fd, 0) follows in a later round.
  virtual void RemoveConnection(int fd) = 0;
  // Sends one packet (at most kSendBytesMax) on a connection without
  // waiting (MSG_DONTWAIT, MSG_NOSIGNAL), and reports it with
  // OnSent(cookie, ...). The packet is copied; it goes out by the time the
  // loop next waits for events, with the round's other packets (io_uring:
  // one io_uring_enter for all of them and the wait, instead of one send(2)
  // each).
  virtual void Send(int fd, std::span<const std::byte> packet, uint64_t cookie) = 0;
  static constexpr size_t kSendBytesMax = 64;
  // Closes a connection descriptor: one refused in OnAccept, or one reported
  // by OnConnectionClosed. A packet sent on it before goes out first.
  virtual void Close(int fd) = 0;
  // Reports readability of `fd` (level-triggered: OnReadable again until
  // the callee drained it).
  virtual Status Watch(int fd) = 0;
  // pwrite(fd, data, bytes, offset); `data` must stay valid until OnIoDone.
  virtual void SubmitWrite(int fd, const std::byte* data, size_t bytes, uint64_t offset,
                           uint64_t cookie) = 0;
  // fdatasync(fd).
  virtual void SubmitSync(int fd, uint64_t cookie) = 0;
  // Runs `task` where it cannot stall the loop and reports its result with
  // OnIoDone(cookie, result): for work io_uring has no operation for
  // (creating a journal segment). The io_uring backend runs it on its one
  // worker thread; the epoll backend inline, as it does its writes and
  // syncs. `task` must touch nothing the loop's thread uses. At most
  // kTasksMax outstanding.
  virtual void SubmitTask(std::function<int64_t()> task, uint64_t cookie) = 0;
  static constexpr size_t kTasksMax = 4;

  // Runs one round: waits up to `timeout_ms` (-1: no limit) for events,
  // delivers them, then OnRoundEnd. An error here is fatal for the loop.
  virtual Status RunOnce(int timeout_ms) = 0;
};

struct IoLoopOptions {
  size_t packet_bytes_max = 0;   // the largest packet received whole
  uint32_t connections_max = 0;  // to size rings and tables
  // After an accept error (EMFILE...), how long accepting pauses.
  uint32_t accept_pause_ms = 100;
};

// io_uring; kUnsupported (with the reason in the message) when the kernel,
// a sysctl or seccomp refuses it or a needed feature is missing.
Status NewUringLoop(const IoLoopOptions& options, IoCallbacks* callbacks,
                    std::unique_ptr<IoLoop>* out);
Status NewEpollLoop(const IoLoopOptions& options, IoCallbacks* callbacks,
                    std::unique_ptr<IoLoop>* out);

}  // namespace postspool::daemon
