// The streamed tile walk of the avx512 and avx512_bf16 rows of the scaled GEMM (include only from
// files compiled with AVX-512 flags or more; internal linkage, so each row keeps its own copy).
//
// Weight streams decode the backend-contract layout in registers, 16 elements at a time, exactly
// to fp32 (no decoded copy of the weights). A Dots type turns R activation rows × C streamed
// weight rows into R·C dot products over one K block, in its row's arithmetic (folded per block,
// or as 16 lane sums per output: Dots::kLaneSums); walk() runs a call as tiles of C weight
// channels × R rows and applies quant_gemm.h's formula per tile. Each
// output's arithmetic depends only on its own activation row and weight row, so results never
// depend on M, on the column split or on the thread.
#pragma once

#include <algorithm>
#include <cstdint>

#include "moecore/core/error.h"
#include "moecore/kernels/quant_gemm.h"
#include "moecore/kernels/x86/avx512_lanes.h"
#include "moecore/kernels/x86/row_common.h"

namespace moecore {
namespace {

// 16 e4m3fn codes → fp32, exact. The code shifted into a fp16 bit pattern (S.0EEEE.MMM0000000) is
// its value · 2^-8, subnormals included, so cvtph then × 2^8 (exact). The NaN codes S.1111.111
// are turned into the fp16 quiet NaN, which widens to the scalar decoder's NaN (sign kept).
inline __m512 decode_e4m3x16(const uint8_t* codes, __mmask16 mask) {
  const __m256i t = _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_maskz_loadu_epi8(mask, codes)), 7);
  const __m256i magnitude = _mm256_set1_epi16(0x3f80);
  const __m256i h = _mm256_and_si256(t, _mm256_set1_epi16(static_cast<int16_t>(0xbf80)));
  // NaN lanes hold S | 0x3f80; xor with 0x4180 gives S | 0x7e00. A vector compare and one
  // ternary logic h ^ (nan & 0x4180) (imm 0x78) keep this off the slower mask registers.
  const __m256i nan = _mm256_cmpeq_epi16(_mm256_and_si256(t, magnitude), magnitude);
  const __m256i fixed = _mm256_ternarylogic_epi32(h, nan, _mm256_set1_epi16(0x4180), 0x78);
  return _mm512_mul_ps(_mm512_cvtph_ps(fixed), _mm512_set1_ps(256.0f));
}

// Weight streams: bind(c, ...) points tile channel c at one weight row; load(c, i, mask) gives
// that row's elements [i, i + 16) exactly in fp32 (lanes outside `mask` are +0); element i of
// channel c starts at byte i · kHalfBytes / 2 of row(c).

template <DType kDtype>
struct DenseStream : StreamRows<void> {
  static constexpr int kHalfBytes = kDtype == DType::kF32 ? 8 : 4;
  __m512 load(int c, int64_t i, __mmask16 mask) const {
    return avx512::load_dense16(row[c], kDtype, i, mask);
  }
};

struct Fp8Stream : StreamRows<uint8_t> {
  static constexpr int kHalfBytes = 2;
  __m512 load(int c, int64_t i, __mmask16 mask) const { return decode_e4m3x16(row[c] + i, mask); }
};

// int8 codes against activations that are not integer codes: fp32 products like the reference.
struct Int8AsFloatStream : StreamRows<int8_t> {
  static constexpr int kHalfBytes = 2;
  __m512 load(int c, int64_t i, __mmask16 mask) const {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, row[c] + i)));
  }
};

// fp4 rows (x86/row_common.h): each 16 weights are a permute of their block's table.
template <int kGroup>
struct Fp4Stream : Fp4StreamRows<kGroup> {
  static constexpr int kHalfBytes = 1;
  using Fp4StreamRows<kGroup>::row;
  using Fp4StreamRows<kGroup>::scale_code;
  __m512 load(int c, int64_t i, __mmask16) const {
    const __m512i bytes =
        _mm512_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row[c] + i / 2)));
    // Lane 2j takes byte j (the permute reads its low nibble), lane 2j + 1 byte j >> 4.
    const __m512i interleave =
        _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i nibbles =
        _mm512_permutex2var_epi32(bytes, interleave, _mm512_srli_epi32(bytes, 4));
    return _mm512_permutexvar_ps(nibbles, _mm512_load_ps(tables.values[scale_code(c, i)]));
  }

  const Fp4Tables& tables = fp4_tables<kGroup>();
};

