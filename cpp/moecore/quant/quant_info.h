// The QuantInfo payloads a quant method hands to MoeRunner.run (sglang moe_runner/*.py). Field
// names, shapes and dtypes follow sglang's dataclasses; undefined Tensors mean None.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moecore/core/dtype.h"
#include "moecore/core/tensor.h"
#include "moecore/kernels/weight_tiles.h"

namespace moecore {

class MoeQuantInfo {
 public:
  virtual ~MoeQuantInfo() = default;
  /// The Python class name, for messages: "TritonMoeQuantInfo".
  virtual const char* name() const = 0;
  /// The expert weight tensors the kernels read in place (those the runner's operands view), which
  /// pack_weight_tiles packs.
  virtual std::vector<Tensor> kernel_weights() const = 0;
  /// The tile layout the kernels read kernel_weights() in (packed fp4 has its own).
  virtual TileLayout kernel_weights_layout() const { return TileLayout::kBytes; }

  /// moecore: kernel_weights() prepacked in weight tiles (kernels/weight_tiles.h), which the
  /// runners' operands read instead where their kernel row streams tiles; nullptr: none. Quant
  /// methods set it when they process the weights; the tiles hold the codes of the moment they were
  /// packed, so weights changed in place afterwards must be packed again.
  std::shared_ptr<const WeightTileSet> weight_tiles;
  /// Packs kernel_weights() into a new weight_tiles.
  void pack_weight_tiles();
};
using QuantInfoPtr = std::shared_ptr<MoeQuantInfo>;

/// TritonMoeQuantInfo (sglang moe_runner/triton.py).
struct TritonMoeQuantInfo : MoeQuantInfo {
  Tensor w13_weight;  // [E, 2I, H] (gated) or [E, I, H]
  Tensor w2_weight;   // [E, H, I]
  Tensor b13;         // [E, 2I] or None
  Tensor b2;          // [E, H] or None
  bool use_fp8_w8a8 = false;
  bool use_int8_w8a8 = false;
  bool use_int8_w8a16 = false;
  bool use_int4_w4a16 = false;
  bool per_channel_quant = false;
  Tensor w13_scale, w2_scale, w13_zp, w2_zp, a13_scale, a2_scale;
  std::vector<int64_t> block_shape;  // empty: None
  const char* name() const override { return "TritonMoeQuantInfo"; }
  std::vector<Tensor> kernel_weights() const override { return {w13_weight, w2_weight}; }
  bool is_quantized() const {
    return use_fp8_w8a8 || use_int8_w8a8 || use_int8_w8a16 || use_int4_w4a16;
  }
};

/// TorchNativeMoeQuantInfo: plain weights for the reference loop (biases are moecore's addition).
struct TorchNativeMoeQuantInfo : MoeQuantInfo {
  Tensor w13_weight;  // [E, 2I, H] or [E, I, H]
  Tensor w2_weight;   // [E, H, I]
  Tensor b13;         // [E, 2I] or None
  Tensor b2;          // [E, H] or None
  const char* name() const override { return "TorchNativeMoeQuantInfo"; }
  std::vector<Tensor> kernel_weights() const override { return {w13_weight, w2_weight}; }
};

/// DeepGemmMoeQuantInfo (sglang moe_runner/deep_gemm.py): DeepGEMM grouped GEMMs, FP8 with
/// 128×128 block weight scales and per-token-group-128 activations, or BF16 (use_fp8=False).
struct DeepGemmMoeQuantInfo : MoeQuantInfo {
  Tensor w13_weight;  // [E, 2I, H] e4m3 (or bf16)
  Tensor w2_weight;   // [E, H, I]
  bool use_fp8 = true;
  Tensor w13_scale;  // f32 [E, ⌈2I/bn⌉, ⌈H/bk⌉] (scale_inv: dequant multipliers); None for bf16
  Tensor w2_scale;   // f32 [E, ⌈H/bn⌉, ⌈I/bk⌉]
  std::vector<int64_t> block_shape;  // [bn, bk], empty: None
  bool is_fp4_experts = false;
  /// moecore: sglang's process-wide deep_gemm_wrapper.DEEPGEMM_SCALE_UE8M0, carried per call:
  /// activation group scales are rounded up to powers of two and weight scales must be ones.
  bool scale_ue8m0 = false;
  const char* name() const override { return "DeepGemmMoeQuantInfo"; }
  std::vector<Tensor> kernel_weights() const override { return {w13_weight, w2_weight}; }
};

/// An NVFP4 MLP's weight block scales in the layout the kernels read: linear kF8E4M3
/// [E, rows, K/16] (w13: rows of w13_weight; w2: H), validated. The quant method derives them
/// once, when it processes the weights, beside the swizzled or MMA-view contract layout that
/// tests inspect. Undefined in a quant info built by hand: the runner then derives them from
/// the contract layout on every call.
struct Nvfp4LinearScales {
  Tensor w13, w2;
};

/// CuteDslFp4MoeQuantInfo (sglang moe_runner/flashinfer_cutedsl.py). v2 (a2a none/flashinfer):
/// w13 is [Up, Gate] 64-row interleaved, block scales in the MMA view, scalar input scales. v1
/// (a2a deepep): w13 [Gate, Up], 128×4-swizzled block scales, per-expert scales.
struct CuteDslFp4MoeQuantInfo : MoeQuantInfo {
  Tensor w13_weight;     // u8 packed e2m1 [E, 2I, H/2]
  Tensor w2_weight;      // u8 packed e2m1 [E, H, I/2]
  Tensor w13_weight_sf;  // e4m3 block scales (layout per version, see above)
  Tensor w2_weight_sf;
  Tensor w1_alpha;       // f32 [E]
  Tensor w2_alpha;       // f32 [E]
  Tensor a1_scale;       // f32: activation quant (global) scale; [1] for v2, [E] for v1
  Tensor a2_scale;       // f32, likewise for the GEMM2 input
  bool use_nvfp4_dispatch = false;  // v1 only
  /// v2: the first global expert id this rank holds (CuteDslMoEWrapper's local_expert_offset,
  /// ep_rank · E_local); ids are global and the rank's experts are [offset, offset + E).
  int64_t local_expert_offset = 0;
  /// moecore: the block scales in the kernels' linear layout (see Nvfp4LinearScales).
  Nvfp4LinearScales linear_scales;
  const char* name() const override { return "CuteDslFp4MoeQuantInfo"; }
  std::vector<Tensor> kernel_weights() const override { return {w13_weight, w2_weight}; }
  TileLayout kernel_weights_layout() const override { return TileLayout::kFp4Nibbles; }
};

/// An MXFP4 MLP's weights in the layout the kernels read (what WeightOperand with
/// WeightCoding::kMxfp4 reads; DESIGN.md §4, Weights): the contract tensors with the SM90 byte
/// interleave and scale fold undone, an exact byte permutation. u8 packed e2m1 [E, rows, K/2]
/// and u8 E8M0 linear scales [E, rows, K/32]: w13 [E, 2N, K/2] and [E, 2N, K/32], w2 [E, K, N/2]
/// and [E, K, N/32]. The quant method makes it once, when it processes the weights, beside the
/// SM90 contract layout that tests inspect. Undefined in a quant info built by hand: the runner
/// then derives it from the contract layout (once per prepared run; an eager call derives it
/// per call).
struct Mxfp4KernelLayout {
  Tensor w13_weight, w13_weight_scale, w2_weight, w2_weight_scale;
};

/// FlashInferMxfp4CutlassMoeQuantInfo (sglang moe_runner/flashinfer_mxfp4.py): GPT-OSS / DSv4
/// MXFP4 W4A16 with the halved [up; gate] w13 layout, padded to multiples of 128.
struct FlashInferMxfp4CutlassMoeQuantInfo : MoeQuantInfo {
  Tensor w13_weight;        // u8 [E, 2N, K/2], SM90-interleaved bytes
  Tensor w2_weight;         // u8 [E, K, N/2], SM90-interleaved bytes
  Tensor w13_weight_scale;  // e8m0 (u8) SM90-folded [E, 2N/64, K/128, 16, 16]
  Tensor w2_weight_scale;   // e8m0 (u8) SM90-folded [E, K/64, N/128, 16, 16]
  Tensor w13_bias;          // bf16 [E, 2N] or None
  Tensor w2_bias;           // bf16 [E, K] or None
  Tensor swiglu_alpha, swiglu_beta, swiglu_limit;  // f32 [E] each, all three or none
  int64_t moe_tp_size = 1, moe_tp_rank = 0, moe_ep_size = 1, moe_ep_rank = 0;
  std::optional<int64_t> padded_hidden;  // pad x to this many columns, trim the output back

