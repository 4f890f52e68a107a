// Times the activation quantizers (the callbacks make_act_quantizer, nvfp4_quantizer and
// fp8_multiply_quantizer build) and the activation epilogue (activation_kernel's rows) at every
// ISA level this machine has, on one thread: each quantizer call quantizes a whole [rows, K] f32
// matrix in place, restored from a copy before each (untimed) call; each epilogue call turns
// [rows, 2·inter] GEMM1 values into [rows, inter] bf16-rounded activations. The median of the
// repeats is printed, with the speed-up over the scalar row (the formats rules, as every quantizer
// ran before the kernel table; the reference epilogue). Built with the tests:
//   ninja -C build moecore_act_quant_timing && build/moecore_act_quant_timing [repeats]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "moecore/isa/isa.h"
#include "moecore/kernels/activation.h"
#include "moecore/runner/backends/flashinfer_moe_common.h"
#include "moecore/runner/quant_compute.h"

namespace {

using moecore::ActivationQuantizer;
using moecore::ActQuant;
using moecore::IsaLevel;

struct Rule {
  const char* name;
  ActivationQuantizer (*make)(IsaLevel level);
  int64_t scales_per_row_of_k;  // 0: one scale per row; else K / this
};

const Rule kRules[] = {
    {"fp8_per_token",
     [](IsaLevel l) { return moecore::make_act_quantizer(l, ActQuant::kFp8PerToken); }, 0},
    {"fp8_per_token_group_128",
     [](IsaLevel l) {
       return moecore::make_act_quantizer(l, ActQuant::kFp8PerTokenGroup, 0.0f, 128);
     },
     128},
    {"fp8_static",
     [](IsaLevel l) { return moecore::make_act_quantizer(l, ActQuant::kFp8Static, 0.02f); }, 0},
    {"int8_per_token",
     [](IsaLevel l) { return moecore::make_act_quantizer(l, ActQuant::kInt8PerToken); }, 0},
    {"nvfp4 (flashinfer)",
     [](IsaLevel l) { return moecore::flashinfer_detail::nvfp4_quantizer(l, 2688.0f / 12.0f); }, 0},
    {"fp8_multiply (flashinfer)",
     [](IsaLevel l) { return moecore::flashinfer_detail::fp8_multiply_quantizer(l, 37.5f); }, 0},
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The epilogues of the bench's layers: a Qwen3-30B-A3B prefill's GEMM1 rows (M = 1024, k = 8)
// and a GPT-OSS-20B one's (k = 4, interleaved clamped SwiGLU), and a plain relu2.
struct Epilogue {
  const char* name;
  int64_t rows, inter;
  moecore::ActivationSpec spec;
};

std::vector<Epilogue> epilogues() {
  moecore::ActivationSpec silu;
  silu.round_dtype = moecore::DType::kBF16;
  moecore::ActivationSpec swiglu = silu;
  swiglu.alpha = 1.702f;
  swiglu.clamp_limit = 7.0f;
  moecore::ActivationSpec relu2 = silu;
  relu2.gated = false;
  relu2.kind = moecore::Activation::RELU2;
  return {{"silu gated", 8192, 768, silu},
          {"clamped swiglu", 4096, 2880, swiglu},
          {"relu2", 8192, 768, relu2}};
}

void time_epilogues(int repeats) {
  std::printf("\n%-12s %-26s %-12s %10s %10s %8s\n", "rows x I", "epilogue", "level", "ms",
              "ns/value", "speedup");
  for (const Epilogue& ep : epilogues()) {
    const int64_t width = ep.spec.gated ? 2 * ep.inter : ep.inter;
    std::mt19937 rng(2);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> in(static_cast<size_t>(ep.rows * width));
    for (float& v : in) v = normal(rng);
    std::vector<float> out(static_cast<size_t>(ep.rows * ep.inter));
    double scalar_ms = 0.0;
    for (IsaLevel level : moecore::available_isa_levels()) {
      if (level > IsaLevel::kAvx512) continue;  // higher levels use the avx512 row
      const moecore::ActivationFn row = moecore::activation_kernel(level);
      std::vector<double> ms;
      for (int r = 0; r < repeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        row(ep.spec, in.data(), width, out.data(), ep.inter, ep.rows, ep.inter, 0, ep.inter);
        const auto t1 = std::chrono::steady_clock::now();
        ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
      const double t = median(ms);
      if (level == IsaLevel::kScalar) scalar_ms = t;
      const std::string shape = std::to_string(ep.rows) + "x" + std::to_string(ep.inter);
      std::printf("%-12s %-26s %-12s %10.3f %10.3f %7.1fx\n", shape.c_str(), ep.name,
                  moecore::isa_level_name(level), t,
                  t * 1e6 / static_cast<double>(ep.rows * ep.inter), scalar_ms / t);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 9;
  const std::pair<int64_t, int64_t> shapes[] = {{1024, 2048}, {8192, 768}};
  std::printf("%-12s %-26s %-12s %10s %10s %8s\n", "rows x K", "quantizer", "level", "ms",
              "ns/value", "speedup");
  for (auto [rows, k] : shapes) {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    std::vector<float> source(static_cast<size_t>(rows * k));
    for (float& v : source) v = normal(rng);
    std::vector<float> work(source.size()), scales(static_cast<size_t>(rows * k / 16 + rows));
    for (const Rule& rule : kRules) {
      double scalar_ms = 0.0;
      for (IsaLevel level : moecore::available_isa_levels()) {
        if (level > IsaLevel::kAvx512) continue;  // higher levels use the avx512 row
        const ActivationQuantizer q = rule.make(level);
        std::vector<double> ms;
        for (int r = 0; r < repeats; ++r) {
          std::memcpy(work.data(), source.data(), source.size() * sizeof(float));
          const auto t0 = std::chrono::steady_clock::now();
          q(work.data(), rows, k, k, scales.data());
          const auto t1 = std::chrono::steady_clock::now();
          ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        }
        const double t = median(ms);
        if (level == IsaLevel::kScalar) scalar_ms = t;
        const std::string shape = std::to_string(rows) + "x" + std::to_string(k);
        std::printf("%-12s %-26s %-12s %10.3f %10.3f %7.1fx\n", shape.c_str(), rule.name,
                    moecore::isa_level_name(level), t, t * 1e6 / static_cast<double>(rows * k),
                    scalar_ms / t);
      }
    }
  }
  time_epilogues(repeats);
  return 0;
}
