// Dispatch and timing of the machine probes (probe.h). The ISA loops live in
// kernels/x86/probe_*.cpp and the portable ones here; this file picks them by the detected ISA
// level and times them.
#include "moecore/kernels/probe.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/core/thread_pool.h"
#include "moecore/isa/isa.h"

namespace moecore {
namespace {

struct KindInfo {
  PeakKind kind;
  const char* name;
  IsaLevel level;            // the lowest ISA level that runs it
  float (*loop)(int64_t);    // nullptr when this build lacks the level's flags
  double flops_per_iteration;
};

// The portable peak loop: 16 chains of acc · a + b (a multiply and an add: moecore builds without
// FMA contraction), which the compiler may vectorize for the build's baseline.
float mul_add_f32_scalar(int64_t iterations) {
  float acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = static_cast<float>(i);
  const float a = 0.999999f, b = 1e-6f;  // a < 1 keeps the chains finite
  for (int64_t it = 0; it < iterations; ++it)
    for (float& v : acc) v = v * a + b;
  return probe_detail::sum_floats(acc, 16);
}

// The portable read loop: the AVX loops' shape (probe_avx2.cpp) with 64-bit loads.
uint64_t read_streams_scalar(const uint8_t* data, int64_t bytes, int streams) {
  const int64_t length = bytes / streams;  // a multiple of 256 (probe_read_bandwidth sizes it)
  uint64_t acc[4] = {};
  for (int64_t offset = 0; offset < length; offset += 256)
    for (int s = 0; s < streams; ++s) {
      const uint8_t* p = data + s * length + offset;
      for (int j = 0; j < 32; ++j) {
        uint64_t word;
        std::memcpy(&word, p + 8 * j, sizeof word);
        acc[j % 4] ^= word;
      }
    }
  return acc[0] ^ acc[1] ^ acc[2] ^ acc[3];
}

// Indexed by PeakKind.
constexpr KindInfo kKinds[] = {
    {PeakKind::kScalarF32, "scalar_f32", IsaLevel::kScalar, mul_add_f32_scalar,
     probe_detail::kScalarF32FlopsPerIteration},
    {PeakKind::kAvx2FmaF32, "avx2_fma_f32", IsaLevel::kAvx2,
#ifdef MOECORE_COMPILED_AVX2
     probe_detail::fma_f32_avx2,
#else
     nullptr,
#endif
     probe_detail::kAvx2FmaF32FlopsPerIteration},
    {PeakKind::kAvx512FmaF32, "avx512_fma_f32", IsaLevel::kAvx512,
#ifdef MOECORE_COMPILED_AVX512
     probe_detail::fma_f32_avx512,
#else
     nullptr,
#endif
     probe_detail::kAvx512FmaF32FlopsPerIteration},
    {PeakKind::kAvx512Bf16, "avx512_bf16", IsaLevel::kAvx512Bf16,
#ifdef MOECORE_COMPILED_AVX512BF16
     probe_detail::dot_bf16_avx512,
#else
     nullptr,
#endif
     probe_detail::kDotBf16FlopsPerIteration},
    {PeakKind::kAmxBf16, "amx_bf16", IsaLevel::kAmx,
#ifdef MOECORE_COMPILED_AMX
     probe_detail::tile_bf16_amx,
#else
     nullptr,
#endif
     probe_detail::kTileBf16FlopsPerIteration},
};

const KindInfo& info(PeakKind kind) { return kKinds[static_cast<int>(kind)]; }

bool runnable(const KindInfo& k) { return k.loop != nullptr && detected_isa_level() >= k.level; }

// Runs body(thread) once per pool thread, `repeats` times; returns the fastest repeat's seconds.
template <typename Body>
double best_seconds(int repeats, Body&& body) {
  const int threads = ThreadPool::instance().num_threads();
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    parallel_for(threads, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) body(t);
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (r == 0 || s < best) best = s;
  }
  return best;
}

// Keeps the probes' results observable so no loop is optimised away.
volatile double g_sink = 0;

}  // namespace

