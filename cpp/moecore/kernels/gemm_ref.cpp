// Scalar reference GEMM in the canonical dot order of gemm.h. Baseline flags: the 16-lane loop
// may be vectorised by the compiler without changing the order, since the lanes are explicit.
#include <vector>

#include "moecore/kernels/convert.h"
#include "moecore/kernels/gemm.h"

namespace moecore {
namespace {

float dot_canonical(const float* a, const float* w, int64_t k) {
  float lane[16] = {};
  int64_t i = 0;
  for (; i + 16 <= k; i += 16)
    for (int j = 0; j < 16; ++j) lane[j] += a[i + j] * w[i + j];
  for (int j = 0; i + j < k; ++j) lane[j] += a[i + j] * w[i + j];
  for (int width = 8; width >= 1; width /= 2)
    for (int j = 0; j < width; ++j) lane[j] += lane[j + width];
  return lane[0];
}

}  // namespace

void gemm_rows_times_wt_ref(const float* a, int64_t m, int64_t lda, const void* w, DType w_dtype,
                            int64_t ldw, int64_t n, int64_t k, float* out, int64_t ldo) {
  const int64_t elem = dtype_size(w_dtype);
  for (int64_t c = 0; c < n; ++c) {
    const void* src = static_cast<const char*>(w) + c * ldw * elem;
    const float* wf = static_cast<const float*>(src);
    if (w_dtype != DType::kF32) {
      // Only narrow weights touch this buffer: f32 calls (the kernel rows') never allocate.
      thread_local std::vector<float> w_row;
      if (static_cast<int64_t>(w_row.size()) < k) w_row.resize(k);
      load_f32(src, w_dtype, k, w_row.data());
      wf = w_row.data();
    }
    for (int64_t r = 0; r < m; ++r) out[r * ldo + c] = dot_canonical(a + r * lda, wf, k);
  }
}

}  // namespace moecore
