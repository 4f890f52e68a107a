// AVX2 row of the activation-quantizer table (built with AVX2 flags; reach it only through
// act_quant_kernels()). The AVX-512 row's lane arithmetic on 8 lanes, bitwise equal to the
// reference row for every input: the scalar rule's fp32 operations in its order, exact rounding
// to each code's value, tails through vmaskmovps (masked lanes are neither read nor written, and
// never fault), amax as an integer max of the magnitudes' bits (amax_row for a segment holding a
// NaN), NVFP4 block scales per block with formats' scalar codec.
#include <immintrin.h>

#include <algorithm>

#include "moecore/formats/fp4.h"
#include "moecore/formats/fp8.h"
#include "moecore/formats/quantize.h"
#include "moecore/kernels/act_quant.h"

namespace moecore {
namespace {

inline __m256i bits(__m256 v) { return _mm256_castps_si256(v); }
inline __m256 floats(__m256i v) { return _mm256_castsi256_ps(v); }
inline __m256 abs_ps(__m256 v) {
  return floats(_mm256_and_si256(bits(v), _mm256_set1_epi32(0x7fffffff)));
}
inline __m256i sign_of(__m256 v) {
  return _mm256_and_si256(bits(v), _mm256_set1_epi32(static_cast<int>(0x80000000u)));
}
// Lanes [0, min(left, 8)) set, as vmaskmovps masks.
inline __m256i tail_mask(int64_t left) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(left, 8))),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Applies f to every 8-lane step of x[0, n) in place; the tail is a masked load and store.
template <typename F>
inline void map_in_place(float* x, int64_t n, const F& f) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, f(_mm256_loadu_ps(x + i)));
  if (i < n) {
    const __m256i m = tail_mask(n - i);
    _mm256_maskstore_ps(x + i, m, f(_mm256_maskload_ps(x + i, m)));
  }
}

// Integer maxima of the magnitudes' bits, a segment with a NaN to amax_row (see the AVX-512 row).
constexpr uint32_t kInfBits = 0x7f800000u;
inline __m256i magnitude(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi32(0x7fffffff)); }
inline uint32_t reduce_max(__m256i v) {
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(1, 0, 3, 2)));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(2, 3, 0, 1)));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(m));
}
inline __m256i load8(const float* x) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
}

float amax(const float* x, int64_t n) {
  __m256i m0 = _mm256_setzero_si256(), m1 = m0, m2 = m0, m3 = m0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    m0 = _mm256_max_epu32(magnitude(load8(x + i)), m0);
    m1 = _mm256_max_epu32(magnitude(load8(x + i + 8)), m1);
    m2 = _mm256_max_epu32(magnitude(load8(x + i + 16)), m2);
    m3 = _mm256_max_epu32(magnitude(load8(x + i + 24)), m3);
  }
  for (; i < n; i += 8)  // masked lanes load +0
    m0 = _mm256_max_epu32(magnitude(bits(_mm256_maskload_ps(x + i, tail_mask(n - i)))), m0);
  const uint32_t top =
      reduce_max(_mm256_max_epu32(_mm256_max_epu32(m0, m1), _mm256_max_epu32(m2, m3)));
  return top > kInfBits ? amax_row(x, n) : bits_float(top);
}

// The fp32 value of e4m3_rne(fmaxf(fminf(t, 448), −448)) (see the AVX-512 row).
inline __m256 fp8_value(__m256 t) {
  const __m256 c =
      _mm256_max_ps(_mm256_min_ps(t, _mm256_set1_ps(kFp8E4M3Max)), _mm256_set1_ps(-kFp8E4M3Max));
  const __m256 a = abs_ps(c);
  const __m256i u = bits(a);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 20), _mm256_set1_epi32(1));
  const __m256i normal =
      _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7ffff), lsb)),
                       _mm256_set1_epi32(static_cast<int>(0xfff00000u)));
  const __m256 big = _mm256_set1_ps(16384.0f);
  const __m256 sub = _mm256_sub_ps(_mm256_add_ps(a, big), big);
  const __m256 tiny = _mm256_cmp_ps(a, _mm256_set1_ps(0x1p-6f), _CMP_LT_OQ);
  const __m256 mag = _mm256_blendv_ps(floats(normal), sub, tiny);
  return floats(_mm256_or_si256(bits(mag), sign_of(c)));
}

