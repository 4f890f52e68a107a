// Runner backend "flashinfer_cutedsl", the v2 path (sglang moe_runner/flashinfer_cutedsl.py →
// FlashInfer CuteDslMoEWrapper.run), fused-only. Registers: fused func (none, flashinfer_cutedsl)
// and fused func (flashinfer, flashinfer_cutedsl); both take a StandardDispatchOutput and a v2
// CuteDslFp4MoeQuantInfo. The v1 key (deepep, flashinfer_cutedsl: masked grouped GEMM, [Gate,
// Up], swizzled scales) is not built here.
//
// Numeric contract (scalar reference; the wrapper's kernels are opaque, spec §6.8, §7.2):
// w13 u8 [E, 2I, H/2] is [Up; Gate] interleaved in 64-row chunks [U0, G0, U1, G1, …], block
// scales arrive in the MMA view (w13 rows in that same order), w1_alpha / w2_alpha f32 [E],
// a1_scale / a2_scale are scalar NVFP4 global scales (already scalarised, R13). Expert ids are
// global; this rank holds [local_expert_offset, local_expert_offset + E). Per (token, slot):
//   x → NVFP4 with a1_scale (16-blocks, linear e4m3 scales, spec §7.2 rounding), unless the
//       flashinfer dispatcher sent it pre-quantized (hidden_states u8 [T, H/2] +
//       hidden_states_scale e4m3 [T, H/16], a2a "flashinfer" only);
//   h1 = round_bf16(w1_alpha[e] · Σ (qa·sa)(qw·sw))  (fp32 dot over exact products);
//   h2 = round_bf16(silu(gate) · up) in fp32 on the de-interleaved halves;
//   h2 → NVFP4 with a2_scale; y = round_bf16(w2_alpha[e] · Σ …);
//   out[t] = round_bf16(Σ_j w_j · y_j) in fp32, slot order. bf16 [T, H], weighted and summed.
// routed_scaling_factor is never applied here (the NVFP4 method folds it into the top-k
// weights). Guards (R15): silu only ("Only silu is supported for CuteDSL MoE."), gated only,
// apply_router_weight_on_input rejected, standard top-k only. Empty input → [0, H] (R9).
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

