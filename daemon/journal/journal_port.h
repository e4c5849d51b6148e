// WriterJournalPort: the JournalPort (ports.h) on a JournalWriter, as the
// ingest loop uses it: the segment task, the reservations, the usage the
// forwarder shares, where the committed end goes and where the watermark
// comes from. The daemon publishes on its CommitChannel and asks its
// Forwarder; the simulation (tests/sim) runs the same class over its
// simulated storage, with its own commit channel and forwarder.
#pragma once

#include <functional>
#include <memory>

#include "journal.h"
#include "ports.h"

namespace postspool::daemon {

class WriterJournalPort final : public JournalPort {
 public:
  using PublishFn = std::function<void(JournalPosition committed)>;
  using WatermarkFn = std::function<JournalPosition()>;
  // `writer` and `usage` must outlive the port.
  WriterJournalPort(JournalWriter* writer, JournalUsage* usage, PublishFn publish)
      : writer_(writer), usage_(usage), publish_(std::move(publish)) {}
  // Until set, the watermark is the beginning.
  void set_watermark(WatermarkFn f) { watermark_ = std::move(f); }

  bool NeedsSegment(uint64_t bytes) const override { return writer_->NeedsSegment(bytes); }
  std::function<int64_t()> NewSegmentTask() override;
  Status SegmentDone() override;
  Status Reserve(uint64_t bytes, Slot* slot) override;
  JournalPosition Committed() override { return writer_->Committed(); }
  void Abandon() override { writer_->Abandon(); }
  JournalPosition end() const override { return writer_->end(); }
  uint64_t bytes() const override { return usage_->bytes.load(std::memory_order_relaxed); }
  JournalPosition watermark() const override {
    return watermark_ ? watermark_() : JournalPosition{};
  }
  void Publish(JournalPosition committed) override { publish_(committed); }

 private:
  JournalWriter* writer_;
  JournalUsage* usage_;
  PublishFn publish_;
  WatermarkFn watermark_;
  std::shared_ptr<NewJournalSegment> made_;  // of the segment task in flight
};

}  // namespace postspool::daemon
