// The bytes of segment headers and records, pinned against FORMAT.md.
#include "segment_format.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <array>

#include "little_endian.h"

namespace postspool::segment {
namespace {

using HeaderBytes = std::array<std::byte, kHeaderBytes>;

Header SampleHeader() {
  Header h;
  h.segment_id = 0x0123456789abcdefULL;
  h.created_unix_ns = 1700000000123456789;
  h.creator_uid = 1001;
  h.creator_gid = 2002;
  h.creator_pid = 4242;
  h.host = "node17.example";
  return h;
}

TEST(SegmentHeader, FieldsSitAtTheDocumentedOffsets) {
  HeaderBytes raw;
  EncodeHeader(SampleHeader(), raw);
  const std::byte* p = raw.data();
  EXPECT_EQ(p[0], std::byte{0x89});
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(p + 1), 7), "PSSEG\r\n");
  EXPECT_EQ(LoadLe16(p + 8), 1);                       // format version
  EXPECT_EQ(LoadLe16(p + 10), 128);                    // header bytes
  EXPECT_EQ(LoadLe32(p + 12), 0u);                     // reserved
  EXPECT_EQ(LoadLe64(p + 16), 0x0123456789abcdefULL);  // segment id
  EXPECT_EQ(LoadLe64(p + 24), 1700000000123456789ULL);
  EXPECT_EQ(LoadLe32(p + 32), 1001u);
  EXPECT_EQ(LoadLe32(p + 36), 2002u);
  EXPECT_EQ(LoadLe32(p + 40), 4242u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(p + 48)), "node17.example");
  EXPECT_EQ(LoadLe64(p + 112), MaskChecksum(XXH3_64bits(p, 112)));
  EXPECT_EQ(LoadLe32(p + 120), 0u);  // flags
  EXPECT_EQ(LoadLe32(p + 124), 0u);  // reserved
}

TEST(SegmentHeader, RoundTrips) {
  HeaderBytes raw;
  Header in = SampleHeader();
  in.flags = kFlagSealed;
  EncodeHeader(in, raw);
  Header out;
  ASSERT_TRUE(DecodeHeader(raw, &out).ok());
  EXPECT_EQ(out.segment_id, in.segment_id);
  EXPECT_EQ(out.created_unix_ns, in.created_unix_ns);
  EXPECT_EQ(out.creator_uid, in.creator_uid);
  EXPECT_EQ(out.creator_gid, in.creator_gid);
  EXPECT_EQ(out.creator_pid, in.creator_pid);
  EXPECT_EQ(out.host, in.host);
  EXPECT_TRUE(out.sealed());
}

TEST(SegmentHeader, LongHostNameIsCutToFit) {
  Header in = SampleHeader();
  in.host = std::string(200, 'h');
  HeaderBytes raw;
  EncodeHeader(in, raw);
  Header out;
  ASSERT_TRUE(DecodeHeader(raw, &out).ok());
  EXPECT_EQ(out.host, std::string(kHostBytes - 1, 'h'));
}

TEST(SegmentHeader, SealingFlagIsOutsideTheChecksum) {
  HeaderBytes raw;
  EncodeHeader(SampleHeader(), raw);
  StoreLe32(raw.data() + kFlagsOffset, kFlagSealed | (1u << 7));  // unknown bit too
  Header out;
  ASSERT_TRUE(DecodeHeader(raw, &out).ok());
  EXPECT_TRUE(out.sealed());
}

TEST(SegmentHeader, AnyFlippedBitBeforeTheFlagsIsDetected) {
  HeaderBytes good;
  EncodeHeader(SampleHeader(), good);
  for (size_t i = 0; i < kFlagsOffset; ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      HeaderBytes raw = good;
      raw[i] ^= std::byte(1 << bit);
      Header out;
      const Status s = DecodeHeader(raw, &out);
      EXPECT_EQ(s.code(), StatusCode::kCorruption) << "byte " << i << " bit " << bit;
    }
  }
}

