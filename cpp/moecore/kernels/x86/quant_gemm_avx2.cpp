// AVX2 row of the scaled-GEMM table (built with -mavx2 -mfma -mf16c; reach it only through
// scaled_gemm_kernel()). Bit-identical to scaled_gemm_ref: every dot keeps the canonical order of
// gemm.h (lanes 0–7 and 8–15 of the 16 lane sums in two __m256, or for fp4 a fixed permutation
// of them put back before the fold; mul then add, never FMA; the first fold step adds the two),
// K tails are zero-padded copies (nothing read past a row), the
// K-block terms are scaled and added exactly as quant_gemm.h's formula says, and int8×int8 dots
// are exact int32.
//
// The tile walk is the avx512 row's (x86/weight_streams.h) at 8 lanes: a tile of C output
// channels × R activation rows streams each weight row once, decodes 16 weights at a time in
// registers (exact; no decoded copy of the weights) and reuses them for all R rows. With 16 ymm
// registers the tiles are 4 × 1, 2 × 2 and 1 × 4 (walk_tiles), over L1-sized chunks of activation
// rows (for_each_row_chunk). Working memory comes from the call's GemmScratch (Buffers) and never
// depends on M.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "moecore/core/error.h"
#include "moecore/formats/fp4.h"
#include "moecore/kernels/quant_gemm.h"
#include "moecore/kernels/x86/row_common.h"

namespace moecore {
namespace {

// A call walks its activation rows in chunks of about this many bytes (L1-sized), at least one
// row tile each: the call's weights (an L2-sized column block) then stream once per chunk while
// the chunk's rows stay in L1, instead of every row streaming once per weight tile (one call at
// M = 64 and 128 1.2–1.45× faster on a Zen 3; bench/RESULTS.md). Working memory per chunk never
// depends on M.
constexpr int64_t kRowChunkBytes = 32 << 10;

/// Rows per chunk for activation rows of `row_bytes` each: whole 4-row tiles, at least one.
int64_t rows_per_chunk(int64_t row_bytes) {
  return std::max<int64_t>(4, kRowChunkBytes / row_bytes / 4 * 4);
}

bool is_fp4(WeightCoding coding) {
  return coding == WeightCoding::kNvfp4 || coding == WeightCoding::kMxfp4;
}

// int16 codes per widened activation row: K rounded up to whole 16-lane loads (zero-padded).
int64_t int16_row_length(int64_t k) { return (k + 15) / 16 * 16; }
int64_t int16_row_bytes(int64_t k) { return int16_row_length(k) * 2; }
int64_t float_row_bytes(int64_t k) { return k * 4; }

// The row's working memory, the same layout for every call on the weight operand.
struct Buffers {
  float* w_scales;  // [nb, kMaxChannels]: K-block scales of the channel tile
  int16_t* a16;     // a chunk of int16_row_length(K) rows: widened int8 codes (kInt8)
  float* permuted;  // a chunk of K-float rows: activations in an fp4 stream's lane order
  Buffers(ScratchCarver& s, const WeightOperand& w)
      : w_scales(s.take<float>(kMaxChannels * w.num_k_blocks())),
        a16(w.coding == WeightCoding::kInt8
                ? s.take<int16_t>(rows_per_chunk(int16_row_bytes(w.k)) * int16_row_length(w.k))
                : nullptr),
        permuted(is_fp4(w.coding) ? s.take<float>(rows_per_chunk(float_row_bytes(w.k)) * w.k)
                                  : nullptr) {}
};

/// _mm256_maskload_ps mask of lanes [0, min(max(left, 0), 8)).
inline __m256i tail_mask8(int64_t left) {
  static const int32_t kOnes[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256(
      reinterpret_cast<const __m256i*>(kOnes + 8 - std::clamp<int64_t>(left, 0, 8)));
}

// 16 e4m3fn codes → their fp16 bit patterns S.0EEEE.MMM0000000, each the code's value · 2^-8,
// subnormals included (the avx512 row's decode; widen with e4m3_half). kNanCodes: the NaN codes
// S.1111.111 become the fp16 quiet NaN, which widens to the scalar decoder's NaN (sign kept);
// without, the caller has checked that there are none (nan_code_in_line) and the fix is skipped
// (a quarter of the decode).
template <bool kNanCodes>
inline __m256i e4m3x16_as_f16(const uint8_t* codes) {
  const __m256i t = _mm256_slli_epi16(
      _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes))), 7);
  const __m256i h = _mm256_and_si256(t, _mm256_set1_epi16(static_cast<int16_t>(0xbf80)));
  if constexpr (!kNanCodes) return h;
  // NaN lanes hold S | 0x3f80; xor with 0x4180 gives S | 0x7e00.
  const __m256i magnitude = _mm256_set1_epi16(0x3f80);
  const __m256i nan = _mm256_cmpeq_epi16(_mm256_and_si256(t, magnitude), magnitude);
  return _mm256_xor_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x4180)));
}

