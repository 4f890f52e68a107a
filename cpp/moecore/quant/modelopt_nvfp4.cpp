// ModelOptNvFp4FusedMoEMethod and the CuteDSL scale helpers (sglang modelopt_quant.py,
// moe_runner/flashinfer_cutedsl.py). Layout changes happen once, in
// process_weights_after_loading; the backend choice is frozen in create_weights.
#include "moecore/quant/modelopt_nvfp4.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/formats/layout.h"
#include "moecore/formats/quantize.h"
#include "moecore/kernels/convert.h"
#include "moecore/layer/fused_moe.h"
#include "moecore/runner/backends/flashinfer_moe_common.h"

namespace moecore {
namespace {

using flashinfer_detail::linear_from_swizzled;
using flashinfer_detail::python_shape;

constexpr const char* kName = "ModelOptNvFp4FusedMoEMethod";
constexpr int64_t kGroupSize = 16;     // NVFP4 block
constexpr int64_t kCuteDslGroup = 64;  // interleave_w13_halves group of the v2 w13 layout
constexpr float kScaleEps = 1e-12f;    // sglang's clamp(min=1e-12) in the CuteDSL resolution

// Any float view (f32/f16/bf16, any shape and strides) → its values in row-major order.
std::vector<float> values_of(const TensorView& v, const char* what) {
  MOECORE_CHECK_DTYPE(is_activation_dtype(v.dtype), kName, ": expected ", what,
                      " f32, f16 or bf16, got ", v.describe());
  const Tensor c = Tensor::copy_of(v);
  std::vector<float> out(static_cast<size_t>(c.numel()));
  load_f32(c.view().data, c.dtype(), c.numel(), out.data());
  return out;
}

Tensor f32_tensor(const std::vector<float>& values) {
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())}, DType::kF32);
  std::copy(values.begin(), values.end(), t.ptr<float>());
  return t;
}

// sglang's _align_scale_to_alpha: a scale vector matched to the alpha vector's length.
std::vector<float> align_scale_to_alpha(const Tensor& scale, int64_t alpha_numel,
                                        const std::vector<int64_t>& alpha_shape,
                                        const CuteDslScaleInputs& in, const char* name) {
  std::vector<float> v = values_of(scale.view(), name);
  std::vector<int64_t> shape = scale.view().shape_vector();
  if (shape.empty()) return std::vector<float>(static_cast<size_t>(alpha_numel), v[0]);
  if (shape.size() == 2 && shape[1] <= 2) {  // gated [E, 2]: the gate (first) column
    std::vector<float> col(static_cast<size_t>(shape[0]));
    for (int64_t e = 0; e < shape[0]; ++e) col[e] = v[e * shape[1]];
    v = col;
    shape = {shape[0]};
  }
  const int64_t n = static_cast<int64_t>(v.size());
  if (n == alpha_numel) return v;
  if (n == 1) return std::vector<float>(static_cast<size_t>(alpha_numel), v[0]);
  if (in.num_local_experts && in.num_experts && n == *in.num_experts &&
      alpha_numel == *in.num_local_experts) {
    const int64_t start = in.moe_ep_rank * alpha_numel;
    MOECORE_CHECK(start >= 0 && start + alpha_numel <= n,
                  "resolve_cutedsl_standard_scales: "
                  "moe_ep_rank ",
                  in.moe_ep_rank, " is outside ", n, " / ", alpha_numel, " experts");
    return std::vector<float>(v.begin() + start, v.begin() + start + alpha_numel);
  }
  MOECORE_THROW(InvalidArgument, "Unable to align ", name, " shape=", python_shape(shape),
                " to alpha shape=", python_shape(alpha_shape),
                " for CuteDSL standard scale resolution.");
}

void check_finite_nonneg(const std::vector<float>& v, const char* what) {
  for (size_t i = 0; i < v.size(); ++i)
    MOECORE_CHECK(std::isfinite(v[i]) && v[i] >= 0.0f, kName, ": expected ", what,
                  " finite and >= 0, got ", v[i], " at flat index ", i);
}

// The values of a registered f32 parameter (row-major).
std::vector<float> param_values(const FusedMoE& layer, const char* name) {
  return values_of(layer.parameter(name).view(), name);
}

}  // namespace

