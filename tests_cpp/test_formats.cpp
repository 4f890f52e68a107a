// The formats layer (formats/fp8.h, e8m0.h, fp4.h, quantize.h, layout.h): every fp8/e8m0/e2m1 code
// against the formats' defining formulas, saturation and tie cases, nibble order, hand-computed
// NVFP4/MXFP4/FP8 blocks, thread-count invariance, every layout against an independent index
// loop and back, and the typed errors. The numpy twins and ml_dtypes check the rest (tests_py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/core/thread_pool.h"
#include "moecore/formats/e8m0.h"
#include "moecore/formats/fp4.h"
#include "moecore/formats/fp8.h"
#include "moecore/formats/layout.h"
#include "moecore/formats/quantize.h"

namespace moecore {
namespace {

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

/// A Tensor holding `values` (f32) with `shape`.
Tensor f32_tensor(const std::vector<float>& values, const std::vector<int64_t>& shape) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  EXPECT_EQ(static_cast<int64_t>(values.size()), t.numel());
  std::memcpy(t.ptr<float>(), values.data(), values.size() * 4);
  return t;
}

std::vector<float> random_values(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const uint8_t* p = t.ptr<uint8_t>();
  return std::vector<uint8_t>(p, p + t.numel() * dtype_size(t.dtype()));
}

/// Value of a minifloat code from the format definition (sign, exponent, mantissa, bias).
double minifloat_value(int code, int exp_bits, int mant_bits, int bias) {
  const int sign = code >> (exp_bits + mant_bits);
  const int e = (code >> mant_bits) & ((1 << exp_bits) - 1);
  const int m = code & ((1 << mant_bits) - 1);
  const double frac = static_cast<double>(m) / (1 << mant_bits);
  const double v = e == 0 ? std::ldexp(frac, 1 - bias) : std::ldexp(1.0 + frac, e - bias);
  return sign ? -v : v;
}

// ------------------------------------------------------------------------------------------------
// Codecs.

TEST(FormatsCodecTest, EveryE4M3CodeDecodesAndRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const float v = fp8_e4m3_to_f32(static_cast<uint8_t>(c));
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v)) << c;
      EXPECT_EQ(f32_to_fp8_e4m3(v), c) << "NaN keeps its sign";
      continue;
    }
    EXPECT_EQ(static_cast<double>(v), minifloat_value(c, 4, 3, 7)) << c;
    EXPECT_EQ(f32_to_fp8_e4m3(v), c) << c;
    EXPECT_EQ(fp8_e4m3_table()[c], v) << c;
  }
}

TEST(FormatsCodecTest, EveryE5M2CodeDecodesAndRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const float v = fp8_e5m2_to_f32(static_cast<uint8_t>(c));
    const int mag = c & 0x7f;
    if (mag >= 0x7c) {
      if (mag == 0x7c) {
        EXPECT_EQ(v, (c & 0x80) ? -kInf : kInf) << c;
      } else {
        EXPECT_TRUE(std::isnan(v)) << c;
      }
      continue;
    }
    EXPECT_EQ(static_cast<double>(v), minifloat_value(c, 5, 2, 15)) << c;
    EXPECT_EQ(f32_to_fp8_e5m2(v), c) << c;
  }
}

TEST(FormatsCodecTest, Fp8TiesRoundToEvenCodes) {
  // The midpoint between consecutive finite codes goes to the even code (RNE); just above it,
  // to the upper code. Covers subnormal, normal and exponent-boundary midpoints.
  for (int c = 0; c < 0x7e; ++c) {
    const double lo = minifloat_value(c, 4, 3, 7), hi = minifloat_value(c + 1, 4, 3, 7);
    const float mid = static_cast<float>((lo + hi) / 2);  // exact: few significant bits
    EXPECT_EQ(f32_to_fp8_e4m3(mid), (c % 2 == 0) ? c : c + 1) << c;
    EXPECT_EQ(f32_to_fp8_e4m3(-mid), 0x80 | ((c % 2 == 0) ? c : c + 1)) << c;
    EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(mid, kInf)), c + 1) << c;
    EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(mid, 0.0f)), c) << c;
  }
  for (int c = 0; c < 0x7b; ++c) {
    const double lo = minifloat_value(c, 5, 2, 15), hi = minifloat_value(c + 1, 5, 2, 15);
    const float mid = static_cast<float>((lo + hi) / 2);
    EXPECT_EQ(f32_to_fp8_e5m2(mid), (c % 2 == 0) ? c : c + 1) << c;
    EXPECT_EQ(f32_to_fp8_e5m2(std::nextafter(mid, kInf)), c + 1) << c;
  }
}

