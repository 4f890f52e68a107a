// AVX-512 row of the GEMM table (built with AVX-512 flags; reach it only through gemm_kernels()).
// Same canonical order as gemm_ref.cpp: one zmm of 16 lane sums per output, mul then add (no
// FMA), masked tails (adding +0 to a lane that started at +0 never changes it), pairwise fold.
#include <immintrin.h>

#include "moecore/kernels/gemm.h"

namespace moecore {
namespace {

inline __m512 load_w16(const void* w, DType dtype, int64_t i, __mmask16 mask) {
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

inline float fold(__m512 v) {
  __m256 lo = _mm512_castps512_ps256(v);
  __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  __m256 s8 = _mm256_add_ps(lo, hi);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

constexpr int kRowBlock = 4;

}  // namespace

void gemm_rows_times_wt_avx512(const float* a, int64_t m, int64_t lda, const void* w,
                               DType w_dtype, int64_t ldw, int64_t n, int64_t k, float* out,
                               int64_t ldo) {
  const int64_t elem = dtype_size(w_dtype);
  for (int64_t c = 0; c < n; ++c) {
    const void* wc = static_cast<const char*>(w) + c * ldw * elem;
    for (int64_t r0 = 0; r0 < m; r0 += kRowBlock) {
      const int rows = static_cast<int>(m - r0 < kRowBlock ? m - r0 : kRowBlock);
      __m512 acc[kRowBlock];
      for (int r = 0; r < kRowBlock; ++r) acc[r] = _mm512_setzero_ps();
      for (int64_t i = 0; i < k; i += 16) {
        const __mmask16 mask =
            k - i >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (k - i)) - 1);
        const __m512 wv = load_w16(wc, w_dtype, i, mask);
        for (int r = 0; r < rows; ++r) {
          const __m512 av = _mm512_maskz_loadu_ps(mask, a + (r0 + r) * lda + i);
          acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(av, wv));
        }
      }
      for (int r = 0; r < rows; ++r) out[(r0 + r) * ldo + c] = fold(acc[r]);
    }
  }
}

}  // namespace moecore
