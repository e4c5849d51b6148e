// RecentIds: a bounded FIFO set of post ids.
#include "recent_ids.h"

#include <gtest/gtest.h>

namespace postspool::daemon {
namespace {

TEST(RecentIds, RemembersTheLastCapacityIdsAndForgetsTheOldest) {
  RecentIds ids(3, RecentIds::Key{});
  for (uint64_t i = 1; i <= 3; ++i) ids.Add(PostId{i, i});
  for (uint64_t i = 1; i <= 3; ++i) EXPECT_TRUE(ids.Contains(PostId{i, i}));
  ids.Add(PostId{4, 4});
  EXPECT_FALSE(ids.Contains(PostId{1, 1}));
  EXPECT_TRUE(ids.Contains(PostId{4, 4}));
  ids.Add(PostId{4, 4});  // again: no second slot
  ids.Add(PostId{5, 5});
  EXPECT_FALSE(ids.Contains(PostId{2, 2}));
  EXPECT_TRUE(ids.Contains(PostId{3, 3}));
}

TEST(RecentIds, CapacityZeroRemembersNothing) {
  RecentIds ids(0, RecentIds::Key{});
  ids.Add(PostId{1, 2});
  EXPECT_FALSE(ids.Contains(PostId{1, 2}));
}

}  // namespace
}  // namespace postspool::daemon
