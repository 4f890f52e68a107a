// The reference row of the activation-quantizer table (act_quant.h) and the table itself. The
// reference is formats' row functions, unchanged: codes pass through a stack buffer, kChunk values
// at a time, and are decoded back into the row, so nothing is allocated.
#include "moecore/kernels/act_quant.h"

#include <algorithm>

#include "moecore/formats/fp8.h"
#include "moecore/formats/quantize.h"

namespace moecore {
namespace {

// Codes per stack chunk (a multiple of the NVFP4 block: its blocks are independent).
constexpr int64_t kChunk = 512;

// x[0, n) ← the E4M3 values of the codes encode(x, len, q) gives, a chunk at a time.
template <typename Encode>
void fp8_in_place(float* x, int64_t n, const Encode& encode) {
  uint8_t q[kChunk];
  const float* table = fp8_e4m3_table();
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t len = std::min(kChunk, n - i0);
    encode(x + i0, len, q);
    for (int64_t i = 0; i < len; ++i) x[i0 + i] = table[q[i]];
  }
}

void fp8_mul_ref(float* x, int64_t n, float inv) {
  fp8_in_place(x, n, [inv](const float* v, int64_t len, uint8_t* q) {
    fp8_quantize_row_mul(v, len, inv, q);
  });
}

void fp8_div_ref(float* x, int64_t n, float s) {
  fp8_in_place(
      x, n, [s](const float* v, int64_t len, uint8_t* q) { fp8_quantize_row_div(v, len, s, q); });
}

void int8_ref(float* x, int64_t n, float amax) {
  int8_t q[kChunk];
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t len = std::min(kChunk, n - i0);
    int8_quantize_row(x + i0, len, amax, q);
    for (int64_t i = 0; i < len; ++i) x[i0 + i] = static_cast<float>(q[i]);
  }
}

void nvfp4_ref(float* x, int64_t n, float global_scale) {
  uint8_t q[kChunk / 2], sf[kChunk / kNvfp4BlockSize];
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t len = std::min(kChunk, n - i0);
    nvfp4_quantize_row(x + i0, len, global_scale, q, sf);
    nvfp4_code_values_row(q, sf, len, x + i0);
  }
}

}  // namespace

const ActQuantKernels kActQuantRef = {amax_row, fp8_mul_ref, fp8_div_ref, int8_ref, nvfp4_ref};

// Rows are named explicitly (a missing ISA file is a link error, not a silent gap).
const ActQuantKernels& act_quant_kernels(IsaLevel level) {
#ifdef MOECORE_COMPILED_AVX512
  if (level >= IsaLevel::kAvx512) return kActQuantAvx512;
#endif
#ifdef MOECORE_COMPILED_AVX2
  if (level >= IsaLevel::kAvx2) return kActQuantAvx2;
#endif
  return kActQuantRef;
}

}  // namespace moecore