TEST(FormatsCodecTest, Fp8SaturatesInsteadOfOverflowing) {
  EXPECT_EQ(f32_to_fp8_e4m3(447.0f), 0x7e);  // rounds up to 448
  EXPECT_EQ(f32_to_fp8_e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(449.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(464.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(465.0f), 0x7e);  // ml_dtypes: NaN
  EXPECT_EQ(f32_to_fp8_e4m3(1e30f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(kInf), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(-kInf), 0xfe);
  EXPECT_EQ(f32_to_fp8_e4m3(-465.0f), 0xfe);
  EXPECT_EQ(f32_to_fp8_e4m3(kNaN), 0x7f);
  EXPECT_EQ(f32_to_fp8_e4m3(-kNaN), 0xff);
  EXPECT_EQ(f32_to_fp8_e5m2(61440.0f), 0x7b);  // ml_dtypes: inf
  EXPECT_EQ(f32_to_fp8_e5m2(kInf), 0x7b);
  EXPECT_EQ(f32_to_fp8_e5m2(-kInf), 0xfb);
  EXPECT_EQ(f32_to_fp8_e5m2(kNaN), 0x7e);
  // Below the smallest subnormal's half: zero with sign.
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(1.0f, -11)), 0x00);
  EXPECT_EQ(f32_to_fp8_e4m3(-std::ldexp(1.0f, -11)), 0x80);
  EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
}

TEST(FormatsCodecTest, E8M0EveryCodeAndPowersOfTwo) {
  for (int c = 0; c < 255; ++c) {
    const float v = e8m0_to_f32(static_cast<uint8_t>(c));
    EXPECT_EQ(static_cast<double>(v), std::ldexp(1.0, c - 127)) << c;
    uint8_t back = 0;
    ASSERT_TRUE(e8m0_from_pow2(v, &back)) << c;
    EXPECT_EQ(back, c);
  }
  EXPECT_TRUE(std::isnan(e8m0_to_f32(0xff)));
  EXPECT_EQ(float_bits(e8m0_to_f32(0x00)), 0x00400000u);  // 2^-127 is an fp32 subnormal
  uint8_t code = 0;
  for (float bad :
       {0.0f, -1.0f, 3.0f, 1.5f, kInf, kNaN, std::ldexp(1.0f, -128), std::ldexp(1.0f, -149)})
    EXPECT_FALSE(e8m0_from_pow2(bad, &code)) << bad;
}

TEST(FormatsCodecTest, CeilAndFloorLog2AreExact) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits(1, 0x7f7fffffu);
  for (int i = 0; i < 100000; ++i) {
    const float s = bits_float(bits(rng));
    const int c = ceil_log2(s), f = floor_log2(s);
    // 2^f ≤ s < 2^(f+1) and 2^(c−1) < s ≤ 2^c, checked in double (exact for these ranges).
    EXPECT_LE(std::ldexp(1.0, f), static_cast<double>(s));
    EXPECT_GT(std::ldexp(1.0, f + 1), static_cast<double>(s));
    EXPECT_GE(std::ldexp(1.0, c), static_cast<double>(s));
    EXPECT_LT(std::ldexp(1.0, c - 1), static_cast<double>(s));
  }
  EXPECT_EQ(ceil_log2(1.0f), 0);
  EXPECT_EQ(ceil_log2(std::nextafter(1.0f, 2.0f)), 1);  // mantissa ≠ 0 → exponent + 1
  EXPECT_EQ(floor_log2(std::ldexp(1.0f, -149)), -149);
  EXPECT_EQ(ceil_log2(std::ldexp(3.0f, -149)), -147);
}

TEST(FormatsCodecTest, E2M1RoundHalfToEvenAndSaturation) {
  const float values[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) {
    const float v = e2m1_to_f32(static_cast<uint8_t>(c));
    EXPECT_EQ(v, (c & 8) ? -values[c & 7] : values[c & 7]) << c;
    EXPECT_EQ(std::signbit(v), (c & 8) != 0) << c;
    EXPECT_EQ(f32_to_e2m1_rne(v), c) << c;
  }
  // Midpoints (spec §7.2): 0.25→0, 0.75→1, 1.25→1, 1.75→2, 2.5→2, 3.5→4, 5→4.
  const float mids[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const uint8_t expect[7] = {0, 2, 2, 4, 4, 6, 6};
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(f32_to_e2m1_rne(mids[i]), expect[i]) << mids[i];
    EXPECT_EQ(f32_to_e2m1_rne(-mids[i]), 8 | expect[i]) << mids[i];
    EXPECT_EQ(f32_to_e2m1_rne(std::nextafter(mids[i], kInf)), i + 1) << mids[i];
  }
  EXPECT_EQ(f32_to_e2m1_rne(5.01f), 7);
  EXPECT_EQ(f32_to_e2m1_rne(100.0f), 7);
  EXPECT_EQ(f32_to_e2m1_rne(kInf), 7);
  EXPECT_EQ(f32_to_e2m1_rne(-kInf), 15);
  EXPECT_EQ(f32_to_e2m1_rne(-0.1f), 8);  // sign kept on a value rounding to zero
  EXPECT_EQ(f32_to_e2m1_rne(0.0f), 0);
  EXPECT_EQ(f32_to_e2m1_rne(kNaN), 7);
}

