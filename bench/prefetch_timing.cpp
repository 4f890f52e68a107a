// Whether a core overlaps a dot loop's compute with its weight stream from memory, per prefetch
// hint: the question behind WeightPrefetch (kernels/x86/row_common.h). One thread streams 256 MiB
// of bf16 weights in 256-byte steps (4 lines, as a 4-channel tile reads them) with R VDPBF16PS
// per line against R activation vectors in L1, prefetching the line `lead` bytes ahead into L1
// (T0), into L2 (T1) or not at all, and times the same loop over 256 KiB that stays in L2 (scaled
// to the same bytes): the compute alone. Where the memory time comes out near max(stream,
// compute), the hint overlaps them; near their sum, it does not.
//   ninja -C build moecore_prefetch_timing
//   build/moecore_prefetch_timing [lead bytes, default 8192]
// Needs AVX512-BF16 (exits with a message otherwise); results: bench/RESULTS.md.
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "moecore/isa/isa.h"

namespace {

enum class Hint { kNone, kL1, kL2 };

template <int R, Hint kHint>
__attribute__((target("avx512f,avx512bf16"), noinline)) float stream(
    const uint8_t* w, size_t bytes, const uint16_t* act, int64_t lead) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  for (size_t off = 0; off < bytes; off += 256) {
    for (int c = 0; c < 4; ++c) {
      const char* ahead = reinterpret_cast<const char*>(w + off + lead + 64 * c);
      if constexpr (kHint == Hint::kL1) _mm_prefetch(ahead, _MM_HINT_T0);
      if constexpr (kHint == Hint::kL2) _mm_prefetch(ahead, _MM_HINT_T1);
    }
    __m512bh wv[4];
    for (int c = 0; c < 4; ++c) wv[c] = (__m512bh)_mm512_load_si512(w + off + 64 * c);
    const uint16_t* a = act + (off / 8 & 2047);  // 4 KiB of activations per row, in L1
    for (int r = 0; r < R; ++r) {
      const __m512bh av = (__m512bh)_mm512_loadu_si512(a + r * 2048);
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], av, wv[c]);
    }
  }
  __m512 sum = _mm512_setzero_ps();
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) sum = _mm512_add_ps(sum, acc[r][c]);
  return _mm512_reduce_add_ps(sum);
}

// Best of `repeats` timings of fn(), in seconds.
template <class Fn>
double best_seconds(int repeats, Fn&& fn) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    volatile float sink = fn();
    (void)sink;
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  return best;
}

template <int R>
void run_rows(const uint8_t* w, size_t bytes, const uint16_t* act, int64_t lead) {
  constexpr size_t kWarmBytes = 256 << 10;
  const double warm =
      best_seconds(200, [&] { return stream<R, Hint::kNone>(w, kWarmBytes, act, 0); });
  const double compute = warm * (static_cast<double>(bytes) / kWarmBytes);
  const double none = best_seconds(3, [&] { return stream<R, Hint::kNone>(w, bytes, act, lead); });
  const double l1 = best_seconds(3, [&] { return stream<R, Hint::kL1>(w, bytes, act, lead); });
  const double l2 = best_seconds(3, [&] { return stream<R, Hint::kL2>(w, bytes, act, lead); });
  std::printf("%d dots/line: compute (from L2) %6.2f ms, no prefetch %6.2f, L1 %6.2f, L2 %6.2f\n",
              R, compute * 1e3, none * 1e3, l1 * 1e3, l2 * 1e3);
}

}  // namespace

int main(int argc, char** argv) {
  if (!moecore::cpu_features().avx512_bf16) {
    std::fprintf(stderr, "moecore_prefetch_timing needs AVX512-BF16\n");
    return 1;
  }
  const int64_t lead = argc > 1 ? std::atoll(argv[1]) : 8192;
  if (lead < 0 || lead > (1 << 20)) {
    std::fprintf(stderr, "lead must be 0 to 1048576 bytes, not %lld\n",
                 static_cast<long long>(lead));
    return 1;
  }
  const size_t bytes = size_t{256} << 20, padded = bytes + (size_t{2} << 20);
  auto* w = static_cast<uint8_t*>(std::aligned_alloc(size_t{2} << 20, padded));
  auto* act = static_cast<uint16_t*>(std::aligned_alloc(64, 9 * 4096));
  if (w == nullptr || act == nullptr) {
    std::fprintf(stderr, "out of memory\n");
    return 1;
  }
  madvise(w, padded, MADV_HUGEPAGE);
  std::memset(w, 0, padded);
  std::fill(act, act + 9 * 2048, uint16_t{0x3f80});  // bf16 1.0
  std::printf("one thread, 256 MiB from memory, prefetch lead %lld bytes (best of 3)\n",
              static_cast<long long>(lead));
  run_rows<1>(w, bytes, act, lead);
  run_rows<2>(w, bytes, act, lead);
  run_rows<4>(w, bytes, act, lead);
  run_rows<8>(w, bytes, act, lead);
  std::free(w);
  std::free(act);
  return 0;
}
