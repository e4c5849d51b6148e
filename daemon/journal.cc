#include "journal.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "little_endian.h"
#include "lost_records.h"
#include "post.h"
#include "segment_writer.h"

namespace postspool::daemon {
namespace {

constexpr char kCheckpointName[] = "checkpoint";
// Only while the version 2 file is first made (Checkpoint::Open).
constexpr char kCheckpointNewName[] = "checkpoint.new";
constexpr char kLockName[] = "lock";
constexpr char kDamagedDirName[] = "damaged";
constexpr uint32_t kCheckpointMagic = 0x4b435350;  // "PSCK"
// Version 1 (earlier releases): one 32-byte record, replaced by rename.
constexpr size_t kCheckpointV1Bytes = 32;
// Version 2: two slots, each at the start of its own 4 KiB block, so that a
// torn write of one (a sector or a page) cannot touch the other.
constexpr size_t kCheckpointSlotStride = 4096;
constexpr size_t kCheckpointSlotBytes = 64;  // 40 used, the rest zero
constexpr size_t kCheckpointFileBytes = 2 * kCheckpointSlotStride;

struct CheckpointSlot {
  bool valid = false;
  uint64_t generation = 0;
  JournalPosition pos;
};

void EncodeCheckpointSlot(uint64_t generation, JournalPosition pos,
                          std::byte (&raw)[kCheckpointSlotBytes]) {
  std::memset(raw, 0, sizeof raw);
  StoreLe32(raw, kCheckpointMagic);
  StoreLe32(raw + 4, 2);
  StoreLe64(raw + 8, generation);
  StoreLe64(raw + 16, pos.segment_seq);
  StoreLe64(raw + 24, pos.offset);
  StoreLe64(raw + 32, segment::MaskChecksum(XXH3_64bits(raw, 32)));
}

CheckpointSlot DecodeCheckpointSlot(const std::byte* raw) {
  CheckpointSlot slot;
  if (LoadLe32(raw) != kCheckpointMagic || LoadLe32(raw + 4) != 2 ||
      LoadLe64(raw + 32) != segment::MaskChecksum(XXH3_64bits(raw, 32))) {
    return slot;
  }
  slot.valid = true;
  slot.generation = LoadLe64(raw + 8);
  slot.pos = JournalPosition{LoadLe64(raw + 16), LoadLe64(raw + 24)};
  return slot;
}

// The newest valid slot of a version 2 file's bytes.
CheckpointSlot NewestCheckpointSlot(const std::byte* file) {
  CheckpointSlot best;
  for (size_t i = 0; i < 2; ++i) {
    const CheckpointSlot slot = DecodeCheckpointSlot(file + i * kCheckpointSlotStride);
    if (slot.valid && (!best.valid || slot.generation > best.generation)) best = slot;
  }
  return best;
}

Status ReadWhole(int fd, std::byte* buf, size_t size, size_t* got) {
  *got = 0;
  while (*got < size) {
    const ssize_t n = ::pread(fd, buf + *got, size - *got, static_cast<off_t>(*got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, "read journal checkpoint");
    if (n == 0) break;
    *got += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status SegmentBytesOnDisk(int dirfd, const std::string& name, uint64_t* bytes) {
  struct stat st;
  if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return Status::FromErrno(errno, "stat " + name);
  }
  *bytes = static_cast<uint64_t>(st.st_size);
  return Status::Ok();
}

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
    : options_(std::move(options)),
      dirfd_(std::move(dirfd)),
      usage_(usage),
      next_seq_(next_seq),
      end_{next_seq, segment::kHeaderBytes} {}

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
  // The first segment of this writer goes after every existing one, and
  // after the checkpoint's: when every segment was confirmed and deleted,
  // the stored watermark may point at the start of a segment that was never
  // created (the previous writer's end()); a reader starting there must not
  // find older records under that name. A damaged checkpoint only costs
  // this guard (the forwarder then starts from the oldest segment anyway).
  uint64_t next = seqs.empty() ? 1 : seqs.back() + 1;
  JournalPosition checkpoint;
  if (Checkpoint::Load(dirfd.get(), &checkpoint).ok()) {
    next = std::max(next, checkpoint.segment_seq + 1);
  }
  out->reset(new JournalWriter(options, std::move(dirfd), usage, next));
  return Status::Ok();
}

NewJournalSegment CreateJournalSegment(int dirfd, uint64_t seq, bool sync) {
  NewJournalSegment out;
  out.seq = seq;
  const std::string name = JournalSegmentName(seq);
  // The journal is the daemon's: 0600. The name never shows a partial
  // header; with `sync` the header and the directory entry also survive a
  // power loss.
  out.status = segment::CreateSegment(dirfd, name, segment::NewHeader(seq), 0600, sync, &out.fd);
  // Appends go through pwrite at offsets the writer tracks, so that io_uring
  // can write them; the descriptor must not be O_APPEND.
  if (out.status.ok() && ::fcntl(out.fd.get(), F_SETFL, 0) != 0) {
    out.status = Status::FromErrno(errno, "fcntl journal");
  }
  if (!out.status.ok()) {
    out.fd.reset();
    // A failure after the name was linked (syncing the directory) leaves a
    // segment holding only its header: it counts, and its seq is used up,
    // or every later attempt would fail with EEXIST.
    out.name_used = SegmentBytesOnDisk(dirfd, name, &out.bytes_on_disk).ok();
  } else {
    out.name_used = true;
    out.bytes_on_disk = segment::kHeaderBytes;
  }
  return out;
}

Status JournalWriter::Install(NewJournalSegment segment) {
  assert(segment.seq == next_seq_);
  if (segment.name_used) {
    usage_->bytes.fetch_add(segment.bytes_on_disk);
    next_seq_ = segment.seq + 1;
  }
  if (!segment.status.ok()) return segment.status;
  fd_ = std::move(segment.fd);
  end_ = JournalPosition{segment.seq, segment::kHeaderBytes};
  return Status::Ok();
}

bool JournalWriter::NeedsSegment(uint64_t bytes) const {
  return !fd_.valid() ||
         (end_.offset > segment::kHeaderBytes && end_.offset + bytes > options_.segment_bytes_max);
}

Status JournalWriter::Reserve(uint64_t bytes, Slot* slot) {
  assert(!reservation_open_);
  if (NeedsSegment(bytes)) {
    if (Status s = Install(CreateJournalSegment(dirfd_.get(), next_seq_, options_.sync)); !s.ok()) {
      return s;
    }
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
  const std::string name = JournalSegmentName(seq);
  if (!fd_.valid() || open_seq_ != seq) {
    fd_.reset(::openat(dirfd_, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd_.valid()) return Status::FromErrno(errno, "open " + name);
    open_seq_ = seq;
  }
  const uint64_t size_max = seq == limit.segment_seq ? limit.offset : UINT64_MAX;
  // Errors name the file: the caller may have to report it as damaged.
  const auto named = [&name](const Status& s) {
    return Status(s.code(), name + ": " + s.message(), s.sys_errno());
  };
  Status s;
  if (source_factory_) {
    s = source_factory_(fd_.get(), seq, size_max, &source_);
  } else {
    std::unique_ptr<segment::FileSource> file;
    s = segment::FileSource::Open(fd_.get(), &file, size_max);
    source_ = std::move(file);
  }
  if (!s.ok()) return named(s);
  segment::ReaderOptions options;
  options.verify_payload = VerifyPostPayload;
  options.start_offset = std::max<uint64_t>(offset, segment::kHeaderBytes);
  options.on_skip = [this](uint64_t at, uint64_t bytes, segment::SkipReason) {
    skipped_bytes_ += bytes;
    lost_records_ += segment::CountLostRecords(source_.get(), at, bytes);
  };
  if (s = segment::SegmentReader::Open(source_.get(), options, &reader_); !s.ok()) {
    reader_.reset();
    return named(s);
  }
  opened_limit_ = size_max;
  return Status::Ok();
}

void JournalReader::SkipSegment() {
  Seek(JournalPosition{pos_.segment_seq + 1, segment::kHeaderBytes});
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
      case segment::SegmentReader::Result::kIoError: {
        // Open the file afresh for a retry, at the last record boundary.
        Status s(reader_->io_status().code(),
                 JournalSegmentName(pos_.segment_seq) + ": " + reader_->io_status().message(),
                 reader_->io_status().sys_errno());
        reader_.reset();
        source_.reset();
        fd_.reset();
        return s;
      }
      case segment::SegmentReader::Result::kEnd:
        if (pos_.segment_seq == limit.segment_seq) {
          // Everything committed in this segment is read (a torn tail beyond
          // the committed end is not ours to judge).
          pos_.offset = std::max(pos_.offset, reader_->data_end());
          if (reader_->torn_tail_bytes() == 0) pos_.offset = std::max(pos_.offset, limit.offset);
          return Status::Ok();
        }
        if (const uint64_t torn = reader_->torn_tail_bytes(); torn != 0) {
          // A finished segment was complete: its torn tail is lost records,
          // at least the one it starts with.
          skipped_bytes_ += torn;
          lost_records_ += std::max<uint64_t>(
              1, segment::CountLostRecords(source_.get(), reader_->data_end(), torn));
        }
        pos_ = JournalPosition{pos_.segment_seq + 1, segment::kHeaderBytes};
        reader_.reset();
        continue;
    }
  }
}

Status Checkpoint::Load(int dirfd, JournalPosition* pos) {
  *pos = JournalPosition{};
  UniqueFd fd(::openat(dirfd, kCheckpointName, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return Status::Ok();
    return Status::FromErrno(errno, "open journal checkpoint");
  }
  // One byte more than a version 2 file: a longer file is not one.
  static_assert(kCheckpointFileBytes > kCheckpointV1Bytes);
  auto raw = std::make_unique<std::byte[]>(kCheckpointFileBytes + 1);
  size_t n = 0;
  if (Status s = ReadWhole(fd.get(), raw.get(), kCheckpointFileBytes + 1, &n); !s.ok()) return s;
  if (n == kCheckpointFileBytes) {
    const CheckpointSlot slot = NewestCheckpointSlot(raw.get());
    if (!slot.valid) {
      return Status(StatusCode::kCorruption, "journal checkpoint is damaged (no valid slot)");
    }
    *pos = slot.pos;
    return Status::Ok();
  }
  if (n != kCheckpointV1Bytes || LoadLe32(raw.get()) != kCheckpointMagic ||
      LoadLe32(raw.get() + 4) != 1 ||
      LoadLe64(raw.get() + 24) != segment::MaskChecksum(XXH3_64bits(raw.get(), 24))) {
    return Status(StatusCode::kCorruption, "journal checkpoint is damaged");
  }
  pos->segment_seq = LoadLe64(raw.get() + 8);
  pos->offset = LoadLe64(raw.get() + 16);
  return Status::Ok();
}

Status Checkpoint::Open(int dirfd, JournalPosition pos, std::unique_ptr<Checkpoint>* out) {
  {
    UniqueFd fd(::openat(dirfd, kCheckpointName, O_RDWR | O_NOFOLLOW | O_CLOEXEC));
    if (!fd.valid() && errno != ENOENT) return Status::FromErrno(errno, "open journal checkpoint");
    struct stat st;
    if (fd.valid() && ::fstat(fd.get(), &st) != 0) {
      return Status::FromErrno(errno, "stat journal checkpoint");
    }
    if (fd.valid() && S_ISREG(st.st_mode) &&
        static_cast<uint64_t>(st.st_size) == kCheckpointFileBytes) {
      // Ours already: go on from its newest slot (a damaged file is reused
      // as it is; its slots are rewritten by the next stores).
      auto raw = std::make_unique<std::byte[]>(kCheckpointFileBytes);
      size_t n = 0;
      if (Status s = ReadWhole(fd.get(), raw.get(), kCheckpointFileBytes, &n); !s.ok()) return s;
      const CheckpointSlot slot = n == kCheckpointFileBytes ? NewestCheckpointSlot(raw.get())
                                                            : CheckpointSlot{};
      out->reset(new Checkpoint(std::move(fd), slot.valid ? slot.generation : 0));
      return Status::Ok();
    }
  }
  // Missing, or version 1: write the whole file under another name and
  // rename it into place, so that the name never shows a partial file. A
  // leftover of a crash here is ours to replace.
  auto raw = std::make_unique<std::byte[]>(kCheckpointFileBytes);
  std::memset(raw.get(), 0, kCheckpointFileBytes);
  std::byte slot[kCheckpointSlotBytes];
  EncodeCheckpointSlot(1, pos, slot);
  std::memcpy(raw.get() + kCheckpointSlotStride, slot, sizeof slot);  // generation 1: slot 1
  UniqueFd fd(::openat(dirfd, kCheckpointNewName,
                       O_RDWR | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) return Status::FromErrno(errno, "create journal checkpoint");
  const auto fail = [dirfd](Status s) {
    ::unlinkat(dirfd, kCheckpointNewName, 0);
    return s;
  };
  size_t done = 0;
  while (done < kCheckpointFileBytes) {
    const ssize_t n = ::pwrite(fd.get(), raw.get() + done, kCheckpointFileBytes - done,
                               static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail(Status::FromErrno(n < 0 ? errno : ENOSPC, "write journal checkpoint"));
    done += static_cast<size_t>(n);
  }
  // Both blocks are allocated now: later stores allocate nothing.
  if (::fdatasync(fd.get()) != 0) {
    return fail(Status::FromErrno(errno, "sync journal checkpoint"));
  }
  if (::renameat(dirfd, kCheckpointNewName, dirfd, kCheckpointName) != 0) {
    return fail(Status::FromErrno(errno, "rename journal checkpoint"));
  }
  if (::fsync(dirfd) != 0) return Status::FromErrno(errno, "sync journal directory");
  out->reset(new Checkpoint(std::move(fd), 1));
  return Status::Ok();
}

Status Checkpoint::Store(JournalPosition pos) {
  const uint64_t generation = generation_ + 1;
  std::byte raw[kCheckpointSlotBytes];
  EncodeCheckpointSlot(generation, pos, raw);
  const off_t at = static_cast<off_t>((generation & 1) * kCheckpointSlotStride);
  const ssize_t n = ::pwrite(fd_.get(), raw, sizeof raw, at);
  if (n != static_cast<ssize_t>(sizeof raw)) {
    return Status::FromErrno(n < 0 ? errno : EIO, "write journal checkpoint");
  }
  generation_ = generation;
  return Status::Ok();
}

Status Checkpoint::Sync() {
  if (::fdatasync(fd_.get()) != 0) return Status::FromErrno(errno, "sync journal checkpoint");
  return Status::Ok();
}

Status LockJournalDir(const std::string& journal_dir, UniqueFd* lock) {
  const std::string path = journal_dir + "/" + kLockName;
  // O_NONBLOCK: a FIFO planted under the name must not hang the open.
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600));
  if (!fd.valid()) return Status::FromErrno(errno, "open lock file " + path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(errno, "stat lock file " + path);
  if (!S_ISREG(st.st_mode)) {
    return Status(StatusCode::kInvalidArgument, "lock file " + path + " is not a regular file");
  }
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) return Status::FromErrno(errno, "lock " + path);
    char buf[32] = {};
    const ssize_t n = ::pread(fd.get(), buf, sizeof buf - 1, 0);
    const long pid = n > 0 ? std::strtol(buf, nullptr, 10) : 0;
    return Status(StatusCode::kAlreadyExists,
                  "another postspoold" + (pid > 0 ? " (pid " + std::to_string(pid) + ")" : "") +
                      " holds the journal directory " + journal_dir + " (lock file " + path + ")",
                  EWOULDBLOCK);
  }
  // The pid is for the message above and for people; the lock is the flock.
  // Writing it may fail on a full disk: the lock holds anyway.
  char pid[32];
  const int len = std::snprintf(pid, sizeof pid, "%d\n", static_cast<int>(::getpid()));
  if (::ftruncate(fd.get(), 0) == 0) {
    [[maybe_unused]] const ssize_t n = ::pwrite(fd.get(), pid, static_cast<size_t>(len), 0);
  }
  *lock = std::move(fd);
  return Status::Ok();
}

Status SetAsideDamagedSegment(int dirfd, uint64_t seq, JournalUsage* usage,
                              std::string* moved_to) {
  const std::string name = JournalSegmentName(seq);
  uint64_t bytes = 0;
  if (Status s = SegmentBytesOnDisk(dirfd, name, &bytes); !s.ok()) return s;
  bool created = ::mkdirat(dirfd, kDamagedDirName, 0700) == 0;
  if (!created && errno != EEXIST) {
    return Status::FromErrno(errno, std::string("create ") + kDamagedDirName + "/");
  }
  UniqueFd damaged(
      ::openat(dirfd, kDamagedDirName, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!damaged.valid()) {
    return Status::FromErrno(errno, std::string("open ") + kDamagedDirName + "/");
  }
  // Whatever the umask: only the daemon may read what it kept aside.
  if (created && ::fchmod(damaged.get(), 0700) != 0) {
    return Status::FromErrno(errno, std::string("chmod ") + kDamagedDirName + "/");
  }
  constexpr int kSuffixesMax = 1000;
  for (int i = 0; i < kSuffixesMax; ++i) {
    const std::string target = i == 0 ? name : name + "." + std::to_string(i);
    int rc = ::renameat2(dirfd, name.c_str(), damaged.get(), target.c_str(), RENAME_NOREPLACE);
    if (rc != 0 && errno == EINVAL) {
      // A filesystem without RENAME_NOREPLACE: link() never replaces either.
      rc = ::linkat(dirfd, name.c_str(), damaged.get(), target.c_str(), 0);
      if (rc == 0 && ::unlinkat(dirfd, name.c_str(), 0) != 0) {
        const int err = errno;
        ::unlinkat(damaged.get(), target.c_str(), 0);
        return Status::FromErrno(err, "unlink " + name);
      }
    }
    if (rc != 0) {
      if (errno == EEXIST) continue;
      return Status::FromErrno(errno, "move " + name + " to " + kDamagedDirName + "/");
    }
    usage->bytes.fetch_sub(std::min(bytes, usage->bytes.load()));
    *moved_to = std::string(kDamagedDirName) + "/" + target;
    if (::fsync(damaged.get()) != 0) return Status::FromErrno(errno, "sync damaged/");
    if (::fsync(dirfd) != 0) return Status::FromErrno(errno, "sync journal directory");
    return Status::Ok();
  }
  return Status(StatusCode::kAlreadyExists, std::string(kDamagedDirName) + "/ holds " +
                                                std::to_string(kSuffixesMax) + " files named " +
                                                name + "*");
}

Status DeleteConfirmedSegments(int dirfd, JournalPosition watermark, JournalUsage* usage,
                               int* deleted, std::span<const uint64_t> keep) {
  *deleted = 0;
  std::vector<uint64_t> seqs;
  if (Status s = ListJournalSegments(dirfd, &seqs); !s.ok()) return s;
  for (uint64_t seq : seqs) {
    if (seq >= watermark.segment_seq) break;
    if (std::find(keep.begin(), keep.end(), seq) != keep.end()) continue;
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
