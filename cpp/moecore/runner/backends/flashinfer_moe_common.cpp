// Shared pieces of the FlashInfer runner backends (see flashinfer_moe_common.h). The expert MLP
// itself is expert_compute's: scaled_gemm's canonical fp32 dot, one rounding to the activation
// dtype after each GEMM and after the activation. Everything TokenMajorRun::run calls works in
// buffers allocated by its constructor.
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
#include "moecore/kernels/act_quant.h"
#include "moecore/kernels/convert.h"

namespace moecore::flashinfer_detail {
namespace {

constexpr int64_t kChunk = 512;  // values per stack chunk

/// When rsf is set, out = round(out · rsf): sglang multiplies the finished output.
void scale_output(const Tensor& out, const std::optional<float>& rsf) {
  if (!rsf) return;
  const float factor = *rsf;
  const int64_t hidden = out.size(1);
  const DType dtype = out.dtype();
  parallel_for(out.size(0), [&](int64_t begin, int64_t end) {
    float row[kChunk];
    for (int64_t t = begin; t < end; ++t)
      for (int64_t h0 = 0; h0 < hidden; h0 += kChunk) {
        const int64_t width = std::min(kChunk, hidden - h0);
        void* p = out.view().at({t, h0});
        load_f32(p, dtype, width, row);
        for (int64_t h = 0; h < width; ++h) row[h] *= factor;
        store_f32(row, width, dtype, p);
      }
  });
}

/// Swizzled byte view [B, Mp, Kbp] (any strides) → linear bytes [B, rows, kb] (contiguous).
void unswizzle_into(const TensorView& swizzled, int64_t rows, int64_t kb, uint8_t* linear) {
  const int64_t groups = swizzled.shape[0], kbp = swizzled.shape[2];
  const uint8_t* src = static_cast<const uint8_t*>(swizzled.data);
  parallel_for(groups * rows, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t g = row / rows, m = row % rows;
      for (int64_t k = 0; k < kb; ++k) {
        const int64_t flat = nvfp4_swizzled_offset(m, k, kbp);  // in one [Mp, Kbp] matrix
        linear[row * kb + k] = src[g * swizzled.strides[0] + flat / kbp * swizzled.strides[1] +
                                   flat % kbp * swizzled.strides[2]];
      }
    }
  });
}

}  // namespace

// ---------------------------------------------------------------------------------------------

void localize_expert_ids(const char* api, const TensorView& ids, int64_t offset, int64_t num_local,
                         int64_t id_limit, bool allow_invalid_id, int32_t* dst) {
  const int64_t rows = ids.shape[0], cols = ids.shape[1];
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t off = t * ids.strides[0] + j * ids.strides[1];
      const int64_t e =
          ids.dtype == DType::kI32 ? ids.ptr<int32_t>()[off] : ids.ptr<int64_t>()[off];
      const bool ok = (e >= -1 && e < id_limit) || (allow_invalid_id && e == id_limit);
      MOECORE_CHECK_INDEX(ok, api, ": expected topk_ids in [-1, ", id_limit, ")",
                          allow_invalid_id ? str_cat(" or the invalid-token id ", id_limit) : "",
                          " (global expert ids), got ", e, " at [", t, ", ", j, "]");
      dst[t * cols + j] =
          e >= offset && e < offset + num_local ? static_cast<int32_t>(e - offset) : -1;
    }
}


FlashinferInput flashinfer_input(const char* api, const DispatchOutputPtr& dispatch,
                                 bool flashinfer_a2a, bool require_standard_topk, bool capture) {
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
  const auto* bypassed = std::get_if<BypassedTopKOutput>(topk);
  if (!capture || bypassed == nullptr) {
    in.topk = to_standard(*topk);
    return in;
  }
  // Routed at every run into buffers of the shape select_experts returns; PreparedRouting
  // validates the logits and the config before these sizes matter.
  const Tensor& logits = bypassed->router_logits;
  const int64_t rows = logits.defined() && logits.ndim() == 2 ? logits.size(0) : 0;
  const int64_t top_k = std::max<int64_t>(bypassed->topk_config.top_k, 0);
  in.topk.topk_weights = Tensor::empty({rows, top_k}, DType::kF32);
  in.topk.topk_ids = Tensor::empty({rows, top_k}, DType::kI32);
  in.topk.router_logits = logits;
  in.routing = std::make_shared<PreparedRouting>(bypassed->topk_config, logits,
                                                 in.topk.topk_weights, in.topk.topk_ids);
  in.routed_rows = bypassed->num_token_non_padded.value_or(rows);
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
                api, ": expected a contiguous, writable moe_output [", tokens, ", ", hidden,
                "], got ", o.describe());
  return o;
}

