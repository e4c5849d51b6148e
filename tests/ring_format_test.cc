// The per-uid shared-memory ring's bytes (format/ring_format.h): the
// header and its checks, the producer's claim/append/doorbell, the daemon's
// lane reader, and what the reader makes of damage.
#include "ring_format.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "little_endian.h"
#include "segment_format.h"

namespace postspool::ring {
namespace {

constexpr uint32_t kLaneBytes = 4096;

// A ring in memory, 8-byte aligned as a mapping is.
class RingMem {
 public:
  RingMem(uint32_t lanes, uint32_t lane_bytes, size_t extra = 0)
      : bytes_(RingBytes(lanes, lane_bytes) + extra), words_(new uint64_t[bytes_ / 8 + 1]()) {}
  std::span<std::byte> span() { return {reinterpret_cast<std::byte*>(words_.get()), bytes_}; }
  std::byte* at(size_t off) { return span().data() + off; }

 private:
  size_t bytes_;
  std::unique_ptr<uint64_t[]> words_;
};

// A framed record whose payload is `n` bytes of `fill`.
std::vector<std::byte> Record(size_t n, uint8_t fill) {
  std::vector<std::byte> payload(n, std::byte{fill});
  std::vector<std::byte> out;
  EXPECT_TRUE(segment::AppendRecord(payload, &out).ok());
  return out;
}

// Payload bytes of a record of exactly `bytes` (a multiple of 8, >= 16).
size_t PayloadFor(size_t bytes) { return bytes - segment::kRecordHeaderBytes; }

class RingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Ring::Format(mem_.span(), 3, kLaneBytes, 1234, kDurabilityAccepted);
    std::string why;
    ASSERT_TRUE(Ring::Open(mem_.span(), &ring_, &why)) << why;
  }
  // Reads everything up to the tail as the daemon does, then moves the head.
  std::vector<std::vector<std::byte>> Drain(uint32_t lane) {
    std::vector<std::vector<std::byte>> out;
    uint64_t tail = 0;
    EXPECT_TRUE(LoadTail(ring_, lane, head_[lane], read_[lane], &tail));
    for (;;) {
      std::span<const std::byte> payload;
      const char* why = nullptr;
      const ReadResult r = ReadRecord(ring_, lane, &read_[lane], tail, &buffer_, &payload, &why);
      if (r == ReadResult::kEmpty) break;
      EXPECT_EQ(r, ReadResult::kRecord) << why;
      if (r != ReadResult::kRecord) break;
      out.emplace_back(payload.begin(), payload.end());
    }
    head_[lane] = read_[lane];
    ring_.head(lane).store(head_[lane]);
    return out;
  }
  ReadResult ReadOne(uint32_t lane, const char** why) {
    uint64_t tail = 0;
    if (!LoadTail(ring_, lane, head_[lane], read_[lane], &tail)) {
      *why = "LoadTail refused";
      return ReadResult::kDamaged;
    }
    std::span<const std::byte> payload;
    return ReadRecord(ring_, lane, &read_[lane], tail, &buffer_, &payload, why);
  }
  // Claims `lane` for a fresh identity and brings it to tail position `at`
  // (records read and the head moved, as in a lane long in use).
  void AdvanceTo(uint32_t lane, uint64_t at) {
    while (tail_[lane] < at) {
      const uint64_t left = at - tail_[lane];
      const uint64_t n = std::min<uint64_t>(left, kLaneBytes / 2);
      ASSERT_GE(n, 16u);
      ASSERT_EQ(Append(ring_, lane, &tail_[lane], Record(PayloadFor(n), 0x11)), AppendResult::kAppended);
      Drain(lane);
    }
    ASSERT_EQ(tail_[lane], at);
  }

  RingMem mem_{3, kLaneBytes};
  Ring ring_;
  uint64_t tail_[3] = {};
  uint64_t head_[3] = {};
  uint64_t read_[3] = {};
  std::vector<std::byte> buffer_;
};

// --- Geometry --------------------------------------------------------------

