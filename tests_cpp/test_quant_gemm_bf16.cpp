// The avx512_bf16 and amx rows of the scaled GEMM (every such level this machine has, and the amx
// row with float operands in AMX tiles): bf16-exact operands match the scalar row within the fp32
// tolerance of TESTING.md (they sum in the instruction's order), int8 × int8 codes bitwise; each
// output is independent of the other rows of the call, of the column split and of the thread; other
// operands run the avx512 row (bitwise equal to scalar).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/isa/isa.h"
#include "moecore/kernels/convert.h"
#include "moecore/kernels/quant_gemm.h"
#include "moecore/kernels/weight_tiles.h"
#include "moecore/runner/runner.h"

namespace moecore {
namespace {

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// TESTING.md, fp32 row: atol = rtol = 1e-5, the relative part taken of the sum of the terms'
// magnitudes (two fp32 summation orders of a dot differ by up to ~K·2^-24 of that sum).
constexpr double kTolerance = 1e-5;

enum class Case {
  kBf16, kF32, kFp8Tensor, kFp8Channel, kFp8Block, kInt8, kInt8Int8, kNvfp4, kMxfp4
};

const char* case_name(Case c) {
  const char* names[] = {"bf16", "f32", "fp8_tensor", "fp8_channel", "fp8_block",
                         "int8", "int8_int8", "nvfp4", "mxfp4"};
  return names[static_cast<int>(c)];
}

// One expert-batched weight operand (E = 2, expert 1 used) with the tensors it views.
struct Operand {
  Tensor data, scale, alpha;
  WeightOperand w;
};

Operand make_operand(std::mt19937& rng, Case c, int64_t n, int64_t k) {
  constexpr int64_t kExperts = 2;
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f), positive(0.5f, 2.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  Operand op;
  WeightOperand& w = op.w;
  w.num_experts = kExperts;
  w.n = n;
  w.k = k;
  auto fill_f32 = [&](Tensor& t, auto&& dist) {
    for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = dist(rng);
  };
  switch (c) {
    case Case::kBf16:
    case Case::kF32: {
      const DType dtype = c == Case::kBf16 ? DType::kBF16 : DType::kF32;
      std::vector<float> values(static_cast<size_t>(kExperts * n * k));
      for (float& v : values) v = unit(rng);
      op.data = Tensor::empty({kExperts, n, k}, dtype);
      store_f32(values.data(), op.data.numel(), dtype, op.data.view().data);
      w.coding = WeightCoding::kDense;
      break;
    }
    case Case::kFp8Tensor:
    case Case::kFp8Channel:
    case Case::kFp8Block: {
      op.data = Tensor::empty({kExperts, n, k}, DType::kF8E4M3);
      for (int64_t i = 0; i < op.data.numel(); ++i) {
        int code = byte(rng);
        if ((code & 0x7f) == 0x7f) code &= 0xf0;  // no NaN codes
        static_cast<uint8_t*>(op.data.view().data)[i] = static_cast<uint8_t>(code);
      }
      w.coding = WeightCoding::kFp8;
      if (c == Case::kFp8Tensor) op.scale = Tensor::empty({kExperts}, DType::kF32);
      if (c == Case::kFp8Channel) op.scale = Tensor::empty({kExperts, n}, DType::kF32);
      if (c == Case::kFp8Block) {
        w.block_n = 16;
        w.block_k = 32;
        op.scale = Tensor::empty({kExperts, (n + 15) / 16, (k + 31) / 32}, DType::kF32);
      }
      fill_f32(op.scale, positive);
      break;
    }
    case Case::kInt8:
    case Case::kInt8Int8: {
      std::uniform_int_distribution<int> code(-127, 127);
      op.data = Tensor::empty({kExperts, n, k}, DType::kI8);
      for (int64_t i = 0; i < op.data.numel(); ++i)
        op.data.ptr<int8_t>()[i] = static_cast<int8_t>(code(rng));
      op.scale = Tensor::empty({kExperts, n}, DType::kF32);
      fill_f32(op.scale, positive);
      w.coding = WeightCoding::kInt8;
      break;
    }
    case Case::kNvfp4:
    case Case::kMxfp4: {
      const bool nv = c == Case::kNvfp4;
      const int64_t group = nv ? 16 : 32;
      op.data = Tensor::empty({kExperts, n, k / 2}, DType::kU8);
      for (int64_t i = 0; i < op.data.numel(); ++i)
        op.data.ptr<uint8_t>()[i] = static_cast<uint8_t>(byte(rng));
      op.scale = Tensor::empty({kExperts, n, k / group}, DType::kU8);
      // e4m3 scales 0.25 .. 1.875 (codes 0x28 .. 0x3f); e8m0 scales 2^-3 .. 2^0.
      std::uniform_int_distribution<int> scale_code(nv ? 0x28 : 124, nv ? 0x3f : 127);
      for (int64_t i = 0; i < op.scale.numel(); ++i)
        op.scale.ptr<uint8_t>()[i] = static_cast<uint8_t>(scale_code(rng));
      op.alpha = Tensor::empty({kExperts}, DType::kF32);
      fill_f32(op.alpha, positive);
      w.coding = nv ? WeightCoding::kNvfp4 : WeightCoding::kMxfp4;
      break;
    }
  }
  w.data = op.data.view();
  if (op.scale.numel() > 0) w.scale = op.scale.view();
  if (op.alpha.numel() > 0) w.alpha = op.alpha.view();
  return op;
}

// Activation codes [m, K] (row stride K + 3) with per-(row, K block) scales: bf16 values, or
// int8 values for the int8 × int8 case.
struct Activations {
  std::vector<float> codes, scales;
  ActivationCodes view;
};

Activations make_activations(std::mt19937& rng, Case c, int64_t m, const WeightOperand& w) {
  Activations a;
  const int64_t ld = w.k + 3, nb = w.num_k_blocks();
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f), positive(0.5f, 2.0f);
  std::uniform_int_distribution<int> code(-128, 127);
  a.codes.resize(static_cast<size_t>(m * ld));
  for (float& v : a.codes)
    v = c == Case::kInt8Int8 ? static_cast<float>(code(rng)) : round_to(DType::kBF16, unit(rng));
  a.scales.resize(static_cast<size_t>(m * nb));
  for (float& s : a.scales) s = positive(rng);
  a.view.codes = a.codes.data();
  a.view.ld = ld;
  a.view.scales = a.scales.data();
  a.view.scales_per_row = nb;
  a.view.integer = c == Case::kInt8Int8;
  a.view.bf16_exact = true;
  return a;
}

// Σ_b |sa[r, b]| · |sw[c, b]| · Σ_{k in b} |a[r, k] · w[c, k]| · |alpha|: the magnitude that
// bounds the fp32 rounding error of any summation order of out[r, c].
std::vector<double> term_magnitudes(const ActivationCodes& a, int64_t m, const WeightOperand& w,
                                    int64_t e) {
  const int64_t nb = w.num_k_blocks(), kb = w.k_block();
  const double alpha = w.alpha.data != nullptr ? std::fabs(w.alpha.ptr<float>()[e]) : 1.0;
  std::vector<float> codes(static_cast<size_t>(w.k)), scales(static_cast<size_t>(nb));
  std::vector<double> out(static_cast<size_t>(m * w.n));
  for (int64_t c = 0; c < w.n; ++c) {
    decode_weight_row(w, e, c, codes.data(), scales.data());
    for (int64_t r = 0; r < m; ++r) {
      double sum = 0.0;
      for (int64_t b = 0; b < nb; ++b) {
        double block = 0.0;
        for (int64_t i = b * kb; i < std::min(w.k, (b + 1) * kb); ++i)
          block += std::fabs(double(a.codes[r * a.ld + i]) * codes[i]);
        sum += block * std::fabs(a.scales[r * a.scales_per_row + b]) * std::fabs(scales[b]);
      }
      out[r * w.n + c] = sum * alpha;
    }
  }
  return out;
}

// Rows of bf16 values (k apart) as activation codes, which the bf16 rows multiply in bf16.
ActivationCodes bf16_codes(const std::vector<float>& rows, int64_t k) {
  ActivationCodes a;
  a.codes = rows.data();
  a.ld = k;
  a.bf16_exact = true;
  return a;
}

// Row r of a call as its own call of one row.
ActivationCodes row_alone(const ActivationCodes& a, int64_t r) {
  ActivationCodes one = a;
  one.codes = a.codes + r * a.ld;
  one.scales = a.scales + r * a.scales_per_row;
  return one;
}

// The kernel rows under test: each bf16 level this machine has, and at amx also the row with
// float operands in AMX tiles.
struct Bf16Row {
  IsaLevel level;
  bool amx_float_tiles;
  ScaledGemmFn kernel() const { return scaled_gemm_kernel(level, amx_float_tiles); }
  std::string name() const {
    return std::string(isa_level_name(level)) + (amx_float_tiles ? "_float_tiles" : "");
  }
};

std::vector<Bf16Row> bf16_rows() {
  std::vector<Bf16Row> out;
  for (IsaLevel level : available_isa_levels()) {
    if (level >= IsaLevel::kAvx512Bf16) out.push_back({level, false});
    if (level >= IsaLevel::kAmx) out.push_back({level, true});
  }
  return out;
}

class QuantGemmBf16Test : public ::testing::TestWithParam<std::tuple<Bf16Row, Case>> {};

TEST_P(QuantGemmBf16Test, MatchesScalarAndIsIndependentOfBatchSplitAndThread) {
  const auto [row, c] = GetParam();
  const ScaledGemmFn kernel = row.kernel();
  const bool fp4 = c == Case::kNvfp4 || c == Case::kMxfp4;
  // Bitwise classes: int8 × int8 is exact; f32 weights fall back to the canonical avx512 row.
  const bool bitwise = c == Case::kInt8Int8 || c == Case::kF32;
  std::mt19937 rng(7);
  const int64_t e = 1;
  // K tails: 100 and 161 end inside a 32-element step; nvfp4's 112 ends on half a step.
  for (auto [n, k] : {std::pair<int64_t, int64_t>{16, 64},
                      {64, 96},
                      {33, c == Case::kNvfp4 ? 112
                           : fp4             ? 96
                                             : 100},
                      {19, fp4 ? 160 : 161}}) {
    const Operand op = make_operand(rng, c, n, k);
    const Tensor tiles = pack_weight_tiles(op.data.view(), tile_layout(op.w.coding));
    WeightOperand tiled_w = op.w;
    tiled_w.tiles = tiles.view();
    for (int64_t m : {1, 2, 3, 6, 7, 16, 17, 64, 130}) {
      SCOPED_TRACE(::testing::Message()
                   << row.name() << " " << case_name(c) << " m=" << m << " n=" << n << " k=" << k);
      const Activations a = make_activations(rng, c, m, op.w);
      std::vector<float> out(m * n), ref(m * n);
      kernel(a.view, m, op.w, e, 0, n, out.data(), n);
      scaled_gemm_ref(a.view, m, op.w, e, 0, n, ref.data(), n);
      const std::vector<double> magnitude = term_magnitudes(a.view, m, op.w, e);
      for (int64_t i = 0; i < m * n; ++i) {
        ASSERT_TRUE(std::isfinite(out[i])) << i;
        if (bitwise)
          ASSERT_EQ(out[i], ref[i]) << i;
        else
          ASSERT_NEAR(out[i], ref[i], kTolerance * (1.0 + magnitude[i])) << i;
      }
      // Rows alone (first, middle, last) give the same bits as inside the batch.
      for (int64_t r : {int64_t{0}, m / 2, m - 1}) {
        std::vector<float> alone(n);
        kernel(row_alone(a.view, r), 1, op.w, e, 0, n, alone.data(), n);
        for (int64_t j = 0; j < n; ++j) ASSERT_EQ(alone[j], out[r * n + j]) << "row " << r;
      }
      // Two column ranges on another thread (as a static schedule splits the work).
      std::vector<float> split(m * n);
      const int64_t n1 = n / 2 + 1;
      std::thread([&] {
        kernel(a.view, m, op.w, e, 0, n1, split.data(), n);
        kernel(a.view, m, op.w, e, n1, n - n1, split.data() + n1, n);
      }).join();
      for (int64_t i = 0; i < m * n; ++i) ASSERT_EQ(split[i], out[i]) << i;
      // The same codes prepacked in weight tiles give the same bits.
      std::vector<float> tiled(m * n);
      kernel(a.view, m, tiled_w, e, 0, n, tiled.data(), n);
      for (int64_t i = 0; i < m * n; ++i) ASSERT_EQ(tiled[i], out[i]) << i;
    }
  }
}

// Long rows: a call of 17 rows (K = 8192) decodes the weights once per block of columns (16 of
// them at this K) into working memory, and a call of 70 rows makes two chunks of rows, the second
// one row tile, with K ending inside a step (on half a step for nvfp4, a whole one for mxfp4);
// every output equals its row's call alone, which streams the weights, and the reference within
// tolerance.
TEST_P(QuantGemmBf16Test, ColumnBlocksDecodedOnceGiveTheStreamedBits) {
  const auto [row, c] = GetParam();
  std::mt19937 rng(13);
  const int64_t n = 40, e = 1;
  const int64_t long_k = c == Case::kNvfp4 ? 8272 : c == Case::kMxfp4 ? 8288 : 8292;
  for (auto [m, k] : {std::pair<int64_t, int64_t>{17, 8192}, {70, long_k}}) {
    SCOPED_TRACE(::testing::Message() << row.name() << " " << case_name(c) << " m=" << m
                                      << " k=" << k);
    const Operand op = make_operand(rng, c, n, k);
    const Activations a = make_activations(rng, c, m, op.w);
    const ScaledGemmFn kernel = row.kernel();
    std::vector<float> out(m * n), ref(m * n);
    kernel(a.view, m, op.w, e, 0, n, out.data(), n);
    scaled_gemm_ref(a.view, m, op.w, e, 0, n, ref.data(), n);
    const std::vector<double> magnitude = term_magnitudes(a.view, m, op.w, e);
    const Tensor tiles = pack_weight_tiles(op.data.view(), tile_layout(op.w.coding));
    WeightOperand tiled = op.w;
    tiled.tiles = tiles.view();
    std::vector<float> out_tiled(m * n);
    kernel(a.view, m, tiled, e, 0, n, out_tiled.data(), n);
    for (int64_t r = 0; r < m; ++r) {
      std::vector<float> alone(n), alone_tiled(n);
      kernel(row_alone(a.view, r), 1, op.w, e, 0, n, alone.data(), n);
      kernel(row_alone(a.view, r), 1, tiled, e, 0, n, alone_tiled.data(), n);
      for (int64_t j = 0; j < n; ++j) {
        ASSERT_EQ(out[r * n + j], alone[j]) << "row " << r << " column " << j;
        ASSERT_EQ(out_tiled[r * n + j], out[r * n + j]) << "row " << r << " column " << j;
        ASSERT_EQ(alone_tiled[j], alone[j]) << "row " << r << " column " << j;
        ASSERT_NEAR(out[r * n + j], ref[r * n + j], kTolerance * (1.0 + magnitude[r * n + j]))
            << "row " << r << " column " << j;
      }
    }
  }
}

// Calls long in each direction: more rows than a chunk of the float tiles (256), more columns than
// their super block (512, then a partial tile pair), K over several of their slices (16 steps), so
// unfinished scale blocks carry across slices. Every output equals the reference within tolerance
// and its row's call alone bit for bit, and two column ranges on another thread give the same bits.
TEST_P(QuantGemmBf16Test, LongCallsAcrossRowChunksColumnBlocksAndKSlices) {
  const auto [row, c] = GetParam();
  std::mt19937 rng(17);
  const bool fp4 = c == Case::kNvfp4 || c == Case::kMxfp4;
  const ScaledGemmFn kernel = row.kernel();
  const int64_t e = 1;
  for (auto [m, n, k] : {std::array<int64_t, 3>{260, 40, fp4 ? 1120 : 1100},
                         std::array<int64_t, 3>{33, 530, fp4 ? 576 : 550}}) {
    SCOPED_TRACE(::testing::Message()
                 << row.name() << " " << case_name(c) << " m=" << m << " n=" << n << " k=" << k);
    const Operand op = make_operand(rng, c, n, k);
    const Activations a = make_activations(rng, c, m, op.w);
    std::vector<float> out(m * n), ref(m * n), split(m * n);
    kernel(a.view, m, op.w, e, 0, n, out.data(), n);
    scaled_gemm_ref(a.view, m, op.w, e, 0, n, ref.data(), n);
    const std::vector<double> magnitude = term_magnitudes(a.view, m, op.w, e);
    for (int64_t i = 0; i < m * n; ++i)
      ASSERT_NEAR(out[i], ref[i], kTolerance * (1.0 + magnitude[i])) << i;
    for (int64_t r :
         {int64_t{0}, std::min<int64_t>(255, m / 2), std::min<int64_t>(256, m - 1), m - 1}) {
      std::vector<float> alone(n);
      kernel(row_alone(a.view, r), 1, op.w, e, 0, n, alone.data(), n);
      for (int64_t j = 0; j < n; ++j) ASSERT_EQ(alone[j], out[r * n + j]) << "row " << r;
    }
    const int64_t n1 = n / 2 + 5;
    std::thread([&] {
      kernel(a.view, m, op.w, e, 0, n1, split.data(), n);
      kernel(a.view, m, op.w, e, n1, n - n1, split.data() + n1, n);
    }).join();
    for (int64_t i = 0; i < m * n; ++i) ASSERT_EQ(split[i], out[i]) << i;
  }
}

TEST_P(QuantGemmBf16Test, ActivationsNotBf16ExactRunTheCanonicalRow) {
  const auto [row, c] = GetParam();
  if (c == Case::kInt8Int8) GTEST_SKIP() << "int8 codes are exact at every level";
  std::mt19937 rng(11);
  const int64_t m = 5, n = 7, k = 96;
  const Operand op = make_operand(rng, c, n, k);
  Activations a = make_activations(rng, c, m, op.w);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (float& v : a.codes) v = unit(rng);  // f32 values, not bf16
  a.view.bf16_exact = false;
  std::vector<float> out(m * n), ref(m * n);
  row.kernel()(a.view, m, op.w, 1, 0, n, out.data(), n);
  scaled_gemm_ref(a.view, m, op.w, 1, 0, n, ref.data(), n);
  for (int64_t i = 0; i < m * n; ++i) ASSERT_EQ(out[i], ref[i]) << i;
}

// One expert's weights of a one-byte coding: data [1, N, K] with its scales.
WeightOperand one_expert(WeightCoding coding, const Tensor& data, const Tensor& scale) {
  WeightOperand w;
  w.coding = coding;
  w.data = data.view();
  w.scale = scale.view();
  w.num_experts = 1;
  w.n = data.size(1);
  w.k = data.size(2);
  return w;
}

// Every e4m3 code through the bf16 rows' decoders (word arithmetic, 32 elements a step, and byte
// tables, 64 a pair of steps in paired order), at every element p of K = 64, streamed (1 row) and
// decoded once per column block (9 rows): weight row c holds code c at element p and zeros
// elsewhere (a NaN elsewhere would make every dot NaN), activation rows are the unit vector e_p, so
// out[r, c] is code c's value, exactly as the scalar decoder gives it (NaN codes NaN), wherever
// the pairing puts element p.
TEST(QuantGemmBf16DecodeTest, EveryFp8CodeDecodesExactly) {
  constexpr int64_t kCodes = 256, kK = 64, kRows = 9;  // 9 rows: more than a row tile
  Tensor scale = Tensor::empty({1}, DType::kF32);
  scale.ptr<float>()[0] = 1.0f;
  const bool default_tables = fp8_byte_tables();
  for (const bool byte_tables : {false, true}) {
    set_fp8_byte_tables(byte_tables);
    for (int64_t p = 0; p < kK; ++p) {
      Tensor data = Tensor::zeros({1, kCodes, kK}, DType::kF8E4M3);
      for (int64_t c = 0; c < kCodes; ++c)
        static_cast<uint8_t*>(data.view().data)[c * kK + p] = static_cast<uint8_t>(c);
      const WeightOperand w = one_expert(WeightCoding::kFp8, data, scale);
      std::vector<float> unit_rows(kRows * kK, 0.0f);
      for (int64_t r = 0; r < kRows; ++r) unit_rows[r * kK + p] = 1.0f;
      const ActivationCodes a = bf16_codes(unit_rows, kK);
      std::vector<float> ref(kCodes);
      scaled_gemm_ref(a, 1, w, 0, 0, kCodes, ref.data(), kCodes);
      for (const Bf16Row& row : bf16_rows()) {
        for (const int64_t m : {int64_t{1}, kRows}) {
          std::vector<float> out(m * kCodes);
          row.kernel()(a, m, w, 0, 0, kCodes, out.data(), kCodes);
          for (int64_t r = 0; r < m; ++r) {
            for (int64_t code = 0; code < kCodes; ++code) {
              SCOPED_TRACE(::testing::Message() << row.name() << " byte tables " << byte_tables
                                                << " lane " << p << " rows " << m << " code "
                                                << code);
              ASSERT_EQ(std::isnan(ref[code]), (code & 0x7f) == 0x7f);
              if (std::isnan(ref[code]))
                ASSERT_TRUE(std::isnan(out[r * kCodes + code]));
              else
                ASSERT_EQ(out[r * kCodes + code], ref[code]);
            }
          }
        }
      }
    }
  }
  set_fp8_byte_tables(default_tables);
}

// int8 × int8 codes at the longest rows of the biased byte sums: every level gives the scalar
// row's bits, from the contract rows and from weight tiles. Extreme codes (a = -128, w = 127) at
// K = 65793 push the avx512_bf16 row's int32 sums of a · (w + 128) to -128 · 255 · K, the last K
// inside int32; one code more and that row hands the call to the avx512 row.
TEST(QuantGemmBf16DecodeTest, Int8CodesGiveTheReferenceBitsAtTheLongestRows) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> code(-128, 127);
  for (const int64_t k : {int64_t{300}, int64_t{65793}, int64_t{65794}}) {
    const bool extreme = k > 300;
    const int64_t n = 5;
    Tensor data = Tensor::empty({1, n, k}, DType::kI8);
    Tensor scale = Tensor::empty({1, n}, DType::kF32);
    for (int64_t i = 0; i < data.numel(); ++i)
      data.ptr<int8_t>()[i] = static_cast<int8_t>(extreme ? 127 : code(rng));
    for (int64_t i = 0; i < n; ++i) scale.ptr<float>()[i] = 0.5f + 0.25f * float(i);
    WeightOperand w = one_expert(WeightCoding::kInt8, data, scale);
    const Tensor tiles = pack_weight_tiles(data.view(), TileLayout::kBytes);
    WeightOperand tiled = w;
    tiled.tiles = tiles.view();
    for (int64_t m : {1, 3, 20}) {
      std::vector<float> codes(static_cast<size_t>(m * k));
      for (float& v : codes) v = extreme ? -128.0f : static_cast<float>(code(rng));
      ActivationCodes a = bf16_codes(codes, k);
      a.integer = true;
      std::vector<float> ref(m * n);
      scaled_gemm_ref(a, m, w, 0, 0, n, ref.data(), n);
      for (IsaLevel level : available_isa_levels()) {
        SCOPED_TRACE(::testing::Message() << isa_level_name(level) << " k=" << k << " m=" << m);
        for (const WeightOperand* operand : {&w, &tiled}) {
          std::vector<float> out(m * n);
          scaled_gemm_kernel(level, false)(a, m, *operand, 0, 0, n, out.data(), n);
          for (int64_t i = 0; i < m * n; ++i) ASSERT_EQ(out[i], ref[i]) << i;
        }
      }
    }
  }
}