/// Whether the 64 codes from element k of the C rows (a cache line's worth each) hold an e4m3 NaN
/// code S.1111.111: the codes | 0x80 reach 0xff only there.
template <int C>
inline bool nan_code_in_line(const uint8_t* const (&rows)[kMaxChannels], int64_t k) {
  const __m256i sign = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256i top = _mm256_setzero_si256();
  for (int c = 0; c < C; ++c)
    for (int half = 0; half < 2; ++half) {
      const __m256i v =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[c] + k + 32 * half));
      top = _mm256_max_epu8(top, _mm256_or_si256(v, sign));
    }
  return _mm256_movemask_epi8(_mm256_cmpeq_epi8(top, _mm256_set1_epi8(-1))) != 0;
}

/// Lanes [8h, 8h + 8) of e4m3x16_as_f16's patterns in fp32: cvtph, then with kTimes256 × 2^8
/// (exact: the codes' values); without, the values · 2^-8 (the caller scales the dot instead).
template <int kHalf, bool kTimes256>
inline __m256 e4m3_half(__m256i f16) {
  const __m128i part = kHalf == 0 ? _mm256_castsi256_si128(f16) : _mm256_extracti128_si256(f16, 1);
  if constexpr (!kTimes256) return _mm256_cvtph_ps(part);
  return _mm256_mul_ps(_mm256_cvtph_ps(part), _mm256_set1_ps(256.0f));
}

// Weight streams: bind(c, ...) points tile channel c at one weight row. A step takes 16 elements
// [i, i + 16) of channel c: fetch(c, src, i) reads them from src (the row's bytes of element i,
// or a zero-padded copy of a tail: zero bytes decode to +0) in the stream's raw form, and
// half<h>(raw) gives elements [i + 8h, i + 8h + 8) exactly in fp32 (the halves are widened one
// after the other, so that a tile's C raw steps, not 2·C fp32 vectors, wait in registers).
// Element i starts at byte i · kHalfBytes / 2 of row[c]. kDotScale: what each folded dot is
// multiplied by (a power of two the stream left out of its weights). kPermutedLanes: half h holds
// the step's elements kLaneOrder[8h …] instead of 8h … 8h + 7, the activations come in that order
// too (lay_out_activations, per row chunk in run_float), and to_canonical_lanes puts the lane sums
// back in order before the fold.

// Streams whose raw step is its bytes, widened by half().
struct RawBytesStream : StreamRows<uint8_t> {
  static constexpr bool kNanCodes = false;
  static constexpr float kDotScale = 1.0f;
  static constexpr bool kPermutedLanes = false;
  using Raw = const uint8_t*;
  template <bool>
  Raw fetch(int, const uint8_t* src, int64_t) const {
    return src;
  }
};

