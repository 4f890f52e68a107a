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
#include "moecore/kernels/x86/avx512_lanes.h"

namespace moecore {
namespace {

constexpr int kMaxChannels = 4;
constexpr int64_t kPrefetchBytes = 1024;
// Activation rows widened to int16 at a time by int8 × int8 calls (the weights stream once per
// chunk; 64 rows of vpmaddwd work per weight byte keep that off the memory bound).
constexpr int64_t kIntRowChunk = 64;

// int16 codes per widened activation row: K rounded up to whole 32-lane loads (zero-padded).
int64_t int16_row_length(int64_t k) { return (k + 31) / 32 * 32; }

// The row's working memory, the same layout for every call on the weight operand.
struct Buffers {
  float* w_scales;    // [kMaxChannels, nb]: K-block scales of the channel tile
  float* fp4_scales;  // [kMaxChannels, K / group]: decoded fp4 block scales (fp4 codings)
  int16_t* a16;       // [kIntRowChunk, int16_row_length(K)] + 32: widened int8 codes (kInt8)
  Buffers(ScratchCarver& s, const WeightOperand& w)
      : w_scales(s.take<float>(kMaxChannels * w.num_k_blocks())),
        fp4_scales(is_fp4(w) ? s.take<float>(kMaxChannels * (w.k / fp4_group_size(w.coding)))
                             : nullptr),
        a16(w.coding == WeightCoding::kInt8
                ? s.take<int16_t>(kIntRowChunk * int16_row_length(w.k) + 32)
                : nullptr) {}
  static bool is_fp4(const WeightOperand& w) {
    return w.coding == WeightCoding::kNvfp4 || w.coding == WeightCoding::kMxfp4;
  }
};

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

// 16 e8m0 codes → fp32 2^(code − 127), exact: code 0 is the subnormal 2^-127 and 0xff
// the scalar decoder's NaN.
inline __m512 decode_e8m0x16(const uint8_t* codes, __mmask16 mask) {
  const __m512i c = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask, codes));
  __m512i bits = _mm512_slli_epi32(c, 23);
  bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(c, _mm512_setzero_si512()),
                               _mm512_set1_epi32(0x00400000));
  bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(c, _mm512_set1_epi32(0xff)),
                               _mm512_set1_epi32(0x7fc00000));
  return _mm512_castsi512_ps(bits);
}

// Weight streams: bind(c, ...) points tile channel c at one weight row; load(c, i, mask) gives
// that row's elements [i, i + 16) exactly in fp32 (lanes outside `mask` are +0); element i of
// channel c starts at byte i · kHalfBytes / 2 of row(c).

template <DType kDtype>
struct DenseStream {
  static constexpr int kHalfBytes = kDtype == DType::kF32 ? 8 : 4;
  const void* row[kMaxChannels] = {};
  void bind(int c, const WeightOperand& w, int64_t e, int64_t r) { row[c] = w.data.at({e, r, 0}); }
  __m512 load(int c, int64_t i, __mmask16 mask) const {
    return avx512::load_dense16(row[c], kDtype, i, mask);
  }
};

struct Fp8Stream {
  static constexpr int kHalfBytes = 2;
  const uint8_t* row[kMaxChannels] = {};
  void bind(int c, const WeightOperand& w, int64_t e, int64_t r) {
    row[c] = static_cast<const uint8_t*>(w.data.at({e, r, 0}));
  }
  __m512 load(int c, int64_t i, __mmask16 mask) const { return decode_e4m3x16(row[c] + i, mask); }
};

// int8 codes against activations that are not integer codes: fp32 products like the reference.
struct Int8AsFloatStream {
  static constexpr int kHalfBytes = 2;
  const int8_t* row[kMaxChannels] = {};
  void bind(int c, const WeightOperand& w, int64_t e, int64_t r) {
    row[c] = static_cast<const int8_t*>(w.data.at({e, r, 0}));
  }
  __m512 load(int c, int64_t i, __mmask16 mask) const {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, row[c] + i)));
  }
};

