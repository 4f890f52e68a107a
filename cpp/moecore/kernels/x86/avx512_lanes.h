// Shared pieces of the AVX-512 rows that keep the canonical order of kernels/gemm.h: tail masks,
// exact widening loads of dense weights and the pairwise lane fold. Include only from files
// compiled with the avx512 flag set.
#pragma once

#include <immintrin.h>

// GCC 12 reports the _mm512_undefined_* pass-through of unmasked intrinsics as (maybe-)
// uninitialized once they are inlined (GCC bug 105593, fixed in 12.3); nothing is uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <cstdint>

#include "moecore/core/dtype.h"

namespace moecore {
namespace avx512 {

/// Lanes [0, min(left, 16)) set.
inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1);
}

/// Lanes [0, min(left, 32)) set: the tail of a 32-element step.
inline __mmask32 tail_mask32(int64_t left) {
  return left >= 32 ? ~static_cast<__mmask32>(0) : (static_cast<__mmask32>(1) << left) - 1;
}

/// Bytes [0, min(left, 64)) set: the tail of a 64-byte step.
inline __mmask64 tail_mask64(int64_t left) {
  return left >= 64 ? ~static_cast<__mmask64>(0) : (static_cast<__mmask64>(1) << left) - 1;
}

/// Elements [i, i + 16) of a f32, f16 or bf16 row widened exactly to fp32 (masked lanes are +0).
inline __m512 load_dense16(const void* w, DType dtype, int64_t i, __mmask16 mask) {
  switch (dtype) {
    case DType::kBF16: {
      __m256i h = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(w) + i);
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    case DType::kF16: {
      __m256i h = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(w) + i);
      return _mm512_cvtph_ps(h);
    }
    default:
      return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(w) + i);
  }
}

/// The canonical fold of 16 lane sums: j += j+8, j += j+4, j += j+2, j += j+1.
inline float fold(__m512 v) {
  __m256 lo = _mm512_castps512_ps256(v);
  __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  __m256 s8 = _mm256_add_ps(lo, hi);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

/// The first level of fold() for two vectors at once (j += j+8): v0's 8 sums in the low 256 bits
/// of the result, v1's in the high.
inline __m512 fold2_to_octets(__m512 v0, __m512 v1) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(3, 2, 3, 2)));
}

/// The second level of fold() (j += j+4) for the octets of four vectors (fold2_to_octets: vectors
/// 0 and 1 in s01, 2 and 3 in s23): 128-bit chunk i of the result holds vector i's four sums.
inline __m512 quads_of_octets(__m512 s01, __m512 s23) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(3, 1, 3, 1)));
}

/// The last two levels of fold() inside each 128-bit chunk (j += j+2, then j += j+1): chunk i's
/// sum at out[i].
inline void fold_quads(__m512 quads, float* out) {
  const __m512 s2 = _mm512_add_ps(quads, _mm512_shuffle_ps(quads, quads, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512 s1 = _mm512_add_ps(s2, _mm512_shuffle_ps(s2, s2, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m512i firsts = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  _mm_storeu_ps(out, _mm512_castps512_ps128(_mm512_permutexvar_ps(firsts, s1)));
}

/// fold() of four vectors at once (the same pairwise adds, lanes of several vectors side by side).
inline void fold4(__m512 v0, __m512 v1, __m512 v2, __m512 v3, float* out) {
  fold_quads(quads_of_octets(fold2_to_octets(v0, v1), fold2_to_octets(v2, v3)), out);
}

}  // namespace avx512
}  // namespace moecore