template <DType kDtype>
struct DenseStream : RawBytesStream {
  static constexpr int kHalfBytes = kDtype == DType::kF32 ? 8 : 4;
  template <int kHalf>
  __m256 half(Raw src) const {
    src += kHalf * 8 * kHalfBytes / 2;
    if constexpr (kDtype == DType::kF32)
      return _mm256_loadu_ps(reinterpret_cast<const float*>(src));
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    if constexpr (kDtype == DType::kF16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
};

// e4m3 rows. kScaledDot (activations with ActivationCodes::bounded_codes): the weights stay at
// value · 2^-8 (cvtph alone) and the dot is multiplied by 2^8, one multiply fewer per 8 weights.
// Every product and partial sum is then zero or a normal fp32 number (a multiple of 2^-26, far
// below overflow), as in the reference's order, so each rounding and the dot have the same bits.
template <bool kScaledDot>
struct Fp8Stream : StreamRows<uint8_t> {
  static constexpr int kHalfBytes = 2;
  static constexpr bool kNanCodes = true;
  static constexpr float kDotScale = kScaledDot ? 256.0f : 1.0f;
  static constexpr bool kPermutedLanes = false;
  using Raw = __m256i;
  template <bool kNan>
  Raw fetch(int, const uint8_t* src, int64_t) const {
    return e4m3x16_as_f16<kNan>(src);
  }
  template <int kHalf>
  __m256 half(Raw f16) const {
    return e4m3_half<kHalf, !kScaledDot>(f16);
  }
};

// int8 codes against activations that are not integer codes: fp32 products like the reference.
struct Int8AsFloatStream : RawBytesStream {
  static constexpr int kHalfBytes = 2;
  template <int kHalf>
  __m256 half(Raw src) const {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + 8 * kHalf))));
  }
};

// The fp4 tables of quant_gemm.h as byte tables for vpshufb: every entry e2m1(j) · scale is a
// bf16 value (≤ 2 significant bits times an e4m3 value or a power of two), so its fp32 bits are
// two bytes and 16 zero bits. Row `code` holds the low bytes of entries 0–15, then the high
// bytes.
struct Fp4ByteTables {
  alignas(32) uint8_t bytes[256][2][16];
  explicit Fp4ByteTables(const Fp4Tables& reference) {
    for (int code = 0; code < 256; ++code)
      for (int j = 0; j < 16; ++j) {
        uint32_t bits;
        std::memcpy(&bits, &reference.values[code][j], sizeof bits);
        MOECORE_INTERNAL_CHECK((bits & 0xffff) == 0, "fp4 scale code ", code, ": entry ", j,
                               " is not a bf16 value");
        bytes[code][0][j] = static_cast<uint8_t>(bits >> 16);
        bytes[code][1][j] = static_cast<uint8_t>(bits >> 24);
      }
  }
};

