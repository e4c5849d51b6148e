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
#include <deque>
#include <unordered_set>

#include "post.h"

namespace postspool::daemon {

class RecentIds {
 public:
  // XXH3's secret: at least XXH3_SECRET_SIZE_MIN (136) bytes.
  using Key = std::array<unsigned char, 192>;

  RecentIds(size_t capacity, const Key& key)
      : capacity_(capacity), set_(0, Hash{&key_}) {
    key_ = key;
    set_.reserve(capacity);
  }
  RecentIds(const RecentIds&) = delete;
  RecentIds& operator=(const RecentIds&) = delete;

  void Add(const PostId& id) {
    if (capacity_ == 0 || !set_.insert(id).second) return;
    order_.push_back(id);
    if (order_.size() > capacity_) {
      set_.erase(order_.front());
      order_.pop_front();
    }
  }
  bool Contains(const PostId& id) const { return set_.count(id) != 0; }
  // The most ids in one hash bucket: what one look-up may have to walk.
  size_t LongestChain() const {
    size_t longest = 0;
    for (size_t b = 0; b < set_.bucket_count(); ++b) longest = std::max(longest, set_.bucket_size(b));
    return longest;
  }

 private:
  struct Hash {
    const Key* key;
    size_t operator()(const PostId& id) const {
      const uint64_t words[2] = {id.hi, id.lo};
      return static_cast<size_t>(XXH3_64bits_withSecret(words, sizeof words, key->data(), key->size()));
    }
  };
  size_t capacity_;
  Key key_{};
  std::unordered_set<PostId, Hash> set_;
  std::deque<PostId> order_;
};

}  // namespace postspool::daemon