TEST(FormatsCodecTest, E2M1TiesDownRuleOfSglangMxfp4) {
  const float mids[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(f32_to_e2m1_ties_down(mids[i]), i) << "ties round down: " << mids[i];
    EXPECT_EQ(f32_to_e2m1_ties_down(-mids[i]), 8 | i) << mids[i];
    EXPECT_EQ(f32_to_e2m1_ties_down(std::nextafter(mids[i], kInf)), i + 1) << mids[i];
  }
  EXPECT_EQ(f32_to_e2m1_ties_down(0.0f), 8) << "sign(0) = 0 gives sign bit 1 in sglang's rule";
  EXPECT_EQ(f32_to_e2m1_ties_down(-0.0f), 8);
  EXPECT_EQ(f32_to_e2m1_ties_down(0.1f), 0);
  EXPECT_EQ(f32_to_e2m1_ties_down(6.0f), 7);
  EXPECT_EQ(f32_to_e2m1_ties_down(9.0f), 7);
}

TEST(FormatsCodecTest, NibbleOrderIsLowFirst) {
  EXPECT_EQ(pack_e2m1x2(0x1, 0xa), 0xa1);
  EXPECT_EQ(e2m1x2_lo(0xa1), 0x1);
  EXPECT_EQ(e2m1x2_hi(0xa1), 0xa);
  Tensor x = f32_tensor({0.5f, -1.0f, 6.0f, 0.0f}, {1, 4});
  Tensor packed = encode_e2m1(x.view());
  EXPECT_EQ(bytes_of(packed), (std::vector<uint8_t>{0xa1, 0x07}));
  Tensor nibbles = unpack_e2m1(packed.view());
  EXPECT_EQ(bytes_of(nibbles), (std::vector<uint8_t>{0x1, 0xa, 0x7, 0x0}));
  EXPECT_EQ(bytes_of(pack_e2m1(nibbles.view())), bytes_of(packed));
}

// ------------------------------------------------------------------------------------------------
// Quantizers.

TEST(FormatsQuantizeTest, Nvfp4HandComputedBlock) {
  // gs = 1, vmax = 6: s = 6 · fp32(1/6) rounds to exactly 1.0 (code 0x38), inv = 1, so the codes
  // are the RNE E2M1 codes of x itself, midpoints included.
  const std::vector<float> x = {6,  5,  3.5f,  2.5f,  1.75f,  1.25f,  0.75f,  0.25f,
                                -6, -5, -3.5f, -2.5f, -1.75f, -1.25f, -0.75f, -0.1f};
  QuantizedTensor q = quantize_nvfp4(f32_tensor(x, {1, 16}).view(), 1.0f);
  EXPECT_EQ(q.q.dtype(), DType::kFp4E2M1x2);
  EXPECT_EQ(q.scale.dtype(), DType::kF8E4M3);
  EXPECT_EQ(bytes_of(q.scale), std::vector<uint8_t>{0x38});
  EXPECT_EQ(bytes_of(q.q), (std::vector<uint8_t>{0x67, 0x46, 0x24, 0x02, 0xef, 0xce, 0xac, 0x8a}));
  Tensor back = dequantize_nvfp4(q.q.view(), q.scale.view(), 1.0f);
  const std::vector<float> expect = {6, 4, 4, 2, 2, 1, 1, 0, -6, -4, -4, -2, -2, -1, -1, -0.0f};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(back.ptr<float>()[i], expect[i]) << i;
}

