// The journal: segments, the committed end, reading across segments, the
// checkpoint, and deleting confirmed segments.
#include "journal.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>

#include "little_endian.h"
#include "test_util.h"
#include <xxhash.h>

namespace postspool::daemon {
namespace {

using testing::FailingSource;
using testing::NumberedPost;
using testing::SmallFilesystem;
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

TEST(JournalReader, CommitByCommitItReadsOnWithOneSourcePerSegment) {
  // The forwarder reads up to the committed end after every commit: the
  // reader grows its source instead of opening the segment again (an
  // fstat, a header read and a 256 KiB window per reader and commit).
  TempDir dir;
  JournalUsage usage;
  std::unique_ptr<JournalWriter> w;
  ASSERT_TRUE(JournalWriter::Open({dir.path(), 1 << 20}, &usage, &w).ok());
  int opened = 0;
  JournalReader r(dir.fd());
  r.set_source_factory([&opened](int fd, uint64_t, uint64_t size_max,
                                 std::unique_ptr<segment::Source>* out) {
    ++opened;
    std::unique_ptr<segment::FileSource> file;
    if (Status s = segment::FileSource::Open(fd, &file, size_max); !s.ok()) return s;
    *out = std::move(file);
    return Status::Ok();
  });
  std::vector<uint64_t> want, read;
  for (uint64_t i = 0; i < 2000; ++i) {  // ~2000 * 800 B: two 1 MiB segments at least
    ASSERT_TRUE(w->Append(Framed(NumberedPost(1, i, 800)), false, nullptr).ok());
    want.push_back(i);
    for (uint64_t id : ReadSeqs(&r, w->end())) read.push_back(id);
  }
  EXPECT_EQ(read, want);
  std::vector<uint64_t> seqs;
  ASSERT_TRUE(ListJournalSegments(dir.fd(), &seqs).ok());
  ASSERT_GE(seqs.size(), 2u);
  EXPECT_EQ(opened, static_cast<int>(seqs.size()));
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

// The writer numbers its first segment after the checkpoint's. A checkpoint
// it cannot read (here: a directory, EISDIR) fails the start, as the
// forwarder could read it a moment later and take the new segments, numbered
// below it, as confirmed; a damaged one (garbage) does not.
TEST(JournalWriter, RefusesToStartOnACheckpointItCannotRead) {
  TempDir dir;
  ASSERT_EQ(::mkdirat(dir.fd(), "checkpoint", 0700), 0);
  JournalUsage usage;
  std::unique_ptr<JournalWriter> w;
  const Status s = JournalWriter::Open({dir.path(), 1 << 20}, &usage, &w);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("checkpoint"), std::string::npos) << s.message();
  ASSERT_EQ(::unlinkat(dir.fd(), "checkpoint", AT_REMOVEDIR), 0);
  {
    std::ofstream f(dir.path() + "/checkpoint", std::ios::binary);
    f << "not a checkpoint at all";
  }
  EXPECT_TRUE(JournalWriter::Open({dir.path(), 1 << 20}, &usage, &w).ok());
}

TEST(Checkpoint, StoresAndLoadsAndStartsAtTheBeginning) {
  TempDir dir;
  JournalPosition p;
  ASSERT_TRUE(Checkpoint::Load(dir.fd(), &p).ok());
  EXPECT_EQ(p, JournalPosition{});
  std::unique_ptr<Checkpoint> c;
  ASSERT_TRUE(Checkpoint::Open(dir.fd(), {7, 4096}, &c).ok());
  ASSERT_TRUE(Checkpoint::Load(dir.fd(), &p).ok());
  EXPECT_EQ(p, (JournalPosition{7, 4096})) << "created holding the position given";
  ASSERT_TRUE(c->Store({8, 128}).ok());
  ASSERT_TRUE(c->Store({9, 256}).ok());
  ASSERT_TRUE(c->Store({9, 512}).ok());
  ASSERT_TRUE(Checkpoint::Load(dir.fd(), &p).ok());
  EXPECT_EQ(p, (JournalPosition{9, 512}));
  EXPECT_EQ(dir.List(), std::vector<std::string>{"checkpoint"});
}

TEST(Checkpoint, StoresRewriteTheSameFileInPlace) {
  TempDir dir;
  std::unique_ptr<Checkpoint> c;
  ASSERT_TRUE(Checkpoint::Open(dir.fd(), {1, 128}, &c).ok());
  struct stat before;
  ASSERT_EQ(::fstatat(dir.fd(), "checkpoint", &before, 0), 0);
  for (uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(c->Store({2, 128 + i * 8}).ok());
  ASSERT_TRUE(c->Sync().ok());
  struct stat after;
  ASSERT_EQ(::fstatat(dir.fd(), "checkpoint", &after, 0), 0);
  EXPECT_EQ(after.st_ino, before.st_ino) << "no new file, no rename";
  EXPECT_EQ(after.st_size, before.st_size);
  EXPECT_EQ(after.st_blocks, before.st_blocks) << "preallocated: stores allocate nothing";
  // Opened again (a restart), it goes on from the newest slot.
  c.reset();
  ASSERT_TRUE(Checkpoint::Open(dir.fd(), {}, &c).ok());
  ASSERT_TRUE(c->Store({3, 128}).ok());
  JournalPosition p;
  ASSERT_TRUE(Checkpoint::Load(dir.fd(), &p).ok());
  EXPECT_EQ(p, (JournalPosition{3, 128}));
}

TEST(Checkpoint, TornWriteOfOneSlotKeepsThePreviousWatermark) {
  TempDir dir;
  std::unique_ptr<Checkpoint> c;
  ASSERT_TRUE(Checkpoint::Open(dir.fd(), {1, 128}, &c).ok());
  ASSERT_TRUE(c->Store({5, 1000}).ok());
  ASSERT_TRUE(c->Store({6, 2000}).ok());
  // The newest store is torn: only some of its bytes reached the disk. The
  // slots are 4 KiB apart; find the one holding {6, 2000} (the newer).
  UniqueFd fd(::openat(dir.fd(), "checkpoint", O_RDWR));
  ASSERT_TRUE(fd.valid());
  int newest = -1;
  for (int slot = 0; slot < 2; ++slot) {
    uint64_t seq = 0;
    ASSERT_EQ(::pread(fd.get(), &seq, sizeof seq, slot * 4096 + 16), 8);
    if (seq == 6) newest = slot;
  }
  ASSERT_GE(newest, 0);
  const uint64_t garbage = 0x1234;
  ASSERT_EQ(::pwrite(fd.get(), &garbage, sizeof garbage, newest * 4096 + 24), 8);
  JournalPosition p;
  ASSERT_TRUE(Checkpoint::Load(dir.fd(), &p).ok());
  EXPECT_EQ(p, (JournalPosition{5, 1000}));
}

TEST(Checkpoint, NeverStoredPastADamagedSegmentNotYetSetAside) {
  EXPECT_EQ(StorableCheckpoint({5, 4096}, std::nullopt), (JournalPosition{5, 4096}));
  EXPECT_EQ(StorableCheckpoint({5, 4096}, JournalPosition{3, 128}), (JournalPosition{3, 128}))
      << "a restart must read segment 3 again to find it damaged and set it aside";
  EXPECT_EQ(StorableCheckpoint({2, 4096}, JournalPosition{3, 128}), (JournalPosition{2, 4096}));
}

TEST(Checkpoint, DamagedCheckpointIsCorruptionNotTheBeginning) {
  TempDir dir;
  std::unique_ptr<Checkpoint> c;
  ASSERT_TRUE(Checkpoint::Open(dir.fd(), {7, 4096}, &c).ok());
  ASSERT_TRUE(c->Store({8, 4096}).ok());
  UniqueFd fd(::openat(dir.fd(), "checkpoint", O_WRONLY));
  const char x = 'x';
  ASSERT_EQ(::pwrite(fd.get(), &x, 1, 10), 1);
  ASSERT_EQ(::pwrite(fd.get(), &x, 1, 4096 + 10), 1);
  JournalPosition p;
  EXPECT_EQ(Checkpoint::Load(dir.fd(), &p).code(), StatusCode::kCorruption);
}

// The checkpoint file of earlier releases: "PSCK", version 1, seq, offset,
// masked XXH3-64 of the first 24 bytes.
void WriteVersion1Checkpoint(int dirfd, JournalPosition pos) {
  std::byte raw[32];
  StoreLe32(raw, 0x4b435350);
  StoreLe32(raw + 4, 1);
  StoreLe64(raw + 8, pos.segment_seq);
  StoreLe64(raw + 16, pos.offset);
  StoreLe64(raw + 24, segment::MaskChecksum(XXH3_64bits(raw, 24)));
  UniqueFd fd(::openat(dirfd, "checkpoint", O_WRONLY | O_CREAT | O_TRUNC, 0600));
  ASSERT_EQ(::write(fd.get(), raw, sizeof raw), 32);
}

TEST(Checkpoint, Version1FileIsReadAndUpgradedKeepingItsWatermark) {
  TempDir dir;
  WriteVersion1Checkpoint(dir.fd(), {12, 4096});
  JournalPosition p;
  ASSERT_TRUE(Checkpoint::Load(dir.fd(), &p).ok());
  EXPECT_EQ(p, (JournalPosition{12, 4096}));
  std::unique_ptr<Checkpoint> c;
  ASSERT_TRUE(Checkpoint::Open(dir.fd(), p, &c).ok());
  ASSERT_TRUE(Checkpoint::Load(dir.fd(), &p).ok());
  EXPECT_EQ(p, (JournalPosition{12, 4096}));
  ASSERT_TRUE(c->Store({13, 128}).ok());
  ASSERT_TRUE(Checkpoint::Load(dir.fd(), &p).ok());
  EXPECT_EQ(p, (JournalPosition{13, 128}));
  EXPECT_EQ(dir.List(), std::vector<std::string>{"checkpoint"});
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

TEST(Journal, OpenCreatesNoSegmentUntilTheFirstWrite) {
  TempDir dir;
  JournalUsage usage;
  std::unique_ptr<JournalWriter> w;
  ASSERT_TRUE(JournalWriter::Open({dir.path(), 1 << 20}, &usage, &w).ok());
  EXPECT_TRUE(dir.List().empty());
  EXPECT_EQ(w->end(), (JournalPosition{1, segment::kHeaderBytes}));
  EXPECT_EQ(usage.bytes.load(), 0u);
  JournalPosition first;
  ASSERT_TRUE(w->Append(Framed(NumberedPost(1, 0)), false, &first).ok());
  EXPECT_EQ(first, (JournalPosition{1, segment::kHeaderBytes})) << "end() was where it went";
  EXPECT_EQ(dir.List(), std::vector<std::string>{JournalSegmentName(1)});
}

TEST(Journal, EndBeforeTheFirstWriteCoversEveryRecordOfTheLastRun) {
  TempDir dir;
  JournalUsage usage;
  {
    std::unique_ptr<JournalWriter> w;
    ASSERT_TRUE(JournalWriter::Open({dir.path(), 1 << 20}, &usage, &w).ok());
    for (uint64_t i = 0; i < 2000; ++i) {
      ASSERT_TRUE(w->Append(Framed(NumberedPost(1, i, 800)), false, nullptr).ok());
    }
  }
  std::unique_ptr<JournalWriter> w;
  ASSERT_TRUE(JournalWriter::Open({dir.path(), 1 << 20}, &usage, &w).ok());
  // What the ingest loop publishes on the CommitChannel at start.
  JournalReader r(dir.fd());
  const std::vector<uint64_t> got = ReadSeqs(&r, w->end());
  ASSERT_EQ(got.size(), 2000u);
  EXPECT_EQ(got.back(), 1999u);
  EXPECT_EQ(r.position(), w->end());
}

TEST(Journal, FirstSegmentGoesAfterTheCheckpointWhenEverySegmentWasDeleted) {
  TempDir dir;
  JournalUsage usage;
  JournalPosition end;
  {
    std::unique_ptr<JournalWriter> w;
    ASSERT_TRUE(JournalWriter::Open({dir.path(), 1 << 20}, &usage, &w).ok());
    for (uint64_t i = 0; i < 2000; ++i) {
      ASSERT_TRUE(w->Append(Framed(NumberedPost(1, i, 800)), false, nullptr).ok());
    }
    // The forwarder confirmed everything up to a writer's end() whose
    // segment was never created, and deleted every segment before it.
    std::unique_ptr<JournalWriter> idle;
    ASSERT_TRUE(JournalWriter::Open({dir.path(), 1 << 20}, &usage, &idle).ok());
    end = idle->end();
  }
  std::unique_ptr<Checkpoint> c;
  ASSERT_TRUE(Checkpoint::Open(dir.fd(), end, &c).ok());
  int deleted = 0;
  ASSERT_TRUE(DeleteConfirmedSegments(dir.fd(), end, &usage, &deleted).ok());
  ASSERT_GT(deleted, 0);
  std::unique_ptr<JournalWriter> w;
  ASSERT_TRUE(JournalWriter::Open({dir.path(), 1 << 20}, &usage, &w).ok());
  EXPECT_GT(w->end(), end);
  ASSERT_TRUE(w->Append(Framed(NumberedPost(2, 0)), false, nullptr).ok());
  // A forwarder starting from the checkpoint finds the new post.
  JournalReader r(dir.fd());
  r.Seek(end);
  EXPECT_EQ(ReadSeqs(&r, w->end()), (std::vector<uint64_t>{0}));
}

TEST(JournalReader, DamagedHeaderIsCorruptionNamingTheFileAndTheNextSegmentIsReadAfterASkip) {
  TempDir dir;
  JournalUsage usage;
  std::unique_ptr<JournalWriter> w;
  ASSERT_TRUE(JournalWriter::Open({dir.path(), 64 << 10}, &usage, &w).ok());
  std::vector<uint64_t> seqs;
  for (uint64_t i = 0; i < 300; ++i) {
    ASSERT_TRUE(w->Append(Framed(NumberedPost(1, i, 800)), false, nullptr).ok());
  }
  ASSERT_TRUE(ListJournalSegments(dir.fd(), &seqs).ok());
  ASSERT_GE(seqs.size(), 4u);
  {
    // A flipped byte in the header of the second segment, and a third that
    // is empty (power loss at durability `accepted`).
    UniqueFd fd(::openat(dir.fd(), JournalSegmentName(seqs[1]).c_str(), O_WRONLY));
    const char x = 'X';
    ASSERT_EQ(::pwrite(fd.get(), &x, 1, 1), 1);
    ASSERT_EQ(::truncate(dir.File(JournalSegmentName(seqs[2])).c_str(), 0), 0);
  }
  JournalReader r(dir.fd());
  JournalReader::Entry e;
  bool got = true;
  uint64_t read = 0;
  Status s;
  while ((s = r.Next(w->end(), &e, &got)).ok() && got) ++read;
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find(JournalSegmentName(seqs[1])), std::string::npos) << s.message();
  EXPECT_EQ(r.position().segment_seq, seqs[1]);
  // Still there on a retry: the reader stays where it was.
  EXPECT_EQ(r.Next(w->end(), &e, &got).code(), StatusCode::kCorruption);
  r.SkipSegment();
  s = r.Next(w->end(), &e, &got);
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << "the empty segment: " << s.ToString();
  EXPECT_EQ(r.position().segment_seq, seqs[2]);
  r.SkipSegment();
  const std::vector<uint64_t> rest = ReadSeqs(&r, w->end());
  ASSERT_FALSE(rest.empty());
  EXPECT_EQ(rest.back(), 299u);
  EXPECT_EQ(r.position(), w->end());
}

TEST(JournalReader, FinishedSegmentCutShortWhileReadIsCorruptionNotATornTail) {
  // Posts the writer committed to a finished segment, gone because someone
  // truncated it: damage (the forwarder sets the segment aside), not a torn
  // tail that would be skipped and deleted with the segment.
  TempDir dir;
  JournalUsage usage;
  std::unique_ptr<JournalWriter> w;
  ASSERT_TRUE(JournalWriter::Open({dir.path(), 2 << 20}, &usage, &w).ok());
  for (uint64_t i = 0; i < 4000; ++i) {
    ASSERT_TRUE(w->Append(Framed(NumberedPost(1, i, 800)), false, nullptr).ok());
  }
  std::vector<uint64_t> seqs;
  ASSERT_TRUE(ListJournalSegments(dir.fd(), &seqs).ok());
  ASSERT_GE(seqs.size(), 2u);
  JournalReader r(dir.fd());
  JournalReader::Entry e;
  bool got = false;
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(r.Next(w->end(), &e, &got).ok());
    ASSERT_TRUE(got);
  }
  ASSERT_EQ(::truncate(dir.File(JournalSegmentName(seqs[0])).c_str(), 300 << 10), 0);
  uint64_t read = 10;
  Status s;
  while ((s = r.Next(w->end(), &e, &got)).ok() && got) ++read;
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find(JournalSegmentName(seqs[0])), std::string::npos) << s.message();
  EXPECT_EQ(r.position().segment_seq, seqs[0]);
  EXPECT_LT(read, 400u);  // what the first 300 KiB held, and no more
  r.SkipSegment();
  const std::vector<uint64_t> rest = ReadSeqs(&r, w->end());
  ASSERT_FALSE(rest.empty());
  EXPECT_EQ(rest.back(), 3999u);
}

TEST(JournalReader, ReadErrorIsAStatusAndARetryGoesOnWhereItStopped) {
  TempDir dir;
  JournalUsage usage;
  std::unique_ptr<JournalWriter> w;
  ASSERT_TRUE(JournalWriter::Open({dir.path(), 64 << 20}, &usage, &w).ok());
  for (uint64_t i = 0; i < 20; ++i) {
    ASSERT_TRUE(w->Append(Framed(NumberedPost(1, i)), false, nullptr).ok());
  }
  std::atomic<int> failures{0};
  JournalReader r(dir.fd());
  r.set_source_factory([&failures](int fd, uint64_t, uint64_t size_max,
                                   std::unique_ptr<segment::Source>* out) {
    std::unique_ptr<segment::FileSource> file;
    if (Status s = segment::FileSource::Open(fd, &file, size_max); !s.ok()) return s;
    *out = std::make_unique<FailingSource>(std::move(file), &failures);
    return Status::Ok();
  });
  JournalReader::Entry e;
  bool got = false;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(r.Next(w->end(), &e, &got).ok());
    ASSERT_TRUE(got);
  }
  const JournalPosition at = r.position();
  // The next two reads of the file fail (the reader holds a window of the
  // file in memory: the Seek makes it read again). After an error it opens
  // the file afresh, so the header read may be the one that fails.
  r.Seek(at);
  failures = 2;
  Status s = r.Next(w->end(), &e, &got);
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  EXPECT_EQ(s.sys_errno(), EIO);
  EXPECT_NE(s.message().find(JournalSegmentName(at.segment_seq)), std::string::npos);
  EXPECT_EQ(r.position(), at);
  s = r.Next(w->end(), &e, &got);
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  EXPECT_EQ(r.position(), at);
  EXPECT_EQ(ReadSeqs(&r, w->end()),
            (std::vector<uint64_t>{5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}));
}