float probe_detail::sum_floats(const float* values, int64_t count) {
  float total = 0;
  for (int64_t i = 0; i < count; ++i) total += values[i];
  return total;
}

probe_detail::ReadFn probe_detail::read_loop(IsaLevel level) {
#ifdef MOECORE_COMPILED_AVX512
  if (level >= IsaLevel::kAvx512) return read_streams_avx512;
#endif
#ifdef MOECORE_COMPILED_AVX2
  if (level >= IsaLevel::kAvx2) return read_streams_avx2;
#endif
  return read_streams_scalar;
}

const char* peak_kind_name(PeakKind kind) { return info(kind).name; }

PeakKind parse_peak_kind(const std::string& name) {
  for (const KindInfo& k : kKinds)
    if (name == k.name) return k.kind;
  MOECORE_THROW(InvalidArgument, "unknown peak probe '", name,
                "' (known: scalar_f32, avx2_fma_f32, avx512_fma_f32, avx512_bf16, amx_bf16)");
}

std::vector<PeakKind> available_peak_kinds() {
  std::vector<PeakKind> out;
  for (const KindInfo& k : kKinds)
    if (runnable(k)) out.push_back(k.kind);
  return out;
}

ProbeResult probe_read_bandwidth(int64_t bytes, int streams, int repeats) {
  MOECORE_CHECK(streams == 1 || streams == 2 || streams == 4 || streams == 8,
                "probe_read_bandwidth: streams must be 1, 2, 4 or 8, got ", streams);
  MOECORE_CHECK(repeats >= 1, "probe_read_bandwidth: repeats must be >= 1, got ", repeats);
  const probe_detail::ReadFn read = probe_detail::read_loop(detected_isa_level());
  const int threads = ThreadPool::instance().num_threads();
  // Every thread gets a slice of whole 256-byte steps per stream (the loop's unit).
  const int64_t unit = int64_t{256} * streams;
  const int64_t per_thread = bytes / threads / unit * unit;
  MOECORE_CHECK(per_thread > 0, "probe_read_bandwidth: bytes must be >= ", unit * threads, " for ",
                threads, " threads and ", streams, " streams, got ", bytes);
  std::unique_ptr<uint8_t, decltype(&std::free)> buffer(
      static_cast<uint8_t*>(std::aligned_alloc(64, static_cast<size_t>(per_thread * threads))), &std::free);
  MOECORE_CHECK(buffer != nullptr, "probe_read_bandwidth: cannot allocate ", per_thread * threads, " bytes");
  uint8_t* data = buffer.get();
  // Each thread first touches its own slice (page placement follows the reader).
  parallel_for(threads, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      std::memset(data + t * per_thread, static_cast<int>(t + 1), static_cast<size_t>(per_thread));
  });
  std::vector<uint64_t> sink(threads);
  const double s = best_seconds(repeats, [&](int64_t t) {
    sink[t] ^= read(data + t * per_thread, per_thread, streams);
  });
  for (uint64_t v : sink) g_sink = g_sink + static_cast<double>(v & 1);
  return {static_cast<double>(per_thread * threads) / s * 1e-9, s, threads};
}

ProbeResult probe_peak(PeakKind kind, int64_t iterations, int repeats) {
  const KindInfo& k = info(kind);
  MOECORE_CHECK(iterations >= 1 && repeats >= 1, "probe_peak: iterations and repeats must be >= 1");
  if (!runnable(k))
    MOECORE_UNSUPPORTED("probe_peak: '", k.name, "' needs ISA level ", isa_level_name(k.level),
                        (k.loop ? "" : " compiled in"), " (detected ",
                        isa_level_name(detected_isa_level()), ")");
  const int threads = ThreadPool::instance().num_threads();
  std::vector<float> sink(threads);
  const double s = best_seconds(repeats, [&](int64_t t) { sink[t] += k.loop(iterations); });
  for (float v : sink) g_sink = g_sink + v;
  return {k.flops_per_iteration * static_cast<double>(iterations) * threads / s * 1e-9, s, threads};
}

}  // namespace moecore