// Packed e2m1 (element 2j in the low nibble of byte j), one block scale per `group` elements
// (a multiple of 16). Each 16 weights are a permute of the 16 e2m1 values × their block scale:
// the products are exact (≤ 3 significant bits times a power of two or an e4m3 value), equal to
// the reference's decoded codes.
struct Fp4Stream {
  static constexpr int kHalfBytes = 1;
  Fp4Stream(WeightCoding coding, int64_t k, float* scale_buffer)
      : coding(coding), blocks(k / fp4_group_size(coding)), scale_buffer(scale_buffer) {
    shift = coding == WeightCoding::kNvfp4 ? 4 : 5;
  }
  void bind(int c, const WeightOperand& w, int64_t e, int64_t r) {
    row[c] = static_cast<const uint8_t*>(w.data.at({e, r, 0}));
    const uint8_t* codes = static_cast<const uint8_t*>(w.scale.at({e, r, 0}));
    float* s = scale_buffer + c * blocks;
    scales[c] = s;
    for (int64_t b = 0; b < blocks; b += 16) {
      const __mmask16 mask = avx512::tail_mask(blocks - b);
      _mm512_mask_storeu_ps(s + b, mask,
                            coding == WeightCoding::kNvfp4 ? decode_e4m3x16(codes + b, mask)
                                                           : decode_e8m0x16(codes + b, mask));
    }
  }
  __m512 load(int c, int64_t i, __mmask16) const {
    const __m512i bytes = _mm512_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row[c] + i / 2)));
    // Lane 2j takes byte j (the permute reads its low nibble), lane 2j + 1 byte j >> 4.
    const __m512i nibbles =
        _mm512_permutex2var_epi32(bytes, interleave, _mm512_srli_epi32(bytes, 4));
    const __m512 table = _mm512_mul_ps(e2m1_values, _mm512_set1_ps(scales[c][i >> shift]));
    return _mm512_permutexvar_ps(nibbles, table);
  }

  WeightCoding coding;
  int64_t blocks;  // block scales per row
  int shift;       // log2 of the group size
  float* scale_buffer;
  const uint8_t* row[kMaxChannels] = {};
  const float* scales[kMaxChannels] = {};
  const __m512 e2m1_values = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f,
                                            -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
  const __m512i interleave =
      _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
};

// The C weight rows are C streams the hardware prefetcher alone keeps too shallow: when element
// k starts a cache line, fetch the line kPrefetchBytes further on in each row.
template <int C, int kHalfBytes, class T>
inline void prefetch_ahead(const T* const (&rows)[kMaxChannels], int64_t k) {
  const int64_t byte = k * kHalfBytes / 2;
  if ((byte & 63) != 0) return;
  for (int c = 0; c < C; ++c)
    _mm_prefetch(reinterpret_cast<const char*>(rows[c]) + byte + kPrefetchBytes, _MM_HINT_T0);
}

// Canonical fp32 dots of R activation rows × C streamed weight rows over K range [k0, k0 + len).
template <class Stream>
struct FloatDots {
  Stream stream;
  const float* a;
  int64_t lda;

  template <int R, int C>
  void run(int64_t r0, int64_t k0, int64_t len, float (&part)[R][C]) const {
    __m512 acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    const float* rows = a + r0 * lda + k0;
    auto step = [&](int64_t i, __mmask16 mask) __attribute__((always_inline)) {
      __m512 wv[C];
      for (int c = 0; c < C; ++c) wv[c] = stream.load(c, k0 + i, mask);
      for (int r = 0; r < R; ++r) {
        const __m512 av = _mm512_maskz_loadu_ps(mask, rows + r * lda + i);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_add_ps(acc[r][c], _mm512_mul_ps(av, wv[c]));
      }
    };
    // Whole vectors with a constant mask (plain loads), then the masked tail.
    int64_t i = 0;
    for (; i + 16 <= len; i += 16) {
      prefetch_ahead<C, Stream::kHalfBytes>(stream.row, k0 + i);
      step(i, static_cast<__mmask16>(0xffff));
    }
    if (i < len) step(i, avx512::tail_mask(len - i));
    for (int r = 0; r < R; ++r) {
      if constexpr (C == 4)
        avx512::fold4(acc[r][0], acc[r][1], acc[r][2], acc[r][3], part[r]);
      else
        for (int c = 0; c < C; ++c) part[r][c] = avx512::fold(acc[r][c]);
    }
  }
};

