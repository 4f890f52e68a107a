// Conversions at the Python boundary: numpy arrays ↔ Tensor without copies, enum values ↔ the
// Python Enum classes of moecore.enums, and GIL-safe holders for Python objects that C++ keeps.
// Only files in cpp/bindings/ include pybind11.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>

#include "moecore/core/enums.h"
#include "moecore/core/error.h"
#include "moecore/core/tensor.h"

namespace moecore::bindings {

namespace py = pybind11;

/// The name of an object's type, for messages: "Tensor", "list".
inline std::string type_name(py::handle obj) {
  return py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>();
}

/// A Python object owned from C++: destroyed under the GIL, or leaked after interpreter exit.
using PyHolder = std::shared_ptr<py::object>;
PyHolder hold(py::object obj);

/// numpy array (or moecore.Tagged(array, dtype), or None → undefined) → Tensor viewing the same
/// memory; the Tensor keeps the array alive. `what` names the argument in errors.
Tensor to_tensor(py::handle obj, const char* what);
/// Like to_tensor but None is an error.
Tensor to_required_tensor(py::handle obj, const char* what);
/// Tensor → numpy array over the same memory (None for an undefined Tensor). bf16/fp8/e8m0 come
/// back as ml_dtypes dtypes when ml_dtypes is installed, else as uint16/uint8.
py::object to_numpy(const Tensor& tensor);
/// DType from "bf16", numpy dtype objects, ml_dtypes types or None (→ nullopt).
std::optional<DType> to_dtype(py::handle obj);

/// Enum from a member of moecore.enums, its wire string, or (a2a only) None.
template <typename E>
E to_enum(py::handle obj) {
  if (py::isinstance<py::str>(obj)) return parse_enum<E>(obj.cast<std::string>());
  if (!obj.is_none() && py::hasattr(obj, "value") && py::isinstance<py::str>(obj.attr("value")))
    return parse_enum<E>(obj.attr("value").cast<std::string>());
  MOECORE_THROW(DTypeError, "expected a ", EnumInfo<E>::class_name(), " or its string value, got ",
                type_name(obj));
}
template <>
MoeA2ABackend to_enum<MoeA2ABackend>(py::handle obj);

template <typename E>
py::object from_enum(E e) {
  return py::module_::import("moecore.enums").attr(EnumInfo<E>::class_name())(to_string(e));
}

template <typename E>
std::optional<E> to_optional_enum(py::handle obj) {
  if (obj.is_none()) return std::nullopt;
  return to_enum<E>(obj);
}

}  // namespace moecore::bindings
