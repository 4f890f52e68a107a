// The dtype traits table.
#include "moecore/core/dtype.h"

#include <iterator>

#include "moecore/core/error.h"

namespace moecore {
namespace {

constexpr bool traits_in_enum_order() {
  for (size_t i = 0; i < std::size(kDTypeTraits); ++i)
    if (static_cast<size_t>(kDTypeTraits[i].dtype) != i) return false;
  return true;
}
static_assert(traits_in_enum_order(), "kDTypeTraits is indexed by DType");

}  // namespace

const DTypeTraits& dtype_traits(DType dtype) {
  const auto index = static_cast<size_t>(dtype);
  MOECORE_INTERNAL_CHECK(index < std::size(kDTypeTraits), "unknown DType ",
                         static_cast<int>(dtype));
  return kDTypeTraits[index];
}

DType parse_dtype(const std::string& name) {
  std::string valid;
  for (const auto& t : kDTypeTraits) {
    if (name == t.name || name == t.numpy_name) return t.dtype;
    valid += std::string(valid.empty() ? "" : ", ") + t.name;
  }
  MOECORE_THROW(InvalidArgument, "unknown dtype '", name, "' (valid: ", valid, ")");
}

const DTypeTraits* all_dtypes(int* count) {
  *count = static_cast<int>(std::size(kDTypeTraits));
  return kDTypeTraits;
}

}  // namespace moecore
