// AVX2 rows of the machine probes (kernels/probe.h): the multi-stream read loop and the fp32 FMA
// peak loop at 8 lanes. Built with AVX2/FMA flags; reach them only through probe_read_bandwidth
// and probe_peak.
#include <immintrin.h>

#include "moecore/kernels/probe.h"

namespace moecore::probe_detail {
namespace {

// The avx512 loop's shape (probe_avx512.cpp) with 32-byte loads: streams advance together, 256
// bytes (eight ymm loads) each per step.
template <int Streams>
uint64_t read_streams(const uint8_t* data, int64_t bytes) {
  const int64_t length = bytes / Streams;  // a multiple of 256 (probe_read_bandwidth sizes it)
  __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                    _mm256_setzero_si256()};
  for (int64_t offset = 0; offset < length; offset += 256) {
    for (int s = 0; s < Streams; ++s) {
      const uint8_t* p = data + s * length + offset;
      for (int j = 0; j < 8; ++j)
        acc[j % 4] = _mm256_xor_si256(
            acc[j % 4], _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 32 * j)));
    }
  }
  const __m256i all =
      _mm256_xor_si256(_mm256_xor_si256(acc[0], acc[1]), _mm256_xor_si256(acc[2], acc[3]));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), all);
  return lanes[0] ^ lanes[1] ^ lanes[2] ^ lanes[3];
}

}  // namespace

uint64_t read_streams_avx2(const uint8_t* data, int64_t bytes, int streams) {
  switch (streams) {
    case 1:
      return read_streams<1>(data, bytes);
    case 2:
      return read_streams<2>(data, bytes);
    case 4:
      return read_streams<4>(data, bytes);
    default:
      return read_streams<8>(data, bytes);
  }
}

float fma_f32_avx2(int64_t iterations) {
  // 12 independent chains hide the FMA latency on both FMA ports (as in fma_f32_avx512).
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-6f);
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  for (int64_t it = 0; it < iterations; ++it)
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  alignas(32) float lanes[12 * 8];
  for (int i = 0; i < 12; ++i) _mm256_store_ps(lanes + 8 * i, acc[i]);
  return sum_floats(lanes, 12 * 8);
}

}  // namespace moecore::probe_detail