// fp4 rows (x86/row_common.h; K is a multiple of kGroup, so no step has a tail and a step lies
// in one group). A step's 8 bytes give the nibbles of elements 0, 2, …, 14 (low) and 1, 3, …, 15
// (high) in the two 128-bit lanes, two vpshufb look up their bf16 bytes in the step's table row
// and one unpack makes them bf16 words: lane 0 holds elements 0, 2, …, 14 and lane 1 the odd
// ones. The words' low halves (shifted up 16 bits) and high halves (masked) are then the fp32
// weights of the elements in kLaneOrder: no permute and no multiply per step (vpermd issues at half
// vpshufb's rate on Zen 3). The activations are laid out in the same order, so each lane sum adds
// the elements the canonical one does, in the same order.
template <int kGroup>
struct Fp4Stream : Fp4StreamRows<kGroup> {
  static constexpr int kHalfBytes = 1;
  static constexpr float kDotScale = 1.0f;
  static constexpr bool kNanCodes = false;
  static constexpr bool kPermutedLanes = true;
  // The canonical lane (element of the 16-element step) in each position of half 0, then half 1.
  static constexpr int kLaneOrder[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
  using Raw = __m256i;
  template <bool>
  Raw fetch(int c, const uint8_t* src, int64_t i) const {
    int64_t packed;
    std::memcpy(&packed, src, sizeof packed);
    // Both lanes hold the 8 bytes; lane 1 shifted right by 4: its bytes' high nibbles, masked.
    const __m256i nibbles = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi64x(packed), _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)),
        _mm256_set1_epi8(0x0f));
    const uint8_t (&row)[2][16] = tables.bytes[this->scale_code(c, i)];
    const __m256i low =
        _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(row[0])));
    const __m256i high =
        _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(row[1])));
    return _mm256_unpacklo_epi8(_mm256_shuffle_epi8(low, nibbles),
                                _mm256_shuffle_epi8(high, nibbles));
  }
  /// A row's K activations in kLaneOrder, 16 by 16.
  static void lay_out_activations(const float* src, float* dst, int64_t k) {
    for (int64_t i = 0; i < k; i += 16)
      for (int p = 0; p < 16; ++p) dst[i + p] = src[i + kLaneOrder[p]];
  }
  template <int kHalf>
  __m256 half(Raw words) const {
    if constexpr (kHalf == 0) return _mm256_castsi256_ps(_mm256_slli_epi32(words, 16));
    return _mm256_castsi256_ps(
        _mm256_and_si256(words, _mm256_set1_epi32(static_cast<int32_t>(0xffff0000u))));
  }
  // Lane sums in kLaneOrder (lo: 0, 4, 8, 12, 1, 5, 9, 13; hi: 2, 6, …, 15) → lo: 0 … 7, hi:
  // 8 … 15. Interleaving lo and hi by pairs gives lanes 0, 2, 4, 6, 1, 3, 5, 7 and 8, 10, …, 15 in
  // the same order; one permute sorts each (once per dot, not per step).
  static void to_canonical_lanes(__m256& lo, __m256& hi) {
    const __m256i sorted = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256 evens = _mm256_unpacklo_ps(lo, hi), odds = _mm256_unpackhi_ps(lo, hi);
    lo = _mm256_permutevar8x32_ps(evens, sorted);
    hi = _mm256_permutevar8x32_ps(odds, sorted);
  }

  static const Fp4ByteTables& tables_of_coding() {
    static const Fp4ByteTables tables(fp4_tables<kGroup>());
    return tables;
  }
  const Fp4ByteTables& tables = tables_of_coding();
};

/// Bytes from one weight row of a stream to the next (the contract layout's row stride).
inline int64_t row_stride_bytes(const WeightOperand& w) {
  return w.data.strides[1] * dtype_size(w.data.dtype);
}

// The C weight rows of a tile are C short streams that the hardware prefetcher picks up late, and
// consecutive tiles read consecutive rows: each channel fetches the same place of the next tile's
// row, `ahead` bytes on, once per cache line of its codes. The dots walk K in whole lines (a fixed
// number of 16-element steps) so that the prefetch needs no test that the compiler could version
// away from the loop that runs.
template <int kHalfBytes>
constexpr int64_t kLineElements = 64 * 2 / kHalfBytes;

template <int R, int C>
inline void prefetch_next_tile(const uint8_t* const (&rows)[kMaxChannels], int64_t byte,
                               const WeightPrefetch& prefetch) {
  for (int c = 0; c < C; ++c) prefetch.line<R>(rows[c] + byte);
}

