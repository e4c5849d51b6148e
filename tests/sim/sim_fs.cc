#include "sim_fs.h"

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>
#include <set>

namespace postspool::sim {

const char* ErrnoName(int err) {
  switch (err) {
    case 0: return "ok";
    case EIO: return "EIO";
    case ENOSPC: return "ENOSPC";
    case EEXIST: return "EEXIST";
    case ENOENT: return "ENOENT";
    default: return "errno";
  }
}

bool SimFs::Fault(uint32_t ppm, const char* kind) {
  if (!rng_.Ppm(ppm)) return false;
  stats_->Fault(kind);
  if (trace_) trace_(std::string("fault: ") + kind);
  return true;
}

bool SimFs::DaemonDies(Actor actor, const char* op, bool* lands) {
  *lands = false;
  if (actor != Actor::kDaemon) return false;
  if (daemon_dead_) return true;
  if (!rng_.Ppm(crash_ppm_)) return false;
  daemon_dead_ = true;
  crash_point_ = op;
  *lands = rng_.OneIn(2);
  return true;
}

SimFs::Ino SimFs::NewInode(uid_t owner, gid_t group, bool regular) {
  const Ino ino = next_ino_++;
  Inode& in = inodes_[ino];
  in.ino = ino;
  in.owner = owner;
  in.group = group;
  in.regular = regular;
  in.mtime_s = wall_s_;
  return ino;
}

void SimFs::Apply(const MetaOp& op, std::map<std::string, Ino>* dirs) {
  switch (op.kind) {
    case MetaOp::kLink: dirs[op.dir][op.name] = op.ino; break;
    case MetaOp::kUnlink: dirs[op.dir].erase(op.name); break;
    case MetaOp::kRename:
      dirs[op.dir].erase(op.name);
      dirs[op.to_dir][op.to] = op.ino;
      break;
  }
}

void SimFs::Record(MetaOp op) {
  // The page-cache directories change now; the durable ones at the next
  // directory fsync (or, in part, at a power loss).
  auto& d = dirs_[op.dir];
  switch (op.kind) {
    case MetaOp::kLink: {
      auto it = d.find(op.name);
      if (it != d.end()) --inodes_[it->second].links;
      d[op.name] = op.ino;
      ++inodes_[op.ino].links;
      break;
    }
    case MetaOp::kUnlink: {
      auto it = d.find(op.name);
      assert(it != d.end());
      --inodes_[it->second].links;
      d.erase(it);
      break;
    }
    case MetaOp::kRename: {
      d.erase(op.name);
      auto& t = dirs_[op.to_dir];
      auto it = t.find(op.to);
      if (it != t.end()) --inodes_[it->second].links;
      t[op.to] = op.ino;
      break;
    }
  }
  meta_pending_.push_back(std::move(op));
}

int SimFs::CreateUnnamed(Actor actor, uid_t owner, gid_t group, Ino* out) {
  bool lands;
  if (DaemonDies(actor, "fs.create", &lands)) return EIO;  // an unnamed file: nothing to keep
  if (Fault(rates_.meta_eio, "fs.create.eio")) return EIO;
  if (full_ || Fault(rates_.meta_enospc, "fs.create.enospc")) return ENOSPC;
  *out = NewInode(owner, group, true);
  return 0;
}

int SimFs::Create(Actor actor, DirId dir, const std::string& name, uid_t owner, gid_t group,
                  bool excl, bool regular, Ino* out) {
  bool lands;
  const bool dies = DaemonDies(actor, "fs.create", &lands);
  if (dies && !lands) return EIO;
  if (!dies) {
    if (Fault(rates_.meta_eio, "fs.create.eio")) return EIO;
    if (full_ || Fault(rates_.meta_enospc, "fs.create.enospc")) return ENOSPC;
  }
  if (excl && dirs_[dir].count(name) != 0) return EEXIST;
  const Ino ino = NewInode(owner, group, regular);
  Record(MetaOp{MetaOp::kLink, dir, name, dir, {}, ino});
  *out = ino;
  return dies ? EIO : 0;
}

int SimFs::Link(Actor actor, DirId dir, const std::string& name, Ino ino) {
  bool lands;
  const bool dies = DaemonDies(actor, "fs.link", &lands);
  if (dies && !lands) return EIO;
  if (!dies) {
    if (Fault(rates_.meta_eio, "fs.link.eio")) return EIO;
    if (Fault(rates_.meta_enospc, "fs.link.enospc")) return ENOSPC;
  }
  if (dirs_[dir].count(name) != 0) return EEXIST;
  Record(MetaOp{MetaOp::kLink, dir, name, dir, {}, ino});
  return dies ? EIO : 0;
}

int SimFs::Rename(Actor actor, DirId from_dir, const std::string& from, DirId to_dir,
                  const std::string& to, bool noreplace) {
  bool lands;
  const bool dies = DaemonDies(actor, "fs.rename", &lands);
  if (dies && !lands) return EIO;
  if (!dies && Fault(rates_.meta_eio, "fs.rename.eio")) return EIO;
  auto it = dirs_[from_dir].find(from);
  if (it == dirs_[from_dir].end()) return ENOENT;
  if (from_dir == to_dir && from == to) return 0;
  if (noreplace && dirs_[to_dir].count(to) != 0) return EEXIST;
  Record(MetaOp{MetaOp::kRename, from_dir, from, to_dir, to, it->second});
  return dies ? EIO : 0;
}

int SimFs::Unlink(Actor actor, DirId dir, const std::string& name) {
  bool lands;
  const bool dies = DaemonDies(actor, "fs.unlink", &lands);
  if (dies && !lands) return EIO;
  if (!dies && Fault(rates_.meta_eio, "fs.unlink.eio")) return EIO;
  if (dirs_[dir].count(name) == 0) return ENOENT;
  Record(MetaOp{MetaOp::kUnlink, dir, name, dir, {}, 0});
  return dies ? EIO : 0;
}

int SimFs::SyncDir(Actor actor) {
  bool lands;
  const bool dies = DaemonDies(actor, "fs.syncdir", &lands);
  if (dies && !lands) return EIO;
  if (!dies && Fault(rates_.sync_eio, "fs.syncdir.eio")) return EIO;
  for (const MetaOp& op : meta_pending_) Apply(op, durable_dirs_);
  meta_pending_.clear();
  return dies ? EIO : 0;
}

void SimFs::ApplyWrite(Inode* in, uint64_t offset, std::span<const std::byte> bytes) {
  if (bytes.empty()) return;
  if (in->data.size() < offset + bytes.size()) in->data.resize(offset + bytes.size());
  std::memcpy(in->data.data() + offset, bytes.data(), bytes.size());
  in->pending.push_back(PendingWrite{offset, std::vector<std::byte>(bytes.begin(), bytes.end())});
  in->mtime_s = wall_s_;
}

int64_t SimFs::Write(Actor actor, Ino ino, uint64_t offset, std::span<const std::byte> bytes) {
  Inode* in = Get(ino);
  assert(in != nullptr);
  if (offset == kAppend) offset = in->data.size();
  bool lands;
  if (DaemonDies(actor, "fs.write", &lands)) {
    if (lands) {
      const size_t n = rng_.OneIn(2) ? bytes.size() : rng_.Below(bytes.size() + 1);
      ApplyWrite(in, offset, bytes.first(n));
    }
    return -EIO;
  }
  const uint64_t end = offset + bytes.size();
  const uint64_t growth_blocks =
      end > in->data.size() ? (end + kBlockBytes - 1) / kBlockBytes -
                                  (in->data.size() + kBlockBytes - 1) / kBlockBytes
                            : 0;
  if (growth_blocks > 0 && (full_ || UsedBytes() + growth_blocks * kBlockBytes > capacity_)) {
    stats_->Fault("fs.write.disk_full");
    return -ENOSPC;
  }
  if (Fault(rates_.write_eio, "fs.write.eio")) return -EIO;
  if (Fault(rates_.write_enospc, "fs.write.enospc")) return -ENOSPC;
  if (bytes.size() > 1 && Fault(rates_.write_short, "fs.write.short")) {
    const size_t n = 1 + rng_.Below(bytes.size() - 1);
    ApplyWrite(in, offset, bytes.first(n));
    return static_cast<int64_t>(n);
  }
  if (bytes.size() > 1 && Fault(rates_.write_torn, "fs.write.torn")) {
    ApplyWrite(in, offset, bytes.first(1 + rng_.Below(bytes.size() - 1)));
    return -EIO;
  }
  ApplyWrite(in, offset, bytes);
  return static_cast<int64_t>(bytes.size());
}

int SimFs::Sync(Actor actor, Ino ino, uint32_t* seen) {
  Inode* in = Get(ino);
  assert(in != nullptr);
  bool lands;
  const bool dies = DaemonDies(actor, "fs.sync", &lands);
  if (dies && !lands) return EIO;
  if (!dies && Fault(rates_.sync_eio, "fs.sync.eio")) {
    // As Linux: the pages are marked clean; what they held never reaches
    // the disk, and the next fdatasync does not report it again.
    in->pending.clear();
    ++in->wb_err;
    if (seen != nullptr) *seen = in->wb_err;
    return EIO;
  }
  for (const PendingWrite& w : in->pending) {
    if (in->durable.size() < w.offset + w.bytes.size()) in->durable.resize(w.offset + w.bytes.size());
    std::memcpy(in->durable.data() + w.offset, w.bytes.data(), w.bytes.size());
  }
  in->pending.clear();
  if (seen != nullptr && *seen != in->wb_err) {
    *seen = in->wb_err;
    return EIO;
  }
  return dies ? EIO : 0;
}

int SimFs::Truncate(Actor actor, Ino ino, uint64_t size) {
  Inode* in = Get(ino);
  assert(in != nullptr);
  bool lands;
  const bool dies = DaemonDies(actor, "fs.truncate", &lands);
  if (dies && !lands) return EIO;
  if (!dies && Fault(rates_.meta_eio, "fs.truncate.eio")) return EIO;
  if (in->data.size() > size) in->data.resize(size);
  if (in->durable.size() > size) in->durable.resize(size);
  for (PendingWrite& w : in->pending) {
    if (w.offset >= size) {
      w.bytes.clear();
    } else if (w.offset + w.bytes.size() > size) {
      w.bytes.resize(size - w.offset);
    }
  }
  return dies ? EIO : 0;
}

int SimFs::ReadFault(Actor actor) {
  (void)actor;
  return Fault(rates_.read_eio, "fs.read.eio") ? EIO : 0;
}

bool SimFs::Lookup(DirId dir, const std::string& name, Ino* ino) const {
  auto it = dirs_[dir].find(name);
  if (it == dirs_[dir].end()) return false;
  *ino = it->second;
  return true;
}

SimFs::Inode* SimFs::Get(Ino ino) {
  auto it = inodes_.find(ino);
  return it == inodes_.end() ? nullptr : &it->second;
}

const SimFs::Inode* SimFs::Get(Ino ino) const {
  auto it = inodes_.find(ino);
  return it == inodes_.end() ? nullptr : &it->second;
}

std::vector<std::pair<std::string, SimFs::Ino>> SimFs::List(DirId dir) const {
  std::vector<std::pair<std::string, Ino>> out(dirs_[dir].begin(), dirs_[dir].end());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second < b.second : a.first < b.first;
  });
  return out;
}