TEST(RingGeometry, FormatThenOpenGivesTheGeometryAndAFreshRing) {
  RingMem mem(5, 8192);
  std::memset(mem.span().data(), 0x5a, mem.span().size());  // a reused file
  Ring::Format(mem.span(), 5, 8192, 77, kDurabilitySynced);
  Ring r;
  std::string why;
  ASSERT_TRUE(Ring::Open(mem.span(), &r, &why)) << why;
  EXPECT_EQ(r.lane_count(), 5u);
  EXPECT_EQ(r.lane_bytes(), 8192u);
  EXPECT_EQ(LoadLe32(mem.at(kOffUid)), 77u);
  EXPECT_EQ(r.durability().load(), kDurabilitySynced);
  EXPECT_EQ(r.doorbell().load(), 0u);
  for (uint32_t l = 0; l < 5; ++l) {
    EXPECT_EQ(r.owner(l).load(), 0u);
    EXPECT_EQ(r.tail(l).load(), 0u);
    EXPECT_EQ(r.head(l).load(), 0u);
    EXPECT_EQ(r.state(l).load(), kLaneOk);
  }
  EXPECT_EQ(r.data(1) - r.data(0), static_cast<ptrdiff_t>(kLaneHeaderBytes + 8192));
  EXPECT_EQ(r.data(0) - mem.span().data(), static_cast<ptrdiff_t>(kHeaderBytes + kLaneHeaderBytes));
  EXPECT_EQ(RingBytes(5, 8192), kHeaderBytes + 5 * (kLaneHeaderBytes + 8192));
}

TEST(RingGeometry, OpenRefusesWhatIsNotARing) {
  RingMem mem(2, kLaneBytes);
  Ring r;
  std::string why;
  EXPECT_FALSE(Ring::Open(mem.span(), &r, &why)) << "all zeroes";
  EXPECT_FALSE(r.valid());
  Ring::Format(mem.span(), 2, kLaneBytes, 1, 0);
  EXPECT_FALSE(Ring::Open(mem.span().first(kHeaderBytes - 1), &r, &why));
  EXPECT_FALSE(Ring::Open(mem.span().subspan(4), &r, &why)) << "misaligned";
  EXPECT_FALSE(Ring::Open(mem.span().first(RingBytes(2, kLaneBytes) - 1), &r, &why));
  EXPECT_EQ(why, "ring shorter than its geometry");
  ASSERT_TRUE(Ring::Open(mem.span(), &r, &why));

  auto with = [&](size_t off, uint32_t v) {
    Ring::Format(mem.span(), 2, kLaneBytes, 1, 0);
    StoreLe32(mem.at(off), v);
    return Ring::Open(mem.span(), &r, &why);
  };
  EXPECT_FALSE(with(kOffMagic, 0x12345678));
  EXPECT_EQ(why, "not a postspool ring (bad magic)");
  EXPECT_FALSE(with(kOffVersion, kVersion + 1));
  EXPECT_EQ(why, "unsupported ring version");
  EXPECT_FALSE(with(kOffLaneCount, 0));
  EXPECT_EQ(why, "bad ring geometry");
  EXPECT_FALSE(with(kOffLaneCount, kLanesMax + 1));
  EXPECT_FALSE(with(kOffLaneCount, 3)) << "more lanes than the mapping holds";
  EXPECT_FALSE(with(kOffLaneBytes, kLaneBytes + 8)) << "not a power of two";
  EXPECT_FALSE(with(kOffLaneBytes, kLaneBytesMin / 2));
  EXPECT_FALSE(with(kOffLaneBytes, kLaneBytesMax * 2));
  EXPECT_TRUE(with(kOffLaneCount, 1)) << "fewer lanes than the mapping holds is fine";
  EXPECT_EQ(r.lane_count(), 1u);
}