TEST(FormatsQuantizeTest, Nvfp4FollowsTheKernelRoundingOrder) {
  // Random rows with a non-trivial gs: each block must equal the formula written out here.
  const std::vector<float> x = random_values(4 * 64, 3, 2.0f);
  const float gs = 448.0f * 6.0f / 7.3f;
  QuantizedTensor q = quantize_nvfp4(f32_tensor(x, {4, 64}).view(), gs);
  for (int64_t b = 0; b < 16; ++b) {
    float vmax = 0;
    for (int i = 0; i < 16; ++i) vmax = std::max(vmax, std::fabs(x[b * 16 + i]));
    const float s = std::min(gs * (vmax * (1.0f / 6.0f)), 448.0f);
    const uint8_t code = f32_to_fp8_e4m3(s);
    ASSERT_EQ(q.scale.ptr<uint8_t>()[b], code) << b;
    const float s8 = fp8_e4m3_to_f32(code);
    const float inv = s8 != 0 ? 1.0f / (s8 * (1.0f / gs)) : 0.0f;
    for (int i = 0; i < 16; ++i) {
      const float y = std::min(std::max(x[b * 16 + i] * inv, -6.0f), 6.0f);
      const uint8_t byte = q.q.ptr<uint8_t>()[(b * 16 + i) / 2];
      EXPECT_EQ(i % 2 ? e2m1x2_hi(byte) : e2m1x2_lo(byte), f32_to_e2m1_rne(y)) << b << " " << i;
    }
  }
}

TEST(FormatsQuantizeTest, Mxfp4SglangCeilHandComputed) {
  std::vector<float> x(96, 0.0f);
  // Block 0: amax 6 → descale 1 → E = 0 (byte 127); ties round down.
  const float b0[11] = {6, 5, 3.5f, 2.5f, 1.75f, 1.25f, 0.75f, 0.25f, 0.0f, -0.0f, -0.3f};
  for (int i = 0; i < 11; ++i) x[i] = b0[i];
  // Block 1: amax 7 → descale 7/6 → E = 1 (byte 128): 7/2 = 3.5 → 3 (ties down).
  x[32] = 7.0f;
  x[33] = -1.0f;  // −0.5 → tie → 0.5 (code 9)
  // Block 2: all zero → E = −127 (byte 0), every code 0x8 (sglang's sign(0) quirk).
  QuantizedTensor q = quantize_mxfp4(f32_tensor(x, {1, 96}).view(), Mxfp4Rounding::kSglangCeil);
  EXPECT_EQ(bytes_of(q.scale), (std::vector<uint8_t>{127, 128, 0}));
  const uint8_t codes0[11] = {7, 6, 5, 4, 3, 2, 1, 0, 8, 8, 9};
  Tensor nibbles = unpack_e2m1(q.q.view());
  for (int i = 0; i < 11; ++i) EXPECT_EQ(nibbles.ptr<uint8_t>()[i], codes0[i]) << i;
  for (int i = 11; i < 32; ++i) EXPECT_EQ(nibbles.ptr<uint8_t>()[i], 8) << i;
  EXPECT_EQ(nibbles.ptr<uint8_t>()[32], 5);
  EXPECT_EQ(nibbles.ptr<uint8_t>()[33], 9);
  for (int i = 64; i < 96; ++i) EXPECT_EQ(nibbles.ptr<uint8_t>()[i], 8) << i;
}

TEST(FormatsQuantizeTest, Mxfp4OcpFloorHandComputed) {
  std::vector<float> x(96, 0.0f);
  const float b0[9] = {6, 5, 3.5f, 2.5f, 1.75f, 1.25f, 0.75f, 0.25f, -0.0f};
  for (int i = 0; i < 9; ++i) x[i] = b0[i];
  x[32] = 7.0f;   // floor(log2 7) − 2 = 0: 7 saturates to 6
  x[33] = -5.0f;  // tie → 4
  x[64] = 8.0f;   // floor(log2 8) − 2 = 1: 8/2 = 4
  x[65] = 0.75f;  // 0.375 → 0.5 (code 1)
  QuantizedTensor q = quantize_mxfp4(f32_tensor(x, {1, 96}).view(), Mxfp4Rounding::kOcpFloor);
  EXPECT_EQ(bytes_of(q.scale), (std::vector<uint8_t>{127, 127, 128}));
  Tensor n = unpack_e2m1(q.q.view());
  const uint8_t codes0[9] = {7, 6, 6, 4, 4, 2, 2, 0, 8};
  for (int i = 0; i < 9; ++i) EXPECT_EQ(n.ptr<uint8_t>()[i], codes0[i]) << i;
  EXPECT_EQ(n.ptr<uint8_t>()[32], 7);
  EXPECT_EQ(n.ptr<uint8_t>()[33], 14);
  EXPECT_EQ(n.ptr<uint8_t>()[64], 6);
  EXPECT_EQ(n.ptr<uint8_t>()[65], 1);
  Tensor zero = f32_tensor(std::vector<float>(32, 0.0f), {32});
  EXPECT_EQ(bytes_of(quantize_mxfp4(zero.view(), Mxfp4Rounding::kOcpFloor).scale),
            std::vector<uint8_t>{0});
}

