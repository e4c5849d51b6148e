// The io_uring backend of IoLoop: multishot accept on the listening socket,
// multishot recv with a provided-buffer ring on every connection (so idle
// connections hold no buffer), multishot poll for watched descriptors, and
// journal syncs submitted through the ring; what io_uring has no operation
// for (creating a journal segment) runs on one worker thread whose eventfd
// the ring polls.
//
// Journal writes are made inline, with pwrite, and their completions
// delivered in the same round: a buffered write to ext4 cannot be issued
// without blocking, so io_uring handed every one to its io-wq worker thread,
// and each batch cost two thread switches (a quarter of the daemon's CPU per
// socket post, and most of a post's latency when client and daemon share a
// CPU). A write into the page cache takes microseconds; an fdatasync, which
// waits for the device, still goes through the ring.
//
// Acknowledgements are sends in the ring (MSG_DONTWAIT: issued at once when
// submitted, never parked waiting for room): a round's acks and the wait for
// the next events are one io_uring_enter, where each was a send(2) of its
// own (8 socket clients: 13.2 -> 11.2 us of daemon CPU per post).
//
// Every submission's user_data names its operation and, for per-connection
// operations, the connection's generation: a completion that arrives after
// the connection was removed (and its fd number reused) is recognised as
// stale and dropped, so the kernel never completes into state that is gone.
#include <liburing.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <array>
#include <cassert>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <vector>

#include "background_worker.h"
#include "io_loop.h"
#include "log.h"
#include "socket_ops.h"

namespace postspool::daemon {
namespace {

enum Op : uint64_t {
  kAccept = 1, kRecv = 2, kPoll = 3, kSync = 5, kCancel = 6, kAcceptResume = 7,
  kTasksDone = 8, kSend = 9
};

constexpr uint64_t UserData(Op op, uint32_t gen, int fd) {
  return (uint64_t{op} << 56) | (uint64_t{gen & 0xffffffu} << 32) | static_cast<uint32_t>(fd);
}
constexpr uint64_t CookieData(Op op, uint64_t cookie) { return (uint64_t{op} << 56) | cookie; }
constexpr Op OpOf(uint64_t ud) { return static_cast<Op>(ud >> 56); }
constexpr uint32_t GenOf(uint64_t ud) { return static_cast<uint32_t>((ud >> 32) & 0xffffffu); }
constexpr int FdOf(uint64_t ud) { return static_cast<int>(ud & 0xffffffffu); }
constexpr uint64_t CookieOf(uint64_t ud) { return ud & ((uint64_t{1} << 56) - 1); }

constexpr unsigned kBufferGroup = 0;
constexpr unsigned kBufferCount = 64;  // power of two
constexpr int kCqesPerRound = 512;

bool KernelAtLeast(int major, int minor) {
  utsname u;
  if (::uname(&u) != 0) return false;
  int ma = 0, mi = 0;
  if (std::sscanf(u.release, "%d.%d", &ma, &mi) != 2) return false;
  return ma > major || (ma == major && mi >= minor);
}

class UringLoop final : public IoLoop {
 public:
  UringLoop(const IoLoopOptions& options, IoCallbacks* callbacks)
      : options_(options), callbacks_(callbacks), accept_pause_(options.accept_pause_ms) {}

  ~UringLoop() override {
    if (ring_ready_ && sends_unsubmitted_ > 0) io_uring_submit(&ring_);  // the last acks go out
    if (ring_ready_) io_uring_queue_exit(&ring_);
    if (buf_ring_ != nullptr) ::munmap(buf_ring_, buf_ring_bytes_);
    if (buffers_ != nullptr) ::munmap(buffers_, buffer_bytes_ * kBufferCount);
  }

