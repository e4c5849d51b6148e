// The forwarder's pure logic, without a broker: the publish window (tags,
// confirms, returns, the watermark), the reconnect backoff, message ids and
// broker URLs. A fake broker drives the window as the forwarder does.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "amqp_properties.h"
#include "amqp_url.h"
#include "backoff.h"
#include "broker_path.h"
#include "publish_window.h"
#include "test_util.h"

namespace postspool::daemon {
namespace {

using Clock = PublishWindow::Clock;
using std::chrono::milliseconds;

// Record i of a fake journal: segment 1 + i / 10, 100 bytes each.
JournalPosition Pos(uint64_t i) { return JournalPosition{1 + i / 10, 128 + (i % 10) * 100}; }
JournalPosition Next(uint64_t i) {
  return (i % 10) == 9 ? JournalPosition{1 + i / 10, 128 + 10 * 100} : Pos(i + 1);
}
PostId Id(uint64_t i) { return PostId{0xabc, i}; }

const Clock::time_point kT0 = Clock::time_point{} + std::chrono::hours(1);

// Retry delays: the n-th wait of a post is in [0, min(1600, 100 * 2^n)] ms.
PublishWindow::Options Options(uint32_t window_max, UnroutablePolicy policy, uint64_t seed = 1) {
  PublishWindow::Options o;
  o.window_max = window_max;
  o.unroutable_policy = policy;
  o.retry_delay_initial_ms = 100;
  o.retry_delay_max_ms = 1600;
  o.seed = seed;
  return o;
}

class PublishWindowTest : public ::testing::Test {
 protected:
  // Publishes records [first, first + n) in order; returns their tags.
  std::vector<uint64_t> PublishN(PublishWindow* w, uint64_t first, uint64_t n) {
    std::vector<uint64_t> tags;
    for (uint64_t i = first; i < first + n; ++i) tags.push_back(w->OnPublished(Pos(i), Next(i), Id(i)));
    return tags;
  }
};

TEST_F(PublishWindowTest, InOrderAcksMoveTheWatermarkRecordByRecord) {
  PublishWindow w(Options(10, UnroutablePolicy::kDrop), Pos(0));
  const std::vector<uint64_t> tags = PublishN(&w, 0, 3);
  EXPECT_EQ(tags, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(w.in_flight(), 3u);
  EXPECT_EQ(w.watermark(), Pos(0));
  for (uint64_t i = 0; i < 3; ++i) {
    const auto r = w.OnAck(tags[i], false, kT0);
    EXPECT_EQ(r.confirmed, 1u);
    EXPECT_EQ(w.watermark(), Next(i));
  }
  EXPECT_EQ(w.in_flight(), 0u);
  EXPECT_EQ(w.size(), 0u);
}

TEST_F(PublishWindowTest, MultipleAckConfirmsEveryTagUpToIt) {
  PublishWindow w(Options(10, UnroutablePolicy::kDrop), Pos(0));
  PublishN(&w, 0, 5);
  const auto r = w.OnAck(3, true, kT0);
  EXPECT_EQ(r.confirmed, 3u);
  EXPECT_EQ(w.watermark(), Next(2));
  EXPECT_EQ(w.in_flight(), 2u);
  // Tag 0 with multiple: everything outstanding.
  EXPECT_EQ(w.OnAck(0, true, kT0).confirmed, 2u);
  EXPECT_EQ(w.watermark(), Next(4));
}

TEST_F(PublishWindowTest, OutOfOrderConfirmsKeepTheWatermarkAtTheFirstUnconfirmed) {
  PublishWindow w(Options(10, UnroutablePolicy::kDrop), Pos(0));
  PublishN(&w, 0, 4);
  EXPECT_EQ(w.OnAck(2, false, kT0).confirmed, 1u);
  EXPECT_EQ(w.OnAck(4, false, kT0).confirmed, 1u);
  EXPECT_EQ(w.watermark(), Pos(0)) << "record 0 is unconfirmed";
  EXPECT_EQ(w.OnAck(1, false, kT0).confirmed, 1u);
  EXPECT_EQ(w.watermark(), Next(1)) << "record 2 (tag 3) is unconfirmed";
  // A multiple ack over tags already confirmed counts only the new one.
  EXPECT_EQ(w.OnAck(4, true, kT0).confirmed, 1u);
  EXPECT_EQ(w.watermark(), Next(3));
}

TEST_F(PublishWindowTest, NackedRecordIsRepublishedAfterItsDelayWithANewTag) {
  PublishWindow w(Options(10, UnroutablePolicy::kDrop), Pos(0));
  PublishN(&w, 0, 3);
  const auto r = w.OnNack(2, false, kT0);
  EXPECT_EQ(r.nacked, 1u);
  EXPECT_EQ(w.waiting(), 1u);
  const Clock::time_point due_at = w.next_retry_at();
  EXPECT_GE(due_at, kT0);
  EXPECT_LE(due_at, kT0 + milliseconds(100)) << "the first wait is at most the initial delay";
  EXPECT_EQ(due_at - kT0, r.delay_max);
  PublishWindow::Due due;
  if (due_at > kT0) {
    EXPECT_FALSE(w.NextDue(due_at - milliseconds(1), &due)) << "not before its time";
  }
  ASSERT_TRUE(w.NextDue(due_at, &due));
  EXPECT_EQ(due.position, Pos(1));
  EXPECT_EQ(due.next, Next(1));
  EXPECT_EQ(due.id, Id(1));
  EXPECT_EQ(w.OnRepublished(due.handle), 4u);
  EXPECT_EQ(w.waiting(), 0u);
  EXPECT_EQ(w.next_retry_at(), Clock::time_point::max());
  EXPECT_EQ(w.OnAck(3, true, kT0).confirmed, 2u);  // tags 1 and 3
  EXPECT_EQ(w.watermark(), Next(0)) << "record 1 awaits its new tag";
  EXPECT_EQ(w.OnAck(4, false, kT0).confirmed, 1u);
  EXPECT_EQ(w.watermark(), Next(2));
}

TEST_F(PublishWindowTest, RepeatedNacksOfAPostBackOffExponentiallyWithFullJitter) {
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  PublishWindow w(Options(10, UnroutablePolicy::kDrop, seed), Pos(0));
  PublishN(&w, 0, 2);
  uint64_t tag = 1;
  Clock::time_point now = kT0;
  const int64_t caps[] = {100, 200, 400, 800, 1600, 1600, 1600};
  for (int64_t cap : caps) {
    const auto r = w.OnNack(tag, false, now);
    ASSERT_EQ(r.nacked, 1u);
    EXPECT_GE(r.delay_max.count(), 0);
    EXPECT_LE(r.delay_max.count(), cap);
    PublishWindow::Due due;
    ASSERT_TRUE(w.NextDue(now + r.delay_max, &due));
    now += r.delay_max;
    tag = w.OnRepublished(due.handle);
  }
  // Another post's first wait starts at the initial delay again.
  const auto r = w.OnNack(2, false, now);
  EXPECT_LE(r.delay_max.count(), 100);
  // Over many posts, the first waits cover [0, 100], not only its top.
  PublishWindow many(Options(1000, UnroutablePolicy::kDrop, seed), Pos(0));
  PublishN(&many, 0, 1000);
  int low = 0, high = 0;
  for (uint64_t t = 1; t <= 1000; ++t) {
    const auto d = many.OnNack(t, false, kT0).delay_max.count();
    low += d < 25;
    high += d > 75;
  }
  EXPECT_GT(low, 150);
  EXPECT_GT(high, 150);
}

TEST_F(PublishWindowTest, NackWithMultipleMakesEveryTagUpToItWait) {
  PublishWindow w(Options(10, UnroutablePolicy::kDrop), Pos(0));
  PublishN(&w, 0, 4);
  const auto r = w.OnNack(3, true, kT0);
  EXPECT_EQ(r.nacked, 3u);
  EXPECT_EQ(w.waiting(), 3u);
  EXPECT_EQ(w.in_flight(), 1u);
  // Once all are due, in journal order.
  for (uint64_t i = 0; i < 3; ++i) {
    PublishWindow::Due due;
    ASSERT_TRUE(w.NextDue(kT0 + r.delay_max, &due));
    EXPECT_EQ(due.position, Pos(i));
    w.OnRepublished(due.handle);
  }
  EXPECT_EQ(w.OnAck(0, true, kT0).confirmed, 4u);
  EXPECT_EQ(w.watermark(), Next(3));
}

TEST_F(PublishWindowTest, ReturnThenAckUnderDropPolicyIsDone) {
  PublishWindow w(Options(10, UnroutablePolicy::kDrop), Pos(0));
  PublishN(&w, 0, 2);
  EXPECT_TRUE(w.OnReturn(Id(0)));
  EXPECT_EQ(w.returned(), 1u);
  const auto r = w.OnAck(2, true, kT0);
  EXPECT_EQ(r.dropped, 1u);
  EXPECT_EQ(r.confirmed, 1u);
  EXPECT_EQ(w.watermark(), Next(1));
  EXPECT_EQ(w.returned(), 0u);
}

TEST_F(PublishWindowTest, ReturnThenAckUnderRetryPolicyIsRepublishedAfterTheDelay) {
  PublishWindow w(Options(10, UnroutablePolicy::kRetry), Pos(0));
  PublishN(&w, 0, 2);
  EXPECT_TRUE(w.OnReturn(Id(1)));
  const auto r = w.OnAck(2, true, kT0);
  EXPECT_EQ(r.retried, 1u);
  EXPECT_EQ(r.confirmed, 1u);
  EXPECT_EQ(w.watermark(), Next(0)) << "the returned post is not done";
  EXPECT_EQ(w.next_retry_at(), kT0 + r.delay_max);
  PublishWindow::Due due;
  ASSERT_TRUE(w.NextDue(kT0 + r.delay_max, &due));
  EXPECT_EQ(due.id, Id(1));
  const uint64_t tag = w.OnRepublished(due.handle);
  EXPECT_EQ(w.OnAck(tag, false, kT0).confirmed, 1u) << "routed this time";
  EXPECT_EQ(w.watermark(), Next(1));
}

TEST_F(PublishWindowTest, ReturnMatchesTheOldestUnconfirmedPublicationOfTheId) {
  PublishWindow w(Options(10, UnroutablePolicy::kDrop), Pos(0));
  // The same post id twice in the journal (a client retried).
  w.OnPublished(Pos(0), Next(0), Id(7));
  w.OnPublished(Pos(1), Next(1), Id(7));
  EXPECT_TRUE(w.OnReturn(Id(7)));
  EXPECT_TRUE(w.OnReturn(Id(7)));
  EXPECT_FALSE(w.OnReturn(Id(7))) << "both publications are returned already";
  EXPECT_FALSE(w.OnReturn(Id(8))) << "never published";
  const auto r = w.OnAck(1, false, kT0);
  EXPECT_EQ(r.dropped, 1u);
  EXPECT_EQ(w.returned(), 1u);
}

TEST_F(PublishWindowTest, WindowBoundStopsPublishingUntilConfirms) {
  PublishWindow w(Options(3, UnroutablePolicy::kDrop), Pos(0));
  PublishN(&w, 0, 3);
  EXPECT_FALSE(w.CanPublishNew());
  EXPECT_FALSE(w.CanRepublish());
  w.OnAck(2, false, kT0);
  EXPECT_FALSE(w.CanPublishNew()) << "record 0 still holds its entry and tag";
  w.OnAck(1, false, kT0);
  EXPECT_TRUE(w.CanPublishNew());
  PublishN(&w, 3, 2);
  EXPECT_FALSE(w.CanPublishNew());
  EXPECT_LE(w.size(), 3u);
  EXPECT_LE(w.in_flight(), 3u);
}

TEST_F(PublishWindowTest, SkippedRecordDoesNotHoldTheWatermark) {
  PublishWindow w(Options(10, UnroutablePolicy::kDrop), Pos(0));
  w.OnSkipped(Pos(0), Next(0));
  EXPECT_EQ(w.watermark(), Next(0));
  w.OnPublished(Pos(1), Next(1), Id(1));
  w.OnSkipped(Pos(2), Next(2));
  EXPECT_EQ(w.watermark(), Next(0));
  w.OnAck(1, false, kT0);
  EXPECT_EQ(w.watermark(), Next(2));
}

TEST_F(PublishWindowTest, ReaderIdleMovesTheWatermarkOnlyWhenNothingIsPending) {
  PublishWindow w(Options(10, UnroutablePolicy::kDrop), Pos(0));
  w.OnPublished(Pos(0), Next(0), Id(0));
  w.OnReaderIdle(JournalPosition{5, 0});
  EXPECT_EQ(w.watermark(), Pos(0));
  w.OnAck(1, false, kT0);
  w.OnReaderIdle(JournalPosition{5, 0});  // past damage the reader skipped
  EXPECT_EQ(w.watermark(), (JournalPosition{5, 0}));
  w.OnReaderIdle(JournalPosition{4, 0});
  EXPECT_EQ(w.watermark(), (JournalPosition{5, 0})) << "never moves back";
}

// A channel that published before (a standby connection taking over, or
// one swapped in): its delivery tags go on from its own count, and the
// window must count with it, or an ack would confirm the wrong post.
TEST_F(PublishWindowTest, ResetOntoAChannelThatPublishedBeforeCountsOnFromItsNextTag) {
  PublishWindow w(Options(10, UnroutablePolicy::kDrop), Pos(0));
  PublishN(&w, 0, 3);
  w.OnAck(1, false, kT0);  // record 0; records 1 and 2 in flight
  EXPECT_EQ(w.Reset(kT0, 21), 2u);
  EXPECT_EQ(w.next_tag(), 21u);
  PublishWindow::Due due;
  ASSERT_TRUE(w.NextDue(kT0, &due));
  EXPECT_EQ(due.id, Id(1));
  EXPECT_EQ(w.OnRepublished(due.handle), 21u);
  ASSERT_TRUE(w.NextDue(kT0, &due));
  EXPECT_EQ(w.OnRepublished(due.handle), 22u);
  // Tags below 21 were that channel's earlier posts: not ours to confirm.
  EXPECT_EQ(w.OnAck(3, true, kT0).confirmed, 0u);
  EXPECT_EQ(w.watermark(), Next(0));
  EXPECT_EQ(w.OnAck(22, true, kT0).confirmed, 2u);
  EXPECT_EQ(w.watermark(), Next(2));
}

TEST_F(PublishWindowTest, ResetPublishesAgainOnlyWhatWasNotConfirmedWithTagsFromOne) {
  PublishWindow w(Options(10, UnroutablePolicy::kDrop), Pos(0));
  PublishN(&w, 0, 5);
  w.OnAck(1, false, kT0);   // record 0
  w.OnNack(3, false, kT0);  // record 2 waits
  w.OnAck(5, false, kT0);   // record 4; records 1 and 3 in flight
  w.OnAck(4, false, kT0);   // record 3
  EXPECT_EQ(w.Reset(kT0), 2u) << "records 1 (in flight) and 2 (waiting)";
  EXPECT_EQ(w.watermark(), Next(0));
  EXPECT_EQ(w.in_flight(), 0u);
  EXPECT_EQ(w.waiting(), 2u);
  EXPECT_EQ(w.next_tag(), 1u);
  // Both due at once, in journal order, with new tags from 1.
  PublishWindow::Due due;
  ASSERT_TRUE(w.NextDue(kT0, &due));
  EXPECT_EQ(due.id, Id(1));
  EXPECT_EQ(w.OnRepublished(due.handle), 1u);
  ASSERT_TRUE(w.NextDue(kT0, &due));
  EXPECT_EQ(due.id, Id(2));
  EXPECT_EQ(w.OnRepublished(due.handle), 2u);
  EXPECT_FALSE(w.NextDue(kT0, &due)) << "records 3 and 4 were confirmed: not again";
  // A confirm for a tag of the old channel that is not published here.
  EXPECT_EQ(w.OnAck(4, false, kT0).unknown, 1u);
  EXPECT_EQ(w.OnAck(2, true, kT0).confirmed, 2u);
  EXPECT_EQ(w.watermark(), Next(4));
  EXPECT_EQ(w.size(), 0u);
}

// Issue 19: a graceful stop of the leader node nacked the oldest post, the
// broker then acked the other 999 of the window with multiple acks, and the
// reconnect published all 1,000 again ("1000 unconfirmed posts").
TEST_F(PublishWindowTest, ReconnectAfterMultipleAcksBehindANackedPostRepublishesOnlyThatPost) {
  PublishWindow w(Options(1000, UnroutablePolicy::kDrop), Pos(0));
  PublishN(&w, 0, 1000);
  EXPECT_EQ(w.OnNack(1, false, kT0).nacked, 1u);
  EXPECT_EQ(w.OnAck(500, true, kT0).confirmed, 499u);
  EXPECT_EQ(w.OnAck(1000, true, kT0).confirmed, 500u);
  EXPECT_EQ(w.size(), 1000u) << "the nacked post holds the watermark";
  EXPECT_EQ(w.Reset(kT0), 1u);
  PublishWindow::Due due;
  ASSERT_TRUE(w.NextDue(kT0, &due));
  EXPECT_EQ(due.id, Id(0));
  EXPECT_EQ(w.OnRepublished(due.handle), 1u);
  EXPECT_FALSE(w.NextDue(kT0 + std::chrono::hours(1), &due));
  EXPECT_EQ(w.OnAck(1, false, kT0).confirmed, 1u);
  EXPECT_EQ(w.watermark(), Next(999));
}

TEST_F(PublishWindowTest, NackedPostsAreDueAtOnceWhenTheBrokerAcksAgain) {
  PublishWindow::Options o = Options(10, UnroutablePolicy::kRetry);
  o.retry_delay_initial_ms = 20000;
  o.retry_delay_max_ms = 30000;
  PublishWindow w(o, Pos(0));
  PublishN(&w, 0, 4);
  const auto n = w.OnNack(2, true, kT0);  // records 0 and 1 wait up to 20 s
  ASSERT_EQ(n.nacked, 2u);
  ASSERT_TRUE(w.OnReturn(Id(2)));
  const auto r = w.OnAck(3, false, kT0);  // record 2: unroutable, waits (retry policy)
  ASSERT_EQ(r.retried, 1u);
  const Clock::time_point later = kT0 + milliseconds(1);
  PublishWindow::Due due;
  EXPECT_EQ(w.OnAck(4, false, later).confirmed, 1u) << "record 3 acked: the broker takes posts";
  ASSERT_TRUE(w.NextDue(later, &due));
  EXPECT_EQ(due.id, Id(0));
  w.OnRepublished(due.handle);
  ASSERT_TRUE(w.NextDue(later, &due));
  EXPECT_EQ(due.id, Id(1));
  w.OnRepublished(due.handle);
  if (r.delay_max > milliseconds(1)) {
    EXPECT_FALSE(w.NextDue(later, &due)) << "an unroutable post keeps its delay";
  }
}

TEST_F(PublishWindowTest, ConfirmsOfUnknownTagsAreIgnored) {
  PublishWindow w(Options(10, UnroutablePolicy::kDrop), Pos(0));
  PublishN(&w, 0, 2);
  EXPECT_EQ(w.OnAck(1, false, kT0).confirmed, 1u);
  EXPECT_EQ(w.OnAck(1, false, kT0).unknown, 1u) << "twice";
  EXPECT_EQ(w.OnAck(0, false, kT0).unknown, 1u) << "tag 0 without multiple";
  const auto r = w.OnAck(9, true, kT0);
  EXPECT_EQ(r.unknown, 1u) << "beyond what was published";
  EXPECT_EQ(r.confirmed, 0u) << "nothing is confirmed on a tag we never sent";
  EXPECT_EQ(w.watermark(), Next(0));
}

// A fake broker that confirms what the forwarder publishes in random order:
// single and multiple acks and nacks, returns (and their acks), and lost
// connections, driving the window as the forwarder does. Checks that the
// watermark never passes a record that is not confirmed (or dropped), and
// that everything is confirmed in the end.
TEST_F(PublishWindowTest, RandomConfirmsAgainstAFakeBrokerNeverPassAnUnconfirmedRecord) {
  const uint64_t seed = testing::TestSeed();
  std::printf("seed %llu (POSTSPOOL_TEST_SEED=%llu reruns it)\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (UnroutablePolicy policy : {UnroutablePolicy::kDrop, UnroutablePolicy::kRetry}) {
    std::mt19937_64 rng(seed);
    constexpr uint64_t kRecords = 20000;
    constexpr uint32_t kWindow = 50;
    PublishWindow::Options options = Options(kWindow, policy, seed);
    options.retry_delay_initial_ms = 1;
    options.retry_delay_max_ms = 20;
    PublishWindow w(options, Pos(0));
    uint64_t next_read = 0;        // the journal reader
    std::vector<int> done(kRecords, 0);  // confirmed (1) or dropped (2)
    struct Sent {
      uint64_t record;
      bool returned;
    };
    std::map<uint64_t, Sent> unconfirmed;  // broker side: tag -> publication
    Clock::time_point now = kT0;
    int steps = 0;
    uint64_t checked = 0;  // records before the watermark checked so far
    uint64_t resets = 0, returns = 0, nacks = 0;
    auto reset = [&] {
      // The reader goes on where it is: the window keeps what is not done.
      unconfirmed.clear();
      w.Reset(now);
    };
    while (w.watermark() < Next(kRecords - 1)) {
      ASSERT_LT(++steps, 2000000) << "no progress";
      now += milliseconds(1);
      // Publish: due ones first, then new ones.
      PublishWindow::Due due;
      while (w.CanRepublish() && w.NextDue(now, &due)) {
        const uint64_t record = due.id.lo;
        ASSERT_EQ(due.position, Pos(record));
        ASSERT_EQ(done[record], 0) << "record " << record << " published again once done";
        unconfirmed[w.OnRepublished(due.handle)] = Sent{record, false};
      }
      while (w.CanPublishNew() && next_read < kRecords && rng() % 4 != 0) {
        const uint64_t tag = w.OnPublished(Pos(next_read), Next(next_read), Id(next_read));
        unconfirmed[tag] = Sent{next_read, false};
        ++next_read;
      }
      ASSERT_LE(w.size(), kWindow);
      ASSERT_LE(w.in_flight(), kWindow);
      ASSERT_EQ(w.in_flight(), unconfirmed.size());
      if (next_read == kRecords) w.OnReaderIdle(Next(kRecords - 1));
      if (unconfirmed.empty()) continue;
      // The broker acts on a random unconfirmed tag.
      auto it = unconfirmed.begin();
      std::advance(it, static_cast<long>(rng() % unconfirmed.size()));
      const uint64_t tag = it->first;
      const int action = static_cast<int>(rng() % 100);
      if (action < 1) {
        reset();  // connection lost
        ++resets;
        continue;
      }
      if (action < 6 && !it->second.returned) {
        // Unroutable: returned before its ack (5% of the time).
        it->second.returned = true;
        ASSERT_TRUE(w.OnReturn(Id(it->second.record)));
        ++returns;
        continue;
      }
      const bool ack = action >= 15;
      const bool multiple = rng() % 3 == 0;
      const auto r = ack ? w.OnAck(tag, multiple, now) : w.OnNack(tag, multiple, now);
      ASSERT_EQ(r.unknown, 0u);
      uint32_t confirmed = 0, dropped = 0, retried = 0, nacked = 0;
      for (auto j = unconfirmed.begin(); j != unconfirmed.end();) {
        if (j->first == tag || (multiple && j->first < tag)) {
          if (!ack) {
            ++nacked;
          } else if (!j->second.returned) {
            ++confirmed;
            done[j->second.record] = 1;
          } else if (policy == UnroutablePolicy::kDrop) {
            ++dropped;
            done[j->second.record] = 2;
          } else {
            ++retried;
          }
          j = unconfirmed.erase(j);
        } else {
          ++j;
        }
      }
      ASSERT_EQ(r.confirmed, confirmed);
      ASSERT_EQ(r.dropped, dropped);
      ASSERT_EQ(r.retried, retried);
      ASSERT_EQ(r.nacked, nacked);
      nacks += nacked;
      // The invariant: everything before the watermark is done.
      for (; checked < kRecords && Next(checked) <= w.watermark(); ++checked) {
        ASSERT_NE(done[checked], 0) << "record " << checked << " is before the watermark unconfirmed";
      }
    }
    for (uint64_t i = 0; i < kRecords; ++i) ASSERT_NE(done[i], 0) << "record " << i;
    std::printf("%s policy: %d steps, %llu resets, %llu returns, %llu nacks\n",
                policy == UnroutablePolicy::kDrop ? "drop" : "retry", steps,
                static_cast<unsigned long long>(resets), static_cast<unsigned long long>(returns),
                static_cast<unsigned long long>(nacks));
  }
}

// ---------------------------------------------------------------------------

// The broken-path policy (broker_path.h), with refused 1 s, silent 5 s and
// waits capped at 4 s.
BrokerPath::Options PathOptions() { return BrokerPath::Options{1000, 5000, 4000}; }

TEST(BrokerPathTest, RefusalReconnectsThenMovesToTheNextBrokersWithDoublingWaits) {
  BrokerPath p(PathOptions());
  Clock::time_point t = kT0;
  p.OnConnected(t);
  p.OnNack(t);
  EXPECT_EQ(p.Check(t + milliseconds(999), true).step, BrokerPath::Step::kNone);
  auto v = p.Check(t + milliseconds(1000), true);
  EXPECT_EQ(v.step, BrokerPath::Step::kReconnect);
  EXPECT_EQ(v.fault, BrokerPath::Fault::kRefused);
  EXPECT_EQ(v.fault_for, milliseconds(1000));
  EXPECT_EQ(v.hold, milliseconds(1000));
  // The new connection refuses too: the next broker, after 1 s.
  t += milliseconds(1000);
  p.OnConnected(t);
  p.OnNack(t);
  v = p.Check(t + milliseconds(1000), true);
  EXPECT_EQ(v.step, BrokerPath::Step::kNextBroker);
  EXPECT_EQ(v.hold, milliseconds(2000));
  t += milliseconds(1000);
  p.OnConnected(t);
  p.OnNack(t);
  EXPECT_EQ(p.Check(t + milliseconds(1999), true).step, BrokerPath::Step::kNone) << "held";
  EXPECT_EQ(p.fault(t + milliseconds(1999), true), BrokerPath::Fault::kRefused);
  v = p.Check(t + milliseconds(2000), true);
  EXPECT_EQ(v.step, BrokerPath::Step::kNextBroker);
  EXPECT_EQ(v.hold, milliseconds(4000));
  t += milliseconds(2000);
  p.OnConnected(t);
  p.OnNack(t);
  v = p.Check(t + milliseconds(4000), true);
  EXPECT_EQ(v.hold, milliseconds(4000)) << "capped at wait_max_ms";
  EXPECT_EQ(p.steps(), 4u);
}

TEST(BrokerPathTest, AnAckEndsARefusalAndStartsTheStepsOver) {
  BrokerPath p(PathOptions());
  p.OnConnected(kT0);
  p.OnNack(kT0);
  p.OnAck(kT0 + milliseconds(500));
  EXPECT_EQ(p.Check(kT0 + milliseconds(1500), true).step, BrokerPath::Step::kNone);
  p.OnNack(kT0 + milliseconds(1600));
  EXPECT_EQ(p.Check(kT0 + milliseconds(2600), true).step, BrokerPath::Step::kReconnect);
  p.OnConnected(kT0 + milliseconds(2600));
  p.OnAck(kT0 + milliseconds(2700));
  p.OnNack(kT0 + milliseconds(2800));
  EXPECT_EQ(p.Check(kT0 + milliseconds(3800), true).step, BrokerPath::Step::kReconnect)
      << "after an ack the first step is a reconnect again, not held";
}

TEST(BrokerPathTest, AFaultOfTheOtherKindIsNotHeldByTheLastStepsWait) {
  BrokerPath p(PathOptions());
  Clock::time_point t = kT0;
  // Silent twice: a reconnect, then the next broker, held 2 s.
  for (int i = 0; i < 2; ++i) {
    p.OnConnected(t);
    EXPECT_EQ(p.Check(t, true).step, BrokerPath::Step::kNone);
    t += milliseconds(5000);
    EXPECT_NE(p.Check(t, true).step, BrokerPath::Step::kNone);
  }
  // The new connection refuses at once: after 1 s, not held by the silent
  // step's 2 s; the steps go on to the next broker.
  p.OnConnected(t);
  p.OnNack(t);
  const auto v = p.Check(t + milliseconds(1000), true);
  EXPECT_EQ(v.step, BrokerPath::Step::kNextBroker);
  EXPECT_EQ(v.fault, BrokerPath::Fault::kRefused);
  EXPECT_EQ(v.hold, milliseconds(4000));
}

TEST(BrokerPathTest, SilenceWhilePostsWaitReconnectsButIdleIsNoFault) {
  BrokerPath p(PathOptions());
  p.OnConnected(kT0);
  EXPECT_EQ(p.Check(kT0 + std::chrono::seconds(60), false).step, BrokerPath::Step::kNone)
      << "nothing waits: silence is normal";
  const Clock::time_point t = kT0 + std::chrono::seconds(61);
  EXPECT_EQ(p.Check(t, true).step, BrokerPath::Step::kNone);
  EXPECT_EQ(p.Check(t + milliseconds(4999), true).step, BrokerPath::Step::kNone);
  const auto v = p.Check(t + milliseconds(5000), true);
  EXPECT_EQ(v.step, BrokerPath::Step::kReconnect);
  EXPECT_EQ(v.fault, BrokerPath::Fault::kSilent);
  EXPECT_EQ(v.fault_for, milliseconds(5000));
}

TEST(BrokerPathTest, ABlockedConnectionIsNotJudgedUntilItIsUnblocked) {
  BrokerPath p(PathOptions());
  p.OnConnected(kT0);
  p.OnBlocked();
  p.OnNack(kT0);
  EXPECT_EQ(p.Check(kT0 + std::chrono::seconds(60), true).step, BrokerPath::Step::kNone);
  const Clock::time_point t = kT0 + std::chrono::seconds(60);
  p.OnConnected(t);  // connection.unblocked
  EXPECT_EQ(p.Check(t, true).step, BrokerPath::Step::kNone);
  EXPECT_EQ(p.Check(t + milliseconds(4999), true).step, BrokerPath::Step::kNone);
  EXPECT_EQ(p.Check(t + milliseconds(5000), true).fault, BrokerPath::Fault::kSilent);
}

// ---------------------------------------------------------------------------

TEST(BackoffTest, DelaysStayWithinZeroAndTheCapAndTheCapDoubles) {
  const uint64_t seed = testing::TestSeed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SCOPED_TRACE("seed " + std::to_string(seed));
  Backoff b(100, 30000, seed);
  const uint32_t expected_caps[] = {100, 200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30000, 30000};
  for (uint32_t cap : expected_caps) {
    EXPECT_EQ(b.cap_ms(), cap);
    const auto d = b.Next();
    EXPECT_GE(d.count(), 0);
    EXPECT_LE(d.count(), cap);
  }
  for (int i = 0; i < 100; ++i) {  // no overflow however long the outage
    EXPECT_LE(b.Next().count(), 30000);
  }
  EXPECT_EQ(b.cap_ms(), 30000u);
}

TEST(BackoffTest, DelaysAreSpreadOverTheWholeRange) {
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // Full jitter: the delays at one cap cover [0, cap], not [cap/2, cap].
  int low = 0, high = 0;
  for (int i = 0; i < 1000; ++i) {
    Backoff b(1000, 1000, seed + static_cast<uint64_t>(i));
    const auto d = b.Next().count();
    low += d < 250;
    high += d > 750;
  }
  EXPECT_GT(low, 150);
  EXPECT_GT(high, 150);
}

TEST(BackoffTest, ResetAfterSuccessStartsOverAtTheInitialDelay) {
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Backoff b(50, 5000, seed);
  for (int i = 0; i < 6; ++i) b.Next();
  EXPECT_EQ(b.attempt(), 6u);
  EXPECT_EQ(b.cap_ms(), 3200u);
  b.Reset();
  EXPECT_EQ(b.attempt(), 0u);
  EXPECT_EQ(b.cap_ms(), 50u);
  EXPECT_LE(b.Next().count(), 50);
}

TEST(BackoffTest, SameSeedGivesTheSameDelays) {
  Backoff a(100, 10000, 42), b(100, 10000, 42);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(a.Next(), b.Next());
}

TEST(BackoffTest, MaximumBelowInitialIsRaisedToIt) {
  Backoff b(500, 100, 1);
  EXPECT_EQ(b.cap_ms(), 500u);
  b.Next();
  EXPECT_EQ(b.cap_ms(), 500u);
}

// ---------------------------------------------------------------------------

TEST(MessageIdTest, IsTheLowerCaseUuidOfHiThenLoBigEndian) {
  const MessageId m = FormatMessageId(PostId{0x0123456789abcdefull, 0xfedcba9876543210ull});
  EXPECT_EQ(View(m), "01234567-89ab-cdef-fedc-ba9876543210");
  EXPECT_EQ(View(FormatMessageId(PostId{0, 1})), "00000000-0000-0000-0000-000000000001");
}

TEST(MessageIdTest, ParsesWhatItFormats) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 100; ++i) {
    const PostId id{rng(), rng()};
    PostId back;
    ASSERT_TRUE(ParseMessageId(View(FormatMessageId(id)), &back));
    EXPECT_EQ(back, id);
  }
  PostId upper;
  ASSERT_TRUE(ParseMessageId("01234567-89AB-CDEF-FEDC-BA9876543210", &upper));
  EXPECT_EQ(upper, (PostId{0x0123456789abcdefull, 0xfedcba9876543210ull}));
}

TEST(MessageIdTest, RejectsAnythingElse) {
  PostId id;
  EXPECT_FALSE(ParseMessageId("", &id));
  EXPECT_FALSE(ParseMessageId("01234567-89ab-cdef-fedc-ba987654321", &id));    // short
  EXPECT_FALSE(ParseMessageId("01234567-89ab-cdef-fedc-ba98765432100", &id));  // long
  EXPECT_FALSE(ParseMessageId("0123456789ab-cdef-fedc-ba98-76543210", &id));   // dashes
  EXPECT_FALSE(ParseMessageId("01234567-89ab-cdef-fedc-ba987654321g", &id));   // not hex
}

// ---------------------------------------------------------------------------

TEST(BrokerUrlTest, RedactRemovesOnlyThePassword) {
  EXPECT_EQ(RedactUrl("amqp://user:secret@host:5672/vh"), "amqp://user@host:5672/vh");
  EXPECT_EQ(RedactUrl("amqps://user@host/"), "amqps://user@host/");
  EXPECT_EQ(RedactUrl("amqp://host:5672/"), "amqp://host:5672/");
  EXPECT_EQ(RedactUrl("amqp://host/a@b"), "amqp://host/a@b");
}

TEST(BrokerUrlTest, ParsesSchemesPortsUserAndVhost) {
  BrokerUrl b;
  ASSERT_TRUE(ParseBrokerUrl("amqp://alice:s%40cret@broker.example:5673/%2fdata", &b).ok());
  EXPECT_FALSE(b.tls);
  EXPECT_EQ(b.host, "broker.example");
  EXPECT_EQ(b.port, 5673);
  EXPECT_EQ(b.user, "alice");
  EXPECT_EQ(b.password, "s@cret");
  EXPECT_EQ(b.vhost, "/data");
  EXPECT_EQ(b.display, "amqp://alice@broker.example:5673/%2fdata");

  ASSERT_TRUE(ParseBrokerUrl("amqps://bob:pw@broker.example/", &b).ok());
  EXPECT_TRUE(b.tls);
  EXPECT_EQ(b.port, 5671);
  EXPECT_EQ(b.vhost, "/") << "a trailing '/' means the default vhost, as Sarracenia reads it";

  ASSERT_TRUE(ParseBrokerUrl("amqp://localhost", &b).ok());
  EXPECT_EQ(b.port, 5672);
  EXPECT_EQ(b.user, "guest");
  EXPECT_EQ(b.vhost, "/");
}

TEST(BrokerUrlTest, ErrorNamesTheUrlWithoutItsPassword) {
  BrokerUrl b;
  const Status s = ParseBrokerUrl("http://alice:secret@host/", &b);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("http://alice@host/"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("secret"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace postspool::daemon