/// Bytes from one weight row of a stream to the next (the contract layout's row stride).
template <class Stream>
inline int64_t stream_row_stride(const Stream&, const WeightOperand& w) {
  return w.data.strides[1] * dtype_size(w.data.dtype);
}

// Prefetch. The C weight rows of a tile are C short streams that the hardware prefetcher picks
// up too late (decode rows are a few KiB). Consecutive tiles read consecutive weight rows, so
// each channel fetches the same place of the next tile's row, WeightPrefetch::lead bytes further
// on: a whole tile of lead, whatever K. Element k of a row starts at byte k · kHalfBytes / 2.

// Steps of 32 elements: the line holding element k, every step, for tiles of R activation rows.
// (A prefetch on line starts only, as prefetch_next_tile does, came out of GCC's loop versioning
// missing from the loop that runs.)
template <int R, int C, int kHalfBytes, class T>
inline void prefetch_next_tile_step(const T* const (&rows)[kMaxChannels], int64_t k,
                                    const WeightPrefetch& prefetch) {
  for (int c = 0; c < C; ++c)
    prefetch.line<R>(reinterpret_cast<const char*>(rows[c]) + k * kHalfBytes / 2);
}

// Steps of 16 elements (several per line for 8- and 4-bit codes): only when element k starts a
// cache line.
template <int R, int C, int kHalfBytes, class T>
inline void prefetch_next_tile(const T* const (&rows)[kMaxChannels], int64_t k,
                               const WeightPrefetch& prefetch) {
  if ((k * kHalfBytes / 2 & 63) == 0) prefetch_next_tile_step<R, C, kHalfBytes>(rows, k, prefetch);
}

/// The dots of R × C accumulators of 16 fp32 lane sums, each folded in the canonical pairwise
/// order.
template <int R, int C>
inline void fold_dots(const __m512 (&acc)[R][C], float (&part)[R][C]) {
  for (int r = 0; r < R; ++r) {
    if constexpr (C == 4)
      avx512::fold4(acc[r][0], acc[r][1], acc[r][2], acc[r][3], part[r]);
    else
      for (int c = 0; c < C; ++c) part[r][c] = avx512::fold(acc[r][c]);
  }
}

// Writes R × C outputs (nc channels real), each total · alpha.
template <int R, int C>
void store_tile(const Call& call, const float (&total)[R][C], int64_t r0, int64_t c0, int nc) {
  const bool has_alpha = call.w.alpha.data != nullptr;
  const float alpha =
      has_alpha ? call.w.alpha.ptr<float>()[call.e * call.w.alpha.strides[0]] : 1.0f;
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < nc; ++c)
      call.out[(r0 + r) * call.ldo + c0 + c] = has_alpha ? total[r][c] * alpha : total[r][c];
}

// A row's C vectors of 16 lane sums folded within each 128-bit chunk, into one vector whose lane c
// of every chunk holds channel c's sum of that chunk's four lanes, (j + j+2) + (j+1 + j+3): all
// in-lane unpacks and adds, for each channel the same adds whatever C (in 2-channel tiles lanes 2
// and 3 repeat channels 0 and 1, as b + a = a + b).
template <int C>
inline __m512 row_chunk_sums(const __m512 (&acc)[C]) {
  static_assert(C == 2 || C == kMaxChannels, "a row's chunk sums fill one vector");
  // [a0 + a2, b0 + b2, a1 + a3, b1 + b3] in every chunk, for channels a, b.
  const auto pair_sums = [](__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  };
  const __m512 s01 = pair_sums(acc[0], acc[1]);
  if constexpr (C == kMaxChannels) {
    const __m512d s23 = _mm512_castps_pd(pair_sums(acc[2], acc[3]));
    const __m512d d01 = _mm512_castps_pd(s01);
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(d01, s23)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(d01, s23)));
  } else {
    return _mm512_add_ps(s01, _mm512_permute_ps(s01, _MM_SHUFFLE(1, 0, 3, 2)));
  }
}