TEST(Journal, DamagedSegmentIsMovedAsideUnderANameThatReplacesNothing) {
  TempDir dir;
  JournalUsage usage;
  std::unique_ptr<JournalWriter> w;
  ASSERT_TRUE(JournalWriter::Open({dir.path(), 64 << 10}, &usage, &w).ok());
  for (uint64_t i = 0; i < 300; ++i) {
    ASSERT_TRUE(w->Append(Framed(NumberedPost(1, i, 800)), false, nullptr).ok());
  }
  std::vector<uint64_t> seqs;
  ASSERT_TRUE(ListJournalSegments(dir.fd(), &seqs).ok());
  ASSERT_GE(seqs.size(), 3u);
  struct stat st;
  ASSERT_EQ(::fstatat(dir.fd(), JournalSegmentName(seqs[0]).c_str(), &st, 0), 0);
  const uint64_t before = usage.bytes.load();
  std::string moved_to;
  ASSERT_TRUE(SetAsideDamagedSegment(dir.fd(), seqs[0], &usage, &moved_to).ok());
  EXPECT_EQ(moved_to, "damaged/" + JournalSegmentName(seqs[0]));
  EXPECT_EQ(usage.bytes.load(), before - static_cast<uint64_t>(st.st_size));
  struct stat dst;
  ASSERT_EQ(::fstatat(dir.fd(), "damaged", &dst, 0), 0);
  EXPECT_EQ(dst.st_mode & 07777, 0700u);
  // The same name again (a later run reused the seq): a new name.
  ASSERT_EQ(::linkat(dir.fd(), JournalSegmentName(seqs[1]).c_str(), dir.fd(),
                     JournalSegmentName(seqs[0]).c_str(), 0),
            0);
  ASSERT_TRUE(SetAsideDamagedSegment(dir.fd(), seqs[0], &usage, &moved_to).ok());
  EXPECT_EQ(moved_to, "damaged/" + JournalSegmentName(seqs[0]) + ".1");
  struct stat first;
  ASSERT_EQ(::fstatat(dir.fd(), ("damaged/" + JournalSegmentName(seqs[0])).c_str(), &first, 0),
            0);
  EXPECT_EQ(first.st_ino, st.st_ino) << "the earlier file is still there";
  EXPECT_EQ(SetAsideDamagedSegment(dir.fd(), seqs[0], &usage, &moved_to).code(),
            StatusCode::kNotFound);
  // Confirmed segments listed as kept (damaged, not moved) are not deleted.
  int deleted = 0;
  ASSERT_TRUE(DeleteConfirmedSegments(dir.fd(), w->end(), &usage, &deleted,
                                      std::vector<uint64_t>{seqs[2]})
                  .ok());
  std::vector<uint64_t> left;
  ASSERT_TRUE(ListJournalSegments(dir.fd(), &left).ok());
  EXPECT_EQ(left.front(), seqs[2]);
}

