#include "sim_spool.h"

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>

#include "little_endian.h"
#include "segment_format.h"
#include "segment_writer.h"

namespace postspool::sim {
namespace {

constexpr uint64_t kFileCostMin = 4096;
constexpr int kReopenAttemptsMax = 8;

// pread through SimFs, for the adopter's SegmentReader.
class SimFileSource final : public segment::Source {
 public:
  SimFileSource(SimFs* fs, SimFs::Ino ino, SpoolWork* work)
      : fs_(fs), ino_(ino), size_(fs->Get(ino)->data.size()), work_(work) {}
  uint64_t size() const override { return size_; }
  Status ReadAt(uint64_t offset, std::span<std::byte> out, size_t* got) override {
    *got = 0;
    if (int err = fs_->ReadFault(Actor::kDaemon); err != 0) {
      return Status::FromErrno(err, "read segment");
    }
    const std::vector<std::byte>& data = fs_->Get(ino_)->data;
    if (offset >= data.size()) return Status::Ok();
    const size_t n = static_cast<size_t>(std::min<uint64_t>(out.size(), data.size() - offset));
    std::memcpy(out.data(), data.data() + offset, n);
    *got = n;
    work_->bytes_read += n;
    return Status::Ok();
  }

 private:
  SimFs* fs_;
  SimFs::Ino ino_;
  uint64_t size_;
  SpoolWork* work_;
};

class SimSpoolFile final : public daemon::SpoolFile {
 public:
  SimSpoolFile(SimNode* node, SimFs::Ino ino, daemon::SpoolEntry entry, SpoolWork* work)
      : node_(node), ino_(ino), entry_(std::move(entry)), work_(work) {
    node_->fs.Ref(ino_);
    wb_err_seen_ = node_->fs.Get(ino_)->wb_err;
  }
  ~SimSpoolFile() override {
    source_.reset();
    node_->fs.Unref(ino_);
  }
  const daemon::SpoolEntry& entry() const override { return entry_; }
  Status TrySeal(bool sync) override {
    Status s = Seal(sync);
    node_->Trace("spool: seal " + entry_.name + ": " + s.ToString());
    return s;
  }
  Status Seal(bool sync) {
    ++work_->seals;
    SimFs& fs = node_->fs;
    SimFs::Inode* in = fs.Get(ino_);
    if (in->shared_locks > 0) return Status(StatusCode::kTimedOut, "segment lock not had in time");
    if (in->data.size() < segment::kFlagsOffset + 4) {
      return Status(StatusCode::kCorruption, "segment shorter than its header");
    }
    const uint32_t flags = LoadLe32(in->data.data() + segment::kFlagsOffset);
    if ((flags & segment::kFlagSealed) != 0) return Status::Ok();
    std::byte raw[4];
    StoreLe32(raw, flags | segment::kFlagSealed);
    const int64_t w = fs.Write(Actor::kDaemon, ino_, segment::kFlagsOffset, std::span(raw));
    if (w != 4) {
      return w < 0 ? Status::FromErrno(static_cast<int>(-w), "seal segment")
                   : Status(StatusCode::kIoError, "short write sealing segment");
    }
    if (sync) {
      if (int err = fs.Sync(Actor::kDaemon, ino_, &wb_err_seen_); err != 0) {
        return Status::FromErrno(err, "sync sealed segment");
      }
    }
    return Status::Ok();
  }
  segment::Source* source() override {
    if (!source_) source_ = std::make_unique<SimFileSource>(&node_->fs, ino_, work_);
    return source_.get();
  }

