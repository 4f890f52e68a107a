// Scalar FP8 codecs, bit-exact: E4M3 "fn" (no infinities, max 448, NaN = S.1111.111) and E5M2
// (IEEE-like, max 57344), per the OCP 8-bit floating point spec. Encoding rounds to nearest even
// and SATURATES like the GPU kernels' cvt.rn.satfinite: finite values and ±inf beyond the largest
// finite magnitude become ±max; NaN stays NaN (sign kept). ml_dtypes differs only there (it turns
// e4m3 overflow into NaN and e5m2 overflow into inf). Header-only so kernels can inline them.
#pragma once

#include <cstdint>

#include "moecore/formats/half.h"

namespace moecore {

/// Largest finite E4M3 (fn) magnitude: 1.75 · 2^8.
constexpr float kFp8E4M3Max = 448.0f;
/// Largest finite E5M2 magnitude: 1.75 · 2^15.
constexpr float kFp8E5M2Max = 57344.0f;
/// E4M3 code of +448 (and the saturated result of anything larger).
constexpr uint8_t kFp8E4M3MaxCode = 0x7e;
/// E5M2 code of +57344.
constexpr uint8_t kFp8E5M2MaxCode = 0x7b;

namespace detail {

/// Code (without sign) of a finite magnitude `a` in [0, max] for a minifloat with `kMant` mantissa
/// bits and exponent bias `kBias`; round to nearest, ties to even, subnormals included.
template <int kMant, int kBias>
inline uint32_t encode_minifloat_magnitude(float a) {
  constexpr int kMinNormalExp = 1 - kBias;  // unbiased exponent of the smallest normal
  const uint32_t u = float_bits(a);
  if (u < static_cast<uint32_t>(kMinNormalExp + 127) << 23) {
    // Subnormal result: a / 2^(kMinNormalExp - kMant) rounded to an integer; the scaling by a
    // power of two is exact, and an integer of 2^kMant carries into the smallest normal code.
    const float scaled = a * bits_float(static_cast<uint32_t>(127 + kMant - kMinNormalExp) << 23);
    uint32_t q = static_cast<uint32_t>(scaled);
    const float rem = scaled - static_cast<float>(q);
    if (rem > 0.5f || (rem == 0.5f && (q & 1u))) ++q;
    return q;
  }
  constexpr int kShift = 23 - kMant;
  // Round the fp32 mantissa to kMant bits (a carry moves into the exponent, as it should), then
  // rebias the exponent from 127 to kBias.
  const uint32_t r = u + ((1u << (kShift - 1)) - 1u) + ((u >> kShift) & 1u);
  return (r >> kShift) - (static_cast<uint32_t>(127 - kBias) << kMant);
}

/// Value of a minifloat code without its sign bit (NaN/inf handled by the callers).
template <int kMant, int kBias>
inline float decode_minifloat_magnitude(uint32_t code) {
  const uint32_t exp = code >> kMant, mant = code & ((1u << kMant) - 1u);
  if (exp == 0) {
    // Subnormal: mant · 2^(1 - kBias - kMant), exact in fp32.
    return static_cast<float>(mant) *
           bits_float(static_cast<uint32_t>(127 + 1 - kBias - kMant) << 23);
  }
  return bits_float(((exp + 127 - kBias) << 23) | (mant << (23 - kMant)));
}

}  // namespace detail

/// fp32 → E4M3 (fn) code: round to nearest even; |x| ≥ 448 and ±inf saturate to ±448 (0x7e/0xfe);
/// NaN → 0x7f (0xff for a negative NaN).
inline uint8_t f32_to_fp8_e4m3(float f) {
  const uint32_t u = float_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7f;
  if (bits_float(abs) >= kFp8E4M3Max) return sign | kFp8E4M3MaxCode;
  return sign | static_cast<uint8_t>(detail::encode_minifloat_magnitude<3, 7>(bits_float(abs)));
}

/// E4M3 (fn) code → fp32, exact. 0x7f and 0xff are NaN.
inline float fp8_e4m3_to_f32(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  if ((code & 0x7fu) == 0x7fu) return bits_float(sign | 0x7fc00000u);
  return bits_float(sign | float_bits(detail::decode_minifloat_magnitude<3, 7>(code & 0x7fu)));
}

/// fp32 → E5M2 code: round to nearest even; |x| ≥ 57344 and ±inf saturate to ±57344 (0x7b/0xfb);
/// NaN → 0x7e (0xfe for a negative NaN), as ml_dtypes encodes it.
inline uint8_t f32_to_fp8_e5m2(float f) {
  const uint32_t u = float_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e;
  if (bits_float(abs) >= kFp8E5M2Max) return sign | kFp8E5M2MaxCode;
  return sign | static_cast<uint8_t>(detail::encode_minifloat_magnitude<2, 15>(bits_float(abs)));
}

/// E5M2 code → fp32, exact. Exponent field 31: ±inf (mantissa 0) or NaN.
inline float fp8_e5m2_to_f32(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const uint32_t mag = code & 0x7fu;
  if ((mag >> 2) == 0x1fu) return bits_float(sign | ((mag & 3u) ? 0x7fc00000u : 0x7f800000u));
  return bits_float(sign | float_bits(detail::decode_minifloat_magnitude<2, 15>(mag)));
}

/// All 256 E4M3 values, indexed by code (for table-driven decode in kernels).
inline const float* fp8_e4m3_table() {
  static const struct Table {
    float v[256];
    Table() {
      for (int c = 0; c < 256; ++c) v[c] = fp8_e4m3_to_f32(static_cast<uint8_t>(c));
    }
  } table;
  return table.v;
}

}  // namespace moecore