Tensor cutedsl_quant_scale_to_scalar(const TensorView& quant_scale, const std::string& name) {
  const std::vector<float> v = values_of(quant_scale, name.c_str());
  float out = 1.0f;  // empty: sglang's 1.0 fallback
  if (!v.empty()) {
    out = v[0];
    for (float x : v) {
      if (std::isnan(x) || std::isnan(out)) {
        out = std::numeric_limits<float>::quiet_NaN();
        break;
      }
      out = std::min(out, x);
    }
  }
  return f32_tensor({out});
}

CuteDslStandardScales resolve_cutedsl_standard_scales(const CuteDslScaleInputs& in) {
  constexpr const char* kApi = "resolve_cutedsl_standard_scales";
  MOECORE_CHECK(in.w13_input_scale_quant.defined() && in.w2_input_scale_quant.defined(), kApi,
                ": w13_input_scale_quant and w2_input_scale_quant are required");
  MOECORE_CHECK(in.g1_alphas.defined() && in.g2_alphas.defined(), kApi,
                ": g1_alphas and g2_alphas are required (they give the alpha shapes)");
  const int64_t n1 = in.g1_alphas.numel(), n2 = in.g2_alphas.numel();
  CuteDslStandardScales out;
  out.fc2_input_scale =
      cutedsl_quant_scale_to_scalar(in.w2_input_scale_quant.view(), "w2_input_scale_quant");
  out.used_input_scale =
      cutedsl_quant_scale_to_scalar(in.w13_input_scale_quant.view(), "w13_input_scale_quant");
  const float fc2 = std::max(out.fc2_input_scale.ptr<float>()[0], kScaleEps);
  const float used = std::max(out.used_input_scale.ptr<float>()[0], kScaleEps);

  std::vector<float> w2_alpha;
  if (in.w2_weight_scale_2.defined()) {
    w2_alpha = align_scale_to_alpha(in.w2_weight_scale_2, n2, in.g2_alphas.view().shape_vector(),
                                    in, "w2_weight_scale_2");
    for (float& a : w2_alpha) a = a / fc2;
  } else {
    std::vector<float> q =
        align_scale_to_alpha(in.w2_input_scale_quant, n2, in.g2_alphas.view().shape_vector(), in,
                             "w2_input_scale_quant");
    const std::vector<float> g2 = values_of(in.g2_alphas.view(), "g2_alphas");
    w2_alpha.resize(static_cast<size_t>(n2));
    for (int64_t e = 0; e < n2; ++e) w2_alpha[e] = (g2[e] * std::max(q[e], kScaleEps)) / fc2;
  }
  std::vector<float> w1_alpha;
  if (in.w13_weight_scale_2.defined()) {
    w1_alpha = align_scale_to_alpha(in.w13_weight_scale_2, n1, in.g1_alphas.view().shape_vector(),
                                    in, "w13_weight_scale_2");
    for (float& a : w1_alpha) a = a / used;
  } else {
    std::vector<float> q =
        align_scale_to_alpha(in.w13_input_scale_quant, n1, in.g1_alphas.view().shape_vector(), in,
                             "w13_input_scale_quant");
    const std::vector<float> g1 = values_of(in.g1_alphas.view(), "g1_alphas");
    w1_alpha.resize(static_cast<size_t>(n1));
    for (int64_t e = 0; e < n1; ++e) w1_alpha[e] = (g1[e] * std::max(q[e], kScaleEps)) / used;
  }
  out.w1_alpha = f32_tensor(w1_alpha);
  out.w2_alpha = f32_tensor(w2_alpha);
  return out;
}

// ---------------------------------------------------------------------------------------------