  /// moecore: the four weight tensors above in the kernels' layout (see Mxfp4KernelLayout).
  Mxfp4KernelLayout kernel_layout;
  const char* name() const override { return "FlashInferMxfp4CutlassMoeQuantInfo"; }
  /// The kernel layout's weights (undefined when it is: the runner then derives it per call).
  std::vector<Tensor> kernel_weights() const override {
    return {kernel_layout.w13_weight, kernel_layout.w2_weight};
  }
  TileLayout kernel_weights_layout() const override { return TileLayout::kFp4Nibbles; }
};

/// FlashInferCutlassMoeQuantInfo (sglang moe_runner/flashinfer_cutlass.py): FlashInfer's
/// cutlass_fused_moe for quant_type "bf16", "fp8" (quant_scales = [fc1_dequant, fc2_quant,
/// fc2_dequant, fc1_input_dequant]) or "fp4" (quant_scales = [a1_gscale, w13 swizzled block
/// scales, g1_alphas, a2_gscale, w2 swizzled block scales, g2_alphas]). Weights [Up, Gate].
struct FlashInferCutlassMoeQuantInfo : MoeQuantInfo {
  std::string quant_type = "bf16";
  Tensor w13_weight;
  Tensor w2_weight;
  std::vector<Tensor> quant_scales;
  std::optional<DType> output_dtype;
  int64_t moe_tp_size = 1, moe_tp_rank = 0, moe_ep_size = 1, moe_ep_rank = 0;
  bool apply_routed_scaling_factor = true;
  /// moecore, quant_type "fp4": the block scales in the kernels' linear layout (see
  /// Nvfp4LinearScales).
  Nvfp4LinearScales linear_scales;
  const char* name() const override { return "FlashInferCutlassMoeQuantInfo"; }
  std::vector<Tensor> kernel_weights() const override { return {w13_weight, w2_weight}; }
  TileLayout kernel_weights_layout() const override {
    return quant_type == "fp4" ? TileLayout::kFp4Nibbles : TileLayout::kBytes;
  }
};

}  // namespace moecore