// Every e2m1 code under every block-scale code, in both halves of a 32-element step, at every
// level: rows of unit activations pick single weights, streamed (one row) and decoded once per
// column block (all rows). Every weight is exact, NaN scales included (the canonical rows give
// the scalar row's bits, zero signs too; a NaN is any NaN), except that the bf16 rows give 0 where
// the scalar row's product is subnormal (bf16 conversion and VDPBF16PS treat subnormals as zero).
TEST(QuantGemmBf16DecodeTest, EveryFp4CodeUnderEveryScaleDecodesExactly) {
  constexpr int64_t kScales = 256, kK = 32;
  for (const WeightCoding coding : {WeightCoding::kNvfp4, WeightCoding::kMxfp4}) {
    const int64_t group = fp4_group_size(coding);
    Tensor data = Tensor::empty({1, kScales, kK / 2}, DType::kU8);
    Tensor scale = Tensor::empty({1, kScales, kK / group}, DType::kU8);
    for (int64_t c = 0; c < kScales; ++c) {
      for (int64_t j = 0; j < kK / 2; ++j)  // element 2j: code j, element 2j + 1: code 15 - j
        data.ptr<uint8_t>()[c * kK / 2 + j] = static_cast<uint8_t>(j | (15 - j) << 4);
      for (int64_t g = 0; g < kK / group; ++g)  // the second group's scale code runs backwards
        scale.ptr<uint8_t>()[c * kK / group + g] = static_cast<uint8_t>(g == 0 ? c : 255 - c);
    }
    WeightOperand w;
    w.coding = coding;
    w.data = data.view();
    w.scale = scale.view();
    w.num_experts = 1;
    w.n = kScales;
    w.k = kK;
    std::vector<float> unit_rows(kK * kK, 0.0f);
    for (int64_t j = 0; j < kK; ++j) unit_rows[j * kK + j] = 1.0f;
    const ActivationCodes a = bf16_codes(unit_rows, kK);
    std::vector<float> ref(kK * kScales);
    scaled_gemm_ref(a, kK, w, 0, 0, kScales, ref.data(), kScales);
    std::vector<Bf16Row> rows;  // every level, and the amx row with float tiles
    for (IsaLevel level : available_isa_levels()) {
      rows.push_back({level, false});
      if (level >= IsaLevel::kAmx) rows.push_back({level, true});
    }
    for (const Bf16Row& row : rows) {
      const bool bf16 = row.level >= IsaLevel::kAvx512Bf16;
      std::vector<float> all(kK * kScales), one(kScales);
      row.kernel()(a, kK, w, 0, 0, kScales, all.data(), kScales);
      for (int64_t j = 0; j < kK; ++j) {
        row.kernel()(activation_rows_from(a, j), 1, w, 0, 0, kScales, one.data(), kScales);
        for (int64_t c = 0; c < kScales; ++c) {
          SCOPED_TRACE(::testing::Message() << row.name() << " fp4 group " << group << " element "
                                            << j << " scale code " << c);
          const float want = ref[j * kScales + c];
          for (const float got : {all[j * kScales + c], one[c]}) {
            if (std::isnan(want))
              ASSERT_TRUE(std::isnan(got));
            else if (!bf16)
              ASSERT_EQ(float_bits(got), float_bits(want));  // signed zeros too
            else if (std::fpclassify(want) == FP_SUBNORMAL)
              ASSERT_EQ(got, 0.0f);
            else
              ASSERT_EQ(got, want);
          }
        }
      }
    }
  }
}