// Exact int32 dots of int8 codes: activations pre-packed to int16 rows (zero-padded), weights
// sign-extended, pairs multiplied and added by vpmaddwd. Integer sums are order-free.
struct IntDots {
  Int8AsFloatStream stream;  // only its row pointers
  const int16_t* a;
  int64_t lda;

  template <int R, int C>
  void run(int64_t r0, int64_t k0, int64_t len, float (&part)[R][C]) const {
    __m512i acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_si512();
    const int16_t* rows = a + r0 * lda + k0;
    for (int64_t i = 0; i < len; i += 32) {
      prefetch_ahead<C, Int8AsFloatStream::kHalfBytes>(stream.row, k0 + i);
      const __mmask32 mask =
          len - i >= 32 ? ~static_cast<__mmask32>(0) : (static_cast<__mmask32>(1) << (len - i)) - 1;
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

// One call's operands and the tile walk shared by every coding.
struct Call {
  const ActivationCodes& a;
  int64_t m;
  const WeightOperand& w;
  int64_t e, n0, n;
  float* out;
  int64_t ldo;
  int64_t nb, kb;
  float* w_scales;  // Buffers::w_scales
};

// R rows from r0 × C channels from c0 (nc of them real): per K block, the dots, then
// · sa[r, b] · sw[c, b] added in block order, then · alpha.
template <int R, int C, class Dots>
void tile(const Call& call, const Dots& dots, int64_t r0, int64_t c0, int nc,
          const float* w_scales) {
  const ActivationCodes& a = call.a;
  float total[R][C] = {};
  for (int64_t b = 0; b < call.nb; ++b) {
    const int64_t k0 = b * call.kb, len = std::min(call.kb, call.w.k - k0);
    float part[R][C];
    dots.template run<R, C>(r0, k0, len, part);
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < C; ++c) {
        float p = part[r][c];
        if (a.scales != nullptr)
          p *= a.scales[(r0 + r) * a.scales_per_row + (a.scales_per_row == 1 ? 0 : b)];
        p *= w_scales[c * call.nb + b];
        total[r][c] = b == 0 ? p : total[r][c] + p;
      }
    }
  }
  const bool has_alpha = call.w.alpha.data != nullptr;
  const float alpha = has_alpha ? call.w.alpha.ptr<float>()[call.e * call.w.alpha.strides[0]] : 1.0f;
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < nc; ++c)
      call.out[(r0 + r) * call.ldo + c0 + c] = has_alpha ? total[r][c] * alpha : total[r][c];
}

template <int C, class Dots>
void row_tile(const Call& call, const Dots& dots, int64_t r0, int rows, int64_t c0, int nc,
              const float* w_scales) {
  switch (rows) {
    case 1: return tile<1, C>(call, dots, r0, c0, nc, w_scales);
    case 2: return tile<2, C>(call, dots, r0, c0, nc, w_scales);
    case 3: return tile<3, C>(call, dots, r0, c0, nc, w_scales);
    case 4: return tile<4, C>(call, dots, r0, c0, nc, w_scales);
  }
  if constexpr (C <= 2) {
    switch (rows) {
      case 5: return tile<5, C>(call, dots, r0, c0, nc, w_scales);
      case 6: return tile<6, C>(call, dots, r0, c0, nc, w_scales);
      case 7: return tile<7, C>(call, dots, r0, c0, nc, w_scales);
      case 8: return tile<8, C>(call, dots, r0, c0, nc, w_scales);
    }
  }
  MOECORE_INTERNAL_CHECK(false, "row tile of ", rows, " rows");
}

