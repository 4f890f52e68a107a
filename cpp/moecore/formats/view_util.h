// Internal helpers shared by quantize.cpp and layout.cpp (not a public API): row access to a
// strided TensorView flattened to [rows, last dim], and the argument checks whose messages every
// formats entry point shares ("api: expected …, got …").
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/core/tensor.h"
#include "moecore/kernels/convert.h"

namespace moecore::formats_detail {

/// A view seen as rows of its last dim (a 0-d view is one row of one element). Leading dims and
/// strides are arbitrary; only element access along a row uses the last stride.
class Rows {
 public:
  explicit Rows(const TensorView& v) : v_(v) {
    cols_ = v.ndim == 0 ? 1 : v.shape[v.ndim - 1];
    col_stride_ = v.ndim == 0 ? 1 : v.strides[v.ndim - 1];
    rows_ = 1;
    for (int d = 0; d + 1 < v.ndim; ++d) rows_ *= v.shape[d];
    elem_ = dtype_size(v.dtype);
  }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }

  /// Address of element (r, 0).
  const char* row(int64_t r) const {
    int64_t off = 0;
    for (int d = v_.ndim - 2; d >= 0; --d) {
      off += (r % v_.shape[d]) * v_.strides[d];
      r /= v_.shape[d];
    }
    return static_cast<const char*>(v_.data) + off * elem_;
  }
  /// Row r widened to fp32 (the view must be f32, f16 or bf16).
  void load_f32(int64_t r, float* dst) const {
    const char* p = row(r);
    if (col_stride_ == 1 || cols_ <= 1) {
      moecore::load_f32(p, v_.dtype, cols_, dst);
      return;
    }
    for (int64_t c = 0; c < cols_; ++c)
      moecore::load_f32(p + c * col_stride_ * elem_, v_.dtype, 1, dst + c);
  }
  /// Row r as raw storage units (any dtype) into a dense buffer of cols · elem bytes.
  void load_bytes(int64_t r, void* dst) const {
    const char* p = row(r);
    if (col_stride_ == 1 || cols_ <= 1) {
      if (cols_ > 0) std::memcpy(dst, p, static_cast<size_t>(cols_ * elem_));
      return;
    }
    char* d = static_cast<char*>(dst);
    for (int64_t c = 0; c < cols_; ++c)
      std::memcpy(d + c * elem_, p + c * col_stride_ * elem_, static_cast<size_t>(elem_));
  }

 private:
  TensorView v_;
  int64_t rows_ = 0, cols_ = 0, col_stride_ = 1, elem_ = 1;
};

/// "f32, f16 or bf16" activation-style inputs.
inline void check_float_input(const TensorView& x, const char* api, const char* what,
                              int min_ndim) {
  MOECORE_CHECK(x.data != nullptr || x.numel() == 0, api, ": expected ", what,
                " to be a tensor, got an undefined one");
  MOECORE_CHECK_DTYPE(is_activation_dtype(x.dtype), api, ": expected ", what,
                      " dtype f32, f16 or bf16, got ", dtype_name(x.dtype));
  MOECORE_CHECK(x.ndim >= min_ndim, api, ": expected ", what, " with at least ", min_ndim,
                " dim(s), got shape ", shape_string(x.shape_vector()));
}

inline void check_out_dtype(DType d, const char* api) {
  MOECORE_CHECK_DTYPE(is_activation_dtype(d), api, ": expected out_dtype f32, f16 or bf16, got ",
                      dtype_name(d));
}

inline void check_positive_scale(float s, const char* api, const char* what) {
  MOECORE_CHECK(std::isfinite(s) && s > 0.0f, api, ": expected ", what, " finite and > 0, got ", s);
}

/// Normalises a possibly negative dim; InvalidArgument when out of range.
inline int normalize_dim(int dim, int ndim, const char* api) {
  MOECORE_CHECK(ndim > 0 && dim >= -ndim && dim < ndim, api, ": expected dim in [", -ndim, ", ",
                ndim - 1, "], got ", dim);
  return dim < 0 ? dim + ndim : dim;
}

/// Leading dims of `v` except the last `drop` ones.
inline std::vector<int64_t> leading_shape(const TensorView& v, int drop) {
  return std::vector<int64_t>(v.shape, v.shape + (v.ndim - drop));
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// The same view with a leading dim of size 1 (ndim < kMaxDims).
inline TensorView unsqueeze0(const TensorView& v) {
  TensorView u = v;
  u.ndim = v.ndim + 1;
  u.shape[0] = 1;
  u.strides[0] = 0;
  for (int d = 0; d < v.ndim; ++d) {
    u.shape[d + 1] = v.shape[d];
    u.strides[d + 1] = v.strides[d];
  }
  return u;
}

}  // namespace moecore::formats_detail
