// The journal: segments, the committed end, reading across segments, the
// checkpoint, and deleting confirmed segments.
#include "journal.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>

#include "test_util.h"

namespace postspool::daemon {
namespace {

using testing::NumberedPost;
using testing::TempDir;

std::vector<std::byte> Framed(const PostData& post) {
  std::vector<std::byte> out;
  if (!segment::AppendRecord(testing::PostPayload(post), &out).ok()) std::abort();
  return out;
}

std::vector<uint64_t> ReadSeqs(JournalReader* reader, JournalPosition limit) {
  std::vector<uint64_t> seqs;
  JournalReader::Entry e;
  bool got = true;
  while (got) {
    EXPECT_TRUE(reader->Next(limit, &e, &got).ok());
    if (got) seqs.push_back(ReadPost(PostFromPayload(e.payload)).id.lo);
  }
  return seqs;
}

TEST(Journal, RecordsReadBackInOrderAcrossSegments) {
  TempDir dir;
  JournalUsage usage;
  std::unique_ptr<JournalWriter> w;
  ASSERT_TRUE(JournalWriter::Open({dir.path(), 1 << 20}, &usage, &w).ok());
  std::vector<uint64_t> want;
  for (uint64_t i = 0; i < 3000; ++i) {  // ~3000 * 800 B: several 1 MiB segments
    JournalPosition first;
    ASSERT_TRUE(w->Append(Framed(NumberedPost(1, i, 800)), false, &first).ok());
    want.push_back(i);
  }
  std::vector<uint64_t> seqs;
  ASSERT_TRUE(ListJournalSegments(dir.fd(), &seqs).ok());
  EXPECT_GE(seqs.size(), 3u);
  JournalReader r(dir.fd());
  EXPECT_EQ(ReadSeqs(&r, w->end()), want);
  EXPECT_EQ(r.position(), w->end());
  uint64_t on_disk = 0;
  for (uint64_t seq : seqs) {
    struct stat st;
    ASSERT_EQ(::fstatat(dir.fd(), JournalSegmentName(seq).c_str(), &st, 0), 0);
    on_disk += static_cast<uint64_t>(st.st_size);
  }
  EXPECT_EQ(usage.bytes.load(), on_disk);
}

TEST(Journal, ReaderStopsAtTheCommittedEndAndGoesOnWhenItMoves) {
  TempDir dir;
  JournalUsage usage;
  std::unique_ptr<JournalWriter> w;
  ASSERT_TRUE(JournalWriter::Open({dir.path(), 64 << 20}, &usage, &w).ok());
  ASSERT_TRUE(w->Append(Framed(NumberedPost(1, 0)), false, nullptr).ok());
  const JournalPosition limit1 = w->end();
  // A write that is reserved and written but not committed is not read.
  JournalWriter::Slot slot;
  const auto rec = Framed(NumberedPost(1, 1));
  ASSERT_TRUE(w->Reserve(rec.size(), &slot).ok());
  ASSERT_EQ(::pwrite(slot.fd, rec.data(), rec.size(), static_cast<off_t>(slot.position.offset)),
            static_cast<ssize_t>(rec.size()));
  JournalReader r(dir.fd());
  EXPECT_EQ(ReadSeqs(&r, limit1), (std::vector<uint64_t>{0}));
  const JournalPosition limit2 = w->Committed();
  EXPECT_EQ(ReadSeqs(&r, limit2), (std::vector<uint64_t>{1}));
  EXPECT_EQ(ReadSeqs(&r, limit2), (std::vector<uint64_t>{}));
}

TEST(Journal, ReopeningStartsANewSegmentAndKeepsTheOldRecords) {
  TempDir dir;
  JournalUsage usage;
  JournalPosition end1;
  {
    std::unique_ptr<JournalWriter> w;
    ASSERT_TRUE(JournalWriter::Open({dir.path(), 64 << 20}, &usage, &w).ok());
    ASSERT_TRUE(w->Append(Framed(NumberedPost(1, 0)), true, nullptr).ok());
    end1 = w->end();
  }
  // A torn write at the end of the old segment (the daemon died mid-write).
  {
    UniqueFd fd(::openat(dir.fd(), JournalSegmentName(end1.segment_seq).c_str(), O_WRONLY | O_APPEND));
    const auto rec = Framed(NumberedPost(1, 99));
    ASSERT_EQ(::write(fd.get(), rec.data(), rec.size() / 2), static_cast<ssize_t>(rec.size() / 2));
  }
  std::unique_ptr<JournalWriter> w;
  ASSERT_TRUE(JournalWriter::Open({dir.path(), 64 << 20}, &usage, &w).ok());
  EXPECT_EQ(w->end().segment_seq, end1.segment_seq + 1);
  ASSERT_TRUE(w->Append(Framed(NumberedPost(1, 1)), false, nullptr).ok());
  JournalReader r(dir.fd());
  EXPECT_EQ(ReadSeqs(&r, w->end()), (std::vector<uint64_t>{0, 1}));
}

TEST(Journal, ReaderResumesFromAPositionItHandedOut) {
  TempDir dir;
  JournalUsage usage;
  std::unique_ptr<JournalWriter> w;
  ASSERT_TRUE(JournalWriter::Open({dir.path(), 1 << 20}, &usage, &w).ok());
  for (uint64_t i = 0; i < 2000; ++i) {
    ASSERT_TRUE(w->Append(Framed(NumberedPost(1, i, 800)), false, nullptr).ok());
  }
  JournalReader r(dir.fd());
  JournalReader::Entry e;
  bool got = false;
  JournalPosition resume;
  for (int i = 0; i < 1500; ++i) {
    ASSERT_TRUE(r.Next(w->end(), &e, &got).ok());
    ASSERT_TRUE(got);
    resume = e.next;
  }
  JournalReader again(dir.fd());
  again.Seek(resume);
  const auto rest = ReadSeqs(&again, w->end());
  ASSERT_EQ(rest.size(), 500u);
  EXPECT_EQ(rest.front(), 1500u);
}

TEST(Checkpoint, StoresAndLoadsAndStartsAtTheBeginning) {
  TempDir dir;
  JournalPosition p;
  ASSERT_TRUE(Checkpoint::Load(dir.fd(), &p).ok());
  EXPECT_EQ(p, JournalPosition{});
  ASSERT_TRUE(Checkpoint::Store(dir.fd(), {7, 4096}).ok());
  ASSERT_TRUE(Checkpoint::Store(dir.fd(), {8, 128}).ok());
  ASSERT_TRUE(Checkpoint::Load(dir.fd(), &p).ok());
  EXPECT_EQ(p, (JournalPosition{8, 128}));
  EXPECT_EQ(dir.List(), std::vector<std::string>{"checkpoint"});
}

TEST(Checkpoint, DamagedCheckpointIsCorruptionNotTheBeginning) {
  TempDir dir;
  ASSERT_TRUE(Checkpoint::Store(dir.fd(), {7, 4096}).ok());
  UniqueFd fd(::openat(dir.fd(), "checkpoint", O_WRONLY));
  const char x = 'x';
  ASSERT_EQ(::pwrite(fd.get(), &x, 1, 10), 1);
  JournalPosition p;
  EXPECT_EQ(Checkpoint::Load(dir.fd(), &p).code(), StatusCode::kCorruption);
}

TEST(Journal, OnlySegmentsWhollyBeforeTheWatermarkAreDeleted) {
  TempDir dir;
  JournalUsage usage;
  std::unique_ptr<JournalWriter> w;
  ASSERT_TRUE(JournalWriter::Open({dir.path(), 1 << 20}, &usage, &w).ok());
  for (uint64_t i = 0; i < 3000; ++i) {
    ASSERT_TRUE(w->Append(Framed(NumberedPost(1, i, 800)), false, nullptr).ok());
  }
  std::vector<uint64_t> seqs;
  ASSERT_TRUE(ListJournalSegments(dir.fd(), &seqs).ok());
  ASSERT_GE(seqs.size(), 3u);
  const uint64_t before = usage.bytes.load();
  int deleted = 0;
  ASSERT_TRUE(DeleteConfirmedSegments(dir.fd(), {seqs[2], 4096}, &usage, &deleted).ok());
  EXPECT_EQ(deleted, 2);
  std::vector<uint64_t> left;
  ASSERT_TRUE(ListJournalSegments(dir.fd(), &left).ok());
  EXPECT_EQ(left.front(), seqs[2]);
  EXPECT_LT(usage.bytes.load(), before);
  // A reader from the beginning starts at the oldest segment left.
  JournalReader r(dir.fd());
  const auto rest = ReadSeqs(&r, w->end());
  ASSERT_FALSE(rest.empty());
  EXPECT_EQ(rest.back(), 2999u);
}

}  // namespace
}  // namespace postspool::daemon
