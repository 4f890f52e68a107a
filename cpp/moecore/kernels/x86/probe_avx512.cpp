// AVX-512 rows of the machine probes (kernels/probe.h): the multi-stream read loop and the fp32
// FMA peak loop. Built with AVX-512 flags; reach them only through probe_read_bandwidth and
// probe_peak.
#include <immintrin.h>

#include "moecore/kernels/probe.h"

namespace moecore::probe_detail {
namespace {

// Streams advance together, 256 bytes (four zmm loads) each per step, so the core keeps
// `Streams` independent sequential read streams in flight, as the expert kernels do when they
// read several weight rows at once. XOR is the cheapest way to consume every loaded byte.
template <int Streams>
uint64_t read_streams(const uint8_t* data, int64_t bytes) {
  const int64_t length = bytes / Streams;  // a multiple of 256 (probe_read_bandwidth sizes it)
  __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                    _mm512_setzero_si512()};
  for (int64_t offset = 0; offset < length; offset += 256) {
    for (int s = 0; s < Streams; ++s) {
      const uint8_t* p = data + s * length + offset;
      for (int j = 0; j < 4; ++j)
        acc[j] = _mm512_xor_si512(acc[j], _mm512_load_si512(p + 64 * j));
    }
  }
  const __m512i all = _mm512_xor_si512(_mm512_xor_si512(acc[0], acc[1]), _mm512_xor_si512(acc[2], acc[3]));
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, all);
  uint64_t total = 0;
  for (uint64_t lane : lanes) total ^= lane;
  return total;
}

}  // namespace

uint64_t read_streams_avx512(const uint8_t* data, int64_t bytes, int streams) {
  switch (streams) {
    case 1: return read_streams<1>(data, bytes);
    case 2: return read_streams<2>(data, bytes);
    case 4: return read_streams<4>(data, bytes);
    default: return read_streams<8>(data, bytes);
  }
}

float fma_f32_avx512(int64_t iterations) {
  // 12 independent accumulator chains hide the FMA latency on both FMA ports; acc·a + b with
  // a < 1 stays finite however long it runs.
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-6f);
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  for (int64_t it = 0; it < iterations; ++it)
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  alignas(64) float lanes[12 * 16];
  for (int i = 0; i < 12; ++i) _mm512_store_ps(lanes + 16 * i, acc[i]);
  return sum_floats(lanes, 12 * 16);
}

}  // namespace moecore::probe_detail
