// TensorView helpers and aligned allocation for Tensor.
#include "moecore/core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

#include "moecore/core/error.h"

#ifdef __linux__
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace moecore {
namespace {

// Tensors this large (expert weights) ask for transparent huge pages, as numpy does for its
// arrays: a forward streams the weights of many experts, and 4 KiB pages would cost a TLB miss
// every few rows. Advice only, before the pages are touched; where the kernel has no huge pages
// it is refused, and nothing changes.
constexpr size_t kHugePageAdviceBytes = size_t{4} << 20;

void advise_huge_pages(void* data, size_t bytes) {
#ifdef __linux__
  if (bytes < kHugePageAdviceBytes) return;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) / page * page;
  madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

}  // namespace

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

bool TensorView::is_contiguous() const {
  if (numel() == 0) return true;  // numpy gives empty arrays arbitrary (e.g. zero) strides
  int64_t expected = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

bool TensorView::rows_contiguous() const {
  if (ndim == 0 || numel() == 0) return true;
  if (shape[ndim - 1] > 1 && strides[ndim - 1] != 1) return false;
  int64_t span = shape[ndim - 1];
  for (int d = ndim - 2; d >= 0; --d) {
    if (shape[d] == 1) continue;
    if (strides[d] < span) return false;
    span = strides[d] * shape[d];
  }
  return true;
}

std::string TensorView::describe() const {
  return shape_string(shape_vector()) + " " + dtype_name(dtype);
}

TensorView TensorView::narrow(int dim, int64_t start, int64_t length) const {
  if (dim < 0) dim += ndim;
  MOECORE_INTERNAL_CHECK(dim >= 0 && dim < ndim && start >= 0 && length >= 0 &&
                             start + length <= shape[dim],
                         "narrow(", dim, ", ", start, ", ", length, ") of ", describe());
  TensorView v = *this;
  v.data = static_cast<char*>(data) + start * strides[dim] * dtype_size(dtype);
  v.shape[dim] = length;
  return v;
}

TensorView TensorView::select(int dim, int64_t index) const {
  if (dim < 0) dim += ndim;
  TensorView v = narrow(dim, index, 1);
  for (int d = dim; d + 1 < ndim; ++d) {
    v.shape[d] = v.shape[d + 1];
    v.strides[d] = v.strides[d + 1];
  }
  --v.ndim;
  return v;
}

namespace {
// Calls fn(src_offset, dst_offset) in storage units for every index of `shape`.
template <typename Fn>
void for_each_index(const TensorView& a, const TensorView& b, Fn fn) {
  const int64_t n = a.numel();
  int64_t index[kMaxDims] = {};
  for (int64_t i = 0; i < n; ++i) {
    int64_t oa = 0, ob = 0;
    for (int d = 0; d < a.ndim; ++d) {
      oa += index[d] * a.strides[d];
      ob += index[d] * b.strides[d];
    }
    fn(oa, ob);
    for (int d = a.ndim - 1; d >= 0; --d) {
      if (++index[d] < a.shape[d]) break;
      index[d] = 0;
    }
  }
}
}  // namespace

void copy_view(const TensorView& src, const TensorView& dst) {
  MOECORE_INTERNAL_CHECK(src.dtype == dst.dtype && src.shape_vector() == dst.shape_vector(),
                         "copy_view: ", src.describe(), " into ", dst.describe());
  const int64_t elem = dtype_size(src.dtype);
  const char* s = static_cast<const char*>(src.data);
  char* d = static_cast<char*>(dst.data);
  for_each_index(src, dst, [&](int64_t os, int64_t od) {
    std::memcpy(d + od * elem, s + os * elem, static_cast<size_t>(elem));
  });
}

void zero_view(const TensorView& dst) {
  const int64_t elem = dtype_size(dst.dtype);
  char* d = static_cast<char*>(dst.data);
  for_each_index(dst, dst, [&](int64_t, int64_t od) {
    std::memset(d + od * elem, 0, static_cast<size_t>(elem));
  });
}

void fill_contiguous_strides(TensorView& view) {
  int64_t stride = 1;
  for (int d = view.ndim - 1; d >= 0; --d) {
    view.strides[d] = stride;
    stride *= view.shape[d];
  }
}

TensorView make_view(void* data, DType dtype, const std::vector<int64_t>& shape) {
  MOECORE_CHECK(shape.size() <= static_cast<size_t>(kMaxDims), "tensor: at most ", kMaxDims,
                " dims, got ", shape.size());
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.ndim = static_cast<int>(shape.size());
  for (int d = 0; d < v.ndim; ++d) {
    MOECORE_CHECK(shape[d] >= 0, "tensor: negative size in shape ", shape_string(shape));
    v.shape[d] = shape[d];
  }
  fill_contiguous_strides(v);
  return v;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Tensor Tensor::empty(const std::vector<int64_t>& shape, DType dtype) {
  int64_t count = 1;
  for (int64_t s : shape) {
    MOECORE_CHECK(s >= 0, "tensor: negative size in shape ", shape_string(shape));
    MOECORE_CHECK(s == 0 || count <= std::numeric_limits<int64_t>::max() / 8 / s,
                  "tensor: shape ", shape_string(shape), " overflows");
    count *= s;
  }
  size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
  size_t rounded = (bytes + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
  // Aligned operator new (not aligned_alloc), so that tensor storage is a heap allocation like any
  // other to whoever replaces the global operators (the tests count allocations that way).
  constexpr std::align_val_t kAlign{kTensorAlignment};
  void* data = ::operator new(rounded == 0 ? kTensorAlignment : rounded, kAlign);
  advise_huge_pages(data, rounded);
  std::shared_ptr<void> owner(data, [](void* p) { ::operator delete(p, kAlign); });
  return Tensor(make_view(data, dtype, shape), std::move(owner));
}

Tensor Tensor::zeros(const std::vector<int64_t>& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.view().data, 0, static_cast<size_t>(t.numel()) * dtype_size(dtype));
  return t;
}

Tensor Tensor::copy_of(const TensorView& src) {
  Tensor t = empty(src.shape_vector(), src.dtype);
  copy_view(src, t.view());
  return t;
}

}  // namespace moecore