// Restores the caller's MOECORE_AMX_FLOAT_TILES (a suite may run with the tiles on).
struct RestoreFloatTilesVariable {
  const char* set = std::getenv("MOECORE_AMX_FLOAT_TILES");
  std::string value = set != nullptr ? set : "";
  ~RestoreFloatTilesVariable() {
    if (set != nullptr)
      setenv("MOECORE_AMX_FLOAT_TILES", value.c_str(), 1);
    else
      unsetenv("MOECORE_AMX_FLOAT_TILES");
  }
};

// MOECORE_AMX_FLOAT_TILES picks the float-tiles row at the amx level only, read at each pick; a
// malformed value is an error, not a silent default.
TEST(QuantGemmBf16RowTest, AmxFloatTilesVariableChoosesTheRowAtTheAmxLevelOnly) {
  const RestoreFloatTilesVariable restore;
  unsetenv("MOECORE_AMX_FLOAT_TILES");
  const ScaledGemmFn tiles = scaled_gemm_kernel(IsaLevel::kAmx, true);
  const ScaledGemmFn streamed = scaled_gemm_kernel(IsaLevel::kAmx, false);
  EXPECT_EQ(scaled_gemm_kernel(IsaLevel::kAmx), streamed);  // unset: off
  setenv("MOECORE_AMX_FLOAT_TILES", "1", 1);
  EXPECT_EQ(scaled_gemm_kernel(IsaLevel::kAmx), tiles);
  for (IsaLevel below : {IsaLevel::kScalar, IsaLevel::kAvx512, IsaLevel::kAvx512Bf16})
    EXPECT_EQ(scaled_gemm_kernel(below), scaled_gemm_kernel(below, false));
  setenv("MOECORE_AMX_FLOAT_TILES", "off", 1);
  EXPECT_EQ(scaled_gemm_kernel(IsaLevel::kAmx), streamed);
  setenv("MOECORE_AMX_FLOAT_TILES", "tiles", 1);
  EXPECT_THROW(scaled_gemm_kernel(IsaLevel::kAmx), InvalidArgument);
}

