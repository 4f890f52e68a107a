// AVX-512 row of the activation table (built with AVX-512 flags; reach it only through
// activation_kernel()): activation_rows.h over 16 fp32 lanes, σ's exp in two halves of 8 doubles.
#include "moecore/kernels/exp_f32.h"
#include "moecore/kernels/x86/activation_rows.h"
#include "moecore/kernels/x86/avx512_lanes.h"

namespace moecore {
namespace {

// exp_in_double's lane type: 8 doubles.
struct Doubles {
  using D = __m512d;
  static D min(D a, D b) { return _mm512_min_pd(a, b); }
  static D max(D a, D b) { return _mm512_max_pd(a, b); }
  static D mul(D a, D b) { return _mm512_mul_pd(a, b); }
  static D add(D a, D b) { return _mm512_add_pd(a, b); }
  static D sub(D a, D b) { return _mm512_sub_pd(a, b); }
  static D set(double c) { return _mm512_set1_pd(c); }
  static D pow2(D shifted) {
    const __m512i biased = _mm512_add_epi64(_mm512_castpd_si512(shifted),
                                           _mm512_set1_epi64(exp_f32_constants::kExponentBias));
    return _mm512_castsi512_pd(_mm512_slli_epi64(biased, 52));  // n + 1023: the exponent
  }
};

struct Lanes {
  using F = __m512;
  static constexpr int64_t kWidth = 16;

  static F load(const float* p, int64_t n) {
    return n == kWidth ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(avx512::tail_mask(n), p);
  }
  static void store(float* p, F v, int64_t n) {
    if (n == kWidth)
      _mm512_storeu_ps(p, v);
    else
      _mm512_mask_storeu_ps(p, avx512::tail_mask(n), v);
  }
  static void load_pairs(const float* p, int64_t n, F& even, F& odd) {
    const F a = load(p, std::min<int64_t>(2 * n, kWidth));
    const F b = load(p + kWidth, std::max<int64_t>(2 * n - kWidth, 0));
    const __m512i evens =
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    even = _mm512_permutex2var_ps(a, evens, b);
    odd = _mm512_permutex2var_ps(a, _mm512_add_epi32(evens, _mm512_set1_epi32(1)), b);
  }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F min(F a, F b) { return _mm512_min_ps(a, b); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F neg(F v) {
    return _mm512_castsi512_ps(
        _mm512_xor_si512(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN)));
  }
  static F exp(F x) {
    const __m256 lo = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 0));
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
    const __m256 e_lo = _mm512_cvtpd_ps(exp_in_double<Doubles>(_mm512_cvtps_pd(lo)));
    const __m256 e_hi = _mm512_cvtpd_ps(exp_in_double<Doubles>(_mm512_cvtps_pd(hi)));
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(e_lo)),
                                               _mm256_castps_pd(e_hi), 1));
  }
  static F round(DType dtype, F v) {
    if (dtype == DType::kF16)
      return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (dtype != DType::kBF16) return v;
    // f32_to_bf16's rule: round to nearest even on the top 16 bits; a NaN keeps its top bits,
    // quieted.
    const __m512i u = _mm512_castps_si512(v);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
    const __m512i top = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
    const __m512i quiet = _mm512_or_si512(_mm512_and_si512(u, top), _mm512_set1_epi32(0x400000));
    return _mm512_castsi512_ps(
        _mm512_mask_mov_epi32(_mm512_and_si512(rounded, top), nan, quiet));
  }
};

}  // namespace

void apply_activation_block_avx512(const ActivationSpec& spec, const float* in, int64_t ldin,
                                   float* out, int64_t ldout, int64_t rows, int64_t inter,
                                   int64_t col0, int64_t cols) {
  activation_rows::apply_block<Lanes>(spec, in, ldin, out, ldout, rows, inter, col0, cols);
}

}  // namespace moecore
