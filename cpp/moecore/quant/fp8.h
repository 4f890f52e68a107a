// FP8 E4M3 quant methods: sglang's Fp8MoEMethod (quantization/fp8.py, spec §6.2) and the weight
// processing steps it shares with ModelOptFp8MoEMethod (modelopt_fp8.h): the per-expert max
// requantization of w1/w3, load-time quantization of bf16/f16/f32 checkpoints, and DeepGEMM's
// UE8M0 block requantization. Parameters keep sglang's names, shapes and dtypes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moecore/quant/method.h"

namespace moecore {

/// Fp8Config's knobs for MoE layers.
struct Fp8MoEOptions {
  enum class WeightScheme { kPerTensor, kPerChannel, kBlock };
  enum class ActivationScheme { kStatic, kDynamic };
  WeightScheme weight_scheme = WeightScheme::kPerTensor;
  /// [block_n, block_k] of the kBlock scheme (sglang's weight_block_size).
  std::vector<int64_t> block_shape = {128, 128};
  ActivationScheme activation_scheme = ActivationScheme::kDynamic;
  /// is_checkpoint_fp8_serialized: weights arrive as e4m3 with scales; false → params_dtype
  /// weights quantized per expert in process_weights_after_loading.
  bool checkpoint_fp8 = true;
  /// DeepGEMM's UE8M0 mode (sglang's DEEPGEMM_SCALE_UE8M0): with the deep_gemm runner, 128×128
  /// block weights are requantized to power-of-two scales at load and activation group scales
  /// round up to powers of two. Needs weight_block_size [128, 128].
  bool scale_ue8m0 = false;
};
const char* to_string(Fp8MoEOptions::WeightScheme s);      // "per_tensor", "per_channel", "block"
const char* to_string(Fp8MoEOptions::ActivationScheme s);  // "static", "dynamic"
/// Validates options with Fp8Config's errors (sglang texts where sglang has them).
void validate_fp8_options(const Fp8MoEOptions& o);

/// Fp8MoEMethod. Parameters (E local experts, N1 = 2I gated / I otherwise):
///   w13_weight e4m3 [E, N1, H] (kW13), w2_weight e4m3 [E, H, I] (kW2) — params_dtype when the
///     checkpoint is not fp8;
///   per-tensor:  w13_weight_scale f32 [E, N1/I] (kPerShard), w2_weight_scale f32 [E];
///   per-channel: w13_weight_scale f32 [E, N1, 1] (kW13), w2_weight_scale f32 [E, H, 1] (whole);
///   block:       w13_weight_scale_inv f32 [E, N1/I·⌈I/bn⌉, ⌈H/bk⌉] (kW13),
///                w2_weight_scale_inv f32 [E, ⌈H/bn⌉, ⌈I/bk⌉] (kW2);
///   static:      w13_input_scale, w2_input_scale f32 [E] (kPerExpert);
///   with_bias:   w13_weight_bias f32 [E, N1], w2_weight_bias f32 [E, H] (TP rank 0).
/// process_weights_after_loading (per-tensor, fp8 checkpoint): input scales → their max (f32
/// [1]); each w13 shard dequantized with its own scale (to fp16, sglang's per_tensor_dequantize)
/// and requantized with the expert's max scale; w13_weight_scale becomes f32 [E]. bf16 checkpoint:
/// w13 and w2 quantized per expert with a dynamic per-tensor scale (per-channel: per row).
/// Backends: triton (auto; flashinfer_cutlass / flashinfer_cutedsl requested → triton, as sglang)
/// and deep_gemm (per-tensor scales expanded to 128×128 blocks; per-channel is not supported).
class Fp8MoEMethod : public FusedMoEMethod {
 public:
  explicit Fp8MoEMethod(Fp8MoEOptions options = {});
  const char* name() const override { return "Fp8MoEMethod"; }
  bool deep_gemm_scale_ue8m0() const override { return options_.scale_ue8m0; }
  void create_weights(FusedMoE& layer, int64_t num_experts, int64_t hidden_size,
                      int64_t intermediate_size_per_partition, DType params_dtype,
                      bool with_bias) override;
  void process_weights_after_loading(FusedMoE& layer) override;
  void create_moe_runner(FusedMoE& layer, const MoeRunnerConfig& config) override;
  QuantInfoPtr apply_quant_info(FusedMoE& layer,
                                const DispatchOutputPtr& dispatch_output) override;
  /// The QuantInfo apply() passes (TritonMoeQuantInfo or DeepGemmMoeQuantInfo).
  QuantInfoPtr quant_info(const FusedMoE& layer) const;
  const Fp8MoEOptions& options() const { return options_; }
  /// The runner backend this method uses for `layer` ('auto' and the fp8-less flashinfer
  /// backends resolved to triton). Throws Unsupported for other backends.
  MoeRunnerBackend resolve_backend(const FusedMoE& layer) const;

 private:
  Fp8MoEOptions options_;
  bool gated_ = true;
  bool processed_ = false;
};

namespace fp8_detail {

/// sglang's requant-to-max of one fp8 w13 (rows [0, n_shards·I) of [E, N1, H], e4m3, in place):
/// per expert, each shard s (rows [s·I, (s+1)·I)) is dequantized as fp16(q · scale[e, s_col])
/// and requantized as e4m3(clamp(dq · (1/max_e), ±448)). shard_cols[s] names the scale column
/// of the rows of shard s. Returns max_e as f32 [E].
Tensor requantize_w13_to_max_scale(const Tensor& w13, const Tensor& shard_scales, int64_t inter,
                                   const std::vector<int>& shard_cols);
/// bf16/f16/f32 weights [E, N, K] → e4m3 codes with a dynamic per-expert scale (sglang
/// scaled_fp8_quant: s = amax/448, q = x · (1/s)); the scale goes to scale[e].
Tensor quantize_per_expert(const Tensor& w, Tensor* scale);
/// The same per output channel: scale f32 [E, N, 1] (per_token_quant_fp8 rule).
Tensor quantize_per_channel(const Tensor& w, Tensor* scale);
/// DeepGEMM's UE8M0 requant of 128×128-block weights (sglang requant_weight_ue8m0): per expert,
/// dequantize to bf16 (q · s, one rounding), per 128×128 tile amax clamped ≥ 1e-4,
/// s' = ceil_to_ue8m0(amax / 448), q' = e4m3(x · (1/s')). In place on w; returns the new
/// power-of-two scales (same shape as `scale`).
Tensor requantize_block_ue8m0(const Tensor& w, const Tensor& scale);
/// Max over all values of an f32 view (validated finite and > 0), as f32 [1].
Tensor max_scale(const char* api, const char* name, const Tensor& scales);
/// Per-tensor scales [E] expanded to 128×128 block scales [E, ⌈N/128⌉, ⌈K/128⌉] by repetition
/// (sglang's Fp8MoEMethod.apply for the DeepGEMM runner).
Tensor expand_per_tensor_to_blocks(const Tensor& scale, int64_t n, int64_t k);

}  // namespace fp8_detail

}  // namespace moecore