void fp8_mul(float* x, int64_t n, float inv) {
  const __m256 v = _mm256_set1_ps(inv);
  map_in_place(x, n, [v](__m256 a) { return fp8_value(_mm256_mul_ps(a, v)); });
}

void fp8_div(float* x, int64_t n, float s) {
  const __m256 v = _mm256_set1_ps(s);
  map_in_place(x, n, [v](__m256 a) { return fp8_value(_mm256_div_ps(a, v)); });
}

void int8(float* x, int64_t n, float amax) {
  const __m256 mul = _mm256_set1_ps(127.0f / amax);  // int8_quantize_row's fp32(127 / a)
  map_in_place(x, n, [mul](__m256 v) {
    const __m256 t = _mm256_mul_ps(v, mul);
    const __m256 number = _mm256_cmp_ps(t, t, _CMP_ORD_Q);  // NaN → 0
    const __m256 a = _mm256_min_ps(abs_ps(t), _mm256_set1_ps(127.0f));
    const __m256 f = _mm256_round_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 up = _mm256_cmp_ps(_mm256_sub_ps(a, f), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 r = _mm256_add_ps(f, _mm256_and_ps(up, _mm256_set1_ps(1.0f)));
    const __m256 signed_r = floats(_mm256_or_si256(bits(r), sign_of(t)));
    return _mm256_and_ps(_mm256_add_ps(signed_r, _mm256_setzero_ps()), number);
  });
}

// The value of f32_to_e2m1_rne(t) (see the AVX-512 row): 8 magnitudes, one permute.
inline __m256 e2m1_value(__m256 t) {
  const __m256 a = abs_ps(t);
  __m256i idx = _mm256_setzero_si256();
  auto count = [&](float bound, int predicate) {  // a true compare is −1: subtracting adds 1
    idx = _mm256_sub_epi32(idx, bits(_mm256_cmp_ps(a, _mm256_set1_ps(bound), predicate)));
  };
  count(0.25f, _CMP_GT_OQ);
  count(0.75f, _CMP_GE_OQ);
  count(1.25f, _CMP_GT_OQ);
  count(1.75f, _CMP_GE_OQ);
  count(2.5f, _CMP_GT_OQ);
  count(3.5f, _CMP_GE_OQ);
  count(5.0f, _CMP_GT_OQ);
  const __m256i nan = bits(_mm256_cmp_ps(t, t, _CMP_UNORD_Q));
  idx = _mm256_or_si256(idx, _mm256_and_si256(nan, _mm256_set1_epi32(7)));
  const __m256 table = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
  const __m256 mag = _mm256_permutevar8x32_ps(table, idx);
  return floats(_mm256_or_si256(bits(mag), _mm256_andnot_si256(nan, sign_of(t))));
}

void nvfp4(float* x, int64_t n, float global_scale) {
  const float inv6 = 1.0f / kE2M1Max;  // nvfp4_quantize_row's fp32 reciprocals and order
  const float inv_gs = 1.0f / global_scale;
  const __m256 lo = _mm256_set1_ps(-kE2M1Max), hi = _mm256_set1_ps(kE2M1Max);
  for (int64_t b = 0; b + kNvfp4BlockSize <= n; b += kNvfp4BlockSize) {
    const __m256 v0 = _mm256_loadu_ps(x + b), v1 = _mm256_loadu_ps(x + b + 8);
    const uint32_t top = reduce_max(_mm256_max_epu32(magnitude(bits(v0)), magnitude(bits(v1))));
    const float vmax = top > kInfBits ? amax_row(x + b, kNvfp4BlockSize) : bits_float(top);
    const float s = std::min(global_scale * (vmax * inv6), kFp8E4M3Max);
    const float s8 = fp8_e4m3_to_f32(f32_to_fp8_e4m3(s));
    const float inv = s8 != 0.0f ? 1.0f / (s8 * inv_gs) : 0.0f;
    const __m256 vinv = _mm256_set1_ps(inv), vs8 = _mm256_set1_ps(s8);
    auto code_values = [&](__m256 v) {
      const __m256 t = _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_mul_ps(v, vinv)));
      return _mm256_mul_ps(e2m1_value(t), vs8);
    };
    _mm256_storeu_ps(x + b, code_values(v0));
    _mm256_storeu_ps(x + b + 8, code_values(v1));
  }
}

}  // namespace

const ActQuantKernels kActQuantAvx2 = {amax, fp8_mul, fp8_div, int8, nvfp4};

}  // namespace moecore
