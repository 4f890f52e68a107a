// Machine probes of the bench (kernels/probe.h): every level's read loop reads each word of its
// buffer once, whatever the stream count; every peak kind the machine has runs, the strongest one
// matching the detected level; bad arguments are typed errors. Rates are never asserted beyond
// being positive.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>

#include "moecore/core/error.h"
#include "moecore/isa/isa.h"
#include "moecore/kernels/probe.h"

namespace moecore {
namespace {

TEST(ProbeTest, EveryReadLoopXorsEachWordOnce) {
  constexpr int64_t kBytes = 64 * 1024;  // a multiple of 256 · 8
  std::unique_ptr<uint8_t, decltype(&std::free)> buffer(
      static_cast<uint8_t*>(std::aligned_alloc(64, kBytes)), &std::free);
  std::mt19937_64 rng(7);
  uint64_t expected = 0;
  for (int64_t i = 0; i < kBytes / 8; ++i) {
    const uint64_t word = rng();
    std::memcpy(buffer.get() + 8 * i, &word, 8);
    expected ^= word;
  }
  for (IsaLevel level : available_isa_levels())
    for (int streams : {1, 2, 4, 8})
      EXPECT_EQ(probe_detail::read_loop(level)(buffer.get(), kBytes, streams), expected)
          << isa_level_name(level) << ", " << streams << " streams";
}

TEST(ProbeTest, EveryAvailablePeakRunsAndTheBestMatchesTheLevel) {
  const std::vector<PeakKind> kinds = available_peak_kinds();
  ASSERT_FALSE(kinds.empty());
  EXPECT_EQ(kinds.front(), PeakKind::kScalarF32);  // the portable loop runs everywhere
  for (PeakKind kind : kinds) {
    const ProbeResult r = probe_peak(kind, 1000, 1);
    EXPECT_TRUE(std::isfinite(r.rate) && r.rate > 0) << peak_kind_name(kind);
    EXPECT_EQ(parse_peak_kind(peak_kind_name(kind)), kind);
  }
  // The strongest kind per level, by IsaLevel.
  const char* const kBest[] = {"scalar_f32", "avx2_fma_f32", "avx512_fma_f32", "avx512_bf16",
                               "amx_bf16"};
  const char* best = kBest[static_cast<int>(detected_isa_level())];
  EXPECT_STREQ(peak_kind_name(kinds.back()), best);
}

TEST(ProbeTest, ReadBandwidthRunsAtTheDetectedLevel) {
  const ProbeResult r = probe_read_bandwidth(1 << 20, 4, 2);
  EXPECT_TRUE(std::isfinite(r.rate) && r.rate > 0);
  EXPECT_GE(r.threads, 1);
}

TEST(ProbeTest, BadArgumentsAreTypedErrors) {
  EXPECT_THROW(probe_read_bandwidth(1 << 20, 3, 1), InvalidArgument);
  EXPECT_THROW(probe_read_bandwidth(64, 4, 1), InvalidArgument);
  EXPECT_THROW(probe_read_bandwidth(1 << 20, 4, 0), InvalidArgument);
  EXPECT_THROW(parse_peak_kind("avx9000"), InvalidArgument);
  EXPECT_THROW(probe_peak(PeakKind::kScalarF32, 0, 1), InvalidArgument);
}

}  // namespace
}  // namespace moecore