TEST(FormatsQuantizeTest, Mxfp4DequantIsExact) {
  const std::vector<float> x = random_values(8 * 64, 11, 3.0f);
  for (Mxfp4Rounding r : {Mxfp4Rounding::kSglangCeil, Mxfp4Rounding::kOcpFloor}) {
    QuantizedTensor q = quantize_mxfp4(f32_tensor(x, {8, 64}).view(), r);
    Tensor back = dequantize_mxfp4(q.q.view(), q.scale.view());
    Tensor codes = unpack_e2m1(q.q.view());
    for (int64_t i = 0; i < 8 * 64; ++i) {
      const float expect = e2m1_to_f32(codes.ptr<uint8_t>()[i]) *
                           std::ldexp(1.0f, q.scale.ptr<uint8_t>()[i / 32] - 127);
      EXPECT_EQ(float_bits(back.ptr<float>()[i]), float_bits(expect)) << i;
    }
  }
}

TEST(FormatsQuantizeTest, Fp8PerTokenGroupAndUe8m0) {
  // Row 0 has amax 448 → s = 1 exactly, so q holds the E4M3 codes of x.
  std::vector<float> x = random_values(2 * 256, 5, 40.0f);
  x[7] = 448.0f;
  x[128] = -448.0f;
  QuantizedTensor q = quantize_fp8_per_token_group(f32_tensor(x, {2, 256}).view(), 128);
  ASSERT_EQ(q.scale.view().shape_vector(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(q.scale.ptr<float>()[0], 1.0f);
  EXPECT_EQ(q.scale.ptr<float>()[1], 1.0f);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(q.q.ptr<uint8_t>()[i], f32_to_fp8_e4m3(x[i])) << i;
  QuantizedTensor u =
      quantize_fp8_per_token_group(f32_tensor(x, {2, 256}).view(), 128, kDefaultMinAmax, true);
  for (int g = 0; g < 4; ++g) {
    const float s = u.scale.ptr<float>()[g];
    EXPECT_EQ(float_bits(s) & 0x7fffffu, 0u) << "power of two";
    EXPECT_GE(s, q.scale.ptr<float>()[g]);
    EXPECT_LT(s, 2 * q.scale.ptr<float>()[g]);
  }
  // All-zero group: s = eps / 448.
  Tensor zeros = f32_tensor(std::vector<float>(128, 0.0f), {1, 128});
  EXPECT_EQ(quantize_fp8_per_token_group(zeros.view()).scale.ptr<float>()[0], 1e-10f / 448.0f);
}

TEST(FormatsQuantizeTest, Fp8BlockHandlesPartialEdgeTiles) {
  const int64_t n = 130, k = 200;
  const std::vector<float> w = random_values(2 * n * k, 9);
  QuantizedTensor q = quantize_fp8_block(f32_tensor(w, {2, n, k}).view(), 128, 128);
  ASSERT_EQ(q.scale.view().shape_vector(), (std::vector<int64_t>{2, 2, 2}));
  for (int64_t e = 0; e < 2; ++e)
    for (int64_t bn = 0; bn < 2; ++bn)
      for (int64_t bk = 0; bk < 2; ++bk) {
        float amax = 0;
        for (int64_t r = bn * 128; r < std::min(n, bn * 128 + 128); ++r)
          for (int64_t c = bk * 128; c < std::min(k, bk * 128 + 128); ++c)
            amax = std::max(amax, std::fabs(w[(e * n + r) * k + c]));
        EXPECT_EQ(q.scale.ptr<float>()[(e * 2 + bn) * 2 + bk], amax / 448.0f);
      }
  Tensor back = dequantize_fp8_block(q.q.view(), q.scale.view(), 128, 128);
  for (int64_t i = 0; i < 2 * n * k; ++i) {
    const int64_t e = i / (n * k), r = (i / k) % n, c = i % k;
    const float s = q.scale.ptr<float>()[(e * 2 + r / 128) * 2 + c / 128];
    ASSERT_EQ(back.ptr<float>()[i], fp8_e4m3_to_f32(q.q.ptr<uint8_t>()[i]) * s) << i;
  }
}

TEST(FormatsQuantizeTest, Int8PerTokenRoundsHalfAwayFromZero) {
  // sglang's per_token_quant_int8 (libdevice.round); amax 127 → multiplier 1: x = 2.5 → 3,
  // 3.5 → 4, −2.5 → −3 (round-half-even would give 2 and −2).
  Tensor x = f32_tensor({127.0f, 2.5f, 3.5f, -2.5f, -127.0f, 0.4f}, {1, 6});
  QuantizedTensor q = quantize_int8_per_token(x.view());
  EXPECT_EQ(q.scale.ptr<float>()[0], 1.0f);
  const int8_t expect[6] = {127, 3, 4, -3, -127, 0};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(static_cast<int8_t>(q.q.ptr<uint8_t>()[i]), expect[i]);
  Tensor back = dequantize_int8_per_row(q.q.view(), q.scale.view());
  EXPECT_EQ(back.ptr<float>()[2], 4.0f);
}

TEST(FormatsQuantizeTest, ResultsDoNotDependOnThreadCount) {
  ThreadPool& pool = ThreadPool::instance();
  const int saved = pool.num_threads();
  const std::vector<float> x = random_values(37 * 256, 21, 3.0f);
  Tensor t = f32_tensor(x, {37, 256});
  auto run = [&] {
    std::vector<std::vector<uint8_t>> out;
    for (const QuantizedTensor& q :
         {quantize_nvfp4(t.view(), 123.0f), quantize_mxfp4(t.view()),
          quantize_fp8_per_token_group(t.view()), quantize_fp8_block(t.view(), 16, 48),
          quantize_fp8_per_tensor(t.view()), quantize_int8_per_channel(t.view())}) {
      out.push_back(bytes_of(q.q));
      out.push_back(bytes_of(q.scale));
    }
    out.push_back(bytes_of(swizzle_nvfp4_scales(quantize_nvfp4(t.view(), 1.0f).scale.view())));
    return out;
  };
  pool.set_num_threads(1);
  const auto one = run();
  pool.set_num_threads(3);
  const auto three = run();
  pool.set_num_threads(saved);
  EXPECT_EQ(one, three);
}

TEST(FormatsQuantizeTest, RejectsBadInputWithTypedErrors) {
  Tensor x = f32_tensor(random_values(64, 1), {2, 32});
  Tensor odd = f32_tensor(random_values(40, 1), {2, 20});
  EXPECT_THROW(quantize_nvfp4(odd.view(), 1.0f), InvalidArgument);  // K % 16
  EXPECT_THROW(quantize_mxfp4(odd.view()), InvalidArgument);        // K % 32
  EXPECT_THROW(quantize_fp8_per_token_group(odd.view(), 128), InvalidArgument);
  EXPECT_THROW(quantize_nvfp4(x.view(), 0.0f), InvalidArgument);
  EXPECT_THROW(quantize_nvfp4(x.view(), -1.0f), InvalidArgument);
  EXPECT_THROW(quantize_nvfp4(x.view(), kNaN), InvalidArgument);
  EXPECT_THROW(quantize_nvfp4(x.view(), kInf), InvalidArgument);
  EXPECT_THROW(quantize_fp8_static(x.view(), 0.0f), InvalidArgument);
  EXPECT_THROW(quantize_fp8_per_token(x.view(), 0.0f), InvalidArgument);  // eps
  std::vector<float> with_nan = random_values(64, 1);
  with_nan[37] = kNaN;
  try {
    quantize_mxfp4(f32_tensor(with_nan, {2, 32}).view());
    ADD_FAILURE() << "NaN input accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("row 1 column 5"), std::string::npos) << e.what();
  }
  Tensor codes = Tensor::zeros({2, 16}, DType::kU8);
  EXPECT_THROW(quantize_mxfp4(codes.view()), DTypeError);
  Tensor e8 = Tensor::zeros({2, 1}, DType::kE8M0);
  e8.ptr<uint8_t>()[1] = 0xff;
  EXPECT_THROW(dequantize_mxfp4(codes.view(), e8.view()), InvalidArgument);
  EXPECT_THROW(e8m0_to_scales(e8.view()), InvalidArgument);
  Tensor not_pow2 = f32_tensor({3.0f}, {1});
  EXPECT_THROW(scales_to_e8m0(not_pow2.view()), InvalidArgument);
  EXPECT_THROW(parse_mxfp4_rounding("nearest"), InvalidArgument);
  EXPECT_THROW(dequantize_fp8_block(encode_fp8(x.view(), DType::kF8E4M3).view(),
                                    f32_tensor({1.0f}, {1, 1}).view(), 1, 32),
               InvalidArgument);  // scale shape [2, 1] expected
}

// ------------------------------------------------------------------------------------------------
// Layouts.

Tensor iota_tensor(const std::vector<int64_t>& shape) {
  Tensor t = Tensor::empty(shape, DType::kI32);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<int32_t>()[i] = static_cast<int32_t>(i + 1);
  return t;
}

TEST(FormatsLayoutTest, SwizzleMatchesTheReshapePermuteOfSglang) {
  const int64_t b = 2, m = 130, kb = 7, mp = 256, kbp = 8;
  Tensor in = iota_tensor({b, m, kb});
  Tensor sw = swizzle_nvfp4_scales(in.view());
  ASSERT_EQ(sw.view().shape_vector(), (std::vector<int64_t>{b, mp, kbp}));
  // Output order of reshape(B, Mp/128, 4, 32, Kbp/4, 4).permute(0, 1, 4, 3, 2, 5).
  int64_t o = 0;
  for (int64_t g = 0; g < b; ++g)
    for (int64_t mt = 0; mt < mp / 128; ++mt)
      for (int64_t kt = 0; kt < kbp / 4; ++kt)
        for (int64_t j = 0; j < 32; ++j)
          for (int64_t i = 0; i < 4; ++i)
            for (int64_t c = 0; c < 4; ++c, ++o) {
              const int64_t row = mt * 128 + i * 32 + j, col = kt * 4 + c;
              const int32_t expect =
                  (row < m && col < kb) ? in.ptr<int32_t>()[(g * m + row) * kb + col] : 0;
              ASSERT_EQ(sw.ptr<int32_t>()[o], expect) << g << " " << row << " " << col;
              if (row < m && col < kb) {
                ASSERT_EQ(nvfp4_swizzled_offset(row, col, kbp) + g * mp * kbp, o);
              }
            }
  Tensor back = unswizzle_nvfp4_scales(sw.view(), m, kb);
  EXPECT_EQ(bytes_of(back), bytes_of(in));
  EXPECT_THROW(unswizzle_nvfp4_scales(sw.view(), 100, kb), InvalidArgument);
}

TEST(FormatsLayoutTest, MmaViewIsTheSameBytes) {
  Tensor in = iota_tensor({3, 200, 9});
  Tensor sw = swizzle_nvfp4_scales(in.view());
  TensorView mma = nvfp4_scales_mma_view(sw.view());
  ASSERT_EQ(mma.data, sw.view().data);
  ASSERT_EQ(mma.shape_vector(), (std::vector<int64_t>{32, 4, 2, 4, 3, 3}));
  for (int64_t g = 0; g < 3; ++g)
    for (int64_t m = 0; m < 200; ++m)
      for (int64_t k = 0; k < 9; ++k) {
        const int32_t v =
            *static_cast<int32_t*>(mma.at({m % 32, (m % 128) / 32, m / 128, k % 4, k / 4, g}));
        ASSERT_EQ(v, in.ptr<int32_t>()[(g * 200 + m) * 9 + k]);
        ASSERT_EQ(sw.ptr<int32_t>()[nvfp4_mma_offset(m % 32, (m % 128) / 32, m / 128, k % 4, k / 4,
                                                     g, 2, 3)],
                  v);
      }
  TensorView back = nvfp4_scales_from_mma_view(mma);
  EXPECT_EQ(back.shape_vector(), sw.view().shape_vector());
  EXPECT_EQ(back.data, sw.view().data);
  TensorView wrong = mma;
  wrong.strides[0] = 1;
  EXPECT_THROW(nvfp4_scales_from_mma_view(wrong), InvalidArgument);
}

TEST(FormatsLayoutTest, W13HalvesInterleaveAndSglangErrors) {
  Tensor t = iota_tensor({2, 256, 3});
  Tensor il = interleave_w13_halves(t.view(), 64, 1);
  // Chunks along dim 1: A0 B0 A1 B1 with A = rows 0..127, B = rows 128..255.
  for (int64_t e = 0; e < 2; ++e)
    for (int64_t o = 0; o < 256; ++o) {
      const int64_t chunk = o / 64, src = (chunk % 2) * 128 + (chunk / 2) * 64 + o % 64;
      for (int64_t h = 0; h < 3; ++h)
        ASSERT_EQ(il.ptr<int32_t>()[(e * 256 + o) * 3 + h],
                  t.ptr<int32_t>()[(e * 256 + src) * 3 + h]);
    }
  EXPECT_EQ(bytes_of(deinterleave_w13_halves(il.view(), 64, 1)), bytes_of(t));
  Tensor odd = iota_tensor({1, 129, 2});
  try {
    interleave_w13_halves(odd.view());
    ADD_FAILURE();
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "Expected even size on interleave dimension for W13 half split.");
  }
  Tensor not_div = iota_tensor({1, 192, 2});
  try {
    interleave_w13_halves(not_div.view(), 64, 1);
    ADD_FAILURE();
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "Expected split dim divisible by group_size=64, got 96.");
  }
}