TEST(RingGeometry, IdentityPacksPidAndStartTimeBelowTheReleasedBit) {
  const uint64_t id = MakeIdentity(4194303, (1ull << 41) - 1);
  EXPECT_EQ(IdentityPid(id), 4194303);
  EXPECT_EQ(IdentityStart(id), (1ull << 41) - 1);
  EXPECT_EQ(id & kReleasedBit, 0u);
  EXPECT_EQ(IdentityPid(id | kReleasedBit), 4194303);
  EXPECT_EQ(IdentityStart(id | kReleasedBit), (1ull << 41) - 1);
  const uint64_t small = MakeIdentity(42, 1000);
  EXPECT_EQ(IdentityPid(small), 42);
  EXPECT_EQ(IdentityStart(small), 1000u);
  EXPECT_NE(MakeIdentity(42, 1000), MakeIdentity(42, 1001)) << "a reused pid is another owner";
  // Bits beyond the fields are dropped, not carried into the other field.
  EXPECT_EQ(IdentityPid(MakeIdentity(42 | (1 << 22), 7)), 42);
  EXPECT_EQ(IdentityStart(MakeIdentity(1, 7 | (1ull << 41))), 7u);
}

// --- Producer ----------------------------------------------------------------

TEST_F(RingTest, ClaimTakesTheFirstFreeLaneFromTheHint) {
  uint32_t lane = 99;
  uint64_t tail = 99;
  ASSERT_TRUE(ClaimLane(ring_, 0x1001, 1, &lane, &tail));
  EXPECT_EQ(lane, 1u);
  EXPECT_EQ(tail, 0u);
  EXPECT_EQ(ring_.owner(1).load(), 0x1001u);
  ASSERT_TRUE(ClaimLane(ring_, 0x1002, 1, &lane, &tail));
  EXPECT_EQ(lane, 2u);
  ASSERT_TRUE(ClaimLane(ring_, 0x1003, 1, &lane, &tail));
  EXPECT_EQ(lane, 0u) << "the search wraps";
  EXPECT_FALSE(ClaimLane(ring_, 0x1004, 0, &lane, &tail)) << "every lane is taken";
}

TEST_F(RingTest, ClaimStartsAtADrainedLanesTail) {
  uint32_t lane;
  uint64_t tail;
  ring_.tail(0).store(4096);
  ring_.head(0).store(4096);
  ASSERT_TRUE(ClaimLane(ring_, 0x2001, 0, &lane, &tail));
  EXPECT_EQ(lane, 0u);
  EXPECT_EQ(tail, 4096u);
}

TEST_F(RingTest, ClaimHandsBackALaneThatIsNotDrainedOrIsBroken) {
  uint32_t lane;
  uint64_t tail;
  ring_.tail(0).store(64);  // not drained
  ring_.state(1).store(kLaneBroken);
  ring_.tail(2).store(12);  // misaligned
  ring_.head(2).store(12);
  EXPECT_FALSE(ClaimLane(ring_, 0x3001, 0, &lane, &tail));
  // Each is handed back to the daemon (released) rather than left owned.
  for (uint32_t l = 0; l < 3; ++l) EXPECT_EQ(ring_.owner(l).load(), 0x3001u | kReleasedBit) << l;
}

TEST_F(RingTest, ReleaseMarksOnlyTheOwnersLane) {
  uint32_t lane;
  uint64_t tail;
  ASSERT_TRUE(ClaimLane(ring_, 0x4001, 0, &lane, &tail));
  ReleaseLane(ring_, lane, 0x4002);  // not its owner
  EXPECT_EQ(ring_.owner(lane).load(), 0x4001u);
  ReleaseLane(ring_, lane, 0x4001);
  EXPECT_EQ(ring_.owner(lane).load(), 0x4001u | kReleasedBit);
  ReleaseLane(ring_, lane, 0x4001);  // twice: no change
  EXPECT_EQ(ring_.owner(lane).load(), 0x4001u | kReleasedBit);
}

TEST_F(RingTest, TakeDoorbellTakesItOnlyWhenTheDaemonSleeps) {
  EXPECT_FALSE(TakeDoorbell(ring_));
  EXPECT_EQ(ring_.doorbell().load(), 0u);
  ring_.doorbell().store(1);
  EXPECT_TRUE(TakeDoorbell(ring_));
  EXPECT_EQ(ring_.doorbell().load(), 0u);
  EXPECT_FALSE(TakeDoorbell(ring_)) << "one producer rings, the next finds it taken";
}