void ModelOptNvFp4FusedMoEMethod::create_weights(FusedMoE& layer, int64_t num_experts,
                                                 int64_t hidden_size, int64_t inter,
                                                 DType params_dtype, bool with_bias) {
  MOECORE_CHECK(!created_, kName,
                ": create_weights already ran; create one "
                "ModelOptNvFp4FusedMoEMethod per layer");
  if (with_bias) MOECORE_UNSUPPORTED(kName, ": NVFP4 MoE has no expert biases (with_bias=True)");
  MOECORE_CHECK_DTYPE(is_activation_dtype(params_dtype), kName,
                      ": params_dtype must be f32, f16 or bf16, got ", dtype_name(params_dtype));
  MOECORE_CHECK(hidden_size % kGroupSize == 0 && inter % kGroupSize == 0, kName,
                ": NVFP4 needs hidden_size and intermediate_size_per_partition to be multiples "
                "of 16 (one e4m3 scale per 16 values along K), got ",
                hidden_size, " and ", inter);
  const MoeRunnerConfig& config = layer.config();
  const bool gated = config.is_gated;

  // The backend and the CuteDSL version are decided here, once (R17).
  MoeRunnerBackend backend = layer.runner_backend();
  if (backend == MoeRunnerBackend::AUTO) backend = MoeRunnerBackend::FLASHINFER_CUTLASS;
  if (backend == MoeRunnerBackend::FLASHINFER_CUTEDSL) {
    // sglang's is_flashinfer_cutedsl_v1_path: a2a deepep runs v1, anything else v2.
    cutedsl_v1_ = layer.a2a_backend() == MoeA2ABackend::DEEPEP;
    cutedsl_v2_ = !cutedsl_v1_;
    MOECORE_CHECK(gated, kName, ": the CuteDSL ", cutedsl_v1_ ? "v1" : "v2",
                  " path runs gated SwiGLU only, got is_gated=False");
  } else if (backend != MoeRunnerBackend::FLASHINFER_CUTLASS) {
    MOECORE_UNSUPPORTED(kName, ": runner backend '", to_string(backend),
                        "' is not supported for NVFP4 MoE in moecore (supported: auto, "
                        "flashinfer_cutlass, flashinfer_cutedsl)");
  }
  // Routed scaling is fused into the top-k weights for this method (sglang's
  // should_fuse_routed_scaling_factor_in_topk): routing must apply it, the runner never does.
  if (config.routed_scaling_factor && *config.routed_scaling_factor != 1.0f) {
    const TopKConfig& topk = layer.options().topk_config;
    MOECORE_CHECK(topk.apply_routed_scaling_factor_on_output && topk.renormalize &&
                      topk.routed_scaling_factor == config.routed_scaling_factor,
                  kName, ": routed_scaling_factor=", *config.routed_scaling_factor,
                  " is folded into the top-k weights for NVFP4 MoE; set TopKConfig("
                  "routed_scaling_factor=",
                  *config.routed_scaling_factor,
                  ", apply_routed_scaling_factor_on_output=True, renormalize=True) so routing "
                  "applies it exactly once (the runner never does)");
  }
  MOECORE_CHECK(!nvfp4_dispatch_ || cutedsl_v1_, kName,
                ": nvfp4_dispatch (SGLANG_MOE_NVFP4_DISPATCH) applies to the CuteDSL v1 path "
                "(runner flashinfer_cutedsl, a2a deepep) only");
  backend_ = backend;
  up_first_ = gated && !cutedsl_v1_;  // flashinfer_cutlass and CuteDSL v2 load [Up, Gate]

  const int64_t e = num_experts, h = hidden_size;
  const int64_t e_global = layer.options().num_experts;
  const int64_t n1 = (gated ? 2 : 1) * inter;
  const int64_t shards = gated ? 2 : 1;
  layer.register_parameter("w13_weight", Tensor::zeros({e, n1, h / 2}, DType::kU8),
                           {ShardLayout::kW13});
  layer.register_parameter("w2_weight", Tensor::zeros({e, h, inter / 2}, DType::kU8),
                           {ShardLayout::kW2});
  layer.register_parameter("w13_weight_scale",
                           Tensor::zeros({e, n1, h / kGroupSize}, DType::kF8E4M3),
                           {ShardLayout::kW13});
  layer.register_parameter("w2_weight_scale",
                           Tensor::zeros({e, h, inter / kGroupSize}, DType::kF8E4M3),
                           {ShardLayout::kW2});
  if (gated) {
    layer.register_parameter("w13_weight_scale_2", Tensor::zeros({e, 2}, DType::kF32),
                             {ShardLayout::kPerShard});
  } else {
    layer.register_parameter("w13_weight_scale_2", Tensor::zeros({e}, DType::kF32),
                             {ShardLayout::kPerExpert});
  }
  layer.register_parameter("w2_weight_scale_2", Tensor::zeros({e}, DType::kF32),
                           {ShardLayout::kPerExpert});
  layer.register_parameter("w13_input_scale", Tensor::zeros({e_global, shards}, DType::kF32),
                           {ShardLayout::kPerShard, false, /*global_experts=*/true});
  layer.register_parameter("w2_input_scale", Tensor::zeros({e_global}, DType::kF32),
                           {ShardLayout::kPerExpert, false, /*global_experts=*/true});
  created_ = true;
}