TEST(FormatsLayoutTest, GateUpOrderPaddingRoundTrip) {
  Tensor t = iota_tensor({2, 10, 4});
  EXPECT_EQ(bytes_of(swap_w13_halves(swap_w13_halves(t.view()).view())), bytes_of(t));
  Tensor halves = deinterleave_gate_up_rows(t.view());
  EXPECT_EQ(halves.ptr<int32_t>()[4], t.ptr<int32_t>()[8]);   // row 1 ← row 2 (g1)
  EXPECT_EQ(halves.ptr<int32_t>()[20], t.ptr<int32_t>()[4]);  // row 5 ← row 1 (u0)
  EXPECT_EQ(bytes_of(interleave_gate_up_rows(halves.view())), bytes_of(t));
  Tensor padded = pad_w13_intermediate(t.view(), 8, true, 1);
  ASSERT_EQ(padded.view().shape_vector(), (std::vector<int64_t>{2, 16, 4}));
  EXPECT_EQ(padded.ptr<int32_t>()[5 * 4], 0);                        // gate padding
  EXPECT_EQ(padded.ptr<int32_t>()[8 * 4], t.ptr<int32_t>()[5 * 4]);  // up half starts at 8
  EXPECT_EQ(bytes_of(unpad_w13_intermediate(padded.view(), 5, true, 1)), bytes_of(t));
  Tensor cols = pad_dim(t.view(), -1, 7);
  EXPECT_EQ(bytes_of(unpad_dim(cols.view(), -1, 4)), bytes_of(t));
  EXPECT_THROW(pad_dim(t.view(), 2, 3), InvalidArgument);
  EXPECT_THROW(swap_w13_halves(iota_tensor({3, 3}).view(), 0), InvalidArgument);
}