CombineInputPtr run_cutedsl_v2(const DispatchOutputPtr& dispatch, const QuantInfoPtr& quant_info,
                               const MoeRunnerConfig& config, bool flashinfer_a2a) {
  MOECORE_CHECK(dispatch != nullptr && quant_info != nullptr, kApi,
                ": expected a dispatch output and a quant info");
  MOECORE_ASSERT(config.activation == "silu", "Only silu is supported for CuteDSL MoE.");
  const ActivationSpec spec = activation_spec(config, kApi);
  MOECORE_CHECK(config.is_gated, kApi,
                ": the CuteDSL v2 wrapper runs gated SwiGLU only, got "
                "is_gated=False");
  if (config.gemm1_alpha || config.swiglu_limit)
    MOECORE_UNSUPPORTED(kApi, ": gemm1_alpha / swiglu_limit are not supported by CuteDSL MoE");
  MOECORE_ASSERT(!config.apply_router_weight_on_input,
                 "apply_router_weight_on_input is not supported for Flashinfer");
  if (config.no_combine)
    MOECORE_UNSUPPORTED(kApi, ": no_combine is not supported (the wrapper always combines)");
  const CuteDslFp4MoeQuantInfo& q = as_info(quant_info);
  auto* d = dynamic_cast<const StandardDispatchOutput*>(dispatch.get());
  MOECORE_CHECK_DTYPE(d != nullptr, kApi, ": expected a StandardDispatchOutput, got format ",
                      to_string(dispatch->format()));
  MOECORE_ASSERT(std::holds_alternative<StandardTopKOutput>(d->topk_output), kApi,
                 ": CuteDSL v2 requires a standard top-k output (TopKOutputChecker."
                 "format_is_standard), got a bypassed one");
  const StandardTopKOutput& topk = std::get<StandardTopKOutput>(d->topk_output);

  // Weights and scales.
  const Tensor& w13 = q.w13_weight;
  const Tensor& w2 = q.w2_weight;
  MOECORE_CHECK(w13.defined() && w2.defined() && w13.ndim() == 3 && w2.ndim() == 3 &&
                    w13.size(0) == w2.size(0),
                kApi, ": expected w13_weight [E, 2I, H/2] and w2_weight [E, H, I/2], got ",
                w13.describe(), " and ", w2.describe());
  const int64_t e = w13.size(0), h = w2.size(1), inter = w2.size(2) * 2;
  MOECORE_CHECK(h % kNvfp4BlockSize == 0 && inter % kNvfp4BlockSize == 0, kApi,
                ": NVFP4 needs H and I multiples of 16 (K of both GEMMs), got H = ", h,
                ", I = ", inter);
  MOECORE_CHECK(inter % kInterleaveGroup == 0, kApi,
                ": the v2 w13 layout interleaves 64-row "
                "chunks, so I must be a multiple of 64, got ",
                inter);
  check_packed_fp4(kApi, "w13_weight", w13, e, 2 * inter, h / 2);
  check_packed_fp4(kApi, "w2_weight", w2, e, h, inter / 2);
  check_per_expert(kApi, "w1_alpha", q.w1_alpha, e);
  check_per_expert(kApi, "w2_alpha", q.w2_alpha, e);
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
  Tensor sf13 =
      linear_from_mma(kApi, "w13_weight_sf", q.w13_weight_sf, e, 2 * inter, h / kNvfp4BlockSize);
  Tensor sf2 = linear_from_mma(kApi, "w2_weight_sf", q.w2_weight_sf, e, h, inter / kNvfp4BlockSize);
  MOECORE_CHECK(q.local_expert_offset >= 0, kApi, ": expected local_expert_offset >= 0, got ",
                q.local_expert_offset);

  // Input rows.
  const Tensor& x = d->hidden_states;
  MOECORE_CHECK(x.defined() && x.ndim() == 2, kApi, ": expected hidden_states [T, ·], got ",
                x.describe());
  RowLoader load_row;
  Tensor xsf;
  const bool prequantized = flashinfer_a2a && d->hidden_states_scale.defined();
  if (prequantized) {
    MOECORE_CHECK_DTYPE(x.dtype() == DType::kU8 || x.dtype() == DType::kFp4E2M1x2, kApi,
                        ": with hidden_states_scale, expected packed NVFP4 hidden_states uint8 "
                        "[T, H/2], got ",
                        x.describe());
    MOECORE_CHECK(x.size(1) == h / 2 && x.view().is_contiguous(), kApi,
                  ": expected contiguous packed hidden_states [T, ", h / 2, "], got ",
                  x.describe());
    const Tensor& s = d->hidden_states_scale;
    MOECORE_CHECK_DTYPE(s.dtype() == DType::kF8E4M3 || s.dtype() == DType::kU8, kApi,
                        ": expected hidden_states_scale float8_e4m3fn (or uint8), got ",
                        s.describe());
    MOECORE_CHECK(s.numel() == x.size(0) * (h / kNvfp4BlockSize) && s.view().is_contiguous(), kApi,
                  ": expected contiguous linear hidden_states_scale [", x.size(0), ", ",
                  h / kNvfp4BlockSize, "] (non-swizzled), got ", s.describe());
    xsf = s;
    check_block_scale_bytes(kApi, "hidden_states_scale", s.view());
    const uint8_t* xq = x.ptr<uint8_t>();
    const uint8_t* xs = s.ptr<uint8_t>();
    load_row = [xq, xs, h](int64_t t, float* dst) {
      nvfp4_code_values_row(xq + t * (h / 2), xs + t * (h / kNvfp4BlockSize), h, dst);
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
  const Tensor local_ids =
      localize_expert_ids(kApi, topk.topk_ids, q.local_expert_offset, e, id_limit, false);
  const RoutedTokens tokens = routed_tokens(kApi, local_ids, topk.topk_weights);
  MOECORE_CHECK(tokens.num_tokens == x.size(0), kApi, ": expected topk_ids with ", x.size(0),
                " rows (one per token), got ", topk.topk_ids.describe());

  Tensor out = Tensor::empty({tokens.num_tokens, h}, DType::kBF16);
  if (tokens.num_tokens == 0) return std::make_shared<StandardCombineInput>(out);  // R9

  ExpertMlp mlp;
  mlp.gemm1.weight.coding = WeightCoding::kNvfp4;
  mlp.gemm1.weight.data = w13.view();
  mlp.gemm1.weight.scale = sf13.view();
  mlp.gemm1.weight.alpha = q.w1_alpha.view();
  mlp.gemm1.weight.num_experts = e;
  mlp.gemm1.weight.n = 2 * inter;
  mlp.gemm1.weight.k = h;
  mlp.gemm2.weight.coding = WeightCoding::kNvfp4;
  mlp.gemm2.weight.data = w2.view();
  mlp.gemm2.weight.scale = sf2.view();
  mlp.gemm2.weight.alpha = q.w2_alpha.view();
  mlp.gemm2.weight.num_experts = e;
  mlp.gemm2.weight.n = h;
  mlp.gemm2.weight.k = inter;
  if (!prequantized) mlp.gemm1.quantize = nvfp4_quantizer(a1);
  mlp.gemm2.quantize = nvfp4_quantizer(a2);
  mlp.activation = spec;
  mlp.activation.layout = GateUpLayout::kUpGateInterleaved;
  mlp.activation.interleave_group = kInterleaveGroup;
  mlp.act_dtype = DType::kBF16;
  mlp.gemm = scaled_gemm_kernel(config.isa_level.value_or(IsaLevel::kScalar));
  mlp.hidden = h;
  mlp.inter = inter;
  // The fused funcs' state: one workspace for every runner of this backend (calls take turns).
  static ExpertWorkspace workspace;
  const Tensor slots = run_routed_experts(mlp, tokens, e, load_row, workspace);
  combine_weighted(tokens, slots, out, nullptr);
  return std::make_shared<StandardCombineInput>(out);
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

}  // namespace moecore
