// AVX-512 row of the scaled-GEMM table (built with AVX-512 flags; reach it only through
// scaled_gemm_kernel()). Bit-identical to scaled_gemm_ref: every dot keeps the canonical order of
// gemm.h (16 lane sums, mul then add, masked tails, pairwise fold), the K-block terms are scaled
// and added exactly as quant_gemm.h's formula says, and int8×int8 dots are exact int32.
//
// Speed is on the memory side (decode is bandwidth bound): a tile of C output channels × R
// activation rows streams each weight row once, decodes 16 weights at a time in registers (exact;
// no decoded copy of the weights) and reuses that vector for all R rows, while the C independent
// accumulator chains keep the adds in flight. Larger M walks row tiles over the same C weight
// rows, which then come from L1/L2. Working memory comes from the call's GemmScratch (Buffers);
// int8 × int8 calls widen kIntRowChunk activation rows at a time, so it never depends on M.
#include <algorithm>
#include <cstring>

#include "moecore/core/error.h"
#include "moecore/kernels/quant_gemm.h"
#include "moecore/kernels/x86/weight_streams.h"

namespace moecore {
namespace {

// Activation rows widened to int16 at a time by int8 × int8 calls (the weights stream once per
// chunk; 64 rows of vpmaddwd work per weight byte keep that off the memory bound).
constexpr int64_t kIntRowChunk = 64;

// int16 codes per widened activation row: K rounded up to whole 32-lane loads (zero-padded).
int64_t int16_row_length(int64_t k) { return (k + 31) / 32 * 32; }

// The row's working memory, the same layout for every call on the weight operand.
struct Buffers {
  float* w_scales;    // [nb, kMaxChannels]: K-block scales of the channel tile
  int16_t* a16;       // [kIntRowChunk, int16_row_length(K)] + 32: widened int8 codes (kInt8)
  Buffers(ScratchCarver& s, const WeightOperand& w)
      : w_scales(s.take<float>(kMaxChannels * w.num_k_blocks())),
        a16(w.coding == WeightCoding::kInt8
                ? s.take<int16_t>(kIntRowChunk * int16_row_length(w.k) + 32)
                : nullptr) {}
};

// Canonical fp32 dots of R activation rows × C streamed weight rows over K range [k0, k0 + len).
template <class Stream>
struct FloatDots {
  Stream stream;
  const ActivationCodes* a;
  WeightPrefetch prefetch = {};  // set by walk
  static constexpr bool kLaneSums = false;  // canonical: each block's dot folded (tile)

  template <int R, int C>
  void run(int64_t r0, int64_t k0, int64_t len, float (&part)[R][C]) const {
    __m512 acc[R][C];
    const float* rows[R];
    for (int r = 0; r < R; ++r) {
      rows[r] = a->row(r0 + r) + k0;
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    }
    auto step = [&](int64_t i, __mmask16 mask) __attribute__((always_inline)) {
      __m512 wv[C];
      for (int c = 0; c < C; ++c) wv[c] = stream.load(c, k0 + i, mask);
      for (int r = 0; r < R; ++r) {
        const __m512 av = _mm512_maskz_loadu_ps(mask, rows[r] + i);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_add_ps(acc[r][c], _mm512_mul_ps(av, wv[c]));
      }
    };
    // Whole vectors with a constant mask (plain loads), then the masked tail.
    int64_t i = 0;
    for (; i + 16 <= len; i += 16) {
      prefetch_next_tile<R, C, Stream::kHalfBytes>(stream.row, k0 + i, prefetch);
      step(i, static_cast<__mmask16>(0xffff));
    }
    if (i < len) step(i, avx512::tail_mask(len - i));
    fold_dots(acc, part);
  }
};

// Exact int32 dots of int8 codes: activations pre-packed to int16 rows (zero-padded), weights
// sign-extended, pairs multiplied and added by vpmaddwd. Integer sums are order-free.
struct IntDots {
  Int8AsFloatStream stream;  // only its row pointers
  const int16_t* a;
  int64_t lda;
  WeightPrefetch prefetch = {};  // set by walk
  static constexpr bool kLaneSums = false;  // canonical: each block's dot folded (tile)

  template <int R, int C>
  void run(int64_t r0, int64_t k0, int64_t len, float (&part)[R][C]) const {
    __m512i acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_si512();
    const int16_t* rows = a + r0 * lda + k0;
    for (int64_t i = 0; i < len; i += 32) {
      prefetch_next_tile_step<R, C, Int8AsFloatStream::kHalfBytes>(stream.row, k0 + i, prefetch);
      const __mmask32 mask = avx512::tail_mask32(len - i);
      __m512i wv[C];
      for (int c = 0; c < C; ++c)
        wv[c] = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(mask, stream.row[c] + k0 + i));
      for (int r = 0; r < R; ++r) {
        const __m512i av = _mm512_loadu_si512(rows + r * lda + i);
        for (int c = 0; c < C; ++c)
          acc[r][c] = _mm512_add_epi32(acc[r][c], _mm512_madd_epi16(av, wv[c]));
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) part[r][c] = static_cast<float>(_mm512_reduce_add_epi32(acc[r][c]));
  }
};

template <class Stream>
void run_float(const Call& call, Stream stream) {
  FloatDots<Stream> dots{stream, &call.a};
  walk_tiles(call, dots);
}

// int8 × int8: activation rows [0, m) in chunks of kIntRowChunk, each widened to int16 rows
// (zero-padded so whole 32-lane loads stay in bounds) and walked as a call of its own; integer
// dots are exact, so a chunk's outputs equal those of one whole call.
void run_int8_codes(const Call& call, int16_t* a16) {
  const int64_t k = call.w.k, ld = int16_row_length(k);
  for (int64_t r0 = 0; r0 < call.m; r0 += kIntRowChunk) {
    const int64_t rows = std::min(kIntRowChunk, call.m - r0);
    for (int64_t r = 0; r < rows; ++r) {
      const float* src = call.a.row(r0 + r);
      for (int64_t i = 0; i < ld; i += 16) {
        const __mmask16 mask = avx512::tail_mask(std::max<int64_t>(k - i, 0));
        const __m512i v = _mm512_cvttps_epi32(_mm512_maskz_loadu_ps(mask, src + i));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(a16 + r * ld + i), _mm512_cvtepi32_epi16(v));
      }
    }
    std::memset(a16 + rows * ld, 0, 32 * sizeof(int16_t));
    IntDots dots{Int8AsFloatStream{}, a16, ld};
    walk_tiles(call.rows_from(r0, rows), dots);
  }
}

}  // namespace

size_t scaled_gemm_avx512_scratch_bytes(const WeightOperand& w) {
  ScratchCarver sizing;
  [[maybe_unused]] const Buffers layout(sizing, w);
  return sizing.bytes();
}

void scaled_gemm_avx512(const ActivationCodes& a, int64_t m, const WeightOperand& w, int64_t e,
                        int64_t n0, int64_t n, float* out, int64_t ldo) {
  const int64_t nb = w.num_k_blocks(), kb = w.k_block();
  check_activation_scales(a, w);
  ScratchCarver carver(gemm_scratch_memory(a, scaled_gemm_avx512_scratch_bytes(w)));
  const Buffers buffers(carver, w);
  const Call call{a, m, w, e, n0, n, out, ldo, nb, kb, buffers.w_scales};
  if (w.coding == WeightCoding::kInt8 && a.integer) return run_int8_codes(call, buffers.a16);
  run_with_weight_stream<DenseStream, Fp8Stream, Int8AsFloatStream, Fp4Stream>(
      w, [&](auto stream) { run_float(call, stream); });
}

}  // namespace moecore
