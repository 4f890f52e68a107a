// The canonical dot order of every fp32 GEMM in moecore: the scalar reference below and the avx2
// and avx512 rows of the scaled GEMM (kernels/quant_gemm.h) follow it, so their results are
// bitwise equal across levels, thread counts and batch compositions (DESIGN.md §4, Determinism).
//
// Canonical order of Σ_k a[k]·w[k]: 16 fp32 partial sums, lane j adding a[k]·w[k] (a rounded fp32
// product, no FMA) for k ≡ j (mod 16) in increasing k, starting from +0; then lanes fold
// pairwise: j += j+8, then j += j+4, j += j+2, j += j+1.
#pragma once

#include <cstdint>

#include "moecore/core/dtype.h"

namespace moecore {

/// out[r * ldo + c] = Σ_k a[r * lda + k] · w[c * ldw + k] for r < m, c < n, in the canonical
/// order (scalar; the ISA rows are those of the scaled GEMM, kernels/quant_gemm.h).
/// a: fp32; w: f32, f16 or bf16 rows; out: fp32. Strides in elements. No aliasing.
void gemm_rows_times_wt_ref(const float* a, int64_t m, int64_t lda, const void* w, DType w_dtype,
                            int64_t ldw, int64_t n, int64_t k, float* out, int64_t ldo);

}  // namespace moecore
