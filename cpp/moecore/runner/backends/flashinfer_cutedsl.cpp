// Runner backend "flashinfer_cutedsl" (sglang moe_runner/flashinfer_cutedsl.py), fused-only.
// Registers: fused func (none, flashinfer_cutedsl) and fused func (flashinfer,
// flashinfer_cutedsl) — the v2 path (FlashInfer CuteDslMoEWrapper.run) on a
// StandardDispatchOutput or a FlashinferDispatchOutput; fused func (deepep, flashinfer_cutedsl) —
// the v1 path (flashinfer_cutedsl_moe_masked) on a DeepEPLLDispatchOutput.
//
// Numeric contract (scalar reference; the kernels are opaque, spec §6.8, §7.2). Both versions
// run the same per-row expert MLP (expert_compute's expert_mlp):
//   x → NVFP4 with the a1 global scale (16-blocks, e4m3 scales, spec §7.2 rounding), unless the
//       dispatcher sent NVFP4 already (its codes and scales are used as they are);
//   h1 = round_bf16(w1_alpha[e] · Σ (qa·sa)(qw·sw))  (fp32 dot over exact products);
//   h2 = round_bf16(silu(gate) · up) in fp32; h2 → NVFP4 with the a2 global scale;
//   y = round_bf16(w2_alpha[e] · Σ …).
// v2: w13 u8 [E, 2I, H/2] is [Up; Gate] interleaved in 64-row chunks [U0, G0, U1, G1, …], block
//   scales in the MMA view (w13 rows in that order), a1_scale / a2_scale scalar (R13). Ids are
//   global; this rank holds [local_expert_offset, local_expert_offset + E) (a FlashinferDispatch-
//   Output may carry the invalid-token id num_experts: it contributes nothing). Pre-quantized
//   input: hidden_states u8 [T, H/2] + linear e4m3 hidden_states_scale [T, H/16] (a2a flashinfer
//   only). out[t] = round_bf16(Σ_j w_j · y_j) in fp32, slot order, bf16 [T, H], written into
//   moe_output when the FlashinferDispatchOutput has one.
// v1: w13 [Gate; Up] not interleaved, 128×4-swizzled block scales, per-expert a1_scale /
//   a2_scale / alphas ([E], or one value for all). Input [E, M, H] bf16 (or u8 [E, M, H/2] with
//   e4m3 scales [E, M, H/16] when use_nvfp4_dispatch); only the first masked_m[e] rows of expert
//   e are read. Output bf16 [E, M, H], UNWEIGHTED (rows past masked_m[e] zero), handed on as a
//   DeepEPLLCombineInput with the dispatch output's routing (DeepEP's combine weights and sums).
// routed_scaling_factor is never applied here (the NVFP4 method folds it into the top-k
// weights). Guards (R15): silu only ("Only silu is supported for CuteDSL MoE."), gated only,
// apply_router_weight_on_input rejected, v2 needs a standard top-k. Empty input → [0, H] (R9).
#include <algorithm>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/formats/quantize.h"
#include "moecore/kernels/convert.h"
#include "moecore/runner/backends/flashinfer_moe_common.h"
#include "moecore/runner/registry.h"

