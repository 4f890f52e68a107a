// The dtype traits table.
#include "moecore/core/dtype.h"

#include <iterator>

#include "moecore/core/error.h"

namespace moecore {
namespace {

const DTypeTraits kTraits[] = {
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

}  // namespace

const DTypeTraits& dtype_traits(DType dtype) {
  for (const auto& t : kTraits)
    if (t.dtype == dtype) return t;
  MOECORE_INTERNAL_CHECK(false, "unknown DType ", static_cast<int>(dtype));
}

DType parse_dtype(const std::string& name) {
  std::string valid;
  for (const auto& t : kTraits) {
    if (name == t.name || name == t.numpy_name) return t.dtype;
    valid += std::string(valid.empty() ? "" : ", ") + t.name;
  }
  MOECORE_THROW(InvalidArgument, "unknown dtype '", name, "' (valid: ", valid, ")");
}

const DTypeTraits* all_dtypes(int* count) {
  *count = static_cast<int>(std::size(kTraits));
  return kTraits;
}

}  // namespace moecore