TEST_F(RingTest, AppendPublishesByTheTailOnly) {
  const auto rec = Record(100, 0x42);
  ASSERT_EQ(Append(ring_, 0, &tail_[0], rec), AppendResult::kAppended);
  EXPECT_EQ(tail_[0], rec.size());
  EXPECT_EQ(ring_.tail(0).load(), rec.size());
  EXPECT_EQ(std::memcmp(ring_.data(0), rec.data(), rec.size()), 0);
  EXPECT_EQ(ring_.tail(1).load(), 0u) << "another lane is untouched";
}

TEST_F(RingTest, AppendRefusesARecordOverHalfALane) {
  EXPECT_EQ(Append(ring_, 0, &tail_[0], Record(PayloadFor(kLaneBytes / 2), 1)), AppendResult::kAppended);
  EXPECT_EQ(Append(ring_, 0, &tail_[0], Record(PayloadFor(kLaneBytes / 2) + 1, 1)),
            AppendResult::kTooBig);
  std::vector<std::byte> odd(20, std::byte{0});
  EXPECT_EQ(Append(ring_, 1, &tail_[1], odd), AppendResult::kTooBig) << "not 8-byte framed";
  EXPECT_EQ(ring_.tail(1).load(), 0u);
}

TEST_F(RingTest, AppendSaysFullUntilTheDaemonMovesTheHead) {
  const auto rec = Record(PayloadFor(1024), 7);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(Append(ring_, 0, &tail_[0], rec), AppendResult::kAppended) << i;
  EXPECT_EQ(Append(ring_, 0, &tail_[0], rec), AppendResult::kFull);
  EXPECT_EQ(Append(ring_, 0, &tail_[0], Record(0, 1)), AppendResult::kFull);
  EXPECT_EQ(tail_[0], kLaneBytes);
  EXPECT_EQ(ring_.tail(0).load(), kLaneBytes);
  // The daemon journals the first record: room for exactly one more.
  ring_.head(0).store(1024);
  EXPECT_EQ(Append(ring_, 0, &tail_[0], rec), AppendResult::kAppended);
  EXPECT_EQ(Append(ring_, 0, &tail_[0], Record(0, 1)), AppendResult::kFull);
}

TEST_F(RingTest, AppendSaysBrokenWhenTheLaneIsNotItsToWrite) {
  ASSERT_EQ(Append(ring_, 0, &tail_[0], Record(8, 1)), AppendResult::kAppended);
  ring_.state(0).store(kLaneBroken);
  EXPECT_EQ(Append(ring_, 0, &tail_[0], Record(8, 1)), AppendResult::kBroken);
  ring_.state(0).store(kLaneOk);
  ring_.head(0).store(tail_[0] + 8);  // a head past the producer's tail
  EXPECT_EQ(Append(ring_, 0, &tail_[0], Record(8, 1)), AppendResult::kBroken);
  uint64_t far = 3 * kLaneBytes;  // more than a lane ahead of the head
  ring_.head(0).store(0);
  EXPECT_EQ(Append(ring_, 0, &far, Record(8, 1)), AppendResult::kBroken);
}

