// Scalar E8M0 codec (OCP MX v1.0 §5.4.1 scale format): byte e means 2^(e − 127), 0xFF is NaN,
// there is no zero, sign or mantissa. Encoding is only defined for powers of two (read off the
// fp32 exponent, as DSv4's f32 scales are converted) and for UE8M0 rounding (ceil to a power of
// two, DeepGEMM's MXFP8 scales, spec §7.4). Header-only; validation lives in quantize.h.
#pragma once

#include <cstdint>

#include "moecore/formats/half.h"

namespace moecore {

constexpr int kE8M0Bias = 127;
constexpr uint8_t kE8M0NaN = 0xff;
/// Smallest and largest finite unbiased exponents E8M0 represents.
constexpr int kE8M0MinExp = -127;
constexpr int kE8M0MaxExp = 127;

/// 2^e as fp32 for e in [−149, 127] (subnormals included), exact.
inline float exp2_int(int e) {
  if (e >= -126) return bits_float(static_cast<uint32_t>(e + 127) << 23);
  return bits_float(1u << (e + 149));
}

/// E8M0 byte → fp32: 2^(code − 127); code 0 is 2^−127 (an fp32 subnormal); 0xFF → NaN.
inline float e8m0_to_f32(uint8_t code) {
  if (code == kE8M0NaN) return bits_float(0x7fc00000u);
  return exp2_int(static_cast<int>(code) - kE8M0Bias);
}

/// True when s is a positive power of two that E8M0 represents (2^−127 … 2^127); then *code is
/// its byte. Everything else (zero, negative, NaN, inf, non-powers) returns false.
inline bool e8m0_from_pow2(float s, uint8_t* code) {
  const uint32_t u = float_bits(s);
  if (u == 0x00400000u) {  // 2^−127: the only subnormal E8M0 value
    *code = 0;
    return true;
  }
  const uint32_t exp = (u >> 23) & 0xffu;
  if ((u & 0x807fffffu) != 0 || exp == 0 || exp == 0xffu) return false;
  *code = static_cast<uint8_t>(exp);
  return true;
}

/// ceil(log2 s) for finite s > 0, exact (bitwise: the fp32 exponent, plus one when the mantissa
/// is non-zero). DeepGEMM's UE8M0 rounding s' = 2^ceil(log2 s), spec §7.4.
inline int ceil_log2(float s) {
  const uint32_t u = float_bits(s);
  const int exp = static_cast<int>((u >> 23) & 0xffu);
  const uint32_t mant = u & 0x7fffffu;
  if (exp == 0) {  // subnormal: s = mant · 2^−149
    int l = 0;
    while ((1u << l) < mant) ++l;
    return l - 149;
  }
  return exp - 127 + (mant != 0 ? 1 : 0);
}

/// floor(log2 s) for finite s > 0, exact (the OCP MX shared-exponent rule uses it).
inline int floor_log2(float s) {
  const uint32_t u = float_bits(s);
  const int exp = static_cast<int>((u >> 23) & 0xffu);
  if (exp == 0) {
    int l = 31;
    const uint32_t mant = u & 0x7fffffu;
    while (!(mant >> l)) --l;
    return l - 149;
  }
  return exp - 127;
}

}  // namespace moecore
