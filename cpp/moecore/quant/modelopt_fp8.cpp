// ModelOptFp8MoEMethod: per-tensor FP8 with the w13 max-requant, scalar input scales, and the
// flashinfer_cutlass scale algebra and intermediate padding (R10).
//
// Deviation from sglang, on purpose: with load_up_proj_weight_first, w13's rows are [Up, Gate]
// while the per-shard scales stay [w1, w3] (FusedMoE loads scales by shard id). sglang's requant
// loop dequantizes rows [0, I) — the up rows — with w13_weight_scale[:, 0], the gate (w1) scale.
// moecore pairs each half with its own shard's scale, so differing w1/w3 scales stay correct;
// with equal scales the two agree bit for bit.
#include "moecore/quant/modelopt_fp8.h"

#include <algorithm>
#include <cfloat>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/formats/layout.h"
#include "moecore/layer/fused_moe.h"
#include "moecore/quant/fp8.h"
#include "moecore/runner/quant_compute.h"

namespace moecore {
namespace {

constexpr int64_t kCutlassIntermediateAlign = 16;

Tensor filled(const std::vector<int64_t>& shape, float v) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  std::fill(t.ptr<float>(), t.ptr<float>() + t.numel(), v);
  return t;
}

}  // namespace

void ModelOptFp8MoEMethod::create_weights(FusedMoE& layer, int64_t num_experts, int64_t hidden,
                                          int64_t inter, DType, bool with_bias) {
  switch (layer.runner_backend()) {
    case MoeRunnerBackend::AUTO:
    case MoeRunnerBackend::TRITON:
      backend_ = MoeRunnerBackend::TRITON;
      break;
    case MoeRunnerBackend::FLASHINFER_CUTLASS:
      backend_ = MoeRunnerBackend::FLASHINFER_CUTLASS;
      break;
    default:
      MOECORE_UNSUPPORTED(name(), ": runner backend '", to_string(layer.runner_backend()),
                          "' is not supported for ModelOpt FP8 MoE (supported: auto, triton, "
                          "flashinfer_cutlass)");
  }
  if (with_bias) MOECORE_UNSUPPORTED(name(), ": ModelOpt FP8 experts have no biases");
  gated_ = layer.config().is_gated;
  const int64_t shards = gated_ ? 2 : 1, E = num_experts;
  layer.register_parameter("w13_weight", Tensor::zeros({E, shards * inter, hidden}, DType::kF8E4M3),
                           {ShardLayout::kW13});
  layer.register_parameter("w2_weight", Tensor::zeros({E, hidden, inter}, DType::kF8E4M3),
                           {ShardLayout::kW2});
  layer.register_parameter("w13_weight_scale", filled({E, shards}, -FLT_MAX),
                           {ShardLayout::kPerShard});
  layer.register_parameter("w2_weight_scale", filled({E}, -FLT_MAX), {ShardLayout::kPerExpert});
  layer.register_parameter("w13_input_scale", filled({E}, 1.0f), {ShardLayout::kPerExpert});
  layer.register_parameter("w2_input_scale", filled({E}, 1.0f), {ShardLayout::kPerExpert});
}

