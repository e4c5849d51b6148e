#include "publish_window.h"

#include <algorithm>
#include <cassert>

#include "backoff.h"

namespace postspool::daemon {

namespace {

PublishWindow::Options Checked(PublishWindow::Options o) {
  if (o.window_max == 0) o.window_max = 1;
  return o;
}

}  // namespace

PublishWindow::PublishWindow(const Options& options, JournalPosition watermark)
    : options_(Checked(options)), rng_(options.seed), watermark_(watermark) {}

bool PublishWindow::CanPublishNew() const {
  return entries_.size() < options_.window_max && tags_.size() < options_.window_max;
}

bool PublishWindow::CanRepublish() const { return tags_.size() < options_.window_max; }

PublishWindow::Entry& PublishWindow::EntryAt(uint64_t handle) {
  assert(handle >= base_handle_ && handle - base_handle_ < entries_.size());
  return entries_[handle - base_handle_];
}

uint64_t PublishWindow::AssignTag(uint64_t handle) {
  const uint64_t tag = next_tag();
  tags_.push_back(handle);
  ++in_flight_;
  Entry& e = EntryAt(handle);
  e.state = State::kInFlight;
  e.returned = false;
  e.tag = tag;
  return tag;
}

uint64_t PublishWindow::OnPublished(JournalPosition position, JournalPosition next, PostId id) {
  assert(entries_.empty() ? position >= watermark_ : position >= entries_.back().next);
  assert(CanPublishNew());
  entries_.push_back(Entry{position, next, id, State::kInFlight, false, false, 0, 0, {}});
  return AssignTag(base_handle_ + entries_.size() - 1);
}

void PublishWindow::OnSkipped(JournalPosition position, JournalPosition next) {
  assert(entries_.empty() ? position >= watermark_ : position >= entries_.back().next);
  entries_.push_back(Entry{position, next, PostId{}, State::kDone, false, false, 0, 0, {}});
  Advance();
}

void PublishWindow::OnReaderIdle(JournalPosition reader_position) {
  if (entries_.empty() && reader_position > watermark_) watermark_ = reader_position;
}

bool PublishWindow::NextDue(Clock::time_point now, Due* due) const {
  if (waiting_ == 0) return false;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    if (e.state == State::kWaiting && e.retry_at <= now) {
      *due = Due{base_handle_ + i, e.position, e.next, e.id};
      return true;
    }
  }
  return false;
}

PublishWindow::Clock::time_point PublishWindow::next_retry_at() const {
  Clock::time_point earliest = Clock::time_point::max();
  if (waiting_ == 0) return earliest;
  for (const Entry& e : entries_) {
    if (e.state == State::kWaiting && e.retry_at < earliest) earliest = e.retry_at;
  }
  return earliest;
}

uint64_t PublishWindow::OnRepublished(uint64_t handle) {
  assert(EntryAt(handle).state == State::kWaiting);
  assert(CanRepublish());
  --waiting_;
  return AssignTag(handle);
}

void PublishWindow::OnUnreadable(uint64_t handle) {
  Entry& e = EntryAt(handle);
  assert(e.state == State::kWaiting);
  --waiting_;
  e.state = State::kDone;
  Advance();
}

void PublishWindow::Confirm(uint64_t tag, bool ack, Clock::time_point now,
                            ConfirmResult* result) {
  const uint64_t handle = tags_[tag - first_tag_];
  if (handle == kNoEntry) return;  // confirmed before
  tags_[tag - first_tag_] = kNoEntry;
  --in_flight_;
  Entry& e = EntryAt(handle);
  assert(e.state == State::kInFlight && e.tag == tag);
  const bool was_returned = e.returned;
  if (was_returned) --returned_;
  e.returned = false;
  e.nacked = !ack;
  if (!ack) {
    ++result->nacked;
  } else if (!was_returned) {
    ++result->confirmed;
    e.state = State::kDone;
    return;
  } else if (options_.unroutable_policy == UnroutablePolicy::kDrop) {
    ++result->dropped;
    e.state = State::kDone;
    return;
  } else {
    ++result->retried;
  }
  // Full jitter over this post's own exponential cap.
  const uint32_t cap = BackoffCapMs(options_.retry_delay_initial_ms, options_.retry_delay_max_ms,
                                    e.retries);
  if (e.retries < UINT32_MAX) ++e.retries;
  const std::chrono::milliseconds delay(std::uniform_int_distribution<uint32_t>(0, cap)(rng_));
  result->delay_max = std::max(result->delay_max, delay);
  e.state = State::kWaiting;
  e.retry_at = now + delay;
  ++waiting_;
}

