// Machine probes for the benchmark harness (python -m moecore bench): a STREAM-like read
// bandwidth probe and peak-throughput probes of the instructions the expert GEMMs use. Each runs
// one work item per thread of moecore's pool, so it measures what the kernels can get with the
// same thread count. Results are the best of the repeats (as STREAM reports them): the bound a
// kernel is compared with should be the highest rate this machine showed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moecore/isa/isa.h"

namespace moecore {

/// Peak probes, weakest first: fp32 multiply and add in portable code (what the compiler makes of
/// it for the build's baseline), fp32 FMA on ymm and on zmm (VFMADD231PS), bf16 pair dot products
/// (VDPBF16PS), AMX bf16 tile products (TDPBF16PS).
enum class PeakKind { kScalarF32, kAvx2FmaF32, kAvx512FmaF32, kAvx512Bf16, kAmxBf16 };

/// "scalar_f32", "avx2_fma_f32", "avx512_fma_f32", "avx512_bf16", "amx_bf16".
const char* peak_kind_name(PeakKind kind);
PeakKind parse_peak_kind(const std::string& name);
/// The kinds this CPU, OS and build can run (by the detected ISA level), weakest first.
std::vector<PeakKind> available_peak_kinds();

struct ProbeResult {
  double rate = 0;     // GB/s (10^9 bytes) or GFLOP/s, best of the repeats
  double seconds = 0;  // wall time of the best repeat
  int threads = 0;
};

/// Reads `bytes` (split evenly over the pool's threads) with `streams` concurrent read streams
/// per thread; the buffer is written once before timing so its pages exist. streams ∈ {1,2,4,8}.
/// The loop is the widest the machine runs: zmm, ymm or 64-bit loads.
ProbeResult probe_read_bandwidth(int64_t bytes, int streams, int repeats);
/// Runs `iterations` unrolled instruction groups per thread of the kind's peak loop.
ProbeResult probe_peak(PeakKind kind, int64_t iterations, int repeats);

namespace probe_detail {
/// A read loop: the XOR of the 64-bit words of data[0, bytes), read as `streams` concurrent
/// sequential streams (bytes a multiple of 256 · streams).
using ReadFn = uint64_t (*)(const uint8_t* data, int64_t bytes, int streams);
/// The widest read loop at or below `level` that this build has (the portable one at scalar).
ReadFn read_loop(IsaLevel level);

// Rows compiled with ISA flags (kernels/x86/probe_*.cpp); reach them only through the functions
// above. Each returns a value derived from everything it computed, so no work can be elided.
uint64_t read_streams_avx2(const uint8_t* data, int64_t bytes, int streams);
uint64_t read_streams_avx512(const uint8_t* data, int64_t bytes, int streams);
float fma_f32_avx2(int64_t iterations);    // 12 ymm FMAs per iteration
float fma_f32_avx512(int64_t iterations);  // 12 zmm FMAs per iteration
float dot_bf16_avx512(int64_t iterations);  // 12 VDPBF16PS per iteration
float tile_bf16_amx(int64_t iterations);    // 4 TDPBF16PS (16×16×32) per iteration
float sum_floats(const float* values, int64_t count);  // folds a loop's accumulators
constexpr double kScalarF32FlopsPerIteration = 16.0 * 2;  // 16 chains of a multiply and an add
constexpr double kAvx2FmaF32FlopsPerIteration = 12.0 * 8 * 2;
constexpr double kAvx512FmaF32FlopsPerIteration = 12.0 * 16 * 2;
constexpr double kDotBf16FlopsPerIteration = 12.0 * 32 * 2;
constexpr double kTileBf16FlopsPerIteration = 4.0 * 16 * 16 * 32 * 2;
}  // namespace probe_detail

}  // namespace moecore