// A MoeRunner fixes the choice when it is built: the config's amx_float_tiles, else the variable
// as it was then; its backends build with that row whatever the variable says later.
TEST(QuantGemmBf16RowTest, RunnerFixesTheFloatTilesChoiceWhenBuilt) {
  const RestoreFloatTilesVariable restore;
  MoeRunnerConfig config;
  config.isa_level = current_isa_level();
  setenv("MOECORE_AMX_FLOAT_TILES", "on", 1);
  const MoeRunner from_variable(MoeRunnerBackend::TRITON, config, MoeA2ABackend::NONE);
  unsetenv("MOECORE_AMX_FLOAT_TILES");
  ASSERT_TRUE(from_variable.config().amx_float_tiles.has_value());
  EXPECT_TRUE(*from_variable.config().amx_float_tiles);
  EXPECT_EQ(from_variable.config().gemm_kernel(), scaled_gemm_kernel(current_isa_level(), true));

  config.amx_float_tiles = false;
  setenv("MOECORE_AMX_FLOAT_TILES", "1", 1);
  const MoeRunner explicit_off(MoeRunnerBackend::TRITON, config, MoeA2ABackend::NONE);
  EXPECT_EQ(explicit_off.config().gemm_kernel(), scaled_gemm_kernel(current_isa_level(), false));
  setenv("MOECORE_AMX_FLOAT_TILES", "tiles", 1);  // malformed, but the runner no longer reads it
  EXPECT_NO_THROW(explicit_off.config().gemm_kernel());
  config.amx_float_tiles.reset();
  EXPECT_THROW(MoeRunner(MoeRunnerBackend::TRITON, config, MoeA2ABackend::NONE), InvalidArgument);
}

