#include "spool_adopter.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "log.h"
#include "segment_writer.h"

namespace postspool::daemon {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// A burst of spool writes makes one scan, not one per write.
constexpr auto kScanDebounce = 50ms;
// Sealing waits for appends in progress; the ingest loop must not stall on
// a busy segment: it tries again at the next scan.
constexpr auto kSealWait = 5ms;
// A segment taken from the writers is read only after this delay: a client
// whose acknowledgement came late spooled its post just now, and the socket
// copy of it, still in the daemon's queue, is then journaled first, so that
// adoption recognises the spooled copy (RecentIds) instead of journaling it
// twice.
constexpr auto kSettle = 50ms;
// A temporary left by a writer that died while creating a segment.
constexpr auto kStaleTemporary = std::chrono::hours(1);

}  // namespace

SpoolAdopter::SpoolAdopter(const Config& config, Metrics* metrics)
    : config_(config), metrics_(metrics) {}

Status SpoolAdopter::Open() {
  dirfd_.reset(::open(config_.spool_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dirfd_.valid()) return Status::FromErrno(errno, "open spool directory " + config_.spool_dir);
  quarantine_fd_.reset(::open(config_.quarantine_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!quarantine_fd_.valid()) {
    return Status::FromErrno(errno, "open quarantine directory " + config_.quarantine_dir);
  }
  inotify_fd_.reset(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (!inotify_fd_.valid()) return Status::FromErrno(errno, "inotify_init1");
  if (::inotify_add_watch(inotify_fd_.get(), config_.spool_dir.c_str(),
                          IN_CREATE | IN_MOVED_TO | IN_MODIFY | IN_CLOSE_WRITE) < 0) {
    return Status::FromErrno(errno, "inotify_add_watch " + config_.spool_dir);
  }
  return Status::Ok();
}

void SpoolAdopter::OnInotify() {
  alignas(inotify_event) char buf[4096];
  while (::read(inotify_fd_.get(), buf, sizeof buf) > 0) {
  }
  // Also IN_Q_OVERFLOW lands here: the scan finds everything anyway.
  changed_ = true;
}

void SpoolAdopter::MaybeScan(Clock::time_point now) {
  const auto since = now - last_scan_;
  if ((changed_ && since >= kScanDebounce) ||
      since >= std::chrono::milliseconds(config_.spool_rescan_interval_ms)) {
    changed_ = false;
    last_scan_ = now;
    Scan();
  }
}

void SpoolAdopter::Quarantine(const std::string& name, const std::string& why) {
  const auto stamp = std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string target = name + "." + std::to_string(stamp);
  if (::renameat(dirfd_.get(), name.c_str(), quarantine_fd_.get(), target.c_str()) != 0) {
    PS_LOG_ERROR("spool: cannot move %s/%s to the quarantine directory %s: %s; leaving it",
                 config_.spool_dir.c_str(), name.c_str(), config_.quarantine_dir.c_str(),
                 std::strerror(errno));
    return;
  }
  metrics_->spool_files_quarantined_total.fetch_add(1, std::memory_order_relaxed);
  PS_LOG_WARNING("spool: moved %s to %s/%s: %s", name.c_str(), config_.quarantine_dir.c_str(),
                 target.c_str(), why.c_str());
}

void SpoolAdopter::Scan() {
  const int fd = ::openat(dirfd_.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    ::close(fd);
    return;
  }
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());

  const std::set<std::string> queued(queue_.begin(), queue_.end());
  uint64_t bytes = 0;
  for (const std::string& name : names) {
    if (current_ && current_->name == name) {
      struct stat st;
      if (::fstat(current_->fd.get(), &st) == 0) bytes += static_cast<uint64_t>(st.st_size);
      continue;
    }
    struct stat st;
    if (::fstatat(dirfd_.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    const auto parsed = segment::ParseSpoolName(name);
    if (!parsed) {
      if (name.rfind(".tmp.", 0) == 0 && S_ISREG(st.st_mode)) {
        const auto age = std::chrono::system_clock::now() -
                         std::chrono::system_clock::from_time_t(st.st_mtime);
        if (age > kStaleTemporary) Quarantine(name, "stale temporary of a writer that died");
        continue;
      }
      Quarantine(name, "not a spool segment name");
      continue;
    }
    if (!S_ISREG(st.st_mode)) {
      Quarantine(name, "not a regular file");
      continue;
    }
    if (st.st_uid != parsed->uid) {
      Quarantine(name, "owned by uid " + std::to_string(st.st_uid) + ", not the uid in its name");
      continue;
    }
    bytes += static_cast<uint64_t>(st.st_size);
    if (parsed->current) {
      if (static_cast<uint64_t>(st.st_size) <= segment::kHeaderBytes) continue;  // nothing yet
      // Take it out of the writers' way; they create a new current segment.
      const std::string sealed = segment::SpoolSealedName(parsed->uid, segment::NewSegmentId());
      if (::renameat(dirfd_.get(), name.c_str(), dirfd_.get(), sealed.c_str()) != 0) continue;
      queue_.push_back(sealed);
      settle_until_ = Clock::now() + kSettle;
    } else if (queued.count(name) == 0) {
      queue_.push_back(name);
    }
  }
  spool_bytes_ = bytes;
}

Status SpoolAdopter::OpenCurrent(const std::string& name, uid_t uid) {
  auto c = std::make_unique<Current>();
  c->name = name;
  c->fd.reset(::openat(dirfd_.get(), name.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!c->fd.valid()) return Status::FromErrno(errno, "open");
  struct stat st;
  if (::fstat(c->fd.get(), &st) != 0) return Status::FromErrno(errno, "stat");
  if (!S_ISREG(st.st_mode) || st.st_uid != uid) {
    return Status(StatusCode::kPermissionDenied, "not a regular file owned by uid " + std::to_string(uid));
  }
  c->uid = st.st_uid;
  c->gid = st.st_gid;
  // Wait for appends in progress, and make sure none follows.
  // No fdatasync of the flag at durability `accepted`: it is for writers,
  // and after a power loss there are none; the ingest loop must not stall.
  if (Status s = segment::SealSegment(c->fd.get(), Clock::now() + kSealWait,
                                      config_.durability == Durability::kSynced);
      !s.ok()) {
    return s;
  }
  if (Status s = segment::FileSource::Open(c->fd.get(), &c->source); !s.ok()) return s;
  segment::ReaderOptions options;
  options.verify_payload = VerifyPostPayload;
  Current* raw = c.get();
  options.on_skip = [this, raw](uint64_t offset, uint64_t bytes, segment::SkipReason reason) {
    raw->skipped_bytes += bytes;
    metrics_->spool_bytes_skipped_total.fetch_add(bytes, std::memory_order_relaxed);
    PS_LOG_WARNING("spool: %s: skipped %llu damaged bytes at offset %llu (%s); the other posts "
                   "in it are kept", raw->name.c_str(), static_cast<unsigned long long>(bytes),
                   static_cast<unsigned long long>(offset), segment::SkipReasonName(reason));
  };
  if (Status s = segment::SegmentReader::Open(c->source.get(), options, &c->reader); !s.ok()) {
    return s;
  }
  current_ = std::move(c);
  return Status::Ok();
}

bool SpoolAdopter::OpenNext() {
  if (Clock::now() < settle_until_) return false;
  while (!queue_.empty()) {
    const std::string name = queue_.front();
    queue_.pop_front();
    const auto parsed = segment::ParseSpoolName(name);
    if (!parsed) continue;
    const Status s = OpenCurrent(name, parsed->uid);
    if (s.ok()) return true;
    if (s.code() == StatusCode::kNotFound) continue;
    if (s.code() == StatusCode::kTimedOut) {
      queue_.push_back(name);  // a writer is mid-append: later
      return false;
    }
    Quarantine(name, "unreadable: " + s.ToString());
  }
  return false;
}

bool SpoolAdopter::Next(Adopted* out) {
  if (!current_ && !OpenNext()) return false;
  if (current_->at_end) return false;
  segment::Record rec;
  switch (current_->reader->Next(&rec)) {
    case segment::SegmentReader::Result::kRecord:
      out->payload = rec.payload;
      out->uid = current_->uid;
      out->gid = current_->gid;
      return true;
    case segment::SegmentReader::Result::kEnd:
      current_->at_end = true;
      if (current_->reader->torn_tail_bytes() > 0) {
        PS_LOG_WARNING("spool: %s ends with %llu bytes of an unfinished record (a writer died "
                       "mid-write)", current_->name.c_str(),
                       static_cast<unsigned long long>(current_->reader->torn_tail_bytes()));
        current_->skipped_bytes += current_->reader->torn_tail_bytes();
        metrics_->spool_bytes_skipped_total.fetch_add(current_->reader->torn_tail_bytes(),
                                                      std::memory_order_relaxed);
      }
      return false;
    case segment::SegmentReader::Result::kIoError:
      PS_LOG_ERROR("spool: reading %s failed: %s; will read it again",
                   current_->name.c_str(), current_->reader->io_status().ToString().c_str());
      current_->at_end = false;
      queue_.push_back(current_->name);
      current_.reset();
      return false;
  }
  return false;
}

void SpoolAdopter::Finish() {
  if (!current_) return;
  metrics_->spool_segments_adopted_total.fetch_add(1, std::memory_order_relaxed);
  if (current_->skipped_bytes > 0) {
    // Keep the damaged bytes for an operator to look at; the good records
    // are journaled, and the quarantine is never read again.
    Quarantine(current_->name, "adopted, but " + std::to_string(current_->skipped_bytes) +
                                   " bytes of it were damaged");
  } else if (::unlinkat(dirfd_.get(), current_->name.c_str(), 0) != 0 && errno != ENOENT) {
    PS_LOG_ERROR("spool: cannot delete adopted segment %s: %s; its posts are journaled and "
                 "would be adopted again", current_->name.c_str(), std::strerror(errno));
  }
  current_.reset();
}

void SpoolAdopter::Restart() {
  if (!current_) return;
  queue_.push_front(current_->name);
  current_.reset();
}

}  // namespace postspool::daemon
