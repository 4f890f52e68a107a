// bf16 and fp16 codecs, bit-exact: every fp16 code decoded against the compiler's _Float16,
// encodes of random, tie and boundary values, bf16 round-to-nearest-even and NaN handling.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "moecore/formats/half.h"

namespace moecore {
namespace {

uint16_t f16_bits(_Float16 h) {
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}

TEST(HalfCodecTest, EveryF16CodeDecodesExactly) {
  for (uint32_t code = 0; code < 65536; ++code) {
    _Float16 h;
    const uint16_t c = static_cast<uint16_t>(code);
    std::memcpy(&h, &c, 2);
    const float expected = static_cast<float>(h);
    const float got = f16_to_f32(c);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << code;
    } else {
      EXPECT_EQ(float_bits(got), float_bits(expected)) << code;
    }
  }
}

TEST(HalfCodecTest, F16EncodeMatchesCompilerRounding) {
  std::mt19937 rng(1);
  std::uniform_int_distribution<uint32_t> any_bits;
  auto check = [](float f) {
    const uint16_t expected = f16_bits(static_cast<_Float16>(f));
    EXPECT_EQ(f32_to_f16(f), expected) << f;
  };
  for (int i = 0; i < 200000; ++i) {
    const float f = bits_float(any_bits(rng));
    if (!std::isnan(f)) check(f);
  }
  // Ties and boundaries: halfway between f16 neighbours, subnormal edges, overflow edge.
  for (uint32_t code = 0; code < 0x7c00; code += 7) {
    const float a = f16_to_f32(static_cast<uint16_t>(code));
    const float b = f16_to_f32(static_cast<uint16_t>(code + 1));
    check((a + b) / 2);
    check(-(a + b) / 2);
  }
  for (float f : {65504.0f, 65519.0f, 65520.0f, 1e9f, 5.96e-8f, 2.98e-8f, 2.99e-8f, 6.1e-5f, 0.0f,
                  -0.0f, std::numeric_limits<float>::infinity()})
    check(f);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::nanf("")))));
}

TEST(HalfCodecTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(bits_float(0x3f808000u)), 0x3f80);  // tie → even (down)
  EXPECT_EQ(f32_to_bf16(bits_float(0x3f818000u)), 0x3f82);  // tie → even (up)
  EXPECT_EQ(f32_to_bf16(bits_float(0x3f808001u)), 0x3f81);  // above tie → up
  EXPECT_EQ(f32_to_bf16(bits_float(0x7f7fffffu)), 0x7f80);  // overflow → inf
  const uint16_t nan = f32_to_bf16(bits_float(0x7f800001u));  // signalling NaN stays NaN
  EXPECT_TRUE(std::isnan(bf16_to_f32(nan)));
  for (uint32_t code = 0; code < 65536; ++code) {
    const float f = bf16_to_f32(static_cast<uint16_t>(code));
    if (!std::isnan(f)) EXPECT_EQ(f32_to_bf16(f), code);
  }
}

}  // namespace
}  // namespace moecore