void ModelOptNvFp4FusedMoEMethod::process_weights_after_loading(FusedMoE& layer) {
  MOECORE_CHECK(created_, kName, ": create_weights has not run");
  MOECORE_CHECK(!processed_, kName,
                ": process_weights_after_loading already ran (it changes "
                "layouts in place and must run once)");
  const bool gated = layer.config().is_gated;
  for (const char* name : {"w13", "w2"}) {
    const Tensor& s = layer.parameter(std::string(name) + "_weight_scale");
    MOECORE_ASSERT(s.dtype() == DType::kF8E4M3, name,
                   " Weight Blockscale must be represented as FP8-E4M3");
  }
  const Tensor w13_ws2 = layer.parameter("w13_weight_scale_2");
  const int64_t e = layer.parameter("w13_weight").size(0);
  const int64_t e_global = layer.options().num_experts;
  const int64_t ep_size = layer.options().ep_size, ep_rank = layer.options().ep_rank;

  // Input (activation) scales: raw checkpoint values = amax / (448 · 6); the NVFP4 global
  // scales are their reciprocals.
  const std::vector<float> in13_all = param_values(layer, "w13_input_scale");
  const std::vector<float> in2_all = param_values(layer, "w2_input_scale");
  check_finite_nonneg(in13_all, "w13_input_scale");
  check_finite_nonneg(in2_all, "w2_input_scale");
  std::vector<float> ws2_13 = param_values(layer, "w13_weight_scale_2");
  const std::vector<float> ws2_2 = param_values(layer, "w2_weight_scale_2");
  check_finite_nonneg(ws2_13, "w13_weight_scale_2");
  check_finite_nonneg(ws2_2, "w2_weight_scale_2");
  if (gated) {  // gate (w1) column; the cutlass kernel takes one alpha per expert
    std::vector<float> gate(static_cast<size_t>(e));
    for (int64_t i = 0; i < e; ++i) gate[i] = ws2_13[i * 2];
    ws2_13 = gate;
  }
  const float max13 = *std::max_element(in13_all.begin(), in13_all.end());
  MOECORE_CHECK(max13 > 0.0f, kName,
                ": expected w13_input_scale > 0 for some expert, got all "
                "zeros (were the input scales loaded?)");
  std::vector<float> in13, in2;  // per local expert (cutedsl) or one value (cutlass)
  if (cutedsl_v2_ || cutedsl_v1_) {
    // CuteDSL standard path: the max over all experts, repeated; w2's per-expert scales sliced
    // to this rank's experts (sglang's _slice_scale).
    MOECORE_ASSERT(ep_size * e == e_global, kName,
                   ": CuteDSL expects moe_ep_size · "
                   "num_local_experts == num_experts, got ",
                   ep_size, " · ", e, " != ", e_global);
    in13.assign(static_cast<size_t>(e), max13);
    in2.assign(in2_all.begin() + ep_rank * e, in2_all.begin() + (ep_rank + 1) * e);
    for (int64_t i = 0; i < e; ++i)
      MOECORE_CHECK(in2[i] > 0.0f, kName, ": expected w2_input_scale > 0 for local expert ", i,
                    " (global ", ep_rank * e + i, "), got ", in2[i]);
  } else {
    const float max2 = *std::max_element(in2_all.begin(), in2_all.end());
    MOECORE_CHECK(max2 > 0.0f, kName,
                  ": expected w2_input_scale > 0 for some expert, got all "
                  "zeros (were the input scales loaded?)");
    in13 = {max13};
    in2 = {max2};
  }
  auto at = [](const std::vector<float>& v, int64_t i) { return v.size() == 1 ? v[0] : v[i]; };
  std::vector<float> g1(static_cast<size_t>(e)), g2(static_cast<size_t>(e));
  for (int64_t i = 0; i < e; ++i) {
    g1[i] = at(in13, i) * ws2_13[i];
    g2[i] = at(in2, i) * ws2_2[i];
  }
  std::vector<float> q13(in13.size()), q2(in2.size());
  for (size_t i = 0; i < in13.size(); ++i) q13[i] = 1.0f / in13[i];
  for (size_t i = 0; i < in2.size(); ++i) q2[i] = 1.0f / in2[i];
  layer.register_parameter("g1_alphas", f32_tensor(g1));
  layer.register_parameter("g2_alphas", f32_tensor(g2));
  layer.register_parameter("w13_input_scale_quant", f32_tensor(q13));
  layer.register_parameter("w2_input_scale_quant", f32_tensor(q2));
  // NVFP4 dispatch (v1): the dispatcher quantizes with the one w13 input scale (uniform here:
  // the max over experts) and the kernel skips its own input quantization.
  if (nvfp4_dispatch_)
    layer.dispatcher()->set_quant_config({{"input_global_scale", f32_tensor({q13[0]})}});
  else
    layer.dispatcher()->set_quant_config({{"input_global_scale", std::monostate{}}});

  if (cutedsl_v2_) {  // v2 only: [Up, Gate] halves → 64-row chunks [U0, G0, U1, G1, …]
    layer.register_parameter(
        "w13_weight", interleave_w13_halves(layer.parameter("w13_weight").view(), kCuteDslGroup, 1),
        {ShardLayout::kW13});
    layer.register_parameter(
        "w13_weight_scale",
        interleave_w13_halves(layer.parameter("w13_weight_scale").view(), kCuteDslGroup, 1),
        {ShardLayout::kW13});
  }

  Tensor sw13 = swizzle_nvfp4_scales(layer.parameter("w13_weight_scale").view());
  const int64_t rows = layer.parameter("w13_weight").size(1);
  const int64_t pad = sw13.size(1) - rows;
  if (pad > 0) {
    MOECORE_ASSERT(!gated,
                   "The intermediate size required padding, but padding is also "
                   "implemented for gated activations");
    // Non-gated: zero rows of w13, zero columns of w2 and its scales (R10-style, output unchanged).
    const Tensor w2 = layer.parameter("w2_weight");
    const Tensor w2s = layer.parameter("w2_weight_scale");
    layer.register_parameter("w13_weight",
                             pad_dim(layer.parameter("w13_weight").view(), 1, rows + pad),
                             {ShardLayout::kW13});
    layer.register_parameter("w2_weight", pad_dim(w2.view(), 2, w2.size(2) + pad / 2),
                             {ShardLayout::kW2});
    layer.register_parameter("w2_weight_scale",
                             pad_dim(w2s.view(), 2, w2s.size(2) + pad / kGroupSize),
                             {ShardLayout::kW2});
  }
  layer.register_parameter("w13_blockscale_swizzled", sw13);
  Tensor sw2 = swizzle_nvfp4_scales(layer.parameter("w2_weight_scale").view());
  layer.register_parameter("w2_blockscale_swizzled", sw2);
  // What the kernels read, derived and validated once here instead of on every call (the MMA
  // view of v2 is a view of sw13 / sw2, so one derivation serves every path).
  {
    const Tensor& w13 = layer.parameter("w13_weight");
    const Tensor& w2 = layer.parameter("w2_weight");
    const int64_t h = w2.size(1), inter = w2.size(2) * 2;
    linear_scales_.w13 = linear_from_swizzled(kName, "w13 block scales", sw13, w13.size(0),
                                              w13.size(1), h / kGroupSize);
    linear_scales_.w2 =
        linear_from_swizzled(kName, "w2 block scales", sw2, w2.size(0), h, inter / kGroupSize);
  }

  if (cutedsl_v2_) {
    layer.register_parameter("w13_blockscale_mma",
                             Tensor(nvfp4_scales_mma_view(sw13.view()), sw13.owner()));
    layer.register_parameter("w2_blockscale_mma",
                             Tensor(nvfp4_scales_mma_view(sw2.view()), sw2.owner()));
    CuteDslScaleInputs in;
    in.w13_input_scale_quant = layer.parameter("w13_input_scale_quant");
    in.w2_input_scale_quant = layer.parameter("w2_input_scale_quant");
    in.g1_alphas = layer.parameter("g1_alphas");
    in.g2_alphas = layer.parameter("g2_alphas");
    in.w13_weight_scale_2 = w13_ws2;
    in.w2_weight_scale_2 = layer.parameter("w2_weight_scale_2");
    in.num_local_experts = e;
    in.num_experts = e_global;
    in.moe_ep_rank = ep_rank;
    cutedsl_scales_ = resolve_cutedsl_standard_scales(in);
  }
  processed_ = true;
}

