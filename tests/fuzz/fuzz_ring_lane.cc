// Fuzz target: the daemon's lane reader (format/ring_format.h) on ring
// memory that a hostile process of the ring's uid wrote.
//
// Input: four control bytes, then the bytes laid over the ring.
//   [0] bit 0: raw — the bytes are the whole ring from offset 0 (header
//       included: Ring::Open must refuse what is not a ring); otherwise a
//       ring is formatted first and the bytes cover it from the first lane
//       header on (owner, tail, state and head words, and the lanes' data).
//       bit 1: after a lane reads to its end, its owner appends one more
//       record (ring::Append at the tail the daemon reached), which must
//       read back unchanged.
//   [1] lanes: 1 + [1] % 4.   [2] lane bytes: 4096 << ([2] % 2).   [3] unused.
// The mapping is exactly RingBytes(lanes, lane bytes) long, so ASan sees a
// read past it; while one lane is read everything else in the mapping is
// poisoned (ASan builds), so a read outside that lane traps too.
//
// Per lane, as Ingest::DrainLane does: the cursor starts at the lane's head
// word, LoadTail, then ReadRecord until empty or damaged, VerifyPostPayload
// on every payload. Invariants: the cursor only moves forward and never
// past the tail; every kRecord's copy passes segment::CheckFrame with the
// payload's length; the number of steps is bounded by the lane's size.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "post.h"
#include "ring_format.h"
#include "segment_format.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define POSTSPOOL_FUZZ_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define POSTSPOOL_FUZZ_ASAN 1
#endif
#ifdef POSTSPOOL_FUZZ_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace {

namespace ring = postspool::ring;
namespace segment = postspool::segment;

// Poisons the mapping except lane `lane` (its header and data) for the
// life of the object.
class OnlyLane {
 public:
  OnlyLane(std::span<std::byte> mem, const ring::Ring& r, uint32_t lane) : mem_(mem) {
    lo_ = static_cast<size_t>(r.data(lane) - mem.data()) - ring::kLaneHeaderBytes;
    hi_ = lo_ + ring::kLaneHeaderBytes + r.lane_bytes();
    POISON(mem.data(), lo_);
    POISON(mem.data() + hi_, mem.size() - hi_);
  }
  ~OnlyLane() { UNPOISON(mem_.data(), mem_.size()); }

 private:
  std::span<std::byte> mem_;
  size_t lo_ = 0, hi_ = 0;
};