CombineInputPtr flashinfer_combine_input(const FlashinferInput& in, Tensor out) {
  if (in.flashinfer_format) return std::make_shared<FlashinferCombineInput>(std::move(out));
  return std::make_shared<StandardCombineInput>(std::move(out));
}

// ---------------------------------------------------------------------------------------------

Nvfp4InputScales::Nvfp4InputScales(Tensor linear) : source_(linear), linear_(std::move(linear)) {}

Nvfp4InputScales::Nvfp4InputScales(const TensorView& swizzled, Tensor source, int64_t rows,
                                   int64_t kb)
    : source_(std::move(source)),
      swizzled_(swizzled),
      linear_(Tensor::empty({rows, kb}, DType::kF8E4M3)) {}

void Nvfp4InputScales::refresh(const char* api) {
  if (swizzled_)
    unswizzle_into(*swizzled_, linear_.size(0), linear_.size(1), linear_.ptr<uint8_t>());
  check_block_scale_bytes(api, "hidden_states_scale", linear_.view());
}

// ---------------------------------------------------------------------------------------------

TokenMajorRun::TokenMajorRun(const char* api, TokenMajorPlan plan,
                             std::shared_ptr<ExpertWorkspace> workspace)
    : PreparedRun(nullptr), api_(api), plan_(std::move(plan)), workspace_(std::move(workspace)) {
  const FlashinferInput& in = plan_.input;
  const Tensor& ids = in.topk.topk_ids;
  MOECORE_CHECK(ids.defined() && ids.ndim() == 2, api, ": expected topk_ids [T, k], got ",
                ids.describe());
  MOECORE_CHECK_DTYPE(ids.dtype() == DType::kI32 || ids.dtype() == DType::kI64, api,
                      ": expected topk_ids int32 or int64, got ", ids.describe());
  const Tensor& weights = in.topk.topk_weights;
  MOECORE_CHECK_DTYPE(weights.defined() && weights.dtype() == DType::kF32, api,
                      ": expected topk_weights float32, got ", weights.describe());
  MOECORE_CHECK(weights.view().shape_vector() == ids.view().shape_vector(), api,
                ": expected topk_weights with the shape of topk_ids ",
                shape_string(ids.view().shape_vector()), ", got ", weights.describe());
  const int64_t num_tokens = ids.size(0), top_k = ids.size(1);
  MOECORE_CHECK(top_k >= 1, api, ": expected top_k >= 1, got ", top_k);
  MOECORE_CHECK(num_tokens == in.hidden_states.size(0), api, ": expected topk_ids with ",
                in.hidden_states.size(0), " rows (one per token), got ", ids.describe());
  local_ids_ = Tensor::empty({num_tokens, top_k}, DType::kI32);
  tokens_.topk_ids = local_ids_.view();
  tokens_.topk_weights = weights.view();
  tokens_.num_tokens = num_tokens;
  tokens_.top_k = top_k;

  const ExpertMlp& mlp = plan_.mlp;
  out_ = flashinfer_output_buffer(api, in, num_tokens, mlp.hidden, mlp.act_dtype);
  combine_input_ = flashinfer_combine_input(in, out_);
  std::lock_guard<std::mutex> lock(workspace_->mutex);  // a shared workspace may be in use
  workspace_->reserve(mlp, num_tokens * top_k);
}