// The canonical fold of 16 lane sums held as lanes 0–7 (lo) and 8–15 (hi): j += j+8 (lo + hi),
// j += j+4, j += j+2, j += j+1.
inline float fold(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

// fold() of four outputs at once: the same pairwise adds, the lanes of several outputs side by
// side in one register.
inline void fold4(const __m256 (&lo)[4], const __m256 (&hi)[4], float* out) {
  __m256 s8[4];
  for (int v = 0; v < 4; ++v) s8[v] = _mm256_add_ps(lo[v], hi[v]);
  // j += j+4: outputs v and v+1 side by side, one per 128-bit half.
  const __m256 s01 = _mm256_add_ps(_mm256_permute2f128_ps(s8[0], s8[1], 0x20),
                                   _mm256_permute2f128_ps(s8[0], s8[1], 0x31));
  const __m256 s23 = _mm256_add_ps(_mm256_permute2f128_ps(s8[2], s8[3], 0x20),
                                   _mm256_permute2f128_ps(s8[2], s8[3], 0x31));
  // j += j+2: half h holds output h's two sums, then output 2 + h's.
  const __m256 s2 = _mm256_add_ps(_mm256_shuffle_ps(s01, s23, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm256_shuffle_ps(s01, s23, _MM_SHUFFLE(3, 2, 3, 2)));
  // j += j+1: lanes 0, 1 | 4, 5 hold outputs 0, 2 | 1, 3.
  const __m256 s1 = _mm256_add_ps(_mm256_shuffle_ps(s2, s2, _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm256_shuffle_ps(s2, s2, _MM_SHUFFLE(3, 1, 3, 1)));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, s1);
  out[0] = lanes[0];
  out[1] = lanes[4];
  out[2] = lanes[1];
  out[3] = lanes[5];
}

/// The dots of R × C outputs from their lane sums, each folded in the canonical order.
template <int R, int C>
inline void fold_dots(const __m256 (&lo)[R][C], const __m256 (&hi)[R][C], float (&part)[R][C]) {
  for (int r = 0; r < R; ++r) {
    if constexpr (C == 4) {
      fold4(lo[r], hi[r], part[r]);
    } else {
      for (int c = 0; c < C; ++c) part[r][c] = fold(lo[r][c], hi[r][c]);
    }
  }
}

// Canonical fp32 dots of R activation rows × C streamed weight rows over K range [k0, k0 + len).
template <class Stream>
struct FloatDots {
  Stream stream;
  const ActivationCodes* a;
  // Streams with kPermutedLanes: the call's activation rows in kLaneOrder, row r at r · ld.
  const float* permuted = nullptr;
  int64_t permuted_ld = 0;
  WeightPrefetch prefetch = {};  // set by walk

  template <int R, int C>
  void run(int64_t r0, int64_t k0, int64_t len, float (&part)[R][C]) const {
    constexpr int kHalfBytes = Stream::kHalfBytes;
    // Byte offset of element k in a row (k ≥ 0; unsigned, so no rounding fix-ups for negatives).
    auto at = [](int64_t k) {
      return static_cast<int64_t>(static_cast<uint64_t>(k) * kHalfBytes / 2);
    };
    __m256 lo[R][C], hi[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) lo[r][c] = hi[r][c] = _mm256_setzero_ps();
    const float* rows[R];
    for (int r = 0; r < R; ++r)
      rows[r] = (Stream::kPermutedLanes ? permuted + (r0 + r) * permuted_ld : a->row(r0 + r)) + k0;
    // One 16-element step: the raw weights of channel c from w[c] (element k0 + i of its row),
    // then per half the weights in fp32 times activations [i + 8h, i + 8h + 8) (masked in a
    // tail: lanes past len are +0) into that half's lane sums.
    auto step = [&](int64_t i, const uint8_t* const(&w)[C], __m256i mask_lo, __m256i mask_hi,
                    auto masked, auto nan) __attribute__((always_inline)) {
      constexpr bool kNan = decltype(nan)::value;
      auto activations = [&](int r, int h, __m256i mask) __attribute__((always_inline)) {
        const float* ar = rows[r] + i + 8 * h;
        return masked ? _mm256_maskload_ps(ar, mask) : _mm256_loadu_ps(ar);
      };
      typename Stream::Raw raw[C];
      for (int c = 0; c < C; ++c) raw[c] = stream.template fetch<kNan>(c, w[c], k0 + i);
      auto half = [&](auto h, __m256(&acc)[R][C], __m256i mask) __attribute__((always_inline)) {
        constexpr int kHalf = decltype(h)::value;
        for (int r = 0; r < R; ++r) {
          const __m256 av = activations(r, kHalf, mask);
          for (int c = 0; c < C; ++c) {
            const __m256 wv = stream.template half<kHalf>(raw[c]);
            acc[r][c] = _mm256_add_ps(acc[r][c], _mm256_mul_ps(av, wv));
          }
        }
      };
      half(std::integral_constant<int, 0>{}, lo, mask_lo);
      half(std::integral_constant<int, 1>{}, hi, mask_hi);
    };
    const __m256i all = _mm256_set1_epi32(-1);
    auto from_rows = [&](int64_t i, auto nan) __attribute__((always_inline)) {
      const uint8_t* w[C];
      for (int c = 0; c < C; ++c) w[c] = stream.row[c] + at(k0 + i);
      step(i, w, all, all, std::false_type{}, nan);
    };
    // Whole cache lines of weights (one prefetch each; fp8 lines without NaN codes skip the NaN
    // fix), then whole steps, then the tail.
    constexpr int64_t kLine = kLineElements<kHalfBytes>;
    constexpr std::bool_constant<Stream::kNanCodes> may_hold_nan;
    int64_t i = 0;
    for (; i + kLine <= len; i += kLine) {
      prefetch_next_tile<R, C>(stream.row, at(k0 + i), prefetch);
      if (Stream::kNanCodes && nan_code_in_line<C>(stream.row, at(k0 + i))) {
        for (int64_t s = 0; s < kLine; s += 16) from_rows(i + s, may_hold_nan);
      } else {
        for (int64_t s = 0; s < kLine; s += 16) from_rows(i + s, std::false_type{});
      }
    }
    for (; i + 16 <= len; i += 16) from_rows(i, may_hold_nan);
    if (i < len) {
      // The tail: each channel's last elements copied into zeros (decoded as +0) and the
      // activations masked (+0), so the lanes past len add +0 · +0 (no change to a lane sum).
      const int64_t left = len - i;
      alignas(32) uint8_t tail[C][16 * kHalfBytes / 2] = {};
      const uint8_t* w[C];
      for (int c = 0; c < C; ++c) {
        std::memcpy(tail[c], stream.row[c] + at(k0 + i), at(left));
        w[c] = tail[c];
      }
      step(i, w, tail_mask8(left), tail_mask8(left - 8), std::true_type{}, may_hold_nan);
    }
    if constexpr (Stream::kPermutedLanes)
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) Stream::to_canonical_lanes(lo[r][c], hi[r][c]);
    fold_dots(lo, hi, part);
    if constexpr (Stream::kDotScale != 1.0f)
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) part[r][c] *= Stream::kDotScale;
  }
};

