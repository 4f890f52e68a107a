// Scalar reference of the scaled GEMM: weight rows are decoded once per output channel and
// dotted with every activation row in the canonical order.
#include "moecore/kernels/quant_gemm.h"

#include <vector>

#include "moecore/core/error.h"
#include "moecore/formats/e8m0.h"
#include "moecore/formats/fp4.h"
#include "moecore/formats/fp8.h"
#include "moecore/kernels/convert.h"

namespace moecore {
namespace {

// Exact int32 dot of int8-valued codes (order-free, so every ISA level agrees).
float dot_int8(const float* a, const float* w, int64_t k) {
  int32_t acc = 0;
  for (int64_t i = 0; i < k; ++i) acc += static_cast<int32_t>(a[i]) * static_cast<int32_t>(w[i]);
  return static_cast<float>(acc);
}

float dot_f32(const float* a, const float* w, int64_t k) {
  float out;
  gemm_rows_times_wt_ref(a, 1, k, w, DType::kF32, k, 1, k, &out, 1);
  return out;
}

float per_tensor_or_channel_scale(const TensorView& scale, int64_t e, int64_t row) {
  if (scale.ndim == 1) return scale.ptr<float>()[e * scale.strides[0]];
  return *static_cast<const float*>(scale.at({e, row}));
}

}  // namespace

void weight_row_scales(const WeightOperand& w, int64_t e, int64_t row, float* scales) {
  switch (w.coding) {
    case WeightCoding::kFp8:
      if (w.block_k > 0) {
        const float* blocks = static_cast<const float*>(w.scale.at({e, row / w.block_n, 0}));
        for (int64_t b = 0; b < w.num_k_blocks(); ++b) scales[b] = blocks[b * w.scale.strides[2]];
      } else {
        scales[0] = per_tensor_or_channel_scale(w.scale, e, row);
      }
      return;
    case WeightCoding::kInt8:
      scales[0] = per_tensor_or_channel_scale(w.scale, e, row);
      return;
    case WeightCoding::kDense:
    case WeightCoding::kNvfp4:
    case WeightCoding::kMxfp4:
      scales[0] = 1.0f;
      return;
  }
  MOECORE_INTERNAL_CHECK(false, "unknown weight coding");
}

float fp4_block_scale(WeightCoding coding, uint8_t code) {
  return coding == WeightCoding::kNvfp4 ? fp8_e4m3_to_f32(code) : e8m0_to_f32(code);
}

void decode_weight_row(const WeightOperand& w, int64_t e, int64_t row, float* codes,
                       float* scales) {
  const int64_t k = w.k;
  weight_row_scales(w, e, row, scales);
  switch (w.coding) {
    case WeightCoding::kDense:
      load_f32(w.data.at({e, row, 0}), w.data.dtype, k, codes);
      return;
    case WeightCoding::kFp8: {
      const uint8_t* q = static_cast<const uint8_t*>(w.data.at({e, row, 0}));
      const float* table = fp8_e4m3_table();
      for (int64_t i = 0; i < k; ++i) codes[i] = table[q[i]];
      return;
    }
    case WeightCoding::kInt8: {
      const int8_t* q = static_cast<const int8_t*>(w.data.at({e, row, 0}));
      for (int64_t i = 0; i < k; ++i) codes[i] = static_cast<float>(q[i]);
      return;
    }
    case WeightCoding::kNvfp4:
    case WeightCoding::kMxfp4: {
      // Block scales fold into the codes: e2m1 (≤ 3 significant bits) × e4m3 or 2^e is exact.
      const int64_t group = fp4_group_size(w.coding);
      const uint8_t* packed = static_cast<const uint8_t*>(w.data.at({e, row, 0}));
      const uint8_t* block_scales = static_cast<const uint8_t*>(w.scale.at({e, row, 0}));
      for (int64_t b = 0; b < k / group; ++b) {
        const float s = fp4_block_scale(w.coding, block_scales[b]);
        for (int64_t i = b * group; i < (b + 1) * group; i += 2) {
          codes[i] = e2m1_to_f32(e2m1x2_lo(packed[i / 2])) * s;
          codes[i + 1] = e2m1_to_f32(e2m1x2_hi(packed[i / 2])) * s;
        }
      }
      return;
    }
  }
  MOECORE_INTERNAL_CHECK(false, "unknown weight coding");
}

void scaled_gemm_ref(const ActivationCodes& a, int64_t m, const WeightOperand& w, int64_t e,
                     int64_t n0, int64_t n, float* out, int64_t ldo) {
  const bool has_alpha = w.alpha.data != nullptr;
  if (w.coding == WeightCoding::kDense && a.scales == nullptr && !has_alpha) {
    gemm_rows_times_wt_ref(a.codes, m, a.ld, w.data.at({e, n0, 0}), w.data.dtype, w.k, n, w.k, out,
                           ldo);
    return;
  }
  const int64_t nb = w.num_k_blocks(), kb = w.k_block();
  MOECORE_INTERNAL_CHECK(a.scales == nullptr || a.scales_per_row == 1 || a.scales_per_row == nb,
                         "activation scales per row (", a.scales_per_row,
                         ") must be 1 or the weight's K blocks (", nb, ")");
  const bool integer = a.integer && w.coding == WeightCoding::kInt8;
  const float alpha = has_alpha ? w.alpha.ptr<float>()[e * w.alpha.strides[0]] : 1.0f;
  thread_local std::vector<float> codes, w_scales;
  codes.resize(static_cast<size_t>(w.k));
  w_scales.resize(static_cast<size_t>(nb));
  for (int64_t c = 0; c < n; ++c) {
    decode_weight_row(w, e, n0 + c, codes.data(), w_scales.data());
    for (int64_t r = 0; r < m; ++r) {
      const float* ar = a.codes + r * a.ld;
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t k0 = b * kb, len = std::min(kb, w.k - k0);
        float part = integer ? dot_int8(ar + k0, codes.data() + k0, len)
                             : dot_f32(ar + k0, codes.data() + k0, len);
        if (a.scales != nullptr) part *= a.scales[r * a.scales_per_row + (a.scales_per_row == 1 ? 0 : b)];
        part *= w_scales[b];
        acc = b == 0 ? part : acc + part;
      }
      out[r * ldo + c] = has_alpha ? acc * alpha : acc;
    }
  }
}

// Rows are named explicitly (a missing ISA file is a link error, not a silent gap).
ScaledGemmFn scaled_gemm_kernel(IsaLevel level) {
#ifdef MOECORE_COMPILED_AMX
  if (level >= IsaLevel::kAmx) return scaled_gemm_amx;
#endif
#ifdef MOECORE_COMPILED_AVX512BF16
  if (level >= IsaLevel::kAvx512Bf16) return scaled_gemm_avx512_bf16;
#endif
#ifdef MOECORE_COMPILED_AVX512
  if (level >= IsaLevel::kAvx512) return scaled_gemm_avx512;
#endif
  return scaled_gemm_ref;
}

}  // namespace moecore
