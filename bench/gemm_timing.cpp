// Times one call of each bf16-capable scaled-GEMM row (avx512_bf16, amx, amx_float_tiles) on one
// thread, warm caches: shapes "m n k" with bf16, fp8 (per channel) or nvfp4 weights, each row's
// median against this thread's measured peak (the AMX bf16 probe where the machine has AMX, else
// the AVX512-BF16 one). A tool for tuning a kernel row in isolation, beside `python -m moecore
// bench`, which times whole layers. Built with the tests:
//   ninja -C build moecore_gemm_timing && build/moecore_gemm_timing [repeats] [m n k coding]...
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "moecore/core/tensor.h"
#include "moecore/core/thread_pool.h"
#include "moecore/isa/isa.h"
#include "moecore/kernels/probe.h"
#include "moecore/kernels/quant_gemm.h"

namespace {

using namespace moecore;

struct Shape {
  int64_t m, n, k;
  std::string coding;  // bf16, fp8, nvfp4
};

// Expert 0's weights [1, n, k] of `coding` with random codes and unit scales.
struct Weights {
  Tensor data, scale, alpha;
  WeightOperand w;
};

Weights make_weights(const Shape& s, std::mt19937& rng) {
  Weights out;
  std::uniform_int_distribution<int> byte(0, 255);
  WeightOperand& w = out.w;
  w.num_experts = 1;
  w.n = s.n;
  w.k = s.k;
  if (s.coding == "bf16") {
    out.data = Tensor::empty({1, s.n, s.k}, DType::kBF16);
    std::uniform_int_distribution<int> bits(0x3c00, 0x3fff);  // bf16 values in [2^-7, 2)
    auto* p = static_cast<uint16_t*>(out.data.view().data);
    for (int64_t i = 0; i < s.n * s.k; ++i)
      p[i] = static_cast<uint16_t>(bits(rng) ^ (byte(rng) << 15 & 0x8000));
    w.coding = WeightCoding::kDense;
  } else if (s.coding == "fp8") {
    out.data = Tensor::empty({1, s.n, s.k}, DType::kF8E4M3);
    auto* p = static_cast<uint8_t*>(out.data.view().data);
    for (int64_t i = 0; i < s.n * s.k; ++i)
      p[i] = static_cast<uint8_t>(byte(rng) & 0xef);  // no NaN
    out.scale = Tensor::empty({1, s.n}, DType::kF32);
    std::fill(out.scale.ptr<float>(), out.scale.ptr<float>() + s.n, 1.0f);
    w.coding = WeightCoding::kFp8;
    w.scale = out.scale.view();
  } else if (s.coding == "nvfp4") {
    out.data = Tensor::empty({1, s.n, s.k / 2}, DType::kU8);
    auto* p = static_cast<uint8_t*>(out.data.view().data);
    for (int64_t i = 0; i < s.n * s.k / 2; ++i) p[i] = static_cast<uint8_t>(byte(rng));
    out.scale = Tensor::empty({1, s.n, s.k / 16}, DType::kU8);
    std::fill(out.scale.ptr<uint8_t>(), out.scale.ptr<uint8_t>() + s.n * s.k / 16, uint8_t{0x38});
    w.coding = WeightCoding::kNvfp4;
    w.scale = out.scale.view();
  } else {
    std::fprintf(stderr, "coding must be bf16, fp8 or nvfp4, got %s\n", s.coding.c_str());
    std::exit(2);
  }
  w.data = out.data.view();
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 9;
  std::vector<Shape> shapes;
  for (int i = 2; i + 3 < argc; i += 4)
    shapes.push_back(
        {std::atoll(argv[i]), std::atoll(argv[i + 1]), std::atoll(argv[i + 2]), argv[i + 3]});
  if (shapes.empty())
    shapes = {{256, 512, 4096, "bf16"}, {32, 512, 4096, "bf16"}, {256, 512, 4096, "nvfp4"}};
  ThreadPool::instance().set_num_threads(1);
  const bool amx = detected_isa_level() >= IsaLevel::kAmx;
  if (detected_isa_level() < IsaLevel::kAvx512Bf16) {
    std::printf("this machine has no AVX512-BF16: nothing to time\n");
    return 0;
  }
  const ProbeResult peak = probe_peak(amx ? PeakKind::kAmxBf16 : PeakKind::kAvx512Bf16, 1 << 20, 3);
  std::printf("1-thread peak %.1f GFLOP/s (%s)\n", peak.rate, amx ? "amx_bf16" : "avx512_bf16");
  std::printf("%-24s %-16s %10s %10s %8s\n", "m n k coding", "row", "ms", "GFLOP/s", "% peak");
  std::vector<std::pair<IsaLevel, bool>> rows = {{IsaLevel::kAvx512Bf16, false}};
  if (amx) rows.insert(rows.end(), {{IsaLevel::kAmx, false}, {IsaLevel::kAmx, true}});
  for (const Shape& s : shapes) {
    std::mt19937 rng(1);
    const Weights weights = make_weights(s, rng);
    std::uniform_int_distribution<int> bits(0x3c00, 0x3fff);
    std::vector<float> codes(static_cast<size_t>(s.m * s.k));
    for (float& v : codes) {
      const uint32_t u = static_cast<uint32_t>(bits(rng)) << 16;  // a bf16 value as fp32
      std::memcpy(&v, &u, sizeof v);
    }
    ActivationCodes a;
    a.codes = codes.data();
    a.ld = s.k;
    a.bf16_exact = true;
    std::vector<float> out(static_cast<size_t>(s.m * s.n));
    const std::string name = std::to_string(s.m) + " " + std::to_string(s.n) + " " +
                             std::to_string(s.k) + " " + s.coding;
    for (auto [level, tiles] : rows) {
      const ScaledGemmFn kernel = scaled_gemm_kernel(level, tiles);
      std::vector<double> ms;
      for (int r = 0; r <= repeats; ++r) {  // the first call warms up
        const auto t0 = std::chrono::steady_clock::now();
        kernel(a, s.m, weights.w, 0, 0, s.n, out.data(), s.n);
        const auto t1 = std::chrono::steady_clock::now();
        if (r > 0) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
      const double t = median(ms), gflops = 2.0 * s.m * s.n * s.k / (t * 1e6);
      std::printf("%-24s %-16s %10.3f %10.1f %7.1f%%\n", name.c_str(),
                  scaled_gemm_kernel_name(kernel), t, gflops, 100.0 * gflops / peak.rate);
    }
  }
  return 0;
}
