// Shared pieces of the FlashInfer runner backends (flashinfer_cutlass, flashinfer_cutedsl; the id
// check of flashinfer_mxfp4): the
// token-major run both fused funcs are (global → local expert ids, the routed expert MLP, the
// weighted top-k combine), prepared once and replayed without allocating; activation quantizers
// (NVFP4, FP8 static); NVFP4 input scales and argument checks. Not a public API: only the backend
// files include it. Nothing here may read process-wide state or depend on the thread count
// (static schedule, per-row math).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moecore/core/tensor.h"
#include "moecore/dispatch/types.h"
#include "moecore/formats/quantize.h"
#include "moecore/kernels/activation.h"
#include "moecore/kernels/quant_gemm.h"
#include "moecore/runner/expert_compute.h"
#include "moecore/runner/prepared.h"

namespace moecore::flashinfer_detail {

/// Loads token t's GEMM1 input row (H fp32 values) into dst. Built at prepare (it may allocate
/// then); calling it never allocates.
using RowLoader = std::function<void(int64_t t, float* dst)>;

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
  /// A captured bypassed top-k: routes the current router logits into topk's tensors (allocated
  /// at prepare) for rows [0, routed_rows) before each run. Null otherwise.
  std::shared_ptr<PreparedRouting> routing;
  int64_t routed_rows = 0;
};
/// Accepts a FlashinferDispatchOutput only when flashinfer_a2a; a StandardDispatchOutput always.
/// `require_standard_topk`: a bypassed top-k is an AssertionError (CuteDSL) instead of being
/// materialised (R8): with to_standard() now, or — when `capture` — by `routing` at every run
/// (a custom routing function cannot be captured: Unsupported).
FlashinferInput flashinfer_input(const char* api, const DispatchOutputPtr& dispatch,
                                 bool flashinfer_a2a, bool require_standard_topk, bool capture);
/// The [T, H] buffer of `dtype` the combine writes: the validated moe_output (contiguous, that
/// dtype and shape, checked before anything runs) or a new tensor.
Tensor flashinfer_output_buffer(const char* api, const FlashinferInput& in, int64_t tokens,
                                int64_t hidden, DType dtype);
/// FlashinferCombineInput for a FlashinferDispatchOutput, StandardCombineInput otherwise.
CombineInputPtr flashinfer_combine_input(const FlashinferInput& in, Tensor out);

/// The block scales of a pre-quantized NVFP4 input as GEMM1's loader reads them: linear e4m3
/// bytes [T, H/16]. Linear scales (the flashinfer dispatcher's) are read in place; 128×4-swizzled
/// ones (the FP4 all-gather's) are copied by refresh() into a linear buffer allocated here. The
/// caller validated dtypes and shapes; refresh() checks the current bytes (finite, ≥ 0) and
/// throws InvalidArgument before the loader reads any of them.
class Nvfp4InputScales {
 public:
  /// Linear scales, contiguous [rows, kb] of 1-byte elements.
  explicit Nvfp4InputScales(Tensor linear);
  /// A byte view of swizzled scales [1, Mp, Kbp] (swizzled_scale_bytes) whose storage `source`
  /// keeps alive.
  Nvfp4InputScales(const TensorView& swizzled, Tensor source, int64_t rows, int64_t kb);
  void refresh(const char* api);
  const uint8_t* bytes() const { return linear_.ptr<uint8_t>(); }

 private:
  Tensor source_;  // the scales as given (kept alive)
  std::optional<TensorView> swizzled_;
  Tensor linear_;  // source_ itself when linear
};

/// A token-major FlashInfer fused func (flashinfer_cutlass; flashinfer_cutedsl v2), resolved by
/// its backend file: everything computed from weights and config alone is done here.
struct TokenMajorPlan {
  DispatchOutputPtr dispatch;  // keeps the dispatch output alive
  FlashinferInput input;
  QuantInfoPtr quant_info;  // keeps the weights alive
  ExpertMlp mlp;            // quantizers included; act_dtype is the output dtype
  RowLoader load_row;
  std::optional<Nvfp4InputScales> input_scales;  // a pre-quantized input's, read by load_row
  std::vector<Tensor> keep_alive;                // linear weight block scales mlp points into
  /// Global id e is local expert e − expert_offset when in [expert_offset, + num_local_experts);
  /// ids must be in [−1, id_limit), or == id_limit (the invalid-token id) when allow_invalid_id.
  int64_t expert_offset = 0, num_local_experts = 0, id_limit = 0;
  bool allow_invalid_id = false;
  /// Multiplies the finished output (one more rounding) when set.
  std::optional<float> routed_scaling_factor;
};

