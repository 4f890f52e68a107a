// Times one call of scaled-GEMM kernel rows on one thread, warm caches: shapes "m n k coding"
// with bf16, fp8 (per channel), fp8_block (128 × 128 weight blocks, activation scales per row and
// 128-wide K group, as DeepSeek-style checkpoints and the per-token-group quantizer give them),
// int8 (per channel, int8 activation codes), nvfp4 or mxfp4 weights.
// Each row reports its median and best time, the weights' bytes over the median (GB/s: what decode,
// M = 1, is bound by once the weights come from memory) and GFLOP/s against this thread's measured
// peak (the machine's strongest probe kind). A tool for tuning a kernel row in isolation, beside
// `python -m moecore bench`, which times whole layers. Built with the tests:
//   ninja -C build moecore_gemm_timing
//   build/moecore_gemm_timing [--rows=avx2,scalar] [--tiles] [--fp8-byte-tables=0|1]
//       [--call-columns=C] [repeats] [m n k coding]...
// --rows names kernel rows (isa levels, or amx_float_tiles); default: every row the machine
// runs from avx2 up (the scalar reference only when named). --tiles packs the weight tiles, as a
// processed layer has them, for the rows that read them. --fp8-byte-tables=0|1 picks the bf16
// rows' e4m3 decoder (byte tables by default; kernels/quant_gemm.h, fp8_byte_tables).
// --call-columns=C times the same work as calls of C weight rows each, in order (as a schedule's
// column blocks make them), to see what narrower calls cost; a timed pass converts its rows once.
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
#include "moecore/kernels/weight_tiles.h"

