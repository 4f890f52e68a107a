// The activation epilogue: exp_f32 rounds e^x correctly (against long double) and keeps the
// special values; every row of the activation table this machine can run (activation_kernel at
// each available level) gives the reference row's bits for every spec the runners build (silu and
// relu2, gated in each layout or not, the clamped SwiGLU on pairs and halves, the DSv4 clamp, the
// torch-native rounding before the multiply, gelu through the reference) in fp32, bf16 and f16, on
// random values, the special values and bf16 / f16 rounding ties, over blocks whose columns start
// and end off the vector width, without touching anything outside the block. A NaN gives a NaN, its
// payload aside: which of two NaN operands an instruction passes on follows the operand order,
// which the compiler picks for the scalar row's commutative operations.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "moecore/formats/half.h"
#include "moecore/isa/isa.h"
#include "moecore/kernels/activation.h"
#include "moecore/kernels/exp_f32.h"

namespace moecore {
namespace {

// Whether f is the fp32 value nearest to the exact e^x (long double), ties either way.
bool nearest_to_exp(float x, float f) {
  const long double exact = std::exp(static_cast<long double>(x));
  const long double here = std::fabs(static_cast<long double>(f) - exact);
  const float up = std::nextafter(f, std::numeric_limits<float>::infinity());
  const float down = std::nextafter(f, -std::numeric_limits<float>::infinity());
  return here <= std::fabs(static_cast<long double>(up) - exact) &&
         here <= std::fabs(static_cast<long double>(down) - exact);
}

TEST(ExpF32, RoundsCorrectlyAcrossTheWholeRange) {
  // Every 613th fp32 bit pattern of magnitude up to 104, both signs (a stride prime to every
  // power of two reaches every exponent and mantissa pattern), results up to +inf and down to 0.
  int64_t checked = 0;
  for (uint32_t u = 0; u < 0x42d00000u; u += 613)  // |x| from 0 to 104
    for (float x : {bits_float(u), bits_float(u | 0x80000000u)}) {
      if (x > 88.7f) continue;  // past the largest finite result (checked below)
      const float f = exp_f32(x);
      ASSERT_TRUE(nearest_to_exp(x, f)) << "x = " << x << " gave " << f;
      ++checked;
    }
  EXPECT_GT(checked, 3'000'000);
}

TEST(ExpF32, SpecialValuesAndTheEndsOfTheRange) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isnan(exp_f32(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(exp_f32(-std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(exp_f32(inf), inf);
  EXPECT_EQ(float_bits(exp_f32(-inf)), 0u);
  EXPECT_EQ(exp_f32(0.0f), 1.0f);
  EXPECT_EQ(exp_f32(-0.0f), 1.0f);
  EXPECT_EQ(exp_f32(1.0f), bits_float(0x402df854u));  // e
  // Overflow to +inf, the largest finite result, subnormal results and underflow to +0: the
  // same as the correctly rounded value.
  // (Round to nearest gives +inf from FLT_MAX + half its ulp on.)
  const long double overflow =
      static_cast<long double>(std::numeric_limits<float>::max()) + std::ldexp(1.0L, 103);
  for (float x : {88.72283f, 88.72284f, 88.7229f, 89.0f, 1e30f, -87.3f, -100.0f, -103.27893f,
                  -103.972f, -103.973f, -104.0f, -1e30f}) {
    const float f = exp_f32(x);
    const long double exact = std::exp(static_cast<long double>(x));
    if (exact >= overflow)
      EXPECT_EQ(f, inf) << "x = " << x;
    else
      EXPECT_TRUE(nearest_to_exp(x, f)) << "x = " << x << " gave " << f;
  }
  EXPECT_EQ(exp_f32(89.0f), inf);
  EXPECT_EQ(float_bits(exp_f32(-104.0f)), 0u);
  EXPECT_GT(exp_f32(-103.0f), 0.0f);  // a subnormal
}

// A spec the runners build, with a name for failure messages.
struct Case {
  std::string name;
  ActivationSpec spec;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (DType rd : {DType::kF32, DType::kBF16, DType::kF16}) {
    const std::string suffix = std::string("/") + dtype_name(rd);
    auto add = [&](std::string name, ActivationSpec s) {
      s.round_dtype = rd;
      out.push_back({name + suffix, s});
    };
    ActivationSpec s;
    add("silu gate|up", s);
    s.layout = GateUpLayout::kUpGate;
    add("silu up|gate", s);
    s.layout = GateUpLayout::kUpGateInterleaved;
    s.interleave_group = 8;
    add("silu interleaved 8", s);
    s.interleave_group = 24;
    add("silu interleaved 24", s);
    s = ActivationSpec{};
    s.swiglu_limit = 7.0f;
    add("silu DSv4 clamp", s);
    s = ActivationSpec{};
    s.round_before_mul = true;
    add("silu rounded before the multiply", s);
    s = ActivationSpec{};
    s.alpha = 1.702f;
    s.clamp_limit = 7.0f;
    s.beta = 1.0f;
    s.layout = GateUpLayout::kGateUpPairs;
    add("GPT-OSS clamped SwiGLU", s);
    s.beta = 0.5f;
    add("clamped SwiGLU, beta 0.5", s);
    s.layout = GateUpLayout::kUpGate;  // FlashInfer's MXFP4 path, per-expert α, β, limit
    s.alpha = -0.75f;
    s.clamp_limit = 3.0f;
    add("clamped SwiGLU on up|gate halves", s);
    s = ActivationSpec{};
    s.gated = false;
    add("silu", s);
    s.kind = Activation::RELU2;
    add("relu2", s);
    s.kind = Activation::GELU;
    add("gelu", s);
    s.gated = true;
    s.kind = Activation::GELU_TANH;
    add("gelu_tanh gated", s);
  }
  return out;
}

// GEMM1 values: random magnitudes across the exponent range that matters, the special values,
// and values on bf16 and f16 rounding ties and one ulp off them.
std::vector<float> gemm1_values(int64_t n, std::mt19937& rng) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> special = {
      std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
      bits_float(0x7f800001u),  // a signalling NaN
      inf, -inf, 0.0f, -0.0f, 1e-40f, -1e-40f, 3e38f, -3e38f, 90.0f, -90.0f, 110.0f, -110.0f,
      bits_float(0x3f808000u),  // a bf16 tie (even below)
      bits_float(0x3f818000u),  // a bf16 tie (odd below)
      bits_float(0x3f801000u),  // an f16 tie
      bits_float(0x3f803000u), bits_float(0x3f807fffu), bits_float(0x3f808001u), 65520.0f,
      -65519.0f, 6e-8f, 3e-8f};
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f), exponent(-30.0f, 8.0f);
  std::uniform_int_distribution<int> pick(0, 9);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) {
    if (pick(rng) == 0) {
      x = special[std::uniform_int_distribution<size_t>(0, special.size() - 1)(rng)];
    } else {
      x = mantissa(rng) * std::exp2(exponent(rng)) * (pick(rng) < 5 ? -1.0f : 1.0f);
      if (pick(rng) == 0) x = std::round(x * 4.0f) / 4.0f;  // small exact values too
    }
  }
  return v;
}

class ActivationRowTest : public ::testing::TestWithParam<IsaLevel> {};

TEST_P(ActivationRowTest, GivesTheReferenceBitsForEverySpecAndBlock) {
  const ActivationFn row = activation_kernel(GetParam());
  std::mt19937 rng(7);
  const int64_t inter = 72, rows = 3, ldin = 2 * inter + 5, ldout = inter + 3;
  const float sentinel = bits_float(0x7fc0dead);
  for (const Case& c : cases()) {
    const int64_t align = activation_column_align(c.spec);
    for (int64_t col0 : {int64_t{0}, align, 3 * align}) {
      for (int64_t cols = 1; col0 + cols <= inter; cols += c.spec.gated ? 5 : 3) {
        if (align > 1 && cols % align != 0 && col0 + cols != inter) continue;
        const std::vector<float> in = gemm1_values(rows * ldin, rng);
        std::vector<float> want(static_cast<size_t>(rows * ldout), sentinel), got = want;
        apply_activation_block(c.spec, in.data(), ldin, want.data() + col0, ldout, rows, inter,
                               col0, cols);
        row(c.spec, in.data(), ldin, got.data() + col0, ldout, rows, inter, col0, cols);
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_TRUE(float_bits(got[i]) == float_bits(want[i]) ||
                      (std::isnan(got[i]) && std::isnan(want[i]) && got[i] != sentinel))
              << c.name << ", columns " << col0 << "+" << cols << ", row " << i / ldout
              << ", column " << i % ldout << ": " << got[i] << " against " << want[i];
      }
    }
  }
}

TEST_P(ActivationRowTest, LeavesEverythingOutsideTheBlockAlone) {
  const ActivationFn row = activation_kernel(GetParam());
  std::mt19937 rng(11);
  ActivationSpec spec;
  spec.round_dtype = DType::kBF16;
  const int64_t inter = 40, ldout = inter;
  const std::vector<float> in = gemm1_values(2 * inter, rng);
  std::vector<float> out(static_cast<size_t>(ldout), -7.0f);
  row(spec, in.data(), 2 * inter, out.data() + 9, ldout, 1, inter, 9, 17);
  for (int64_t i = 0; i < ldout; ++i)
    if (i < 9 || i >= 26) EXPECT_EQ(out[static_cast<size_t>(i)], -7.0f) << "column " << i;
}

INSTANTIATE_TEST_SUITE_P(Levels, ActivationRowTest, ::testing::ValuesIn(available_isa_levels()),
                         [](const auto& info) { return std::string(isa_level_name(info.param)); });

TEST(ActivationRows, EachLevelTakesItsOwnRow) {
  for (IsaLevel level : available_isa_levels()) {
    const ActivationFn row = activation_kernel(level);
    if (level < IsaLevel::kAvx2)
      EXPECT_EQ(row, &apply_activation_block) << isa_level_name(level);
    else
      EXPECT_NE(row, &apply_activation_block) << isa_level_name(level);
  }
}

}  // namespace
}  // namespace moecore
