// The per-uid shared-memory ring: its byte layout, the producer's append
// and the daemon's lane reader. FORMAT.md ("The shared-memory ring") is the
// specification; this file must agree with it.
//
// A ring is one System V shared memory segment, created by the daemon and
// attached by the daemon and by every process of its uid that asked the
// daemon for it (its size is fixed: nobody can shrink it under a reader).
// It holds lane_count single-producer lanes. Every process of that uid can
// write every byte of it, so each side treats what the other writes as
// hostile: the producer keeps its own copy of its tail and checks the head
// it reads; the daemon keeps its own read cursor, copies a record out of
// shared memory before it looks at it, and checks every index, length and
// checksum of the copy.
//
// Nothing here does I/O or a system call (the doorbell's futex wake is the
// caller's).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace postspool::ring {

inline constexpr uint64_t kMagic = 0x31304752535350ull;  // bytes "PSSRG01\0"
inline constexpr uint32_t kVersion = 1;
inline constexpr size_t kHeaderBytes = 4096;
inline constexpr size_t kLaneHeaderBytes = 128;
inline constexpr uint32_t kLanesMin = 1;
inline constexpr uint32_t kLanesMax = 4096;
inline constexpr uint32_t kLaneBytesMin = 4096;
inline constexpr uint32_t kLaneBytesMax = 16u << 20;
// A lane stops short of its end with a wrap marker when the next record
// does not fit there: [u64 0][u32 "PSWR"][u32 0]. Fewer than 16 bytes left
// before the end are skipped without one.
inline constexpr uint32_t kWrapMarker = 0x52575350;  // bytes "PSWR"
inline constexpr size_t kWrapBytes = 16;

// Header fields (byte offsets; little-endian, naturally aligned).
inline constexpr size_t kOffMagic = 0;         // u64
inline constexpr size_t kOffVersion = 8;       // u32
inline constexpr size_t kOffLaneCount = 12;    // u32
inline constexpr size_t kOffLaneBytes = 16;    // u32: data bytes of a lane, a power of two
inline constexpr size_t kOffUid = 20;          // u32: whose ring it is
inline constexpr size_t kOffDurability = 24;   // u32: 0 accepted, 1 synced (the daemon's)
inline constexpr size_t kOffFull = 28;         // u32: 1 = the daemon takes no more of this uid's posts (quota)
// u64: posts that processes of the uid could not make (a shim over its
// budget, a failed post), added by producers, taken (exchanged to 0) by the
// daemon. Bytes 32..39 were zero and unread before, so the version stays 1:
// an older daemon leaves the word alone, an older client never adds to it.
inline constexpr size_t kOffDropped = 32;
inline constexpr size_t kOffDoorbell = 64;     // u32 futex word: 1 = the daemon sleeps
// Lane header fields (offsets from the lane's start).
inline constexpr size_t kLaneOwner = 0;   // u64: 0 free, else an Identity
inline constexpr size_t kLaneTail = 8;    // u64: bytes the producer published (release)
inline constexpr size_t kLaneState = 16;  // u32: kLaneBroken once the daemon found damage
inline constexpr size_t kLaneHead = 64;   // u64: bytes the daemon journaled (release)

inline constexpr uint32_t kLaneOk = 0;
inline constexpr uint32_t kLaneBroken = 1;

inline constexpr uint32_t kDurabilityAccepted = 0;
inline constexpr uint32_t kDurabilitySynced = 1;

// A lane owner: pid (22 bits: Linux pids are below 2^22) and the process's
// start time in clock ticks since boot (41 bits), so that a reused pid is a
// different owner; bit 63 set when the owner released the lane (closed its
// client) and the daemon may reclaim it once drained.
inline constexpr uint64_t kReleasedBit = 1ull << 63;
constexpr uint64_t MakeIdentity(pid_t pid, uint64_t start_ticks) {
  return ((start_ticks & ((1ull << 41) - 1)) << 22) | (static_cast<uint64_t>(pid) & ((1u << 22) - 1));
}
constexpr pid_t IdentityPid(uint64_t identity) { return static_cast<pid_t>(identity & ((1u << 22) - 1)); }
constexpr uint64_t IdentityStart(uint64_t identity) { return (identity >> 22) & ((1ull << 41) - 1); }

// The state letter (field 3) and start time in clock ticks (field 22) of a
// process, from the text of its /proc/<pid>/stat (NUL-terminated); false if
// the text does not have them. The command (field 2) may hold spaces and
// parentheses: fields are counted from the last ")".
bool ParseProcStat(const char* stat, char* state, uint64_t* start_ticks);

constexpr uint64_t RingBytes(uint32_t lane_count, uint32_t lane_bytes) {
  return kHeaderBytes + uint64_t{lane_count} * (kLaneHeaderBytes + lane_bytes);
}

// A view of a mapped ring. The geometry is read once, checked against the
// mapping's size, and kept here: later scribbles over the header cannot
// move a lane outside the mapping.
class Ring {
 public:
  Ring() = default;
  // Writes a fresh header and zeroes every lane header (the daemon, on a
  // ring it just created). `mem` must be RingBytes(...) long and
  // page-aligned.
  static void Format(std::span<std::byte> mem, uint32_t lane_count, uint32_t lane_bytes,
                     uint32_t uid, uint32_t durability);
  // Checks the header of a mapped ring; false (with the reason) unless the
  // magic, version and geometry are right and fit `mem`.
  static bool Open(std::span<std::byte> mem, Ring* out, std::string* why);