TEST(JournalLock, SecondLockOfTheJournalDirectoryIsRefusedNamingTheHolder) {
  TempDir dir;
  UniqueFd lock;
  ASSERT_TRUE(LockJournalDir(dir.path(), &lock).ok());
  struct stat st;
  ASSERT_EQ(::fstatat(dir.fd(), "lock", &st, 0), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  // flock locks belong to the open file description: a second open in the
  // same process conflicts, as another daemon would.
  UniqueFd second;
  const Status s = LockJournalDir(dir.path(), &second);
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(s.message().find("another postspoold (pid " + std::to_string(::getpid()) + ")"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find(dir.path()), std::string::npos) << s.message();
  EXPECT_FALSE(second.valid());
  lock.reset();
  EXPECT_TRUE(LockJournalDir(dir.path(), &second).ok()) << "free once the holder closed it";
}

TEST(JournalLock, AChildProcessCannotTakeItAndItIsFreeOnceTheHolderIsKilled) {
  TempDir dir;
  UniqueFd lock;
  ASSERT_TRUE(LockJournalDir(dir.path(), &lock).ok());
  const pid_t child = ::fork();
  if (child == 0) {
    UniqueFd mine;
    const Status s = LockJournalDir(dir.path(), &mine);
    ::_exit(s.code() == StatusCode::kAlreadyExists ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child got the lock";
  lock.reset();
  // A holder that dies by SIGKILL (no cleanup at all) frees it at once.
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t holder = ::fork();
  if (holder == 0) {
    UniqueFd mine;
    const char c = LockJournalDir(dir.path(), &mine).ok() ? 'y' : 'n';
    if (::write(ready[1], &c, 1) != 1) ::_exit(1);
    for (;;) ::pause();
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  ::close(ready[1]);
  ASSERT_EQ(c, 'y');
  const Status held = LockJournalDir(dir.path(), &lock);
  EXPECT_EQ(held.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(held.message().find("pid " + std::to_string(holder)), std::string::npos)
      << held.message();
  ASSERT_EQ(::kill(holder, SIGKILL), 0);
  ASSERT_EQ(::waitpid(holder, &status, 0), holder);
  EXPECT_TRUE(LockJournalDir(dir.path(), &lock).ok());
}

TEST(JournalLock, LockFileThatIsASymlinkIsRefused) {
  TempDir dir;
  ASSERT_EQ(::symlinkat("/tmp/elsewhere", dir.fd(), "lock"), 0);
  UniqueFd lock;
  EXPECT_FALSE(LockJournalDir(dir.path(), &lock).ok());
}

TEST(Journal, OnAFullDiskTheWriterOpensAndTheCheckpointAndDeletionsWork) {
  SmallFilesystem fs(512 << 10);
  if (!fs.mounted()) GTEST_SKIP() << fs.why_not();
  const std::string dir = fs.path() + "/journal";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  UniqueFd dirfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY));
  JournalUsage usage;
  JournalPosition end;
  {
    std::unique_ptr<JournalWriter> w;
    ASSERT_TRUE(JournalWriter::Open({dir, 32 << 10}, &usage, &w).ok());
    for (uint64_t i = 0; i < 200; ++i) {
      ASSERT_TRUE(w->Append(Framed(NumberedPost(1, i, 800)), false, nullptr).ok());
    }
    end = w->end();
  }
  std::unique_ptr<Checkpoint> checkpoint;
  ASSERT_TRUE(Checkpoint::Open(dirfd.get(), {}, &checkpoint).ok());
  fs.Fill();
  ASSERT_EQ(fs.free_bytes(), 0u);

  // (a) The daemon starts: the writer opens, and says clearly that it
  // cannot write yet; so does every later attempt.
  std::unique_ptr<JournalWriter> w;
  const Status opened = JournalWriter::Open({dir, 32 << 10}, &usage, &w);
  ASSERT_TRUE(opened.ok()) << opened.ToString();
  JournalWriter::Slot slot;
  EXPECT_EQ(w->Reserve(100, &slot).code(), StatusCode::kNoSpace);
  EXPECT_EQ(w->Reserve(100, &slot).code(), StatusCode::kNoSpace);
  // A checkpoint file cannot be made now, and none is left half made.
  {
    std::unique_ptr<Checkpoint> none;
    const std::string other = fs.path() + "/other";
    ASSERT_EQ(::mkdir(other.c_str(), 0700), 0);
    UniqueFd otherfd(::open(other.c_str(), O_RDONLY | O_DIRECTORY));
    EXPECT_EQ(Checkpoint::Open(otherfd.get(), {}, &none).code(), StatusCode::kNoSpace);
    struct stat st;
    EXPECT_NE(::fstatat(otherfd.get(), "checkpoint.new", &st, 0), 0);
    EXPECT_NE(::fstatat(otherfd.get(), "checkpoint", &st, 0), 0);
  }

  // (b) The forwarder's side: the broker confirmed everything up to `end`;
  // the watermark is stored in place and the confirmed segments go.
  ASSERT_TRUE(checkpoint->Store(end).ok());
  ASSERT_TRUE(checkpoint->Sync().ok());
  JournalPosition loaded;
  ASSERT_TRUE(Checkpoint::Load(dirfd.get(), &loaded).ok());
  EXPECT_EQ(loaded, end);
  int deleted = 0;
  ASSERT_TRUE(DeleteConfirmedSegments(dirfd.get(), end, &usage, &deleted).ok());
  EXPECT_GT(deleted, 3);
  EXPECT_GT(fs.free_bytes(), 100u << 10);

  // And the writer writes again, after everything that was there.
  JournalPosition first;
  ASSERT_TRUE(w->Append(Framed(NumberedPost(2, 0)), false, &first).ok());
  EXPECT_GT(first, end);
  JournalReader r(dirfd.get());
  r.Seek(loaded);
  EXPECT_EQ(ReadSeqs(&r, w->end()), (std::vector<uint64_t>{0}));
}

}  // namespace
}  // namespace postspool::daemon