// Exact int32 dots of int8 codes: activations pre-packed to int16 rows (zero-padded), weights
// sign-extended, pairs multiplied and added by vpmaddwd. Integer sums are order-free.
struct IntDots {
  Int8AsFloatStream stream;  // only its row pointers
  const int16_t* a;
  int64_t lda;
  WeightPrefetch prefetch = {};  // set by walk

  template <int R, int C>
  void run(int64_t r0, int64_t k0, int64_t len, float (&part)[R][C]) const {
    __m256i acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_si256();
    const int16_t* rows = a + r0 * lda + k0;
    // 16 codes of each channel from `w` (element k0 + i of its row, or a zero-padded tail).
    auto step = [&](int64_t i, const uint8_t* const(&w)[C]) __attribute__((always_inline)) {
      __m256i wv[C];
      for (int c = 0; c < C; ++c)
        wv[c] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[c])));
      for (int r = 0; r < R; ++r) {
        const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows + r * lda + i));
        for (int c = 0; c < C; ++c)
          acc[r][c] = _mm256_add_epi32(acc[r][c], _mm256_madd_epi16(av, wv[c]));
      }
    };
    auto from_rows = [&](int64_t i) __attribute__((always_inline)) {
      const uint8_t* w[C];
      for (int c = 0; c < C; ++c) w[c] = stream.row[c] + k0 + i;
      step(i, w);
    };
    constexpr int64_t kLine = kLineElements<Int8AsFloatStream::kHalfBytes>;
    int64_t i = 0;
    for (; i + kLine <= len; i += kLine) {
      prefetch_next_tile<R, C>(stream.row, k0 + i, prefetch);
      for (int64_t s = 0; s < kLine; s += 16) from_rows(i + s);
    }
    for (; i + 16 <= len; i += 16) from_rows(i);
    if (i < len) {
      alignas(16) uint8_t tail[C][16] = {};
      const uint8_t* w[C];
      for (int c = 0; c < C; ++c) {
        std::memcpy(tail[c], stream.row[c] + k0 + i, len - i);
        w[c] = tail[c];
      }
      step(i, w);
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) {
        const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(acc[r][c]),
                                        _mm256_extracti128_si256(acc[r][c], 1));
        const __m128i s2 = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        const __m128i s1 = _mm_add_epi32(s2, _mm_shuffle_epi32(s2, _MM_SHUFFLE(1, 1, 1, 1)));
        part[r][c] = static_cast<float>(_mm_cvtsi128_si32(s1));
      }
  }
};

