// ModelOptFp8MoEMethod (sglang quantization/modelopt_quant.py, spec §6.3): per-tensor FP8
// checkpoints with static activation scales, on the triton or flashinfer_cutlass runner.
#pragma once

#include <cstdint>
#include <optional>

#include "moecore/quant/method.h"

namespace moecore {

/// Parameters (E local experts, N1 = 2I gated / I otherwise): w13_weight e4m3 [E, N1, H] (kW13),
/// w2_weight e4m3 [E, H, I] (kW2), w13_weight_scale f32 [E, N1/I] (kPerShard) and
/// w2_weight_scale f32 [E] initialised to float32 min (-3.4e38), w13_input_scale and
/// w2_input_scale f32 [E] initialised to 1. No biases.
/// The runner backend is fixed when the weights are created (layer.runner_backend(): auto →
/// triton; flashinfer_cutlass; triton). With flashinfer_cutlass and a gated layer w13 is loaded
/// [Up, Gate] (load_up_proj_weight_first).
/// process_weights_after_loading: w13 shards requantized to the per-expert max scale (each
/// shard's rows dequantized with their own shard's scale — see modelopt_fp8.cpp), input scales →
/// their max (f32 [1]). flashinfer_cutlass additionally: fc1_dequant = w13_weight_scale ·
/// input_scale [E], fc2_quant = 1 / w2_input_scale [1], fc2_dequant = w2_input_scale ·
/// w2_weight_scale [E], fc1_input_dequant = input_scale [1] (layer parameters of those names),
/// and I zero-padded to a multiple of 16 — each gated half of w13 separately, w2 on its last dim
/// (R10: the output is unchanged).
class ModelOptFp8MoEMethod : public FusedMoEMethod {
 public:
  const char* name() const override { return "ModelOptFp8MoEMethod"; }
  void create_weights(FusedMoE& layer, int64_t num_experts, int64_t hidden_size,
                      int64_t intermediate_size_per_partition, DType params_dtype,
                      bool with_bias) override;
  void process_weights_after_loading(FusedMoE& layer) override;
  void create_moe_runner(FusedMoE& layer, const MoeRunnerConfig& config) override;
  QuantInfoPtr apply_quant_info(FusedMoE& layer,
                                const DispatchOutputPtr& dispatch_output) override;
  bool load_up_proj_weight_first() const override {
    return gated_ && backend_ == MoeRunnerBackend::FLASHINFER_CUTLASS;
  }
  /// The QuantInfo apply() passes: FlashInferCutlassMoeQuantInfo(quant_type "fp8", quant_scales
  /// = [fc1_dequant, fc2_quant, fc2_dequant, fc1_input_dequant]) or TritonMoeQuantInfo.
  /// output_dtype: set by apply to the hidden states' dtype (flashinfer_cutlass).
  QuantInfoPtr quant_info(const FusedMoE& layer, std::optional<DType> output_dtype = {}) const;
  /// The backend fixed by create_weights (AUTO before it).
  MoeRunnerBackend backend() const { return backend_; }

 private:
  MoeRunnerBackend backend_ = MoeRunnerBackend::AUTO;
  bool gated_ = true;
  bool processed_ = false;
};

}  // namespace moecore
