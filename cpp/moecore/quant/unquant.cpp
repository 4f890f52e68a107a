// UnquantizedFusedMoEMethod: plain f32/f16/bf16 experts through the triton or torch_native
// runner backends.
#include "moecore/core/error.h"
#include "moecore/layer/fused_moe.h"
#include "moecore/quant/method.h"

namespace moecore {

void UnquantizedFusedMoEMethod::create_weights(FusedMoE& layer, int64_t num_experts,
                                               int64_t hidden_size, int64_t inter,
                                               DType params_dtype, bool with_bias) {
  MOECORE_CHECK_DTYPE(is_activation_dtype(params_dtype), name(),
                      ": params_dtype must be f32, f16 or bf16, got ", dtype_name(params_dtype));
  const int64_t n1 = layer.config().is_gated ? 2 * inter : inter;
  layer.register_parameter("w13_weight", Tensor::zeros({num_experts, n1, hidden_size}, params_dtype),
                           {ShardLayout::kW13});
  layer.register_parameter("w2_weight", Tensor::zeros({num_experts, hidden_size, inter}, params_dtype),
                           {ShardLayout::kW2});
  if (with_bias) {
    layer.register_parameter("w13_weight_bias", Tensor::zeros({num_experts, n1}, DType::kF32),
                             {ShardLayout::kW13});
    layer.register_parameter("w2_weight_bias", Tensor::zeros({num_experts, hidden_size}, DType::kF32),
                             {ShardLayout::kPerExpert, /*tp_rank0_only=*/true});
  }
}

void UnquantizedFusedMoEMethod::process_weights_after_loading(FusedMoE&) {
  // Unquantized weights are used in the contract layout as loaded.
}

void UnquantizedFusedMoEMethod::create_moe_runner(FusedMoE& layer, const MoeRunnerConfig& config) {
  MoeRunnerBackend backend = layer.runner_backend();
  if (backend == MoeRunnerBackend::AUTO) backend = MoeRunnerBackend::TRITON;
  if (backend != MoeRunnerBackend::TRITON && backend != MoeRunnerBackend::TORCH_NATIVE)
    MOECORE_UNSUPPORTED(name(), ": runner backend '", to_string(backend),
                        "' is not supported for unquantized MoE (supported: auto, triton, "
                        "torch_native)");
  runner_ = std::make_shared<MoeRunner>(backend, config, layer.a2a_backend());
}

QuantInfoPtr UnquantizedFusedMoEMethod::quant_info(const FusedMoE& layer) const {
  MOECORE_CHECK(runner_ != nullptr, name(), ": create_moe_runner has not run");
  if (runner_->runner_backend() == MoeRunnerBackend::TORCH_NATIVE) {
    auto info = std::make_shared<TorchNativeMoeQuantInfo>();
    info->w13_weight = layer.parameter("w13_weight");
    info->w2_weight = layer.parameter("w2_weight");
    info->b13 = layer.find_parameter("w13_weight_bias");
    info->b2 = layer.find_parameter("w2_weight_bias");
    return info;
  }
  auto info = std::make_shared<TritonMoeQuantInfo>();
  info->w13_weight = layer.parameter("w13_weight");
  info->w2_weight = layer.parameter("w2_weight");
  info->b13 = layer.find_parameter("w13_weight_bias");
  info->b2 = layer.find_parameter("w2_weight_bias");
  return info;
}

CombineInputPtr UnquantizedFusedMoEMethod::apply(FusedMoE& layer,
                                                 const DispatchOutputPtr& dispatch_output) {
  return runner_->run(dispatch_output, quant_info(layer));
}

}  // namespace moecore
