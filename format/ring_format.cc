#include "ring_format.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "little_endian.h"
#include "segment_format.h"

namespace postspool::ring {
namespace {

constexpr bool IsPowerOfTwo(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

bool ParseProcStat(const char* stat, char* state, uint64_t* start_ticks) {
  const char* p = std::strrchr(stat, ')');
  if (p == nullptr || p[1] != ' ' || p[2] == '\0') return false;
  *state = p[2];
  int field = 2;
  for (++p; *p != '\0' && field < 22; ++p) {
    if (*p == ' ') ++field;
  }
  if (field < 22 || *p < '0' || *p > '9') return false;
  *start_ticks = std::strtoull(p, nullptr, 10);
  return true;
}

void Ring::Format(std::span<std::byte> mem, uint32_t lane_count, uint32_t lane_bytes, uint32_t uid,
                  uint32_t durability) {
  std::memset(mem.data(), 0, kHeaderBytes);
  Ring r;
  r.base_ = mem.data();
  r.lane_count_ = lane_count;
  r.lane_bytes_ = lane_bytes;
  for (uint32_t i = 0; i < lane_count; ++i) {
    std::memset(mem.data() + r.LaneOffset(i), 0, kLaneHeaderBytes);
  }
  r.U32(kOffVersion).store(kVersion, std::memory_order_relaxed);
  r.U32(kOffLaneCount).store(lane_count, std::memory_order_relaxed);
  r.U32(kOffLaneBytes).store(lane_bytes, std::memory_order_relaxed);
  r.U32(kOffUid).store(uid, std::memory_order_relaxed);
  r.U32(kOffDurability).store(durability, std::memory_order_relaxed);
  // The magic last: a ring whose formatting was interrupted is not a ring.
  r.U64(kOffMagic).store(kMagic, std::memory_order_release);
}

void Ring::RepairHeader(uint32_t uid) const {
  if (U64(kOffMagic).load(std::memory_order_acquire) == kMagic &&
      U32(kOffVersion).load(std::memory_order_relaxed) == kVersion &&
      U32(kOffLaneCount).load(std::memory_order_relaxed) == lane_count_ &&
      U32(kOffLaneBytes).load(std::memory_order_relaxed) == lane_bytes_ &&
      U32(kOffUid).load(std::memory_order_relaxed) == uid) {
    return;
  }
  U32(kOffVersion).store(kVersion, std::memory_order_relaxed);
  U32(kOffLaneCount).store(lane_count_, std::memory_order_relaxed);
  U32(kOffLaneBytes).store(lane_bytes_, std::memory_order_relaxed);
  U32(kOffUid).store(uid, std::memory_order_relaxed);
  U64(kOffMagic).store(kMagic, std::memory_order_release);
}

void AddDropped(const Ring& ring, uint64_t count) {
  if (count != 0) ring.dropped().fetch_add(count, std::memory_order_relaxed);
}

uint64_t TakeDropped(const Ring& ring) {
  // One load first: the common case (nothing dropped) writes nothing.
  if (ring.dropped().load(std::memory_order_relaxed) == 0) return 0;
  return std::min(ring.dropped().exchange(0, std::memory_order_relaxed), kDroppedPerTakeMax);
}

bool Ring::Open(std::span<std::byte> mem, Ring* out, std::string* why) {
  *out = Ring();
  if (mem.size() < kHeaderBytes || reinterpret_cast<uintptr_t>(mem.data()) % 8 != 0) {
    *why = "shorter than a ring header";
    return false;
  }
  Ring r;
  r.base_ = mem.data();
  if (r.U64(kOffMagic).load(std::memory_order_acquire) != kMagic) {
    *why = "not a postspool ring (bad magic)";
    return false;
  }
  if (r.U32(kOffVersion).load(std::memory_order_relaxed) != kVersion) {
    *why = "unsupported ring version";
    return false;
  }
  const uint32_t lanes = r.U32(kOffLaneCount).load(std::memory_order_relaxed);
  const uint32_t lane_bytes = r.U32(kOffLaneBytes).load(std::memory_order_relaxed);
  if (lanes < kLanesMin || lanes > kLanesMax || lane_bytes < kLaneBytesMin ||
      lane_bytes > kLaneBytesMax || !IsPowerOfTwo(lane_bytes)) {
    *why = "bad ring geometry";
    return false;
  }
  if (RingBytes(lanes, lane_bytes) > mem.size()) {
    *why = "ring shorter than its geometry";
    return false;
  }
  r.lane_count_ = lanes;
  r.lane_bytes_ = lane_bytes;
  *out = r;
  return true;
}

// ---------------------------------------------------------------------------
// Producer

bool ClaimLane(const Ring& ring, uint64_t identity, uint32_t hint, uint32_t* lane, uint64_t* tail) {
  const uint32_t n = ring.lane_count();
  for (uint32_t k = 0; k < n; ++k) {
    const uint32_t i = (hint + k) % n;
    uint64_t expected = 0;
    if (ring.owner(i).load(std::memory_order_relaxed) != 0) continue;
    if (!ring.owner(i).compare_exchange_strong(expected, identity, std::memory_order_acq_rel)) {
      continue;
    }
    // A free lane is drained: head == tail, nothing broken. One that is not
    // (scribbled over) is left for the daemon to notice.
    const uint64_t h = ring.head(i).load(std::memory_order_acquire);
    const uint64_t t = ring.tail(i).load(std::memory_order_relaxed);
    if (h != t || t % segment::kRecordAlign != 0 ||
        ring.state(i).load(std::memory_order_relaxed) != kLaneOk) {
      ring.owner(i).store(identity | kReleasedBit, std::memory_order_release);
      continue;
    }
    *lane = i;
    *tail = t;
    return true;
  }
  return false;
}

void ReleaseLane(const Ring& ring, uint32_t lane, uint64_t identity) {
  uint64_t expected = identity;
  ring.owner(lane).compare_exchange_strong(expected, identity | kReleasedBit,
                                           std::memory_order_acq_rel);
}

AppendResult Append(const Ring& ring, uint32_t lane, uint64_t* tail,
                    std::span<const std::byte> record) {
  const uint64_t size = ring.lane_bytes();
  if (record.size() > size / 2 || record.size() % segment::kRecordAlign != 0) {
    return AppendResult::kTooBig;
  }
  if (ring.state(lane).load(std::memory_order_relaxed) != kLaneOk) return AppendResult::kBroken;
  const uint64_t head = ring.head(lane).load(std::memory_order_acquire);
  const uint64_t t = *tail;
  if (head > t || t - head > size) return AppendResult::kBroken;
  const uint64_t pos = t % size;
  const uint64_t to_end = size - pos;
  const uint64_t skip = to_end < record.size() ? to_end : 0;
  if (t + skip + record.size() - head > size) return AppendResult::kFull;
  std::byte* data = ring.data(lane);
  if (skip >= kWrapBytes) {
    std::byte wrap[kWrapBytes] = {};
    StoreLe32(wrap + 8, kWrapMarker);
    std::memcpy(data + pos, wrap, kWrapBytes);
  }
  std::memcpy(data + (t + skip) % size, record.data(), record.size());
  *tail = t + skip + record.size();
  ring.tail(lane).store(*tail, std::memory_order_release);
  return AppendResult::kAppended;
}

bool TakeDoorbell(const Ring& ring) {
  // The tail's store and this load must not be reordered (the daemon sets
  // the doorbell, then looks at the tails: one of the two sides sees the
  // other's store).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (ring.doorbell().load(std::memory_order_relaxed) == 0) return false;
  return ring.doorbell().exchange(0, std::memory_order_acq_rel) != 0;
}

// ---------------------------------------------------------------------------
// Daemon

bool LoadTail(const Ring& ring, uint32_t lane, uint64_t head, uint64_t read, uint64_t* tail) {
  const uint64_t t = ring.tail(lane).load(std::memory_order_acquire);
  if (t < read || t < head || t - head > ring.lane_bytes() || t % segment::kRecordAlign != 0) {
    return false;
  }
  *tail = t;
  return true;
}

ReadResult ReadRecord(const Ring& ring, uint32_t lane, uint64_t* read, uint64_t tail,
                      std::vector<std::byte>* buffer, std::span<const std::byte>* payload,
                      const char** why) {
  const uint64_t size = ring.lane_bytes();
  const std::byte* data = ring.data(lane);
  // At most one wrap before a record.
  for (int step = 0; step < 2; ++step) {
    if (*read >= tail) return ReadResult::kEmpty;
    const uint64_t pos = *read % size;
    const uint64_t to_end = size - pos;
    const uint64_t available = tail - *read;
    std::byte head[segment::kRecordHeaderBytes];
    bool wrap = to_end < kWrapBytes;
    if (!wrap) {
      if (available < segment::kRecordHeaderBytes) {
        *why = "the tail cuts a record header";
        return ReadResult::kDamaged;
      }
      std::memcpy(head, data + pos, sizeof head);
      wrap = LoadLe32(head + 8) == kWrapMarker;
    }
    if (wrap) {
      if (available <= to_end) {
        *why = "the tail points into a wrap";
        return ReadResult::kDamaged;
      }
      *read += to_end;
      continue;
    }
    if (LoadLe32(head + 8) != segment::kRecordMarker) {
      *why = "no record marker where a record starts";
      return ReadResult::kDamaged;
    }
    const uint32_t length = LoadLe32(head + 12);
    if (length > segment::kRecordPayloadMax) {
      *why = "record length above the maximum";
      return ReadResult::kDamaged;
    }
    const uint64_t bytes = segment::RecordBytes(length);
    if (bytes > to_end || bytes > available) {
      *why = "record runs past the lane's end or its tail";
      return ReadResult::kDamaged;
    }
    buffer->resize(bytes);
    std::memcpy(buffer->data(), data + pos, bytes);
    uint32_t checked = 0;
    if (segment::CheckFrame(*buffer, segment::kRecordPayloadMax, &checked) !=
            segment::FrameCheck::kValid ||
        checked != length) {
      *why = "record checksum mismatch";
      return ReadResult::kDamaged;
    }
    *payload = std::span<const std::byte>(*buffer).subspan(segment::kRecordHeaderBytes, length);
    *read += bytes;
    return ReadResult::kRecord;
  }
  *why = "a wrap right after a wrap";
  return ReadResult::kDamaged;
}

}  // namespace postspool::ring
