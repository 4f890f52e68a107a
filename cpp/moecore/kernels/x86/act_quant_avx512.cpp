// AVX-512 row of the activation-quantizer table (built with AVX-512 flags; reach it only through
// act_quant_kernels()). Bitwise equal to the reference row for every input: each lane does the
// scalar rule's fp32 operations in its order (one multiply or divide, the clamp with fminf/fmaxf
// or std::min/max NaN semantics, then exact rounding to the code's value), tails are masked
// loads and stores (nothing outside x[0, n) is touched), amax is an integer max of the magnitudes'
// bits (a segment holding a NaN takes amax_row itself), and NVFP4 block scales are computed per
// block with formats' scalar codec.
#include <algorithm>

#include "moecore/formats/fp4.h"
#include "moecore/formats/fp8.h"
#include "moecore/formats/quantize.h"
#include "moecore/kernels/act_quant.h"
#include "moecore/kernels/x86/avx512_lanes.h"

namespace moecore {
namespace {

using avx512::tail_mask;

inline __m512i bits(__m512 v) { return _mm512_castps_si512(v); }
inline __m512 floats(__m512i v) { return _mm512_castsi512_ps(v); }
inline __m512i sign_of(__m512 v) {
  return _mm512_and_si512(bits(v), _mm512_set1_epi32(static_cast<int>(0x80000000u)));
}

// Applies f to every 16-lane step of x[0, n) in place; the tail is a masked load and store.
template <typename F>
inline void map_in_place(float* x, int64_t n, const F& f) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, f(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(x + i, m, f(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

// Integer maxima of the magnitudes' bits order numbers as their values do and put any NaN (bits
// above +inf's) on top, so a segment with a NaN is seen for free. amax_row itself takes such a
// segment: it ignores quiet NaNs, but glibc's fmaxf turns a signalling one into NaN, which restarts
// the running max (CUDA's fmaxf ignores both), and the rows give the reference's bits.
constexpr uint32_t kInfBits = 0x7f800000u;
inline __m512i magnitude(__m512i v) { return _mm512_and_si512(v, _mm512_set1_epi32(0x7fffffff)); }

float amax(const float* x, int64_t n) {
  __m512i m0 = _mm512_setzero_si512(), m1 = m0, m2 = m0, m3 = m0;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    m0 = _mm512_max_epu32(magnitude(_mm512_loadu_si512(x + i)), m0);
    m1 = _mm512_max_epu32(magnitude(_mm512_loadu_si512(x + i + 16)), m1);
    m2 = _mm512_max_epu32(magnitude(_mm512_loadu_si512(x + i + 32)), m2);
    m3 = _mm512_max_epu32(magnitude(_mm512_loadu_si512(x + i + 48)), m3);
  }
  for (; i < n; i += 16)  // masked lanes load +0
    m0 = _mm512_max_epu32(magnitude(_mm512_maskz_loadu_epi32(tail_mask(n - i), x + i)), m0);
  const uint32_t top =
      _mm512_reduce_max_epu32(_mm512_max_epu32(_mm512_max_epu32(m0, m1), _mm512_max_epu32(m2, m3)));
  return top > kInfBits ? amax_row(x, n) : bits_float(top);
}

// The fp32 value of e4m3_rne(fmaxf(fminf(t, 448), −448)): f32_to_fp8_e4m3 then its decode.
inline __m512 fp8_value(__m512 t) {
  // min_ps(t, 448) is 448 for a NaN t (fminf); max_ps then sees no NaN.
  const __m512 c =
      _mm512_max_ps(_mm512_min_ps(t, _mm512_set1_ps(kFp8E4M3Max)), _mm512_set1_ps(-kFp8E4M3Max));
  const __m512 a = _mm512_abs_ps(c);
  // Normal results: the fp32 mantissa rounded to 3 bits, ties to even (a carry moves into the
  // exponent); |c| ≤ 448 never rounds past 448.
  const __m512i u = bits(a);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 20), _mm512_set1_epi32(1));
  const __m512i normal =
      _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7ffff), lsb)),
                       _mm512_set1_epi32(static_cast<int>(0xfff00000u)));
  // Subnormal results (|c| < 2^-6): multiples of 2^-9, rounded to even by the fp32 add to 2^14
  // (whose ulp is 2^-9); the subtraction is exact. 2^-6 itself is where the carry lands.
  const __m512 big = _mm512_set1_ps(16384.0f);
  const __m512 sub = _mm512_sub_ps(_mm512_add_ps(a, big), big);
  const __mmask16 tiny = _mm512_cmp_ps_mask(a, _mm512_set1_ps(0x1p-6f), _CMP_LT_OQ);
  const __m512i mag = _mm512_mask_blend_epi32(tiny, normal, bits(sub));
  return floats(_mm512_or_si512(mag, sign_of(c)));  // −0 for negatives that round to zero
}

