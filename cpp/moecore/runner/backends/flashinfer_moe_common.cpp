// Shared pieces of the FlashInfer runner backends (see flashinfer_moe_common.h). The expert MLP
// itself is expert_compute's: scaled_gemm's canonical fp32 dot, one rounding to the activation
// dtype after each GEMM and after the activation.
#include "moecore/runner/backends/flashinfer_moe_common.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/core/thread_pool.h"
#include "moecore/formats/fp4.h"
#include "moecore/formats/fp8.h"
#include "moecore/formats/layout.h"
#include "moecore/formats/quantize.h"
#include "moecore/kernels/convert.h"

namespace moecore::flashinfer_detail {
Tensor run_routed_experts(const ExpertMlp& mlp, const RoutedTokens& local,
                          int64_t num_local_experts, const RowLoader& load_row,
                          ExpertWorkspace& workspace) {
  Tensor slots = Tensor::zeros({local.num_tokens, local.top_k, mlp.hidden}, mlp.act_dtype);
  std::lock_guard<std::mutex> lock(workspace.mutex);
  workspace.rows.group_slots(local, num_local_experts, /*with_scale=*/false);
  run_expert_mlp(mlp, workspace, load_row, RowScaleAt::kNone, slot_rows(slots.view()));
  return slots;
}

void combine_weighted(const RoutedTokens& local, const Tensor& slots, const Tensor& out,
                      const float* rsf) {
  combine_topk(local, slots.view(), /*weighted=*/true, 1.0f, out.view());
  if (rsf == nullptr) return;
  const float factor = *rsf;
  const int64_t hidden = out.size(1);
  const DType dtype = out.dtype();
  parallel_for(out.size(0), [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(hidden));
    for (int64_t t = begin; t < end; ++t) {
      void* p = out.view().at({t, 0});
      load_f32(p, dtype, hidden, row.data());
      for (float& v : row) v *= factor;
      store_f32(row.data(), hidden, dtype, p);
    }
  });
}

Tensor localize_expert_ids(const char* api, const Tensor& ids, int64_t offset, int64_t num_local,
                           int64_t id_limit, bool allow_invalid_id) {
  MOECORE_CHECK(ids.defined() && ids.ndim() == 2, api, ": expected topk_ids [T, k], got ",
                ids.describe());
  MOECORE_CHECK_DTYPE(ids.dtype() == DType::kI32 || ids.dtype() == DType::kI64, api,
                      ": expected topk_ids int32 or int64, got ", ids.describe());
  const TensorView v = ids.view();
  const int64_t rows = v.shape[0], cols = v.shape[1];
  Tensor local = Tensor::empty({rows, cols}, DType::kI32);
  int32_t* dst = local.ptr<int32_t>();
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t off = t * v.strides[0] + j * v.strides[1];
      const int64_t e = v.dtype == DType::kI32 ? v.ptr<int32_t>()[off] : v.ptr<int64_t>()[off];
      const bool ok = (e >= -1 && e < id_limit) || (allow_invalid_id && e == id_limit);
      MOECORE_CHECK_INDEX(ok, api, ": expected topk_ids in [-1, ", id_limit, ")",
                          allow_invalid_id ? str_cat(" or the invalid-token id ", id_limit) : "",
                          " (global expert ids), got ", e, " at [", t, ", ", j, "]");
      dst[t * cols + j] =
          e >= offset && e < offset + num_local ? static_cast<int32_t>(e - offset) : -1;
    }
  return local;
}

RoutedTokens routed_tokens(const char* api, const Tensor& local_ids, const Tensor& topk_weights) {
  MOECORE_CHECK_DTYPE(topk_weights.defined() && topk_weights.dtype() == DType::kF32, api,
                      ": expected topk_weights float32, got ", topk_weights.describe());
  MOECORE_CHECK(topk_weights.view().shape_vector() == local_ids.view().shape_vector(), api,
                ": expected topk_weights with the shape of topk_ids ",
                shape_string(local_ids.view().shape_vector()), ", got ", topk_weights.describe());
  RoutedTokens r;
  r.topk_ids = local_ids.view();
  r.topk_weights = topk_weights.view();
  r.num_tokens = local_ids.size(0);
  r.top_k = local_ids.size(1);
  MOECORE_CHECK(r.top_k >= 1, api, ": expected top_k >= 1, got ", r.top_k);
  return r;
}

