// Scalar row conversions (the compiler vectorises the simple loops at baseline flags).
#include "moecore/kernels/convert.h"

#include <cstring>

#include "moecore/core/error.h"
#include "moecore/formats/half.h"

namespace moecore {

void load_f32(const void* src, DType dtype, int64_t n, float* dst) {
  if (n <= 0) return;  // empty tensors may have null data
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::kF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    default:
      MOECORE_INTERNAL_CHECK(false, "load_f32: unsupported dtype ", dtype_name(dtype));
  }
}

void store_f32(const float* src, int64_t n, DType dtype, void* dst) {
  if (n <= 0) return;
  switch (dtype) {
    case DType::kF32:
      std::memmove(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    default:
      MOECORE_INTERNAL_CHECK(false, "store_f32: unsupported dtype ", dtype_name(dtype));
  }
}

void round_in_place(float* v, int64_t n, DType dtype) {
  switch (dtype) {  // outside the loop, so that each loop vectorizes
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) v[i] = bf16_to_f32(f32_to_bf16(v[i]));
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) v[i] = f16_to_f32(f32_to_f16(v[i]));
      return;
    default:
      return;
  }
}

}  // namespace moecore
