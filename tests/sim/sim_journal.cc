#include "sim_journal.h"

#include <xxhash.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>

#include "little_endian.h"
#include "segment_format.h"

namespace postspool::sim {
namespace {

constexpr char kCheckpointName[] = "checkpoint";
constexpr char kCheckpointTmpName[] = "checkpoint.tmp";
constexpr uint32_t kCheckpointMagic = 0x4b435350;

bool ParseSegmentName(const std::string& name, uint64_t* seq) {
  unsigned long long v = 0;
  int n = 0;
  if (std::sscanf(name.c_str(), "journal-%16llx.seg%n", &v, &n) != 1) return false;
  if (name[n] != '\0' || n != 8 + 16 + 4) return false;
  *seq = v;
  return true;
}

}  // namespace

std::vector<uint64_t> ListJournalSegments(const SimFs& fs) {
  std::vector<uint64_t> seqs;
  for (const auto& [name, ino] : fs.List(kJournalDir)) {
    uint64_t seq;
    if (ParseSegmentName(name, &seq)) seqs.push_back(seq);
  }
  std::sort(seqs.begin(), seqs.end());
  return seqs;
}

// --- SimJournal: JournalWriter ------------------------------------------------

Status SimJournal::Open(SimNode* node, const Options& options, daemon::JournalUsage* usage,
                        SimCommits* commits, std::unique_ptr<SimJournal>* out) {
  const std::vector<uint64_t> seqs = ListJournalSegments(node->fs);
  uint64_t bytes = 0;
  for (uint64_t seq : seqs) {
    SimFs::Ino ino;
    if (node->fs.Lookup(kJournalDir, daemon::JournalSegmentName(seq), &ino)) {
      bytes += node->fs.Get(ino)->data.size();
    }
  }
  usage->bytes.store(bytes);
  const uint64_t next = seqs.empty() ? 1 : seqs.back() + 1;
  out->reset(new SimJournal(node, options, usage, commits, next));
  return (*out)->StartSegment();
}

SimJournal::~SimJournal() {
  CloseFd();
  if (made_fd_ >= 0) node_->CloseFd(made_fd_);
}

void SimJournal::CloseFd() {
  if (fd_ >= 0) node_->CloseFd(fd_);
  fd_ = -1;
}

// Reserve's synchronous path: the task run at once.
Status SimJournal::StartSegment() {
  NewSegmentTask()();
  return SegmentDone();
}

bool SimJournal::NeedsSegment(uint64_t bytes) const {
  return fd_ < 0 ||
         (end_.offset > segment::kHeaderBytes && end_.offset + bytes > options_.segment_bytes_max);
}

// As the daemon's: the file is made when the loop runs the task (SimIoLoop
// runs it as a completion, rounds later), installed by SegmentDone.
std::function<int64_t()> SimJournal::NewSegmentTask() {
  const uint64_t seq = next_seq_;
  next_seq_ = seq + 1;
  return [this, seq] {
    made_ = CreateSegmentFile(seq, &made_fd_);
    made_seq_ = seq;
    return made_.ok() ? int64_t{0} : int64_t{-1};
  };
}

Status SimJournal::SegmentDone() {
  if (!made_.ok()) return made_;
  CloseFd();
  fd_ = made_fd_;
  made_fd_ = -1;
  end_ = JournalPosition{made_seq_, segment::kHeaderBytes};
  usage_->bytes.fetch_add(segment::kHeaderBytes);
  return Status::Ok();
}

// segment::CreateSegment (an unnamed file linked into place) and
// CreateJournalSegment.
Status SimJournal::CreateSegmentFile(uint64_t seq, int* fd_out) {
  SimFs& fs = node_->fs;
  const std::string name = daemon::JournalSegmentName(seq);
  segment::Header h;
  h.segment_id = seq;
  h.created_unix_ns = node_->clock.WallSeconds() * 1000000000;
  h.host = "simhost";
  std::array<std::byte, segment::kHeaderBytes> raw;
  segment::EncodeHeader(h, raw);
  SimFs::Ino ino;
  if (int err = fs.CreateUnnamed(Actor::kDaemon, 0, 0, &ino); err != 0) {
    return Status::FromErrno(err, "create segment " + name);
  }
  // WriteAll: continues after a short write.
  size_t done = 0;
  while (done < raw.size()) {
    const int64_t w = fs.Write(Actor::kDaemon, ino, done, std::span(raw).subspan(done));
    if (w < 0) {
      fs.Collect();
      return Status::FromErrno(static_cast<int>(-w), "write segment header " + name);
    }
    done += static_cast<size_t>(w);
  }
  if (options_.sync) {
    if (int err = fs.Sync(Actor::kDaemon, ino); err != 0) {
      fs.Collect();
      return Status::FromErrno(err, "sync " + name);
    }
  }
  if (int err = fs.Link(Actor::kDaemon, kJournalDir, name, ino); err != 0) {
    fs.Collect();
    return Status::FromErrno(err, "link segment " + name);
  }
  const int fd = node_->AllocFd(SimNode::FdEntry{SimNode::FdEntry::kFile, 0, ino});
  if (options_.sync) {
    if (int err = fs.SyncDir(Actor::kDaemon); err != 0) {
      node_->CloseFd(fd);
      return Status::FromErrno(err, "sync spool directory");
    }
  }
  *fd_out = fd;
  return Status::Ok();
}

Status SimJournal::Reserve(uint64_t bytes, Slot* slot) {
  assert(!reservation_open_);
  if (NeedsSegment(bytes)) {
    if (Status s = StartSegment(); !s.ok()) return s;
  }
  reservation_open_ = true;
  reserved_ = bytes;
  slot->fd = fd_;
  slot->position = end_;
  return Status::Ok();
}

JournalPosition SimJournal::Committed() {
  assert(reservation_open_);
  reservation_open_ = false;
  end_.offset += reserved_;
  usage_->bytes.fetch_add(reserved_);
  return end_;
}

void SimJournal::Abandon() {
  assert(reservation_open_);
  reservation_open_ = false;
  // As JournalWriter::Abandon: cut the failed write past the committed end.
  if (const SimNode::FdEntry* e = node_->Fd(fd_)) {
    (void)node_->fs.Truncate(Actor::kDaemon, e->ino, end_.offset);
  }
  CloseFd();
}

// --- SimJournalReader: JournalReader ------------------------------------------

void SimJournalReader::Release() {
  reader_.reset();
  source_.reset();
  if (open_) fs_->Unref(ino_);
  open_ = false;
}

void SimJournalReader::Seek(JournalPosition pos) {
  pos_ = pos;
  Release();
}

Status SimJournalReader::OpenSegment(uint64_t seq, uint64_t offset, JournalPosition limit) {
  reader_.reset();
  source_.reset();
  const std::string name = daemon::JournalSegmentName(seq);
  if (!open_ || open_seq_ != seq) {
    if (open_) fs_->Unref(ino_);
    open_ = false;
    SimFs::Ino ino;
    if (!fs_->Lookup(kJournalDir, name, &ino)) {
      return Status::FromErrno(ENOENT, "open " + name);
    }
    if (int err = fs_->ReadFault(Actor::kDaemon); err != 0) return Status::FromErrno(err, "open " + name);
    ino_ = ino;
    fs_->Ref(ino_);
    open_ = true;
    open_seq_ = seq;
  }
  const uint64_t size_max = seq == limit.segment_seq ? limit.offset : UINT64_MAX;
  const std::vector<std::byte>& data = fs_->Get(ino_)->data;
  bytes_.assign(data.begin(), data.begin() + static_cast<ptrdiff_t>(
                                                 std::min<uint64_t>(data.size(), size_max)));
  source_ = std::make_unique<segment::MemorySource>(bytes_);
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

Status SimJournalReader::Next(JournalPosition limit, daemon::JournalReader::Entry* entry,
                              bool* got) {
  *got = false;
  for (;;) {
    if (pos_ >= limit) return Status::Ok();
    if (pos_.segment_seq == 0) {
      const std::vector<uint64_t> seqs = ListJournalSegments(*fs_);
      auto it = std::lower_bound(seqs.begin(), seqs.end(), uint64_t{1});
      if (it == seqs.end()) return Status::Ok();
      pos_ = JournalPosition{*it, segment::kHeaderBytes};
      continue;
    }
    const uint64_t want_limit = pos_.segment_seq == limit.segment_seq ? limit.offset : UINT64_MAX;
    if (!reader_ || open_seq_ != pos_.segment_seq || opened_limit_ != want_limit) {
      Status s = OpenSegment(pos_.segment_seq, pos_.offset, limit);
      if (s.code() == StatusCode::kNotFound) {
        const std::vector<uint64_t> seqs = ListJournalSegments(*fs_);
        auto it = std::upper_bound(seqs.begin(), seqs.end(), pos_.segment_seq);
        if (it == seqs.end() || *it > limit.segment_seq) return Status::Ok();
        pos_ = JournalPosition{*it, segment::kHeaderBytes};
        continue;
      }
      if (s.code() == StatusCode::kCorruption || s.code() == StatusCode::kUnsupported) {
        // As JournalReader::Next.
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
      case segment::SegmentReader::Result::kYield:
      case segment::SegmentReader::Result::kIoError:
        return reader_->io_status();
      case segment::SegmentReader::Result::kEnd:
        if (pos_.segment_seq == limit.segment_seq) {
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

// --- Checkpoint ------------------------------------------------------------------

namespace {

// The version 2 checkpoint (journal.cc, FORMAT.md "The journal directory"):
// two 64-byte slots 4 KiB apart, the newest valid generation wins.
constexpr size_t kSlotStride = 4096;
constexpr size_t kSlotBytes = 64;
constexpr size_t kFileBytes = 2 * kSlotStride;

void EncodeSlot(uint64_t generation, JournalPosition pos, std::byte (&raw)[kSlotBytes]) {
  std::memset(raw, 0, sizeof raw);
  StoreLe32(raw, kCheckpointMagic);
  StoreLe32(raw + 4, 2);
  StoreLe64(raw + 8, generation);
  StoreLe64(raw + 16, pos.segment_seq);
  StoreLe64(raw + 24, pos.offset);
  StoreLe64(raw + 32, segment::MaskChecksum(XXH3_64bits(raw, 32)));
}

// The newest valid slot: false if none.
bool NewestSlot(const std::vector<std::byte>& file, uint64_t* generation, JournalPosition* pos) {
  bool found = false;
  for (size_t i = 0; i < 2; ++i) {
    if (file.size() < i * kSlotStride + kSlotBytes) break;
    const std::byte* raw = file.data() + i * kSlotStride;
    if (LoadLe32(raw) != kCheckpointMagic || LoadLe32(raw + 4) != 2 ||
        LoadLe64(raw + 32) != segment::MaskChecksum(XXH3_64bits(raw, 32))) {
      continue;
    }
    const uint64_t g = LoadLe64(raw + 8);
    if (found && g <= *generation) continue;
    found = true;
    *generation = g;
    *pos = JournalPosition{LoadLe64(raw + 16), LoadLe64(raw + 24)};
  }
  return found;
}

}  // namespace

Status LoadCheckpoint(SimFs* fs, JournalPosition* pos) {
  *pos = JournalPosition{};
  SimFs::Ino ino;
  if (!fs->Lookup(kJournalDir, kCheckpointName, &ino)) return Status::Ok();
  if (int err = fs->ReadFault(Actor::kDaemon); err != 0) {
    return Status::FromErrno(err, "open journal checkpoint");
  }
  const std::vector<std::byte>& raw = fs->Get(ino)->data;
  uint64_t generation = 0;
  if (!NewestSlot(raw, &generation, pos)) {
    return Status(StatusCode::kCorruption, "journal checkpoint is damaged");
  }
  return Status::Ok();
}

Status SimCheckpoint::Open(SimFs* fs, JournalPosition pos) {
  fs_ = fs;
  if (fs->Lookup(kJournalDir, kCheckpointName, &ino_) && fs->Get(ino_)->data.size() == kFileBytes) {
    JournalPosition ignored;
    generation_ = 0;
    (void)NewestSlot(fs->Get(ino_)->data, &generation_, &ignored);
    open_ = true;
    return Status::Ok();
  }
  // Made whole under another name, synced, renamed into place.
  std::vector<std::byte> file(kFileBytes);
  std::byte slot[kSlotBytes];
  EncodeSlot(1, pos, slot);
  std::memcpy(file.data() + kSlotStride, slot, sizeof slot);
  SimFs::Ino ino;
  if (int err = fs->Create(Actor::kDaemon, kJournalDir, kCheckpointTmpName, 0, 0, false, true, &ino);
      err != 0) {
    return Status::FromErrno(err, "create journal checkpoint");
  }
  if (fs->Write(Actor::kDaemon, ino, 0, std::span(file)) != static_cast<int64_t>(file.size())) {
    return Status::FromErrno(EIO, "write journal checkpoint");
  }
  if (int err = fs->Sync(Actor::kDaemon, ino); err != 0) {
    return Status::FromErrno(err, "sync journal checkpoint");
  }
  if (int err = fs->Rename(Actor::kDaemon, kJournalDir, kCheckpointTmpName, kJournalDir,
                           kCheckpointName, false);
      err != 0) {
    return Status::FromErrno(err, "rename journal checkpoint");
  }
  if (int err = fs->SyncDir(Actor::kDaemon); err != 0) {
    return Status::FromErrno(err, "sync journal directory");
  }
  ino_ = ino;
  generation_ = 1;
  open_ = true;
  return Status::Ok();
}

Status SimCheckpoint::Store(JournalPosition pos) {
  const uint64_t generation = generation_ + 1;
  std::byte raw[kSlotBytes];
  EncodeSlot(generation, pos, raw);
  if (fs_->Write(Actor::kDaemon, ino_, (generation & 1) * kSlotStride, std::span(raw)) !=
      static_cast<int64_t>(sizeof raw)) {
    return Status::FromErrno(EIO, "write journal checkpoint");
  }
  generation_ = generation;
  return Status::Ok();
}

Status SimCheckpoint::Sync() {
  if (int err = fs_->Sync(Actor::kDaemon, ino_); err != 0) {
    return Status::FromErrno(err, "sync journal checkpoint");
  }
  return Status::Ok();
}

Status DeleteConfirmedSegments(SimFs* fs, JournalPosition watermark, daemon::JournalUsage* usage,
                               int* deleted) {
  *deleted = 0;
  for (uint64_t seq : ListJournalSegments(*fs)) {
    if (seq >= watermark.segment_seq) break;
    const std::string name = daemon::JournalSegmentName(seq);
    SimFs::Ino ino;
    const uint64_t size = fs->Lookup(kJournalDir, name, &ino) ? fs->Get(ino)->data.size() : 0;
    if (int err = fs->Unlink(Actor::kDaemon, kJournalDir, name); err != 0) {
      if (err == ENOENT) continue;
      return Status::FromErrno(err, "delete " + name);
    }
    usage->bytes.fetch_sub(std::min(size, usage->bytes.load()));
    ++*deleted;
  }
  fs->Collect();
  return Status::Ok();
}

bool ReadRecords(const std::vector<std::byte>& bytes, uint64_t offset,
                 const std::function<void(const fb::Post&, uint64_t at, uint64_t next)>& f) {
  segment::MemorySource source(bytes);
  segment::ReaderOptions options;
  options.verify_payload = VerifyPostPayload;
  options.start_offset = std::max<uint64_t>(offset, segment::kHeaderBytes);
  std::unique_ptr<segment::SegmentReader> reader;
  if (!segment::SegmentReader::Open(&source, options, &reader).ok()) return false;
  segment::Record rec;
  while (reader->Next(&rec) == segment::SegmentReader::Result::kRecord) {
    f(PostFromPayload(rec.payload), rec.position.offset, rec.next_offset);
  }
  return true;
}

}  // namespace postspool::sim
