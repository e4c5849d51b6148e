#include "journal.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstdio>

#include "little_endian.h"
#include "post.h"
#include "segment_writer.h"

namespace postspool::daemon {
namespace {

constexpr char kCheckpointName[] = "checkpoint";
constexpr char kCheckpointTmpName[] = "checkpoint.tmp";
constexpr uint32_t kCheckpointMagic = 0x4b435350;  // "PSCK"
constexpr size_t kCheckpointBytes = 32;

bool ParseSegmentName(const char* name, uint64_t* seq) {
  unsigned long long v = 0;
  int n = 0;
  if (std::sscanf(name, "journal-%16llx.seg%n", &v, &n) != 1) return false;
  if (name[n] != '\0' || n != 8 + 16 + 4) return false;
  *seq = v;
  return true;
}

}  // namespace

std::string JournalSegmentName(uint64_t seq) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "journal-%016llx.seg", static_cast<unsigned long long>(seq));
  return buf;
}

Status ListJournalSegments(int dirfd, std::vector<uint64_t>* seqs) {
  seqs->clear();
  const int fd = ::openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open journal directory");
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    ::close(fd);
    return Status::FromErrno(errno, "list journal directory");
  }
  while (dirent* e = ::readdir(d)) {
    uint64_t seq;
    if (ParseSegmentName(e->d_name, &seq)) seqs->push_back(seq);
  }
  ::closedir(d);
  std::sort(seqs->begin(), seqs->end());
  return Status::Ok();
}

CommitChannel::CommitChannel() : event_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