namespace {

using namespace moecore;

struct Shape {
  int64_t m, n, k;
  std::string coding;  // bf16, fp8, fp8_block, int8, nvfp4, mxfp4
};

// Expert 0's weights [1, n, k] of `coding` with random codes; unit scales but fp8_block's, drawn
// from [0.5, 2).
struct Weights {
  Tensor data, scale;
  WeightOperand w;
  int64_t bytes = 0;  // codes and scales
};

Weights make_weights(const Shape& s, std::mt19937& rng) {
  Weights out;
  std::uniform_int_distribution<int> byte(0, 255);
  auto random_bytes = [&](Tensor& t, int mask) {
    auto* p = static_cast<uint8_t*>(t.view().data);
    for (int64_t i = 0; i < t.numel() * dtype_size(t.dtype()); ++i)
      p[i] = static_cast<uint8_t>(byte(rng) & mask);
  };
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
  } else if (s.coding == "fp8" || s.coding == "int8") {
    const bool fp8 = s.coding == "fp8";
    out.data = Tensor::empty({1, s.n, s.k}, fp8 ? DType::kF8E4M3 : DType::kI8);
    random_bytes(out.data, fp8 ? 0xef : 0xff);  // fp8: no NaN code
    out.scale = Tensor::empty({1, s.n}, DType::kF32);
    std::fill(out.scale.ptr<float>(), out.scale.ptr<float>() + s.n, 1.0f);
    w.coding = fp8 ? WeightCoding::kFp8 : WeightCoding::kInt8;
  } else if (s.coding == "fp8_block") {
    out.data = Tensor::empty({1, s.n, s.k}, DType::kF8E4M3);
    random_bytes(out.data, 0xef);
    constexpr int64_t kBlock = 128;
    w.block_n = w.block_k = kBlock;
    const int64_t bn = (s.n + kBlock - 1) / kBlock;
    out.scale = Tensor::empty({1, bn, w.num_k_blocks()}, DType::kF32);
    std::uniform_real_distribution<float> around_one(0.5f, 2.0f);
    for (int64_t i = 0; i < out.scale.numel(); ++i) out.scale.ptr<float>()[i] = around_one(rng);
    w.coding = WeightCoding::kFp8;
  } else if (s.coding == "nvfp4" || s.coding == "mxfp4") {
    const bool nv = s.coding == "nvfp4";
    const int64_t group = nv ? 16 : 32;
    if (s.k % group != 0) {
      std::fprintf(stderr, "%s K must be a multiple of %lld\n", s.coding.c_str(),
                   static_cast<long long>(group));
      std::exit(2);
    }
    out.data = Tensor::empty({1, s.n, s.k / 2}, DType::kU8);
    random_bytes(out.data, 0xff);
    out.scale = Tensor::empty({1, s.n, s.k / group}, DType::kU8);
    // Scales around 1 (e4m3 0x30–0x3f, e8m0 124–131): a mix of table rows, as a model's.
    auto* codes = out.scale.ptr<uint8_t>();
    for (int64_t i = 0; i < s.n * s.k / group; ++i)
      codes[i] = static_cast<uint8_t>(nv ? 0x30 + (byte(rng) & 15) : 124 + (byte(rng) & 7));
    w.coding = nv ? WeightCoding::kNvfp4 : WeightCoding::kMxfp4;
  } else {
    std::fprintf(stderr, "coding must be bf16, fp8, fp8_block, int8, nvfp4 or mxfp4, got %s\n",
                 s.coding.c_str());
    std::exit(2);
  }
  w.data = out.data.view();
  out.bytes = out.data.numel() * dtype_size(out.data.dtype());
  if (out.scale.defined()) {
    w.scale = out.scale.view();
    out.bytes += out.scale.numel() * dtype_size(out.scale.dtype());
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A kernel row to time: an ISA level, with the AMX float tiles or not.
struct Row {
  IsaLevel level;
  bool float_tiles;
};

std::vector<Row> parse_rows(const std::string& list) {
  std::vector<Row> rows;
  size_t at = 0;
  while (at <= list.size()) {
    const size_t comma = std::min(list.find(',', at), list.size());
    const std::string name = list.substr(at, comma - at);
    if (name == "amx_float_tiles")
      rows.push_back({IsaLevel::kAmx, true});
    else
      rows.push_back({parse_isa_level(name), false});
    at = comma + 1;
  }
  return rows;
}

}  // namespace

int main(int argc, char** argv) try {
  int arg = 1;
  std::vector<Row> rows;
  bool tiles = false;
  int64_t call_columns = 0;  // 0: one call for all n
  for (; argc > arg && std::strncmp(argv[arg], "--", 2) == 0; ++arg) {
    if (std::strncmp(argv[arg], "--rows=", 7) == 0) {
      rows = parse_rows(argv[arg] + 7);
    } else if (std::strcmp(argv[arg], "--tiles") == 0) {
      tiles = true;
    } else if (std::strncmp(argv[arg], "--call-columns=", 15) == 0) {
      call_columns = std::atoll(argv[arg] + 15);
      if (call_columns < 1) {
        std::fprintf(stderr, "--call-columns must be positive: %s\n", argv[arg]);
        return 2;
      }
    } else if (std::strcmp(argv[arg], "--fp8-byte-tables=0") == 0 ||
               std::strcmp(argv[arg], "--fp8-byte-tables=1") == 0) {
      set_fp8_byte_tables(argv[arg][std::strlen(argv[arg]) - 1] == '1');
    } else {
      std::fprintf(stderr, "unknown option %s (known: --rows=…, --tiles, --fp8-byte-tables=0|1, "
                   "--call-columns=C)\n",
                   argv[arg]);
      return 2;
    }
  }
  const int repeats = argc > arg ? std::atoi(argv[arg++]) : 9;
  if (repeats < 1 || (argc - arg) % 4 != 0) {
    std::fprintf(stderr,
                 "usage: %s [--rows=avx2,…] [--tiles] [--fp8-byte-tables=0|1] [--call-columns=C] "
                 "[repeats ≥ 1] [m n k coding]...\n",
                 argv[0]);
    return 2;
  }
  std::vector<Shape> shapes;
  for (int i = arg; i + 3 < argc; i += 4) {
    shapes.push_back(
        {std::atoll(argv[i]), std::atoll(argv[i + 1]), std::atoll(argv[i + 2]), argv[i + 3]});
    if (shapes.back().m < 1 || shapes.back().n < 1 || shapes.back().k < 1) {
      std::fprintf(stderr, "m, n and k must be positive: %s %s %s\n", argv[i], argv[i + 1],
                   argv[i + 2]);
      return 2;
    }
  }
  if (shapes.empty())
    shapes = {{1, 1536, 2048, "bf16"}, {1, 1536, 2048, "nvfp4"}, {256, 512, 4096, "bf16"}};
  const IsaLevel detected = detected_isa_level();
  if (rows.empty()) {
    for (IsaLevel level : available_isa_levels())
      if (level >= IsaLevel::kAvx2) rows.push_back({level, false});
    if (detected >= IsaLevel::kAmx) rows.push_back({IsaLevel::kAmx, true});
  }
  for (const Row& row : rows)
    if (row.level > detected) {
      std::fprintf(stderr, "this machine runs rows up to %s, not %s\n", isa_level_name(detected),
                   isa_level_name(row.level));
      return 2;
    }
  ThreadPool::instance().set_num_threads(1);
  const PeakKind peak_kind = available_peak_kinds().back();
  const ProbeResult peak = probe_peak(peak_kind, 1 << 20, 3);
  std::printf("1-thread peak %.1f GFLOP/s (%s)\n", peak.rate, peak_kind_name(peak_kind));
  std::printf("%-24s %-16s %10s %10s %8s %10s %8s\n", "m n k coding", "row", "ms", "best ms",
              "GB/s", "GFLOP/s", "% peak");
  for (const Shape& s : shapes) {
    std::mt19937 rng(1);
    Weights weights = make_weights(s, rng);
    Tensor weight_tiles;  // as a processed layer has them (rows that do not read tiles ignore them)
    if (tiles) {
      weight_tiles = pack_weight_tiles(weights.data.view(), tile_layout(weights.w.coding));
      weights.w.tiles = weight_tiles.view();
    }
    const bool integer = s.coding == "int8";
    // Activation codes as the quantizers make them (ActivationCodes::bounded_codes holds): int8
    // values, else e4m3 values in [2^-6, 2) (bf16 patterns with 3 mantissa bits).
    std::uniform_int_distribution<int> bits(0x3c80, 0x3fff), int8_code(-127, 127);
    std::vector<float> codes(static_cast<size_t>(s.m * s.k));
    for (float& v : codes) {
      if (integer) {
        v = static_cast<float>(int8_code(rng));
        continue;
      }
      const uint32_t u = static_cast<uint32_t>(bits(rng) & 0xfff0) << 16;
      std::memcpy(&v, &u, sizeof v);
    }
    // Per (row, K block) scales where the weights have K blocks, as the group quantizer gives.
    std::vector<float> scales(static_cast<size_t>(s.m * weights.w.num_k_blocks()));
    std::uniform_real_distribution<float> around_one(0.5f, 2.0f);
    for (float& v : scales) v = around_one(rng);
    ActivationCodes a;
    if (weights.w.num_k_blocks() > 1) {
      a.scales = scales.data();
      a.scales_per_row = weights.w.num_k_blocks();
    }
    a.codes = codes.data();
    a.ld = s.k;
    a.integer = integer;
    a.bf16_exact = true;
    a.bounded_codes = true;
    // Working memory of its own, and a fresh tag for each timed pass: a pass's calls of
    // --call-columns convert the rows once and keep them, as a schedule's column blocks do.
    GemmScratch scratch;
    a.scratch = &scratch;
    std::vector<float> out(static_cast<size_t>(s.m * s.n));
    const std::string name = std::to_string(s.m) + " " + std::to_string(s.n) + " " +
                             std::to_string(s.k) + " " + s.coding;
    for (const Row& row : rows) {
      const ScaledGemmFn kernel = scaled_gemm_kernel(row.level, row.float_tiles);
      std::vector<double> ms;
      for (int r = 0; r <= repeats; ++r) {  // the first call warms up
        a.tag = new_activation_tag();
        const auto t0 = std::chrono::steady_clock::now();
        const int64_t step = call_columns > 0 ? call_columns : s.n;
        for (int64_t n0 = 0; n0 < s.n; n0 += step)
          kernel(a, s.m, weights.w, 0, n0, std::min(step, s.n - n0), out.data() + n0, s.n);
        const auto t1 = std::chrono::steady_clock::now();
        if (r > 0) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
      const double t = median(ms), gflops = 2.0 * s.m * s.n * s.k / (t * 1e6);
      std::printf("%-24s %-16s %10.4f %10.4f %8.2f %10.1f %7.1f%%\n", name.c_str(),
                  scaled_gemm_kernel_name(kernel), t, *std::min_element(ms.begin(), ms.end()),
                  weights.bytes / (t * 1e6), gflops, 100.0 * gflops / peak.rate);
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 2;
}
