#include "sim_rings.h"

#include <cstring>

namespace postspool::sim {

ring::Ring SimRingStore::Get(uid_t uid) const {
  ring::Ring r;
  auto it = rings_.find(uid);
  if (it == rings_.end()) return r;
  std::string why;
  if (!ring::Ring::Open(std::span(reinterpret_cast<std::byte*>(it->second.words.get()), it->second.bytes),
                        &r, &why)) {
    return ring::Ring();
  }
  return r;
}

ring::Ring SimRingStore::Create(uid_t uid, uint32_t lane_count, uint32_t lane_bytes,
                                uint32_t durability) {
  if (rings_.count(uid) == 0) {
    Mem m;
    m.bytes = ring::RingBytes(lane_count, lane_bytes);
    // ftruncate: zeroes.
    m.words = std::make_unique<uint64_t[]>(m.bytes / 8);
    ring::Ring::Format(std::span(reinterpret_cast<std::byte*>(m.words.get()), m.bytes), lane_count,
                       lane_bytes, uid, durability);
    rings_[uid] = std::move(m);
  }
  return Get(uid);
}

std::vector<uid_t> SimRingStore::uids() const {
  std::vector<uid_t> out;
  for (const auto& [uid, m] : rings_) out.push_back(uid);
  return out;
}

std::span<std::byte> SimRingStore::Memory(uid_t uid) {
  auto it = rings_.find(uid);
  if (it == rings_.end()) return {};
  return std::span(reinterpret_cast<std::byte*>(it->second.words.get()), it->second.bytes);
}

SimRingPort::SimRingPort(const daemon::Config& config, SimRingStore* store)
    : config_(config), store_(store) {
  const uint32_t durability = config_.durability == daemon::Durability::kSynced
                                  ? ring::kDurabilitySynced
                                  : ring::kDurabilityAccepted;
  for (uid_t uid : store_->uids()) {
    if (entries_.size() >= config_.ring_uids_max) break;
    Entry e;
    e.uid = uid;
    e.ring = store_->Get(uid);
    if (!e.ring.valid()) continue;
    e.ring.durability().store(durability, std::memory_order_relaxed);
    e.ring.doorbell().store(0, std::memory_order_relaxed);
    entries_.push_back(e);
  }
}

Status SimRingPort::ForUid(uid_t uid, int* shm_id) {
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].uid == uid) {
      *shm_id = static_cast<int>(1000 + i);  // the simulated client finds it by uid (SimNode)
      return Status::Ok();
    }
  }
  if (entries_.size() >= config_.ring_uids_max) {
    return Status(StatusCode::kUnsupported, "ring_uids_max rings exist");
  }
  const uint32_t durability = config_.durability == daemon::Durability::kSynced
                                  ? ring::kDurabilitySynced
                                  : ring::kDurabilityAccepted;
  Entry e;
  e.uid = uid;
  e.ring = store_->Create(uid, config_.ring_lanes, config_.ring_lane_bytes, durability);
  e.ring.durability().store(durability, std::memory_order_relaxed);
  e.ring.doorbell().store(0, std::memory_order_relaxed);
  entries_.push_back(e);
  *shm_id = static_cast<int>(1000 + entries_.size() - 1);
  return Status::Ok();
}

void SimRingPort::Sleep() {
  asleep_ = true;
  rung_ = false;
  ++sleeps_;
  if (on_sleep_) on_sleep_();
}

}  // namespace postspool::sim
