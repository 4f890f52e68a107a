// AVX512-BF16 row of the peak probe (kernels/probe.h): VDPBF16PS, 16 lanes × 2 bf16 pairs per
// instruction. Built with AVX512-BF16 flags; reach it only through probe_peak.
#include <immintrin.h>

#include "moecore/kernels/probe.h"

namespace moecore::probe_detail {

float dot_bf16_avx512(int64_t iterations) {
  // Small operands keep the 12 accumulator chains finite for any iteration count.
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  for (int64_t it = 0; it < iterations; ++it)
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  alignas(64) float lanes[12 * 16];
  for (int i = 0; i < 12; ++i) _mm512_store_ps(lanes + 16 * i, acc[i]);
  return sum_floats(lanes, 12 * 16);
}

}  // namespace moecore::probe_detail