namespace moecore {
namespace {

using namespace flashinfer_detail;

constexpr const char* kApi = "MoeRunner(flashinfer_cutedsl)";
constexpr int64_t kInterleaveGroup = 64;


const CuteDslFp4MoeQuantInfo& as_info(const QuantInfoPtr& q) {
  auto* info = dynamic_cast<const CuteDslFp4MoeQuantInfo*>(q.get());
  MOECORE_CHECK_DTYPE(info != nullptr, kApi, ": expected CuteDslFp4MoeQuantInfo, got ", q->name());
  return *info;
}

/// The config guards both versions share (sglang asserts silu and no router weight on input).
ActivationSpec cutedsl_activation(const MoeRunnerConfig& config) {
  MOECORE_ASSERT(config.activation == "silu", "Only silu is supported for CuteDSL MoE.");
  const ActivationSpec spec = activation_spec(config, kApi);
  MOECORE_CHECK(config.is_gated, kApi,
                ": CuteDSL MoE runs gated SwiGLU only, got "
                "is_gated=False");
  if (config.gemm1_alpha || config.swiglu_limit)
    MOECORE_UNSUPPORTED(kApi, ": gemm1_alpha / swiglu_limit are not supported by CuteDSL MoE");
  MOECORE_ASSERT(!config.apply_router_weight_on_input,
                 "apply_router_weight_on_input is not supported for Flashinfer");
  if (config.no_combine)
    MOECORE_UNSUPPORTED(kApi, ": no_combine is not supported (CuteDSL always combines)");
  return spec;
}

/// Validated packed weights: E, H and I from w13 [E, 2I, H/2] and w2 [E, H, I/2].
struct Fp4Shapes {
  int64_t e = 0, h = 0, inter = 0;
};
Fp4Shapes check_fp4_weights(const CuteDslFp4MoeQuantInfo& q) {
  const Tensor& w13 = q.w13_weight;
  const Tensor& w2 = q.w2_weight;
  MOECORE_CHECK(w13.defined() && w2.defined() && w13.ndim() == 3 && w2.ndim() == 3 &&
                    w13.size(0) == w2.size(0),
                kApi, ": expected w13_weight [E, 2I, H/2] and w2_weight [E, H, I/2], got ",
                w13.describe(), " and ", w2.describe());
  Fp4Shapes s{w13.size(0), w2.size(1), w2.size(2) * 2};
  MOECORE_CHECK(s.h % kNvfp4BlockSize == 0 && s.inter % kNvfp4BlockSize == 0 && s.inter > 0, kApi,
                ": NVFP4 needs H and I multiples of 16 (K of both GEMMs), got H = ", s.h,
                ", I = ", s.inter);
  check_packed_fp4(kApi, "w13_weight", w13, s.e, 2 * s.inter, s.h / 2);
  check_packed_fp4(kApi, "w2_weight", w2, s.e, s.h, s.inter / 2);
  check_per_expert(kApi, "w1_alpha", q.w1_alpha, s.e);
  check_per_expert(kApi, "w2_alpha", q.w2_alpha, s.e);
  return s;
}

/// The expert MLP over linear block scales; the caller sets the activation quantizers.
/// The fused funcs' state: one workspace for every runner of this backend (calls take turns).
ExpertWorkspace& workspace() {
  static ExpertWorkspace ws;
  return ws;
}

ExpertMlp cutedsl_mlp(const CuteDslFp4MoeQuantInfo& q, const Fp4Shapes& s, const Tensor& sf13,
                      const Tensor& sf2, const ActivationSpec& spec, GateUpLayout layout,
                      const MoeRunnerConfig& config) {
  ExpertMlp mlp;
  auto operand = [&](WeightOperand& w, const Tensor& data, const Tensor& sf, const Tensor& alpha,
                     int64_t n, int64_t k) {
    w.coding = WeightCoding::kNvfp4;
    w.data = data.view();
    w.scale = sf.view();
    w.alpha = alpha.view();
    w.num_experts = s.e;
    w.n = n;
    w.k = k;
  };
  operand(mlp.gemm1.weight, q.w13_weight, sf13, q.w1_alpha, 2 * s.inter, s.h);
  operand(mlp.gemm2.weight, q.w2_weight, sf2, q.w2_alpha, s.h, s.inter);
  mlp.activation = spec;
  mlp.activation.layout = layout;
  mlp.activation.interleave_group = kInterleaveGroup;
  mlp.act_dtype = DType::kBF16;
  mlp.gemm = scaled_gemm_kernel(config.isa_level.value_or(IsaLevel::kScalar));
  mlp.hidden = s.h;
  mlp.inter = s.inter;
  return mlp;
}

/// Packed NVFP4 activations: codes u8 [lead..., H/2] and e4m3 scales [lead..., H/16], both
/// contiguous (shapes and dtypes checked; the caller checks the scale bytes it will read).
void check_nvfp4_payload(const Tensor& x, const Tensor& s, std::vector<int64_t> lead, int64_t h) {
  MOECORE_CHECK_DTYPE(x.dtype() == DType::kU8 || x.dtype() == DType::kFp4E2M1x2, kApi,
                      ": with hidden_states_scale, expected packed NVFP4 hidden_states uint8, got ",
                      x.describe());
  std::vector<int64_t> want = lead;
  want.push_back(h / 2);
  MOECORE_CHECK(x.view().shape_vector() == want && x.view().is_contiguous(), kApi,
                ": expected contiguous packed hidden_states ", shape_string(want), ", got ",
                x.describe());
  MOECORE_CHECK_DTYPE(s.dtype() == DType::kF8E4M3 || s.dtype() == DType::kU8, kApi,
                      ": expected hidden_states_scale float8_e4m3fn (or uint8), got ",
                      s.describe());
  want.back() = h / kNvfp4BlockSize;
  MOECORE_CHECK(s.view().shape_vector() == want && s.view().is_contiguous(), kApi,
                ": expected contiguous linear hidden_states_scale ", shape_string(want),
                " (non-swizzled), got ", s.describe());
}

// ---------------------------------------------------------------------------------------------
// v2

CombineInputPtr run_cutedsl_v2(const DispatchOutputPtr& dispatch, const QuantInfoPtr& quant_info,
                               const MoeRunnerConfig& config, bool flashinfer_a2a) {
  MOECORE_CHECK(dispatch != nullptr && quant_info != nullptr, kApi,
                ": expected a dispatch output and a quant info");
  const ActivationSpec spec = cutedsl_activation(config);
  const CuteDslFp4MoeQuantInfo& q = as_info(quant_info);
  const FlashinferInput in = flashinfer_input(kApi, dispatch, flashinfer_a2a, true);
  const Fp4Shapes s = check_fp4_weights(q);
  const int64_t e = s.e, h = s.h, inter = s.inter;
  MOECORE_CHECK(inter % kInterleaveGroup == 0, kApi,
                ": the v2 w13 layout interleaves 64-row "
                "chunks, so I must be a multiple of 64, got ",
                inter);
  MOECORE_CHECK(q.a1_scale.defined() && q.a1_scale.numel() == 1, kApi,
                ": the v2 path takes a scalar a1_scale (reduce per-expert scales with "
                "cutedsl_quant_scale_to_scalar), got ",
                q.a1_scale.describe());
  MOECORE_CHECK(q.a2_scale.defined() && q.a2_scale.numel() == 1, kApi,
                ": the v2 path takes a scalar a2_scale (fc2_input_scale), got ",
                q.a2_scale.describe());
  const float a1 = scalar_of(kApi, "a1_scale", q.a1_scale);
  const float a2 = scalar_of(kApi, "a2_scale", q.a2_scale);
  check_global_scale(kApi, "a1_scale", a1);
  check_global_scale(kApi, "a2_scale", a2);
  const Tensor sf13 =
      linear_from_mma(kApi, "w13_weight_sf", q.w13_weight_sf, e, 2 * inter, h / kNvfp4BlockSize);
  const Tensor sf2 =
      linear_from_mma(kApi, "w2_weight_sf", q.w2_weight_sf, e, h, inter / kNvfp4BlockSize);
  MOECORE_CHECK(q.local_expert_offset >= 0, kApi, ": expected local_expert_offset >= 0, got ",
                q.local_expert_offset);

  // Input rows.
  const Tensor& x = in.hidden_states;
  MOECORE_CHECK(x.defined() && x.ndim() == 2, kApi, ": expected hidden_states [T, ·], got ",
                x.describe());
  RowLoader load_row;
  const bool prequantized = flashinfer_a2a && in.hidden_states_scale.defined();
  if (prequantized) {
    const Tensor& xs = in.hidden_states_scale;
    check_nvfp4_payload(x, xs, {x.size(0)}, h);
    check_block_scale_bytes(kApi, "hidden_states_scale", xs.view());
    const uint8_t* xq = x.ptr<uint8_t>();
    const uint8_t* xsf = xs.ptr<uint8_t>();
    load_row = [xq, xsf, h](int64_t t, float* dst) {
      nvfp4_code_values_row(xq + t * (h / 2), xsf + t * (h / kNvfp4BlockSize), h, dst);
    };
  } else {
    MOECORE_CHECK_DTYPE(is_activation_dtype(x.dtype()), kApi,
                        ": expected hidden_states f32, f16 or bf16, got ", x.describe());
    MOECORE_CHECK(x.size(1) == h && x.view().rows_contiguous(), kApi,
                  ": expected hidden_states [T, ", h, "] with contiguous rows, got ", x.describe());
    const TensorView v = x.view();
    load_row = [v, h](int64_t t, float* dst) { load_f32(v.at({t, 0}), v.dtype, h, dst); };
  }

  const int64_t id_limit = config.num_experts.value_or(q.local_expert_offset + e);
  const Tensor local_ids = localize_expert_ids(kApi, in.topk.topk_ids, q.local_expert_offset, e,
                                               id_limit, in.flashinfer_format);
  const RoutedTokens tokens = routed_tokens(kApi, local_ids, in.topk.topk_weights);
  MOECORE_CHECK(tokens.num_tokens == x.size(0), kApi, ": expected topk_ids with ", x.size(0),
                " rows (one per token), got ", in.topk.topk_ids.describe());

  Tensor out = flashinfer_output_buffer(kApi, in, tokens.num_tokens, h, DType::kBF16);
  if (tokens.num_tokens == 0) return flashinfer_combine_input(in, out);  // R9

  ExpertMlp mlp =
      cutedsl_mlp(q, s, sf13, sf2, spec, GateUpLayout::kUpGateInterleaved, config);
  if (!prequantized) mlp.gemm1.quantize = nvfp4_quantizer(a1);
  mlp.gemm2.quantize = nvfp4_quantizer(a2);
  const Tensor slots = run_routed_experts(mlp, tokens, e, load_row, workspace());
  combine_weighted(tokens, slots, out, nullptr);
  return flashinfer_combine_input(in, out);
}

// ---------------------------------------------------------------------------------------------
// v1

/// A per-expert f32 scale given as [E] or as one value for all experts; every value finite > 0.
std::vector<float> per_expert_global_scales(const char* what, const Tensor& t, int64_t e) {
  MOECORE_CHECK(t.defined(), kApi, ": expected ", what, " float32 [", e, "], got None");
  MOECORE_CHECK_DTYPE(t.dtype() == DType::kF32, kApi, ": expected ", what, " float32, got ",
                      t.describe());
  MOECORE_CHECK(t.numel() == 1 || (t.ndim() == 1 && t.size(0) == e), kApi, ": expected ", what,
                " [", e, "] (one global scale per local expert) or one value, got ",
                t.describe());
  std::vector<float> v(static_cast<size_t>(e));
  for (int64_t i = 0; i < e; ++i) {
    v[i] = t.numel() == 1 ? *t.ptr<float>() : t.ptr<float>()[i * t.view().strides[0]];
    check_global_scale(kApi, what, v[i]);
  }
  return v;
}

/// DeepEP's NVFP4 scales as bytes: e4m3/u8 as they are; a wider dtype (DeepEP hands out int32
/// words) is viewed as its bytes, which sglang's .view(torch.float8_e4m3fn) can do only with a
/// unit last stride.
Tensor nvfp4_dispatch_scale_bytes(const Tensor& s) {
  if (dtype_size(s.dtype()) == 1) return s;
  MOECORE_ASSERT(s.ndim() >= 1 && s.view().strides[s.ndim() - 1] == 1,
                 "NVFP4 dispatch scale has stride(-1)=",
                 s.ndim() >= 1 ? s.view().strides[s.ndim() - 1] : 0,
                 ", dtype=", dtype_name(s.dtype()),
                 "; .view(float8_e4m3fn) requires stride(-1)==1. Try "
                 "SGLANG_MOE_NVFP4_DISPATCH=0 or check DeepEP version.");
  TensorView v = s.view();
  const int64_t width = dtype_size(s.dtype());
  v.shape[v.ndim - 1] *= width;
  for (int i = 0; i < v.ndim - 1; ++i) v.strides[i] *= width;
  v.dtype = DType::kF8E4M3;
  return Tensor(v, s.owner());
}

CombineInputPtr run_cutedsl_v1(const DispatchOutputPtr& dispatch, const QuantInfoPtr& quant_info,
                               const MoeRunnerConfig& config) {
  MOECORE_CHECK(dispatch != nullptr && quant_info != nullptr, kApi,
                ": expected a dispatch output and a quant info");
  const ActivationSpec spec = cutedsl_activation(config);
  const CuteDslFp4MoeQuantInfo& q = as_info(quant_info);
  auto* d = dynamic_cast<const DeepEPLLDispatchOutput*>(dispatch.get());
  MOECORE_CHECK_DTYPE(d != nullptr, kApi,
                      ": the v1 path (a2a deepep) takes a DeepEPLLDispatchOutput (DeepEP "
                      "low-latency mode), got format ",
                      to_string(dispatch->format()));
  const Fp4Shapes s = check_fp4_weights(q);
  const int64_t e = s.e, h = s.h, inter = s.inter;
  const Tensor sf13 = linear_from_swizzled(kApi, "w13_weight_sf", q.w13_weight_sf, e, 2 * inter,
                                           h / kNvfp4BlockSize);
  const Tensor sf2 =
      linear_from_swizzled(kApi, "w2_weight_sf", q.w2_weight_sf, e, h, inter / kNvfp4BlockSize);
  const std::vector<float> a2 = per_expert_global_scales("a2_scale", q.a2_scale, e);

  const Tensor& x = d->hidden_states;
  MOECORE_CHECK(x.defined() && x.ndim() == 3 && x.size(0) == e, kApi,
                ": expected hidden_states [E_local=", e, ", M, ·] (the masked layout), got ",
                x.describe());
  const int64_t m_cap = x.size(1);
  const bool prequantized = d->hidden_states_scale.defined();
  MOECORE_CHECK(prequantized == q.use_nvfp4_dispatch, kApi, ": use_nvfp4_dispatch=",
                q.use_nvfp4_dispatch ? "True" : "False", " but the DeepEP payload ",
                prequantized ? "is NVFP4 (hidden_states_scale given)"
                             : "is BF16 (no hidden_states_scale)",
                "; the quant method and the dispatcher must agree");
  std::vector<float> a1;
  Tensor xs;
  if (prequantized) {
    xs = nvfp4_dispatch_scale_bytes(d->hidden_states_scale);
    check_nvfp4_payload(x, xs, {e, m_cap}, h);
  } else {
    MOECORE_CHECK_DTYPE(x.dtype() == DType::kBF16, kApi,
                        ": expected a bf16 DeepEP payload, got ", x.describe());
    MOECORE_CHECK(x.size(2) == h && x.view().is_contiguous(), kApi,
                  ": expected contiguous hidden_states [", e, ", ", m_cap, ", ", h, "], got ",
                  x.describe());
    a1 = per_expert_global_scales("a1_scale", q.a1_scale, e);
  }
  const Tensor& mm = d->masked_m;
  MOECORE_CHECK(mm.defined() && mm.dtype() == DType::kI32 && mm.ndim() == 1 && mm.size(0) == e,
                kApi, ": expected masked_m int32 [", e, "], got ", mm.describe());
  std::vector<int64_t> counts(static_cast<size_t>(e));
  for (int64_t i = 0; i < e; ++i) {
    const int64_t m = mm.ptr<int32_t>()[i * mm.view().strides[0]];
    MOECORE_CHECK(m >= 0 && m <= m_cap, kApi, ": masked_m[", i, "] must be in [0, ", m_cap,
                  "], got ", m);
    if (prequantized && m > 0)  // only the valid rows: the rest is garbage by contract
      check_block_scale_bytes(kApi, "hidden_states_scale", xs.view().select(0, i).narrow(0, 0, m));
    counts[i] = m;
  }

  // One MLP per expert: the activation global scales are per expert, so experts run one after
  // another, each over the shared schedule's column blocks.
  const ExpertMlp base = cutedsl_mlp(q, s, sf13, sf2, spec, GateUpLayout::kGateUp, config);
  Tensor out = Tensor::zeros({e, m_cap, h}, DType::kBF16);
  ExpertWorkspace& ws = workspace();
  std::lock_guard<std::mutex> lock(ws.mutex);
  for (int64_t i = 0; i < e; ++i) {
    if (counts[i] == 0) continue;
    ExpertMlp mlp = base;
    if (!prequantized) mlp.gemm1.quantize = nvfp4_quantizer(a1[i]);
    mlp.gemm2.quantize = nvfp4_quantizer(a2[i]);
    // Rows 0..masked_m[i] of expert i alone: its slice of the masked layout in and out.
    std::vector<int64_t> only(static_cast<size_t>(e), 0);
    only[i] = counts[i];
    ws.rows.sorted_rows(only.data(), e);
    const int64_t base_row = i * m_cap;
    auto load = [&](int64_t r, float* dst) {
      const int64_t row = base_row + r;
      if (prequantized)
        nvfp4_code_values_row(x.ptr<uint8_t>() + row * (h / 2),
                              xs.ptr<uint8_t>() + row * (h / kNvfp4BlockSize), h, dst);
      else
        load_f32(x.ptr<uint16_t>() + row * h, DType::kBF16, h, dst);
    };
    run_expert_mlp(mlp, ws, load, RowScaleAt::kNone, out.view().select(0, i));
  }
  auto combine = std::make_shared<DeepEPLLCombineInput>();
  combine->hidden_states = out;
  combine->topk_ids = d->topk_ids;
  combine->topk_weights = d->topk_weights;
  return combine;
}

CombineInputPtr fused_none_to_flashinfer_cutedsl(const DispatchOutputPtr& d, const QuantInfoPtr& q,
                                                 const MoeRunnerConfig& config) {
  return run_cutedsl_v2(d, q, config, /*flashinfer_a2a=*/false);
}

CombineInputPtr fused_flashinfer_to_flashinfer_cutedsl(const DispatchOutputPtr& d,
                                                       const QuantInfoPtr& q,
                                                       const MoeRunnerConfig& config) {
  return run_cutedsl_v2(d, q, config, /*flashinfer_a2a=*/true);
}

}  // namespace

MOECORE_REGISTER_FUSED_FUNC(NONE, FLASHINFER_CUTEDSL, fused_none_to_flashinfer_cutedsl);
MOECORE_REGISTER_FUSED_FUNC(FLASHINFER, FLASHINFER_CUTEDSL, fused_flashinfer_to_flashinfer_cutedsl);
MOECORE_REGISTER_FUSED_FUNC(DEEPEP, FLASHINFER_CUTEDSL, run_cutedsl_v1);

}  // namespace moecore