// R rows from r0 × C channels from c0 (nc of them real), in the canonical order: per K block the
// dot, then · sa[r, b] · sw[c, b], added in block order, then · alpha.
template <int R, int C, class Dots>
void tile(const Call& call, const Dots& dots, int64_t r0, int64_t c0, int nc) {
  const ActivationCodes& a = call.a;
  float total[R][C] = {};
  for (int64_t b = 0; b < call.nb; ++b) {
    const int64_t k0 = b * call.kb, len = std::min(call.kb, call.w.k - k0);
    float part[R][C];
    dots.template run<R, C>(r0, k0, len, part);
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < C; ++c) {
        const float p = part[r][c] * a.scale(r0 + r, b) * call.w_scales[b * kMaxChannels + c];
        total[r][c] = b == 0 ? p : total[r][c] + p;
      }
    }
  }
  const bool has_alpha = call.w.alpha.data != nullptr;
  const float alpha =
      has_alpha ? call.w.alpha.ptr<float>()[call.e * call.w.alpha.strides[0]] : 1.0f;
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < nc; ++c)
      call.out[(r0 + r) * call.ldo + c0 + c] = has_alpha ? total[r][c] * alpha : total[r][c];
}

// The tile of `rows` rows (1 to kRows), picked at compile time.
template <int C, int kRows, int R = 1, class Dots>
void row_tile(const Call& call, const Dots& dots, int64_t r0, int rows, int64_t c0, int nc) {
  if constexpr (R <= kRows) {
    if (rows == R) return tile<R, C>(call, dots, r0, c0, nc);
    return row_tile<C, kRows, R + 1>(call, dots, r0, rows, c0, nc);
  }
  MOECORE_INTERNAL_CHECK(false, "row tile of ", rows, " rows");
}

// Tiles of C channels (the last one padded by repeating its final row, results dropped) × row
// tiles of kRows rows.
template <int C, int kRows, class Dots>
void walk(const Call& call, Dots& dots) {
  TileScales scales(call);
  dots.prefetch = WeightPrefetch::ahead_by(C * row_stride_bytes(call.w));
  for (int64_t c0 = 0; c0 < call.n; c0 += C) {
    const int nc = static_cast<int>(std::min<int64_t>(C, call.n - c0));
    for (int c = 0; c < C; ++c)
      dots.stream.bind(c, call.w, call.e, call.n0 + c0 + std::min(c, nc - 1));
    scales.bind(call.n0 + c0, call.n0 + c0 + nc - 1);
    for (int64_t r0 = 0; r0 < call.m; r0 += kRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kRows, call.m - r0));
      row_tile<C, kRows>(call, dots, r0, rows, c0, nc);
    }
  }
}

