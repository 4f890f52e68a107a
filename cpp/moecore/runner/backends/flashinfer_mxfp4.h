// The kernel behind the flashinfer_mxfp4 runner backend: FlashInfer's SM90
// cutlass_fused_moe(use_w4_group_scaling=True) — W4A16 MXFP4 with SwiGLU — as a CPU contract.
// The fused func ("none", "flashinfer_mxfp4") pads, calls it and trims; tests call it directly,
// as sglang's test_mxfp4_sm90_cutlass.py calls the FlashInfer kernel. Numerics: the opener of
// flashinfer_mxfp4.cpp.
#pragma once

#include <cstdint>

#include "moecore/core/tensor.h"
#include "moecore/isa/isa.h"
#include "moecore/kernels/quant_gemm.h"

namespace moecore {

/// Geometry of the SM90-folded E8M0 scales of interleave_moe_scales_for_sm90_mixed_gemm for
/// 1-byte scales with group size 32 (formats/layout.h): [E, rows/64, K/128, 16, 16] with
/// element [e, a, kb, f, s·4 + g] = scale of row a·64 + s·16 + f, K block kb·4 + g.
constexpr int64_t kSm90ScaleRowTile = 64;
constexpr int64_t kSm90ScaleFoldedM = 16;
constexpr int64_t kSm90ScaleCols = 16;

/// Arguments of cutlass_fused_moe_mxfp4, named after FlashInfer's cutlass_fused_moe keywords.
/// E = local experts, 2N = fc1 rows (halved [up; gate]), K = hidden; N and K multiples of 128.
struct Mxfp4CutlassMoeArgs {
  Tensor input;         // bf16 [T, K], rows contiguous (already padded to the weights' K)
  Tensor topk_ids;      // token_selected_experts: i32/i64 [T, k], global ids, −1 = none
  Tensor topk_weights;  // token_final_scales: f32 [T, k]
  Tensor w13;           // fc1_expert_weights: packed e2m1 (u8) [E, 2N, K/2], SM90-interleaved
  Tensor w2;            // fc2_expert_weights: packed e2m1 (u8) [E, K, N/2], SM90-interleaved
  Tensor w13_scale;     // quant_scales[0]: E8M0 (u8) folded [E, 2N/64, K/128, 16, 16]
  Tensor w2_scale;      // quant_scales[1]: E8M0 (u8) folded [E, K/64, N/128, 16, 16]
  Tensor w13_bias;      // fc1_expert_biases: bf16 [E, 2N], or undefined
  Tensor w2_bias;       // fc2_expert_biases: bf16 [E, K], or undefined
  Tensor swiglu_alpha;  // f32 [E]; the three swiglu tensors come together or not at all
  Tensor swiglu_beta;   // f32 [E]
  Tensor swiglu_limit;  // f32 [E]
  int64_t tp_size = 1, tp_rank = 0, ep_size = 1, ep_rank = 0;
};

/// Validates every argument (before any work), then computes the MoE per the contract and
/// returns a new bf16 [T, K] tensor. Ids outside this EP rank's [ep_rank·E, (ep_rank+1)·E) and
/// −1 contribute nothing. T = 0 returns [0, K] without decoding any weight. E8M0 0xFF (NaN) in
/// a scale the call reads → InvalidArgument. `gemm`: the scaled-GEMM row it runs (a row of
/// scaled_gemm_kernel).
Tensor cutlass_fused_moe_mxfp4(const Mxfp4CutlassMoeArgs& args, ScaledGemmFn gemm);

/// The backend's own decode of SM90-interleaved MXFP4 weights: packed [E, R, C/2] (u8 or
/// fp4_e2m1x2, R % 64 == 0, C % 128 == 0) with folded scales [E, R/64, C/128, 16, 16] →
/// f32 [E, R, C] logical values e2m1 · 2^(e − 127) (exact). 0xFF scales → InvalidArgument.
Tensor dequantize_sm90_mxfp4(const TensorView& weight, const TensorView& folded_scale);

}  // namespace moecore
