// UnquantizedFusedMoEMethod: plain f32/f16/bf16 experts through the triton or torch_native
// runner backends, or bf16 experts through DeepGEMM BF16 (deep_gemm, use_fp8=False) — the path
// of unquantized MoE under DeepEP low-latency, which tells the dispatcher to send BF16 (R6).
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

namespace {

/// The runner backend this method uses for `layer`: 'auto' → triton.
MoeRunnerBackend resolve_backend(const FusedMoE& layer) {
  const MoeRunnerBackend backend = layer.runner_backend();
  return backend == MoeRunnerBackend::AUTO ? MoeRunnerBackend::TRITON : backend;
}

}  // namespace

void UnquantizedFusedMoEMethod::process_weights_after_loading(FusedMoE& layer) {
  // Unquantized weights are used in the contract layout as loaded. sglang's seed rule (R6):
  // DeepGEMM with bf16 weights under DeepEP low-latency makes the dispatcher send BF16
  // (otherwise it would quantize the payload to FP8 for DeepGEMM).
  if (resolve_backend(layer) == MoeRunnerBackend::DEEP_GEMM &&
      layer.parameter("w13_weight").dtype() == DType::kBF16 &&
      layer.a2a_backend() == MoeA2ABackend::DEEPEP && enable_low_latency(get_deepep_mode()))
    layer.dispatcher()->set_quant_config({{"dispatcher_output_dtype", std::string("bf16")}});
}

void UnquantizedFusedMoEMethod::create_moe_runner(FusedMoE& layer, const MoeRunnerConfig& config) {
  const MoeRunnerBackend backend = resolve_backend(layer);
  if (backend != MoeRunnerBackend::TRITON && backend != MoeRunnerBackend::TORCH_NATIVE &&
      backend != MoeRunnerBackend::DEEP_GEMM)
    MOECORE_UNSUPPORTED(name(), ": runner backend '", to_string(backend),
                        "' is not supported for unquantized MoE (supported: auto, triton, "
                        "torch_native, deep_gemm)");
  if (backend == MoeRunnerBackend::DEEP_GEMM) {
    const Tensor& w13 = layer.parameter("w13_weight");
    MOECORE_CHECK_DTYPE(w13.dtype() == DType::kBF16, name(),
                        ": runner backend 'deep_gemm' runs DeepGEMM BF16, which needs bf16 "
                        "weights (params_dtype='bf16'), got ",
                        w13.describe());
    MOECORE_CHECK(!layer.find_parameter("w13_weight_bias").defined(), name(),
                  ": DeepGEMM BF16 has no expert biases (with_bias=True)");
  }
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
  if (runner_->runner_backend() == MoeRunnerBackend::DEEP_GEMM) {
    auto info = std::make_shared<DeepGemmMoeQuantInfo>();
    info->w13_weight = layer.parameter("w13_weight");
    info->w2_weight = layer.parameter("w2_weight");
    info->use_fp8 = false;
    return info;
  }
  auto info = std::make_shared<TritonMoeQuantInfo>();
  info->w13_weight = layer.parameter("w13_weight");
  info->w2_weight = layer.parameter("w2_weight");
  info->b13 = layer.find_parameter("w13_weight_bias");
  info->b2 = layer.find_parameter("w2_weight_bias");
  return info;
}

QuantInfoPtr UnquantizedFusedMoEMethod::apply_quant_info(FusedMoE& layer,
                                                        const DispatchOutputPtr& dispatch_output) {
  return quant_info(layer);
}

}  // namespace moecore
