// The ids of the last posts journaled, so that spool adoption can drop a
// spooled copy of a post that is in the journal already: one whose
// acknowledgement reached its client too late (the client then spooled it
// as well), or one of a spool segment the daemon was adopting when it died.
// A bounded FIFO set: memory is fixed by `capacity`, and an id is
// remembered until `capacity` newer ones came. The daemon fills it at start
// from its newest journal segments.
#pragma once

#include <cstddef>
#include <deque>
#include <unordered_set>

#include "post.h"

namespace postspool::daemon {

class RecentIds {
 public:
  explicit RecentIds(size_t capacity) : capacity_(capacity) { set_.reserve(capacity); }

  void Add(const PostId& id) {
    if (capacity_ == 0 || !set_.insert(id).second) return;
    order_.push_back(id);
    if (order_.size() > capacity_) {
      set_.erase(order_.front());
      order_.pop_front();
    }
  }
  bool Contains(const PostId& id) const { return set_.count(id) != 0; }

 private:
  struct Hash {
    size_t operator()(const PostId& id) const { return static_cast<size_t>(id.hi ^ (id.lo * 0x9e3779b97f4a7c15ULL)); }
  };
  size_t capacity_;
  std::unordered_set<PostId, Hash> set_;
  std::deque<PostId> order_;
};

}  // namespace postspool::daemon