  Status Init() {
    if (!KernelAtLeast(6, 0)) {
      return Status(StatusCode::kUnsupported, "kernel older than 6.0 (no multishot recv)");
    }
    io_uring_params p{};
    p.flags = IORING_SETUP_CQSIZE | IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN |
              IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
    // Completions outnumber submissions (multishot): oversize the CQ.
    p.cq_entries = 4096;
    int rc = io_uring_queue_init_params(512, &ring_, &p);
    if (rc == -EINVAL) {
      // An older kernel without some of the flags: the plain ring.
      io_uring_params plain{};
      plain.flags = IORING_SETUP_CQSIZE;
      plain.cq_entries = 4096;
      rc = io_uring_queue_init_params(512, &ring_, &plain);
    }
    if (rc < 0) {
      return Status(StatusCode::kUnsupported,
                    std::string("io_uring_setup: ") + std::strerror(-rc) +
                        (rc == -EPERM ? " (disabled by the kernel.io_uring_disabled sysctl or "
                                        "a seccomp filter)"
                                      : ""));
    }
    ring_ready_ = true;
    io_uring_probe* probe = io_uring_get_probe_ring(&ring_);
    if (probe == nullptr) return Status(StatusCode::kUnsupported, "io_uring probe failed");
    bool ok = true;
    for (int op : {IORING_OP_ACCEPT, IORING_OP_RECV, IORING_OP_SEND, IORING_OP_FSYNC,
                   IORING_OP_POLL_ADD, IORING_OP_ASYNC_CANCEL, IORING_OP_PROVIDE_BUFFERS}) {
      ok = ok && io_uring_opcode_supported(probe, op);
    }
    io_uring_free_probe(probe);
    if (!ok) return Status(StatusCode::kUnsupported, "io_uring lacks a needed operation");

    // The provided-buffer ring: one buffer per packet, each large enough for
    // the largest packet plus one byte, so that a longer one shows as cut.
    buffer_bytes_ = (options_.packet_bytes_max + 1 + 63) & ~size_t{63};
    buffers_ = static_cast<std::byte*>(::mmap(nullptr, buffer_bytes_ * kBufferCount,
                                              PROT_READ | PROT_WRITE,
                                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (buffers_ == MAP_FAILED) {
      buffers_ = nullptr;
      return Status::FromErrno(errno, "mmap receive buffers");
    }
    buf_ring_bytes_ = kBufferCount * sizeof(io_uring_buf);
    void* br = ::mmap(nullptr, buf_ring_bytes_, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (br == MAP_FAILED) return Status::FromErrno(errno, "mmap buffer ring");
    buf_ring_ = static_cast<io_uring_buf_ring*>(br);
    io_uring_buf_ring_init(buf_ring_);
    io_uring_buf_reg reg{};
    reg.ring_addr = reinterpret_cast<uint64_t>(buf_ring_);
    reg.ring_entries = kBufferCount;
    reg.bgid = kBufferGroup;
    rc = io_uring_register_buf_ring(&ring_, &reg, 0);
    if (rc < 0) {
      return Status(StatusCode::kUnsupported,
                    std::string("io_uring_register_buf_ring: ") + std::strerror(-rc));
    }
    for (unsigned i = 0; i < kBufferCount; ++i) {
      io_uring_buf_ring_add(buf_ring_, buffers_ + i * buffer_bytes_,
                            static_cast<unsigned>(buffer_bytes_), static_cast<unsigned short>(i),
                            io_uring_buf_ring_mask(kBufferCount), static_cast<int>(i));
    }
    io_uring_buf_ring_advance(buf_ring_, kBufferCount);
    if (Status s = worker_.Start(); !s.ok()) return s;
    ArmTasksDone();
    return Status::Ok();
  }

  const char* name() const override { return "io_uring"; }

  Status Listen(int listen_fd) override {
    listen_fd_ = listen_fd;
    ArmAccept();
    return Status::Ok();
  }

  void StopListening() override {
    if (listen_fd_ < 0) return;
    io_uring_prep_cancel_fd(Sqe(), listen_fd_, 0);
    io_uring_sqe_set_data64(last_sqe_, UserData(kCancel, 0, listen_fd_));
    listen_fd_ = -1;
  }

  Status AddConnection(int fd) override {
    if (static_cast<size_t>(fd) >= conns_.size()) conns_.resize(static_cast<size_t>(fd) + 64);
    Conn& c = conns_[static_cast<size_t>(fd)];
    c.gen = ++next_gen_ & 0xffffffu;  // user_data carries 24 bits of it
    c.active = true;
    c.removing = false;
    ArmRecv(fd);
    return Status::Ok();
  }

  void RemoveConnection(int fd) override {
    Conn& c = conns_[static_cast<size_t>(fd)];
    if (!c.active || c.removing) return;
    c.removing = true;
    // The recv completes with -ECANCELED and without F_MORE; the close is
    // reported then, when the kernel holds nothing of ours for this fd.
    io_uring_prep_cancel_fd(Sqe(), fd, 0);
    io_uring_sqe_set_data64(last_sqe_, UserData(kCancel, c.gen, fd));
  }

  Status Watch(int fd) override {
    io_uring_prep_poll_multishot(Sqe(), fd, POLLIN);
    io_uring_sqe_set_data64(last_sqe_, UserData(kPoll, 0, fd));
    return Status::Ok();
  }

  void Send(int fd, std::span<const std::byte> packet, uint64_t cookie) override {
    assert(packet.size() <= kSendBytesMax);
    uint32_t slot;
    if (!free_slots_.empty()) {
      slot = free_slots_.back();
      free_slots_.pop_back();
    } else {
      slot = static_cast<uint32_t>(send_slots_.size());
      send_slots_.emplace_back();  // a deque: the others' bytes stay where they are
    }
    SendSlot& s = send_slots_[slot];
    s.cookie = cookie;
    std::memcpy(s.bytes.data(), packet.data(), packet.size());
    // MSG_DONTWAIT: a full receive buffer fails the send (EAGAIN) at once,
    // as send(2) did, instead of io_uring waiting for room.
    io_uring_prep_send(Sqe(), fd, s.bytes.data(), packet.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    io_uring_sqe_set_data64(last_sqe_, CookieData(kSend, (uint64_t{slot} << 8) | packet.size()));
    ++sends_unsubmitted_;
  }

  void Close(int fd) override {
    // A send on this descriptor that is still in the submission queue would
    // find it closed (or, once the number is reused, another connection).
    if (sends_unsubmitted_ > 0) {
      io_uring_submit(&ring_);
      sends_unsubmitted_ = 0;
    }
    ::close(fd);
  }

  void SubmitWrite(int fd, const std::byte* data, size_t bytes, uint64_t offset,
                   uint64_t cookie) override {
    written_.push_back({cookie, WriteWholeAt(fd, data, bytes, offset)});
  }

  void SubmitSync(int fd, uint64_t cookie) override {
    assert(cookie < (uint64_t{1} << 56));
    io_uring_prep_fsync(Sqe(), fd, IORING_FSYNC_DATASYNC);
    io_uring_sqe_set_data64(last_sqe_, CookieData(kSync, cookie));
  }

  void SubmitTask(std::function<int64_t()> task, uint64_t cookie) override {
    assert(tasks_outstanding_ < kTasksMax);
    ++tasks_outstanding_;
    worker_.Submit(std::move(task), cookie);
  }

  Status RunOnce(int timeout_ms) override {
    io_uring_cqe* cqe = nullptr;
    int rc;
    if (!written_.empty()) timeout_ms = 0;  // a completion waits for delivery
    // The sends submitted here complete at once, each with a completion of
    // its own: wait for one more, the next event (else a round's acks would
    // end its wait and cost an empty round each time).
    const unsigned wait_nr = 1 + (io_uring_cq_ready(&ring_) == 0 ? sends_unsubmitted_ : 0);
    if (timeout_ms < 0) {
      rc = io_uring_submit_and_wait(&ring_, wait_nr);
    } else {
      __kernel_timespec ts{timeout_ms / 1000, (timeout_ms % 1000) * 1000000LL};
      rc = io_uring_submit_and_wait_timeout(&ring_, &cqe, wait_nr, &ts, nullptr);
    }
    sends_unsubmitted_ = 0;
    if (rc < 0 && rc != -ETIME && rc != -EINTR && rc != -EBUSY) {
      return Status(StatusCode::kIoError, std::string("io_uring_submit_and_wait: ") +
                                              std::strerror(-rc));
    }
    int handled = 0;
    while (handled < kCqesPerRound && io_uring_peek_cqe(&ring_, &cqe) == 0) {
      const uint64_t ud = io_uring_cqe_get_data64(cqe);
      const int32_t res = cqe->res;
      const uint32_t flags = cqe->flags;
      io_uring_cqe_seen(&ring_, cqe);
      ++handled;
      Handle(ud, res, flags);
    }
    DeliverWritten();
    callbacks_->OnRoundEnd();
    // The round's group commit wrote its batch: its completion (and so the
    // acknowledgements) goes out now, not one more io_uring_enter later.
    // Once: a batch written in this second pass waits for the next round.
    if (!written_.empty()) {
      DeliverWritten();
      callbacks_->OnRoundEnd();
    }
    return Status::Ok();
  }

 private:
  struct Conn {
    uint32_t gen = 0;
    bool active = false;
    bool removing = false;
  };

  struct Written {
    uint64_t cookie;
    int64_t result;
  };

  void DeliverWritten() {
    delivering_.swap(written_);
    for (const Written& w : delivering_) callbacks_->OnIoDone(w.cookie, w.result);
    delivering_.clear();
  }

  io_uring_sqe* Sqe() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    while (sqe == nullptr) {
      io_uring_submit(&ring_);
      sends_unsubmitted_ = 0;
      sqe = io_uring_get_sqe(&ring_);
    }
    last_sqe_ = sqe;
    return sqe;
  }

  void ArmAccept() {
    io_uring_prep_multishot_accept(Sqe(), listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    io_uring_sqe_set_data64(last_sqe_, UserData(kAccept, 0, listen_fd_));
  }

  void ArmRecv(int fd) {
    io_uring_prep_recv_multishot(Sqe(), fd, nullptr, 0, 0);
    last_sqe_->flags |= IOSQE_BUFFER_SELECT;
    last_sqe_->buf_group = kBufferGroup;
    io_uring_sqe_set_data64(last_sqe_, UserData(kRecv, conns_[static_cast<size_t>(fd)].gen, fd));
  }

  void ArmTasksDone() {
    io_uring_prep_poll_multishot(Sqe(), worker_.event_fd(), POLLIN);
    io_uring_sqe_set_data64(last_sqe_, UserData(kTasksDone, 0, worker_.event_fd()));
  }

  void RecycleBuffer(unsigned bid) {
    io_uring_buf_ring_add(buf_ring_, buffers_ + bid * buffer_bytes_,
                          static_cast<unsigned>(buffer_bytes_), static_cast<unsigned short>(bid),
                          io_uring_buf_ring_mask(kBufferCount), 0);
    io_uring_buf_ring_advance(buf_ring_, 1);
  }

  void Closed(int fd, int error) {
    conns_[static_cast<size_t>(fd)].active = false;
    callbacks_->OnConnectionClosed(fd, error);
  }

  void Handle(uint64_t ud, int32_t res, uint32_t flags) {
    switch (OpOf(ud)) {
      case kAccept:
        if (res >= 0) {
          accept_pause_.Succeeded();
          PeerCred peer;
          if (ReadPeerCred(res, &peer)) {
            callbacks_->OnAccept(res, peer);
          } else {
            ::close(res);
          }
        } else if (res != -ECANCELED && res != -EAGAIN && res != -EINTR) {
          callbacks_->OnAcceptError(-res);
          accept_pause_.Failed(-res, std::chrono::steady_clock::now());
          if (flags & IORING_CQE_F_MORE) {
            // Still armed: cancel it; the pause re-arms it.
            io_uring_prep_cancel64(Sqe(), ud, 0);
            io_uring_sqe_set_data64(last_sqe_, UserData(kCancel, 0, FdOf(ud)));
          }
          paused_ = true;
          pause_ts_ = {0, static_cast<long long>(options_.accept_pause_ms) * 1000000LL};
          io_uring_prep_timeout(Sqe(), &pause_ts_, 0, 0);
          io_uring_sqe_set_data64(last_sqe_, UserData(kAcceptResume, 0, FdOf(ud)));
          return;
        }
        if (!(flags & IORING_CQE_F_MORE) && !paused_ && listen_fd_ >= 0 && listen_fd_ == FdOf(ud)) {
          ArmAccept();
        }
        return;
      case kAcceptResume:
        paused_ = false;
        if (listen_fd_ >= 0) ArmAccept();
        return;
      case kRecv: {
        const int fd = FdOf(ud);
        const bool has_buffer = (flags & IORING_CQE_F_BUFFER) != 0;
        const unsigned bid = flags >> IORING_CQE_BUFFER_SHIFT;
        Conn* c = static_cast<size_t>(fd) < conns_.size() ? &conns_[static_cast<size_t>(fd)] : nullptr;
        const bool current = c != nullptr && c->active && c->gen == GenOf(ud);
        if (res > 0 && has_buffer) {
          if (current && !c->removing) {
            const bool truncated = static_cast<size_t>(res) > options_.packet_bytes_max;
            const size_t len = truncated ? options_.packet_bytes_max : static_cast<size_t>(res);
            callbacks_->OnPacket(fd, std::span<const std::byte>(buffers_ + bid * buffer_bytes_, len),
                                 truncated);
          }
          RecycleBuffer(bid);
        } else if (has_buffer) {
          RecycleBuffer(bid);
        }
        if (flags & IORING_CQE_F_MORE) return;
        if (!current) return;  // stale: that connection was reported closed already
        if (!c->removing && (res > 0 || res == -ENOBUFS)) {
          // Multishot ended (out of buffers, or the kernel chose to): re-arm.
          // The buffers recycled in this round make room again.
          ArmRecv(fd);
          return;
        }
        Closed(fd, (res < 0 && res != -ECANCELED) ? -res : 0);
        return;
      }
      case kPoll:
        if (res > 0) callbacks_->OnReadable(FdOf(ud));
        if (!(flags & IORING_CQE_F_MORE) && res != -ECANCELED) {
          io_uring_prep_poll_multishot(Sqe(), FdOf(ud), POLLIN);
          io_uring_sqe_set_data64(last_sqe_, ud);
        }
        return;
      case kSync:
        callbacks_->OnIoDone(CookieOf(ud), res);
        return;
      case kTasksDone:
        if (res > 0) {
          for (const auto& [cookie, result] : worker_.TakeDone()) {
            --tasks_outstanding_;
            callbacks_->OnIoDone(cookie, result);
          }
        }
        if (!(flags & IORING_CQE_F_MORE) && res != -ECANCELED) ArmTasksDone();
        return;
      case kSend: {
        const uint64_t c = CookieOf(ud);
        const uint32_t slot = static_cast<uint32_t>(c >> 8);
        const uint64_t cookie = send_slots_[slot].cookie;
        free_slots_.push_back(slot);
        callbacks_->OnSent(cookie, res == static_cast<int32_t>(c & 0xff));
        return;
      }
      case kCancel:
        return;  // the cancelled operation reports itself
    }
  }

  IoLoopOptions options_;
  IoCallbacks* callbacks_;
  io_uring ring_{};
  bool ring_ready_ = false;
  io_uring_sqe* last_sqe_ = nullptr;
  io_uring_buf_ring* buf_ring_ = nullptr;
  size_t buf_ring_bytes_ = 0;
  std::byte* buffers_ = nullptr;
  size_t buffer_bytes_ = 0;
  int listen_fd_ = -1;
  AcceptPause accept_pause_;
  bool paused_ = false;              // accepting is paused (kAcceptResume re-arms)
  __kernel_timespec pause_ts_{};     // the pause's timeout; read by the kernel
  std::vector<Conn> conns_;
  uint32_t next_gen_ = 0;
  std::vector<Written> written_;     // inline writes not yet delivered
  std::vector<Written> delivering_;  // being delivered (a callback may write again)
  // Declared last: destroyed first, so that no job runs once the rest is
  // gone.
  BackgroundWorker worker_;
  size_t tasks_outstanding_ = 0;
  // The packets of sends in flight: the kernel reads them when the send is
  // issued, at the next submission. A slot is free again at the completion.
  struct SendSlot {
    uint64_t cookie = 0;
    std::array<std::byte, kSendBytesMax> bytes;
  };
  std::deque<SendSlot> send_slots_;
  std::vector<uint32_t> free_slots_;
  unsigned sends_unsubmitted_ = 0;  // sends in the SQ, not yet submitted
};

}  // namespace

Status NewUringLoop(const IoLoopOptions& options, IoCallbacks* callbacks,
                    std::unique_ptr<IoLoop>* out) {
  auto loop = std::make_unique<UringLoop>(options, callbacks);
  if (Status s = loop->Init(); !s.ok()) return s;
  *out = std::move(loop);
  return Status::Ok();
}

}  // namespace postspool::daemon
