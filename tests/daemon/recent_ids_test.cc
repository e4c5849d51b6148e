// RecentIds: a bounded FIFO set of post ids.
#include "recent_ids.h"

#include <gtest/gtest.h>

#include <random>

#include "test_util.h"

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

TEST(RecentIds, IdsChosenToCollideUnderAnUnkeyedHashSpreadOut) {
  // The hash before the key: hi ^ (lo * 0x9e3779b97f4a7c15). These ids all
  // hash to 0 under it, so every look-up walked one chain of 20,000 (ingest
  // 60-180 times slower, a start of 23 s).
  RecentIds::Key key;
  std::mt19937_64 rng(testing::TestSeed());
  for (auto& b : key) b = static_cast<unsigned char>(rng());
  RecentIds ids(20000, key);
  for (uint64_t i = 1; i <= 20000; ++i) ids.Add(PostId{i * 0x9e3779b97f4a7c15ULL, i});
  EXPECT_LE(ids.LongestChain(), 64u);
  for (uint64_t i = 1; i <= 20000; ++i) ASSERT_TRUE(ids.Contains(PostId{i * 0x9e3779b97f4a7c15ULL, i}));
}

}  // namespace
}  // namespace postspool::daemon
