// SpoolAdopter against a scripted in-memory spool directory: what it adopts,
// what it quarantines and under which name, that it never waits for a held
// lock, that it is fair over uids, and that its work per round is bounded.
#include "spool_adopter.h"

#include <gtest/gtest.h>

#include <map>

#include "segment_writer.h"
#include "test_util.h"

namespace postspool::daemon {
namespace {

using testing::NumberedPost;
using testing::SegmentBytes;

class FakeClock final : public ClockPort {
 public:
  Clock::time_point Now() override { return now; }
  int64_t WallSeconds() override { return wall_s; }
  Clock::time_point now = Clock::time_point{} + std::chrono::hours(1);
  int64_t wall_s = 1'800'000'000;
};

struct FakeFile {
  SpoolEntry entry;
  std::vector<std::byte> bytes;
  bool locked = false;  // a writer holds the segment's lock
};

class FakeSpoolDir final : public SpoolDir {
 public:
  std::map<std::string, FakeFile> files;
  std::map<std::string, FakeFile> quarantine;
  size_t list_calls = 0;
  size_t entries_listed_max = 0;  // the most entries one List call returned

  void Add(const std::string& name, uid_t owner, std::vector<std::byte> bytes) {
    FakeFile f;
    f.entry.name = name;
    f.entry.regular = true;
    f.entry.owner = owner;
    f.entry.links = 1;
    f.entry.size = bytes.size();
    f.entry.allocated_bytes = (bytes.size() + 4095) / 4096 * 4096;
    f.entry.mtime_s = 1'700'000'000;
    f.bytes = std::move(bytes);
    files[name] = std::move(f);
  }

  Status List(size_t max, std::vector<SpoolEntry>* out, bool* pass_done) override {
    ++list_calls;
    out->clear();
    auto it = files.upper_bound(cursor_);
    if (!in_pass_) it = files.begin();
    in_pass_ = true;
    for (; it != files.end() && out->size() < max; ++it) {
      out->push_back(it->second.entry);
      cursor_ = it->first;
    }
    *pass_done = it == files.end();
    if (*pass_done) in_pass_ = false;
    entries_listed_max = std::max(entries_listed_max, out->size());
    return Status::Ok();
  }
  Status Rename(const std::string& from, const std::string& to) override {
    if (!files.count(from)) return Status(StatusCode::kNotFound, from);
    if (files.count(to)) return Status(StatusCode::kAlreadyExists, to);
    auto node = files.extract(from);
    node.key() = to;
    node.mapped().entry.name = to;
    files.insert(std::move(node));
    return Status::Ok();
  }
  Status Open(const std::string& name, std::unique_ptr<SpoolFile>* out) override {
    auto it = files.find(name);
    if (it == files.end()) return Status(StatusCode::kNotFound, name);
    *out = std::make_unique<File>(&it->second);
    return Status::Ok();
  }
  Status Unlink(const std::string& name) override {
    return files.erase(name) ? Status::Ok() : Status(StatusCode::kNotFound, name);
  }
  Status Quarantine(const std::string& name, const std::string& target) override {
    if (!files.count(name)) return Status(StatusCode::kNotFound, name);
    if (quarantine.count(target)) return Status(StatusCode::kAlreadyExists, target);
    quarantine_bytes_ += std::max<uint64_t>(files[name].entry.allocated_bytes, 4096);
    quarantine[target] = std::move(files[name]);
    files.erase(name);
    return Status::Ok();
  }
  uint64_t quarantine_bytes() const override { return quarantine_bytes_; }
  bool TakeChanges() override { return false; }

 private:
  class File final : public SpoolFile {
   public:
    explicit File(FakeFile* f) : f_(f), source_(f->bytes) {}
    const SpoolEntry& entry() const override { return f_->entry; }
    Status TrySeal(bool) override {
      if (f_->locked) return Status(StatusCode::kTimedOut, "locked");
      return Status::Ok();
    }
    segment::Source* source() override { return &source_; }

   private:
    FakeFile* f_;
    segment::MemorySource source_;
  };
  std::string cursor_;
  bool in_pass_ = false;
  uint64_t quarantine_bytes_ = 0;
};

class SpoolAdopterTest : public ::testing::Test {
 protected:
  SpoolAdopterTest() : adopter_(config_, &metrics_, &dir_, &clock_) {}

