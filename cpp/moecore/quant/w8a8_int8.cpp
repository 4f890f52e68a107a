// INT8 W8A8 / W8A16 MoE methods (sglang quantization/w8a8_int8.py).
#include "moecore/quant/w8a8_int8.h"

#include <algorithm>

#include "moecore/core/error.h"
#include "moecore/layer/fused_moe.h"

namespace moecore {

void Int8MoEMethod::create_weights(FusedMoE& layer, int64_t num_experts, int64_t hidden,
                                   int64_t inter, DType, bool with_bias) {
  if (with_bias) MOECORE_UNSUPPORTED(name(), ": INT8 experts have no biases");
  const int64_t n1 = (layer.config().is_gated ? 2 : 1) * inter, E = num_experts;
  layer.register_parameter("w13_weight", Tensor::zeros({E, n1, hidden}, DType::kI8),
                           {ShardLayout::kW13});
  layer.register_parameter("w2_weight", Tensor::zeros({E, hidden, inter}, DType::kI8),
                           {ShardLayout::kW2});
  auto ones = [](const std::vector<int64_t>& shape) {
    Tensor t = Tensor::empty(shape, DType::kF32);
    std::fill(t.ptr<float>(), t.ptr<float>() + t.numel(), 1.0f);
    return t;
  };
  layer.register_parameter("w13_weight_scale", ones({E, n1, 1}), {ShardLayout::kW13});
  layer.register_parameter("w2_weight_scale", ones({E, hidden, 1}), {ShardLayout::kPerExpert});
}

void Int8MoEMethod::process_weights_after_loading(FusedMoE&) {
  // The checkpoint layout is the contract layout (sglang only re-wraps the parameters).
}

void Int8MoEMethod::create_moe_runner(FusedMoE& layer, const MoeRunnerConfig& config) {
  const MoeRunnerBackend b = layer.runner_backend();
  if (b != MoeRunnerBackend::AUTO && b != MoeRunnerBackend::TRITON)
    MOECORE_UNSUPPORTED(name(), ": runner backend '", to_string(b),
                        "' is not supported for INT8 "
                        "MoE (supported: auto, triton)");
  runner_ = std::make_shared<MoeRunner>(MoeRunnerBackend::TRITON, config, layer.a2a_backend());
}

QuantInfoPtr Int8MoEMethod::quant_info(const FusedMoE& layer) const {
  MOECORE_CHECK(runner_ != nullptr, name(),
                ": run process_weights_after_loading (it builds the runner) first");
  auto info = std::make_shared<TritonMoeQuantInfo>();
  info->w13_weight = layer.parameter("w13_weight");
  info->w2_weight = layer.parameter("w2_weight");
  info->use_int8_w8a8 = w8a8_;
  info->use_int8_w8a16 = !w8a8_;
  info->per_channel_quant = w8a8_;
  info->w13_scale = layer.parameter("w13_weight_scale");
  info->w2_scale = layer.parameter("w2_weight_scale");
  return info;
}

QuantInfoPtr Int8MoEMethod::apply_quant_info(FusedMoE& layer,
                                            const DispatchOutputPtr& dispatch_output) {
  return quant_info(layer);
}

}  // namespace moecore
