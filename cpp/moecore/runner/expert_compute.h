// The unquantized expert computation shared by the triton and torch_native backends: input
// validation, the moe_align_block_size layout, the expert-sorted layout, one expert's MLP on a
// set of rows, and the top-k combine. Each backend file composes these into its own contract.
#pragma once

#include <cstdint>
#include <functional>

#include "moecore/core/tensor.h"
#include "moecore/kernels/activation.h"
#include "moecore/kernels/gemm.h"
#include "moecore/kernels/quant_gemm.h"
#include "moecore/routing/topk.h"

namespace moecore {

/// Validated unquantized expert weights: w13 [E, N1, H] (N1 = 2I gated, else I), w2 [E, H, I],
/// optional biases b13 [E, N1], b2 [E, H] (f32, f16 or bf16). All contiguous.
struct ExpertWeights {
  TensorView w13, w2, b13, b2;  // b13/b2 have data == nullptr when absent
  int64_t num_experts = 0, n1 = 0, hidden = 0, inter = 0;
  DType dtype = DType::kF32;
};
ExpertWeights check_expert_weights(const char* api, const Tensor& w13, const Tensor& w2,
                                   const Tensor& b13, const Tensor& b2, bool gated);

/// Validated routed tokens: x [T, H] (rows contiguous), topk ids i32/i64 [T, k] with values in
/// [-1, E), topk weights f32 [T, k]. Checks everything before any output is written.
struct RoutedTokens {
  TensorView x, topk_ids, topk_weights;
  int64_t num_tokens = 0, top_k = 0;
  int32_t id(int64_t t, int64_t j) const;
  float weight(int64_t t, int64_t j) const;
};
RoutedTokens check_routed_tokens(const char* api, const Tensor& x, const StandardTopKOutput& topk,
                                 const ExpertWeights& weights);

/// sglang moe_align_block_size: for each expert in order, its (token, slot) indices t·k + j in
/// increasing order, padded to a multiple of block_m with the sentinel T·k. Ids −1 are left out.
struct BlockLayout {
  Tensor sorted_token_ids;  // i32 [num_tokens_post_padded]
  Tensor expert_ids;        // i32 [num_tokens_post_padded / block_m]
  int64_t num_tokens_post_padded = 0;
  int64_t block_m = 0;
};
BlockLayout align_block_size(const RoutedTokens& tokens, int64_t num_experts, int64_t block_m);

/// The valid slot indices t·k + j of block `block` of that layout, in order (entries at or past
/// `sentinel` are padding); returns how many were written to `slots` (at most block_m).
int64_t block_slots(const int32_t* sorted_token_ids, int64_t block, int64_t block_m,
                    int64_t sentinel, int64_t* slots);

/// The torch-native layout: valid slot indices stably sorted by expert, and per-expert counts.
struct SortedLayout {
  Tensor idxs;               // i64 [num_valid]
  Tensor tokens_per_expert;  // i64 [E]
};
SortedLayout sort_by_expert(const RoutedTokens& tokens, int64_t num_experts);

/// Where a per-row scale (the routed weight) multiplies: nowhere, GEMM1's or GEMM2's fp32 result.
enum class RowScaleAt { kNone, kGemm1, kGemm2 };

/// A backend's activation quantizer for one GEMM input: turns m rows of fp32 values (stride ld,
/// width k) into codes in place and writes scales [m, scales_per_row]. It must treat each row
/// on its own (batch invariance).
using ActivationQuantizer =
    std::function<void(float* rows, int64_t m, int64_t k, int64_t ld, float* scales)>;

/// One GEMM of the expert MLP: its weights, optional bias [E, N] (f32/f16/bf16), and how its
/// input is quantized (empty quantizer: used as it is).
struct ExpertGemm {
  WeightOperand weight;
  TensorView bias;  // data == nullptr: none
  ActivationQuantizer quantize;
  int64_t scales_per_row = 1;
  bool integer_codes = false;  // the quantizer emits int8 values (exact int32 dot with kInt8)
};

/// The whole expert MLP contract: GEMM1 (N1 = 2I gated, else I) → activation → GEMM2 (H).
struct ExpertMlp {
  ExpertGemm gemm1, gemm2;
  ActivationSpec activation;  // its round_dtype is overridden by act_dtype
  DType act_dtype = DType::kF32;
  GemmRowsFn gemm = nullptr;  // the dense kernel row, picked at construction
  int64_t hidden = 0, inter = 0;
};
/// The dense (unquantized) MLP over validated weights.
ExpertMlp dense_expert_mlp(const ExpertWeights& w, const ActivationSpec& spec, GemmRowsFn gemm);

/// One GEMM of the MLP on m input rows `in` [m, K] (fp32, not modified): quantizes a copy when
/// the GEMM has a quantizer, then the scaled GEMM over all N outputs of `expert` into out [m, N].
void run_expert_gemm(const ExpertGemm& g, GemmRowsFn gemm, int64_t expert, const float* in,
                     int64_t m, float* out);
/// The epilogue after a GEMM: + bias row of `expert` (if any), × row_scale[r] when `scale`,
/// rounded to act_dtype, in place on rows [m, width].
void expert_epilogue(float* rows, int64_t m, int64_t width, const TensorView& bias,
                     int64_t expert, const float* row_scale, bool scale, DType act_dtype);

/// One expert's MLP on m rows a [m, H] (fp32 holding act-dtype values; not modified):
///   h1 = round(gemm1(q1(a)) + b13 (× row_scale if kGemm1)), h2 = round(act(h1)), and
///   y  = round(gemm2(q2(h2)) + b2 (× row_scale if kGemm2)), rounding to mlp.act_dtype.
/// y: [m, H] fp32. Deterministic per row (canonical dot order), independent of m.
void expert_mlp(const ExpertMlp& mlp, int64_t expert, const float* a, int64_t m,
                const float* row_scale, RowScaleAt scale_at, float* y);

/// Combine in fp32: out[t] = round(rsf · Σ_j slot_out[t, j] (× w[t, j] if weighted)) over valid
/// slots j in increasing order. slot_out: [T, k, H] of act dtype.
void combine_topk(const RoutedTokens& tokens, const TensorView& slot_out, bool weighted, float rsf,
                  const TensorView& out);

/// In place: slot_out[t, j] = round(w[t, j] · slot_out[t, j]) for valid slots (fp32 product).
void weight_slots(const RoutedTokens& tokens, const TensorView& slot_out);

}  // namespace moecore