  // One round of the ingest loop: scan a little, hand out what is ready;
  // every record handed out counts as journaled at once.
  std::vector<uid_t> Round() {
    std::vector<uid_t> got;
    adopter_.NewRound();
    adopter_.Tick();
    SpoolAdopter::Adopted a;
    while (adopter_.Next(&a)) got.push_back(a.uid);
    if (adopter_.AtEnd()) adopter_.Finish();
    clock_.now += std::chrono::milliseconds(20);
    return got;
  }
  std::vector<uid_t> Rounds(int n) {
    std::vector<uid_t> all;
    for (int i = 0; i < n; ++i) {
      auto r = Round();
      all.insert(all.end(), r.begin(), r.end());
    }
    return all;
  }

  static std::vector<std::byte> Segment(int records, uint64_t writer = 1) {
    std::vector<PostData> posts;
    for (int i = 0; i < records; ++i) posts.push_back(NumberedPost(writer, static_cast<uint64_t>(i)));
    return SegmentBytes(posts, nullptr, segment::NewSegmentId());
  }

  Config config_;
  Metrics metrics_;
  FakeClock clock_;
  FakeSpoolDir dir_;
  SpoolAdopter adopter_;
};

TEST_F(SpoolAdopterTest, AdoptsASealedSegmentAndDeletesItOnceFinished) {
  dir_.Add(segment::SpoolSealedName(1000, 7), 1000, Segment(3));
  EXPECT_EQ(Rounds(10).size(), 3u);
  EXPECT_TRUE(dir_.files.empty());
  EXPECT_TRUE(dir_.quarantine.empty());
}

TEST_F(SpoolAdopterTest, ACurrentSegmentIsRenamedToASealedNameBeforeItIsRead) {
  dir_.Add(segment::SpoolCurrentName(1000), 1000, Segment(2));
  adopter_.Tick();
  ASSERT_EQ(dir_.files.size(), 1u);
  EXPECT_TRUE(segment::ParseSpoolName(dir_.files.begin()->first).has_value());
  EXPECT_FALSE(segment::ParseSpoolName(dir_.files.begin()->first)->current);
  EXPECT_EQ(Rounds(10).size(), 2u);
  EXPECT_TRUE(dir_.files.empty());
}

TEST_F(SpoolAdopterTest, SquattersHardLinksSparseAndForeignFilesGoToTheQuarantine) {
  dir_.Add(segment::SpoolCurrentName(1000), 2000, Segment(1));  // owned by someone else
  dir_.Add(segment::SpoolSealedName(1001, 1), 1001, Segment(1));
  dir_.files[segment::SpoolSealedName(1001, 1)].entry.links = 2;  // a hard link
  dir_.Add(segment::SpoolSealedName(1002, 1), 1002, Segment(1));
  auto& sparse = dir_.files[segment::SpoolSealedName(1002, 1)].entry;
  sparse.size = 10ull << 30;
  sparse.allocated_bytes = 0;
  sparse.has_hole = true;
  dir_.Add(segment::SpoolSealedName(1003, 1), 1003, Segment(1));
  dir_.files[segment::SpoolSealedName(1003, 1)].entry.regular = false;  // FIFO, directory...
  dir_.Add("junk", 1000, {});
  EXPECT_TRUE(Rounds(10).empty());
  EXPECT_TRUE(dir_.files.empty());
  EXPECT_EQ(dir_.quarantine.size(), 5u);
  EXPECT_EQ(metrics_.spool_files_quarantined_total.load(), 5u);
  // The sparse file's 10 GiB never counted as spool bytes.
  EXPECT_EQ(adopter_.spool_bytes(), 0u);
}

TEST_F(SpoolAdopterTest, QuarantineNeverReplacesAnEarlierFileOfTheSameName) {
  for (int i = 0; i < 3; ++i) {
    dir_.Add("junk", 1000, {});
    Rounds(5);
    clock_.now += std::chrono::milliseconds(config_.spool_rescan_interval_ms);
  }
  EXPECT_EQ(dir_.quarantine.size(), 3u);
}

TEST_F(SpoolAdopterTest, AHeldLockDelaysOnlyThatSegmentNotTheOthers) {
  dir_.Add(segment::SpoolSealedName(1000, 1), 1000, Segment(2));
  dir_.files[segment::SpoolSealedName(1000, 1)].locked = true;
  dir_.Add(segment::SpoolSealedName(1001, 1), 1001, Segment(2));
  const auto got = Rounds(10);
  EXPECT_EQ(got, (std::vector<uid_t>{1001, 1001}));
  EXPECT_GT(metrics_.spool_seal_busy_total.load(), 0u);
  EXPECT_TRUE(dir_.files.count(segment::SpoolSealedName(1000, 1)));
  dir_.files[segment::SpoolSealedName(1000, 1)].locked = false;
  clock_.now += std::chrono::seconds(6);  // past the longest seal back-off
  EXPECT_EQ(Rounds(10), (std::vector<uid_t>{1000, 1000}));
  EXPECT_TRUE(dir_.files.empty());
}

TEST_F(SpoolAdopterTest, AdoptionIsRoundRobinOverUidsSoAFloodDoesNotDelayAnotherUser) {
  for (uint64_t i = 0; i < 200; ++i) dir_.Add(segment::SpoolSealedName(1000, i + 1), 1000, Segment(1));
  dir_.Add(segment::SpoolSealedName(1001, 0xffff), 1001, Segment(1));
  std::vector<uid_t> order;
  for (int i = 0; i < 400 && order.size() < 201; ++i) {
    auto r = Round();
    order.insert(order.end(), r.begin(), r.end());
  }
  ASSERT_EQ(order.size(), 201u);
  const auto at = std::find(order.begin(), order.end(), 1001u) - order.begin();
  // The scan sees 256 entries per round, so uid 1001's segment is waiting
  // from the first round on, and it is the second or third one adopted.
  EXPECT_LE(at, 2) << "uid 1001 adopted after " << at << " segments of uid 1000";
}

TEST_F(SpoolAdopterTest, AScanExaminesAtMostTheConfiguredEntriesPerRound) {
  config_.spool_scan_entries_max = 16;
  for (uint64_t i = 0; i < 100; ++i) dir_.Add("junk" + std::to_string(i), 1000, {});
  Rounds(20);
  EXPECT_LE(dir_.entries_listed_max, 16u);
  EXPECT_TRUE(dir_.files.empty());
}

TEST_F(SpoolAdopterTest, AUidAboveItsShareWaitsAndOthersGoOn) {
  dir_.Add(segment::SpoolSealedName(1000, 1), 1000, Segment(1));
  dir_.Add(segment::SpoolSealedName(1001, 1), 1001, Segment(1));
  adopter_.set_uid_admission([](uid_t uid) { return uid != 1000; });
  EXPECT_EQ(Rounds(10), (std::vector<uid_t>{1001}));
  adopter_.set_uid_admission([](uid_t) { return true; });
  EXPECT_EQ(Rounds(10), (std::vector<uid_t>{1000}));
}

TEST_F(SpoolAdopterTest, ASegmentWithARejectedPostGoesToTheQuarantineNotToUnlink) {
  dir_.Add(segment::SpoolSealedName(1000, 1), 1000, Segment(2));
  adopter_.Tick();
  SpoolAdopter::Adopted a;
  ASSERT_TRUE(adopter_.Next(&a));
  adopter_.MarkRejected("base_url too long");
  while (adopter_.Next(&a)) {
  }
  ASSERT_TRUE(adopter_.AtEnd());
  adopter_.Finish();
  EXPECT_TRUE(dir_.files.empty());
  EXPECT_EQ(dir_.quarantine.size(), 1u);
}

TEST_F(SpoolAdopterTest, AHugeSegmentIsReadInBoundedStepsAcrossRounds) {
  config_.spool_read_bytes_max = 64 << 10;
  // 256 KiB of garbage between two good records: resynchronising through
  // it takes several rounds, none of which examines much more than 64 KiB.
  auto seg = Segment(1);
  std::vector<std::byte> garbage(256 << 10, std::byte{0x5a});
  auto tail = Segment(1, 2);
  seg.insert(seg.end(), garbage.begin(), garbage.end());
  seg.insert(seg.end(), tail.begin() + segment::kHeaderBytes, tail.end());
  dir_.Add(segment::SpoolSealedName(1000, 1), 1000, seg);
  int rounds = 0;
  size_t records = 0;
  while (!dir_.files.empty() && rounds < 100) {
    const auto r = Round();
    ++rounds;
    records += r.size();
  }
  EXPECT_EQ(records, 2u);
  EXPECT_GE(rounds, 4);  // 256 KiB at 64 KiB a round
  EXPECT_EQ(dir_.quarantine.size(), 1u);  // kept: part of it was damaged
}

}  // namespace
}  // namespace postspool::daemon
