// The GEMM op table of the unquantized runner paths: one row of function pointers per ISA level.
// Every row computes each dot product in the canonical order below, so results are bitwise equal
// across levels, thread counts and batch compositions (DESIGN.md §4, Determinism).
//
// Canonical order of Σ_k a[k]·w[k]: 16 fp32 partial sums, lane j adding a[k]·w[k] (a rounded fp32
// product, no FMA) for k ≡ j (mod 16) in increasing k, starting from +0; then lanes fold
// pairwise: j += j+8, then j += j+4, j += j+2, j += j+1.
#pragma once

#include <cstdint>

#include "moecore/core/dtype.h"
#include "moecore/isa/isa.h"

namespace moecore {

/// out[r * ldo + c] = Σ_k a[r * lda + k] · w[c * ldw + k] for r < m, c < n.
/// a: fp32; w: f32, f16 or bf16 rows; out: fp32. Strides in elements. No aliasing.
using GemmRowsFn = void (*)(const float* a, int64_t m, int64_t lda, const void* w, DType w_dtype,
                            int64_t ldw, int64_t n, int64_t k, float* out, int64_t ldo);

struct GemmKernels {
  IsaLevel level;
  GemmRowsFn rows_times_wt;
};

/// The best row at or below `level` that this build has.
const GemmKernels& gemm_kernels(IsaLevel level);

/// Scalar reference twin of every row (gemm_ref.cpp).
void gemm_rows_times_wt_ref(const float* a, int64_t m, int64_t lda, const void* w, DType w_dtype,
                            int64_t ldw, int64_t n, int64_t k, float* out, int64_t ldo);
#ifdef MOECORE_COMPILED_AVX512
void gemm_rows_times_wt_avx512(const float* a, int64_t m, int64_t lda, const void* w,
                               DType w_dtype, int64_t ldw, int64_t n, int64_t k, float* out,
                               int64_t ldo);
#endif

}  // namespace moecore
