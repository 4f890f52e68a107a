// The activation quantizers' kernel table: one row per ISA level (act_quant_kernels), each
// replacing a segment of fp32 values in place by the exact fp32 values of its codes under a rule
// of formats/quantize.h. The scalar row runs those rules themselves (the reference); every other
// row gives its bits for every input (NaN, ±inf, ±0, subnormals, ties, beyond ±448), never reads
// or writes outside x[0, n) and allocates nothing. Pick the row once, where a quantizer is built.
#pragma once

#include <cstdint>

#include "moecore/isa/isa.h"

namespace moecore {

/// One row of the table. x: n contiguous fp32 values, any alignment, rewritten in place; nothing
/// outside x[0, n) is read or written. No state: any thread may call any row.
struct ActQuantKernels {
  /// amax_row: max |x[i]| with NaN ignored; 0 for n = 0.
  float (*amax)(const float* x, int64_t n);
  /// x[i] ← the value of fp8_quantize_row_mul's code: e4m3_rne(clamp(x[i] · inv, ±448)), NaN
  /// → +448, the sign of ±0 kept.
  void (*fp8_mul)(float* x, int64_t n, float inv);
  /// x[i] ← the value of fp8_quantize_row_div's code: e4m3_rne(clamp(x[i] / s, ±448)).
  void (*fp8_div)(float* x, int64_t n, float s);
  /// x[i] ← int8_quantize_row's code as fp32: round_half_away(x[i] · fp32(127 / amax)) clamped
  /// to ±127, NaN → 0 (always +0, never −0).
  void (*int8)(float* x, int64_t n, float amax);
  /// n % 16 == 0: each 16-value block ← the values of its nvfp4_quantize_row codes,
  /// e2m1 · s_e4m3 (nvfp4_code_values_row: exact, without the 1/gs factor).
  void (*nvfp4)(float* x, int64_t n, float global_scale);
};

/// The best row at or below `level` that this build has (avx512_bf16 and amx use the avx512
/// row: nothing here needs their instructions).
const ActQuantKernels& act_quant_kernels(IsaLevel level);

/// The rows, named so that a missing ISA file is a link error. kActQuantRef is the reference:
/// formats' row functions through a stack buffer of codes.
extern const ActQuantKernels kActQuantRef;
#ifdef MOECORE_COMPILED_AVX2
extern const ActQuantKernels kActQuantAvx2;
#endif
#ifdef MOECORE_COMPILED_AVX512
extern const ActQuantKernels kActQuantAvx512;
#endif

}  // namespace moecore
