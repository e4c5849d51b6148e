// PublishWindow: the forwarder's bookkeeping of what it has published and
// what the broker has confirmed, without any I/O, so that it is tested with a
// fake broker (tests/broker/forwarder_unit_test.cc).
//
// It holds one entry per journal record read since the watermark, in journal
// order, and maps the delivery tags of the channel (1, 2, 3, ... in publish
// order, as publisher confirms number them) to entries. A record is *done*
// when the broker acked it, or when it can never be published (an encoding
// error, an unroutable message under the drop policy); the watermark is the
// position just after the longest done prefix: everything before it may be
// deleted from the journal.
//
//   entry states:  in flight --ack--> done
//                  in flight --return, then ack--> done (drop) | waiting (retry)
//                  in flight --nack--> waiting --due, republished--> in flight
//
// Payloads are not kept here: the journal is the only copy, and a record is
// re-read from it by position when it has to be published again. Memory is
// bounded by window_max (entries and the span of unconfirmed tags).
//
// A post that must wait (nacked; returned under the retry policy) waits per
// post, with exponential backoff and full jitter: its n-th wait in a row is
// uniform in [0, min(retry_delay_max_ms, retry_delay_initial_ms * 2^(n-1))].
// So a broker that keeps refusing (a full queue, a missing binding) sees
// each post at most once per retry_delay_max_ms, not a busy loop. But a
// refusal that ends does not leave posts behind their timers: the first ack
// of a routed post after nacks makes every nacked post waiting due at once
// (the window is not held by retry timers once the broker takes posts).
//
// A lost channel (Reset) keeps what is known: entries already acked stay
// done and are not published again; only those in flight or waiting are
// published again, at once, in journal order, on the new channel.
//
// Not thread-safe: the forwarder thread's own.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <random>

#include "config.h"
#include "journal.h"
#include "post.h"

namespace postspool::daemon {

class PublishWindow {
 public:
  using Clock = std::chrono::steady_clock;

  struct Options {
    uint32_t window_max = 1000;
    UnroutablePolicy unroutable_policy = UnroutablePolicy::kDrop;
    uint32_t retry_delay_initial_ms = 100;
    uint32_t retry_delay_max_ms = 30000;
    uint64_t seed = 0;  // of the jitter
  };
  // `watermark`: where the journal reader starts (the stored checkpoint).
  PublishWindow(const Options& options, JournalPosition watermark);

  // --- Capacity -----------------------------------------------------------
  // A new record may be read and published: fewer than window_max entries
  // and unconfirmed tags.
  bool CanPublishNew() const;
  // A waiting entry may be published again (it needs a tag, not an entry).
  bool CanRepublish() const;

  // --- Publishing ---------------------------------------------------------
  // The record at [position, next) with post id `id` was just published;
  // returns the delivery tag it got. Records are added in journal order.
  uint64_t OnPublished(JournalPosition position, JournalPosition next, PostId id);
  // The record at [position, next) can never be published (it cannot be
  // encoded): done at once.
  void OnSkipped(JournalPosition position, JournalPosition next);
  // The journal reader found no record before its limit and stands at
  // `reader_position` (past any damage it skipped). With nothing pending,
  // the watermark moves there.
  void OnReaderIdle(JournalPosition reader_position);

  // A waiting entry whose retry time has come.
  struct Due {
    uint64_t handle = 0;  // valid until the entry is published again or Reset()
    JournalPosition position;
    JournalPosition next;
    PostId id;
  };
  // The first (in journal order) waiting entry due at `now`.
  bool NextDue(Clock::time_point now, Due* due) const;
  // The earliest retry time of a waiting entry; time_point::max() if none.
  Clock::time_point next_retry_at() const;
  // The due entry was published again; returns its new delivery tag.
  uint64_t OnRepublished(uint64_t handle);
  // The due entry cannot be read from the journal any more: done.
  void OnUnreadable(uint64_t handle);