void SimFs::Ref(Ino ino) { ++Get(ino)->refs; }

void SimFs::Unref(Ino ino) {
  Inode* in = Get(ino);
  assert(in != nullptr && in->refs > 0);
  --in->refs;
}

void SimFs::DropAllRefs() {
  for (auto& [ino, in] : inodes_) {
    in.refs = 0;
    in.shared_locks = 0;
  }
}

uint64_t SimFs::UsedBytes() const {
  uint64_t n = 0;
  for (const auto& [ino, in] : inodes_) {
    if (in.links > 0 || in.refs > 0) n += in.allocated();
  }
  return n;
}

void SimFs::Recount() {
  for (auto& [ino, in] : inodes_) in.links = 0;
  for (const auto& d : dirs_) {
    for (const auto& [name, ino] : d) ++inodes_[ino].links;
  }
}

void SimFs::PowerLoss() {
  const size_t keep = rng_.Below(meta_pending_.size() + 1);
  for (size_t i = 0; i < keep; ++i) Apply(meta_pending_[i], durable_dirs_);
  meta_pending_.clear();
  for (int d = 0; d < kDirCount; ++d) dirs_[d] = durable_dirs_[d];
  for (auto& [ino, in] : inodes_) {
    const size_t k = rng_.Below(in.pending.size() + 1);
    for (size_t i = 0; i < in.pending.size() && i <= k; ++i) {
      const PendingWrite& w = in.pending[i];
      size_t n = w.bytes.size();
      if (i == k) {
        if (!rng_.OneIn(3)) break;
        n = rng_.Below(n + 1);  // torn
      }
      if (in.durable.size() < w.offset + n) in.durable.resize(w.offset + n);
      std::memcpy(in.durable.data() + w.offset, w.bytes.data(), n);
    }
    in.pending.clear();
    in.data = in.durable;
  }
  DropAllRefs();
  Recount();
  Collect();
}

void SimFs::Collect() {
  std::set<Ino> durable;
  for (const auto& d : durable_dirs_) {
    for (const auto& [name, ino] : d) durable.insert(ino);
  }
  for (auto it = inodes_.begin(); it != inodes_.end();) {
    const Inode& in = it->second;
    if (in.links == 0 && in.refs == 0 && durable.count(it->first) == 0) {
      it = inodes_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace postspool::sim
