// AVX2 row of the activation table (built with AVX2, FMA and F16C flags; reach it only through
// activation_kernel()): activation_rows.h over 8 fp32 lanes, σ's exp in two halves of 4 doubles,
// tails through vmaskmovps (masked lanes are neither read nor written).
#include <immintrin.h>

#include "moecore/kernels/exp_f32.h"
#include "moecore/kernels/x86/activation_rows.h"

namespace moecore {
namespace {

// exp_in_double's lane type: 4 doubles.
struct Doubles {
  using D = __m256d;
  static D min(D a, D b) { return _mm256_min_pd(a, b); }
  static D max(D a, D b) { return _mm256_max_pd(a, b); }
  static D mul(D a, D b) { return _mm256_mul_pd(a, b); }
  static D add(D a, D b) { return _mm256_add_pd(a, b); }
  static D sub(D a, D b) { return _mm256_sub_pd(a, b); }
  static D set(double c) { return _mm256_set1_pd(c); }
  static D pow2(D shifted) {
    const __m256i biased = _mm256_add_epi64(_mm256_castpd_si256(shifted),
                                           _mm256_set1_epi64x(exp_f32_constants::kExponentBias));
    return _mm256_castsi256_pd(_mm256_slli_epi64(biased, 52));  // n + 1023: the exponent
  }
};

// Lanes [0, n) set, as vmaskmovps masks.
__m256i tail_mask(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

struct Lanes {
  using F = __m256;
  static constexpr int64_t kWidth = 8;

  static F load(const float* p, int64_t n) {
    return n == kWidth ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, tail_mask(n));
  }
  static void store(float* p, F v, int64_t n) {
    if (n == kWidth)
      _mm256_storeu_ps(p, v);
    else
      _mm256_maskstore_ps(p, tail_mask(n), v);
  }
  static void load_pairs(const float* p, int64_t n, F& even, F& odd) {
    const F a = load(p, std::min<int64_t>(2 * n, kWidth));
    const F b = load(p + kWidth, std::max<int64_t>(2 * n - kWidth, 0));
    // Per 128-bit half: a's pairs then b's; the 64-bit permute puts the halves in order.
    const auto in_order = [](__m256 v) {
      return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(v), _MM_SHUFFLE(3, 1, 2, 0)));
    };
    even = in_order(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)));
    odd = in_order(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
  }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F min(F a, F b) { return _mm256_min_ps(a, b); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F neg(F v) { return _mm256_xor_ps(v, _mm256_set1_ps(-0.0f)); }
  static F exp(F x) {
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    const __m128 e_lo = _mm256_cvtpd_ps(exp_in_double<Doubles>(lo));
    const __m128 e_hi = _mm256_cvtpd_ps(exp_in_double<Doubles>(hi));
    return _mm256_insertf128_ps(_mm256_castps128_ps256(e_lo), e_hi, 1);
  }
  static F round(DType dtype, F v) {
    if (dtype == DType::kF16)
      return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (dtype != DType::kBF16) return v;
    // f32_to_bf16's rule: round to nearest even on the top 16 bits; a NaN keeps its top bits,
    // quieted. (Magnitudes are below 2^31, so the signed compare orders them.)
    const __m256i u = _mm256_castps_si256(v);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd));
    const __m256i top = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    const __m256i quiet = _mm256_or_si256(_mm256_and_si256(u, top), _mm256_set1_epi32(0x400000));
    return _mm256_castsi256_ps(
        _mm256_blendv_epi8(_mm256_and_si256(rounded, top), quiet, nan));
  }
};

}  // namespace

void apply_activation_block_avx2(const ActivationSpec& spec, const float* in, int64_t ldin,
                                 float* out, int64_t ldout, int64_t rows, int64_t inter,
                                 int64_t col0, int64_t cols) {
  activation_rows::apply_block<Lanes>(spec, in, ldin, out, ldout, rows, inter, col0, cols);
}

}  // namespace moecore