TEST_F(RingTest, ManyRecordsRoundTripAcrossManyWraps) {
  std::mt19937 rng(20261203);
  uint64_t expected = 0;
  uint64_t read_back = 0;
  std::vector<std::vector<std::byte>> in_flight;
  int markers = 0, implicit = 0;
  for (int i = 0; i < 5000; ++i) {
    const size_t n = rng() % 3 == 0 ? rng() % 1900 : rng() % 200;
    std::vector<std::byte> payload(n);
    for (auto& b : payload) b = static_cast<std::byte>(rng());
    std::vector<std::byte> rec;
    ASSERT_TRUE(segment::AppendRecord(payload, &rec).ok());
    const uint64_t to_end = kLaneBytes - tail_[0] % kLaneBytes;
    const AppendResult r = Append(ring_, 0, &tail_[0], rec);
    if (r == AppendResult::kFull) {
      for (const auto& got : Drain(0)) {
        ASSERT_FALSE(in_flight.empty());
        ASSERT_EQ(got, in_flight.front()) << "record " << read_back;
        in_flight.erase(in_flight.begin());
        ++read_back;
      }
      ASSERT_TRUE(in_flight.empty());
      ASSERT_EQ(Append(ring_, 0, &tail_[0], rec), AppendResult::kAppended);
    } else {
      ASSERT_EQ(r, AppendResult::kAppended);
    }
    if (to_end < rec.size()) ++(to_end >= kWrapBytes ? markers : implicit);
    in_flight.push_back(payload);
    ++expected;
    if (rng() % 4 == 0) {
      for (const auto& got : Drain(0)) {
        ASSERT_EQ(got, in_flight.front()) << "record " << read_back;
        in_flight.erase(in_flight.begin());
        ++read_back;
      }
    }
  }
  for (const auto& got : Drain(0)) {
    ASSERT_EQ(got, in_flight.front());
    in_flight.erase(in_flight.begin());
    ++read_back;
  }
  EXPECT_EQ(read_back, expected);
  EXPECT_GT(tail_[0], 100u * kLaneBytes) << "many laps";
  EXPECT_GT(markers, 10);
  EXPECT_GT(implicit, 0);
}

TEST_F(RingTest, AWrapMarkerEndsTheLapWhenTheNextRecordDoesNotFit) {
  AdvanceTo(0, kLaneBytes - 24);  // 24 bytes left: room for a marker
  std::memset(ring_.data(0) + kLaneBytes - 24, 0xee, 24);
  const auto rec = Record(16, 0x33);  // 32 bytes
  ASSERT_EQ(Append(ring_, 0, &tail_[0], rec), AppendResult::kAppended);
  EXPECT_EQ(tail_[0], kLaneBytes + rec.size());
  const std::byte* m = ring_.data(0) + kLaneBytes - 24;
  EXPECT_EQ(LoadLe64(m), 0u);
  EXPECT_EQ(LoadLe32(m + 8), kWrapMarker);
  EXPECT_EQ(LoadLe32(m + 12), 0u);
  EXPECT_EQ(std::memcmp(ring_.data(0), rec.data(), rec.size()), 0) << "the record starts the lap";
  const auto got = Drain(0);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], std::vector<std::byte>(16, std::byte{0x33}));
  EXPECT_EQ(read_[0], tail_[0]);
}

TEST_F(RingTest, FewerThan16BytesLeftAreSkippedWithoutAMarker) {
  AdvanceTo(0, kLaneBytes - 8);
  std::memset(ring_.data(0) + kLaneBytes - 8, 0xee, 8);
  const auto rec = Record(16, 0x44);
  ASSERT_EQ(Append(ring_, 0, &tail_[0], rec), AppendResult::kAppended);
  EXPECT_EQ(tail_[0], kLaneBytes + rec.size());
  for (int i = 0; i < 8; ++i) EXPECT_EQ(ring_.data(0)[kLaneBytes - 8 + i], std::byte{0xee});
  const auto got = Drain(0);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], std::vector<std::byte>(16, std::byte{0x44}));
}

TEST_F(RingTest, ARecordThatFillsTheLapExactlyNeedsNoWrap) {
  AdvanceTo(0, kLaneBytes - 32);
  ASSERT_EQ(Append(ring_, 0, &tail_[0], Record(16, 0x55)), AppendResult::kAppended);
  EXPECT_EQ(tail_[0], kLaneBytes);
  ASSERT_EQ(Append(ring_, 0, &tail_[0], Record(16, 0x56)), AppendResult::kAppended);
  EXPECT_EQ(tail_[0], kLaneBytes + 32);
  const auto got = Drain(0);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0][0], std::byte{0x55});
  EXPECT_EQ(got[1][0], std::byte{0x56});
}

