// Times the activation quantizers (the callbacks make_act_quantizer, nvfp4_quantizer and
// fp8_multiply_quantizer build) at every ISA level this machine has, on one thread: each call
// quantizes a whole [rows, K] f32 matrix in place, restored from a copy before each (untimed)
// call; the median of the repeats is printed, with the speed-up over the scalar row (the formats
// rules, as every quantizer ran before the kernel table). Built with the tests:
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
  return 0;
}