void ModelOptFp8MoEMethod::process_weights_after_loading(FusedMoE& layer) {
  const char* api = "ModelOptFp8MoEMethod.process_weights_after_loading";
  MOECORE_CHECK(!processed_, api, ": the weights were already processed (run it once)");
  const Tensor w13 = layer.parameter("w13_weight");
  const Tensor w2 = layer.parameter("w2_weight");
  const Tensor& s13 = layer.parameter("w13_weight_scale");
  const Tensor& s2 = layer.parameter("w2_weight_scale");
  check_scale_values(api, "w13_weight_scale", s13.view(), false);
  check_scale_values(api, "w2_weight_scale", s2.view(), false);
  const Tensor in13 =
      fp8_detail::max_scale(api, "w13_input_scale", layer.parameter("w13_input_scale"));
  const Tensor in2 =
      fp8_detail::max_scale(api, "w2_input_scale", layer.parameter("w2_input_scale"));
  const int64_t inter = layer.intermediate_size_per_partition();
  const ParamSpec processed{ShardLayout::kPerExpert};
  // [Up, Gate] rows (flashinfer_cutlass) pair with scale columns [w3, w1].
  const std::vector<int> cols =
      load_up_proj_weight_first() ? std::vector<int>{1, 0} : std::vector<int>{0, 1};
  const Tensor max13 = gated_ ? fp8_detail::requantize_w13_to_max_scale(w13, s13, inter, cols)
                              : Tensor::copy_of(s13.view().select(1, 0));
  layer.register_parameter("w13_weight_scale", max13, processed);
  layer.register_parameter("w13_input_scale", in13, processed);
  layer.register_parameter("w2_input_scale", in2, processed);
  if (backend_ == MoeRunnerBackend::FLASHINFER_CUTLASS) {
    const int64_t E = max13.size(0);
    const float a1 = in13.ptr<float>()[0], a2 = in2.ptr<float>()[0];
    Tensor fc1_dequant = Tensor::empty({E}, DType::kF32),
           fc2_dequant = Tensor::empty({E}, DType::kF32);
    for (int64_t e = 0; e < E; ++e) {
      fc1_dequant.ptr<float>()[e] = max13.ptr<float>()[e] * a1;
      fc2_dequant.ptr<float>()[e] = a2 * *static_cast<const float*>(s2.view().at({e}));
    }
    Tensor fc2_quant = filled({1}, 1.0f / a2);
    layer.register_parameter("fc1_dequant", fc1_dequant, processed);
    layer.register_parameter("fc2_quant", fc2_quant, processed);
    layer.register_parameter("fc2_dequant", fc2_dequant, processed);
    layer.register_parameter("fc1_input_dequant", Tensor::copy_of(in13.view()), processed);
    // flashinfer_cutlass needs I % 16 == 0: zero rows per gated half, zero w2 columns.
    const int64_t padded = (inter + kCutlassIntermediateAlign - 1) / kCutlassIntermediateAlign *
                           kCutlassIntermediateAlign;
    if (padded != inter) {
      layer.register_parameter("w13_weight", pad_w13_intermediate(w13.view(), padded, gated_, 1),
                               {ShardLayout::kW13});
      layer.register_parameter("w2_weight", pad_dim(w2.view(), 2, padded), {ShardLayout::kW2});
    }
  }
  processed_ = true;
}

void ModelOptFp8MoEMethod::create_moe_runner(FusedMoE& layer, const MoeRunnerConfig& config) {
  MOECORE_CHECK(backend_ != MoeRunnerBackend::AUTO, name(), ": create_weights has not run");
  runner_ = std::make_shared<MoeRunner>(backend_, config, layer.a2a_backend());
}

QuantInfoPtr ModelOptFp8MoEMethod::quant_info(const FusedMoE& layer,
                                              std::optional<DType> output_dtype) const {
  MOECORE_CHECK(runner_ != nullptr && processed_, name(),
                ": run process_weights_after_loading (it builds the runner) first");
  if (backend_ == MoeRunnerBackend::FLASHINFER_CUTLASS) {
    auto info = std::make_shared<FlashInferCutlassMoeQuantInfo>();
    info->quant_type = "fp8";
    info->w13_weight = layer.parameter("w13_weight");
    info->w2_weight = layer.parameter("w2_weight");
    info->quant_scales = {layer.parameter("fc1_dequant"), layer.parameter("fc2_quant"),
                          layer.parameter("fc2_dequant"), layer.parameter("fc1_input_dequant")};
    info->output_dtype = output_dtype;
    const FusedMoEOptions& o = layer.options();
    info->moe_tp_size = o.tp_size;
    info->moe_tp_rank = o.tp_rank;
    info->moe_ep_size = o.ep_size;
    info->moe_ep_rank = o.ep_rank;
    info->apply_routed_scaling_factor = true;  // moecore never folds rsf into top-k for FP8
    return info;
  }
  auto info = std::make_shared<TritonMoeQuantInfo>();
  info->w13_weight = layer.parameter("w13_weight");
  info->w2_weight = layer.parameter("w2_weight");
  info->use_fp8_w8a8 = true;
  info->per_channel_quant = false;  // ModelOpt uses per-tensor quantization
  info->w13_scale = layer.parameter("w13_weight_scale");
  info->w2_scale = layer.parameter("w2_weight_scale");
  info->a13_scale = layer.parameter("w13_input_scale");
  info->a2_scale = layer.parameter("w2_input_scale");
  return info;
}

QuantInfoPtr ModelOptFp8MoEMethod::apply_quant_info(FusedMoE& layer,
                                                   const DispatchOutputPtr& dispatch_output) {
  std::optional<DType> out_dtype;
  if (auto* d = dynamic_cast<const StandardDispatchOutput*>(dispatch_output.get()))
    if (d->hidden_states.defined()) out_dtype = d->hidden_states.dtype();
  return quant_info(layer, out_dtype);
}

}  // namespace moecore
