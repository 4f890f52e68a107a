"""moecore.formats: bit-exact codecs, block quantizers and layout transforms for the quantized MoE
formats (FP8 E4M3/E5M2, E8M0/UE8M0, NVFP4, MXFP4, INT8), running in moecore's C++ core.

Conventions (spec sections refer to spec/sglang-moe-architecture.md):

* Inputs are numpy arrays (any strides), passed without copies: float32, float16 or ml_dtypes
  bfloat16 for real values; ml_dtypes float8_e4m3fn / float8_e8m0fnu for fp8 and e8m0 codes
  (uint8 is accepted where sglang stores E8M0 as uint8); packed FP4 as uint8, element 2i in the
  low nibble of byte i (or ``moecore.tagged(u8, "fp4_e2m1x2")``). Outputs are new arrays.
* FP8 encoding rounds to nearest even and saturates like the GPU kernels (|x| ≥ 448 and ±inf
  become ±448 for e4m3; ml_dtypes gives NaN instead). NaN stays NaN.
* Quantizers compute in float32 in the rule's documented order (below). Non-finite input, invalid input
  scales (zero, negative, NaN or inf; NVFP4 block scales may be 0) and E8M0 0xFF raise
  ``InvalidArgumentError`` (a ValueError); wrong dtypes raise ``DTypeError`` (a TypeError). Scales
  returned as float32 are dequant multipliers (x ≈ q · s).
* Every quantization rule exists once in C++ (cpp/moecore/formats/quantize.h), shared with the MoE
  backends, in the fp32 operation order of the sglang kernel it mirrors:

  - ``quantize_fp8_static``: sgl-kernel per_tensor_quant_fp8 (static, ``scaled_fp8_quant(x,
    scale)``): q = e4m3(clamp(x · fp32(1/scale), ±448)).
  - ``quantize_fp8_per_tensor``: the same kernel, dynamic: s = max(amax(x), eps)/448, then as
    static.
  - ``quantize_fp8_per_token`` / ``quantize_fp8_per_channel``: sgl-kernel per_token_quant_fp8
    (``scaled_fp8_quant(x, use_per_token_if_dynamic=True)``): s = max(amax_row, eps)/448,
    q = e4m3(clamp(x · fp32(1/s))). sglang's per-tensor / per-token kernels have no eps (it only
    matters for an all-zero input).
  - ``quantize_fp8_per_token_group``: ``sglang_per_token_group_quant_fp8`` (sgl-kernel
    per_token_group_quant_8bit): s = max(amax, eps)/448, with ``scale_ue8m0`` s =
    2^ceil(log2 max(s, 1e-10)); q = e4m3(clamp(x / s)) (a division). DeepGEMM's Triton
    ``_silu_and_mul_post_quant_kernel`` differs only in its UE8M0 step (no 1e-10 floor); that rule
    is ``fp8_int8_ops.quantize_activation(..., rule="fp8_silu_post_group")``.
  - ``quantize_fp8_block``: DeepGEMM's per_block_cast_to_fp8 (eps is its amax clamp): s =
    max(amax_tile, eps)/448, UE8M0 s = 2^ceil(log2 s), q = e4m3(clamp(x · fp32(1/s))).
  - ``quantize_nvfp4`` (§7.2): sgl-kernel's NVFP4 quant kernel (cvt_warp_fp16_to_fp4) and
    ref_nvfp4_quant: 16-blocks, e4m3 block scales (linear layout), fp32 global scale gs.
    ModelOpt's weight_scale_2 / input_scale are 1/gs.
  - ``quantize_mxfp4`` (§7.3): 32-blocks, e8m0 scales; ``rounding="sglang_ceil"`` (sglang's
    MXFP4QuantizeUtil, ties down, zero encodes as 0x8) or ``"ocp_floor"`` (OCP MX v1.0:
    floor(log2 amax) − 2, RNE, saturating).
  - ``quantize_int8_per_token`` / ``quantize_int8_per_channel``: sglang's per_token_quant_int8
    (Triton): a = max(amax, eps), s = a/127, q = round_half_away_from_zero(x · fp32(127/a)).

* Layout transforms move bytes of any dtype and have exact inverses; sizes count storage units
  (bytes of packed FP4). The MMA view shares memory with its input.

Every function has a numpy twin in ``moecore.reference.quant`` / ``moecore.reference.layout``.
"""

from __future__ import annotations

from ._moecore import formats as _f

E4M3_MAX = 448.0
E5M2_MAX = 57344.0
E2M1_MAX = 6.0
NVFP4_BLOCK_SIZE = 16
MXFP4_BLOCK_SIZE = 32
FP8_GROUP_SIZE = 128
MXFP4_ROUNDINGS = ("sglang_ceil", "ocp_floor")

