// The ids of the last posts journaled, so that spool adoption can drop a
// spooled copy of a post that is in the journal already: one whose
// acknowledgement reached its client too late (the client then spooled it
// as well), or one of a spool segment the daemon was adopting when it died.
// A bounded FIFO set: memory is fixed by `capacity`, and an id is
// remembered until `capacity` newer ones came. The daemon fills it at start
// from its newest journal segments.
//
// The ids are chosen by clients, so the hash is keyed: XXH3 with a secret
// drawn at random when the daemon starts. Without the key, ids crafted to
// collide made every look-up walk one bucket (ingest 60-180 times slower,
// a start of 23 s); with it, nobody outside the daemon knows which ids
// collide.
#pragma once

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <span>
#include <vector>

#include "post.h"

namespace postspool::daemon {

// Open addressing with linear probing (at most half full) and a FIFO ring
// of the ids in the order they came: one cache line per look-up and no
// allocation per post (a std::unordered_set cost about a third of the
// ingest thread's time at 200,000 ring posts a second).
class RecentIds {
 public:
  // XXH3's secret: at least XXH3_SECRET_SIZE_MIN (136) bytes.
  using Key = std::array<unsigned char, 192>;

  RecentIds(size_t capacity, const Key& key) : capacity_(capacity) {
    key_ = key;
    if (capacity_ == 0) return;
    size_t n = 16;
    while (n < 2 * capacity_) n <<= 1;
    slots_.assign(n, Slot{});
    mask_ = n - 1;
    order_.resize(capacity_);
  }
  RecentIds(const RecentIds&) = delete;
  RecentIds& operator=(const RecentIds&) = delete;

  // An id already held is not added again (it keeps its place).
  void Add(const PostId& id) {
    if (capacity_ == 0) return;
    Insert(id, HashOf(id));
  }
  // Add, for a batch: the slots it is about to touch (the new ids' and the
  // evicted ones') are prefetched a few ids ahead, so that the cache misses
  // of a table larger than the cache overlap.
  void AddAll(std::span<const PostId> ids) {
    if (capacity_ == 0) return;
    constexpr size_t kAhead = 8;
    for (size_t k = 0; k < ids.size(); ++k) {
      if (k + kAhead < ids.size()) {
        __builtin_prefetch(&slots_[HashOf(ids[k + kAhead]) & mask_], 1);
        if (count_ == capacity_) {
          const size_t old = (next_ + kAhead) % capacity_;
          __builtin_prefetch(&slots_[HashOf(order_[old]) & mask_], 1);
        }
      }
      Insert(ids[k], HashOf(ids[k]));
    }
  }
  bool Contains(const PostId& id) const { return capacity_ != 0 && Find(id, HashOf(id)) != kNone; }
  // Forgets `id`; false if it was not held. Its place in the FIFO stays
  // taken until the place comes round (Erase then finds nothing).
  bool Remove(const PostId& id) { return capacity_ != 0 && Erase(id); }
  // The longest probe sequence: what one look-up may have to walk.
  size_t LongestChain() const {
    size_t longest = 0;
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].used) longest = std::max(longest, ((i - slots_[i].hash) & mask_) + 1);
    }
    return longest;
  }

 private:
  static constexpr size_t kNone = ~size_t{0};
  struct Slot {
    PostId id;
    uint64_t hash = 0;
    bool used = false;
  };
  void Insert(const PostId& id, uint64_t h) {
    if (Find(id, h) != kNone) return;
    if (count_ == capacity_) {
      Erase(order_[next_]);
    } else {
      ++count_;
    }
    order_[next_] = id;
    next_ = next_ + 1 == capacity_ ? 0 : next_ + 1;
    size_t i = h & mask_;
    while (slots_[i].used) i = (i + 1) & mask_;
    slots_[i] = Slot{id, h, true};
  }
  uint64_t HashOf(const PostId& id) const {
    const uint64_t words[2] = {id.hi, id.lo};
    return XXH3_64bits_withSecret(words, sizeof words, key_.data(), key_.size());
  }
  size_t Find(const PostId& id, uint64_t h) const {
    for (size_t i = h & mask_; slots_[i].used; i = (i + 1) & mask_) {
      if (slots_[i].hash == h && slots_[i].id == id) return i;
    }
    return kNone;
  }
  // Backward-shift deletion: no tombstones, so probe sequences stay short.
  bool Erase(const PostId& id) {
    size_t i = Find(id, HashOf(id));
    if (i == kNone) return false;
    for (size_t j = (i + 1) & mask_; slots_[j].used; j = (j + 1) & mask_) {
      const size_t home = slots_[j].hash & mask_;
      // Slot j may move back to i only if its home is not in (i, j].
      const bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
      if (stays) continue;
      slots_[i] = slots_[j];
      i = j;
    }
    slots_[i].used = false;
    return true;
  }

  size_t capacity_;
  Key key_{};
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  std::vector<PostId> order_;  // a ring: order_[next_] is the oldest once full
  size_t next_ = 0;
  size_t count_ = 0;
};

}  // namespace postspool::daemon