// --- Reader: damage ------------------------------------------------------------

TEST_F(RingTest, LoadTailRefusesATailOutsideTheLane) {
  uint64_t tail = 0;
  ring_.tail(0).store(64);
  EXPECT_TRUE(LoadTail(ring_, 0, 0, 0, &tail));
  EXPECT_EQ(tail, 64u);
  EXPECT_FALSE(LoadTail(ring_, 0, 0, 72, &tail)) << "behind the reader";
  EXPECT_FALSE(LoadTail(ring_, 0, 72, 72, &tail)) << "behind the head";
  ring_.tail(0).store(kLaneBytes + 8);
  EXPECT_FALSE(LoadTail(ring_, 0, 0, 0, &tail)) << "more than a lane ahead of the head";
  EXPECT_TRUE(LoadTail(ring_, 0, 8, 8, &tail));
  ring_.tail(0).store(68);
  EXPECT_FALSE(LoadTail(ring_, 0, 0, 0, &tail)) << "misaligned";
}

TEST_F(RingTest, ReaderReportsABadMarker) {
  ASSERT_EQ(Append(ring_, 0, &tail_[0], Record(40, 1)), AppendResult::kAppended);
  ring_.data(0)[8] ^= std::byte{0x01};
  const char* why = nullptr;
  EXPECT_EQ(ReadOne(0, &why), ReadResult::kDamaged);
  EXPECT_STREQ(why, "no record marker where a record starts");
  EXPECT_EQ(read_[0], 0u) << "the cursor stays at the damage";
}

TEST_F(RingTest, ReaderReportsALengthAboveTheMaximum) {
  ASSERT_EQ(Append(ring_, 0, &tail_[0], Record(40, 1)), AppendResult::kAppended);
  StoreLe32(ring_.data(0) + 12, segment::kRecordPayloadMax + 1);
  const char* why = nullptr;
  EXPECT_EQ(ReadOne(0, &why), ReadResult::kDamaged);
  EXPECT_STREQ(why, "record length above the maximum");
}

TEST_F(RingTest, ReaderReportsALengthPastTheTailOrTheLanesEnd) {
  ASSERT_EQ(Append(ring_, 0, &tail_[0], Record(40, 1)), AppendResult::kAppended);
  StoreLe32(ring_.data(0) + 12, 48);  // 64 bytes: past the tail at 56
  const char* why = nullptr;
  EXPECT_EQ(ReadOne(0, &why), ReadResult::kDamaged);
  EXPECT_STREQ(why, "record runs past the lane's end or its tail");

  AdvanceTo(1, kLaneBytes - 64);
  ASSERT_EQ(Append(ring_, 1, &tail_[1], Record(32, 1)), AppendResult::kAppended);  // 48 bytes
  ASSERT_EQ(Append(ring_, 1, &tail_[1], Record(32, 1)), AppendResult::kAppended);  // wraps
  StoreLe32(ring_.data(1) + kLaneBytes - 64 + 12, 64);  // 80 bytes: past the lane's end
  EXPECT_EQ(ReadOne(1, &why), ReadResult::kDamaged);
  EXPECT_STREQ(why, "record runs past the lane's end or its tail");
}

TEST_F(RingTest, ReaderReportsAChecksumMismatch) {
  ASSERT_EQ(Append(ring_, 0, &tail_[0], Record(40, 1)), AppendResult::kAppended);
  ASSERT_EQ(Append(ring_, 0, &tail_[0], Record(40, 2)), AppendResult::kAppended);
  ring_.data(0)[56 + 20] ^= std::byte{0x80};  // the second record's payload
  const char* why = nullptr;
  EXPECT_EQ(ReadOne(0, &why), ReadResult::kRecord);
  EXPECT_EQ(ReadOne(0, &why), ReadResult::kDamaged);
  EXPECT_STREQ(why, "record checksum mismatch");
  EXPECT_EQ(read_[0], 56u);
}