TEST(SegmentHeader, NewerFormatVersionIsUnsupportedNotCorrupt) {
  HeaderBytes raw;
  EncodeHeader(SampleHeader(), raw);
  StoreLe16(raw.data() + 8, 2);
  StoreLe64(raw.data() + 112, MaskChecksum(XXH3_64bits(raw.data(), 112)));
  Header out;
  const Status s = DecodeHeader(raw, &out);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("version 2"), std::string::npos) << s.message();
}

TEST(ChecksumMask, UnmaskInvertsMaskAndMaskChangesTheValue) {
  for (uint64_t v : {0ULL, 1ULL, 0xffffffffffffffffULL, 0x0123456789abcdefULL}) {
    EXPECT_EQ(UnmaskChecksum(MaskChecksum(v)), v);
    EXPECT_NE(MaskChecksum(v), v);
    EXPECT_NE(MaskChecksum(MaskChecksum(v)), MaskChecksum(v));
  }
}

TEST(RecordFraming, LayoutIsChecksumMarkerLengthPayloadPadding) {
  const std::array<std::byte, 5> payload = {std::byte{'h'}, std::byte{'e'}, std::byte{'l'},
                                            std::byte{'l'}, std::byte{'o'}};
  std::vector<std::byte> out = {std::byte{0xaa}};  // appends after what is there
  ASSERT_TRUE(AppendRecord(payload, &out).ok());
  ASSERT_EQ(out.size(), 1u + 24u);
  const std::byte* rec = out.data() + 1;
  EXPECT_EQ(LoadLe32(rec + 8), 0x43525350u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(rec + 8), 4), "PSRC");
  EXPECT_EQ(LoadLe32(rec + 12), 5u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(rec + 16), 5), "hello");
  for (int i = 21; i < 24; ++i) EXPECT_EQ(rec[i], std::byte{0}) << "padding byte " << i;
  EXPECT_EQ(LoadLe64(rec), MaskChecksum(XXH3_64bits(rec + 8, 16)));
}

TEST(RecordFraming, SizesAreMultiplesOfEight) {
  EXPECT_EQ(RecordBytes(0), 16u);
  EXPECT_EQ(RecordBytes(1), 24u);
  EXPECT_EQ(RecordBytes(8), 24u);
  EXPECT_EQ(RecordBytes(9), 32u);
}

TEST(RecordFraming, PayloadAboveMaximumIsRejectedAndNothingAppended) {
  std::vector<std::byte> big(kRecordPayloadMax + 1);
  std::vector<std::byte> out;
  const Status s = AppendRecord(big, &out);
  EXPECT_EQ(s.code(), StatusCode::kTooLarge);
  EXPECT_TRUE(out.empty());
  big.resize(kRecordPayloadMax);
  EXPECT_TRUE(AppendRecord(big, &out).ok());
}

TEST(RecordFraming, CheckFrameNamesEachKindOfDamage) {
  const std::array<std::byte, 9> payload{};
  std::vector<std::byte> rec;
  ASSERT_TRUE(AppendRecord(payload, &rec).ok());
  uint32_t len = 0;
  EXPECT_EQ(CheckFrame(rec, kRecordPayloadMax, &len), FrameCheck::kValid);
  EXPECT_EQ(len, 9u);

  EXPECT_EQ(CheckFrame(std::span(rec).first(rec.size() - 1), kRecordPayloadMax, &len),
            FrameCheck::kTruncated);
  EXPECT_EQ(CheckFrame(std::span(rec).first(10), kRecordPayloadMax, &len),
            FrameCheck::kTruncated);
  EXPECT_EQ(CheckFrame(rec, 8, &len), FrameCheck::kBadLength);

  auto bad = rec;
  bad[9] ^= std::byte{1};
  EXPECT_EQ(CheckFrame(bad, kRecordPayloadMax, &len), FrameCheck::kBadMarker);
  bad = rec;
  bad[rec.size() - 1] ^= std::byte{1};  // padding is covered too
  EXPECT_EQ(CheckFrame(bad, kRecordPayloadMax, &len), FrameCheck::kChecksumMismatch);
  bad = rec;
  bad[0] ^= std::byte{1};
  EXPECT_EQ(CheckFrame(bad, kRecordPayloadMax, &len), FrameCheck::kChecksumMismatch);
}

}  // namespace
}  // namespace postspool::segment
