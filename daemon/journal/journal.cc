#include "journal.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
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

Status ReadWhole(Storage* storage, int fd, std::byte* buf, size_t size, size_t* got) {
  *got = 0;
  while (*got < size) {
    size_t n = 0;
    if (Status s = storage->ReadAt(fd, *got, std::span(buf + *got, size - *got), &n); !s.ok()) {
      return Status::FromErrno(s.sys_errno(), "read journal checkpoint");
    }
    if (n == 0) break;
    *got += n;
  }
  return Status::Ok();
}

// pwrite until all of `bytes` is written; a write that makes no progress is
// ENOSPC.
Status WriteWhole(Storage* storage, int fd, uint64_t offset, std::span<const std::byte> bytes,
                  const char* what) {
  size_t done = 0;
  while (done < bytes.size()) {
    size_t n = 0;
    Status s = storage->WriteAt(fd, offset + done, bytes.subspan(done), &n);
    if (!s.ok() || n == 0) return Status::FromErrno(!s.ok() ? s.sys_errno() : ENOSPC, what);
    done += n;
  }
  return Status::Ok();
}

Status SegmentBytesOnDisk(Storage* storage, int dirfd, const std::string& name, uint64_t* bytes) {
  FileInfo info;
  if (Status s = storage->StatAt(dirfd, name, &info); !s.ok()) return s;
  *bytes = info.size;
  return Status::Ok();
}

// A segment::Source reading through the Storage (segment::FileSource over
// pread, as the reader had before the port).
class StorageSource final : public segment::Source {
 public:
  static Status Open(Storage* storage, int fd, uint64_t size_max,
                     std::unique_ptr<segment::Source>* out) {
    FileInfo info;
    if (Status s = storage->Stat(fd, &info); !s.ok()) return s;
    out->reset(new StorageSource(storage, fd, std::min(info.size, size_max)));
    return Status::Ok();
  }
  uint64_t size() const override { return size_; }
  bool Grow(uint64_t size_max) override {
    if (size_max != UINT64_MAX) {
      // The limit in this segment is a committed end (JournalReader::Next):
      // its bytes were written before it was published, so the file holds
      // them, and a segment that grows with every commit costs no fstat
      // per commit. A file cut below it shows as a short read
      // (SegmentReader::source_shrank).
      if (size_max < size_) return false;
      size_ = size_max;
      return true;
    }
    FileInfo info;
    if (!storage_->Stat(fd_, &info).ok()) return false;
    const uint64_t size = std::min(info.size, size_max);
    if (size < size_) return false;
    size_ = size;
    return true;
  }
  Status ReadAt(uint64_t offset, std::span<std::byte> out, size_t* got) override {
    *got = 0;
    if (offset >= size_) return Status::Ok();
    out = out.first(std::min<uint64_t>(out.size(), size_ - offset));
    while (*got < out.size()) {
      size_t n = 0;
      if (Status s = storage_->ReadAt(fd_, offset + *got, out.subspan(*got), &n); !s.ok()) {
        return s;
      }
      if (n == 0) break;
      *got += n;
    }
    return Status::Ok();
  }

 private:
  StorageSource(Storage* storage, int fd, uint64_t size)
      : storage_(storage), fd_(fd), size_(size) {}
  Storage* storage_;
  int fd_;
  uint64_t size_;
};

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

Status ListJournalSegments(int dirfd, std::vector<uint64_t>* seqs, Storage* storage) {
  seqs->clear();
  std::vector<std::string> names;
  if (Status s = storage->List(dirfd, &names); !s.ok()) {
    return Status::FromErrno(s.sys_errno(), "list journal directory");
  }
  for (const std::string& name : names) {
    uint64_t seq;
    if (ParseSegmentName(name.c_str(), &seq)) seqs->push_back(seq);
  }
  std::sort(seqs->begin(), seqs->end());
  return Status::Ok();
}

CommitChannel::CommitChannel() : event_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