FlashinferInput flashinfer_input(const char* api, const DispatchOutputPtr& dispatch,
                                 bool flashinfer_a2a, bool require_standard_topk) {
  FlashinferInput in;
  const TopKOutput* topk = nullptr;
  if (auto* s = dynamic_cast<const StandardDispatchOutput*>(dispatch.get())) {
    in.hidden_states = s->hidden_states;
    in.hidden_states_scale = s->hidden_states_scale;
    topk = &s->topk_output;
  } else if (auto* f = dynamic_cast<const FlashinferDispatchOutput*>(dispatch.get());
             f != nullptr && flashinfer_a2a) {
    in.hidden_states = f->hidden_states;
    in.hidden_states_scale = f->hidden_states_scale;
    in.moe_output = f->moe_output;
    in.output_dtype = f->output_dtype;
    in.flashinfer_format = true;
    topk = &f->topk_output;
  } else {
    MOECORE_THROW(DTypeError, api, ": expected a StandardDispatchOutput",
                  flashinfer_a2a ? " or a FlashinferDispatchOutput" : "", ", got format ",
                  to_string(dispatch->format()));
  }
  if (require_standard_topk)
    MOECORE_ASSERT(std::holds_alternative<StandardTopKOutput>(*topk), api,
                   ": CuteDSL requires a standard top-k output (TopKOutputChecker."
                   "format_is_standard), got a bypassed one");
  in.topk = to_standard(*topk);
  return in;
}

Tensor flashinfer_output_buffer(const char* api, const FlashinferInput& in, int64_t tokens,
                                int64_t hidden, DType dtype) {
  if (in.output_dtype)
    MOECORE_CHECK_DTYPE(*in.output_dtype == dtype, api, ": the dispatch output asks for ",
                        dtype_name(*in.output_dtype), " output, but this path produces ",
                        dtype_name(dtype));
  if (!in.moe_output.defined()) return Tensor::empty({tokens, hidden}, dtype);
  const Tensor& o = in.moe_output;
  MOECORE_CHECK_DTYPE(o.dtype() == dtype, api, ": expected moe_output ", dtype_name(dtype),
                      ", got ", o.describe());
  MOECORE_CHECK(o.view().shape_vector() == std::vector<int64_t>({tokens, hidden}) &&
                    o.view().is_contiguous() && o.view().writable,
                api, ": expected a contiguous, writable moe_output [", tokens, ", ", hidden, "], got ",
                o.describe());
  return o;
}

CombineInputPtr flashinfer_combine_input(const FlashinferInput& in, Tensor out) {
  if (in.flashinfer_format) return std::make_shared<FlashinferCombineInput>(std::move(out));
  return std::make_shared<StandardCombineInput>(std::move(out));
}

// ---------------------------------------------------------------------------------------------

ActivationQuantizer nvfp4_quantizer(float global_scale) {
  return [global_scale](float* rows, int64_t m, int64_t k, int64_t ld, float* scales) {
    std::vector<uint8_t> q(static_cast<size_t>(k / 2)), sf(static_cast<size_t>(k / 16));
    for (int64_t r = 0; r < m; ++r) {
      float* row = rows + r * ld;
      nvfp4_quantize_row(row, k, global_scale, q.data(), sf.data());
      nvfp4_code_values_row(q.data(), sf.data(), k, row);
      scales[r] = 1.0f;
    }
  };
}

ActivationQuantizer fp8_multiply_quantizer(float multiplier) {
  return [multiplier](float* rows, int64_t m, int64_t k, int64_t ld, float* scales) {
    std::vector<uint8_t> q(static_cast<size_t>(k));
    const float* table = fp8_e4m3_table();
    for (int64_t r = 0; r < m; ++r) {
      float* row = rows + r * ld;
      fp8_quantize_row_mul(row, k, multiplier, q.data());
      for (int64_t i = 0; i < k; ++i) row[i] = table[q[i]];
      scales[r] = 1.0f;
    }
  };
}

// ---------------------------------------------------------------------------------------------

float scalar_of(const char* api, const char* what, const Tensor& t) {
  MOECORE_CHECK(t.defined(), api, ": expected ", what, " (a float32 scalar), got None");
  MOECORE_CHECK_DTYPE(t.dtype() == DType::kF32, api, ": expected ", what, " float32, got ",
                      t.describe());
  MOECORE_CHECK(t.numel() == 1, api, ": expected ", what, " to hold one value, got ", t.describe());
  return *t.ptr<float>();  // numel 1: the data pointer addresses the only element
}

void check_global_scale(const char* api, const char* what, float v) {
  MOECORE_CHECK(std::isfinite(v) && v > 0.0f, api, ": expected ", what, " finite and > 0, got ", v);
}

void check_per_expert(const char* api, const char* what, const Tensor& t, int64_t num_experts) {
  MOECORE_CHECK(t.defined(), api, ": expected ", what, " float32 [", num_experts, "], got None");
  MOECORE_CHECK_DTYPE(t.dtype() == DType::kF32, api, ": expected ", what, " float32, got ",
                      t.describe());
  MOECORE_CHECK(t.ndim() == 1 && t.size(0) == num_experts, api, ": expected ", what, " [",
                num_experts, "], got ", t.describe());
  for (int64_t e = 0; e < num_experts; ++e) {
    const float v = t.ptr<float>()[e * t.view().strides[0]];
    MOECORE_CHECK(std::isfinite(v) && v >= 0.0f, api, ": expected ", what, " finite and >= 0, got ",
                  v, " for expert ", e);
  }
}