TEST_F(RingTest, ReaderReportsATailThatCutsARecord) {
  ASSERT_EQ(Append(ring_, 0, &tail_[0], Record(40, 1)), AppendResult::kAppended);
  ring_.tail(0).store(8);
  const char* why = nullptr;
  EXPECT_EQ(ReadOne(0, &why), ReadResult::kDamaged);
  EXPECT_STREQ(why, "the tail cuts a record header");
  ring_.tail(0).store(24);
  EXPECT_EQ(ReadOne(0, &why), ReadResult::kDamaged);
  EXPECT_STREQ(why, "record runs past the lane's end or its tail");
}

TEST_F(RingTest, ReaderReportsATailInsideAWrap) {
  AdvanceTo(0, kLaneBytes - 24);
  ASSERT_EQ(Append(ring_, 0, &tail_[0], Record(16, 1)), AppendResult::kAppended);  // marker, then lap 2
  ring_.tail(0).store(kLaneBytes - 8);  // inside the skipped 24 bytes
  const char* why = nullptr;
  EXPECT_EQ(ReadOne(0, &why), ReadResult::kDamaged);
  EXPECT_STREQ(why, "the tail points into a wrap");
  ring_.tail(0).store(kLaneBytes);  // exactly at the lap's end: still nothing after the wrap
  EXPECT_EQ(ReadOne(0, &why), ReadResult::kDamaged);
  EXPECT_STREQ(why, "the tail points into a wrap");
}

TEST_F(RingTest, ReaderReportsAWrapMarkerThatStartsALap) {
  AdvanceTo(0, kLaneBytes - 24);
  ASSERT_EQ(Append(ring_, 0, &tail_[0], Record(16, 1)), AppendResult::kAppended);
  StoreLe32(ring_.data(0) + 8, kWrapMarker);  // the new lap starts with a marker
  const char* why = nullptr;
  // A lap holds at most what the tail allows (tail - head <= lane_bytes),
  // so a second wrap always has the tail inside it.
  EXPECT_EQ(ReadOne(0, &why), ReadResult::kDamaged);
  EXPECT_STREQ(why, "the tail points into a wrap");
}

TEST_F(RingTest, ReaderCopiesTheRecordBeforeCheckingIt) {
  ASSERT_EQ(Append(ring_, 0, &tail_[0], Record(40, 9)), AppendResult::kAppended);
  uint64_t tail = 0;
  ASSERT_TRUE(LoadTail(ring_, 0, 0, 0, &tail));
  std::span<const std::byte> payload;
  const char* why = nullptr;
  ASSERT_EQ(ReadRecord(ring_, 0, &read_[0], tail, &buffer_, &payload, &why), ReadResult::kRecord);
  // The payload lies in the reader's buffer, so a producer that writes over
  // the lane now cannot change what the daemon checked.
  EXPECT_GE(payload.data(), buffer_.data());
  EXPECT_LE(payload.data() + payload.size(), buffer_.data() + buffer_.size());
  std::memset(ring_.data(0), 0, 56);
  EXPECT_EQ(payload[0], std::byte{9});
  uint32_t len = 0;
  EXPECT_EQ(segment::CheckFrame(buffer_, segment::kRecordPayloadMax, &len), segment::FrameCheck::kValid);
  EXPECT_EQ(len, 40u);
}

// The lane owner's identity comes from /proc/<pid>/stat on both sides
// (client and daemon): a command with spaces and ")" must not shift fields.
TEST(ParseProcStat, TakesStateAndStartTimeAfterTheLastParenthesis) {
  const char* stat =
      "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
  char state = 0;
  uint64_t start = 0;
  ASSERT_TRUE(ParseProcStat(stat, &state, &start));
  EXPECT_EQ(state, 'S');
  EXPECT_EQ(start, 987654u);
  EXPECT_FALSE(ParseProcStat("4242 (cut short", &state, &start));
  EXPECT_FALSE(ParseProcStat("4242 (x) Z 1 2 3", &state, &start));
}

}  // namespace
}  // namespace postspool::ring