// One lane as the daemon reads it; returns where the reader stopped, or
// false if the lane is damaged.
bool ReadLane(const ring::Ring& r, uint32_t lane, uint64_t head, uint64_t* read,
              std::vector<std::byte>* buffer, std::vector<std::vector<std::byte>>* payloads) {
  uint64_t tail = 0;
  if (!ring::LoadTail(r, lane, head, *read, &tail)) return false;
  FUZZ_CHECK(tail >= *read && tail >= head && tail - head <= r.lane_bytes());
  // Every record or wrap moves the cursor by at least 8 bytes (a wrap by
  // the rest of a lap), and the cursor never passes the tail.
  const uint64_t steps_max = r.lane_bytes() / 8 + 2;
  for (uint64_t step = 0;; ++step) {
    FUZZ_CHECK(step <= steps_max);
    const uint64_t before = *read;
    std::span<const std::byte> payload;
    const char* why = nullptr;
    const ring::ReadResult rr = ring::ReadRecord(r, lane, read, tail, buffer, &payload, &why);
    FUZZ_CHECK(*read >= before);
    FUZZ_CHECK(*read <= tail);
    if (rr == ring::ReadResult::kEmpty) {
      FUZZ_CHECK(*read == tail);
      return true;
    }
    if (rr == ring::ReadResult::kDamaged) {
      FUZZ_CHECK(why != nullptr && why[0] != '\0');
      return false;
    }
    FUZZ_CHECK(rr == ring::ReadResult::kRecord);
    FUZZ_CHECK(*read > before);
    // The payload is in the reader's own copy, and the copy is one whole,
    // checked record.
    FUZZ_CHECK(payload.size() <= segment::kRecordPayloadMax);
    FUZZ_CHECK(payload.data() >= buffer->data() &&
               payload.data() + payload.size() <= buffer->data() + buffer->size());
    uint32_t length = 0;
    FUZZ_CHECK(segment::CheckFrame(*buffer, segment::kRecordPayloadMax, &length) ==
               segment::FrameCheck::kValid);
    FUZZ_CHECK(length == payload.size());
    FUZZ_CHECK(buffer->size() == segment::RecordBytes(length));
    (void)postspool::VerifyPostPayload(payload);
    if (payloads != nullptr) payloads->emplace_back(payload.begin(), payload.end());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const bool raw = (data[0] & 1) != 0;
  const bool append_after = (data[0] & 2) != 0;
  const uint32_t lanes = 1 + data[1] % 4;
  const uint32_t lane_bytes = 4096u << (data[2] % 2);
  const std::span<const uint8_t> overlay(data + 4, size - 4);

  const size_t bytes = ring::RingBytes(lanes, lane_bytes);
  std::vector<uint64_t> words(bytes / 8);  // exactly the mapping, 8-byte aligned
  const std::span<std::byte> mem(reinterpret_cast<std::byte*>(words.data()), bytes);
  size_t at = 0;
  if (!raw) {
    ring::Ring::Format(mem, lanes, lane_bytes, 1000, ring::kDurabilityAccepted);
    at = ring::kHeaderBytes;
  }
  std::memcpy(mem.data() + at, overlay.data(), std::min(overlay.size(), bytes - at));

  ring::Ring r;
  std::string why;
  if (!ring::Ring::Open(mem, &r, &why)) {
    FUZZ_CHECK(!r.valid() && !why.empty());
    return 0;
  }
  FUZZ_CHECK(r.lane_count() >= 1 && r.lane_count() <= ring::kLanesMax);
  FUZZ_CHECK(ring::RingBytes(r.lane_count(), r.lane_bytes()) <= bytes);

  std::vector<std::byte> buffer;
  for (uint32_t lane = 0; lane < r.lane_count(); ++lane) {
    OnlyLane only(mem, r, lane);
    // Where an earlier daemon left off (Ingest::SyncRingCursors).
    const uint64_t head = r.head(lane).load(std::memory_order_relaxed);
    uint64_t read = head;
    if (!ReadLane(r, lane, head, &read, &buffer, nullptr) || !append_after) continue;
    // The daemon journaled it all: the head moves, and the lane's owner
    // appends one more record where the tail is.
    r.head(lane).store(read, std::memory_order_relaxed);
    std::vector<std::byte> payload(overlay.size() % 300);
    for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::byte>(i * 31 + lane);
    std::vector<std::byte> record;
    FUZZ_CHECK(segment::AppendRecord(payload, &record).ok());
    uint64_t tail = read;
    if (ring::Append(r, lane, &tail, record) != ring::AppendResult::kAppended) continue;
    FUZZ_CHECK(tail > read && tail - read <= record.size() + ring::kWrapBytes + r.lane_bytes());
    FUZZ_CHECK(r.tail(lane).load(std::memory_order_relaxed) == tail);
    std::vector<std::vector<std::byte>> got;
    FUZZ_CHECK(ReadLane(r, lane, read, &read, &buffer, &got));
    FUZZ_CHECK(got.size() == 1 && got[0] == payload);
    FUZZ_CHECK(read == tail);
  }

  // A producer's claim over the same lanes: a lane it gets is drained,
  // sane and its own; one it does not trust it hands back to the daemon.
  uint32_t lane = 0;
  uint64_t tail = 0;
  const uint64_t identity = ring::MakeIdentity(4242, 777);
  if (ring::ClaimLane(r, identity, data[3], &lane, &tail)) {
    FUZZ_CHECK(lane < r.lane_count());
    FUZZ_CHECK(r.owner(lane).load(std::memory_order_relaxed) == identity);
    FUZZ_CHECK(r.head(lane).load(std::memory_order_relaxed) == tail);
    FUZZ_CHECK(tail % segment::kRecordAlign == 0);
    FUZZ_CHECK(r.state(lane).load(std::memory_order_relaxed) == ring::kLaneOk);
  }
  return 0;
}
