// The storage dtypes moecore understands and their traits. Sub-byte formats are stored packed:
// kFp4E2M1x2 holds two E2M1 values per byte, element 0 in the low nibble, and tensor shapes count
// storage units (bytes), as sglang's uint8 [.., K/2] tensors do.
#pragma once

#include <cstdint>
#include <iterator>
#include <string>

namespace moecore {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF8E4M3,      // float8_e4m3fn: no inf, max 448
  kF8E5M2,      // float8_e5m2
  kE8M0,        // OCP MX scale byte: 2^(e-127), 0xFF is NaN
  kFp4E2M1x2,   // two E2M1 values per byte, element 0 in the low nibble
  kU8,
  kI8,          // INT8 weights and activations (symmetric, per-channel / per-token scales)
  kI32,
  kI64,
};

struct DTypeTraits {
  DType dtype;
  const char* name;         // moecore's short name: "bf16"
  const char* numpy_name;   // numpy / ml_dtypes name: "bfloat16"
  int storage_bytes;        // bytes per storage unit
  int values_per_storage;   // 2 for packed fp4, else 1
  bool is_floating;         // holds real numbers a kernel computes with
};

/// Indexed by DType (dtype.cpp checks the order at compile time).
inline constexpr DTypeTraits kDTypeTraits[] = {
    {DType::kF32, "f32", "float32", 4, 1, true},
    {DType::kF16, "f16", "float16", 2, 1, true},
    {DType::kBF16, "bf16", "bfloat16", 2, 1, true},
    {DType::kF8E4M3, "fp8_e4m3fn", "float8_e4m3fn", 1, 1, true},
    {DType::kF8E5M2, "fp8_e5m2", "float8_e5m2", 1, 1, true},
    {DType::kE8M0, "e8m0", "float8_e8m0fnu", 1, 1, true},
    {DType::kFp4E2M1x2, "fp4_e2m1x2", "float4_e2m1fn_x2", 1, 2, true},
    {DType::kU8, "u8", "uint8", 1, 1, false},
    {DType::kI8, "i8", "int8", 1, 1, false},
    {DType::kI32, "i32", "int32", 4, 1, false},
    {DType::kI64, "i64", "int64", 8, 1, false},
};

/// The traits of `dtype` (an internal error for a value outside the enum).
const DTypeTraits& dtype_traits(DType dtype);
inline const char* dtype_name(DType dtype) { return dtype_traits(dtype).name; }
/// Bytes per storage unit; inline, as kernels ask once per weight row.
inline int64_t dtype_size(DType dtype) {
  const auto index = static_cast<size_t>(dtype);
  return index < std::size(kDTypeTraits) ? kDTypeTraits[index].storage_bytes
                                         : dtype_traits(dtype).storage_bytes;
}
/// Parses "bf16", "bfloat16", "float32", ... (either spelling); throws InvalidArgument.
DType parse_dtype(const std::string& name);
/// All dtypes, in declaration order.
const DTypeTraits* all_dtypes(int* count);

/// Activation dtypes the unquantized runner paths compute with.
inline bool is_activation_dtype(DType d) {
  return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16;
}

}  // namespace moecore