void TokenMajorRun::run() {
  const FlashinferInput& in = plan_.input;
  if (in.routing) in.routing->run(in.routed_rows);
  if (plan_.input_scales) plan_.input_scales->refresh(api_);
  localize_expert_ids(api_, in.topk.topk_ids.view(), plan_.expert_offset, plan_.num_local_experts,
                      plan_.id_limit, plan_.allow_invalid_id, local_ids_.ptr<int32_t>());
  if (tokens_.num_tokens == 0) return;  // R9: no kernel for empty input
  {
    ExpertWorkspace& ws = *workspace_;
    std::lock_guard<std::mutex> lock(ws.mutex);
    ws.rows.group_slots(tokens_, plan_.num_local_experts, /*with_scale=*/false);
    expert_gemm1_phase(plan_.mlp, ws, plan_.load_row, RowScaleAt::kNone);
    // Σ_j w[t, j] · slot[t, j] over valid slots in fp32, slot order, rounded once to out's
    // dtype: the combine, read from GEMM2's rows (no per-slot rows).
    expert_gemm2_summed_phase(plan_.mlp, ws, RowScaleAt::kNone,
                              TopkSum{&tokens_, /*weighted=*/true, 1.0f, out_.view(), /*bias=*/{}});
  }
  scale_output(out_, plan_.routed_scaling_factor);
}

// ---------------------------------------------------------------------------------------------

ActivationQuantizer nvfp4_quantizer(IsaLevel level, float global_scale) {
  const ActQuantKernels* kernels = &act_quant_kernels(level);
  return [kernels, global_scale](float* rows, int64_t m, int64_t k, int64_t ld, float* scales) {
    for (int64_t r = 0; r < m; ++r) {
      kernels->nvfp4(rows + r * ld, k, global_scale);
      scales[r] = 1.0f;
    }
  };
}

void use_nvfp4_quantizer(ExpertGemm& g, IsaLevel level, float global_scale) {
  g.quantize = nvfp4_quantizer(level, global_scale);
  g.quantize_segment = kNvfp4BlockSize;
}

void use_fp8_multiply_quantizer(ExpertGemm& g, IsaLevel level, float multiplier) {
  g.quantize = fp8_multiply_quantizer(level, multiplier);
  g.quantize_segment = 1;
}

ActivationQuantizer fp8_multiply_quantizer(IsaLevel level, float multiplier) {
  const ActQuantKernels* kernels = &act_quant_kernels(level);
  return [kernels, multiplier](float* rows, int64_t m, int64_t k, int64_t ld, float* scales) {
    for (int64_t r = 0; r < m; ++r) {
      kernels->fp8_mul(rows + r * ld, k, multiplier);
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
                  fp8_e4m3_to_f32(p[i]), " (code 0x", Hex{p[i]}, ") at flat index ", i);
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

TensorView swizzled_scale_bytes(const char* api, const char* what, const Tensor& swizzled,
                                int64_t e, int64_t rows, int64_t kb) {
  const TensorView v = scale_bytes(api, what, swizzled);
  const int64_t mp = (rows + 127) / 128 * 128, kbp = (kb + 3) / 4 * 4;
  MOECORE_CHECK(v.ndim == 3 && v.shape[0] == e && v.shape[1] == mp && v.shape[2] == kbp, api,
                ": expected ", what, " 128x4-swizzled [", e, ", ", mp, ", ", kbp, "] (rows ", rows,
                ", K/16 = ", kb, "), got ", swizzled.describe());
  return v;
}

const Tensor& checked_linear_scales(const char* api, const char* what, const Tensor& linear,
                                    int64_t e, int64_t rows, int64_t kb) {
  MOECORE_CHECK_DTYPE(linear.dtype() == DType::kF8E4M3, api, ": expected ", what,
                      " float8_e4m3fn, got ", linear.describe());
  MOECORE_CHECK(linear.view().shape_vector() == std::vector<int64_t>({e, rows, kb}) &&
                    linear.view().is_contiguous(),
                api, ": expected ", what, " contiguous [", e, ", ", rows, ", ", kb, "], got ",
                linear.describe());
  return linear;
}

Tensor linear_from_swizzled(const char* api, const char* what, const Tensor& swizzled, int64_t e,
                            int64_t rows, int64_t kb) {
  const TensorView v = swizzled_scale_bytes(api, what, swizzled, e, rows, kb);
  Tensor linear = Tensor::empty({e, rows, kb}, DType::kF8E4M3);
  unswizzle_into(v, rows, kb, linear.ptr<uint8_t>());
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
