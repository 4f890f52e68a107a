// ModelOptNvFp4FusedMoEMethod (sglang quantization/modelopt_quant.py, spec §6.4) and the CuteDSL
// scale helpers of sglang's moe_runner/flashinfer_cutedsl.py. NVFP4 W4A4 experts: packed e2m1
// weights, e4m3 16-block scales, fp32 per-tensor weight and activation scales. The runner
// backend, the CuteDSL v1/v2 choice and the w1/w3 load order are fixed when the layer is built
// (create_weights), never re-read from process-wide state later (R17).
#pragma once

#include <optional>
#include <string>

#include "moecore/quant/method.h"

namespace moecore {

/// sglang's cutedsl_quant_scale_to_scalar: per-expert activation *quant* scales (1 / raw input
/// scale, f32, any shape) → f32 [1]: numel 0 → 1.0 (sglang warns), numel 1 → that value,
/// otherwise min (= 1 / max raw scale, TRT-LLM's convention). NaN propagates like torch.min.
Tensor cutedsl_quant_scale_to_scalar(const TensorView& quant_scale, const std::string& name);

/// Inputs of sglang's resolve_cutedsl_standard_scales (the layer attributes it reads).
struct CuteDslScaleInputs {
  Tensor w13_input_scale_quant;  // f32, per expert or scalar
  Tensor w2_input_scale_quant;   // f32, per expert or scalar
  Tensor g1_alphas, g2_alphas;   // f32 [E_local]: the alpha shapes the scales align to
  Tensor w13_weight_scale_2;     // f32 [E, 2] / [E] / scalar; undefined → fallback via g1_alphas
  Tensor w2_weight_scale_2;      // f32 [E] / scalar; undefined → fallback via g2_alphas
  std::optional<int64_t> num_local_experts, num_experts;  // for the EP slice of global vectors
  int64_t moe_ep_rank = 0;
};
struct CuteDslStandardScales {
  Tensor w1_alpha;         // f32 [E_local]: w13_weight_scale_2[:, 0] / max(used_input_scale, 1e-12)
  Tensor fc2_input_scale;  // f32 [1]: scalar(w2_input_scale_quant)
  Tensor w2_alpha;         // f32 [E_local]: w2_weight_scale_2 / max(fc2_input_scale, 1e-12)
  Tensor used_input_scale;  // f32 [1]: scalar(w13_input_scale_quant)
};
/// sglang's resolve_cutedsl_standard_scales (R13): scalarises the activation quant scales and
/// re-derives the alphas from the weight scales so that alpha = weight_scale_2 / scalar. A
/// [E, 2] weight scale uses column 0; a vector of global size is sliced to
/// [ep_rank · L, (ep_rank + 1) · L); anything else → ValueError("Unable to align {name}
/// shape=(…) to alpha shape=(…) for CuteDSL standard scale resolution.").
CuteDslStandardScales resolve_cutedsl_standard_scales(const CuteDslScaleInputs& in);

/// NVFP4 experts (ModelOpt FP4 checkpoints). Parameters (E = local experts, E_g = global, N1 =
/// 2I gated else I): w13_weight u8 [E, N1, H/2], w2_weight u8 [E, H, I/2], w13_weight_scale e4m3
/// [E, N1, H/16], w2_weight_scale e4m3 [E, H, I/16] (linear), w13_weight_scale_2 f32 [E, 2] (gated,
/// one per shard) or [E], w2_weight_scale_2 f32 [E], w13_input_scale f32 [E_g, 2 or 1] and
/// w2_input_scale f32 [E_g] (loaded for every global expert). Backends: flashinfer_cutlass (also
/// for 'auto'), flashinfer_cutedsl v2 (a2a none / flashinfer: [Up, Gate] 64-row interleaved, MMA
/// scales, scalar input scales) and flashinfer_cutedsl v1 (a2a deepep: [Gate, Up] as loaded,
/// 128×4-swizzled scales, per-expert alphas and input scales). Routed scaling is folded into
/// the top-k weights by routing (TopKConfig.apply_routed_scaling_factor_on_output), never by
/// the runner.
class ModelOptNvFp4FusedMoEMethod : public FusedMoEMethod {
 public:
  /// nvfp4_dispatch: sglang's SGLANG_MOE_NVFP4_DISPATCH — CuteDSL v1 only: the DeepEP
  /// dispatcher is given input_global_scale and sends NVFP4, which the kernel takes as it is.
  explicit ModelOptNvFp4FusedMoEMethod(bool nvfp4_dispatch = false)
      : nvfp4_dispatch_(nvfp4_dispatch) {}
  const char* name() const override { return "ModelOptNvFp4FusedMoEMethod"; }
  void create_weights(FusedMoE& layer, int64_t num_experts, int64_t hidden_size,
                      int64_t intermediate_size_per_partition, DType params_dtype,
                      bool with_bias) override;
  void process_weights_after_loading(FusedMoE& layer) override;
  void create_moe_runner(FusedMoE& layer, const MoeRunnerConfig& config) override;
  QuantInfoPtr apply_quant_info(FusedMoE& layer,
                                const DispatchOutputPtr& dispatch_output) override;
  /// [Up, Gate] for flashinfer_cutlass and CuteDSL v2 when gated (fixed at create_weights).
  bool load_up_proj_weight_first() const override { return up_first_; }
  TileLayout kernel_weights_layout() const override { return TileLayout::kFp4Nibbles; }

  /// The QuantInfo apply() passes (FlashInferCutlassMoeQuantInfo or CuteDslFp4MoeQuantInfo).
  QuantInfoPtr quant_info(const FusedMoE& layer) const;
  /// The backend chosen at create_weights ('auto' resolved); AUTO before that.
  MoeRunnerBackend resolved_backend() const { return backend_; }
  /// True when the layer runs the CuteDSL v2 / v1 path (decided at create_weights, R17).
  bool is_cutedsl_v2() const { return cutedsl_v2_; }
  bool is_cutedsl_v1() const { return cutedsl_v1_; }
  bool nvfp4_dispatch() const { return nvfp4_dispatch_; }
  bool weights_created() const { return created_; }
  bool weights_processed() const { return processed_; }

 private:
  MoeRunnerBackend backend_ = MoeRunnerBackend::AUTO;
  bool cutedsl_v2_ = false;
  bool cutedsl_v1_ = false;
  bool nvfp4_dispatch_ = false;
  bool up_first_ = false;
  bool created_ = false;
  bool processed_ = false;
  Nvfp4LinearScales linear_scales_;  // derived from the swizzled scales once, at load
  CuteDslStandardScales cutedsl_scales_;
};

}  // namespace moecore