/// A TokenMajorPlan prepared for its dispatch output's shapes. Each run(): routes a captured
/// bypassed top-k, checks the input scales and localizes the ids (OutOfRange for ids outside
/// their range, before anything is written), runs every (token, slot) with a local id ≥ 0
/// through its expert (moe_align_block_size order, expert_compute's static schedule), and writes
/// out[t] = round(Σ_j w[t, j] · y[t, j]) in fp32, slot order — then × routed_scaling_factor —
/// into the output (moe_output when given). Empty input runs nothing (R9). The eager fused
/// funcs construct one and run it once, so both give the same bits by construction.
class TokenMajorRun final : public PreparedRun {
 public:
  /// `workspace`: the prepared run's own, or the fused funcs' shared one (calls take turns).
  TokenMajorRun(const char* api, TokenMajorPlan plan, std::shared_ptr<ExpertWorkspace> workspace);
  void run() override;

 private:
  const char* api_;
  TokenMajorPlan plan_;
  Tensor local_ids_;  // i32 [T, k]
  RoutedTokens tokens_;
  Tensor out_;
  std::shared_ptr<ExpertWorkspace> workspace_;
};

// ---------------------------------------------------------------------------------------------
// Activation quantizers (ActivationQuantizer callbacks; one scale per row, always 1.0). The
// arithmetic is formats' (moecore/formats/quantize.h), run by the act_quant_kernels row of
// `level` (picked when the quantizer is made; every row gives formats' bits). Their functors hold
// the row and one float, so a std::function stores them inline: calling one never allocates.

/// NVFP4 with a fp32 global scale gs: formats' nvfp4_quantize_row (sgl-kernel's NVFP4 quant
/// kernel, spec §7.2); the row is replaced by nvfp4_code_values_row, the exact values
/// e2m1 · s_e4m3 (the 1/gs factor lives in alpha).
ActivationQuantizer nvfp4_quantizer(IsaLevel level, float global_scale);
/// FP8 E4M3 per tensor with a given multiplier (FlashInfer's fp8 input quantizer, sgl-kernel's
/// x · (1/scale)): formats' fp8_quantize_row_mul, the row replaced by the decoded codes.
ActivationQuantizer fp8_multiply_quantizer(IsaLevel level, float multiplier);
/// g's quantizer set to one of those, with its quantize_segment (nvfp4: its 16-value blocks;
/// fp8 multiply: elementwise).
void use_nvfp4_quantizer(ExpertGemm& g, IsaLevel level, float global_scale);
void use_fp8_multiply_quantizer(ExpertGemm& g, IsaLevel level, float multiplier);

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
/// last dim /4, as sglang's .view(torch.int32)) → their byte view (dtype and shape checked).
TensorView swizzled_scale_bytes(const char* api, const char* what, const Tensor& swizzled,
                                int64_t e, int64_t rows, int64_t kb);
/// A quant info's Nvfp4LinearScales entry (derived and validated at load) with its shape
/// checked: contiguous kF8E4M3 [E, rows, kb].
const Tensor& checked_linear_scales(const char* api, const char* what, const Tensor& linear,
                                    int64_t e, int64_t rows, int64_t kb);
/// swizzled_scale_bytes, then → validated linear kF8E4M3 [E, rows, kb] (a new tensor).
Tensor linear_from_swizzled(const char* api, const char* what, const Tensor& swizzled, int64_t e,
                            int64_t rows, int64_t kb);
/// MMA view (6-d logical (32, 4, m_tiles, 4, k_tiles, E), any strides) → validated linear
/// kF8E4M3 [E, rows, kb].
Tensor linear_from_mma(const char* api, const char* what, const Tensor& mma, int64_t e,
                       int64_t rows, int64_t kb);

/// Global ids [T, k] (i32/i64, shape checked) → local ids into dst (contiguous i32 [T, k]): id −
/// offset when in [offset, offset + local), −1 otherwise (other ranks' experts, −1, and
/// `id_limit` when allow_invalid_id). Ids outside [−1, id_limit) (id_limit itself allowed only
/// with allow_invalid_id) → OutOfRange.
void localize_expert_ids(const char* api, const TensorView& ids, int64_t offset, int64_t num_local,
                         int64_t id_limit, bool allow_invalid_id, int32_t* dst);

/// "(8,)" / "(8, 2)": a shape as Python prints a tuple (for sglang's messages).
std::string python_shape(const std::vector<int64_t>& shape);

}  // namespace moecore::flashinfer_detail
