#include "client.h"

#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "last_error.h"
#include "post.h"
#include "post_conversion.h"
#include "segment_format.h"

namespace postspool::client {
namespace {

int64_t RealtimeNs() {
  timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// The id as 16 bytes, most significant first: the byte order of its UUID
// text (the AMQP message_id).
void PutId(const PostId& id, uint8_t out[16]) {
  for (int i = 0; i < 8; ++i) {
    out[i] = static_cast<uint8_t>(id.hi >> (56 - 8 * i));
    out[8 + i] = static_cast<uint8_t>(id.lo >> (56 - 8 * i));
  }
}

// Locks `mutex` unless `deadline` passes first (a deadline already passed
// still takes a free mutex).
bool LockUntil(pthread_mutex_t* mutex, Deadline deadline) {
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch()).count();
  const timespec abs{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  // steady_clock is CLOCK_MONOTONIC.
  return ::pthread_mutex_clocklock(mutex, CLOCK_MONOTONIC, &abs) == 0;
}

class Unlocker {
 public:
  explicit Unlocker(pthread_mutex_t* mutex) : mutex_(mutex) {}
  ~Unlocker() { ::pthread_mutex_unlock(mutex_); }
  Unlocker(const Unlocker&) = delete;
  Unlocker& operator=(const Unlocker&) = delete;

 private:
  pthread_mutex_t* mutex_;
};

// Forks this process is a child of (counted in the child by an atfork
// handler): a post compares it with the client's own count instead of
// calling getpid(), which is a system call.
std::atomic<uint32_t> g_forks{0};

void CountFork() { g_forks.fetch_add(1, std::memory_order_relaxed); }

uint32_t Forks() {
  static const bool registered = ::pthread_atfork(nullptr, nullptr, CountFork) == 0;
  (void)registered;
  return g_forks.load(std::memory_order_acquire);
}

}  // namespace

int SpoolErrorCode(const Status& status) {
  switch (status.code()) {
    case StatusCode::kNoSpace: return POSTSPOOL_ENOSPACE;
    case StatusCode::kPermissionDenied: return POSTSPOOL_EPERM;
    case StatusCode::kTimedOut: return POSTSPOOL_ETIMEDOUT;
    case StatusCode::kNotFound: return POSTSPOOL_ENODAEMON;  // no spool directory
    default: return POSTSPOOL_EIO;
  }
}

Client::Client(ClientOptions options)
    : options_(std::move(options)),
      owner_pid_(::getpid()),
      forks_seen_(Forks()),
      state_(new ProcessState(options_)) {
  ::pthread_mutex_init(&mutex_, nullptr);
}

Client::~Client() {
  if (owner_pid_.load(std::memory_order_acquire) == ::getpid()) {
    delete state_;
  } else if (::pthread_mutex_trylock(&mutex_) == 0) {
    // A child that never posted: the inherited state is consistent; this
    // closes the child's copies of the descriptors only.
    ::pthread_mutex_unlock(&mutex_);
    delete state_;
  }
  // Else a child whose parent was mid-post at the fork: abandon the state.
  ::pthread_mutex_destroy(&mutex_);
}

void Client::AdoptIfForked() {
  const uint32_t forks = Forks();
  if (forks_seen_.load(std::memory_order_acquire) == forks) return;
  const pid_t me = ::getpid();
  if (owner_pid_.load(std::memory_order_acquire) == me) {
    forks_seen_.store(forks, std::memory_order_release);
    return;
  }

  // Allocated before claiming the adoption, so that nothing can throw while
  // other threads wait for it.
  auto fresh = std::make_unique<ProcessState>(options_);
  for (;;) {
    pid_t owner = owner_pid_.load(std::memory_order_acquire);
    if (owner == me) return;  // another thread of this process adopted it
    if (owner == -me) {
      ::sched_yield();
      continue;
    }
    if (owner_pid_.compare_exchange_weak(owner, -me, std::memory_order_acq_rel)) break;
  }
  // Only the thread that called fork() exists in a new child; threads it
  // started since wait above until this is done.
  if (::pthread_mutex_trylock(&mutex_) == 0) {
    // Nobody held the mutex at the fork: the state is consistent.
    delete state_;
    state_ = fresh.release();
    ::pthread_mutex_unlock(&mutex_);
  } else {
    // A thread of the parent held it, mid-post; it does not exist here.
    ::pthread_mutex_init(&mutex_, nullptr);
    state_ = fresh.release();  // the old state is abandoned, not freed
  }
  owner_pid_.store(me, std::memory_order_release);
  forks_seen_.store(forks, std::memory_order_release);
}

int Client::Fail(int error, const std::string& detail, const char* rel_path) const {
  SetLastError(detail);
  if (options_.log_stderr) {
    std::string line = "postspool: post";
    if (rel_path != nullptr) {
      line += ' ';
      line.append(rel_path, ::strnlen(rel_path, kPathBytesMax));
    }
    line += " failed: ";
    line += postspool_strerror(error);
    line += ": ";
    line += detail;
    LogToStderr(line);
  }
  return error;
}

int Client::Post(const struct postspool_post* post, postspool_post_result* result) {
  const auto start = Clock::now();
  const uint64_t budget_us = uint64_t{options_.budget_ms} * 1000;
  const Deadline deadline = start + std::chrono::microseconds(budget_us);
  const Deadline socket_deadline =
      start + std::chrono::microseconds(budget_us * options_.socket_share_pct / 100);
  if (result != nullptr) std::memset(result, 0, sizeof *result);
  const char* rel_path = post != nullptr && post->struct_size >= sizeof *post ? post->rel_path
                                                                               : nullptr;

  // The record, built before any lock is taken.
  PostData data;
  std::string detail;
  if (const int rc = ConvertPost(post, &data, &detail); rc != POSTSPOOL_OK) {
    return Fail(rc, detail, rel_path);
  }
  data.id = NewPostId();
  data.pub_time_ns = RealtimeNs();
  // The daemon applies the same check to every post it takes (and the v03
  // encoder refuses no less), so a post refused here would be refused there.
  if (const Status s = ValidatePost(data); !s.ok()) {
    return Fail(ValidationErrorCode(s), s.message(), rel_path);
  }
  flatbuffers::FlatBufferBuilder builder(1024);
  BuildPost(data, &builder);
  const std::span<const std::byte> payload(
      reinterpret_cast<const std::byte*>(builder.GetBufferPointer()), builder.GetSize());
  std::vector<std::byte> record;
  if (const Status s = segment::AppendRecord(payload, &record); !s.ok()) {
    return Fail(POSTSPOOL_ETOOBIG, s.message(), rel_path);
  }
  if (result != nullptr) PutId(data.id, result->id);

  AdoptIfForked();
  std::string daemon_reason;
  bool malformed = false;
  Status spooled;
  if (LockUntil(&mutex_, socket_deadline)) {
    Unlocker unlock(&mutex_);
    // A post that spent most of the socket's share waiting for the mutex
    // does not try the socket: an ack could hardly arrive in what is left,
    // and the timeout would drop a healthy connection and back off.
    const auto socket_share = socket_deadline - start;
    if (options_.socket_share_pct > 0 && socket_deadline - Clock::now() < socket_share / 2) {
      daemon_reason = "not tried: less than half of the socket's share of the budget was "
                      "left (another thread's post held the client, or this one was "
                      "descheduled)";
    } else if (options_.socket_share_pct > 0) {
      bool quota_full = false;
      if (options_.use_ring) {
        RingClient::Result rr = state_->ring.Post(record, &state_->socket, socket_deadline, deadline);
        if (rr.outcome == RingClient::Outcome::kAppended) {
          if (result != nullptr) result->transport = POSTSPOOL_TRANSPORT_RING;
          return POSTSPOOL_OK;
        }
        quota_full = rr.outcome == RingClient::Outcome::kQuotaFull;
        if (rr.outcome == RingClient::Outcome::kNotSynced) {
          // In the ring, but the daemon (at `synced`) did not journal it in
          // time: the spool gets a copy, which the daemon drops as a
          // duplicate if the ring's comes first.
          spooled = state_->spool.Append(record, deadline);
          if (spooled.ok()) {
            if (result != nullptr) result->transport = POSTSPOOL_TRANSPORT_SPOOL;
            return POSTSPOOL_OK;
          }
          return Fail(SpoolErrorCode(spooled), rr.reason + "; spool: " + spooled.message(), rel_path);
        }
      }
      // A socket post is journaled at once: it must not overtake this
      // process's posts still waiting in its lane. (At the disk share the
      // socket refuses it anyway, and the lane waits for the share.)
      const bool drained = !options_.use_ring || quota_full || state_->ring.WaitDrained(socket_deadline);
      DaemonSocket::Result r = drained ? state_->socket.Post(record, 1, socket_deadline)
                                       : DaemonSocket::Result{false,
                                                              "not tried: the daemon did not read "
                                                              "this process's ring posts within the "
                                                              "budget (the socket would overtake them)",
                                                              false};
      if (r.accepted) {
        if (result != nullptr) result->transport = POSTSPOOL_TRANSPORT_SOCKET;
        return POSTSPOOL_OK;
      }
      if (r.full) {
        return Fail(POSTSPOOL_ENOSPACE,
                    "daemon: " + r.reason + "; not spooled: the spool counts against the same "
                    "limit", rel_path);
      }
      daemon_reason = std::move(r.reason);
      malformed = r.malformed;
    } else {
      daemon_reason = "not tried (socket_share_pct is 0)";
    }
    spooled = state_->spool.Append(record, deadline);
  } else {
    daemon_reason = "not tried: another thread's post held the client for the socket's share "
                    "of the budget";
    Spool own(options_.spool_dir, options_.sync_spool);
    spooled = own.Append(record, deadline);
  }

  if (spooled.ok()) {
    if (result != nullptr) result->transport = POSTSPOOL_TRANSPORT_SPOOL;
    if (malformed) {
      // The post is safe in the spool, but one side has a bug: say so.
      const std::string note = "daemon: " + daemon_reason + " (the post went to the spool)";
      SetLastError(note);
      if (options_.log_stderr) LogToStderr("postspool: " + note);
    }
    return POSTSPOOL_OK;
  }
  return Fail(SpoolErrorCode(spooled), "daemon: " + daemon_reason + "; spool: " + spooled.message(),
              rel_path);
}

int Client::ReportDropped(uint32_t count) {
  if (count == 0) return POSTSPOOL_OK;
  const Deadline deadline =
      Clock::now() + std::chrono::microseconds(uint64_t{options_.budget_ms} * 1000);
  AdoptIfForked();
  if (!LockUntil(&mutex_, deadline)) {
    SetLastError("another thread's post held the client for the budget");
    return POSTSPOOL_ETIMEDOUT;
  }
  Unlocker unlock(&mutex_);
  if (!options_.use_ring) {
    SetLastError("use_ring is off: the count has no ring to go to");
    return POSTSPOOL_ENODAEMON;
  }
  std::string reason;
  if (!state_->ring.AddDropped(count, &state_->socket, deadline, &reason)) {
    SetLastError(reason);
    return POSTSPOOL_ENODAEMON;
  }
  return POSTSPOOL_OK;
}

}  // namespace postspool::client