  // --- Confirms -----------------------------------------------------------
  struct ConfirmResult {
    uint32_t confirmed = 0;  // acked, now done
    uint32_t dropped = 0;    // returned then acked under the drop policy: done
    uint32_t retried = 0;    // returned then acked under the retry policy: waiting
    uint32_t nacked = 0;     // nacked: waiting
    uint32_t unknown = 0;    // tags that are not unconfirmed (ignored)
    // The longest wait given to a post here (0 if none waits).
    std::chrono::milliseconds delay_max{0};
  };
  // basic.ack: `tag`, or with `multiple` every unconfirmed tag up to it (tag
  // 0 with multiple: all). Returned posts under the retry policy wait from
  // `now` (see the class comment).
  ConfirmResult OnAck(uint64_t tag, bool multiple, Clock::time_point now);
  // basic.nack: as OnAck, but every post confirmed by it waits from `now`
  // and is then published again.
  ConfirmResult OnNack(uint64_t tag, bool multiple, Clock::time_point now);
  // basic.return of the message with post id `id`: marks the oldest
  // unconfirmed, not yet returned publication of that id. False if there is
  // none (a return for something not in flight).
  bool OnReturn(PostId id);

  // --- Connection ---------------------------------------------------------
  // The channel is gone: every unconfirmed tag is void and tags restart at
  // `first_tag` (1 on a new channel; a channel that published before goes on
  // from its next tag). Entries the broker acked stay done (never published again); those in
  // flight or waiting become due at `now` and are published again on the
  // next channel (duplicates of those only, never loss). The journal reader
  // goes on where it is (after the last entry). Returns how many entries
  // will be published again.
  size_t Reset(Clock::time_point now, uint64_t first_tag = 1);

  // --- State --------------------------------------------------------------
  JournalPosition watermark() const { return watermark_; }
  // Publications awaiting a confirm.
  size_t in_flight() const { return in_flight_; }
  // Entries (records read and not yet in the done prefix).
  size_t size() const { return entries_.size(); }
  // Entries waiting to be published again.
  size_t waiting() const { return waiting_; }
  // In-flight entries the broker returned (awaiting their ack).
  size_t returned() const { return returned_; }
  uint64_t next_tag() const { return first_tag_ + tags_.size(); }
  uint32_t window_max() const { return options_.window_max; }
  // Records the watermark moved past since construction (done entries
  // popped; Reset() forgets entries without counting them, as they are read
  // and counted again). For the backlog count (forwarder.h).
  uint64_t done_total() const { return done_total_; }
  // Whether the watermark has to be written before up to `adding` more new
  // posts are published, so that a crash publishes again at most
  // window_max: those after the watermark written when done_total() was
  // `done_when_written` are the records the watermark moved past since,
  // plus the entries, and the entries can grow to window_max.
  bool WatermarkWriteDue(uint64_t done_when_written, size_t adding) const {
    const uint64_t entries_after =
        std::min<uint64_t>(entries_.size() + adding, options_.window_max);
    return done_total_ - done_when_written + entries_after > options_.window_max;
  }

 private:
  enum class State : uint8_t { kInFlight, kWaiting, kDone };
  struct Entry {
    JournalPosition position;
    JournalPosition next;
    PostId id;
    State state = State::kInFlight;
    bool returned = false;
    bool nacked = false;   // waiting because of a nack (not a return)
    uint32_t retries = 0;  // waits so far
    uint64_t tag = 0;
    Clock::time_point retry_at;
  };
  static constexpr uint64_t kNoEntry = UINT64_MAX;

  Entry& EntryAt(uint64_t handle);
  uint64_t AssignTag(uint64_t handle);
  // Applies an ack or nack to the entry holding `tag`.
  void Confirm(uint64_t tag, bool ack, Clock::time_point now, ConfirmResult* result);
  ConfirmResult ConfirmRange(uint64_t tag, bool multiple, bool ack, Clock::time_point now);
  // Pops the done prefix, moving the watermark.
  void Advance();
  // Makes every entry waiting after a nack due at `now`.
  void ReleaseNacked(Clock::time_point now);

  const Options options_;
  std::mt19937_64 rng_;
  JournalPosition watermark_;
  // Entries in journal order; entries_[i] has handle base_handle_ + i.
  std::deque<Entry> entries_;
  uint64_t base_handle_ = 0;
  // tags_[i] is the handle of the entry published with tag first_tag_ + i,
  // or kNoEntry once that tag is confirmed. The front is never kNoEntry.
  std::deque<uint64_t> tags_;
  uint64_t first_tag_ = 1;
  uint64_t done_total_ = 0;
  size_t in_flight_ = 0;
  size_t waiting_ = 0;
  size_t returned_ = 0;
};

}  // namespace postspool::daemon
