// Thread pool: static chunks, whichever thread claims them, cover [0, n) exactly once, whether
// the workers are still spinning from the previous call or asleep; exceptions reach the caller,
// nested calls run serially, resizing works, and concurrent callers take turns. split_by_cost
// cuts uneven items into contiguous runs, none costing more than an even share plus one item.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/core/thread_pool.h"

namespace moecore {
namespace {

class ThreadPoolTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { ThreadPool::instance().set_num_threads(GetParam()); }
  void TearDown() override { ThreadPool::instance().set_num_threads(available_cpus()); }
};

TEST_P(ThreadPoolTest, EveryItemExactlyOnce) {
  for (int64_t n : {1, 2, 3, 17, 1000}) {
    std::vector<std::atomic<int>> hits(n);
    parallel_for(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
  }
}

// Threads claim chunks (a worker slow to wake leaves its chunk to another thread), but the chunks
// themselves are the static split: num_threads contiguous runs of near-equal size, the larger
// first, and no empty one is ever run.
TEST_P(ThreadPoolTest, ChunksAreTheStaticSplitWhicheverThreadRunsThem) {
  const int64_t threads = GetParam();
  for (int64_t n : {1, 2, 3, 17, 1000}) {
    std::mutex mutex;
    std::vector<std::pair<int64_t, int64_t>> chunks;
    parallel_for(n, [&](int64_t b, int64_t e) {
      std::lock_guard<std::mutex> lock(mutex);
      chunks.emplace_back(b, e);
    });
    std::sort(chunks.begin(), chunks.end());
    std::vector<std::pair<int64_t, int64_t>> expected;
    for (int64_t i = 0, begin = 0; i < threads && begin < n; ++i) {
      const int64_t size = n / threads + (i < n % threads ? 1 : 0);
      expected.emplace_back(begin, begin + size);
      begin += size;
    }
    if (threads == 1 || n == 1) expected = {{0, n}};  // run inline, whole
    EXPECT_EQ(chunks, expected) << "n=" << n;
  }
}

// Calls back to back find the workers spinning; calls a millisecond apart find them asleep
// (they spin for 100 µs). Each call must run each of its items once, with nothing left over
// from the call before.
TEST_P(ThreadPoolTest, BackToBackAndSpacedCallsRunEveryItemOnce) {
  constexpr int64_t kItems = 37;
  std::vector<std::atomic<int>> hits(kItems);
  for (int call = 0; call < 2030; ++call) {
    if (call >= 2000) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    parallel_for(kItems, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < kItems; ++i)
      ASSERT_EQ(hits[i].exchange(0), 1) << "call " << call << " item " << i;
  }
}

TEST_P(ThreadPoolTest, ExceptionsReachTheCaller) {
  for (int64_t failing : {0, 500, 999}) {
    EXPECT_THROW(parallel_for(1000, [&](int64_t b, int64_t e) {
                   for (int64_t i = b; i < e; ++i)
                     if (i == failing) MOECORE_THROW(InvalidArgument, "item ", i);
                 }),
                 InvalidArgument);
  }
  // The pool still works after an exception.
  std::atomic<int64_t> sum{0};
  parallel_for(100, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 4950);
}

TEST_P(ThreadPoolTest, NestedCallsRunInline) {
  std::atomic<int64_t> count{0};
  parallel_for(8, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      parallel_for(10, [&](int64_t b2, int64_t e2) { count += e2 - b2; });
  });
  EXPECT_EQ(count.load(), 80);
}

TEST_P(ThreadPoolTest, ConcurrentCallersTakeTurns) {
  std::vector<std::thread> callers;
  std::atomic<int64_t> total{0};
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&] {
      for (int r = 0; r < 50; ++r)
        parallel_for(64, [&](int64_t b, int64_t e) { total += e - b; });
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 50 * 64);
}

INSTANTIATE_TEST_SUITE_P(Threads, ThreadPoolTest, ::testing::Values(1, 2, 3, 8),
                         [](const auto& info) { return "T" + std::to_string(info.param); });

// Runs cover [0, count) in order; no run costs more than total / parts plus the largest item;
// parts beyond the items (or items of no cost) give empty runs, never a skipped item.
TEST(SplitByCostTest, ContiguousRunsOfNearEqualCost) {
  std::mt19937 rng(3);
  for (int64_t parts : {1, 2, 3, 16}) {
    for (int64_t count : {0, 1, 5, 100, 3072}) {
      // Skewed: the first quarter of the items costs the most (an even count per run would not
      // pass), the rest little.
      std::vector<int64_t> cost(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i)
        cost[static_cast<size_t>(i)] =
            std::uniform_int_distribution<int64_t>(0, 4 * i < count ? 80 : 8)(rng);
      if (count == 5) std::fill(cost.begin(), cost.end(), 0);  // nothing to balance
      std::vector<int64_t> begin(static_cast<size_t>(parts + 1), -1);
      split_by_cost(count, parts, [&](int64_t i) { return cost[static_cast<size_t>(i)]; },
                    begin.data());
      SCOPED_TRACE(::testing::Message() << parts << " parts, " << count << " items");
      EXPECT_EQ(begin.front(), 0);
      EXPECT_EQ(begin.back(), count);
      const int64_t total = std::accumulate(cost.begin(), cost.end(), int64_t{0});
      const int64_t largest = count > 0 ? *std::max_element(cost.begin(), cost.end()) : 0;
      for (int64_t p = 0; p < parts; ++p) {
        ASSERT_LE(begin[p], begin[p + 1]);
        const int64_t run =
            std::accumulate(cost.begin() + begin[p], cost.begin() + begin[p + 1], int64_t{0});
        EXPECT_LE(run * parts, total + largest * parts) << "run " << p;
      }
    }
  }
}

TEST(ThreadPoolConfigTest, RejectsBadSizes) {
  EXPECT_THROW(ThreadPool::instance().set_num_threads(0), InvalidArgument);
  EXPECT_THROW(ThreadPool::instance().set_num_threads(100000), InvalidArgument);
}

}  // namespace
}  // namespace moecore
