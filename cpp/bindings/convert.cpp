// numpy ↔ Tensor and enum conversions. Nothing here copies or converts data: dtype, shape and
// strides are checked and the Tensor views the array's memory.
#include "convert.h"

#include <cstring>

namespace moecore::bindings {
namespace {

// ml_dtypes is optional: looked up once.
py::object ml_dtypes_module() {
  static py::object* module = [] {
    try {
      return new py::object(py::module_::import("ml_dtypes"));
    } catch (const py::error_already_set&) {
      return new py::object(py::none());
    }
  }();
  return *module;
}

std::optional<DType> dtype_of_numpy(const py::dtype& dt) {
  const std::string name = py::str(dt.attr("name")).cast<std::string>();
  if (name == "float32") return DType::kF32;
  if (name == "float16") return DType::kF16;
  if (name == "bfloat16") return DType::kBF16;
  if (name == "float8_e4m3fn") return DType::kF8E4M3;
  if (name == "float8_e5m2") return DType::kF8E5M2;
  if (name == "float8_e8m0fnu") return DType::kE8M0;
  if (name == "uint8") return DType::kU8;
  if (name == "int8") return DType::kI8;
  if (name == "int32") return DType::kI32;
  if (name == "int64") return DType::kI64;
  return std::nullopt;
}

py::dtype numpy_dtype_of(DType d) {
  py::object ml = ml_dtypes_module();
  switch (d) {
    case DType::kF32:
      return py::dtype("float32");
    case DType::kF16:
      return py::dtype("float16");
    case DType::kBF16:
      return ml.is_none() ? py::dtype("uint16") : py::dtype::from_args(ml.attr("bfloat16"));
    case DType::kF8E4M3:
      return ml.is_none() ? py::dtype("uint8") : py::dtype::from_args(ml.attr("float8_e4m3fn"));
    case DType::kF8E5M2:
      return ml.is_none() ? py::dtype("uint8") : py::dtype::from_args(ml.attr("float8_e5m2"));
    case DType::kE8M0:
      return ml.is_none() || !py::hasattr(ml, "float8_e8m0fnu")
                 ? py::dtype("uint8")
                 : py::dtype::from_args(ml.attr("float8_e8m0fnu"));
    case DType::kFp4E2M1x2:
    case DType::kU8:
      return py::dtype("uint8");
    case DType::kI8:
      return py::dtype("int8");
    case DType::kI32:
      return py::dtype("int32");
    case DType::kI64:
      return py::dtype("int64");
  }
  MOECORE_INTERNAL_CHECK(false, "unknown dtype");
}

}  // namespace

PyHolder hold(py::object obj) {
  return PyHolder(new py::object(std::move(obj)), [](py::object* p) {
    if (!Py_IsInitialized()) return;  // interpreter gone: leak rather than touch it
    py::gil_scoped_acquire gil;
    delete p;
  });
}

std::optional<DType> to_dtype(py::handle obj) {
  if (obj.is_none()) return std::nullopt;
  if (py::isinstance<py::str>(obj)) return parse_dtype(obj.cast<std::string>());
  py::dtype dt;
  try {
    dt = py::dtype::from_args(py::reinterpret_borrow<py::object>(obj));
  } catch (const py::error_already_set&) {
    MOECORE_THROW(DTypeError, "expected a dtype, got ", py::str(obj).cast<std::string>());
  }
  auto d = dtype_of_numpy(dt);
  MOECORE_CHECK_DTYPE(d.has_value(), "unsupported dtype ",
                      py::str(py::handle(dt)).cast<std::string>());
  return d;
}

Tensor to_tensor(py::handle obj, const char* what) {
  if (obj.is_none()) return Tensor();
  std::optional<DType> tag;
  py::handle array_obj = obj;
  if (py::hasattr(obj, "__moecore_tagged__")) {
    array_obj = obj.attr("array");
    tag = to_dtype(py::object(obj.attr("dtype")));
  }
  if (!py::isinstance<py::array>(array_obj))
    MOECORE_THROW(DTypeError, what, ": expected a numpy array, got ",
                  type_name(array_obj),
                  " (convert explicitly, e.g. np.asarray(x) or t.numpy())");
  py::array arr = py::reinterpret_borrow<py::array>(array_obj);
  const py::dtype dt = arr.dtype();
  const std::string dt_name = py::str(dt.attr("name")).cast<std::string>();
  MOECORE_CHECK_DTYPE(dt.attr("isnative").cast<bool>(), what,
                      ": the array has non-native byte order (",
                      py::str(py::handle(dt)).cast<std::string>(),
                      "); convert it with a.astype(a.dtype.newbyteorder('='))");
  DType dtype;
  if (tag) {
    dtype = *tag;
    MOECORE_CHECK_DTYPE(dt.itemsize() == dtype_size(dtype) && (dt.kind() == 'u' || dt.kind() == 'V' ||
                                                               dtype_of_numpy(dt) == dtype),
                        what, ": a ", dtype_name(dtype), " tag needs a uint", 8 * dtype_size(dtype),
                        " array (or the matching ml_dtypes array), got ", dt_name);
  } else {
    auto inferred = dtype_of_numpy(dt);
    if (!inferred) {
      if (dt_name == "uint16")
        MOECORE_THROW(DTypeError, what, ": a uint16 array is ambiguous; tag it, e.g. "
                      "moecore.tagged(array, 'bf16')");
      MOECORE_THROW(DTypeError, what, ": unsupported dtype ", dt_name,
                    " (supported: float32, float16, bfloat16, float8_e4m3fn, float8_e5m2, "
                    "float8_e8m0fnu, uint8, int8, int32, int64)");
    }
    dtype = *inferred;
  }
  MOECORE_CHECK(arr.ndim() <= kMaxDims, what, ": at most ", kMaxDims, " dims, got ", arr.ndim());
  TensorView v;
  v.data = const_cast<void*>(arr.data());
  v.dtype = dtype;
  v.ndim = static_cast<int>(arr.ndim());
  v.writable = arr.writeable();
  for (int d = 0; d < v.ndim; ++d) {
    v.shape[d] = arr.shape(d);
    const int64_t stride = arr.strides(d);
    MOECORE_CHECK(stride >= 0 && stride % dt.itemsize() == 0, what,
                  ": strides must be non-negative multiples of the item size, got ", stride,
                  " bytes in dim ", d);
    v.strides[d] = stride / dt.itemsize();
  }
  return Tensor(v, hold(py::reinterpret_borrow<py::object>(array_obj)));
}

Tensor to_required_tensor(py::handle obj, const char* what) {
  MOECORE_CHECK(!obj.is_none(), what, ": expected a numpy array, got None");
  return to_tensor(obj, what);
}

py::object to_numpy(const Tensor& t) {
  if (!t.defined()) return py::none();
  const TensorView& v = t.view();
  const py::dtype dt = numpy_dtype_of(v.dtype);
  std::vector<py::ssize_t> shape(v.shape, v.shape + v.ndim), strides(v.ndim);
  for (int d = 0; d < v.ndim; ++d) strides[d] = v.strides[d] * dt.itemsize();
  // The capsule owns a copy of the Tensor, so the storage lives as long as the array.
  auto* keep = new Tensor(t);
  py::capsule base(keep, [](void* p) { delete static_cast<Tensor*>(p); });
  py::array arr(dt, shape, strides, v.data, base);
  if (!v.writable) arr.attr("flags").attr("writeable") = false;
  return std::move(arr);
}

template <>
MoeA2ABackend to_enum<MoeA2ABackend>(py::handle obj) {
  if (obj.is_none()) return MoeA2ABackend::NONE;  // sglang's _missing_: None → NONE
  if (py::isinstance<py::str>(obj)) {
    const std::string s = obj.cast<std::string>();
    for (const auto& e : EnumInfo<MoeA2ABackend>::entries())
      if (s == e.value) return e.member;
    MOECORE_THROW(InvalidArgument, "No MoeA2ABackend member for value ", s);
  }
  if (py::hasattr(obj, "value") && py::isinstance<py::str>(obj.attr("value")))
    return to_enum<MoeA2ABackend>(obj.attr("value"));
  MOECORE_THROW(DTypeError, "expected a MoeA2ABackend or its string value, got ",
                type_name(obj));
}

}  // namespace moecore::bindings
