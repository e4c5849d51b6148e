// `postspool inspect`, `postspool verify [--repair]`, the --json round trip
// of what the daemon publishes, and the sharp edges of `postspool post`,
// each through the built binary.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "client_test_util.h"
#include "fake_daemon.h"
#include "little_endian.h"
#include "segment_format.h"
#include "segment_reader.h"
#include "v03_encoder.h"

namespace postspool::testing {
namespace {

using nlohmann::json;

void WriteWhole(const std::string& path, std::span<const std::byte> bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream s(text);
  for (std::string line; std::getline(s, line);) lines.push_back(line);
  return lines;
}

std::vector<std::string> ListDir(const std::string& path) {
  std::vector<std::string> names = ListNames(path);
  std::sort(names.begin(), names.end());
  return names;
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class CliSegmentTest : public ::testing::Test {
 protected:
  // Runs the tool with `args`, `input` on stdin, in `cwd` when given.
  ToolRun Postspool(std::vector<std::string> args, const std::string& input = "",
                    const std::string& cwd = "") {
    args.insert(args.begin(), POSTSPOOL_CLI_PATH);
    return RunTool(io_.path(), std::move(args), input, cwd);
  }

  std::vector<std::string> Transport() const {
    return {"--socket", io_.File("d.sock"), "--spool-dir", spool_.path(), "--budget-ms", "2000"};
  }

  ToolRun Post(std::vector<std::string> args, const std::string& input = "",
           const std::string& cwd = "") {
    args.insert(args.begin(), "post");
    for (const std::string& a : Transport()) args.push_back(a);
    return Postspool(args, input, cwd);
  }

  TempDir io_;      // the tool's stdin/stdout/stderr files and socket path
  TempDir spool_;   // its spool directory
  TempDir data_;    // segments to inspect and verify
  TempDir quarantine_;
};

std::vector<PostData> Posts(size_t n, size_t bytes = 200) {
  std::vector<PostData> posts;
  for (size_t i = 0; i < n; ++i) posts.push_back(NumberedPost(7, i + 1, bytes));
  return posts;
}

// One way of damaging a segment, as tests/segment_reader_test.cc does it,
// and what a reader must then see.
struct Damaged {
  std::string kind;
  std::vector<std::byte> bytes;
  std::vector<PostData> survivors;  // the valid records, in order
  std::vector<uint64_t> survivor_offsets;
  // The damaged range (empty reason: none), or the torn tail.
  uint64_t damage_offset = 0;
  uint64_t damage_bytes = 0;
  std::string reason;
  uint64_t torn_tail_bytes = 0;
  bool header_unreadable = false;
  // Records whose start is in the damage (or, in a sealed segment, the torn
  // tail): what `verify` reports as lost.
  uint64_t lost_records = 0;
};

Damaged NewDamaged(std::string kind, std::vector<std::byte> bytes = {}) {
  Damaged d;
  d.kind = std::move(kind);
  d.bytes = std::move(bytes);
  return d;
}

std::vector<Damaged> EveryDamage() {
  std::vector<Damaged> all;
  const auto posts = Posts(5);
  std::vector<uint64_t> offsets;
  const auto good = SegmentBytes(posts, &offsets);
  offsets.push_back(good.size());
  const auto without = [&](size_t victim) {
    std::vector<PostData> s;
    std::vector<uint64_t> o;
    for (size_t i = 0; i < posts.size(); ++i) {
      if (i == victim) continue;
      s.push_back(posts[i]);
      o.push_back(offsets[i]);
    }
    return std::pair(s, o);
  };
  {
    Damaged d = NewDamaged("flipped bit in a middle record", good);
    d.bytes[offsets[2] + 40] ^= std::byte{0x04};
    std::tie(d.survivors, d.survivor_offsets) = without(2);
    d.damage_offset = offsets[2];
    d.damage_bytes = offsets[3] - offsets[2];
    d.reason = segment::SkipReasonName(segment::SkipReason::kChecksumMismatch);
    d.lost_records = 1;
    all.push_back(d);
  }
  {
    // A short append: part of record 1 again after record 1, so the later
    // records are off the 8-byte grid.
    Damaged d = NewDamaged("partial record from a short write");
    const size_t partial = 37;
    d.bytes.assign(good.begin(), good.begin() + static_cast<long>(offsets[2]));
    d.bytes.insert(d.bytes.end(), good.begin() + static_cast<long>(offsets[1]),
                   good.begin() + static_cast<long>(offsets[1] + partial));
    d.bytes.insert(d.bytes.end(), good.begin() + static_cast<long>(offsets[2]), good.end());
    d.survivors = posts;
    for (size_t i = 0; i < posts.size(); ++i) {
      d.survivor_offsets.push_back(offsets[i] + (i >= 2 ? partial : 0));
    }
    d.damage_offset = offsets[2];
    d.damage_bytes = partial;
    d.reason = "*";  // the first failure depends on the bytes
    d.lost_records = 1;
    all.push_back(d);
  }
  {
    Damaged d = NewDamaged("garbage between records", good);
    std::vector<std::byte> garbage(1001);
    for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = std::byte((i * 131 + 7) & 0xff);
    d.bytes.insert(d.bytes.begin() + static_cast<long>(offsets[2]), garbage.begin(), garbage.end());
    d.survivors = posts;
    for (size_t i = 0; i < posts.size(); ++i) {
      d.survivor_offsets.push_back(offsets[i] + (i >= 2 ? garbage.size() : 0));
    }
    d.damage_offset = offsets[2];
    d.damage_bytes = garbage.size();
    d.reason = segment::SkipReasonName(segment::SkipReason::kBadMarker);
    d.lost_records = 0;
    all.push_back(d);
  }
  {
    Damaged d = NewDamaged("payload that fails the verifier");
    d.bytes = SegmentBytes({posts[0]});
    d.survivor_offsets.push_back(segment::kHeaderBytes);
    d.damage_offset = d.bytes.size();
    std::vector<std::byte> junk(100, std::byte{0x5a});
    EXPECT_TRUE(segment::AppendRecord(junk, &d.bytes).ok());
    d.damage_bytes = d.bytes.size() - d.damage_offset;
    d.survivors = {posts[0]};
    for (size_t i = 1; i < 3; ++i) {
      d.survivor_offsets.push_back(d.bytes.size());
      EXPECT_TRUE(segment::AppendRecord(PostPayload(posts[i]), &d.bytes).ok());
      d.survivors.push_back(posts[i]);
    }
    d.reason = segment::SkipReasonName(segment::SkipReason::kInvalidPayload);
    d.lost_records = 1;
    all.push_back(d);
  }
  {
    Damaged d = NewDamaged("length above the maximum", good);
    StoreLe32(d.bytes.data() + offsets[1] + 12, segment::kRecordPayloadMax + 1);
    std::tie(d.survivors, d.survivor_offsets) = without(1);
    d.damage_offset = offsets[1];
    d.damage_bytes = offsets[2] - offsets[1];
    d.reason = segment::SkipReasonName(segment::SkipReason::kBadLength);
    d.lost_records = 1;
    all.push_back(d);
  }
  {
    Damaged d = NewDamaged("length past the next record", good);
    StoreLe32(d.bytes.data() + offsets[0] + 12, 60000);
    std::tie(d.survivors, d.survivor_offsets) = without(0);
    d.damage_offset = offsets[0];
    d.damage_bytes = offsets[1] - offsets[0];
    d.reason = segment::SkipReasonName(segment::SkipReason::kTruncated);
    d.lost_records = 1;
    all.push_back(d);
  }
  {
    Damaged d = NewDamaged("torn tail (a writer died mid-record)");
    d.bytes.assign(good.begin(), good.begin() + static_cast<long>(offsets[4] + 30));
    std::tie(d.survivors, d.survivor_offsets) = without(4);
    d.torn_tail_bytes = 30;
    d.lost_records = 1;
    all.push_back(d);
  }
  {
    Damaged d = NewDamaged("truncated header");
    d.bytes.assign(good.begin(), good.begin() + 100);
    d.header_unreadable = true;
    d.lost_records = 0;
    all.push_back(d);
  }
  {
    Damaged d = NewDamaged("zero-length file after a power loss");
    d.header_unreadable = true;
    d.lost_records = 0;
    all.push_back(d);
  }
  {
    Damaged d = NewDamaged("damaged header checksum", good);
    d.bytes[20] ^= std::byte{0xff};
    d.header_unreadable = true;
    d.lost_records = 5;
    all.push_back(d);
  }
  return all;
}

// The JSON lines of `inspect` of the given kind.
std::vector<json> OfKind(const std::string& out, const std::string& kind) {
  std::vector<json> found;
  for (const std::string& line : Lines(out)) {
    const json j = json::parse(line);
    if (j.at("kind") == kind) found.push_back(j);
  }
  return found;
}

TEST_F(CliSegmentTest, InspectShowsEveryRecordAndEveryDamagedRangeWithOffsetsAndReasons) {
  for (const Damaged& d : EveryDamage()) {
    SCOPED_TRACE(d.kind);
    const std::string path = data_.File("1000.000000000000002a.sealed");
    WriteWhole(path, d.bytes);
    const ToolRun r = Postspool({"inspect", path});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto header = OfKind(r.out, "segment");
    ASSERT_EQ(header.size(), 1u);
    EXPECT_EQ(header[0].contains("headerError"), d.header_unreadable) << header[0];
    const auto records = OfKind(r.out, "record");
    ASSERT_EQ(records.size(), d.survivors.size()) << r.out;
    for (size_t i = 0; i < records.size(); ++i) {
      EXPECT_EQ(records[i]["offset"], d.survivor_offsets[i]);
      EXPECT_EQ(records[i]["id"], Uuid(d.survivors[i].id));
      EXPECT_EQ(records[i]["post"]["relPath"], d.survivors[i].rel_path);
      EXPECT_EQ(records[i]["routingKey"], "v03.data.w7");
    }
    const auto damaged = OfKind(r.out, "damaged");
    if (d.header_unreadable) {
      ASSERT_EQ(damaged.size(), 1u);
      EXPECT_EQ(damaged[0]["offset"], 0u);
      EXPECT_EQ(damaged[0]["bytes"], d.bytes.size());
      EXPECT_EQ(damaged[0]["reason"].get<std::string>().rfind("unreadable header", 0), 0u);
      EXPECT_EQ(damaged[0]["lostRecords"], d.lost_records);
    } else if (d.reason.empty()) {
      EXPECT_TRUE(damaged.empty());
    } else {
      ASSERT_EQ(damaged.size(), 1u) << r.out;
      EXPECT_EQ(damaged[0]["offset"], d.damage_offset);
      EXPECT_EQ(damaged[0]["bytes"], d.damage_bytes);
      if (d.reason != "*") {
        EXPECT_EQ(damaged[0]["reason"], d.reason);
      }
      EXPECT_EQ(damaged[0]["lostRecords"], d.lost_records);
    }
    const auto torn = OfKind(r.out, "tornTail");
    EXPECT_EQ(torn.size(), d.torn_tail_bytes != 0 ? 1u : 0u);
    if (!torn.empty()) {
      EXPECT_EQ(torn[0]["bytes"], d.torn_tail_bytes);
      // Not sealed: the end of data of a segment that may grow, no loss.
      EXPECT_EQ(torn[0]["lostRecords"], 0u);
    }

    // The table says the same, a row per record and per damaged range.
    const ToolRun t = Postspool({"inspect", "--table", path});
    ASSERT_EQ(t.exit_code, 0) << t.err;
    EXPECT_EQ(Count(t.out, " record  "), d.survivors.size()) << t.out;
    EXPECT_EQ(Count(t.out, " DAMAGED "), damaged.size()) << t.out;
  }
}

TEST_F(CliSegmentTest, VerifyFindsEveryDamageAndRepairKeepsEveryValidRecordSealedAsItWas) {
  for (const Damaged& d : EveryDamage()) {
    SCOPED_TRACE(d.kind);
    TempDir dir;
    TempDir quarantine;
    const std::string name = "1000.000000000000002a.sealed";
    std::vector<std::byte> bytes = d.bytes;
    if (!d.header_unreadable) {
      // Sealed, as the daemon leaves a spool segment it renamed away.
      bytes[segment::kFlagsOffset] |= std::byte{segment::kFlagSealed};
    }
    WriteWhole(dir.File(name), bytes);
    WriteWhole(dir.File("1000.000000000000002b.sealed"), SegmentBytes(Posts(2), nullptr, 0x2b));
    // A sealed segment was complete: a torn tail in it is damage too.
    const bool damaged = d.header_unreadable || !d.reason.empty() || d.torn_tail_bytes != 0;

    const ToolRun v = Postspool({"verify", dir.path()});
    EXPECT_EQ(v.exit_code, damaged ? 1 : 0) << v.out << v.err;
    EXPECT_EQ(Count(v.out, "DAMAGED"), damaged ? 1u : 0u) << v.out;
    EXPECT_NE(v.out.find("2 segments, " + std::to_string(d.survivors.size() + 2) + " records, " +
                         (damaged ? "1" : "0") + " damaged, " + std::to_string(d.lost_records) +
                         " records lost"),
              std::string::npos)
        << v.out;
    const ToolRun vj = Postspool({"verify", "--json", dir.path()});
    const auto lines = Lines(vj.out);
    ASSERT_EQ(lines.size(), 2u) << vj.out;
    const json first = json::parse(lines[0]);
    EXPECT_EQ(first["ok"], !damaged);
    EXPECT_EQ(first["records"], d.survivors.size());
    EXPECT_EQ(first["tornTailBytes"], d.torn_tail_bytes);
    EXPECT_EQ(first["lostRecords"], d.lost_records);

    const ToolRun repair =
        Postspool({"verify", "--repair", "--quarantine-dir", quarantine.path(), dir.path()});
    EXPECT_EQ(repair.exit_code, damaged ? 1 : 0) << repair.out << repair.err;
    if (!damaged) {
      EXPECT_TRUE(quarantine.List().empty());
      continue;
    }
    // The damaged file, byte for byte, in the quarantine.
    ASSERT_EQ(quarantine.List(), std::vector<std::string>{name}) << repair.out;
    const std::string kept = ReadWhole(quarantine.File(name));
    EXPECT_TRUE(std::equal(kept.begin(), kept.end(), bytes.begin(), bytes.end(),
                           [](char a, std::byte b) { return std::byte(a) == b; }));
    if (d.survivors.empty()) {
      EXPECT_FALSE(std::ifstream(dir.File(name)).good());  // nothing to copy
      continue;
    }
    // A clean copy with every valid record, sealed, that verifies clean.
    const ReadResult clean = ReadFile(dir.File(name));
    ASSERT_TRUE(clean.open_status.ok()) << clean.open_status.ToString();
    EXPECT_EQ(clean.posts, d.survivors);
    EXPECT_TRUE(clean.skips.empty());
    EXPECT_EQ(clean.torn_tail_bytes, 0u);
    segment::Header header;
    UniqueFd fd(::open(dir.File(name).c_str(), O_RDONLY));
    ASSERT_TRUE(segment::ReadHeader(fd.get(), &header).ok());
    EXPECT_TRUE(header.sealed());
    EXPECT_EQ(header.segment_id, 42u);
    const ToolRun again = Postspool({"verify", dir.path()});
    EXPECT_EQ(again.exit_code, 0) << again.out;
  }
}

TEST_F(CliSegmentTest, CraftedFakeRecordHeadersAreReportedAsAnExhaustedScanBudget) {
  // As in segment_reader_test: every offset looks like a maximal record
  // whose checksum fails.
  std::vector<std::byte> bytes = SegmentBytes({});
  std::vector<std::byte> fake(16);
  StoreLe32(fake.data() + 8, segment::kRecordMarker);
  StoreLe32(fake.data() + 12, segment::kRecordPayloadMax);
  while (bytes.size() < (4u << 20)) bytes.insert(bytes.end(), fake.begin(), fake.end());
  WriteWhole(data_.File("crafted"), bytes);
  const ToolRun r = Postspool({"inspect", data_.File("crafted")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(OfKind(r.out, "record").empty());
  const auto damaged = OfKind(r.out, "damaged");
  ASSERT_FALSE(damaged.empty());
  EXPECT_EQ(damaged.back()["reason"],
            segment::SkipReasonName(segment::SkipReason::kScanBudgetExhausted));
  uint64_t covered = 0;
  for (const json& d : damaged) covered += d["bytes"].get<uint64_t>();
  for (const json& t : OfKind(r.out, "tornTail")) covered += t["bytes"].get<uint64_t>();
  EXPECT_EQ(covered, bytes.size() - segment::kHeaderBytes);
  const ToolRun v = Postspool({"verify", data_.File("crafted")});
  EXPECT_EQ(v.exit_code, 1);
  EXPECT_NE(v.out.find("0 records, DAMAGED"), std::string::npos) << v.out;
}

TEST_F(CliSegmentTest, RepairNeverReplacesAFileInTheQuarantine) {
  const auto all = EveryDamage();
  const std::string name = "1000.000000000000002a.sealed";
  WriteWhole(quarantine_.File(name), std::vector<std::byte>(3, std::byte{'x'}));
  WriteWhole(quarantine_.File(name + ".1"), std::vector<std::byte>(3, std::byte{'y'}));
  WriteWhole(data_.File(name), all[0].bytes);
  const ToolRun r = Postspool({"verify", "--repair", "--quarantine-dir", quarantine_.path(), data_.path()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("moved to " + quarantine_.path() + "/" + name + ".2"), std::string::npos)
      << r.out;
  EXPECT_EQ(ReadWhole(quarantine_.File(name)), "xxx");
  EXPECT_EQ(ReadWhole(quarantine_.File(name + ".1")), "yyy");
  EXPECT_EQ(ReadWhole(quarantine_.File(name + ".2")).size(), all[0].bytes.size());
}

TEST_F(CliSegmentTest, RepairLeavesASpoolSegmentClientsStillAppendTo) {
  WriteWhole(data_.File("1000.current"), EveryDamage()[0].bytes);
  const ToolRun r = Postspool({"verify", "--repair", "--quarantine-dir", quarantine_.path(), data_.path()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("not repaired: clients may still append"), std::string::npos) << r.out;
  EXPECT_TRUE(quarantine_.List().empty());
}

TEST_F(CliSegmentTest, RepairRefusesAJournalADaemonHoldsLockedAndSparesTheCheckpointSegment) {
  const std::string damaged = EveryDamage()[0].kind;
  const auto bytes = EveryDamage()[0].bytes;
  WriteWhole(data_.File("journal-0000000000000001.seg"), bytes);
  WriteWhole(data_.File("journal-0000000000000002.seg"), bytes);
  // The lock, held as the daemon holds it.
  UniqueFd lock(::open(data_.File("lock").c_str(), O_RDWR | O_CREAT, 0600));
  ASSERT_EQ(::flock(lock.get(), LOCK_EX | LOCK_NB), 0);
  ToolRun r = Postspool({"verify", "--repair", data_.path()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("a running postspoold holds this journal"), std::string::npos) << r.err;
  EXPECT_FALSE(std::ifstream(data_.File("damaged")).good());
  lock.reset();

  // A version 2 checkpoint whose watermark is in segment 1.
  std::vector<std::byte> checkpoint(8192);
  std::byte* slot = checkpoint.data();
  StoreLe32(slot, 0x4b435350);
  StoreLe32(slot + 4, 2);
  StoreLe64(slot + 8, 1);
  StoreLe64(slot + 16, 1);
  StoreLe64(slot + 24, segment::kHeaderBytes);
  StoreLe64(slot + 32, segment::MaskChecksum(XXH3_64bits(slot, 32)));
  WriteWhole(data_.File("checkpoint"), checkpoint);
  r = Postspool({"verify", "--repair", data_.path()});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.out.find("journal-0000000000000001.seg: "), std::string::npos);
  EXPECT_NE(r.out.find("not repaired: the checkpoint points into this segment"), std::string::npos)
      << r.out;
  // Segment 2 went to damaged/, as the daemon sets damaged segments aside.
  const std::vector<std::string> expected = {"journal-0000000000000002.seg"};
  EXPECT_EQ(ListDir(data_.File("damaged")), expected);
  EXPECT_EQ(ReadFile(data_.File("journal-0000000000000002.seg")).posts.size(), 4u);
  EXPECT_EQ(ReadFile(data_.File("journal-0000000000000001.seg")).skips.size(), 1u);
}

// The body the daemon publishes (its own v03 encoder, with source), read
// back by `post --json`, is the same post: every field, the bytes of a name
// that is not UTF-8, and pubTime and source replaced and said so.
TEST_F(CliSegmentTest, JsonTakesBackTheBodyTheDaemonPublishes) {
  PostData original;
  original.id = PostId{1, 2};
  original.pub_time_ns = 1700000000123456789;
  original.base_url = "sftp://host/";
  original.rel_path = "data/caf\xc3\xa9/\xff\xfe name.bin";
  original.retrieve_path = "r/x";
  original.rename = "data/old \x80.bin";
  original.identity_method = fb::IdentityMethod::Sha512;
  original.identity_value = std::string(64, '\x11');
  original.size = 1234;
  original.mode = 0640;
  original.mtime_ns = 1700000000000000001;
  original.atime_ns = 1600000000500000000;
  original.extras = {{"flavour", "vanille \xf0\x9f\x8d\xa6"}, {"raw", "\xc0"}};
  flatbuffers::FlatBufferBuilder builder;
  BuildPost(original, &builder);
  v03::Encoded published;
  ASSERT_TRUE(v03::Encode(*fb::GetPost(builder.GetBufferPointer()),
                          v03::EncodeOptions{.topic_prefix = "v03", .source = "alice",
                                             .base_url_default = {}},
                          &published)
                  .ok());
  ASSERT_NE(published.body.find("\\udcff\\udcfe"), std::string::npos) << published.body;

  const ToolRun r = Post({"--json"}, published.body + "\n" + published.body + "\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Count(r.err, "pubTime and source replaced"), 1u) << r.err;
  const auto spooled = ReadSpool(spool_.path());
  ASSERT_EQ(spooled.size(), 2u);
  PostData got = spooled[0];
  EXPECT_NE(got.id, original.id);
  EXPECT_NE(got.pub_time_ns, original.pub_time_ns);
  got.id = original.id;
  got.pub_time_ns = original.pub_time_ns;
  EXPECT_EQ(got, original);
}

TEST_F(CliSegmentTest, InspectOutputGoesBackThroughPostJson) {
  std::vector<uint64_t> offsets;
  const auto posts = Posts(3);
  WriteWhole(data_.File("seg"), SegmentBytes(posts, &offsets));
  const ToolRun inspect = Postspool({"inspect", data_.File("seg")});
  ASSERT_EQ(inspect.exit_code, 0);
  std::string bodies;
  for (const json& record : OfKind(inspect.out, "record")) bodies += record["post"].dump() + "\n";
  const ToolRun post = Post({"--json"}, bodies);
  ASSERT_EQ(post.exit_code, 0) << post.err;
  const auto spooled = ReadSpool(spool_.path());
  ASSERT_EQ(spooled.size(), posts.size());
  for (size_t i = 0; i < posts.size(); ++i) {
    EXPECT_EQ(spooled[i].rel_path, posts[i].rel_path);
    EXPECT_EQ(spooled[i].extras, posts[i].extras);
    EXPECT_EQ(spooled[i].size, posts[i].size);
  }
}

TEST_F(CliSegmentTest, FileIsPostedRelativeToTheStatedBaseAndNeverOutsideIt) {
  const std::string base = data_.File("base");
  ASSERT_EQ(::mkdir(base.c_str(), 0700), 0);
  ASSERT_EQ(::mkdir((base + "/src").c_str(), 0700), 0);
  std::ofstream(base + "/f.txt") << "x";
  std::ofstream(data_.File("outside.txt")) << "x";
  ToolRun r = Post({"--file", "../../base/./src//../f.txt", "--base-dir", base}, "", base + "/src");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = Post({"--file", "../../outside.txt", "--base-dir", ".."}, "", base + "/src");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("is not under the base directory .."), std::string::npos) << r.err;
  const auto spooled = ReadSpool(spool_.path());
  ASSERT_EQ(spooled.size(), 1u);
  EXPECT_EQ(spooled[0].rel_path, "f.txt");
}

TEST_F(CliSegmentTest, RemoveTakesAFileThatIsGoneAndRefusesOneThatExists) {
  const std::string file = data_.File("f.txt");
  std::ofstream(file) << "x";
  ToolRun r = Post({"--file", file, "--remove"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("but it still exists"), std::string::npos) << r.err;
  ASSERT_EQ(::unlink(file.c_str()), 0);
  r = Post({"--file", file});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("does not exist (to announce that it was removed, add --remove)"),
            std::string::npos)
      << r.err;
  r = Post({"--file", file, "--remove", "--base-dir", data_.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto spooled = ReadSpool(spool_.path());
  ASSERT_EQ(spooled.size(), 1u);
  EXPECT_EQ(spooled[0].rel_path, "f.txt");
  EXPECT_TRUE(spooled[0].remove);
  EXPECT_FALSE(spooled[0].size.has_value());
}

// --rename with --file is a file path under the base, posted as its
// absolute path: the form an sr3 subscriber maps onto its own tree.
TEST_F(CliSegmentTest, RenameWithFileIsPostedAsTheAbsolutePathOfTheOldName) {
  const std::string file = data_.File("new.txt");
  std::ofstream(file) << "x";
  ASSERT_EQ(::link(file.c_str(), data_.File("other.txt").c_str()), 0);
  const ToolRun r = Post({"--file", "new.txt", "--rename", "./sub/../old.txt", "--base-dir", "."}, "",
                     data_.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // A hard link is posted as the file it is (sr3 does not apply hlink).
  const ToolRun h = Post({"--file", "other.txt", "--base-dir", "."}, "", data_.path());
  ASSERT_EQ(h.exit_code, 0) << h.err;
  EXPECT_EQ(Post({"--file", "other.txt", "--hlink", "new.txt"}, "", data_.path()).exit_code, 2);
  const auto spooled = ReadSpool(spool_.path());
  ASSERT_EQ(spooled.size(), 2u);
  EXPECT_EQ(spooled[0].rel_path, "new.txt");
  EXPECT_EQ(spooled[0].rename, std::filesystem::canonical(data_.path()).string() + "/old.txt");
  EXPECT_EQ(spooled[1].rel_path, "other.txt");
  EXPECT_FALSE(spooled[1].hlink.has_value());
  EXPECT_TRUE(spooled[1].size.has_value());
}

TEST_F(CliSegmentTest, AMissingSocketIsSaidOnceAndThePostStillSpooled) {
  const ToolRun r = Post({"--json"}, "{\"relPath\": \"a\"}\n{\"relPath\": \"b\"}\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The socket is missing during every stop and restart of the daemon:
  // the warning names that first, not only a wrong path.
  EXPECT_EQ(Count(r.err, "warning: no postspoold socket at " + io_.File("d.sock") +
                             " (postspoold is stopped or restarting"),
            1u)
      << r.err;
  EXPECT_EQ(ReadSpool(spool_.path()).size(), 2u);

  FakeDaemon daemon(io_.File("d.sock"));
  ASSERT_TRUE(daemon.ok());
  const ToolRun s = Post({"--rel-path", "c"});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_EQ(s.err, "");
}

TEST_F(CliSegmentTest, ErrorsAreInTheUsersWordsWithOneExitCodeConvention) {
  ToolRun r = Post({"--rel-path", "a", "--identity", "md5:AAAA"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("the md5 value is the 16-byte digest in base64"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("identity_size"), std::string::npos) << r.err;
  r = Post({"--json"}, "{\"relPath\": \"a\", \"meta\": {\"k\": 1}}\n");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("put structured data in a string"), std::string::npos) << r.err;
  r = Post({"--rel-path", "a/../b"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("relPath"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("rel_path"), std::string::npos) << r.err;
  r = Postspool({"inspect", data_.File("missing")});
  EXPECT_EQ(r.exit_code, 2);
  r = Postspool({"verify", data_.File("missing")});
  EXPECT_EQ(r.exit_code, 2);
}

}  // namespace
}  // namespace postspool::testing
