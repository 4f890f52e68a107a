// Scalar E2M1 (FP4) codec, bit-exact: bit 3 is the sign, bits 0–2 index {0, 0.5, 1, 1.5, 2, 3, 4,
// 6} (OCP MX v1.0 §5.3.3; NVFP4 uses the same element type). Two encoders, because sglang uses two
// rules: round-half-to-even (NVFP4 kernels and their reference, OCP) and ModelOpt's "ties down"
// (sglang's MXFP4QuantizeUtil, spec §7.3). Packing puts element 2i in the LOW nibble of byte i.
#pragma once

#include <cstdint>

#include "moecore/formats/half.h"

namespace moecore {

constexpr float kE2M1Max = 6.0f;

/// E2M1 nibble (low 4 bits used) → fp32, exact; 0x8 is −0.
inline float e2m1_to_f32(uint8_t nibble) {
  static constexpr float kValues[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                        -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  return kValues[nibble & 0xfu];
}

/// fp32 → E2M1 nibble, round half to even (the NVFP4 rule of spec §7.2 and the OCP rule): the
/// midpoints 0.25→0, 0.75→1, 1.25→1, 1.75→2, 2.5→2, 3.5→4, 5→4; |x| > 5 (and ±inf) saturate to
/// ±6. The sign is kept, so negative values that round to zero give −0 (0x8), as the GPU's
/// cvt.rn.satfinite.e2m1x2 and ml_dtypes do. E2M1 has no NaN: NaN encodes as +6 (0x7); quantizers
/// reject non-finite input before they get here.
inline uint8_t f32_to_e2m1_rne(float x) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7;
  const uint8_t sign = static_cast<uint8_t>((u >> 28) & 0x8u);
  const float a = bits_float(u & 0x7fffffffu);
  uint8_t m;
  if (a <= 0.25f)
    m = 0;
  else if (a < 0.75f)
    m = 1;
  else if (a <= 1.25f)
    m = 2;
  else if (a < 1.75f)
    m = 3;
  else if (a <= 2.5f)
    m = 4;
  else if (a < 3.5f)
    m = 5;
  else if (a <= 5.0f)
    m = 6;
  else
    m = 7;
  return sign | m;
}

/// fp32 → E2M1 nibble with sglang's MXFP4QuantizeUtil rule (from ModelOpt): the magnitude index
/// is the number of bounds {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5} strictly below |x|, so every
/// midpoint rounds DOWN (0.75→0.5, 1.75→1.5, 2.5→2, 3.5→3, 5→4) and |x| > 5 gives 6. Its sign bit
/// is (2 − sign(x)) // 2, which is 1 for x = ±0 too: zero encodes as 0x8 (−0), mirrored on
/// purpose so codes match sglang's quantizer. NaN encodes as 0x7 (never reached by quantizers).
inline uint8_t f32_to_e2m1_ties_down(float x) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7;
  const float a = bits_float(u & 0x7fffffffu);
  uint8_t m = 0;
  for (float bound : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f}) m += a > bound ? 1 : 0;
  return static_cast<uint8_t>((x > 0.0f ? 0u : 0x8u) | m);
}

/// Byte holding element 2i (`lo`, low nibble) and element 2i+1 (`hi`, high nibble).
inline uint8_t pack_e2m1x2(uint8_t lo, uint8_t hi) {
  return static_cast<uint8_t>((lo & 0xfu) | ((hi & 0xfu) << 4));
}
inline uint8_t e2m1x2_lo(uint8_t byte) { return byte & 0xfu; }
inline uint8_t e2m1x2_hi(uint8_t byte) { return byte >> 4; }

}  // namespace moecore