void fp8_mul(float* x, int64_t n, float inv) {
  const __m512 v = _mm512_set1_ps(inv);
  map_in_place(x, n, [v](__m512 a) { return fp8_value(_mm512_mul_ps(a, v)); });
}

void fp8_div(float* x, int64_t n, float s) {
  const __m512 v = _mm512_set1_ps(s);
  map_in_place(x, n, [v](__m512 a) { return fp8_value(_mm512_div_ps(a, v)); });
}

void int8(float* x, int64_t n, float amax) {
  const __m512 mul = _mm512_set1_ps(127.0f / amax);  // int8_quantize_row's fp32(127 / a)
  map_in_place(x, n, [mul](__m512 v) {
    const __m512 t = _mm512_mul_ps(v, mul);
    const __mmask16 number = _mm512_cmp_ps_mask(t, t, _CMP_ORD_Q);  // NaN → 0
    // round half away from zero, then clamp to 127; clamping first changes nothing (126.5 and
    // above round to 127 either way) and keeps a − trunc(a) exact.
    const __m512 a = _mm512_min_ps(_mm512_abs_ps(t), _mm512_set1_ps(127.0f));
    const __m512 f = _mm512_roundscale_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __mmask16 up = _mm512_cmp_ps_mask(_mm512_sub_ps(a, f), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    const __m512 r = _mm512_mask_add_ps(f, up, f, _mm512_set1_ps(1.0f));
    // The sign back on; + 0 turns −0 into +0, as the int8 code 0 decodes.
    const __m512 signed_r = floats(_mm512_or_si512(bits(r), sign_of(t)));
    return _mm512_maskz_add_ps(number, signed_r, _mm512_setzero_ps());
  });
}

// The value of f32_to_e2m1_rne(t) for t = min(max(x · inv, −6), 6) or NaN: the index of the
// magnitude counts the bounds below |t| (ties to the even code: 0.25→0, 0.75→1, 1.25→1, 1.75→2,
// 2.5→2, 3.5→4, 5→4), negatives keep their sign (−0 included), NaN gives +6.
inline __m512 e2m1_value(__m512 t) {
  const __m512 a = _mm512_abs_ps(t);
  __m512i idx = _mm512_setzero_si512();
  const __m512i one = _mm512_set1_epi32(1);
  auto count = [&](float bound, int predicate) {
    const __mmask16 k = _mm512_cmp_ps_mask(a, _mm512_set1_ps(bound), predicate);
    idx = _mm512_mask_add_epi32(idx, k, idx, one);
  };
  count(0.25f, _CMP_GT_OQ);
  count(0.75f, _CMP_GE_OQ);
  count(1.25f, _CMP_GT_OQ);
  count(1.75f, _CMP_GE_OQ);
  count(2.5f, _CMP_GT_OQ);
  count(3.5f, _CMP_GE_OQ);
  count(5.0f, _CMP_GT_OQ);
  const __mmask16 nan = _mm512_cmp_ps_mask(t, t, _CMP_UNORD_Q);
  idx = _mm512_mask_mov_epi32(idx, nan, _mm512_set1_epi32(7));
  const __m512 table = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, 0.0f, 0.0f,
                                      0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f);
  const __m512 mag = _mm512_permutexvar_ps(idx, table);
  return floats(_mm512_or_si512(bits(mag), _mm512_maskz_mov_epi32(~nan, sign_of(t))));
}

void nvfp4(float* x, int64_t n, float global_scale) {
  // nvfp4_quantize_row's fp32 reciprocals and per-block order.
  const float inv6 = 1.0f / kE2M1Max;
  const float inv_gs = 1.0f / global_scale;
  const __m512 lo = _mm512_set1_ps(-kE2M1Max), hi = _mm512_set1_ps(kE2M1Max);
  for (int64_t b = 0; b + kNvfp4BlockSize <= n; b += kNvfp4BlockSize) {
    const __m512 v = _mm512_loadu_ps(x + b);
    const uint32_t top = _mm512_reduce_max_epu32(magnitude(bits(v)));  // amax_row, as amax()
    const float vmax = top > kInfBits ? amax_row(x + b, kNvfp4BlockSize) : bits_float(top);
    const float s = std::min(global_scale * (vmax * inv6), kFp8E4M3Max);
    const float s8 = fp8_e4m3_to_f32(f32_to_fp8_e4m3(s));
    const float inv = s8 != 0.0f ? 1.0f / (s8 * inv_gs) : 0.0f;
    // std::max(t, −6) and std::min(t, 6) keep a NaN t: max_ps/min_ps with the bound first.
    const __m512 t = _mm512_min_ps(hi, _mm512_max_ps(lo, _mm512_mul_ps(v, _mm512_set1_ps(inv))));
    _mm512_storeu_ps(x + b, _mm512_mul_ps(e2m1_value(t), _mm512_set1_ps(s8)));
  }
}

}  // namespace

const ActQuantKernels kActQuantAvx512 = {amax, fp8_mul, fp8_div, int8, nvfp4};

}  // namespace moecore