// Dots that sum in their own instruction order (Dots::kLaneSums; the avx512_bf16 row) give each
// output's 16 lane sums of a K block. Each block's are summed within each 128-bit chunk
// (row_chunk_sums), scaled by sa[r, b] · sw[c, b] and added lane by lane (one FMA); the four
// chunks fold once at the end, (0 + 2) + (1 + 3). A row's channels then share one vector of
// totals, so a 6 × 4 tile keeps 6 totals beside its 24 accumulators: with 24 totals of 16 lanes,
// spilled and reloaded every block, the per-block scaling took half of a blocked fp8 tile's time
// (128 × 128 blocks; Zen 4). The per-block sums take in-lane unpacks: folded across chunks first
// (j += j+8, j += j+4: six 512-bit lane-crossing shuffles a row of four channels), calls on
// 128 × 128 fp8 blocks took up to 1.3× the time (Zen 4, one thread, from L2: 1 × 1536 × 2048
// 1.07–1.33×, 32 rows 1.01–1.11×, 64 × 2048 × 768 1.04–1.10×, 2-channel tiles of 6 and 8 rows
// 0.98–1.04×; bench/RESULTS.md). Never inlined: inlined into the walk of a whole call, its loop's
// registers depended on the code around it (a change to the activation packing there made nvfp4
// decode 1.2× slower through spills in this loop).
template <int R, int C, class Dots>
[[gnu::noinline]] void tile_lane_sums(const Call& call, const Dots& dots, int64_t r0,
                                      int64_t c0, int nc, const float* w_scales) {
  __m512 total[R];  // lane c of each chunk of total[r]: channel c of row r (row_chunk_sums)
  for (int64_t b = 0; b < call.nb; ++b) {
    const int64_t k0 = b * call.kb, len = std::min(call.kb, call.w.k - k0);
    __m512 acc[R][C];
    dots.template lanes<R, C>(r0, b, k0, len, acc);
    // sw[c, b] in lane c of every chunk (2-channel tiles: channels 0, 1, 0, 1).
    __m128 block_scales = _mm_loadu_ps(w_scales + b * kMaxChannels);
    if constexpr (C == 2) block_scales = _mm_movelh_ps(block_scales, block_scales);
    const __m512 sw = _mm512_broadcast_f32x4(block_scales);
    for (int r = 0; r < R; ++r) {
      const __m512 scale = _mm512_mul_ps(sw, _mm512_set1_ps(dots.row_scale(r0 + r, b)));
      const __m512 sums = row_chunk_sums<C>(acc[r]);
      total[r] = b == 0 ? _mm512_mul_ps(sums, scale) : _mm512_fmadd_ps(sums, scale, total[r]);
    }
  }
  float folded[R][C];
  for (int r = 0; r < R; ++r) {
    // Chunks (0 + 2) + (1 + 3); lane c of chunk 0 then holds channel c.
    const __m512 halves =
        _mm512_add_ps(total[r], _mm512_shuffle_f32x4(total[r], total[r], _MM_SHUFFLE(1, 0, 3, 2)));
    const __m512 whole =
        _mm512_add_ps(halves, _mm512_shuffle_f32x4(halves, halves, _MM_SHUFFLE(2, 3, 0, 1)));
    alignas(16) float lanes[kMaxChannels];
    _mm_store_ps(lanes, _mm512_castps512_ps128(whole));
    for (int c = 0; c < C; ++c) folded[r][c] = lanes[c];
  }
  store_tile(call, folded, r0, c0, nc);
}

// The canonical order (Dots::run folds each block's dot): per K block, the dot, then
// · sa[r, b] · sw[c, b] added in block order, then · alpha.
template <int R, int C, class Dots>
void tile_block_dots(const Call& call, const Dots& dots, int64_t r0, int64_t c0, int nc,
                     const float* w_scales) {
  const ActivationCodes& a = call.a;
  float total[R][C] = {};
  for (int64_t b = 0; b < call.nb; ++b) {
    const int64_t k0 = b * call.kb, len = std::min(call.kb, call.w.k - k0);
    float part[R][C];
    dots.template run<R, C>(r0, k0, len, part);
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < C; ++c) {
        const float p = part[r][c] * a.scale(r0 + r, b) * w_scales[b * kMaxChannels + c];
        total[r][c] = b == 0 ? p : total[r][c] + p;
      }
    }
  }
  store_tile(call, total, r0, c0, nc);
}