# Codecs.
encode_fp8 = _f.encode_fp8
decode_to_f32 = _f.decode_to_f32
encode_e2m1 = _f.encode_e2m1
decode_e2m1 = _f.decode_e2m1
pack_e2m1 = _f.pack_e2m1
unpack_e2m1 = _f.unpack_e2m1
round_scales_ue8m0 = _f.round_scales_ue8m0
scales_to_e8m0 = _f.scales_to_e8m0
e8m0_to_scales = _f.e8m0_to_scales
pack_ue8m0 = _f.pack_ue8m0
unpack_ue8m0 = _f.unpack_ue8m0

# FP8.
quantize_fp8_static = _f.quantize_fp8_static
quantize_fp8_per_tensor = _f.quantize_fp8_per_tensor
quantize_fp8_per_channel = _f.quantize_fp8_per_channel
quantize_fp8_per_token = _f.quantize_fp8_per_token
quantize_fp8_per_token_group = _f.quantize_fp8_per_token_group
quantize_fp8_block = _f.quantize_fp8_block
dequantize_fp8_per_tensor = _f.dequantize_fp8_per_tensor
dequantize_fp8_per_row = _f.dequantize_fp8_per_row
dequantize_fp8_per_token_group = _f.dequantize_fp8_per_token_group
dequantize_fp8_block = _f.dequantize_fp8_block

# NVFP4 and MXFP4.
nvfp4_global_scales = _f.nvfp4_global_scales
quantize_nvfp4 = _f.quantize_nvfp4
dequantize_nvfp4 = _f.dequantize_nvfp4
quantize_mxfp4 = _f.quantize_mxfp4
dequantize_mxfp4 = _f.dequantize_mxfp4

# INT8.
quantize_int8_per_channel = _f.quantize_int8_per_channel
quantize_int8_per_token = _f.quantize_int8_per_token
dequantize_int8_per_row = _f.dequantize_int8_per_row

# Layouts.
nvfp4_swizzled_offset = _f.nvfp4_swizzled_offset
swizzle_nvfp4_scales = _f.swizzle_nvfp4_scales
unswizzle_nvfp4_scales = _f.unswizzle_nvfp4_scales
nvfp4_scales_mma_view = _f.nvfp4_scales_mma_view
nvfp4_scales_from_mma_view = _f.nvfp4_scales_from_mma_view
interleave_w13_halves = _f.interleave_w13_halves
deinterleave_w13_halves = _f.deinterleave_w13_halves
swap_w13_halves = _f.swap_w13_halves
deinterleave_gate_up_rows = _f.deinterleave_gate_up_rows
interleave_gate_up_rows = _f.interleave_gate_up_rows
pad_dim = _f.pad_dim
unpad_dim = _f.unpad_dim
pad_w13_intermediate = _f.pad_w13_intermediate
unpad_w13_intermediate = _f.unpad_w13_intermediate
interleave_moe_weights_for_sm90_mixed_gemm = _f.interleave_moe_weights_for_sm90_mixed_gemm
deinterleave_moe_weights_for_sm90_mixed_gemm = _f.deinterleave_moe_weights_for_sm90_mixed_gemm
interleave_moe_scales_for_sm90_mixed_gemm = _f.interleave_moe_scales_for_sm90_mixed_gemm
deinterleave_moe_scales_for_sm90_mixed_gemm = _f.deinterleave_moe_scales_for_sm90_mixed_gemm

__all__ = [
    "E4M3_MAX", "E5M2_MAX", "E2M1_MAX", "NVFP4_BLOCK_SIZE", "MXFP4_BLOCK_SIZE", "FP8_GROUP_SIZE",
    "MXFP4_ROUNDINGS",
    "encode_fp8", "decode_to_f32", "encode_e2m1", "decode_e2m1", "pack_e2m1", "unpack_e2m1",
    "round_scales_ue8m0", "scales_to_e8m0", "e8m0_to_scales", "pack_ue8m0", "unpack_ue8m0",
    "quantize_fp8_static", "quantize_fp8_per_tensor", "quantize_fp8_per_channel",
    "quantize_fp8_per_token", "quantize_fp8_per_token_group", "quantize_fp8_block",
    "dequantize_fp8_per_tensor", "dequantize_fp8_per_row", "dequantize_fp8_per_token_group",
    "dequantize_fp8_block",
    "nvfp4_global_scales", "quantize_nvfp4", "dequantize_nvfp4",
    "quantize_mxfp4", "dequantize_mxfp4",
    "quantize_int8_per_channel", "quantize_int8_per_token", "dequantize_int8_per_row",
    "nvfp4_swizzled_offset", "swizzle_nvfp4_scales", "unswizzle_nvfp4_scales",
    "nvfp4_scales_mma_view", "nvfp4_scales_from_mma_view",
    "interleave_w13_halves", "deinterleave_w13_halves", "swap_w13_halves",
    "deinterleave_gate_up_rows", "interleave_gate_up_rows",
    "pad_dim", "unpad_dim", "pad_w13_intermediate", "unpad_w13_intermediate",
    "interleave_moe_weights_for_sm90_mixed_gemm", "deinterleave_moe_weights_for_sm90_mixed_gemm",
    "interleave_moe_scales_for_sm90_mixed_gemm", "deinterleave_moe_scales_for_sm90_mixed_gemm",
]
