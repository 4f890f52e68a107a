// MXFP4 MoE quant methods (spec §6.5): GPT-OSS's Mxfp4MoEMethod (sglang quantization/mxfp4.py,
// SM90 cutlass path) and the DeepSeek-V4 sibling Mxfp4FlashinferCutlassMoEMethod (sglang
// quantization/mxfp4_flashinfer_cutlass_moe.py). Both hand FlashInferMxfp4CutlassMoeQuantInfo to
// the flashinfer_mxfp4 runner (rule R7). Layout changes happen once, in
// process_weights_after_loading; a second call is an error, never a silent double transform.
// There, beside the SM90 contract layout, each method keeps the kernel layout of the same bytes
// (Mxfp4KernelLayout, copied into every quant info); weights must not be rewritten after
// processing (only their scales' 0xFF check stays live in the runner).
#pragma once

#include <cstdint>
#include <string>

#include "moecore/quant/method.h"
#include "moecore/quant/quant_info.h"

namespace moecore {

/// GPT-OSS MXFP4 experts (W4A16, E8M0 per 32, bf16 biases, clamped SwiGLU α = 1.702, β = 1,
/// limit = 7). create_weights (Ip = round_up(I, 64), H % 32 == 0):
///   w13_weight u8 [E, 2·Ip, H/2], w13_weight_scale u8 [E, 2·Ip, H/32], w13_weight_bias bf16
///   [E, 2·Ip] in GPT-OSS's row-interleaved [g0, u0, g1, u1, …] order; w2_weight u8 [E, H, Ip/2],
///   w2_weight_scale u8 [E, H, Ip/32], w2_weight_bias bf16 [E, H]. All zero.
/// process_weights_after_loading (SM90 cutlass path; Np = round_up(I, 128), Kp = round_up(H, 128)):
///   even rows → gate, odd rows → up; halved [up ; gate], each half zero-padded to Np rows and K
///   to Kp (bytes Kp/2, scales Kp/32); biases likewise; w2 zero-padded to [E, Kp, Np/2] (scales
///   [E, Kp, Np/32], bias [E, Kp]); then FlashInfer's SM90 byte interleave
///   (interleave_moe_weights_for_sm90_mixed_gemm, "fp4") and scale fold
///   (interleave_moe_scales_for_sm90_mixed_gemm, group 32) → w13_weight_scale
///   [E, 2Np/64, Kp/128, 16, 16], w2_weight_scale [E, Kp/64, Np/128, 16, 16]; adds
///   swiglu_alpha/beta/limit f32 [E]. The layer must run runner backend auto or flashinfer_mxfp4.
///   The kernel layout is the padded [up; gate] bytes and linear scales before the interleave.
/// apply: FlashInferMxfp4CutlassMoeQuantInfo(padded_hidden = Kp, kernel_layout) → runner.run.
class Mxfp4MoEMethod : public FusedMoEMethod {
 public:
  const char* name() const override { return "Mxfp4MoEMethod"; }
  void create_weights(FusedMoE& layer, int64_t num_experts, int64_t hidden_size,
                      int64_t intermediate_size_per_partition, DType params_dtype,
                      bool with_bias) override;
  void process_weights_after_loading(FusedMoE& layer) override;
  /// auto → flashinfer_mxfp4 (moecore's only MXFP4 executor; sglang's auto picks triton_kernels,
  /// which moecore does not build); anything else → Unsupported.
  void create_moe_runner(FusedMoE& layer, const MoeRunnerConfig& config) override;
  QuantInfoPtr apply_quant_info(FusedMoE& layer,
                                const DispatchOutputPtr& dispatch_output) override;
  /// The QuantInfo apply() passes (after process_weights_after_loading).
  QuantInfoPtr quant_info(const FusedMoE& layer) const;

