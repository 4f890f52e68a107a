// INT8 quant methods through the triton runner: W8A8 (sglang quantization/w8a8_int8.py
// W8A8Int8MoEMethod: int8 per-channel weights, per-token dynamic int8 activations) and W8A16
// (int8 per-channel weights, activations unquantized — the Triton kernel's use_int8_w8a16).
#pragma once

#include <cstdint>

#include "moecore/quant/method.h"

namespace moecore {

/// Parameters (E local experts, N1 = 2I gated / I otherwise): w13_weight i8 [E, N1, H] (kW13),
/// w2_weight i8 [E, H, I] (kW2), w13_weight_scale f32 [E, N1, 1] (per output channel, kW13),
/// w2_weight_scale f32 [E, H, 1] (whole on every TP rank), all scales initialised to 1. No
/// biases; checkpoints are int8 (moecore does not quantize bf16 experts at load here).
/// Backends: auto / triton. apply: TritonMoeQuantInfo(use_int8_w8a8=True, per_channel_quant=True)
/// or TritonMoeQuantInfo(use_int8_w8a16=True).
class Int8MoEMethod : public FusedMoEMethod {
 public:
  /// activations_int8: W8A8 (true) or W8A16 (false).
  explicit Int8MoEMethod(bool activations_int8) : w8a8_(activations_int8) {}
  const char* name() const override { return w8a8_ ? "W8A8Int8MoEMethod" : "W8A16Int8MoEMethod"; }
  void create_weights(FusedMoE& layer, int64_t num_experts, int64_t hidden_size,
                      int64_t intermediate_size_per_partition, DType params_dtype,
                      bool with_bias) override;
  void process_weights_after_loading(FusedMoE& layer) override;
  void create_moe_runner(FusedMoE& layer, const MoeRunnerConfig& config) override;
  QuantInfoPtr apply_quant_info(FusedMoE& layer,
                                const DispatchOutputPtr& dispatch_output) override;
  QuantInfoPtr quant_info(const FusedMoE& layer) const;
 private:
  bool w8a8_;
};

class W8A8Int8MoEMethod : public Int8MoEMethod {
 public:
  W8A8Int8MoEMethod() : Int8MoEMethod(true) {}
};

class W8A16Int8MoEMethod : public Int8MoEMethod {
 public:
  W8A16Int8MoEMethod() : Int8MoEMethod(false) {}
};

}  // namespace moecore