void CommitChannel::Publish(JournalPosition end) {
  {
    std::lock_guard lock(mu_);
    if (end <= end_) return;
    end_ = end;
    if (signalled_) return;  // the forwarder has not drained the last one yet
    signalled_ = true;
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(event_fd_.get(), &one, sizeof one);
}

JournalPosition CommitChannel::committed() const {
  std::lock_guard lock(mu_);
  return end_;
}

void CommitChannel::Drain() {
  // Read, then clear: a Publish in between finds signalled_ set and does
  // not write, but its end is in end_ before the caller reads committed().
  uint64_t v;
  [[maybe_unused]] ssize_t n = ::read(event_fd_.get(), &v, sizeof v);
  std::lock_guard lock(mu_);
  signalled_ = false;
}

JournalWriter::JournalWriter(Options options, StorageFd dirfd, JournalUsage* usage,
                             uint64_t next_seq)
    : options_(std::move(options)),
      dirfd_(std::move(dirfd)),
      usage_(usage),
      next_seq_(next_seq),
      end_{next_seq, segment::kHeaderBytes} {}

Status JournalWriter::Open(const Options& options, JournalUsage* usage,
                           std::unique_ptr<JournalWriter>* out) {
  Storage* storage = options.storage;
  int raw_dirfd = -1;
  if (Status s = storage->OpenDirectory(options.dir, &raw_dirfd); !s.ok()) {
    return Status::FromErrno(s.sys_errno(), "open journal directory " + options.dir);
  }
  StorageFd dirfd(storage, raw_dirfd);
  std::vector<uint64_t> seqs;
  if (Status s = ListJournalSegments(dirfd.get(), &seqs, storage); !s.ok()) return s;
  uint64_t bytes = 0;
  for (uint64_t seq : seqs) {
    uint64_t size = 0;
    if (SegmentBytesOnDisk(storage, dirfd.get(), JournalSegmentName(seq), &size).ok()) {
      bytes += size;
    }
  }
  usage->bytes.store(bytes);
  // The first segment of this writer goes after every existing one, and
  // after the checkpoint's: when every segment was confirmed and deleted,
  // the stored watermark may point at the start of a segment that was never
  // created (the previous writer's end()); a reader starting there must not
  // find older records under that name. A damaged checkpoint only costs
  // this guard (the forwarder then starts from the oldest segment anyway).
  // One that could not be read (EIO, say) fails the start: the forwarder
  // may read it a moment later, and would then take this writer's first
  // segments, numbered below the checkpoint, as confirmed.
  uint64_t next = seqs.empty() ? 1 : seqs.back() + 1;
  JournalPosition checkpoint;
  if (Status s = Checkpoint::Load(dirfd.get(), &checkpoint, storage); s.ok()) {
    next = std::max(next, checkpoint.segment_seq + 1);
  } else if (s.code() != StatusCode::kCorruption) {
    return s;
  }
  out->reset(new JournalWriter(options, std::move(dirfd), usage, next));
  return Status::Ok();
}

NewJournalSegment CreateJournalSegment(int dirfd, uint64_t seq, bool sync, Storage* storage) {
  NewJournalSegment out;
  out.seq = seq;
  const std::string name = JournalSegmentName(seq);
  std::array<std::byte, segment::kHeaderBytes> header;
  segment::EncodeHeader(segment::NewHeader(seq), header);
  // The journal is the daemon's: 0600. The name never shows a partial
  // header; with `sync` the header and the directory entry also survive a
  // power loss. Appends go through pwrite at offsets the writer tracks, so
  // that io_uring can write them: the descriptor is not O_APPEND.
  int fd = -1;
  out.status = storage->CreateComplete(dirfd, name, header, 0600, sync, &fd);
  out.fd = StorageFd(storage, fd);
  if (!out.status.ok()) {
    out.fd.reset();
    // A failure after the name was linked (syncing the directory) leaves a
    // segment holding only its header: it counts, and its seq is used up,
    // or every later attempt would fail with EEXIST.
    out.name_used = SegmentBytesOnDisk(storage, dirfd, name, &out.bytes_on_disk).ok();
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
  // An uncut segment: Reserve() cuts it first (and creates the next).
  if (uncut_) return false;
  return !fd_.valid() ||
         (end_.offset > segment::kHeaderBytes && end_.offset + bytes > options_.segment_bytes_max);
}

Status JournalWriter::Reserve(uint64_t bytes, Slot* slot) {
  assert(!reservation_open_);
  if (uncut_) {
    if (Status s = options_.storage->Truncate(fd_.get(), end_.offset); !s.ok()) {
      return Status::FromErrno(s.sys_errno(), "cut a failed write off the journal");
    }
    uncut_ = false;
    fd_.reset();
  }
  if (NeedsSegment(bytes)) {
    if (Status s = Install(CreateJournalSegment(dirfd_.get(), next_seq_, options_.sync,
                                                options_.storage));
        !s.ok()) {
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
  // them). The segment is finished either way; but while those bytes
  // stay, the writer must not move on: the forwarder reads a segment that
  // is not the newest to its end, past its committed end, and would
  // publish the failed batch's posts while they are journaled again (a
  // ring's records are read again, socket clients spool theirs). Reserve()
  // tries the cut again first.
  if (fd_.valid() && !options_.storage->Truncate(fd_.get(), end_.offset).ok()) {
    uncut_ = true;
    return;
  }
  fd_.reset();
}

Status JournalWriter::Append(std::span<const std::byte> records, bool sync,
                             JournalPosition* first) {
  Slot slot;
  if (Status s = Reserve(records.size(), &slot); !s.ok()) return s;
  if (Status s = WriteWhole(options_.storage, slot.fd, slot.position.offset, records,
                            "write journal");
      !s.ok()) {
    Abandon();
    return s;
  }
  if (sync) {
    if (Status s = options_.storage->SyncData(slot.fd); !s.ok()) {
      Abandon();
      return Status::FromErrno(s.sys_errno(), "sync journal");
    }
  }
  Committed();
  if (first) *first = slot.position;
  return Status::Ok();
}

JournalReader::JournalReader(int dirfd, Storage* storage) : dirfd_(dirfd), storage_(storage) {}

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
    int fd = -1;
    if (Status s = storage_->OpenAt(dirfd_, name, Storage::OpenMode::kRead, &fd); !s.ok()) {
      return Status::FromErrno(s.sys_errno(), "open " + name);
    }
    fd_ = StorageFd(storage_, fd);
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
    s = StorageSource::Open(storage_, fd_.get(), size_max, &source_);
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
      if (Status s = ListJournalSegments(dirfd_, &seqs, storage_); !s.ok()) return s;
      auto it = std::lower_bound(seqs.begin(), seqs.end(), uint64_t{1});
      if (it == seqs.end()) return Status::Ok();
      pos_ = JournalPosition{*it, segment::kHeaderBytes};
      continue;
    }
    const uint64_t want_limit = pos_.segment_seq == limit.segment_seq ? limit.offset : UINT64_MAX;
    if (reader_ && open_seq_ == pos_.segment_seq && want_limit > opened_limit_ &&
        source_->Grow(want_limit) && reader_->Grow()) {
      // More of the segment was committed: read on with the same reader.
      // Opening a new one for every commit cost an fstat, a header read
      // and a 256 KiB window, zeroed and faulted in, per reader and commit.
      opened_limit_ = want_limit;
    }
    if (!reader_ || open_seq_ != pos_.segment_seq || opened_limit_ != want_limit) {
      Status s = OpenSegment(pos_.segment_seq, pos_.offset, limit);
      if (s.code() == StatusCode::kNotFound) {
        // Gone or never there: go on with the next segment that exists.
        std::vector<uint64_t> seqs;
        if (Status ls = ListJournalSegments(dirfd_, &seqs, storage_); !ls.ok()) return ls;
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
        Seek(pos_);
        return s;
      }
      case segment::SegmentReader::Result::kEnd:
        if (reader_->source_shrank()) {
          // Nothing of ours cuts a segment below what was committed to it
          // (Abandon cuts only past the committed end, which is the reader's
          // limit): someone truncated it. Its posts are not to be taken for
          // a torn tail and deleted with it: it is damaged, to be set aside.
          Seek(pos_);  // read afresh if asked again
          return Status(StatusCode::kCorruption,
                        JournalSegmentName(pos_.segment_seq) +
                            ": the file was cut short while it was read (truncated)");
        }
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

Status Checkpoint::Load(int dirfd, JournalPosition* pos, Storage* storage) {
  *pos = JournalPosition{};
  int raw_fd = -1;
  if (Status s = storage->OpenAt(dirfd, kCheckpointName, Storage::OpenMode::kRead, &raw_fd);
      !s.ok()) {
    if (s.sys_errno() == ENOENT) return Status::Ok();
    return Status::FromErrno(s.sys_errno(), "open journal checkpoint");
  }
  StorageFd fd(storage, raw_fd);
  // One byte more than a version 2 file: a longer file is not one.
  static_assert(kCheckpointFileBytes > kCheckpointV1Bytes);
  auto raw = std::make_unique<std::byte[]>(kCheckpointFileBytes + 1);
  size_t n = 0;
  if (Status s = ReadWhole(storage, fd.get(), raw.get(), kCheckpointFileBytes + 1, &n); !s.ok()) {
    return s;
  }
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

Status Checkpoint::Open(int dirfd, JournalPosition pos, std::unique_ptr<Checkpoint>* out,
                        Storage* storage) {
  {
    int raw_fd = -1;
    const Status opened =
        storage->OpenAt(dirfd, kCheckpointName, Storage::OpenMode::kReadWrite, &raw_fd);
    if (!opened.ok() && opened.sys_errno() != ENOENT) {
      return Status::FromErrno(opened.sys_errno(), "open journal checkpoint");
    }
    StorageFd fd(storage, opened.ok() ? raw_fd : -1);
    FileInfo st;
    if (fd.valid()) {
      if (Status s = storage->Stat(fd.get(), &st); !s.ok()) {
        return Status::FromErrno(s.sys_errno(), "stat journal checkpoint");
      }
    }
    if (fd.valid() && st.regular && st.size == kCheckpointFileBytes) {
      // Ours already: go on from its newest slot (a damaged file is reused
      // as it is; its slots are rewritten by the next stores).
      auto raw = std::make_unique<std::byte[]>(kCheckpointFileBytes);
      size_t n = 0;
      if (Status s = ReadWhole(storage, fd.get(), raw.get(), kCheckpointFileBytes, &n); !s.ok()) {
        return s;
      }
      const CheckpointSlot slot = n == kCheckpointFileBytes ? NewestCheckpointSlot(raw.get())
                                                            : CheckpointSlot{};
      out->reset(new Checkpoint(storage, std::move(fd), slot.valid ? slot.generation : 0));
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
  int raw_fd = -1;
  if (Status s =
          storage->OpenAt(dirfd, kCheckpointNewName, Storage::OpenMode::kCreateReadWrite, &raw_fd);
      !s.ok()) {
    return Status::FromErrno(s.sys_errno(), "create journal checkpoint");
  }
  StorageFd fd(storage, raw_fd);
  const auto fail = [dirfd, storage](Status s) {
    storage->Unlink(dirfd, kCheckpointNewName).IgnoreError();
    return s;
  };
  if (Status s = WriteWhole(storage, fd.get(), 0, std::span(raw.get(), kCheckpointFileBytes),
                            "write journal checkpoint");
      !s.ok()) {
    return fail(s);
  }
  // Both blocks are allocated now: later stores allocate nothing.
  if (Status s = storage->SyncData(fd.get()); !s.ok()) {
    return fail(Status::FromErrno(s.sys_errno(), "sync journal checkpoint"));
  }
  if (Status s = storage->Rename(dirfd, kCheckpointNewName, dirfd, kCheckpointName, false);
      !s.ok()) {
    return fail(Status::FromErrno(s.sys_errno(), "rename journal checkpoint"));
  }
  if (Status s = storage->SyncDirectory(dirfd); !s.ok()) {
    return Status::FromErrno(s.sys_errno(), "sync journal directory");
  }
  out->reset(new Checkpoint(storage, std::move(fd), 1));
  return Status::Ok();
}

Status Checkpoint::Store(JournalPosition pos) {
  const uint64_t generation = generation_ + 1;
  std::byte raw[kCheckpointSlotBytes];
  EncodeCheckpointSlot(generation, pos, raw);
  const off_t at = static_cast<off_t>((generation & 1) * kCheckpointSlotStride);
  size_t n = 0;
  const Status s = storage_->WriteAt(fd_.get(), static_cast<uint64_t>(at), raw, &n);
  if (!s.ok() || n != sizeof raw) {
    return Status::FromErrno(!s.ok() ? s.sys_errno() : EIO, "write journal checkpoint");
  }
  generation_ = generation;
  return Status::Ok();
}

Status Checkpoint::Sync() {
  if (Status s = storage_->SyncData(fd_.get()); !s.ok()) {
    return Status::FromErrno(s.sys_errno(), "sync journal checkpoint");
  }
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

JournalPosition StorableCheckpoint(JournalPosition watermark,
                                   std::optional<JournalPosition> damaged_at) {
  return damaged_at ? std::min(watermark, *damaged_at) : watermark;
}

uint64_t CountRecordsFrom(int dirfd, uint64_t seq, uint64_t offset, Storage* storage) {
  int raw = -1;
  if (!storage->OpenAt(dirfd, JournalSegmentName(seq), Storage::OpenMode::kRead, &raw).ok()) {
    return 0;
  }
  const StorageFd fd(storage, raw);
  std::unique_ptr<segment::Source> source;
  if (!StorageSource::Open(storage, fd.get(), UINT64_MAX, &source).ok()) return 0;
  const uint64_t from = std::min(offset, source->size());
  return segment::CountLostRecords(source.get(), from, source->size() - from);
}

Status SetAsideDamagedSegment(int dirfd, uint64_t seq, JournalUsage* usage,
                              std::string* moved_to, Storage* storage) {
  const std::string name = JournalSegmentName(seq);
  uint64_t bytes = 0;
  if (Status s = SegmentBytesOnDisk(storage, dirfd, name, &bytes); !s.ok()) return s;
  // Whatever the umask: only the daemon may read what it kept aside.
  if (Status s = storage->MakeDirectory(dirfd, kDamagedDirName, 0700);
      !s.ok() && s.code() != StatusCode::kAlreadyExists) {
    return s;
  }
  int raw_damaged = -1;
  if (Status s = storage->OpenAt(dirfd, kDamagedDirName, Storage::OpenMode::kDirectory,
                                 &raw_damaged);
      !s.ok()) {
    return Status::FromErrno(s.sys_errno(), std::string("open ") + kDamagedDirName + "/");
  }
  StorageFd damaged(storage, raw_damaged);
  constexpr int kSuffixesMax = 1000;
  for (int i = 0; i < kSuffixesMax; ++i) {
    const std::string target = i == 0 ? name : name + "." + std::to_string(i);
    if (Status s = storage->Rename(dirfd, name, damaged.get(), target, /*noreplace=*/true);
        !s.ok()) {
      if (s.code() == StatusCode::kAlreadyExists) continue;
      return Status::FromErrno(s.sys_errno(),
                               "move " + name + " to " + kDamagedDirName + "/");
    }
    usage->bytes.fetch_sub(std::min(bytes, usage->bytes.load()));
    *moved_to = std::string(kDamagedDirName) + "/" + target;
    if (Status s = storage->SyncDirectory(damaged.get()); !s.ok()) {
      return Status::FromErrno(s.sys_errno(), "sync damaged/");
    }
    if (Status s = storage->SyncDirectory(dirfd); !s.ok()) {
      return Status::FromErrno(s.sys_errno(), "sync journal directory");
    }
    return Status::Ok();
  }
  return Status(StatusCode::kAlreadyExists, std::string(kDamagedDirName) + "/ holds " +
                                                std::to_string(kSuffixesMax) + " files named " +
                                                name + "*");
}

Status DeleteConfirmedSegments(int dirfd, JournalPosition watermark, JournalUsage* usage,
                               int* deleted, std::span<const uint64_t> keep, Storage* storage) {
  *deleted = 0;
  std::vector<uint64_t> seqs;
  if (Status s = ListJournalSegments(dirfd, &seqs, storage); !s.ok()) return s;
  for (uint64_t seq : seqs) {
    if (seq >= watermark.segment_seq) break;
    if (std::find(keep.begin(), keep.end(), seq) != keep.end()) continue;
    const std::string name = JournalSegmentName(seq);
    uint64_t size = 0;
    if (!SegmentBytesOnDisk(storage, dirfd, name, &size).ok()) size = 0;
    if (Status s = storage->Unlink(dirfd, name); !s.ok()) {
      if (s.code() == StatusCode::kNotFound) continue;
      return Status::FromErrno(s.sys_errno(), "delete " + name);
    }
    usage->bytes.fetch_sub(std::min(size, usage->bytes.load()));
    ++*deleted;
  }
  return Status::Ok();
}

}  // namespace postspool::daemon