  /// GPT-OSS checkpoint loader (sglang GptOssForCausalLM._load_mxfp4_experts_weights): one fused
  /// whole-layer tensor holding all global experts, named by (a name ending in)
  ///   gate_up_proj_blocks u8 [E, 2I, H/32, 16] (or [E, 2I, H/2]), gate_up_proj_scales u8
  ///   [E, 2I, H/32], gate_up_proj_bias bf16 [E, 2I], down_proj_blocks u8 [E, H, I/32, 16] (or
  ///   [E, H, I/2]), down_proj_scales u8 [E, H, I/32], down_proj_bias bf16 [E, H]
  /// (E = global experts, I = full intermediate size, rows in GPT-OSS's interleaved order).
  /// Takes this EP rank's experts and this TP rank's slice of I — per_rank =
  /// ceil(I/32/tp)·32, [rank·per_rank, min((rank+1)·per_rank, I)) — copies it naïvely into the
  /// start of the (zero, padded) parameter, zeroes down_proj_bias on TP ranks > 0. Validates
  /// before writing; returns the parameter name written. Before processing only.
  std::string load_fused_expert_weight(FusedMoE& layer, const std::string& name,
                                       const Tensor& loaded);

  int64_t padded_intermediate() const { return padded_inter_; }  // Np
  int64_t padded_hidden() const { return padded_hidden_; }       // Kp
  /// The kernel layout's weights.
  std::vector<Tensor> kernel_weights(const FusedMoE&) const override {
    return {kernel_layout_.w13_weight, kernel_layout_.w2_weight};
  }
  TileLayout kernel_weights_layout() const override { return TileLayout::kFp4Nibbles; }

 private:
  int64_t hidden_ = 0, inter_ = 0, inter_after_pad_ = 0, padded_inter_ = 0, padded_hidden_ = 0;
  Mxfp4KernelLayout kernel_layout_;  // made once, at load
};

/// DeepSeek-V4 MXFP4 experts on the SM90 cutlass path (no bias). create_weights requires H and I
/// multiples of 128 (sglang's ValueError) and allocates the FP8 method's FP4-expert buffers:
///   w13_weight i8 [E, 2I, H/2] ([w1; w3] as loaded), w2_weight i8 [E, H, I/2],
///   w13_weight_scale_inv f32 [E, 2I, H/32], w2_weight_scale_inv f32 [E, H, I/32]
/// (scales: f32 powers of two; loaded per expert through FusedMoE.weight_loader, shards w1/w3/w2).
/// process_weights_after_loading: [w1; w3] → [w3; w1] (= [up; gate]) for weights and scales, f32
/// scales → E8M0 bytes (the fp32 exponent; anything not a power of two in E8M0's range is a
/// ValueError), SM90 interleave and fold as above (kernel layout: [w3; w1] bytes and E8M0 scales
/// before the interleave). create_moe_runner: swiglu tensors alpha = 1, beta = 0, limit =
/// config.swiglu_limit when set, else none. apply: padded_hidden = None; a
/// non-standard top-k output is rejected ("Unsupported topk output format: …").
class Mxfp4FlashinferCutlassMoEMethod : public FusedMoEMethod {
 public:
  const char* name() const override { return "Mxfp4FlashinferCutlassMoEMethod"; }
  void create_weights(FusedMoE& layer, int64_t num_experts, int64_t hidden_size,
                      int64_t intermediate_size_per_partition, DType params_dtype,
                      bool with_bias) override;
  void process_weights_after_loading(FusedMoE& layer) override;
  void create_moe_runner(FusedMoE& layer, const MoeRunnerConfig& config) override;
  QuantInfoPtr apply_quant_info(FusedMoE& layer,
                                const DispatchOutputPtr& dispatch_output) override;
  QuantInfoPtr quant_info(const FusedMoE& layer) const;
  /// The kernel layout's weights.
  std::vector<Tensor> kernel_weights(const FusedMoE&) const override {
    return {kernel_layout_.w13_weight, kernel_layout_.w2_weight};
  }
  TileLayout kernel_weights_layout() const override { return TileLayout::kFp4Nibbles; }

 private:
  Tensor swiglu_alpha_, swiglu_beta_, swiglu_limit_;
  Mxfp4KernelLayout kernel_layout_;  // made once, at load
};

}  // namespace moecore
