// Operands of the avx512_bf16 and amx rows of the scaled GEMM (included only by kernels/x86 files
// built with AVX512-BF16 flags or more): which operands they take, and rows of codes in a padded
// K layout, where each K block of the weight's scale grid is padded with zeros to whole 64-byte
// steps, so a step never straddles two blocks and padding adds exact zeros. Codes are bf16 (the
// activation rows of bf16-exact operands) or int8 (exact integer codes for the int8 × int8 dot).
#pragma once

#include <immintrin.h>

// GCC 12 reports the _mm512_undefined_* pass-through of unmasked intrinsics as (maybe-)
// uninitialized once they are inlined (GCC bug 105593, fixed in 12.3); nothing is uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "moecore/core/error.h"
#include "moecore/kernels/quant_gemm.h"
#include "moecore/kernels/x86/avx512_lanes.h"

namespace moecore {
namespace {  // internal linkage: each ISA file keeps its own copy, compiled with its own flags

constexpr int64_t kStepBytes = 64;

enum class CodeType { kBf16, kInt8 };

inline int64_t code_bytes(CodeType type) { return type == CodeType::kInt8 ? 1 : 2; }

/// Which operands may multiply in bf16 (decided by dtype and coding, never by values): the
/// activation codes are bf16 values and the weights decode exactly to bf16 (every coding but
/// f32/f16 dense weights).
inline bool bf16_operands(const ActivationCodes& a, const WeightOperand& w) {
  return a.bf16_exact && (w.coding != WeightCoding::kDense || w.data.dtype == DType::kBF16);
}

/// int8 codes on both sides: the dot is exact in int32 (as in scaled_gemm_ref).
inline bool integer_operands(const ActivationCodes& a, const WeightOperand& w) {
  return a.integer && w.coding == WeightCoding::kInt8;
}

/// int8 × int8 calls of fewer rows take the avx512_bf16 row, which streams the int8 weights as
/// they are stored: the AMX row repacks every weight row of a call into tiles, which pays off only
/// over enough rows (decode calls have one or a few). The dots are exact on every row, so the
/// choice never changes a bit.
constexpr int64_t kPackedIntegerMinRows = 16;

/// `bytes` (whole 64-byte lines) plus one line when they are an even number of lines: the distance
/// between rows that share working memory. With an odd number of lines between them, consecutive
/// rows start in different L1 sets; rows a multiple of 4 KiB apart (K = 2048 in bf16) all map to
/// the same sets, so a tile's 8 activation rows evicted each other (one Zen 4 core: 8 × 1536 ×
/// 2048 bf16 calls 0.67 ms with rows 4 KiB apart, 0.49 ms with one line more).
inline int64_t odd_lines(int64_t bytes) {
  return bytes / kStepBytes % 2 == 0 ? bytes + kStepBytes : bytes;
}

/// The padded K layout of one row of codes, fixed when it is made. The steps of a whole block and
/// the row stride are worked out then, once: every tile reads them, and derived per tile they took
/// two integer divisions on the way to its first activation load.
struct PaddedK {
  const int64_t k, block_k, num_blocks, step_codes;
  const int64_t whole_block_steps;  // block_steps(0)
  const int64_t stride;             // row_stride()

  PaddedK(const WeightOperand& w, CodeType type)
      : k(w.k), block_k(w.k_block()), num_blocks(w.num_k_blocks()),
        step_codes(kStepBytes / code_bytes(type)), whole_block_steps(block_steps(0)),
        stride(odd_lines(row_bytes())) {}