  // Rewrites the header's fixed fields from this view's geometry (the
  // daemon, before handing the ring to a process: a process of the uid may
  // have written over them). Lanes, doorbell and durability are untouched.
  void RepairHeader(uint32_t uid) const;

  bool valid() const { return base_ != nullptr; }
  uint32_t lane_count() const { return lane_count_; }
  uint32_t lane_bytes() const { return lane_bytes_; }
  std::byte* base() const { return base_; }

  std::atomic_ref<uint32_t> doorbell() const { return U32(kOffDoorbell); }
  std::atomic_ref<uint32_t> durability() const { return U32(kOffDurability); }
  std::atomic_ref<uint32_t> full() const { return U32(kOffFull); }
  std::atomic_ref<uint64_t> dropped() const { return U64(kOffDropped); }
  std::atomic_ref<uint64_t> owner(uint32_t lane) const { return U64(LaneOffset(lane) + kLaneOwner); }
  std::atomic_ref<uint64_t> tail(uint32_t lane) const { return U64(LaneOffset(lane) + kLaneTail); }
  std::atomic_ref<uint64_t> head(uint32_t lane) const { return U64(LaneOffset(lane) + kLaneHead); }
  std::atomic_ref<uint32_t> state(uint32_t lane) const { return U32(LaneOffset(lane) + kLaneState); }
  std::byte* data(uint32_t lane) const { return base_ + LaneOffset(lane) + kLaneHeaderBytes; }

 private:
  size_t LaneOffset(uint32_t lane) const {
    return kHeaderBytes + size_t{lane} * (kLaneHeaderBytes + lane_bytes_);
  }
  std::atomic_ref<uint64_t> U64(size_t off) const {
    return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(base_ + off));
  }
  std::atomic_ref<uint32_t> U32(size_t off) const {
    return std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(base_ + off));
  }

  std::byte* base_ = nullptr;
  uint32_t lane_count_ = 0;
  uint32_t lane_bytes_ = 0;
};

// ---------------------------------------------------------------------------
// Producer (libpostspool)

// Claims a free lane for `identity` by compare-and-swap of its owner word,
// starting the search at `hint`. The lane's tail is taken as the
// producer's starting point (*tail); false when every lane is taken (or
// the free ones look damaged).
bool ClaimLane(const Ring& ring, uint64_t identity, uint32_t hint, uint32_t* lane, uint64_t* tail);
// Marks the lane released: the daemon frees it once it has drained it.
void ReleaseLane(const Ring& ring, uint32_t lane, uint64_t identity);

enum class AppendResult {
  kAppended,  // published: the record is in the ring
  kFull,      // no room until the daemon drains: try the next transport
  kBroken,    // the lane is damaged or no longer ours: drop it, claim another later
  kTooBig,    // the record is larger than half a lane: use the socket
};
// Appends one framed record (segment::AppendRecord's output) to a lane the
// caller owns, at its own copy of the tail (*tail, advanced on success),
// and publishes it by one release-store of the lane's tail. The caller
// rings the doorbell afterwards (NeedsDoorbell).
AppendResult Append(const Ring& ring, uint32_t lane, uint64_t* tail, std::span<const std::byte> record);
// After an Append: true when the daemon said it sleeps and this caller took
// the doorbell (exchanged it to 0): it must then FUTEX_WAKE the doorbell
// word. One load while the daemon is awake.
bool TakeDoorbell(const Ring& ring);

// Adds `count` to the ring's dropped-posts word (one atomic add; the sum
// wraps at 2^64, which the daemon's clamp makes harmless).
void AddDropped(const Ring& ring, uint64_t count);

// ---------------------------------------------------------------------------
// Daemon

// The most posts one take of the dropped-posts word counts: every process
// of the uid can write the word, so its value is a claim, not a fact.
inline constexpr uint64_t kDroppedPerTakeMax = 1u << 20;
// Takes the ring's dropped-posts word (exchanges it to 0) and returns it
// clamped to kDroppedPerTakeMax.
uint64_t TakeDropped(const Ring& ring);

enum class ReadResult {
  kRecord,   // *payload is the next post's payload, in *buffer
  kEmpty,    // *read reached `tail`
  kDamaged,  // the bytes between *read and `tail` are not records; *why says what
};
// The lane's published tail, if it is sane for a reader at `read` whose
// lane head is `head` (read <= tail, tail - head <= lane_bytes, 8-byte
// aligned); else false.
bool LoadTail(const Ring& ring, uint32_t lane, uint64_t head, uint64_t read, uint64_t* tail);
// Reads the record at *read (< tail, from LoadTail): copies it out of shared
// memory into *buffer first, then checks its framing and checksum on the
// copy; skips a wrap to the next lap. Advances *read past the record.
ReadResult ReadRecord(const Ring& ring, uint32_t lane, uint64_t* read, uint64_t tail,
                      std::vector<std::byte>* buffer, std::span<const std::byte>* payload,
                      const char** why);

}  // namespace postspool::ring