TEST(FormatsLayoutTest, Sm90WeightInterleaveIsABijectionWithInverse) {
  Tensor w = Tensor::empty({2, 32, 64}, DType::kU8);
  std::mt19937 rng(5);
  for (int64_t i = 0; i < w.numel(); ++i) w.ptr<uint8_t>()[i] = static_cast<uint8_t>(rng());
  Tensor il = interleave_moe_weights_for_sm90_mixed_gemm(w.view());
  EXPECT_NE(bytes_of(il), bytes_of(w));
  EXPECT_EQ(bytes_of(deinterleave_moe_weights_for_sm90_mixed_gemm(il.view())), bytes_of(w));
  // One set bit moves to exactly one bit: the low nibble's sign bit (bit 3) of byte (0, 0) lands
  // at bit 15 of the word at (0, 0), i.e. bit 7 of byte 1.
  Tensor one = Tensor::zeros({1, 16, 32}, DType::kU8);
  one.ptr<uint8_t>()[0] = 0x08;
  Tensor moved = interleave_moe_weights_for_sm90_mixed_gemm(one.view());
  for (int64_t i = 0; i < moved.numel(); ++i)
    EXPECT_EQ(moved.ptr<uint8_t>()[i], i == 1 ? 0x80 : 0) << i;
  EXPECT_THROW(
      interleave_moe_weights_for_sm90_mixed_gemm(Tensor::zeros({1, 8, 32}, DType::kU8).view()),
      InvalidArgument);
  EXPECT_THROW(interleave_moe_weights_for_sm90_mixed_gemm(w.view(), "int4"), Unsupported);
}

