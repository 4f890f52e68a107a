// Runner backend "flashinfer_cutlass" (sglang moe_runner/flashinfer_cutlass.py → FlashInfer
// cutlass_fused_moe), fused-only. Registers: fused func (none, flashinfer_cutlass) and fused func
// (flashinfer, flashinfer_cutlass); both take FlashInferCutlassMoeQuantInfo and a
// StandardDispatchOutput, the flashinfer one also a FlashinferDispatchOutput (its result goes
// into moe_output when given, and comes back as a FlashinferCombineInput). Prepared runs
// (standard, flashinfer_cutlass) and (flashinfer, flashinfer_cutlass) capture them; each fused
// func is its prepared run built and run once (flashinfer_moe_common's TokenMajorRun).
//
// Numeric contract (scalar reference; FlashInfer's kernel is opaque, so this is moecore's reading
// of the formulas of spec §6.3, §6.4, §7.2, §7.4). w13 is [Up; Gate] (load_up_proj_weight_first),
// expert ids are global (local = id − ep_rank·E_local; others and −1 contribute nothing).
// Act dtype A = output dtype (output_dtype, else: x's dtype for bf16/fp8, bf16 for fp4).
//  * bf16: h1 = round_A(x·W13ᵀ) (fp32 dot) → h2 = round_A(act(gate, up)) → y = round_A(h2·W2ᵀ).
//  * fp8 (quant_scales = [fc1_dequant [E], fc2_quant, fc2_dequant [E], fc1_input_dequant]):
//    xq = e4m3(sat(x · fp32(1/fc1_input_dequant))); h1 = round_A((xq·W13qᵀ) · fc1_dequant[e]);
//    h2 = round_A(act); hq = e4m3(sat(h2 · fc2_quant)); y = round_A((hq·W2qᵀ) · fc2_dequant[e]).
//  * fp4 (quant_scales = [a1_gscale, w13 swizzled sf, g1_alphas [E], a2_gscale, w2 swizzled sf,
//    g2_alphas [E]]): x → NVFP4 with a1_gscale (16-blocks, e4m3 scales, spec §7.2 rounding);
//    h1 = round_A(g1_alphas[e] · Σ (qa·sa)(qw·sw)) (fp32 dot over the exact products);
//    h2 = round_A(act) → NVFP4 with a2_gscale → y = round_A(g2_alphas[e] · Σ …). A
//    pre-quantized input (hidden_states u8 [T, H/2] + hidden_states_scale: 128×4-swizzled from
//    the FP4 all-gather, linear [T, H/16] from the flashinfer dispatcher, as FlashInfer's
//    swizzled_input_sf=False) skips the first quantization.
// Then out = round_out(Σ_j w_j · y_j) in fp32, slot order; routed_scaling_factor multiplies
// the finished output (one more rounding) only for bf16/fp8 and only if
// apply_routed_scaling_factor — exactly once; fp4 never applies it (the NVFP4 method folds it
// into the top-k weights). Activations: silu/gelu gated → Swiglu/Geglu (gate = second half),
// relu2 non-gated → Relu2; others are rejected like sglang's assertion.
// apply_router_weight_on_input is rejected. TP fields are accepted and unused (weights arrive
// sharded). Empty input returns [0, H] without running anything (R9); inplace is ignored
// (FlashInfer always writes a new output).
#include <optional>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/formats/quantize.h"
#include "moecore/kernels/convert.h"
#include "moecore/runner/backends/flashinfer_moe_common.h"
#include "moecore/runner/registry.h"

