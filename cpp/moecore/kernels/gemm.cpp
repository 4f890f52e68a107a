// The GEMM table: rows are named here explicitly (a missing ISA file is a link error, not a gap).
#include "moecore/kernels/gemm.h"

namespace moecore {

const GemmKernels& gemm_kernels(IsaLevel level) {
  static const GemmKernels kScalar{IsaLevel::kScalar, gemm_rows_times_wt_ref};
#ifdef MOECORE_COMPILED_AVX512
  static const GemmKernels kAvx512{IsaLevel::kAvx512, gemm_rows_times_wt_avx512};
  if (level >= IsaLevel::kAvx512) return kAvx512;
#endif
  return kScalar;
}

}  // namespace moecore