// R rows from r0 × C channels from c0 (nc of them real), in the Dots' order.
template <int R, int C, class Dots>
void tile(const Call& call, const Dots& dots, int64_t r0, int64_t c0, int nc,
          const float* w_scales) {
  if constexpr (Dots::kLaneSums)
    tile_lane_sums<R, C>(call, dots, r0, c0, nc, w_scales);
  else
    tile_block_dots<R, C>(call, dots, r0, c0, nc, w_scales);
}

// Rows per tile of C channels: the R·C accumulators, C weight vectors and the constants stay in
// registers. Dots that fold each block (R·C ≤ 16: their fold needs registers too) walk 4 × 4 or
// 2 × 8; lane-sum dots (Dots::kLaneSums) walk 4 channels × up to 6 rows, 24 accumulators and ten
// loads per 24 VDPBF16PS where 2 × 8 took ten per 16 (Zen 4, one call from L2: 64 × 1536 × 2048
// bf16 0.86×, mxfp4 0.81× the time; bench/RESULTS.md).
template <int C, bool kLaneSums>
constexpr int kWalkRows = C == 4 ? (kLaneSums ? 6 : 4) : 8;

// The tile of `rows` rows (1 to kWalkRows), picked at compile time.
template <int C, int R = 1, class Dots>
void row_tile(const Call& call, const Dots& dots, int64_t r0, int rows, int64_t c0, int nc,
              const float* w_scales) {
  if constexpr (R <= kWalkRows<C, Dots::kLaneSums>) {
    if (rows == R) return tile<R, C>(call, dots, r0, c0, nc, w_scales);
    return row_tile<C, R + 1>(call, dots, r0, rows, c0, nc, w_scales);
  }
  MOECORE_INTERNAL_CHECK(false, "row tile of ", rows, " rows");
}

// Tiles of C channels (the last one padded by repeating its final row, results dropped) × row
// tiles of at most kWalkRows rows, as even as they divide: their sizes differ by one at most (13
// rows in 6-row tiles: 5 + 4 + 4, not 6 + 6 + 1, which would stream every weight again for one
// row; 32 rows: 6 + 6 + 5 + 5 + 5 + 5).
template <int C, class Dots>
void walk(const Call& call, Dots& dots) {
  constexpr int64_t kRows = kWalkRows<C, Dots::kLaneSums>;
  const int64_t row_tiles = (call.m + kRows - 1) / kRows;
  const int64_t short_rows = call.m / row_tiles, long_tiles = call.m % row_tiles;
  float* w_scales = call.w_scales;
  TileScales scales(call);
  dots.prefetch = WeightPrefetch::ahead_by(dots.stream.lead(call.w, C));
  for (int64_t c0 = 0; c0 < call.n; c0 += C) {
    const int nc = static_cast<int>(std::min<int64_t>(C, call.n - c0));
    for (int c = 0; c < C; ++c)
      dots.stream.bind(c, call.w, call.e, call.n0 + c0 + std::min(c, nc - 1));
    scales.bind(call.n0 + c0, call.n0 + c0 + nc - 1);
    for (int64_t t = 0, r0 = 0; t < row_tiles; ++t) {
      const int rows = static_cast<int>(short_rows + (t < long_tiles ? 1 : 0));
      row_tile<C>(call, dots, r0, rows, c0, nc, w_scales);
      r0 += rows;
    }
  }
}

// Calls of at most this many rows (decode) walk tiles of 4 channels.
constexpr int64_t kFourChannelMaxRows = 4;

// Few rows (decode): 4 channels in flight, each weight vector used by ≤ 4 rows. Up to 8 rows:
// 2 channels × all of them, so the weights stream once (8 × 1536 × 2048 fp8 as 4 + 4 rows of 4
// channels took 1.12× the time). More rows: 4 × 6 for lane-sum dots, else 2 × 8. Whatever the
// tiles, each output's arithmetic is the same, so results never depend on M.
template <class Dots>
void walk_tiles(const Call& call, Dots& dots) {
  constexpr int64_t kTwoChannelRows = kWalkRows<2, Dots::kLaneSums>;
  if (call.m <= kFourChannelMaxRows || (Dots::kLaneSums && call.m > kTwoChannelRows))
    walk<4>(call, dots);
  else
    walk<2>(call, dots);
}

}  // namespace
}  // namespace moecore