TEST(FormatsLayoutTest, Sm90ScaleFoldRoundTrip) {
  Tensor s = Tensor::empty({2, 128, 8}, DType::kU8);
  for (int64_t i = 0; i < s.numel(); ++i) s.ptr<uint8_t>()[i] = static_cast<uint8_t>(i * 7 + 3);
  Tensor f = interleave_moe_scales_for_sm90_mixed_gemm(s.view(), 32);
  ASSERT_EQ(f.view().shape_vector(), (std::vector<int64_t>{2, 2, 2, 16, 16}));
  // [e, a, kb, f, s·4 + g] ← [e, a·64 + s·16 + f, kb·4 + g]
  EXPECT_EQ(f.ptr<uint8_t>()[((((1 * 2 + 1) * 2 + 1) * 16 + 5) * 16) + 2 * 4 + 3],
            s.ptr<uint8_t>()[(1 * 128 + 64 + 2 * 16 + 5) * 8 + 1 * 4 + 3]);
  EXPECT_EQ(bytes_of(deinterleave_moe_scales_for_sm90_mixed_gemm(f.view(), 32)), bytes_of(s));
  EXPECT_THROW(
      interleave_moe_scales_for_sm90_mixed_gemm(Tensor::zeros({1, 96, 8}, DType::kU8).view()),
      InvalidArgument);
}

}  // namespace
}  // namespace moecore