void ModelOptNvFp4FusedMoEMethod::create_moe_runner(FusedMoE& layer,
                                                    const MoeRunnerConfig& config) {
  MOECORE_CHECK(created_, kName, ": create_weights has not run");
  runner_ = std::make_shared<MoeRunner>(backend_, config, layer.a2a_backend());
}

QuantInfoPtr ModelOptNvFp4FusedMoEMethod::quant_info(const FusedMoE& layer) const {
  MOECORE_CHECK(processed_, kName, ": process_weights_after_loading has not run");
  // moecore's FusedMoE builds its dispatcher before 'auto' is resolved here; when that
  // dispatcher already mapped ids to this rank's local ones, they are read as local (EP 1).
  const bool ids_local = layer.dispatcher()->local_expert_mapping().defined();
  const FusedMoEOptions& o = layer.options();
  if (cutedsl_v2_) {
    auto info = std::make_shared<CuteDslFp4MoeQuantInfo>();
    info->w13_weight = layer.parameter("w13_weight");
    info->w2_weight = layer.parameter("w2_weight");
    info->w13_weight_sf = layer.parameter("w13_blockscale_mma");
    info->w2_weight_sf = layer.parameter("w2_blockscale_mma");
    info->w1_alpha = cutedsl_scales_.w1_alpha;
    info->w2_alpha = cutedsl_scales_.w2_alpha;
    info->a1_scale = cutedsl_scales_.used_input_scale;
    info->a2_scale = cutedsl_scales_.fc2_input_scale;
    info->local_expert_offset = ids_local ? 0 : o.ep_rank * layer.num_local_experts();
    info->linear_scales = linear_scales_;
    return info;
  }
  if (cutedsl_v1_) {  // [Gate, Up] as loaded, swizzled scales, per-expert alphas and scales
    auto info = std::make_shared<CuteDslFp4MoeQuantInfo>();
    info->w13_weight = layer.parameter("w13_weight");
    info->w2_weight = layer.parameter("w2_weight");
    info->w13_weight_sf = layer.parameter("w13_blockscale_swizzled");
    info->w2_weight_sf = layer.parameter("w2_blockscale_swizzled");
    info->w1_alpha = layer.parameter("g1_alphas");
    info->w2_alpha = layer.parameter("g2_alphas");
    info->a1_scale = layer.parameter("w13_input_scale_quant");
    info->a2_scale = layer.parameter("w2_input_scale_quant");
    info->use_nvfp4_dispatch = nvfp4_dispatch_;
    info->linear_scales = linear_scales_;
    return info;
  }
  auto info = std::make_shared<FlashInferCutlassMoeQuantInfo>();
  info->quant_type = "fp4";
  info->w13_weight = layer.parameter("w13_weight");
  info->w2_weight = layer.parameter("w2_weight");
  info->quant_scales = {layer.parameter("w13_input_scale_quant"),
                        layer.parameter("w13_blockscale_swizzled"),
                        layer.parameter("g1_alphas"),
                        layer.parameter("w2_input_scale_quant"),
                        layer.parameter("w2_blockscale_swizzled"),
                        layer.parameter("g2_alphas")};
  info->output_dtype = DType::kBF16;
  info->moe_tp_size = o.tp_size;
  info->moe_tp_rank = o.tp_rank;
  info->moe_ep_size = ids_local ? 1 : o.ep_size;
  info->moe_ep_rank = ids_local ? 0 : o.ep_rank;
  info->apply_routed_scaling_factor = false;
  info->linear_scales = linear_scales_;
  return info;
}

QuantInfoPtr ModelOptNvFp4FusedMoEMethod::apply_quant_info(FusedMoE& layer,
                                                          const DispatchOutputPtr& dispatch_output) {
  return quant_info(layer);
}

}  // namespace moecore