namespace moecore {
namespace {

using namespace flashinfer_detail;

constexpr const char* kApi = "MoeRunner(flashinfer_cutlass)";

const char* flashinfer_activation_name(Activation kind, bool gated) {
  switch (kind) {
    case Activation::SILU:
      return gated ? "Swiglu" : "Silu";
    case Activation::GELU:
      return gated ? "Geglu" : "Gelu";
    case Activation::GELU_TANH:
      return nullptr;
    case Activation::RELU2:
      return "Relu2";
  }
  return nullptr;
}

// sglang's _activation_type: the config's activation must map to Swiglu, Geglu, Relu2 (or
// Identity, which no sglang activation string produces).
ActivationSpec cutlass_activation(const MoeRunnerConfig& config) {
  const ActivationSpec spec = activation_spec(config, kApi);  // unknown names: ValueError (R15)
  if (config.gemm1_alpha || config.swiglu_limit)
    MOECORE_UNSUPPORTED(kApi,
                        ": gemm1_alpha / swiglu_limit (clamped SwiGLU) are not supported by "
                        "flashinfer cutlass moe through MoeRunnerConfig");
  const char* name = flashinfer_activation_name(spec.kind, spec.gated);
  const bool supported =
      name != nullptr && (std::string(name) == "Swiglu" || std::string(name) == "Geglu" ||
                          std::string(name) == "Relu2");
  MOECORE_ASSERT(supported, "Activation '", config.activation,
                 "' (is_gated=", config.is_gated ? "True" : "False", ") maps to ",
                 name ? name : "no FlashInfer ActivationType",
                 ", which is not supported by flashinfer cutlass moe.");
  return spec;
}

const FlashInferCutlassMoeQuantInfo& as_info(const QuantInfoPtr& q) {
  auto* info = dynamic_cast<const FlashInferCutlassMoeQuantInfo*>(q.get());
  MOECORE_CHECK_DTYPE(info != nullptr,
                      "Unexpected quant_info type for flashinfer_cutlass: ", q->name());
  return *info;
}

WeightOperand operand(WeightCoding coding, const Tensor& data, int64_t e, int64_t n, int64_t k) {
  WeightOperand w;
  w.coding = coding;
  w.data = data.view();
  w.num_experts = e;
  w.n = n;
  w.k = k;
  return w;
}

DType output_dtype_or(const FlashInferCutlassMoeQuantInfo& q, DType fallback) {
  const DType d = q.output_dtype.value_or(fallback);
  MOECORE_CHECK_DTYPE(is_activation_dtype(d), kApi,
                      ": expected output_dtype f32, f16 or bf16, "
                      "got ",
                      dtype_name(d));
  return d;
}

// Float hidden_states [T, H] (rows contiguous) → a loader widening row t to fp32.
RowLoader float_rows(const Tensor& x, int64_t hidden) {
  MOECORE_CHECK_DTYPE(is_activation_dtype(x.dtype()), kApi,
                      ": expected hidden_states f32, f16 or bf16, got ", x.describe());
  MOECORE_CHECK(x.ndim() == 2 && x.size(1) == hidden, kApi, ": expected hidden_states [T, ", hidden,
                "], got ", x.describe());
  MOECORE_CHECK(x.view().rows_contiguous(), kApi,
                ": expected hidden_states rows contiguous (inner stride 1)");
  const TensorView v = x.view();
  return [v, hidden](int64_t t, float* dst) { load_f32(v.at({t, 0}), v.dtype, hidden, dst); };
}

// A swizzled [Mp, Kbp] activation scale seen as one group [1, Mp, Kbp] (same storage).
Tensor with_group_dim(const Tensor& t) {
  if (!t.defined() || t.ndim() != 2) return t;
  TensorView v = t.view();
  v.ndim = 3;
  v.shape[2] = v.shape[1];
  v.shape[1] = v.shape[0];
  v.shape[0] = 1;
  v.strides[2] = v.strides[1];
  v.strides[1] = v.strides[0];
  v.strides[0] = v.shape[1] * v.strides[1];
  return Tensor(v, t.owner());
}

// Expert count, I and gating from w13 [E, N1, K1] and w2 [E, H, K2] (K in values).
void check_mlp_shapes(const Tensor& w13, const Tensor& w2, int64_t h, int64_t inter, bool gated) {
  MOECORE_CHECK(w13.defined() && w2.defined() && w13.ndim() == 3 && w2.ndim() == 3, kApi,
                ": expected w13_weight [E, N, K] and w2_weight [E, H, K'], got ", w13.describe(),
                " and ", w2.describe());
  MOECORE_CHECK(w2.size(0) == w13.size(0) && w2.size(1) == h, kApi, ": expected w2_weight [",
                w13.size(0), ", ", h, ", ·], got ", w2.describe());
  MOECORE_CHECK(inter > 0 && w13.size(1) == (gated ? 2 : 1) * inter, kApi,
                ": expected w13_weight rows ", gated ? "2·I" : "I",
                " (is_gated=", gated ? "True" : "False", ", I = ", inter, " from w2_weight), got ",
                w13.describe());
}

// The MLP (its act dtype is the output dtype), the input loader and the local expert range of
// quant_type `q.quant_type` over p.input, validated; weight block scales are unswizzled here, once.
void resolve_quant_type(const FlashInferCutlassMoeQuantInfo& q, const ActivationSpec& spec,
                        const MoeRunnerConfig& config, TokenMajorPlan& p) {
  const FlashinferInput& d = p.input;
  const Tensor& x = d.hidden_states;
  MOECORE_CHECK(x.defined(), kApi, ": hidden_states is required");
  const Tensor& w13 = q.w13_weight;
  const Tensor& w2 = q.w2_weight;
  MOECORE_CHECK(w13.defined() && w2.defined() && w13.ndim() == 3 && w2.ndim() == 3, kApi,
                ": expected 3-d w13_weight and w2_weight, got ", w13.describe(), " and ",
                w2.describe());
  const int64_t e = w13.size(0);
  const bool gated = spec.gated;
  ExpertMlp& mlp = p.mlp;
  mlp.activation = spec;
  mlp.activation.layout = gated ? GateUpLayout::kUpGate : GateUpLayout::kGateUp;
  mlp.gemm = config.gemm_kernel();

  if (q.quant_type == "bf16") {
    MOECORE_CHECK(q.quant_scales.empty(), kApi, ": quant_type 'bf16' takes no quant_scales, got ",
                  q.quant_scales.size());
    MOECORE_CHECK_DTYPE(is_activation_dtype(w13.dtype()) && w2.dtype() == w13.dtype(), kApi,
                        ": quant_type 'bf16' expects f32/f16/bf16 weights of one dtype, got ",
                        w13.describe(), " and ", w2.describe());
    MOECORE_CHECK(!d.hidden_states_scale.defined(), kApi,
                  ": quant_type 'bf16' takes no "
                  "hidden_states_scale (the input is not quantized)");
    const int64_t h = w13.size(2), inter = w2.size(2);
    check_mlp_shapes(w13, w2, h, inter, gated);
    MOECORE_CHECK(w13.view().is_contiguous() && w2.view().is_contiguous(), kApi,
                  ": expected contiguous expert weights");
    MOECORE_CHECK_DTYPE(x.dtype() == w13.dtype(), kApi,
                        ": hidden_states dtype must equal the "
                        "weights' (",
                        dtype_name(w13.dtype()), "), got ", x.describe());
    p.load_row = float_rows(x, h);
    mlp.act_dtype = output_dtype_or(q, x.dtype());
    mlp.gemm1.weight = operand(WeightCoding::kDense, w13, e, w13.size(1), h);
    mlp.gemm2.weight = operand(WeightCoding::kDense, w2, e, h, inter);
    mlp.hidden = h;
    mlp.inter = inter;
  } else if (q.quant_type == "fp8") {
    MOECORE_CHECK(q.quant_scales.size() == 4, kApi,
                  ": quant_type 'fp8' needs 4 quant_scales "
                  "[fc1_dequant, fc2_quant, fc2_dequant, fc1_input_dequant], got ",
                  q.quant_scales.size());
    MOECORE_CHECK_DTYPE(w13.dtype() == DType::kF8E4M3 && w2.dtype() == DType::kF8E4M3, kApi,
                        ": quant_type 'fp8' expects float8_e4m3fn weights, got ", w13.describe(),
                        " and ", w2.describe());
    const int64_t h = w13.size(2), inter = w2.size(2);
    check_mlp_shapes(w13, w2, h, inter, gated);
    MOECORE_CHECK(w13.view().is_contiguous() && w2.view().is_contiguous(), kApi,
                  ": expected contiguous expert weights");
    check_per_expert(kApi, "quant_scales[0] (fc1_dequant)", q.quant_scales[0], e);
    const float fc2_quant = scalar_of(kApi, "quant_scales[1] (fc2_quant)", q.quant_scales[1]);
    check_global_scale(kApi, "quant_scales[1] (fc2_quant)", fc2_quant);
    check_per_expert(kApi, "quant_scales[2] (fc2_dequant)", q.quant_scales[2], e);
    const float in_dq = scalar_of(kApi, "quant_scales[3] (fc1_input_dequant)", q.quant_scales[3]);
    check_global_scale(kApi, "quant_scales[3] (fc1_input_dequant)", in_dq);
    p.load_row = float_rows(x, h);  // hidden_states_scale is dropped, as in sglang
    mlp.act_dtype = output_dtype_or(q, x.dtype());
    mlp.gemm1.weight = operand(WeightCoding::kFp8, w13, e, w13.size(1), h);
    mlp.gemm1.weight.scale = q.quant_scales[0].view();
    mlp.gemm2.weight = operand(WeightCoding::kFp8, w2, e, h, inter);
    mlp.gemm2.weight.scale = q.quant_scales[2].view();
    // sgl-kernel: x · (1/scale)
    use_fp8_multiply_quantizer(mlp.gemm1, config.kernel_level(), 1.0f / in_dq);
    use_fp8_multiply_quantizer(mlp.gemm2, config.kernel_level(), fc2_quant);
    mlp.hidden = h;
    mlp.inter = inter;
  } else if (q.quant_type == "fp4") {
    MOECORE_CHECK(q.quant_scales.size() == 6, kApi,
                  ": quant_type 'fp4' needs 6 quant_scales "
                  "[a1_gscale, w13_blockscale_swizzled, g1_alphas, a2_gscale, "
                  "w2_blockscale_swizzled, g2_alphas], got ",
                  q.quant_scales.size());
    const int64_t h = w2.size(1), inter = w2.size(2) * 2;
    MOECORE_CHECK(h % kNvfp4BlockSize == 0 && inter % kNvfp4BlockSize == 0, kApi,
                  ": NVFP4 needs H and I multiples of 16 (K of both GEMMs), got H = ", h,
                  ", I = ", inter);
    const int64_t n1 = (gated ? 2 : 1) * inter;
    check_packed_fp4(kApi, "w13_weight", w13, e, n1, h / 2);
    check_packed_fp4(kApi, "w2_weight", w2, e, h, inter / 2);
    const float a1 = scalar_of(kApi, "quant_scales[0] (a1_gscale)", q.quant_scales[0]);
    check_global_scale(kApi, "quant_scales[0] (a1_gscale)", a1);
    check_per_expert(kApi, "quant_scales[2] (g1_alphas)", q.quant_scales[2], e);
    const float a2 = scalar_of(kApi, "quant_scales[3] (a2_gscale)", q.quant_scales[3]);
    check_global_scale(kApi, "quant_scales[3] (a2_gscale)", a2);
    check_per_expert(kApi, "quant_scales[5] (g2_alphas)", q.quant_scales[5], e);
    const Nvfp4LinearScales& linear = q.linear_scales;
    Tensor sf13 = linear.w13.defined()
                      ? checked_linear_scales(kApi, "linear_scales.w13", linear.w13, e, n1,
                                              h / kNvfp4BlockSize)
                      : linear_from_swizzled(kApi, "quant_scales[1] (w13 block scales)",
                                             q.quant_scales[1], e, n1, h / kNvfp4BlockSize);
    Tensor sf2 = linear.w2.defined()
                     ? checked_linear_scales(kApi, "linear_scales.w2", linear.w2, e, h,
                                             inter / kNvfp4BlockSize)
                     : linear_from_swizzled(kApi, "quant_scales[4] (w2 block scales)",
                                            q.quant_scales[4], e, h, inter / kNvfp4BlockSize);
    mlp.act_dtype = output_dtype_or(q, DType::kBF16);
    if (d.hidden_states_scale.defined()) {
      // Pre-quantized NVFP4 input (FP4 all-gather / NVFP4 dispatch): swizzled scales.
      MOECORE_CHECK_DTYPE(x.dtype() == DType::kU8 || x.dtype() == DType::kFp4E2M1x2, kApi,
                          ": with hidden_states_scale, expected packed NVFP4 hidden_states "
                          "uint8 [T, H/2], got ",
                          x.describe());
      MOECORE_CHECK(x.ndim() == 2 && x.size(1) == h / 2 && x.view().is_contiguous(), kApi,
                    ": expected contiguous packed hidden_states [T, ", h / 2, "], got ",
                    x.describe());
      const int64_t t = x.size(0), kb = h / kNvfp4BlockSize;
      const Tensor& s = d.hidden_states_scale;
      if (d.flashinfer_format) {  // the flashinfer dispatcher's linear [T, H/16] scales
        MOECORE_CHECK_DTYPE(s.dtype() == DType::kF8E4M3 || s.dtype() == DType::kU8, kApi,
                            ": expected hidden_states_scale float8_e4m3fn (or uint8), got ",
                            s.describe());
        MOECORE_CHECK(
            s.view().shape_vector() == std::vector<int64_t>({t, kb}) && s.view().is_contiguous(),
            kApi, ": expected contiguous linear hidden_states_scale [", t, ", ", kb,
            "] (the flashinfer dispatcher's), got ", s.describe());
        p.input_scales.emplace(s);
      } else {
        const Tensor grouped = with_group_dim(s);
        p.input_scales.emplace(swizzled_scale_bytes(kApi, "hidden_states_scale", grouped, 1, t, kb),
                               grouped, t, kb);
      }
      const uint8_t* xq = x.ptr<uint8_t>();
      const uint8_t* xsf = p.input_scales->bytes();  // checked by every run before it is read
      p.load_row = [xq, xsf, h](int64_t row, float* dst) {
        nvfp4_code_values_row(xq + row * (h / 2), xsf + row * (h / kNvfp4BlockSize), h, dst);
      };
    } else {
      p.load_row = float_rows(x, h);
      use_nvfp4_quantizer(mlp.gemm1, config.kernel_level(), a1);
    }
    mlp.gemm1.weight = operand(WeightCoding::kNvfp4, w13, e, n1, h);
    mlp.gemm1.weight.scale = sf13.view();
    mlp.gemm1.weight.alpha = q.quant_scales[2].view();
    mlp.gemm2.weight = operand(WeightCoding::kNvfp4, w2, e, h, inter);
    mlp.gemm2.weight.scale = sf2.view();
    mlp.gemm2.weight.alpha = q.quant_scales[5].view();
    use_nvfp4_quantizer(mlp.gemm2, config.kernel_level(), a2);
    p.keep_alive.push_back(sf13);
    p.keep_alive.push_back(sf2);
    mlp.hidden = h;
    mlp.inter = inter;
  } else {
    MOECORE_THROW(InvalidArgument, kApi, ": quant_type must be 'bf16', 'fp8' or 'fp4', got '",
                  q.quant_type, "'");
  }
  p.expert_offset = q.moe_ep_rank * e;
  p.num_local_experts = e;
  p.id_limit = e * q.moe_ep_size;
}

// The whole call resolved from the dispatch output, the quant info and the config.
TokenMajorPlan cutlass_plan(const DispatchOutputPtr& dispatch, const QuantInfoPtr& quant_info,
                            const MoeRunnerConfig& config, bool flashinfer_a2a, bool capture) {
  MOECORE_CHECK(dispatch != nullptr && quant_info != nullptr, kApi,
                ": expected a dispatch output and a quant info");
  const FlashInferCutlassMoeQuantInfo& q = as_info(quant_info);
  MOECORE_ASSERT(!config.apply_router_weight_on_input,
                 "apply_router_weight_on_input is not supported for Flashinfer");
  const ActivationSpec spec = cutlass_activation(config);
  if (config.no_combine)
    MOECORE_UNSUPPORTED(kApi, ": no_combine is not supported (FlashInfer always combines top-k)");
  TokenMajorPlan plan;
  plan.input = flashinfer_input(kApi, dispatch, flashinfer_a2a, false, capture);
  MOECORE_CHECK(q.moe_ep_size >= 1 && q.moe_ep_rank >= 0 && q.moe_ep_rank < q.moe_ep_size &&
                    q.moe_tp_size >= 1 && q.moe_tp_rank >= 0 && q.moe_tp_rank < q.moe_tp_size,
                kApi, ": bad TP/EP topology (tp ", q.moe_tp_rank, "/", q.moe_tp_size, ", ep ",
                q.moe_ep_rank, "/", q.moe_ep_size, ")");
  resolve_quant_type(q, spec, config, plan);
  attach_weight_tiles(q.weight_tiles.get(), plan.mlp);
  plan.dispatch = dispatch;
  plan.quant_info = quant_info;
  plan.allow_invalid_id = flashinfer_a2a;
  if (q.quant_type != "fp4" && q.apply_routed_scaling_factor)
    plan.routed_scaling_factor = config.routed_scaling_factor;
  return plan;
}

CombineInputPtr run_cutlass(const DispatchOutputPtr& dispatch, const QuantInfoPtr& quant_info,
                            const MoeRunnerConfig& config, bool flashinfer_a2a) {
  // The fused funcs' state: one workspace for every runner of this backend (calls take turns).
  static const auto workspace = std::make_shared<ExpertWorkspace>();
  TokenMajorRun call(kApi, cutlass_plan(dispatch, quant_info, config, flashinfer_a2a, false),
                     workspace);
  call.run();
  return call.combine_input();
}

CombineInputPtr fused_none_to_flashinfer_cutlass(const DispatchOutputPtr& d, const QuantInfoPtr& q,
                                                 const MoeRunnerConfig& config) {
  return run_cutlass(d, q, config, /*flashinfer_a2a=*/false);
}

CombineInputPtr fused_flashinfer_to_flashinfer_cutlass(const DispatchOutputPtr& d,
                                                       const QuantInfoPtr& q,
                                                       const MoeRunnerConfig& config) {
  return run_cutlass(d, q, config, /*flashinfer_a2a=*/true);
}

PreparedRunPtr prepare_cutlass(const DispatchOutputPtr& d, const QuantInfoPtr& q,
                               const MoeRunnerConfig& config, MoeA2ABackend a2a) {
  return std::make_unique<TokenMajorRun>(
      kApi, cutlass_plan(d, q, config, a2a == MoeA2ABackend::FLASHINFER, true),
      std::make_shared<ExpertWorkspace>());
}

}  // namespace

MOECORE_REGISTER_FUSED_FUNC(NONE, FLASHINFER_CUTLASS, fused_none_to_flashinfer_cutlass);
MOECORE_REGISTER_FUSED_FUNC(FLASHINFER, FLASHINFER_CUTLASS, fused_flashinfer_to_flashinfer_cutlass);
MOECORE_REGISTER_PREPARED_RUN(STANDARD, FLASHINFER_CUTLASS, prepare_cutlass);
MOECORE_REGISTER_PREPARED_RUN(FLASHINFER, FLASHINFER_CUTLASS, prepare_cutlass);

}  // namespace moecore
