// sglang's activation quantizers for the 8-bit MoE paths (FP8 E4M3 and INT8), as exact scalar
// kernels that the triton and deep_gemm backends share, plus the scale checks of those backends.
// Every rule repeats the fp32 operation order of the sglang kernel it names, so the numpy twins in
// python/moecore/reference/moe_fp8.py reproduce the codes bit for bit. Rows are quantized one at a
// time (batch invariance); only the per-tensor dynamic scale looks at a whole batch.
#pragma once

#include <cstdint>

#include "moecore/core/tensor.h"
#include "moecore/runner/expert_compute.h"

namespace moecore {

/// The eps of sglang's dynamic 8-bit quantizers (per-token-group FP8, per-token INT8).
constexpr float kActQuantEps = 1e-10f;

/// How a GEMM input is quantized (sglang fused_moe_triton invoke_fused_moe_kernel and the
/// DeepGEMM masked flow).
enum class ActQuant {
  kNone,                 // used as it is (W8A16, unquantized)
  kFp8Static,            // scaled_fp8_quant(A, scale): one given scale
  kFp8PerTensorDynamic,  // scaled_fp8_quant(A): s = amax(A)/448 over the whole A (batch-dependent)
  kFp8PerToken,          // scaled_fp8_quant(A, use_per_token_if_dynamic=True)
  kFp8PerTokenGroup,     // sglang_per_token_group_quant_fp8(A, group) (CUDA kernel rule)
  kFp8SiluPostGroup,     // DeepGEMM _silu_and_mul_post_quant_kernel's group rule (Triton)
  kInt8PerToken,         // per_token_quant_int8(A)
};
const char* act_quant_name(ActQuant q);

// ---------------------------------------------------------------------------------------------
// Row kernels (unchecked; fp32 in, E4M3 / INT8 codes out). NaN inputs follow CUDA fminf/fmaxf:
// the clamp turns NaN into +448 (as sglang's kernels do).

/// sglang's static per-tensor rule (jit per_tensor_quant_fp8, is_static): inv = 1/scale in fp32,
/// q = e4m3(fmax(fmin(x·inv, 448), −448)) with RNE. Also the dynamic per-tensor rule once the
/// scale amax/448 is known (inv = inf for scale 0 gives NaN → +448 codes, as on the GPU).
void fp8_quant_scaled_row(const float* x, int64_t n, float scale, uint8_t* q);
/// amax/448 (the dynamic per-tensor scale; no eps, as the jit absmax kernel).
float fp8_per_tensor_scale(float amax);
/// sglang's dynamic per-token rule (jit per_token_quant_fp8): s = amax/448 (no eps),
/// inv = s == 0 ? 0 : 1/s, q = e4m3(clamp(x·inv, ±448)). Returns s.
float fp8_quant_per_token_row(const float* x, int64_t n, uint8_t* q);
/// A per-token-group rule over `n` values of one group. Returns the group scale s and writes
/// q = e4m3(clamp(x / s, ±448)) (a division, as both kernels). a = max(max|x|, 1e-10),
/// s = a / 448; with ue8m0, s = 2^ceil(log2 s') where s' = max(s, 1e-10) for kFp8PerTokenGroup
/// (sglang per_token_group_quant_8bit CUDA) and s' = s for kFp8SiluPostGroup (the Triton
/// _silu_and_mul_post_quant_kernel).
float fp8_quant_group(const float* x, int64_t n, bool ue8m0, ActQuant rule, uint8_t* q);
/// sglang's per_token_quant_int8 (Triton): a = max(max|x|, 1e-10), s = a/127 (fp32 division),
/// q = round_half_away_from_zero(x · (127/a)) (libdevice.round), written as int8. Returns s.
float int8_quant_per_token_row(const float* x, int64_t n, int8_t* q);

/// max |x| over m rows of n values (stride ld), NaN ignored (fmaxf); 0 for no rows.
float amax_rows(const float* x, int64_t m, int64_t n, int64_t ld);

/// The quantizer callback of one GEMM input (expert_compute.h's contract): quantizes each row
/// of fp32 values in place to decoded codes (fp32 values of E4M3/INT8) and writes scales
/// [m, scales_per_row]. `static_scale` is the per-tensor scale for kFp8Static and for
/// kFp8PerTensorDynamic (computed over the batch by the caller). group: K block for the group
/// rules. Returns an empty callback for kNone.
ActivationQuantizer make_act_quantizer(ActQuant rule, float static_scale = 0.0f, int64_t group = 0,
                                       bool ue8m0 = false);
/// Scales per row that make_act_quantizer writes for a K of `k`: ⌈k/group⌉ for group rules, 1
/// otherwise.
int64_t act_scales_per_row(ActQuant rule, int64_t k, int64_t group);

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
/// naming the first bad index otherwise. A non-f32 view → DTypeError.
void check_scale_values(const char* api, const char* name, const TensorView& scale,
                        bool allow_zero);
/// A per-channel scale [E, N] or [E, N, 1] seen as a 2-D [E, N] view (shape checked).
TensorView per_channel_scale_view(const char* api, const char* name, const Tensor& scale,
                                  int64_t num_experts, int64_t n);
/// The single value of a per-tensor activation scale (numel 1, f32, finite, > 0).
float scalar_scale(const char* api, const char* name, const Tensor& scale);

}  // namespace moecore