// Each row of the build is named after its level, and the float tiles after themselves.
TEST(QuantGemmBf16RowTest, KernelRowsAreNamedAfterTheirLevel) {
  for (IsaLevel level : available_isa_levels())
    EXPECT_STREQ(scaled_gemm_kernel_name(scaled_gemm_kernel(level, false)), isa_level_name(level));
  const ScaledGemmFn tiles = scaled_gemm_kernel(IsaLevel::kAmx, true);
  if (tiles != scaled_gemm_kernel(IsaLevel::kAmx, false))
    EXPECT_STREQ(scaled_gemm_kernel_name(tiles), "amx_float_tiles");
  EXPECT_THROW(scaled_gemm_kernel_name(nullptr), InternalError);
}

// Only the float tiles ask for wide calls (512 weight rows); every streamed row takes any width.
TEST(QuantGemmBf16RowTest, OnlyTheFloatTilesAskForWideCalls) {
  for (IsaLevel level : available_isa_levels())
    EXPECT_EQ(scaled_gemm_min_call_columns(scaled_gemm_kernel(level, false)), 0)
        << isa_level_name(level);
  const ScaledGemmFn tiles = scaled_gemm_kernel(IsaLevel::kAmx, true);
  if (tiles != scaled_gemm_kernel(IsaLevel::kAmx, false))
    EXPECT_EQ(scaled_gemm_min_call_columns(tiles), 512);
  EXPECT_THROW(scaled_gemm_min_call_columns(nullptr), InternalError);
}

std::vector<std::tuple<Bf16Row, Case>> params() {
  std::vector<std::tuple<Bf16Row, Case>> out;
  for (const Bf16Row& row : bf16_rows())
    for (Case c : {Case::kBf16, Case::kF32, Case::kFp8Tensor, Case::kFp8Channel, Case::kFp8Block,
                   Case::kInt8, Case::kInt8Int8, Case::kNvfp4, Case::kMxfp4})
      out.emplace_back(row, c);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Levels, QuantGemmBf16Test, ::testing::ValuesIn(params()),
                         [](const auto& info) {
                           return std::get<0>(info.param).name() + "_" +
                                  case_name(std::get<1>(info.param));
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(QuantGemmBf16Test);

}  // namespace
}  // namespace moecore
