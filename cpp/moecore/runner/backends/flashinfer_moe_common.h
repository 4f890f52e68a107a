// Shared pieces of the FlashInfer runner backends (flashinfer_cutlass, flashinfer_cutedsl):
// activation quantizers (NVFP4, FP8 static),
// global → local expert ids, the (token, slot) loop and argument checks. Not a public API: only
// the backend files include it. Nothing here may read process-wide state or depend on the thread
// count (static schedule, per-row math).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "moecore/core/tensor.h"
#include "moecore/dispatch/types.h"
#include "moecore/formats/quantize.h"
#include "moecore/kernels/activation.h"
#include "moecore/kernels/quant_gemm.h"
#include "moecore/runner/expert_compute.h"

namespace moecore::flashinfer_detail {

/// Loads token t's GEMM1 input row (H fp32 values) into dst.
using RowLoader = std::function<void(int64_t t, float* dst)>;

/// Runs every (token, slot) with a local id ≥ 0 through its expert and returns the slot outputs
/// [T, k, H] in mlp.act_dtype (zeros for slots with id −1). Rows are grouped by expert
/// (moe_align_block_size order) and run on expert_compute's static schedule in `workspace`
/// (the calling fused func's, reused across calls).
Tensor run_routed_experts(const ExpertMlp& mlp, const RoutedTokens& local,
                          int64_t num_local_experts, const RowLoader& load_row,
                          ExpertWorkspace& workspace);

/// Σ_j w[t, j] · slots[t, j] over valid slots in fp32, slot order, rounded once to out's dtype;
/// then, when rsf is set, out = round(out · rsf) (sglang multiplies the finished output).
void combine_weighted(const RoutedTokens& local, const Tensor& slots, const Tensor& out,
                      const float* rsf);

/// Validated global ids → local ids i32 [T, k]: id − offset when in [offset, offset + local),
/// −1 otherwise (other ranks' experts, −1, and `invalid_id` when allow_invalid_id). Ids outside
/// [−1, id_limit) (id_limit itself allowed only with allow_invalid_id) → OutOfRange.
Tensor localize_expert_ids(const char* api, const Tensor& topk_ids, int64_t offset,
                           int64_t num_local, int64_t id_limit, bool allow_invalid_id);

/// RoutedTokens over already-validated local ids and the top-k weights (x is not used).
RoutedTokens routed_tokens(const char* api, const Tensor& local_ids, const Tensor& topk_weights);

/// What the FlashInfer fused funcs read from their dispatch output: a StandardDispatchOutput
/// (a2a none, or the flashinfer dispatcher's BF16 extend fallback through its internal
/// StandardDispatcher, spec §5.4) or a FlashinferDispatchOutput (hidden_states_scale present:
/// the dispatcher sent NVFP4 with linear e4m3 scales [T, H/16]).
struct FlashinferInput {
  Tensor hidden_states, hidden_states_scale;
  StandardTopKOutput topk;
  Tensor moe_output;                  // where the result goes when defined (flashinfer only)
  std::optional<DType> output_dtype;  // the dispatch output's output_dtype (flashinfer only)
  bool flashinfer_format = false;     // a FlashinferDispatchOutput
};
/// Accepts a FlashinferDispatchOutput only when flashinfer_a2a; a StandardDispatchOutput always.
/// `require_standard_topk`: a bypassed top-k is an AssertionError (CuteDSL) instead of being
/// materialised with to_standard() (R8).
FlashinferInput flashinfer_input(const char* api, const DispatchOutputPtr& dispatch,
                                 bool flashinfer_a2a, bool require_standard_topk);
/// The [T, H] buffer of `dtype` the combine writes: the validated moe_output (contiguous, that
/// dtype and shape, checked before anything runs) or a new tensor.
Tensor flashinfer_output_buffer(const char* api, const FlashinferInput& in, int64_t tokens,
                                int64_t hidden, DType dtype);
/// FlashinferCombineInput for a FlashinferDispatchOutput, StandardCombineInput otherwise.
CombineInputPtr flashinfer_combine_input(const FlashinferInput& in, Tensor out);

// ---------------------------------------------------------------------------------------------
// Activation quantizers (ActivationQuantizer callbacks; one scale per row, always 1.0). The
// arithmetic is formats' (moecore/formats/quantize.h); these only adapt it to the callback.

/// NVFP4 with a fp32 global scale gs: formats' nvfp4_quantize_row (sgl-kernel's NVFP4 quant
/// kernel, spec §7.2); the row is replaced by nvfp4_code_values_row, the exact values
/// e2m1 · s_e4m3 (the 1/gs factor lives in alpha).
ActivationQuantizer nvfp4_quantizer(float global_scale);
/// FP8 E4M3 per tensor with a given multiplier (FlashInfer's fp8 input quantizer, sgl-kernel's
/// x · (1/scale)): formats' fp8_quantize_row_mul, the row replaced by the decoded codes.
ActivationQuantizer fp8_multiply_quantizer(float multiplier);

// ---------------------------------------------------------------------------------------------
// Argument checks ("API: expected …, got …"); all throw before anything is written.

/// The one value of a f32 tensor with numel 1 (any shape).
float scalar_of(const char* api, const char* what, const Tensor& t);
/// finite and > 0 (global quant scales).
void check_global_scale(const char* api, const char* what, float v);
/// f32 [E] (1-d, numel E), every value finite and ≥ 0 (dequant factors, alphas).
void check_per_expert(const char* api, const char* what, const Tensor& t, int64_t num_experts);
/// Packed e2m1 bytes (kU8 or kFp4E2M1x2), contiguous [E, rows, cols].
void check_packed_fp4(const char* api, const char* what, const Tensor& t, int64_t e, int64_t rows,
                      int64_t cols);
/// Every e4m3 block-scale byte finite and ≥ 0 (codes 0x00–0x7e).
void check_block_scale_bytes(const char* api, const char* what, const TensorView& linear);
/// 128×4-swizzled block scales [E, ⌈rows/128⌉·128, ⌈kb/4⌉·4] (kF8E4M3 or kU8; kI32 with the
/// last dim /4, as sglang's .view(torch.int32)) → validated linear kF8E4M3 [E, rows, kb].
Tensor linear_from_swizzled(const char* api, const char* what, const Tensor& swizzled, int64_t e,
                            int64_t rows, int64_t kb);
/// MMA view (6-d logical (32, 4, m_tiles, 4, k_tiles, E), any strides) → validated linear
/// kF8E4M3 [E, rows, kb].
Tensor linear_from_mma(const char* api, const char* what, const Tensor& mma, int64_t e,
                       int64_t rows, int64_t kb);

/// "(8,)" / "(8, 2)": a shape as Python prints a tuple (for sglang's messages).
std::string python_shape(const std::vector<int64_t>& shape);

}  // namespace moecore::flashinfer_detail
