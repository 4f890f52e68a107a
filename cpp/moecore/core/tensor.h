// TensorView: a non-owning, DLPack-shaped view (data, dtype, shape, strides in storage units).
// Tensor: a view plus shared ownership of its storage, either a 64-byte aligned buffer moecore
// allocated or a keep-alive handle the caller supplied (a numpy array). Neither copies on its own.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "moecore/core/dtype.h"

namespace moecore {

constexpr int kMaxDims = 6;
constexpr size_t kTensorAlignment = 64;

/// Non-owning view. Shape and strides count storage units (bytes for packed fp4).
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  bool writable = true;

  int64_t size(int dim) const { return shape[dim < 0 ? dim + ndim : dim]; }
  int64_t stride(int dim) const { return strides[dim < 0 ? dim + ndim : dim]; }
  int64_t numel() const;
  bool is_contiguous() const;
  /// True when the last dim has stride 1 and outer strides are non-negative and non-overlapping
  /// in the row-major sense (rows may be padded, as in x[:, :H] of a wider array).
  bool rows_contiguous() const;
  std::vector<int64_t> shape_vector() const { return {shape, shape + ndim}; }
  /// "[8, 256, 64] bf16", for error messages.
  std::string describe() const;

  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }
  /// Address of storage unit (i0, i1, ...) — the index list must have ndim entries. Inline:
  /// kernels call it once per weight row.
  void* at(std::initializer_list<int64_t> index) const {
    int64_t offset = 0;
    int d = 0;
    for (int64_t i : index) offset += i * strides[d++];
    return static_cast<char*>(data) + offset * dtype_size(dtype);
  }
  /// The sub-view [start, start + length) along `dim` (same storage; bounds checked).
  TensorView narrow(int dim, int64_t start, int64_t length) const;
  /// The sub-view at `index` along `dim`, with that dim removed.
  TensorView select(int dim, int64_t index) const;
};

/// Owning (or keep-alive) tensor. Copying a Tensor shares storage; it never copies data.
class Tensor {
 public:
  Tensor() = default;
  /// Wraps a view whose storage `owner` keeps alive (owner may be null for borrowed views that
  /// outlive the Tensor by contract).
  Tensor(const TensorView& view, std::shared_ptr<void> owner)
      : view_(view), owner_(std::move(owner)), defined_(true) {}

  /// A new 64-byte aligned, row-major tensor; contents uninitialised.
  static Tensor empty(const std::vector<int64_t>& shape, DType dtype);
  /// A new row-major tensor filled with zero bytes.
  static Tensor zeros(const std::vector<int64_t>& shape, DType dtype);
  /// A row-major copy of `view` in new storage.
  static Tensor copy_of(const TensorView& view);

  bool defined() const { return defined_; }
  const TensorView& view() const { return view_; }
  DType dtype() const { return view_.dtype; }
  int ndim() const { return view_.ndim; }
  int64_t size(int dim) const { return view_.size(dim); }
  int64_t numel() const { return view_.numel(); }
  template <typename T>
  T* ptr() const { return view_.ptr<T>(); }
  const std::shared_ptr<void>& owner() const { return owner_; }
  std::string describe() const { return defined_ ? view_.describe() : "None"; }

 private:
  TensorView view_;
  std::shared_ptr<void> owner_;
  bool defined_ = false;
};

/// Copies src into dst element by element (equal shapes and dtypes; any strides; no overlap).
void copy_view(const TensorView& src, const TensorView& dst);
/// Fills a view with zero bytes.
void zero_view(const TensorView& dst);

/// Row-major contiguous strides for `shape`.
void fill_contiguous_strides(TensorView& view);
/// Builds a row-major view over `data`.
TensorView make_view(void* data, DType dtype, const std::vector<int64_t>& shape);
/// "[8, 256, 64]".
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace moecore