PublishWindow::ConfirmResult PublishWindow::ConfirmRange(uint64_t tag, bool multiple, bool ack,
                                                         Clock::time_point now) {
  ConfirmResult result;
  const uint64_t end = next_tag();  // one past the last tag published
  if (tag >= end) {
    // A tag never published on this channel: the broker and we disagree.
    // Confirming anything on its word could lose posts; ignore it.
    ++result.unknown;
  } else if (multiple) {
    // "Up to and including tag"; tag 0 means every outstanding one.
    const uint64_t last = tag == 0 ? end - 1 : tag;
    for (uint64_t t = first_tag_; t <= last; ++t) Confirm(t, ack, now, &result);
  } else if (tag >= first_tag_ && tags_[tag - first_tag_] != kNoEntry) {
    Confirm(tag, ack, now, &result);
  } else {
    ++result.unknown;  // confirmed before
  }
  while (!tags_.empty() && tags_.front() == kNoEntry) {
    tags_.pop_front();
    ++first_tag_;
  }
  // The broker takes posts again: those it refused before need not wait.
  if (result.confirmed > 0) ReleaseNacked(now);
  Advance();
  return result;
}

PublishWindow::ConfirmResult PublishWindow::OnAck(uint64_t tag, bool multiple,
                                                  Clock::time_point now) {
  return ConfirmRange(tag, multiple, true, now);
}

PublishWindow::ConfirmResult PublishWindow::OnNack(uint64_t tag, bool multiple,
                                                   Clock::time_point now) {
  return ConfirmRange(tag, multiple, false, now);
}

bool PublishWindow::OnReturn(PostId id) {
  // The broker returns messages in publish order, before their ack: the
  // oldest unconfirmed publication of the id is the one returned.
  Entry* oldest = nullptr;
  for (Entry& e : entries_) {
    if (e.state == State::kInFlight && !e.returned && e.id == id &&
        (oldest == nullptr || e.tag < oldest->tag)) {
      oldest = &e;
    }
  }
  if (oldest == nullptr) return false;
  oldest->returned = true;
  ++returned_;
  return true;
}

size_t PublishWindow::Reset(Clock::time_point now, uint64_t first_tag) {
  size_t again = 0;
  for (Entry& e : entries_) {
    if (e.state == State::kDone) continue;
    // The old channel's acks will never come: publish it again at once.
    e.state = State::kWaiting;
    e.returned = false;
    e.nacked = false;
    e.retries = 0;
    e.tag = 0;
    e.retry_at = now;
    ++again;
  }
  tags_.clear();
  first_tag_ = first_tag;
  in_flight_ = 0;
  waiting_ = again;
  returned_ = 0;
  return again;
}

void PublishWindow::ReleaseNacked(Clock::time_point now) {
  if (waiting_ == 0) return;
  for (Entry& e : entries_) {
    if (e.state == State::kWaiting && e.nacked && e.retry_at > now) {
      e.retry_at = now;
      e.retries = 0;
    }
  }
}

void PublishWindow::Advance() {
  while (!entries_.empty() && entries_.front().state == State::kDone) {
    watermark_ = entries_.front().next;
    entries_.pop_front();
    ++base_handle_;
    ++done_total_;
  }
}

}  // namespace postspool::daemon
