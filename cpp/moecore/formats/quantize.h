// Block quantizers and dequantizers for FP8 (E4M3), NVFP4, MXFP4 and INT8: every quantization rule
// of moecore exists once here, in the fp32 operation order of the sglang kernel it names, and the
// backends (runner/quant_compute, runner/backends/flashinfer_moe_common, quant/fp8) call the same
// *_row kernels as the tensor-level functions. Tensor-level functions validate everything (dtypes,
// shapes, block divisibility, scale values, finite input) before writing and return new row-major
// Tensors; results never depend on the thread count. Numpy twins:
// python/moecore/reference/quant.py.
#pragma once

#include <cstdint>
#include <string>

#include "moecore/core/dtype.h"
#include "moecore/core/tensor.h"

namespace moecore {

/// Default lower bound on a block's amax for dynamic FP8/INT8 scales (sglang's `eps`), so an
/// all-zero block gets a tiny positive scale instead of 0 (and x / s stays finite).
constexpr float kDefaultMinAmax = 1e-10f;
/// sglang's per-token-group size for FP8 activations (DeepSeek-V3 style 1×128).
constexpr int64_t kFp8GroupSize = 128;
/// DeepSeek-V3 style weight block (128×128).
constexpr int64_t kFp8WeightBlock = 128;
constexpr int64_t kNvfp4BlockSize = 16;
constexpr int64_t kMxfp4BlockSize = 32;

/// Codes and their scales.
struct QuantizedTensor {
  Tensor q;      ///< codes (dtype per function)
  Tensor scale;  ///< scales (dtype and shape per function)
};

/// The MXFP4 scale rule.
enum class Mxfp4Rounding {
  /// sglang's MXFP4QuantizeUtil (from ModelOpt, spec §7.3): E = ceil(max(log2(amax/6), −127)),
  /// computed exactly; elements x / 2^E with the "ties down" E2M1 rule (zero encodes as 0x8).
  /// Because E is a ceiling, |x / 2^E| ≤ 6: nothing clips.
  kSglangCeil,
  /// OCP MX v1.0 §6.3: E = floor(log2 amax) − 2 (2 = emax of E2M1), clamped to [−127, 127];
  /// elements x / 2^E rounded half-to-even and saturated to ±6 (values up to 8·2^E clip).
  kOcpFloor,
};
/// "sglang_ceil" / "ocp_floor".
const char* mxfp4_rounding_name(Mxfp4Rounding rounding);
/// Parses the names above; throws InvalidArgument listing them.
Mxfp4Rounding parse_mxfp4_rounding(const std::string& name);

// ---------------------------------------------------------------------------------------------
// Scalar codecs over tensors (the tests drive every code through these).

/// x (f32/f16/bf16, any shape and strides) → codes of `fp8_dtype` (kF8E4M3 or kF8E5M2), same
/// shape, round to nearest even with saturation (fp8.h). NaN is kept (never rejected here).
Tensor encode_fp8(const TensorView& x, DType fp8_dtype);
/// kF8E4M3 / kF8E5M2 / kE8M0 codes → f32, same shape, exact (NaN codes give NaN).
Tensor decode_to_f32(const TensorView& codes);
/// x (f32/f16/bf16) [..., K], K even → packed kFp4E2M1x2 [..., K/2]; `ties_down` picks sglang's
/// MXFP4QuantizeUtil rule instead of round-half-to-even (fp4.h).
Tensor encode_e2m1(const TensorView& x, bool ties_down = false);
/// packed kFp4E2M1x2 (or kU8) [..., Kb] → f32 [..., 2·Kb], exact.
Tensor decode_e2m1(const TensorView& packed);
/// Nibble codes kU8 [..., K] (values 0–15), K even → packed kFp4E2M1x2 [..., K/2], element 2i in
/// the low nibble.
Tensor pack_e2m1(const TensorView& nibbles);
/// packed kFp4E2M1x2 (or kU8) [..., Kb] → nibble codes kU8 [..., 2·Kb].
Tensor unpack_e2m1(const TensorView& packed);

// ---------------------------------------------------------------------------------------------
// E8M0 / UE8M0 scales (spec §7.3, §7.4).

/// f32 scales (finite, > 0) → f32 scales rounded UP to powers of two, 2^ceil(log2 s), clamped
/// below at 2^−127 (still ≥ s); s > 2^127 → InvalidArgument (2^128 has no E8M0 code).
Tensor round_scales_ue8m0(const TensorView& scale);
/// f32 powers of two in [2^−127, 2^127] → kE8M0 bytes (the fp32 exponent, as DSv4's f32 scales
/// are converted); anything else → InvalidArgument.
Tensor scales_to_e8m0(const TensorView& scale);
/// kE8M0 (or kU8) scale bytes → f32 2^(e−127); 0xFF (NaN) → InvalidArgument.
Tensor e8m0_to_scales(const TensorView& e8m0);
/// f32 powers of two [..., G] → kI32 [..., ⌈G/4⌉]: byte j (little-endian) of word w is the E8M0
/// byte of scale 4w+j, missing tail bytes are 0 (DeepGEMM's packed UE8M0 layout along K).
Tensor pack_ue8m0(const TensorView& scale);
/// Inverse of pack_ue8m0: kI32 [..., W] → f32 [..., groups], groups ≤ 4·W and > 4·(W−1).
Tensor unpack_ue8m0(const TensorView& packed, int64_t groups);

// ---------------------------------------------------------------------------------------------
// FP8 E4M3 (spec §7.4). Codes are kF8E4M3 with the input's shape; scales are f32 dequant
// multipliers (x ≈ q · s). Dynamic scales are s = max(amax, eps) / 448 (eps > 0 and finite;
// sglang's per-tensor / per-token CUDA kernels have no eps, which only differs for an all-zero
// input). Static, per-tensor, per-channel / per-token and block rules multiply by fp32(1/s)
// (sgl-kernel's per_tensor_quant_fp8 / per_token_quant_fp8, DeepGEMM's per_block_cast_to_fp8); the
// per-token-group rule divides by s (sgl-kernel's per_token_group_quant_8bit). Codes:
// e4m3_rne(clamp(v, ±448)).

/// Static per-tensor (scaled_fp8_quant(x, scale)): q = e4m3(clamp(x · fp32(1/scale))), scale
/// finite and > 0.
Tensor quantize_fp8_static(const TensorView& x, float scale);
/// Dynamic per-tensor (scaled_fp8_quant(x)): s = max(amax(x), eps)/448 over all of x, then the
/// static rule; scale f32 [1].
QuantizedTensor quantize_fp8_per_tensor(const TensorView& x, float eps = kDefaultMinAmax);
/// Per output channel of a weight [..., N, K] (sglang quantizes per-channel weights with the
/// per-token kernel): one scale per row; scale f32 [..., N, 1].
QuantizedTensor quantize_fp8_per_channel(const TensorView& w, float eps = kDefaultMinAmax);
/// Per token of an activation [..., T, H] (scaled_fp8_quant(x, use_per_token_if_dynamic=True),
/// sgl-kernel per_token_quant_fp8): s = max(amax_row, eps)/448, q = e4m3(clamp(x · fp32(1/s)));
/// scale f32 [..., T, 1]. Same rule as per-channel.
QuantizedTensor quantize_fp8_per_token(const TensorView& x, float eps = kDefaultMinAmax);
/// Per token group (1×G along the last dim, DeepSeek-V3 activations;
/// sglang_per_token_group_quant_fp8 → sgl-kernel per_token_group_quant_8bit): x [..., K] with
/// K % group_size == 0 → scale f32 [..., K/G]. s = max(amax, eps)/448; with `scale_ue8m0`,
/// s = 2^ceil(log2 max(s, 1e-10)) (the CUDA kernel's floor); q = e4m3(clamp(x / s)) (a division).
/// DeepGEMM's silu post-quant group rule differs only in its UE8M0 step
/// (Fp8GroupRule::kDeepGemmSiluPost, row kernels below).
QuantizedTensor quantize_fp8_per_token_group(const TensorView& x,
                                             int64_t group_size = kFp8GroupSize,
                                             float eps = kDefaultMinAmax, bool scale_ue8m0 = false);
/// 2-D blocks of a weight w [..., N, K] (typically [E, N, K], 128×128; DeepGEMM's
/// per_block_cast_to_fp8, whose amax clamp is our eps): one scale per block_n × block_k tile, edge
/// tiles may be partial. s = max(amax, eps)/448 (UE8M0: 2^ceil(log2 s)), q = e4m3(clamp(x ·
/// fp32(1/s))). Scale ("weight_scale_inv", the dequant multiplier) f32 [..., ⌈N/bn⌉, ⌈K/bk⌉].
QuantizedTensor quantize_fp8_block(const TensorView& w, int64_t block_n = kFp8WeightBlock,
                                   int64_t block_k = kFp8WeightBlock, float eps = kDefaultMinAmax,
                                   bool scale_ue8m0 = false);

/// x̂ = q · scale (fp32 multiply, one rounding to out_dtype ∈ {kF32, kF16, kBF16}). q kF8E4M3 (or
/// kF8E5M2) of any shape; scale finite > 0.
Tensor dequantize_fp8_per_tensor(const TensorView& q, float scale, DType out_dtype = DType::kF32);
/// Generic block dequant: q [..., N, K] (ndim ≥ 2), scale f32 [..., ⌈N/bn⌉, ⌈K/bk⌉] with the
/// same leading dims; block (bn, bk) covers rows n/bn, cols k/bk. Covers per-channel / per-token
/// (bn = 1, bk = K, scale [..., N, 1]), per-token-group (1, G) and 128×128 weight blocks.
/// Scales must be finite and > 0.
Tensor dequantize_fp8_block(const TensorView& q, const TensorView& scale, int64_t block_n,
                            int64_t block_k, DType out_dtype = DType::kF32);
/// Per-row scales [..., R, 1] (per-channel weights or per-token activations).
Tensor dequantize_fp8_per_row(const TensorView& q, const TensorView& scale,
                              DType out_dtype = DType::kF32);
/// Per-token-group scales [..., K/G] (q [..., K], any ndim ≥ 1).
Tensor dequantize_fp8_per_token_group(const TensorView& q, const TensorView& scale,
                                      int64_t group_size = kFp8GroupSize,
                                      DType out_dtype = DType::kF32);

// ---------------------------------------------------------------------------------------------
// NVFP4 (spec §7.2): E2M1 codes, one E4M3 scale per 16 elements along the last dim (linear
// layout), an fp32 global scale gs. ModelOpt checkpoints store 1/gs (weight_scale_2,
// input_scale); sglang's *_input_scale_quant is gs.

/// Per-tensor (per_leading = false → f32 [1]) or per-leading-index (per_leading = true, e.g. per
/// expert of [E, N, K] → f32 [E]) global scales gs = 448·6 / amax in fp32. An all-zero slice gets
/// gs = 1 (sglang's get_reciprocal would give 0, which no dequantizer can divide by; with zero
/// data every code and block scale is 0 either way). Input must be finite.
Tensor nvfp4_global_scales(const TensorView& x, bool per_leading = true);
/// x [..., K] (K % 16 == 0) → (q kFp4E2M1x2 [..., K/2], block scales kF8E4M3 [..., K/16]).
/// `global_scale` f32 holds one value (any shape) or x.shape[0] values (one per leading index, e.g.
/// per expert); each finite and > 0. Per block of 16, in the order of sglang's reference and CUDA
/// kernel: s = gs · (vmax · fp32(1/6)), clamped to 448, rounded to E4M3 (RNE);
/// inv = s8 ≠ 0 ? 1 / (s8 · fp32(1/gs)) : 0; q = E2M1_rne(clamp(x · inv, −6, 6)).
/// This is also the activation-side quantize (a scalar gs = 1/input_scale).
QuantizedTensor quantize_nvfp4(const TensorView& x, const TensorView& global_scale);
/// Same with one scalar global scale.
QuantizedTensor quantize_nvfp4(const TensorView& x, float global_scale);
/// x̂ = (e2m1 · s8) / gs in fp32 (the product is exact; one rounding for the division), rounded
/// to out_dtype. q [..., K/2], block_scale kF8E4M3 [..., K/16] (finite, ≥ 0), global_scale as
/// for quantize_nvfp4.
Tensor dequantize_nvfp4(const TensorView& q, const TensorView& block_scale,
                        const TensorView& global_scale, DType out_dtype = DType::kF32);
Tensor dequantize_nvfp4(const TensorView& q, const TensorView& block_scale, float global_scale,
                        DType out_dtype = DType::kF32);

// ---------------------------------------------------------------------------------------------
// MXFP4 (OCP MX v1.0; spec §7.3): E2M1 codes, one E8M0 scale per 32 elements along the last dim.

/// x [..., K] (K % 32 == 0) → (q kFp4E2M1x2 [..., K/2], scale kE8M0 [..., K/32]).
QuantizedTensor quantize_mxfp4(const TensorView& x,
                               Mxfp4Rounding rounding = Mxfp4Rounding::kSglangCeil);
/// x̂ = e2m1 · 2^(e − 127), exact in fp32, rounded to out_dtype. q [..., K/2] kFp4E2M1x2 or kU8;
/// scale [..., K/32] kE8M0 or kU8 (sglang/GPT-OSS store E8M0 as uint8); 0xFF → InvalidArgument.
/// GPT-OSS checkpoints use [..., G, 16] blocks with scales [..., G]: reshape to [..., G·16] first.
Tensor dequantize_mxfp4(const TensorView& q, const TensorView& scale,
                        DType out_dtype = DType::kF32);

// ---------------------------------------------------------------------------------------------
// INT8 symmetric per row (sglang's per_token_quant_int8 Triton kernel): a = max(amax, eps),
// s = a / 127, q = round_half_away_from_zero(x · fp32(127 / a)) (libdevice.round), codes kI8.

/// Per output channel of a weight [..., N, K]: scale f32 [..., N, 1].
QuantizedTensor quantize_int8_per_channel(const TensorView& w, float eps = kDefaultMinAmax);
/// Per token of an activation [..., T, H]: scale f32 [..., T, 1].
QuantizedTensor quantize_int8_per_token(const TensorView& x, float eps = kDefaultMinAmax);
/// x̂ = q · s (q kI8 [..., R, K], scale f32 [..., R, 1], finite > 0).
Tensor dequantize_int8_per_row(const TensorView& q, const TensorView& scale,
                               DType out_dtype = DType::kF32);

// ---------------------------------------------------------------------------------------------
// Row kernels: the rules themselves (hot paths; the functions above and the backends call them).
// Unchecked: fp32 in, codes out; the caller guarantees sizes and scales. NaN follows CUDA
// fminf/fmaxf: amax ignores NaN and the FP8 clamp turns NaN into +448, as sglang's kernels do.

/// max |x[i]| over n values, NaN ignored (fmaxf); 0 for n = 0.
float amax_row(const float* x, int64_t n);
/// max |x| over m rows of n values with row stride ld (NaN ignored); 0 for no rows.
float amax_rows(const float* x, int64_t m, int64_t n, int64_t ld);

/// The dynamic FP8 scale of every rule: max(amax, eps) / 448 in fp32. eps = 0 is sgl-kernel's
/// per_tensor_absmax / per_token_quant_fp8 (no floor).
float fp8_dynamic_scale(float amax, float eps);
/// UE8M0 rounding 2^ceil(log2 s) of a scale s > 0 (DeepGEMM's ceil_to_ue8m0 and the Triton
/// _silu_and_mul_post_quant_kernel's exp2(ceil(log2|s|))), clamped below at 2^−127 (the smallest
/// E8M0; unreachable from fp8_dynamic_scale with eps ≥ 1e−36).
float ue8m0_round_up(float s);
/// sgl-kernel per_token_group_quant_8bit's UE8M0 rounding: 2^ceil(log2 max(s, 1e−10)).
float ue8m0_round_up_floored(float s);

/// The multiply step of sgl-kernel's per_tensor_quant_fp8 / per_token_quant_fp8 (and FlashInfer's
/// FP8 input quantizer): q[i] = e4m3_rne(fmaxf(fminf(x[i] · inv, 448), −448)).
void fp8_quantize_row_mul(const float* x, int64_t n, float inv, uint8_t* q);
/// The divide step of the per-token-group kernels: q[i] = e4m3_rne(clamp(x[i] / s, ±448)).
void fp8_quantize_row_div(const float* x, int64_t n, float s, uint8_t* q);
/// Static per-tensor rule: inv = fp32(1 / scale), then fp8_quantize_row_mul (scale 0 gives
/// inv = inf and +448 codes, as on the GPU).
void fp8_quantize_row_static(const float* x, int64_t n, float scale, uint8_t* q);
/// Dynamic per-token rule (per_token_quant_fp8): s = fp8_dynamic_scale(amax_row, eps),
/// inv = s == 0 ? 0 : 1/s, fp8_quantize_row_mul. Returns s. eps = 0: sglang's kernel exactly.
float fp8_quantize_row_per_token(const float* x, int64_t n, float eps, uint8_t* q);

/// The two sglang per-token-group FP8 rules. Both: s = max(amax, eps)/448, q = clamp(x / s).
enum class Fp8GroupRule {
  /// sglang_per_token_group_quant_fp8 → sgl-kernel per_token_group_quant_8bit (CUDA): UE8M0 is
  /// ue8m0_round_up_floored (floor 1e−10).
  kSglangCuda,
  /// DeepGEMM's _silu_and_mul_post_quant_kernel (Triton, eps fixed at 1e−10): UE8M0 is
  /// ue8m0_round_up (no floor).
  kDeepGemmSiluPost,
};
/// The scale of one group under `rule`.
float fp8_group_scale(float amax, float eps, bool ue8m0, Fp8GroupRule rule);
/// One group of n values: s = fp8_group_scale(amax_row, …), fp8_quantize_row_div. Returns s.
float fp8_quantize_group_row(const float* x, int64_t n, float eps, bool ue8m0, Fp8GroupRule rule,
                             uint8_t* q);
/// DeepGEMM per_block_cast_to_fp8's tile scale: fp8_dynamic_scale(amax, eps), ue8m0_round_up when
/// `ue8m0`. Elements are then quantized with fp8_quantize_row_mul(inv = 1/s).
float fp8_block_scale(float amax, float eps, bool ue8m0);

/// One NVFP4 row (sgl-kernel cvt_warp_fp16_to_fp4 / ref_nvfp4_quant): n % 16 == 0, q gets n/2
/// bytes, sf n/16 E4M3 bytes.
void nvfp4_quantize_row(const float* x, int64_t n, float global_scale, uint8_t* q, uint8_t* sf);
/// The exact code values e2m1 · s8 of one NVFP4 row (n % 16 == 0), without the 1/gs factor (what
/// the FlashInfer GEMMs multiply; alpha carries 1/gs).
void nvfp4_code_values_row(const uint8_t* q, const uint8_t* sf, int64_t n, float* out);
/// out[i] = (e2m1 · s8) / gs for n values (n % 16 == 0).
void nvfp4_dequantize_row(const uint8_t* q, const uint8_t* sf, int64_t n, float global_scale,
                          float* out);
/// One MXFP4 row: n % 32 == 0, q gets n/2 bytes, sf n/32 E8M0 bytes.
void mxfp4_quantize_row(const float* x, int64_t n, Mxfp4Rounding rounding, uint8_t* q, uint8_t* sf);
/// out[i] = e2m1 · 2^(e − 127) for n values (n % 32 == 0).
void mxfp4_dequantize_row(const uint8_t* q, const uint8_t* sf, int64_t n, float* out);
/// sglang's per_token_quant_int8 with a given a = max(amax, eps) > 0: q[i] =
/// round_half_away(x[i] · fp32(127 / a)), clamped to ±127 (never reached by finite x); NaN → 0.
void int8_quantize_row(const float* x, int64_t n, float amax, int8_t* q);
/// The whole per-token INT8 rule: a = max(amax_row, eps), int8_quantize_row; returns s = a / 127.
float int8_quantize_row_per_token(const float* x, int64_t n, float eps, int8_t* q);

}  // namespace moecore