// Tile shapes (channels × rows) by the call's rows: one row, 4 × 1 (four weight streams in
// flight, 8 lane sums); two rows, 2 × 2; more, 1 × 4 (each decoded weight vector serves four
// rows: faster on Zen 4 than 2 × 3 or 3 × 2, whose raw weights and lane sums spill). Each
// output's arithmetic is the same in every shape, so results never depend on M. (One weight row
// per one-row tile made dense and int8-code decode 8–18 % faster on a Zen 3 and 25–28 % slower on
// a Xeon; bench/RESULTS.md.)
template <class Dots>
void walk_tiles(const Call& call, Dots& dots) {
  if (call.m <= 1)
    walk<4, 1>(call, dots);
  else if (call.m == 2)
    walk<2, 2>(call, dots);
  else
    walk<1, 4>(call, dots);
}

// run(chunk) for activation rows [0, m) in chunks of rows_per_chunk(row_bytes), each a call of
// its own (each output's arithmetic never depends on the other rows, so the bits are the same).
template <class Run>
void for_each_row_chunk(const Call& call, int64_t row_bytes, Run&& run) {
  const int64_t step = rows_per_chunk(row_bytes);
  for (int64_t r0 = 0; r0 < call.m; r0 += step)
    run(call.rows_from(r0, std::min(step, call.m - r0)));
}

// Float dots of `stream`, chunk by chunk; a stream with kPermutedLanes reads each chunk's rows laid
// out in its lane order in `permuted`.
template <class Stream>
void run_float(const Call& call, Stream stream, float* permuted) {
  const int64_t k = call.w.k;
  for_each_row_chunk(call, float_row_bytes(k), [&](const Call& chunk) {
    FloatDots<Stream> dots{stream, &chunk.a};
    if constexpr (Stream::kPermutedLanes) {
      for (int64_t r = 0; r < chunk.m; ++r)
        Stream::lay_out_activations(chunk.a.row(r), permuted + r * k, k);
      dots.permuted = permuted;
      dots.permuted_ld = k;
    }
    walk_tiles(chunk, dots);
  });
}

// int8 × int8: chunk by chunk, the activation rows widened to int16 rows (zero-padded to whole
// 16-lane loads); integer dots are exact.
void run_int8_codes(const Call& call, int16_t* a16) {
  const int64_t k = call.w.k, ld = int16_row_length(k);
  for_each_row_chunk(call, int16_row_bytes(k), [&](const Call& chunk) {
    for (int64_t r = 0; r < chunk.m; ++r) {
      const float* src = chunk.a.row(r);
      for (int64_t i = 0; i < ld; i += 8) {
        const __m256i v = _mm256_cvttps_epi32(_mm256_maskload_ps(src + i, tail_mask8(k - i)));
        const __m128i packed =
            _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(a16 + r * ld + i), packed);
      }
    }
    IntDots dots{Int8AsFloatStream{}, a16, ld};
    walk_tiles(chunk, dots);
  });
}

}  // namespace

size_t scaled_gemm_avx2_scratch_bytes(const WeightOperand& w) {
  ScratchCarver sizing;
  [[maybe_unused]] const Buffers layout(sizing, w);
  return sizing.bytes();
}

void scaled_gemm_avx2(const ActivationCodes& a, int64_t m, const WeightOperand& w, int64_t e,
                      int64_t n0, int64_t n, float* out, int64_t ldo) {
  const int64_t nb = w.num_k_blocks(), kb = w.k_block();
  check_activation_scales(a, w);
  ScratchCarver carver(gemm_scratch_memory(a, scaled_gemm_avx2_scratch_bytes(w)));
  const Buffers buffers(carver, w);
  const Call call{a, m, w, e, n0, n, out, ldo, nb, kb, buffers.w_scales};
  if (w.coding == WeightCoding::kInt8 && a.integer) return run_int8_codes(call, buffers.a16);
  if (w.coding == WeightCoding::kFp8 && a.bounded_codes)
    return run_float(call, Fp8Stream<true>{}, nullptr);
  run_with_weight_stream<DenseStream, Fp8Stream<false>, Int8AsFloatStream, Fp4Stream>(
      w, [&](auto stream) { run_float(call, stream, buffers.permuted); });
}

}  // namespace moecore
