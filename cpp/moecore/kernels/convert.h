// Row conversions between activation dtypes (f32, f16, bf16) and fp32 working buffers. Loads are
// exact; stores round to nearest even. Every runner path rounds through these, so the rounding
// points of a backend's contract are the calls to store_f32 / round_to.
#pragma once

#include <cstdint>

#include "moecore/core/dtype.h"
#include "moecore/formats/half.h"

namespace moecore {

/// dst[i] = float(src[i]) for i < n; src is f32, f16 or bf16.
void load_f32(const void* src, DType dtype, int64_t n, float* dst);
/// dst[i] = round_to_dtype(src[i]) stored as `dtype` (f32, f16 or bf16).
void store_f32(const float* src, int64_t n, DType dtype, void* dst);
/// v rounded to `dtype` and widened back to fp32 (identity for f32). Inline: epilogues call it
/// per element.
inline float round_to(DType dtype, float v) {
  switch (dtype) {
    case DType::kBF16:
      return bf16_to_f32(f32_to_bf16(v));
    case DType::kF16:
      return f16_to_f32(f32_to_f16(v));
    default:
      return v;
  }
}
/// Rounds a fp32 buffer in place to `dtype`'s precision (values stay fp32).
void round_in_place(float* v, int64_t n, DType dtype);

}  // namespace moecore