 private:
  SimNode* node_;
  SimFs::Ino ino_;
  daemon::SpoolEntry entry_;
  SpoolWork* work_;
  std::unique_ptr<SimFileSource> source_;
  uint32_t wb_err_seen_ = 0;
};

}  // namespace

daemon::SpoolEntry DescribeInode(const SimFs::Inode& in, const std::string& name) {
  daemon::SpoolEntry e;
  e.name = name;
  e.regular = in.regular;
  e.owner = in.owner;
  e.group = in.group;
  e.links = in.links;
  e.size = in.data.size();
  e.allocated_bytes = in.sparse ? in.allocated() / 2 : in.allocated();
  e.has_hole = in.sparse;
  e.mtime_s = in.mtime_s;
  return e;
}

void SimSpoolDir::Open() {
  quarantine_bytes_ = 0;
  for (const auto& [name, ino] : node_->fs.List(kQuarantineDir)) {
    quarantine_bytes_ += std::max<uint64_t>(node_->fs.Get(ino)->allocated(), kFileCostMin);
  }
}

bool SimSpoolDir::TakeChanges() {
  const bool changed = node_->spool_changed;
  node_->spool_changed = false;
  return changed;
}

Status SimSpoolDir::List(size_t max, std::vector<daemon::SpoolEntry>* out, bool* pass_done) {
  ++work_.lists;
  out->clear();
  *pass_done = false;
  SimFs& fs = node_->fs;
  if (!in_pass_) {
    if (int err = fs.ReadFault(Actor::kDaemon); err != 0) {
      return Status::FromErrno(err, "open spool directory");
    }
    // readdir: the entries there when the pass began, in the directory's
    // own order (inode order here); entries made meanwhile are seen by the
    // next pass.
    pass_.clear();
    for (const auto& [name, ino] : fs.List(kSpoolDir)) pass_.push_back(name);
    pass_pos_ = 0;
    in_pass_ = true;
  }
  while (out->size() < max) {
    if (pass_pos_ >= pass_.size()) {
      in_pass_ = false;
      *pass_done = true;
      return Status::Ok();
    }
    const std::string& name = pass_[pass_pos_++];
    SimFs::Ino ino;
    if (!fs.Lookup(kSpoolDir, name, &ino)) continue;  // gone: fstatat fails
    out->push_back(DescribeInode(*fs.Get(ino), name));
    ++work_.entries;
  }
  return Status::Ok();
}

Status SimSpoolDir::Rename(const std::string& from, const std::string& to) {
  ++work_.renames;
  const int err = node_->fs.Rename(Actor::kDaemon, kSpoolDir, from, kSpoolDir, to, true);
  node_->Trace("spool: rename " + from + " to " + to + ": " + ErrnoName(err));
  if (err != 0) {
    return Status::FromErrno(err, "rename " + from + " to " + to);
  }
  return Status::Ok();
}

Status SimSpoolDir::Open(const std::string& name, std::unique_ptr<daemon::SpoolFile>* out) {
  ++work_.opens;
  SimFs& fs = node_->fs;
  SimFs::Ino ino;
  if (!fs.Lookup(kSpoolDir, name, &ino)) return Status::FromErrno(ENOENT, "open " + name);
  if (int err = fs.ReadFault(Actor::kDaemon); err != 0) {
    node_->Trace("spool: open " + name + ": EIO");
    return Status::FromErrno(err, "open " + name);
  }
  *out = std::make_unique<SimSpoolFile>(node_, ino, DescribeInode(*fs.Get(ino), name), &work_);
  return Status::Ok();
}

Status SimSpoolDir::Unlink(const std::string& name) {
  ++work_.unlinks;
  const int err = node_->fs.Unlink(Actor::kDaemon, kSpoolDir, name);
  node_->Trace("spool: unlink " + name + ": " + ErrnoName(err));
  if (err != 0) {
    return Status::FromErrno(err, "delete " + name);
  }
  node_->fs.Collect();
  return Status::Ok();
}

Status SimSpoolDir::Quarantine(const std::string& name, const std::string& target) {
  ++work_.quarantines;
  SimFs& fs = node_->fs;
  SimFs::Ino ino;
  const uint64_t bytes = fs.Lookup(kSpoolDir, name, &ino) ? fs.Get(ino)->allocated() : 0;
  const int err = fs.Rename(Actor::kDaemon, kSpoolDir, name, kQuarantineDir, target, true);
  node_->Trace("spool: quarantine " + name + ": " + ErrnoName(err));
  if (err != 0) {
    return Status::FromErrno(err, "move " + name + " to the quarantine");
  }
  quarantine_bytes_ += std::max(bytes, kFileCostMin);
  return Status::Ok();
}

// --- SimSpoolWriter: SegmentAppender ---------------------------------------------

void SimSpoolWriter::Close() {
  if (locked_) {
    --node_->fs.Get(ino_)->shared_locks;
    locked_ = false;
  }
  if (open_) node_->fs.Unref(ino_);
  open_ = false;
}

bool SimSpoolWriter::StillCurrent() const {
  SimFs::Ino named;
  return node_->fs.Lookup(kSpoolDir, segment::SpoolCurrentName(uid_), &named) && named == ino_;
}

Status SimSpoolWriter::CreateSegment(const std::string& name, SimFs::Ino* out) {
  SimFs& fs = node_->fs;
  segment::Header h;
  h.segment_id = rng_->Next();
  h.created_unix_ns = node_->clock.WallSeconds() * 1000000000;
  h.creator_uid = uid_;
  h.host = "simhost";
  std::array<std::byte, segment::kHeaderBytes> raw;
  segment::EncodeHeader(h, raw);
  SimFs::Ino ino;
  if (int err = fs.CreateUnnamed(Actor::kClient, uid_, spool_gid_, &ino); err != 0) {
    return Status::FromErrno(err, "create segment " + name);
  }
  size_t done = 0;
  while (done < raw.size()) {
    const int64_t w = fs.Write(Actor::kClient, ino, done, std::span(raw).subspan(done));
    if (w < 0) {
      fs.Collect();
      return Status::FromErrno(static_cast<int>(-w), "write segment header " + name);
    }
    done += static_cast<size_t>(w);
  }
  if (options_.sync) {
    if (int err = fs.Sync(Actor::kClient, ino); err != 0) {
      fs.Collect();
      return Status::FromErrno(err, "sync " + name);
    }
  }
  if (int err = fs.Link(Actor::kClient, kSpoolDir, name, ino); err != 0) {
    fs.Collect();
    return Status::FromErrno(err, "link segment " + name);
  }
  node_->spool_changed = true;
  if (options_.sync) {
    if (int err = fs.SyncDir(Actor::kClient); err != 0) {
      // As SegmentAppender::MoveAsideUnsynced: a name that may not survive
      // a power loss is no current segment for anyone's posts.
      SimFs::Ino named;
      if (fs.Lookup(kSpoolDir, name, &named) && named == ino) {
        (void)fs.Rename(Actor::kClient, kSpoolDir, name, kSpoolDir,
                        segment::SpoolSealedName(uid_, h.segment_id), true);
      }
      return Status::FromErrno(err, "sync spool directory");
    }
  }
  *out = ino;
  return Status::Ok();
}

Status SimSpoolWriter::OpenCurrent() {
  Close();
  SimFs& fs = node_->fs;
  const std::string current = segment::SpoolCurrentName(uid_);
  for (int attempt = 0; attempt < kReopenAttemptsMax; ++attempt) {
    SimFs::Ino ino;
    if (!fs.Lookup(kSpoolDir, current, &ino)) {
      Status s = CreateSegment(current, &ino);
      if (s.code() == StatusCode::kAlreadyExists) continue;
      if (!s.ok()) return s;
    }
    const SimFs::Inode* in = fs.Get(ino);
    if (!in->regular || in->owner != uid_) {
      return Status(StatusCode::kPermissionDenied,
                    "spool segment " + current + " is not a regular file owned by uid " +
                        std::to_string(uid_));
    }
    segment::Header header;
    Status s = in->data.size() < segment::kHeaderBytes
                   ? Status(StatusCode::kCorruption, "segment header truncated")
                   : segment::DecodeHeader(
                         std::span<const std::byte, segment::kHeaderBytes>(in->data.data(),
                                                                           segment::kHeaderBytes),
                         &header);
    if (s.ok() && !header.sealed()) {
      ino_ = ino;
      fs.Ref(ino_);
      wb_err_seen_ = in->wb_err;
      open_ = true;
      open_segment_id_ = header.segment_id;
      return Status::Ok();
    }
    const uint64_t id = s.ok() ? header.segment_id : rng_->Next();
    SimFs::Ino named;
    if (fs.Lookup(kSpoolDir, current, &named) && named == ino) {
      (void)fs.Rename(Actor::kClient, kSpoolDir, current, kSpoolDir,
                      segment::SpoolSealedName(uid_, id), false);
      node_->spool_changed = true;
    }
  }
  return Status(StatusCode::kIoError, "could not open a writable current spool segment " + current);
}

Status SimSpoolWriter::RollOver() {
  SimFs& fs = node_->fs;
  const SimFs::Ino mine = ino_;
  const std::string sealed_name = segment::SpoolSealedName(uid_, open_segment_id_);
  const std::string current = segment::SpoolCurrentName(uid_);
  fs.Ref(mine);  // held while we look at it
  Close();
  Status result = Status::Ok();
  SimFs::Ino named;
  if (fs.Lookup(kSpoolDir, current, &named) && named == mine) {
    if (int err = fs.Rename(Actor::kClient, kSpoolDir, current, kSpoolDir, sealed_name, false);
        err != 0) {
      result = Status::FromErrno(err, "rename spool segment to " + sealed_name);
    } else {
      node_->spool_changed = true;
      SimFs::Ino reopened;
      if (fs.Lookup(kSpoolDir, sealed_name, &reopened) && reopened == mine) {
        SimFs::Inode* in = fs.Get(mine);
        if (in->shared_locks > 0) {
          result = Status(StatusCode::kTimedOut, "segment lock not had in time");
        } else if (in->data.size() >= segment::kFlagsOffset + 4) {
          const uint32_t flags = LoadLe32(in->data.data() + segment::kFlagsOffset);
          if ((flags & segment::kFlagSealed) == 0) {
            std::byte raw[4];
            StoreLe32(raw, flags | segment::kFlagSealed);
            const int64_t w = fs.Write(Actor::kClient, mine, segment::kFlagsOffset, std::span(raw));
            if (w != 4) {
              result = Status(StatusCode::kIoError, "seal segment");
            } else if (int sync_err = fs.Sync(Actor::kClient, mine); sync_err != 0) {
              result = Status::FromErrno(sync_err, "sync sealed segment");
            }
          }
        }
      }
    }
  }
  fs.Unref(mine);
  return result;
}

Status SimSpoolWriter::Prepare(size_t bytes) {
  assert(!locked_);
  SimFs& fs = node_->fs;
  for (int attempt = 0; attempt < kReopenAttemptsMax; ++attempt) {
    if (!open_) {
      if (Status s = OpenCurrent(); !s.ok()) return s;
    }
    if (!StillCurrent()) {
      Close();
      continue;
    }
    SimFs::Inode* in = fs.Get(ino_);
    if (in->data.size() > segment::kHeaderBytes &&
        in->data.size() + bytes > options_.segment_bytes_max) {
      if (Status s = RollOver(); !s.ok() && s.code() != StatusCode::kTimedOut) return s;
      continue;
    }
    // AppendToSegment: the shared lock (never contended for long: only a
    // seal takes it exclusively, for a moment), then the checks under it.
    ++in->shared_locks;
    locked_ = true;
    if (in->data.size() < segment::kFlagsOffset + 4) {
      --in->shared_locks;
      locked_ = false;
      return Status(StatusCode::kCorruption, "segment shorter than its header");
    }
    const uint32_t flags = LoadLe32(in->data.data() + segment::kFlagsOffset);
    if ((flags & segment::kFlagSealed) != 0 || !StillCurrent()) {
      --in->shared_locks;
      locked_ = false;
      Close();
      continue;
    }
    return Status::Ok();
  }
  return Status(StatusCode::kSealed, "current spool segment kept being sealed; gave up");
}

Status SimSpoolWriter::Commit(std::span<const std::byte> records, size_t* written) {
  assert(locked_);
  SimFs& fs = node_->fs;
  Status s;
  const size_t before = fs.Get(ino_)->data.size();
  const int64_t w = fs.Write(Actor::kClient, ino_, SimFs::kAppend, records);
  node_->spool_changed = true;
  // What landed, also when the write failed (a torn write lands a prefix).
  if (written != nullptr) *written = fs.Get(ino_)->data.size() - before;
  if (w < 0) {
    s = Status::FromErrno(static_cast<int>(-w), "append to segment");
  } else if (static_cast<size_t>(w) != records.size()) {
    s = Status(StatusCode::kNoSpace, "short write to segment");
  } else if (options_.sync) {
    if (int err = fs.Sync(Actor::kClient, ino_, &wb_err_seen_); err != 0) {
      s = Status::FromErrno(err, "sync segment");
    }
  }
  --fs.Get(ino_)->shared_locks;
  locked_ = false;
  return s;
}

size_t SimSpoolWriter::Abort(std::span<const std::byte> records, size_t torn) {
  size_t written = 0;
  if (locked_ && torn > 0) {
    const size_t before = node_->fs.Get(ino_)->data.size();
    (void)node_->fs.Write(Actor::kClient, ino_, SimFs::kAppend, records.first(torn));
    node_->spool_changed = true;
    written = node_->fs.Get(ino_)->data.size() - before;
  }
  Close();
  return written;
}

Status SimSpoolWriter::Append(std::span<const std::byte> records) {
  if (Status s = Prepare(records.size()); !s.ok()) return s;
  return Commit(records);
}

}  // namespace postspool::sim
