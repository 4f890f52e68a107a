// The canonical rows of the scaled GEMM (scalar and avx512, whichever this machine has) are
// bitwise equal to scaled_gemm_ref for every weight coding and scale mode, with K tails (not a
// multiple of 16 or 32), odd N, an output column offset and M from 1 to 33; NaN fp8 codes give
// NaN outputs in both.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "moecore/isa/isa.h"
#include "moecore/kernels/quant_gemm.h"
#include "support/moe_problem.h"

namespace moecore {
namespace {

enum class Mode {
  kF32, kF16, kBf16,                  // dense, no scales, no alpha (the plain GEMM)
  kBf16Scaled,                        // dense with activation scales and alpha
  kFp8Tensor, kFp8Channel, kFp8Block, kFp8OddBlock,
  kInt8Channel, kInt8Tensor, kInt8Int8,
  kNvfp4, kMxfp4,
};

const char* mode_name(Mode mode) {
  const char* names[] = {"f32",         "f16",          "bf16",        "bf16_scaled",
                         "fp8_tensor",  "fp8_channel",  "fp8_block",   "fp8_odd_block",
                         "int8_channel", "int8_tensor", "int8_int8",   "nvfp4",
                         "mxfp4"};
  return names[static_cast<int>(mode)];
}

struct Case {
  Mode mode;
  Tensor data, scale, alpha;
  WeightOperand w;
};

constexpr int64_t kExperts = 2, kExpert = 1;

Case make_case(std::mt19937& rng, Mode mode, int64_t n, int64_t k) {
  std::uniform_real_distribution<float> positive(0.25f, 2.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  Case c;
  c.mode = mode;
  WeightOperand& w = c.w;
  w.num_experts = kExperts;
  w.n = n;
  w.k = k;
  auto random_bytes = [&](Tensor& t, int lo, int hi) {
    std::uniform_int_distribution<int> code(lo, hi);
    for (int64_t i = 0; i < t.numel(); ++i)
      static_cast<uint8_t*>(t.view().data)[i] = static_cast<uint8_t>(code(rng));
  };
  auto f32_scales = [&](const std::vector<int64_t>& shape) {
    c.scale = Tensor::empty(shape, DType::kF32);
    for (int64_t i = 0; i < c.scale.numel(); ++i) c.scale.ptr<float>()[i] = positive(rng);
  };
  switch (mode) {
    case Mode::kF32: c.data = testing::random_tensor(rng, {kExperts, n, k}, DType::kF32); break;
    case Mode::kF16: c.data = testing::random_tensor(rng, {kExperts, n, k}, DType::kF16); break;
    case Mode::kBf16:
    case Mode::kBf16Scaled:
      c.data = testing::random_tensor(rng, {kExperts, n, k}, DType::kBF16);
      break;
    case Mode::kFp8Tensor:
    case Mode::kFp8Channel:
    case Mode::kFp8Block:
    case Mode::kFp8OddBlock:
      w.coding = WeightCoding::kFp8;
      c.data = Tensor::empty({kExperts, n, k}, DType::kF8E4M3);
      random_bytes(c.data, 0, 255);
      for (int64_t i = 0; i < c.data.numel(); ++i) {  // NaN codes only where the NaN test puts them
        uint8_t& q = static_cast<uint8_t*>(c.data.view().data)[i];
        if ((q & 0x7f) == 0x7f) q ^= 0x01;
      }
      if (mode == Mode::kFp8Tensor) f32_scales({kExperts});
      if (mode == Mode::kFp8Channel) f32_scales({kExperts, n});
      if (mode == Mode::kFp8Block || mode == Mode::kFp8OddBlock) {
        // 16 × 48 blocks (K tails inside the last block) and 3 × 40 (every block has a tail).
        w.block_n = mode == Mode::kFp8Block ? 16 : 3;
        w.block_k = mode == Mode::kFp8Block ? 48 : 40;
        f32_scales({kExperts, (n + w.block_n - 1) / w.block_n, (k + w.block_k - 1) / w.block_k});
      }
      break;
    case Mode::kInt8Channel:
    case Mode::kInt8Tensor:
    case Mode::kInt8Int8:
      w.coding = WeightCoding::kInt8;
      c.data = Tensor::empty({kExperts, n, k}, DType::kI8);
      random_bytes(c.data, 0, 255);
      if (mode == Mode::kInt8Tensor)
        f32_scales({kExperts});
      else
        f32_scales({kExperts, n});
      break;
    case Mode::kNvfp4:
    case Mode::kMxfp4: {
      const bool nv = mode == Mode::kNvfp4;
      w.coding = nv ? WeightCoding::kNvfp4 : WeightCoding::kMxfp4;
      c.data = Tensor::empty({kExperts, n, k / 2}, DType::kU8);
      random_bytes(c.data, 0, 255);
      c.scale = Tensor::empty({kExperts, n, k / fp4_group_size(w.coding)}, DType::kU8);
      // e4m3 scales 2^-6 .. 448 without NaN; e8m0 scales 2^-20 .. 2^20.
      if (nv)
        random_bytes(c.scale, 0x08, 0x7e);
      else
        random_bytes(c.scale, 107, 147);
      break;
    }
  }
  const bool has_alpha = mode == Mode::kBf16Scaled || mode == Mode::kNvfp4 ||
                         mode == Mode::kMxfp4 || mode == Mode::kFp8Channel;
  if (has_alpha) {
    c.alpha = Tensor::empty({kExperts}, DType::kF32);
    for (int64_t i = 0; i < kExperts; ++i) c.alpha.ptr<float>()[i] = positive(rng);
    w.alpha = c.alpha.view();
  }
  w.data = c.data.view();
  if (c.scale.numel() > 0) w.scale = c.scale.view();
  return c;
}

// Activation codes [m, K] (row stride K + 5): fp32 values, or int8 values for int8 × int8;
// per-(row, K block) scales for blocked fp8, one per row for the other scaled modes.
struct Activations {
  std::vector<float> codes, scales;
  ActivationCodes view;
};

Activations make_activations(std::mt19937& rng, const Case& c, int64_t m) {
  Activations a;
  const int64_t ld = c.w.k + 5;
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f), positive(0.25f, 2.0f);
  std::uniform_int_distribution<int> code(-128, 127);
  const bool integer = c.mode == Mode::kInt8Int8;
  a.codes.resize(static_cast<size_t>(m * ld));
  for (float& v : a.codes) v = integer ? static_cast<float>(code(rng)) : unit(rng);
  a.view.codes = a.codes.data();
  a.view.ld = ld;
  a.view.integer = integer;
  const bool plain = c.mode == Mode::kF32 || c.mode == Mode::kF16 || c.mode == Mode::kBf16;
  if (!plain) {
    a.view.scales_per_row = c.w.block_k > 0 ? c.w.num_k_blocks() : 1;
    a.scales.resize(static_cast<size_t>(m * a.view.scales_per_row));
    for (float& s : a.scales) s = positive(rng);
    a.view.scales = a.scales.data();
  }
  return a;
}

std::vector<IsaLevel> canonical_levels() {
  std::vector<IsaLevel> out;
  for (IsaLevel level : available_isa_levels())
    if (level <= IsaLevel::kAvx512) out.push_back(level);
  return out;
}

bool same_bits(float x, float y) { return std::memcmp(&x, &y, sizeof x) == 0; }

class QuantGemmTest : public ::testing::TestWithParam<std::tuple<IsaLevel, Mode>> {};

TEST_P(QuantGemmTest, BitwiseEqualToScalar) {
  const auto [level, mode] = GetParam();
  const ScaledGemmFn kernel = scaled_gemm_kernel(level);
  const bool nv = mode == Mode::kNvfp4, mx = mode == Mode::kMxfp4;
  std::mt19937 rng(11);
  // K tails of 16 and 32 lanes (fp4 K is a whole number of scale groups), odd N.
  const std::vector<std::pair<int64_t, int64_t>> shapes =
      nv   ? std::vector<std::pair<int64_t, int64_t>>{{7, 48}, {5, 208}}
      : mx ? std::vector<std::pair<int64_t, int64_t>>{{7, 32}, {5, 224}}
           : std::vector<std::pair<int64_t, int64_t>>{{7, 37}, {5, 200}, {1, 16}};
  for (auto [n, k] : shapes) {
    const Case c = make_case(rng, mode, n, k);
    for (int64_t m : {1, 2, 3, 7, 16, 33}) {
      SCOPED_TRACE(::testing::Message() << isa_level_name(level) << " " << mode_name(mode)
                                        << " m=" << m << " n=" << n << " k=" << k);
      const Activations a = make_activations(rng, c, m);
      // Columns [1, n) of the expert into an output with stride n + 2, as a column block would.
      const int64_t ldo = n + 2, n0 = n > 1 ? 1 : 0, cols = n - n0;
      std::vector<float> out(m * ldo, -1.0f), ref(m * ldo, -1.0f);
      kernel(a.view, m, c.w, kExpert, n0, cols, out.data(), ldo);
      scaled_gemm_ref(a.view, m, c.w, kExpert, n0, cols, ref.data(), ldo);
      for (int64_t i = 0; i < m * ldo; ++i) {
        ASSERT_TRUE(std::isfinite(ref[i])) << i;
        ASSERT_TRUE(same_bits(out[i], ref[i])) << "at " << i << ": " << out[i] << " vs " << ref[i];
      }
    }
  }
}

std::vector<std::tuple<IsaLevel, Mode>> params() {
  std::vector<std::tuple<IsaLevel, Mode>> out;
  for (IsaLevel level : canonical_levels())
    for (int mode = 0; mode <= static_cast<int>(Mode::kMxfp4); ++mode)
      out.emplace_back(level, static_cast<Mode>(mode));
  return out;
}

INSTANTIATE_TEST_SUITE_P(Levels, QuantGemmTest, ::testing::ValuesIn(params()),
                         [](const auto& info) {
                           return std::string(isa_level_name(std::get<0>(info.param))) + "_" +
                                  mode_name(std::get<1>(info.param));
                         });

// Rows read through ActivationCodes::row_index (the k slots of a token share its stored row) give
// the bits of the same rows copied out in call order, at every level this machine has, for every
// coding: each row reads codes and scales of its own stored row, repeats and chunks included.
TEST(QuantGemmRowIndexTest, IndexedRowsGiveTheBitsOfACopyAtEveryLevel) {
  std::mt19937 rng(17);
  constexpr int64_t kStored = 5;
  for (int mode_index = 0; mode_index <= static_cast<int>(Mode::kMxfp4); ++mode_index) {
    const Mode mode = static_cast<Mode>(mode_index);
    const int64_t n = 6, k = mode == Mode::kMxfp4 ? 96 : 80;
    const Case c = make_case(rng, mode, n, k);
    const Activations stored = make_activations(rng, c, kStored);
    for (int64_t m : {1, 3, 40}) {  // 40 rows: more than one row chunk of every row
      std::vector<int64_t> index(static_cast<size_t>(m));
      for (int64_t r = 0; r < m; ++r) index[r] = (3 * r + 2) % kStored;
      Activations copy = stored;  // rows in call order, every stored row's scales with it
      const int64_t ld = stored.view.ld, spr = stored.view.scales_per_row;
      copy.codes.resize(static_cast<size_t>(m * ld));
      if (stored.view.scales != nullptr) copy.scales.resize(static_cast<size_t>(m * spr));
      for (int64_t r = 0; r < m; ++r) {
        std::copy_n(stored.codes.begin() + index[r] * ld, ld, copy.codes.begin() + r * ld);
        if (stored.view.scales != nullptr)
          std::copy_n(stored.scales.begin() + index[r] * spr, spr, copy.scales.begin() + r * spr);
      }
      copy.view.codes = copy.codes.data();
      if (stored.view.scales != nullptr) copy.view.scales = copy.scales.data();
      ActivationCodes indexed = stored.view;
      indexed.row_index = index.data();
      for (const bool bf16_exact : {false, true}) {
        indexed.bf16_exact = copy.view.bf16_exact = bf16_exact;
        for (IsaLevel level : available_isa_levels()) {
          SCOPED_TRACE(::testing::Message() << isa_level_name(level) << " " << mode_name(mode)
                                            << " m=" << m << " bf16_exact=" << bf16_exact);
          const ScaledGemmFn kernel = scaled_gemm_kernel(level);
          std::vector<float> out(m * n, -1.0f), expected(m * n, -2.0f);
          kernel(indexed, m, c.w, kExpert, 0, n, out.data(), n);
          kernel(copy.view, m, c.w, kExpert, 0, n, expected.data(), n);
          for (int64_t i = 0; i < m * n; ++i)
            ASSERT_TRUE(same_bits(out[i], expected[i]))
                << "at " << i << ": " << out[i] << " vs " << expected[i];
        }
      }
    }
  }
}

TEST(QuantGemmNanTest, Fp8NanCodesGiveNanOutputsAtEveryCanonicalLevel) {
  std::mt19937 rng(5);
  Case c = make_case(rng, Mode::kFp8Channel, 3, 40);
  uint8_t* codes = static_cast<uint8_t*>(c.data.view().data);
  codes[(kExpert * 3 + 0) * 40 + 5] = 0x7f;   // channel 0: +NaN
  codes[(kExpert * 3 + 2) * 40 + 33] = 0xff;  // channel 2: −NaN, in the K tail
  for (IsaLevel level : canonical_levels()) {
    const Activations a = make_activations(rng, c, 2);
    std::vector<float> out(2 * 3), ref(2 * 3);
    scaled_gemm_kernel(level)(a.view, 2, c.w, kExpert, 0, 3, out.data(), 3);
    scaled_gemm_ref(a.view, 2, c.w, kExpert, 0, 3, ref.data(), 3);
    for (int64_t r = 0; r < 2; ++r) {
      EXPECT_TRUE(std::isnan(out[r * 3 + 0]) && std::isnan(ref[r * 3 + 0])) << r;
      EXPECT_TRUE(same_bits(out[r * 3 + 1], ref[r * 3 + 1])) << r;
      EXPECT_TRUE(std::isnan(out[r * 3 + 2]) && std::isnan(ref[r * 3 + 2])) << r;
    }
  }
}

}  // namespace
}  // namespace moecore
