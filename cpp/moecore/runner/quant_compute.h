// The activation-quantizer plumbing of the 8-bit MoE paths (triton, deep_gemm): which sglang rule
// quantizes a GEMM input (ActQuant), the ActivationQuantizer callback and a validated tensor-level
// entry point over it, plus the scale checks of those backends. The rules themselves live once in
// moecore/formats/quantize.h (row kernels, and the scale and encode steps it documents for each).
// Rows are quantized one at a time (batch invariance); only the per-tensor dynamic scale looks at
// a whole batch, and the caller computes it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moecore/core/tensor.h"
#include "moecore/formats/quantize.h"
#include "moecore/isa/isa.h"
#include "moecore/runner/expert_compute.h"

namespace moecore {

/// The eps of sglang's dynamic 8-bit quantizers (per-token-group FP8, per-token INT8).
constexpr float kActQuantEps = 1e-10f;

/// How a GEMM input is quantized (sglang fused_moe_triton invoke_fused_moe_kernel and the
/// DeepGEMM masked flow), and the formats row kernel each rule runs. One byte, so that
/// make_act_quantizer's callback fits std::function's inline storage.
enum class ActQuant : uint8_t {
  kNone,                 // used as it is (W8A16, unquantized)
  kFp8Static,            // scaled_fp8_quant(A, scale): fp8_quantize_row_static
  kFp8PerTensorDynamic,  // scaled_fp8_quant(A): s = fp8_dynamic_scale(amax(A), 0) over the whole
                         // A (batch-dependent, computed by the caller), then as static
  kFp8PerToken,          // scaled_fp8_quant(A, use_per_token_if_dynamic=True):
                         // fp8_quantize_row_per_token with eps 0
  kFp8PerTokenGroup,     // sglang_per_token_group_quant_fp8(A, group): fp8_quantize_group_row,
                         // Fp8GroupRule::kSglangCuda, eps 1e-10
  kFp8SiluPostGroup,     // DeepGEMM _silu_and_mul_post_quant_kernel: fp8_quantize_group_row,
                         // Fp8GroupRule::kDeepGemmSiluPost, eps 1e-10
  kInt8PerToken,         // per_token_quant_int8(A): int8_quantize_row_per_token, eps 1e-10
};
const char* act_quant_name(ActQuant q);

/// The formats group rule of a group ActQuant (kFp8PerTokenGroup → kSglangCuda,
/// kFp8SiluPostGroup → kDeepGemmSiluPost).
Fp8GroupRule fp8_group_rule(ActQuant rule);
/// Compatibility name (deep_gemm.cpp): one group of n values under a group ActQuant with sglang's
/// eps 1e-10 — formats' fp8_quantize_group_row. Returns the scale.
inline float fp8_quant_group(const float* x, int64_t n, bool ue8m0, ActQuant rule, uint8_t* q) {
  return fp8_quantize_group_row(x, n, kActQuantEps, ue8m0, fp8_group_rule(rule), q);
}

/// The quantizer callback of one GEMM input (expert_compute.h's contract): quantizes each row
/// of fp32 values in place to decoded codes (fp32 values of E4M3/INT8) and writes scales
/// [m, scales_per_row], with the act_quant_kernels row of `level` (picked here, once).
/// `static_scale` is the per-tensor scale for kFp8Static and for kFp8PerTensorDynamic (computed
/// over the batch by the caller). group: K block for the group rules. Returns an empty callback
/// for kNone. Allocates nothing when called, made or copied (the callback fits std::function's
/// inline storage), and gives the bits of quantize_activation at every level.
ActivationQuantizer make_act_quantizer(IsaLevel level, ActQuant rule, float static_scale = 0.0f,
                                       int64_t group = 0, bool ue8m0 = false);
/// Scales per row that make_act_quantizer writes for a K of `k`: ⌈k/group⌉ for group rules, 1
/// otherwise.
int64_t act_scales_per_row(ActQuant rule, int64_t k, int64_t group);
/// ExpertGemm::quantize_segment of a rule: its group (group rules), 1 (the static rule, one
/// scale for every element), 0 (per-token and dynamic per-tensor rules read the whole row or
/// batch first).
int64_t act_quant_segment(ActQuant rule, int64_t group);

// ---------------------------------------------------------------------------------------------
// Tensor-level entry points (validated; bound to Python for the bit-exact tests). x: [rows, K]
// f32/f16/bf16 with contiguous rows. Codes are kF8E4M3 (or kI8) [rows, K]; scales f32.

struct ActQuantResult {
  Tensor q;      // kF8E4M3 or kI8 [rows, K]
  Tensor scale;  // f32: [1] per-tensor, [rows, 1] per-token, [rows, ⌈K/group⌉] group rules
};
/// `scale` is used by kFp8Static only (finite, > 0); `group` by the group rules (K % group == 0).
ActQuantResult quantize_activation(const TensorView& x, ActQuant rule, float scale = 0.0f,
                                   int64_t group = 128, bool ue8m0 = false);
ActQuant parse_act_quant(const std::string& name);

// ---------------------------------------------------------------------------------------------
// Scale checks shared by the 8-bit backends ("api: expected …, got …").

/// Every value of an f32 view is finite and > 0 (or ≥ 0 when allow_zero); InvalidArgument
/// naming the first bad index otherwise. A non-f32 view → DTypeError. With `experts` (a flag per
/// index of dim 0, the expert), only the flagged experts' values: the scales a call reads.
void check_scale_values(const char* api, const char* name, const TensorView& scale, bool allow_zero,
                        const std::vector<uint8_t>* experts = nullptr);
/// A per-channel scale [E, N] or [E, N, 1] seen as a 2-D [E, N] view (shape checked).
TensorView per_channel_scale_view(const char* api, const char* name, const Tensor& scale,
                                  int64_t num_experts, int64_t n);
/// The single value of a per-tensor activation scale (numel 1, f32, finite, > 0).
float scalar_scale(const char* api, const char* name, const Tensor& scale);

}  // namespace moecore