void CommitChannel::Publish(JournalPosition end) {
  {
    std::lock_guard lock(mu_);
    if (end <= end_) return;
    end_ = end;
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(event_fd_.get(), &one, sizeof one);
}

JournalPosition CommitChannel::committed() const {
  std::lock_guard lock(mu_);
  return end_;
}

void CommitChannel::Drain() {
  uint64_t v;
  [[maybe_unused]] ssize_t n = ::read(event_fd_.get(), &v, sizeof v);
}

JournalWriter::JournalWriter(Options options, UniqueFd dirfd, JournalUsage* usage,
                             uint64_t next_seq)
    : options_(std::move(options)), dirfd_(std::move(dirfd)), usage_(usage), next_seq_(next_seq) {}

Status JournalWriter::Open(const Options& options, JournalUsage* usage,
                           std::unique_ptr<JournalWriter>* out) {
  UniqueFd dirfd(::open(options.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dirfd.valid()) return Status::FromErrno(errno, "open journal directory " + options.dir);
  std::vector<uint64_t> seqs;
  if (Status s = ListJournalSegments(dirfd.get(), &seqs); !s.ok()) return s;
  uint64_t bytes = 0;
  for (uint64_t seq : seqs) {
    struct stat st;
    if (::fstatat(dirfd.get(), JournalSegmentName(seq).c_str(), &st, 0) == 0) {
      bytes += static_cast<uint64_t>(st.st_size);
    }
  }
  usage->bytes.store(bytes);
  const uint64_t next = seqs.empty() ? 1 : seqs.back() + 1;
  out->reset(new JournalWriter(options, std::move(dirfd), usage, next));
  return (*out)->StartSegment();
}

Status JournalWriter::StartSegment() {
  const uint64_t seq = next_seq_;
  // A failed attempt may leave its name behind (the link worked, syncing the
  // directory did not): the next attempt takes the next number, or it would
  // fail with kAlreadyExists forever. Readers skip the gap.
  next_seq_ = seq + 1;
  UniqueFd fd;
  // The journal is the daemon's: 0600. The name never shows a partial
  // header; with `sync` the header and the directory entry also survive a
  // power loss.
  if (Status s = segment::CreateSegment(dirfd_.get(), JournalSegmentName(seq),
                                        segment::NewHeader(seq), 0600, options_.sync, &fd);
      !s.ok()) {
    return s;
  }
  // Appends go through pwrite at offsets the writer tracks, so that io_uring
  // can write them; the descriptor must not be O_APPEND.
  if (::fcntl(fd.get(), F_SETFL, 0) != 0) return Status::FromErrno(errno, "fcntl journal");
  fd_ = std::move(fd);
  end_ = JournalPosition{seq, segment::kHeaderBytes};
  usage_->bytes.fetch_add(segment::kHeaderBytes);
  return Status::Ok();
}

Status JournalWriter::Reserve(uint64_t bytes, Slot* slot) {
  assert(!reservation_open_);
  if (!fd_.valid() ||
      (end_.offset > segment::kHeaderBytes && end_.offset + bytes > options_.segment_bytes_max)) {
    if (Status s = StartSegment(); !s.ok()) return s;
  }
  reservation_open_ = true;
  reserved_ = bytes;
  slot->fd = fd_.get();
  slot->position = end_;
  return Status::Ok();
}

JournalPosition JournalWriter::Committed() {
  assert(reservation_open_);
  reservation_open_ = false;
  end_.offset += reserved_;
  usage_->bytes.fetch_add(reserved_);
  return end_;
}

void JournalWriter::Abandon() {
  assert(reservation_open_);
  reservation_open_ = false;
  // Cut what the failed write left past the committed end. After a failed
  // fdatasync those bytes stay readable in the page cache but never reach
  // the disk: a restarted daemon would remember their ids and drop the
  // spooled copies of posts whose journal copy a power loss then takes (and
  // the forwarder would publish posts whose clients were told to spool
  // them). Best effort: the segment is finished either way.
  if (fd_.valid()) (void)::ftruncate(fd_.get(), static_cast<off_t>(end_.offset));
  fd_.reset();
}

Status JournalWriter::Append(std::span<const std::byte> records, bool sync,
                             JournalPosition* first) {
  Slot slot;
  if (Status s = Reserve(records.size(), &slot); !s.ok()) return s;
  size_t done = 0;
  while (done < records.size()) {
    const ssize_t n = ::pwrite(slot.fd, records.data() + done, records.size() - done,
                               static_cast<off_t>(slot.position.offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      Abandon();
      return Status::FromErrno(err, "write journal");
    }
    done += static_cast<size_t>(n);
  }
  if (sync && ::fdatasync(slot.fd) != 0) {
    const int err = errno;
    Abandon();
    return Status::FromErrno(err, "sync journal");
  }
  Committed();
  if (first) *first = slot.position;
  return Status::Ok();
}

JournalReader::JournalReader(int dirfd) : dirfd_(dirfd) {}

void JournalReader::Seek(JournalPosition pos) {
  pos_ = pos;
  reader_.reset();
  source_.reset();
  fd_.reset();
}

Status JournalReader::OpenSegment(uint64_t seq, uint64_t offset, JournalPosition limit) {
  reader_.reset();
  source_.reset();
  if (!fd_.valid() || open_seq_ != seq) {
    fd_.reset(::openat(dirfd_, JournalSegmentName(seq).c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd_.valid()) return Status::FromErrno(errno, "open " + JournalSegmentName(seq));
    open_seq_ = seq;
  }
  const uint64_t size_max = seq == limit.segment_seq ? limit.offset : UINT64_MAX;
  if (Status s = segment::FileSource::Open(fd_.get(), &source_, size_max); !s.ok()) return s;
  segment::ReaderOptions options;
  options.verify_payload = VerifyPostPayload;
  options.start_offset = std::max<uint64_t>(offset, segment::kHeaderBytes);
  options.on_skip = [this](uint64_t, uint64_t bytes, segment::SkipReason) {
    skipped_bytes_ += bytes;
  };
  if (Status s = segment::SegmentReader::Open(source_.get(), options, &reader_); !s.ok()) {
    return s;
  }
  opened_limit_ = size_max;
  return Status::Ok();
}

Status JournalReader::Next(JournalPosition limit, Entry* entry, bool* got) {
  *got = false;
  for (;;) {
    if (pos_ >= limit) return Status::Ok();
    if (pos_.segment_seq == 0) {
      // Before the first segment: start at the oldest one there is.
      std::vector<uint64_t> seqs;
      if (Status s = ListJournalSegments(dirfd_, &seqs); !s.ok()) return s;
      auto it = std::lower_bound(seqs.begin(), seqs.end(), uint64_t{1});
      if (it == seqs.end()) return Status::Ok();
      pos_ = JournalPosition{*it, segment::kHeaderBytes};
      continue;
    }
    const uint64_t want_limit = pos_.segment_seq == limit.segment_seq ? limit.offset : UINT64_MAX;
    if (!reader_ || open_seq_ != pos_.segment_seq || opened_limit_ != want_limit) {
      Status s = OpenSegment(pos_.segment_seq, pos_.offset, limit);
      if (s.code() == StatusCode::kNotFound) {
        // Gone or never there: go on with the next segment that exists.
        std::vector<uint64_t> seqs;
        if (Status ls = ListJournalSegments(dirfd_, &seqs); !ls.ok()) return ls;
        auto it = std::upper_bound(seqs.begin(), seqs.end(), pos_.segment_seq);
        if (it == seqs.end() || *it > limit.segment_seq) return Status::Ok();
        pos_ = JournalPosition{*it, segment::kHeaderBytes};
        continue;
      }
      if (s.code() == StatusCode::kCorruption || s.code() == StatusCode::kUnsupported) {
        // Its header cannot be read (damage, or the zero-length file a power
        // loss leaves of a segment whose header was never synced), so
        // nothing in it can be: skip it as damage and go on with the next
        // segment (or to the limit, inside the limit's segment: a post read
        // again for a retry is then unreadable, not retried forever), or
        // forwarding would stop here for good.
        if (source_) skipped_bytes_ += source_->size();
        pos_ = pos_.segment_seq < limit.segment_seq
                   ? JournalPosition{pos_.segment_seq + 1, segment::kHeaderBytes}
                   : limit;
        reader_.reset();
        continue;
      }
      if (!s.ok()) return s;
    }
    segment::Record rec;
    switch (reader_->Next(&rec)) {
      case segment::SegmentReader::Result::kRecord:
        entry->position = JournalPosition{pos_.segment_seq, rec.position.offset};
        entry->next = JournalPosition{pos_.segment_seq, rec.next_offset};
        entry->payload = rec.payload;
        pos_ = entry->next;
        *got = true;
        return Status::Ok();
      case segment::SegmentReader::Result::kYield:  // no step budget is set
      case segment::SegmentReader::Result::kIoError:
        return reader_->io_status();
      case segment::SegmentReader::Result::kEnd:
        if (pos_.segment_seq == limit.segment_seq) {
          // Everything committed in this segment is read (a torn tail beyond
          // the committed end is not ours to judge).
          pos_.offset = std::max(pos_.offset, reader_->data_end());
          if (reader_->torn_tail_bytes() == 0) pos_.offset = std::max(pos_.offset, limit.offset);
          return Status::Ok();
        }
        skipped_bytes_ += reader_->torn_tail_bytes();
        pos_ = JournalPosition{pos_.segment_seq + 1, segment::kHeaderBytes};
        reader_.reset();
        continue;
    }
  }
}

Status Checkpoint::Load(int dirfd, JournalPosition* pos) {
  *pos = JournalPosition{};
  UniqueFd fd(::openat(dirfd, kCheckpointName, O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return Status::Ok();
    return Status::FromErrno(errno, "open journal checkpoint");
  }
  std::byte raw[kCheckpointBytes];
  const ssize_t n = ::pread(fd.get(), raw, sizeof raw, 0);
  if (n != static_cast<ssize_t>(sizeof raw) || LoadLe32(raw) != kCheckpointMagic ||
      LoadLe32(raw + 4) != 1 ||
      LoadLe64(raw + 24) != segment::MaskChecksum(XXH3_64bits(raw, 24))) {
    return Status(StatusCode::kCorruption, "journal checkpoint is damaged");
  }
  pos->segment_seq = LoadLe64(raw + 8);
  pos->offset = LoadLe64(raw + 16);
  return Status::Ok();
}

Status Checkpoint::Store(int dirfd, JournalPosition pos) {
  std::byte raw[kCheckpointBytes];
  StoreLe32(raw, kCheckpointMagic);
  StoreLe32(raw + 4, 1);
  StoreLe64(raw + 8, pos.segment_seq);
  StoreLe64(raw + 16, pos.offset);
  StoreLe64(raw + 24, segment::MaskChecksum(XXH3_64bits(raw, 24)));
  UniqueFd fd(::openat(dirfd, kCheckpointTmpName, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd.valid()) return Status::FromErrno(errno, "create journal checkpoint");
  if (::pwrite(fd.get(), raw, sizeof raw, 0) != static_cast<ssize_t>(sizeof raw)) {
    return Status::FromErrno(errno, "write journal checkpoint");
  }
  if (::fsync(fd.get()) != 0) return Status::FromErrno(errno, "sync journal checkpoint");
  if (::renameat(dirfd, kCheckpointTmpName, dirfd, kCheckpointName) != 0) {
    return Status::FromErrno(errno, "rename journal checkpoint");
  }
  if (::fsync(dirfd) != 0) return Status::FromErrno(errno, "sync journal directory");
  return Status::Ok();
}

Status DeleteConfirmedSegments(int dirfd, JournalPosition watermark, JournalUsage* usage,
                               int* deleted) {
  *deleted = 0;
  std::vector<uint64_t> seqs;
  if (Status s = ListJournalSegments(dirfd, &seqs); !s.ok()) return s;
  for (uint64_t seq : seqs) {
    if (seq >= watermark.segment_seq) break;
    const std::string name = JournalSegmentName(seq);
    struct stat st;
    const uint64_t size = ::fstatat(dirfd, name.c_str(), &st, 0) == 0
                              ? static_cast<uint64_t>(st.st_size) : 0;
    if (::unlinkat(dirfd, name.c_str(), 0) != 0) {
      if (errno == ENOENT) continue;
      return Status::FromErrno(errno, "delete " + name);
    }
    usage->bytes.fetch_sub(std::min(size, usage->bytes.load()));
    ++*deleted;
  }
  return Status::Ok();
}

}  // namespace postspool::daemon