  int64_t block_len(int64_t b) const { return std::min(block_k, k - b * block_k); }
  int64_t block_steps(int64_t b) const { return (block_len(b) + step_codes - 1) / step_codes; }
  /// First step of block b (every block but the last has block_k codes).
  int64_t block_first_step(int64_t b) const { return b * whole_block_steps; }
  int64_t steps() const { return block_first_step(num_blocks - 1) + block_steps(num_blocks - 1); }
  int64_t row_bytes() const { return steps() * kStepBytes; }
  /// From one row to the next in working memory (odd_lines).
  int64_t row_stride() const { return stride; }
};

/// Writes n fp32 codes as `type` codes (bf16 round to nearest even: exact for bf16 values).
inline void store_codes(const float* src, int64_t n, CodeType type, uint8_t* dst) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = avx512::tail_mask(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(mask, src + i);
    switch (type) {
      case CodeType::kBf16:
        _mm256_mask_storeu_epi16(dst + 2 * i, mask, (__m256i)_mm512_cvtneps_pbh(v));
        break;
      case CodeType::kInt8:
        _mm512_mask_cvtsepi32_storeu_epi8(dst + i, mask, _mm512_cvtps_epi32(v));
        break;
    }
  }
}

/// Paired order, for weight streams that decode two steps at a time (bf16_streams.h,
/// kPairedSteps): each group of 64 bf16 codes of a K block, but a block's last group when it holds
/// 32 codes or fewer (one step), is stored as two steps whose word 8i + j holds element
/// 16i + 8v + j of the group (v the step, i < 4, j < 8).
inline bool paired_group(int64_t block_len, int64_t group) { return block_len - 64 * group > 32; }

/// The group of 64 bf16 codes at `codes`, from element order into paired order.
inline void pair_codes(uint8_t* codes) {
  // Words of the group: elements 0-7, 16-23, 32-39, 48-55 (first), each + 8 (second).
  const __m512i first = _mm512_setr_epi32(0x10000, 0x30002, 0x50004, 0x70006,
                                          0x110010, 0x130012, 0x150014, 0x170016,
                                          0x210020, 0x230022, 0x250024, 0x270026,
                                          0x310030, 0x330032, 0x350034, 0x370036);
  const __m512i second = _mm512_add_epi16(first, _mm512_set1_epi16(8));
  const __m512i lo = _mm512_loadu_si512(codes), hi = _mm512_loadu_si512(codes + kStepBytes);
  _mm512_storeu_si512(codes, _mm512_permutex2var_epi16(lo, first, hi));
  _mm512_storeu_si512(codes + kStepBytes, _mm512_permutex2var_epi16(lo, second, hi));
}

/// One row of K fp32 codes into the padded layout (row_bytes() bytes at dst); bf16 codes in
/// paired order when `paired`.
inline void pack_codes_row(const float* src, const PaddedK& pk, CodeType type, uint8_t* dst,
                           bool paired = false) {
  MOECORE_INTERNAL_CHECK(!paired || type == CodeType::kBf16, "paired order is for bf16 codes");
  std::memset(dst, 0, static_cast<size_t>(pk.row_bytes()));
  for (int64_t b = 0; b < pk.num_blocks; ++b) {
    uint8_t* block = dst + pk.block_first_step(b) * kStepBytes;
    store_codes(src + b * pk.block_k, pk.block_len(b), type, block);
    for (int64_t g = 0; paired && paired_group(pk.block_len(b), g); ++g)
      pair_codes(block + 2 * kStepBytes * g);
  }
}

/// Row `row` of expert e's int8 weights (kInt8 coding) into the padded int8 layout, straight from
/// the stored bytes, plus its num_blocks scales.
inline void pack_int8_weight_row(const WeightOperand& w, int64_t e, int64_t row, const PaddedK& pk,
                                 uint8_t* dst, float* scales) {
  MOECORE_INTERNAL_CHECK(w.coding == WeightCoding::kInt8, "int8 weights only");
  weight_row_scales(w, e, row, scales);
  const int8_t* codes = static_cast<const int8_t*>(w.data.at({e, row, 0}));
  std::memset(dst, 0, static_cast<size_t>(pk.row_bytes()));
  for (int64_t b = 0; b < pk.num_blocks; ++b) {
    const int8_t* src = codes + b * pk.block_k;
    uint8_t* out = dst + pk.block_first_step(b) * kStepBytes;
    const int64_t len = pk.block_len(b);
    for (int64_t i = 0; i < len; i += 32) {
      const __mmask32 mask = avx512::tail_mask32(len - i);
      _mm256_mask_storeu_epi8(out + i, mask, _mm256_maskz_loadu_epi8(mask, src + i));
    }
  }
}

/// The per-expert post scale (1 when the operand has none).
inline float expert_alpha(const WeightOperand& w, int64_t e) {
  return w.alpha.data != nullptr ? w.alpha.ptr<float>()[e * w.alpha.strides[0]] : 1.0f;
}

}  // namespace
}  // namespace moecore