void check_packed_fp4(const char* api, const char* what, const Tensor& t, int64_t e, int64_t rows,
                      int64_t cols) {
  MOECORE_CHECK(t.defined(), api, ": expected ", what, " uint8 [", e, ", ", rows, ", ", cols,
                "], got None");
  MOECORE_CHECK_DTYPE(t.dtype() == DType::kU8 || t.dtype() == DType::kFp4E2M1x2, api, ": expected ",
                      what, " uint8 (packed e2m1, two values per byte), got ", t.describe());
  MOECORE_CHECK(t.ndim() == 3 && t.size(0) == e && t.size(1) == rows && t.size(2) == cols, api,
                ": expected ", what, " [", e, ", ", rows, ", ", cols, "], got ", t.describe());
  MOECORE_CHECK(t.view().is_contiguous(), api, ": expected ", what, " contiguous");
}

void check_block_scale_bytes(const char* api, const char* what, const TensorView& linear) {
  const uint8_t* p = static_cast<const uint8_t*>(linear.data);
  const int64_t n = linear.numel();
  for (int64_t i = 0; i < n; ++i)
    MOECORE_CHECK(p[i] < 0x7f, api, ": expected ", what,
                  " finite and >= 0 (e4m3 codes 0x00-0x7e), "
                  "got ",
                  fp8_e4m3_to_f32(p[i]), " (code 0x", std::hex, int(p[i]), std::dec,
                  ") at flat index ", i);
}

namespace {

// e4m3 / u8 (or i32 holding four scale bytes) [E, a, b] → a byte view [E, a, b'] with b' = b
// (or 4b for i32).
TensorView scale_bytes(const char* api, const char* what, const Tensor& t) {
  MOECORE_CHECK(t.defined(), api, ": expected ", what, ", got None");
  const DType d = t.dtype();
  MOECORE_CHECK_DTYPE(d == DType::kF8E4M3 || d == DType::kU8 || d == DType::kI32, api,
                      ": expected ", what, " float8_e4m3fn (or its uint8 / int32 view), got ",
                      t.describe());
  TensorView v = t.view();
  if (d == DType::kI32) {
    MOECORE_CHECK(v.ndim >= 1 && v.strides[v.ndim - 1] == 1, api, ": expected ", what,
                  " as int32 to have a contiguous last dim, got ", t.describe());
    v.shape[v.ndim - 1] *= 4;
    for (int i = 0; i < v.ndim - 1; ++i) v.strides[i] *= 4;
  }
  v.dtype = DType::kF8E4M3;
  return v;
}

}  // namespace

Tensor linear_from_swizzled(const char* api, const char* what, const Tensor& swizzled, int64_t e,
                            int64_t rows, int64_t kb) {
  const TensorView v = scale_bytes(api, what, swizzled);
  const int64_t mp = (rows + 127) / 128 * 128, kbp = (kb + 3) / 4 * 4;
  MOECORE_CHECK(v.ndim == 3 && v.shape[0] == e && v.shape[1] == mp && v.shape[2] == kbp, api,
                ": expected ", what, " 128x4-swizzled [", e, ", ", mp, ", ", kbp, "] (rows ", rows,
                ", K/16 = ", kb, "), got ", swizzled.describe());
  Tensor linear = unswizzle_nvfp4_scales(v, rows, kb);
  check_block_scale_bytes(api, what, linear.view());
  return linear;
}

Tensor linear_from_mma(const char* api, const char* what, const Tensor& mma, int64_t e,
                       int64_t rows, int64_t kb) {
  const TensorView v = scale_bytes(api, what, mma);
  MOECORE_CHECK(mma.dtype() != DType::kI32, api, ": expected ", what,
                " as float8_e4m3fn or uint8 bytes, got int32");
  const int64_t mt = (rows + 127) / 128, kt = (kb + 3) / 4;
  const std::vector<int64_t> want{32, 4, mt, 4, kt, e};
  MOECORE_CHECK(v.shape_vector() == want, api, ": expected ", what, " in the MMA layout ",
                shape_string(want), " (32, 4, m_tiles, 4, k_tiles, E) for rows ", rows,
                ", K/16 = ", kb, ", got ", mma.describe());
  Tensor linear = Tensor::empty({e, rows, kb}, DType::kF8E4M3);
  uint8_t* dst = linear.ptr<uint8_t>();
  const uint8_t* src = static_cast<const uint8_t*>(v.data);
  for (int64_t b = 0; b < e; ++b)
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t k = 0; k < kb; ++k) {
        const int64_t j = m % 32, i = (m % 128) / 32, t = m / 128, c = k % 4, q = k / 4;
        const int64_t off = j * v.strides[0] + i * v.strides[1] + t * v.strides[2] +
                            c * v.strides[3] + q * v.strides[4] + b * v.strides[5];
        dst[(b * rows + m) * kb + k] = src[off];
      }
  check_block_scale_bytes(api, what, linear.view());
  return linear;
}

std::string python_shape(const std::vector<int64_t>& shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + (shape.size() == 1 ? ",)" : ")");
}

}  // namespace moecore::flashinfer_detail
