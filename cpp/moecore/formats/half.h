// Scalar bf16 and fp16 codecs, bit-exact. bf16: round-to-nearest-even from fp32, NaN kept quiet
// (spec §7.5). fp16: IEEE binary16 with RNE, subnormals and overflow to inf. Header-only so every
// kernel level can inline them; the fp8/fp4/e8m0 codecs live beside this file.
#pragma once

#include <cstdint>
#include <cstring>

namespace moecore {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_f32(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    // Subnormal: value = mant * 2^-24, exact in fp32.
    float v = static_cast<float>(mant) * bits_float(0x33800000u);  // 2^-24
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

inline uint16_t f32_to_f16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u | static_cast<uint16_t>((abs >> 13) & 0x3ffu);
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): round abs / 2^-24 to an integer, ties to even.
    const float scaled = bits_float(abs) * bits_float(0x4b800000u);  // * 2^24, exact
    uint32_t q = static_cast<uint32_t>(scaled);
    const float rem = scaled - static_cast<float>(q);
    if (rem > 0.5f || (rem == 0.5f && (q & 1u))) ++q;
    return sign | static_cast<uint16_t>(q);
  }
  uint32_t r = abs - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return sign | static_cast<uint16_t>(r >> 13);
}

}  // namespace moecore