// Tiles of C channels (the last one padded by repeating its final row, results dropped) × row
// tiles; accumulators R·C ≤ 16 so they, C weight vectors and the constants stay in registers.
template <int C, class Dots>
void walk(const Call& call, Dots& dots) {
  constexpr int kRows = C == 4 ? 4 : 8;
  float* w_scales = call.w_scales;
  for (int64_t c0 = 0; c0 < call.n; c0 += C) {
    const int nc = static_cast<int>(std::min<int64_t>(C, call.n - c0));
    for (int c = 0; c < C; ++c) {
      const int64_t row = call.n0 + c0 + std::min(c, nc - 1);
      dots.stream.bind(c, call.w, call.e, row);
      weight_row_scales(call.w, call.e, row, w_scales + c * call.nb);
    }
    for (int64_t r0 = 0; r0 < call.m; r0 += kRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kRows, call.m - r0));
      row_tile<C>(call, dots, r0, rows, c0, nc, w_scales);
    }
  }
}

// Few rows (decode): 4 channels in flight, each weight vector used by ≤ 4 rows. More rows: 2
// channels × 8 rows. Either way each output's arithmetic is the same, so results never depend on M.
template <class Dots>
void walk_tiles(const Call& call, Dots& dots) {
  if (call.m <= 4)
    walk<4>(call, dots);
  else
    walk<2>(call, dots);
}

template <class Stream>
void run_float(const Call& call, Stream stream) {
  FloatDots<Stream> dots{stream, call.a.codes, call.a.ld};
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
      const float* src = call.a.codes + (r0 + r) * call.a.ld;
      for (int64_t i = 0; i < ld; i += 16) {
        const __mmask16 mask = avx512::tail_mask(std::max<int64_t>(k - i, 0));
        const __m512i v = _mm512_cvttps_epi32(_mm512_maskz_loadu_ps(mask, src + i));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(a16 + r * ld + i), _mm512_cvtepi32_epi16(v));
      }
    }
    std::memset(a16 + rows * ld, 0, 32 * sizeof(int16_t));
    const ActivationCodes chunk = activation_rows_from(call.a, r0);
    const Call part{
        chunk,    rows,    call.w,  call.e,       call.n0, call.n, call.out + r0 * call.ldo,
        call.ldo, call.nb, call.kb, call.w_scales};
    IntDots dots{Int8AsFloatStream{}, a16, ld};
    walk_tiles(part, dots);
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
  MOECORE_INTERNAL_CHECK(a.scales == nullptr || a.scales_per_row == 1 || a.scales_per_row == nb,
                         "activation scales per row (", a.scales_per_row,
                         ") must be 1 or the weight's K blocks (", nb, ")");
  ScratchCarver carver(gemm_scratch_memory(a, scaled_gemm_avx512_scratch_bytes(w)));
  const Buffers buffers(carver, w);
  const Call call{a, m, w, e, n0, n, out, ldo, nb, kb, buffers.w_scales};
  switch (w.coding) {
    case WeightCoding::kDense:
      switch (w.data.dtype) {
        case DType::kBF16: return run_float(call, DenseStream<DType::kBF16>{});
        case DType::kF16: return run_float(call, DenseStream<DType::kF16>{});
        default: return run_float(call, DenseStream<DType::kF32>{});
      }
    case WeightCoding::kFp8:
      return run_float(call, Fp8Stream{});
    case WeightCoding::kInt8:
      if (!a.integer) return run_float(call, Int8AsFloatStream{});
      return run_int8_codes(call, buffers.a16);
    case WeightCoding::kNvfp4:
    case WeightCoding::kMxfp4:
      MOECORE_INTERNAL_CHECK(w.k % fp4_group_size(w.coding) == 0, "fp4 K (", w.k,
                             ") must be a multiple of its scale group");
      return run_float(call, Fp4Stream(w.coding, w.k, buffers.fp4_scales));
  }
  MOECORE_INTERNAL_CHECK(false, "unknown weight coding");
}

}  // namespace moecore
