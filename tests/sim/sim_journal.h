// The journal on SimFs: the JournalPort the Ingest writes through
// (SimJournal, a step-for-step mirror of JournalWriter and
// segment::CreateSegment on SimFs), the forwarder's reader (SimJournalReader,
// a mirror of JournalReader that reads with the real SegmentReader over a
// MemorySource of the file's bytes), the checkpoint (the real 32-byte
// format) and the deletion of confirmed segments. Segments hold real records
// built by the real format code.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "journal.h"
#include "ports.h"
#include "post.h"
#include "segment_reader.h"
#include "sim_node.h"

namespace postspool::sim {

using daemon::JournalPosition;

// Where the Ingest publishes the committed end (the CommitChannel).
struct SimCommits {
  JournalPosition end;
  void Publish(JournalPosition e) {
    if (e > end) end = e;
  }
};

class SimJournal final : public daemon::JournalPort {
 public:
  struct Options {
    uint64_t segment_bytes_max = 64 << 10;
    bool sync = true;  // durability `synced`: a new segment's header and name are synced
  };
  // As JournalWriter::Open: counts the segments there, starts a new one.
  static Status Open(SimNode* node, const Options& options, daemon::JournalUsage* usage,
                     SimCommits* commits, std::unique_ptr<SimJournal>* out);
  ~SimJournal() override;

  void set_watermark(std::function<JournalPosition()> f) { watermark_ = std::move(f); }

  bool NeedsSegment(uint64_t bytes) const override;
  std::function<int64_t()> NewSegmentTask() override;
  Status SegmentDone() override;
  Status Reserve(uint64_t bytes, Slot* slot) override;
  JournalPosition Committed() override;
  void Abandon() override;
  JournalPosition end() const override { return end_; }
  uint64_t bytes() const override { return usage_->bytes.load(); }
  JournalPosition watermark() const override { return watermark_ ? watermark_() : JournalPosition{}; }
  void Publish(JournalPosition committed) override { commits_->Publish(committed); }

 private:
  SimJournal(SimNode* node, const Options& options, daemon::JournalUsage* usage,
             SimCommits* commits, uint64_t next_seq)
      : node_(node), options_(options), usage_(usage), commits_(commits), next_seq_(next_seq) {}
  Status StartSegment();
  Status CreateSegmentFile(uint64_t seq, int* fd);
  void CloseFd();

  SimNode* node_;
  Options options_;
  daemon::JournalUsage* usage_;
  SimCommits* commits_;
  std::function<JournalPosition()> watermark_;
  uint64_t next_seq_;
  int fd_ = -1;
  JournalPosition end_;
  uint64_t reserved_ = 0;
  bool reservation_open_ = false;
  // The segment the last task made (SegmentDone installs it).
  Status made_;
  int made_fd_ = -1;
  uint64_t made_seq_ = 0;
};

// Sorted sequence numbers of the journal segments.
std::vector<uint64_t> ListJournalSegments(const SimFs& fs);

// The mirror of JournalReader (journal.h) on SimFs.
class SimJournalReader {
 public:
  explicit SimJournalReader(SimFs* fs) : fs_(fs) {}
  ~SimJournalReader() { Release(); }
  SimJournalReader(const SimJournalReader&) = delete;
  SimJournalReader& operator=(const SimJournalReader&) = delete;

  void Seek(JournalPosition pos);
  Status Next(JournalPosition limit, daemon::JournalReader::Entry* entry, bool* got);
  JournalPosition position() const { return pos_; }
  uint64_t skipped_bytes() const { return skipped_bytes_; }

 private:
  Status OpenSegment(uint64_t seq, uint64_t offset, JournalPosition limit);
  void Release();

  SimFs* fs_;
  JournalPosition pos_;
  bool open_ = false;  // the descriptor: kept across reopenings of one segment
  SimFs::Ino ino_ = 0;
  std::vector<std::byte> bytes_;
  std::unique_ptr<segment::MemorySource> source_;
  std::unique_ptr<segment::SegmentReader> reader_;
  uint64_t open_seq_ = 0;
  uint64_t opened_limit_ = 0;
  uint64_t skipped_bytes_ = 0;
};

// Checkpoint::Load on SimFs, in the real (version 2) format.
Status LoadCheckpoint(SimFs* fs, JournalPosition* pos);

// Checkpoint::Open / Store / Sync on SimFs: a preallocated file of two slots,
// rewritten in place (Store writes the page cache; Sync makes it durable).
class SimCheckpoint {
 public:
  Status Open(SimFs* fs, JournalPosition pos);
  bool open() const { return open_; }
  Status Store(JournalPosition pos);
  Status Sync();

 private:
  SimFs* fs_ = nullptr;
  SimFs::Ino ino_{};
  uint64_t generation_ = 0;
  bool open_ = false;
};
// DeleteConfirmedSegments on SimFs.
Status DeleteConfirmedSegments(SimFs* fs, JournalPosition watermark, daemon::JournalUsage* usage,
                               int* deleted);

// Every valid record of a file's current bytes (from `offset`), as the
// real reader yields them, with where it starts and ends. False if the
// header is unreadable.
bool ReadRecords(const std::vector<std::byte>& bytes, uint64_t offset,
                 const std::function<void(const fb::Post&, uint64_t at, uint64_t next)>& f);

}  // namespace postspool::sim
