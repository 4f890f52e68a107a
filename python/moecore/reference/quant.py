"""Pure-numpy twins of moecore's scalar codecs and quantizers (cpp/moecore/formats/quantize.h).

Every quantization rule exists once here, as in the C++: an unchecked ``*_rule_ref`` function per
rule in the fp32 operation order of the sglang kernel it names (the MoE references in
``moe_fp8`` / ``moe_nvfp4`` call these), and the validated ``quantize_*_ref`` twins of the public
``moecore.formats`` functions built from them. Written independently of the C++: encoders search
each format's value table for the nearest value (ties to the even code, or down for sglang's MXFP4
rule) instead of manipulating bits, and log2 rules use ``np.frexp``. float32 numpy arithmetic,
so results are bit-exact twins. Codes are raw uint8 (fp8, e8m0, packed e2m1) or int8; scales
float32. NaN follows CUDA fminf/fmaxf (amax ignores it, the FP8 clamp makes it +448).
Must never import the compiled extension or torch.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import round_to

F32 = np.float32
E4M3_MAX = 448.0
E5M2_MAX = 57344.0
E2M1_MAX = 6.0
NVFP4_BLOCK = 16
MXFP4_BLOCK = 32


# ---------------------------------------------------------------------------------------------
# Value tables from the format definitions.


def _minifloat_magnitudes(exp_bits: int, mant_bits: int, bias: int, count: int) -> np.ndarray:
    """Values (float64, exact) of the first `count` non-negative codes."""
    codes = np.arange(count)
    e = codes >> mant_bits
    m = (codes & ((1 << mant_bits) - 1)) / float(1 << mant_bits)
    return np.where(e == 0, np.ldexp(m, 1 - bias), np.ldexp(1.0 + m, e - bias))


E4M3_MAGNITUDES = _minifloat_magnitudes(4, 3, 7, 0x7F)  # codes 0x00..0x7e; 0x7f is NaN
E5M2_MAGNITUDES = _minifloat_magnitudes(5, 2, 15, 0x7C)  # codes 0x00..0x7b; 0x7c inf
E2M1_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def fp8_e4m3_values() -> np.ndarray:
    """float32 value of every E4M3 (fn) code 0..255 (NaN for 0x7f, 0xff)."""
    mags = np.append(E4M3_MAGNITUDES, np.nan)
    return np.concatenate([mags, -mags]).astype(F32)


def fp8_e5m2_values() -> np.ndarray:
    """float32 value of every E5M2 code 0..255 (±inf at 0x7c/0xfc, NaN above)."""
    mags = np.concatenate([E5M2_MAGNITUDES, [np.inf, np.nan, np.nan, np.nan]])
    return np.concatenate([mags, -mags]).astype(F32)


def e2m1_values() -> np.ndarray:
    """float32 value of every E2M1 nibble 0..15 (0x8 is -0)."""
    return np.concatenate([E2M1_MAGNITUDES, -E2M1_MAGNITUDES]).astype(F32)


def e8m0_values() -> np.ndarray:
    """float32 value of every E8M0 byte: 2^(e-127), NaN for 0xff."""
    v = np.ldexp(1.0, np.arange(255) - 127).astype(F32)  # 2^128 (code 255) would overflow
    return np.append(v, F32(np.nan)).astype(F32)


def _nearest_index(a: np.ndarray, table: np.ndarray, ties: str) -> np.ndarray:
    """Index of the table value nearest to each a (a ≥ 0, ≤ table max; table ascending).

    ties: "even" picks the even index on an exact midpoint, "down" the lower one.
    """
    a = np.asarray(a, dtype=np.float64)
    hi = np.clip(np.searchsorted(table, a, side="left"), 0, len(table) - 1)
    lo = np.maximum(hi - 1, 0)
    d_lo = a - table[lo]
    d_hi = table[hi] - a
    pick_hi = d_hi < d_lo
    tie = d_hi == d_lo
    if ties == "even":
        pick_hi = pick_hi | (tie & (hi % 2 == 0))
    return np.where(pick_hi, hi, lo).astype(np.uint8)


# ---------------------------------------------------------------------------------------------
# Scalar codecs.


def encode_fp8_ref(x, dtype: str = "e4m3") -> np.ndarray:
    """float → fp8 codes (uint8), round to nearest even, saturating at ±max; NaN → NaN code."""
    x = np.asarray(x, dtype=F32)
    sign = np.signbit(x).astype(np.uint8) << 7
    a = np.abs(x).astype(np.float64)
    if dtype == "e4m3":
        table, top, nan = E4M3_MAGNITUDES, E4M3_MAX, 0x7F
    elif dtype == "e5m2":
        table, top, nan = E5M2_MAGNITUDES, E5M2_MAX, 0x7E
    else:
        raise ValueError(f"encode_fp8_ref: dtype must be 'e4m3' or 'e5m2', got {dtype!r}")
    isnan = np.isnan(a)
    codes = _nearest_index(np.where(isnan, 0.0, np.minimum(a, top)), table, "even")
    return np.where(isnan, nan, codes).astype(np.uint8) | sign


def decode_fp8_ref(codes, dtype: str = "e4m3") -> np.ndarray:
    """fp8 codes (uint8) → float32."""
    table = fp8_e4m3_values() if dtype == "e4m3" else fp8_e5m2_values()
    return table[np.asarray(codes, dtype=np.uint8)]


def encode_e2m1_ref(x, rounding: str = "rne") -> np.ndarray:
    """float → E2M1 nibble codes (uint8, unpacked).

    rounding "rne": nearest, ties to even, saturating to ±6, sign kept (−0 for negatives that
    round to zero). "ties_down": sglang's MXFP4QuantizeUtil — ties to the lower magnitude and
    the sign bit set unless x > 0 (so zero encodes as 0x8). NaN encodes as 0x7 in both.
    """
    x = np.asarray(x, dtype=F32)
    a = np.abs(x).astype(np.float64)
    isnan = np.isnan(a)
    a = np.where(isnan, 0.0, np.minimum(a, E2M1_MAX))
    if rounding == "rne":
        mag = _nearest_index(a, E2M1_MAGNITUDES, "even")
        sign = np.signbit(x)
    elif rounding == "ties_down":
        mag = _nearest_index(a, E2M1_MAGNITUDES, "down")
        sign = ~(x > 0)
    else:
        raise ValueError(f"encode_e2m1_ref: rounding 'rne' or 'ties_down', got {rounding!r}")
    codes = mag | (sign.astype(np.uint8) << 3)
    return np.where(isnan, 0x7, codes).astype(np.uint8)


def decode_e2m1_ref(nibbles) -> np.ndarray:
    return e2m1_values()[np.asarray(nibbles, dtype=np.uint8) & 0xF]


def pack_e2m1_ref(nibbles) -> np.ndarray:
    """Nibbles [..., K] → bytes [..., K/2]: element 2i in the low nibble."""
    n = np.asarray(nibbles, dtype=np.uint8)
    if n.shape[-1] % 2:
        raise ValueError(f"pack_e2m1_ref: last dim must be even, got {n.shape[-1]}")
    return (n[..., 0::2] | (n[..., 1::2] << 4)).astype(np.uint8)


def unpack_e2m1_ref(packed) -> np.ndarray:
    p = np.asarray(packed, dtype=np.uint8)
    out = np.empty(p.shape[:-1] + (2 * p.shape[-1],), dtype=np.uint8)
    out[..., 0::2] = p & 0xF
    out[..., 1::2] = p >> 4
    return out


def ceil_log2_ref(s) -> np.ndarray:
    """Exact ceil(log2 s) for s > 0 (frexp: s = m·2^e, m in [0.5, 1))."""
    m, e = np.frexp(np.asarray(s, dtype=np.float64))
    return np.where(m == 0.5, e - 1, e).astype(np.int64)


def floor_log2_ref(s) -> np.ndarray:
    _, e = np.frexp(np.asarray(s, dtype=np.float64))
    return (e - 1).astype(np.int64)


def pow2_f32(e) -> np.ndarray:
    """2^e as float32 (e ≥ −149), exact."""
    return np.ldexp(1.0, np.asarray(e, dtype=np.int64)).astype(F32)


def round_scales_ue8m0_ref(scale) -> np.ndarray:
    """2^ceil(log2 s), at least 2^-127 (ue8m0_round_up_ref)."""
    return ue8m0_round_up_ref(scale)


def scales_to_e8m0_ref(scale) -> np.ndarray:
    s = np.asarray(scale, dtype=F32)
    e = floor_log2_ref(s)
    if not (np.all(s > 0) and np.all(pow2_f32(e) == s) and np.all((e >= -127) & (e <= 127))):
        raise ValueError("scales_to_e8m0_ref: scales must be powers of two in [2^-127, 2^127]")
    return (e + 127).astype(np.uint8)


def e8m0_to_scales_ref(codes) -> np.ndarray:
    c = np.asarray(codes, dtype=np.uint8)
    if np.any(c == 0xFF):
        raise ValueError("e8m0_to_scales_ref: 0xFF is NaN")
    return e8m0_values()[c]


def pack_ue8m0_ref(scale) -> np.ndarray:
    """float32 powers of two [..., G] → int32 [..., ceil(G/4)], little-endian bytes, zero tail."""
    b = scales_to_e8m0_ref(scale)
    g = b.shape[-1]
    pad = (-g) % 4
    b = np.concatenate([b, np.zeros(b.shape[:-1] + (pad,), np.uint8)], axis=-1)
    w = b.reshape(b.shape[:-1] + (-1, 4)).astype(np.uint32)
    return (w[..., 0] | (w[..., 1] << 8) | (w[..., 2] << 16) | (w[..., 3] << 24)).view(np.int32)


def unpack_ue8m0_ref(packed, groups: int) -> np.ndarray:
    w = np.asarray(packed, dtype=np.int32).view(np.uint32)
    b = np.stack([(w >> (8 * j)) & 0xFF for j in range(4)], axis=-1).astype(np.uint8)
    b = b.reshape(w.shape[:-1] + (-1,))[..., :groups]
    return e8m0_to_scales_ref(b)


# ---------------------------------------------------------------------------------------------
# FP8 E4M3 rules (quantize.h's row kernels), unchecked.


def as_f32(x) -> np.ndarray:
    """float32 view of f32 / f16 / bfloat16 input (exact widening)."""
    x = np.asarray(x)
    if x.dtype.name == "bfloat16" or x.dtype == np.float16:
        return x.astype(F32)
    return np.asarray(x, dtype=F32)


def amax_ref(x, axis=None, keepdims=False) -> np.ndarray:
    """max |x| with NaN ignored (fmaxf), 0 for empty input."""
    a = np.abs(as_f32(x))
    if a.size == 0:
        if axis is None:
            return F32(0)
        shape = list(a.shape)
        ax = axis % a.ndim
        if keepdims:
            shape[ax] = 1
        else:
            del shape[ax]
        return np.zeros(shape, F32)
    a = np.where(np.isnan(a), F32(0), a)
    return np.fmax.reduce(a, axis=axis, keepdims=keepdims).astype(F32)


def fp8_dynamic_scale_ref(amax, eps) -> np.ndarray:
    """max(amax, eps) / 448 in fp32 (eps 0: sgl-kernel's per-tensor / per-token, no floor)."""
    return (np.fmax(np.asarray(amax, F32), F32(eps)) / F32(E4M3_MAX)).astype(F32)


def ue8m0_round_up_ref(s) -> np.ndarray:
    """2^ceil(log2 s), at least 2^-127 (DeepGEMM ceil_to_ue8m0, the Triton post-quant kernel)."""
    return pow2_f32(np.maximum(ceil_log2_ref(np.asarray(s, F32)), -127))


def ue8m0_round_up_floored_ref(s) -> np.ndarray:
    """sgl-kernel per_token_group_quant_8bit: 2^ceil(log2 max(s, 1e-10))."""
    return ue8m0_round_up_ref(np.fmax(np.asarray(s, F32), F32(1e-10)))


def fp8_quantize_mul_rule_ref(x, inv) -> np.ndarray:
    """sgl-kernel per_tensor / per_token_quant_fp8's step: e4m3(fmax(fmin(x · inv, 448), -448))."""
    with np.errstate(invalid="ignore", over="ignore"):
        v = (as_f32(x) * np.asarray(inv, F32)).astype(F32)
    return encode_fp8_ref(np.fmax(np.fmin(v, F32(E4M3_MAX)), F32(-E4M3_MAX)))


def fp8_quantize_div_rule_ref(x, s) -> np.ndarray:
    """The per-token-group kernels' step: e4m3(clamp(x / s, ±448))."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        v = (as_f32(x) / np.asarray(s, F32)).astype(F32)
    return encode_fp8_ref(np.fmax(np.fmin(v, F32(E4M3_MAX)), F32(-E4M3_MAX)))


def fp8_static_rule_ref(x, scale) -> np.ndarray:
    """scaled_fp8_quant(x, scale): inv = fp32(1/scale), then the multiply step (scale 0 → +448)."""
    with np.errstate(divide="ignore"):
        inv = F32(1.0) / F32(scale)
    return fp8_quantize_mul_rule_ref(x, inv)


def fp8_per_token_rule_ref(x, eps=0.0):
    """per_token_quant_fp8 over the last dim: s = max(amax, eps)/448, inv = s ? 1/s : 0.
    Returns (codes, s [..., 1])."""
    x = as_f32(x)
    s = fp8_dynamic_scale_ref(amax_ref(x, axis=-1, keepdims=True), eps)
    with np.errstate(divide="ignore"):
        inv = np.where(s == 0, F32(0), F32(1.0) / np.where(s == 0, F32(1), s)).astype(F32)
    return fp8_quantize_mul_rule_ref(x, inv), s


FP8_GROUP_RULES = ("sglang_cuda", "deep_gemm_silu_post")


def fp8_group_scale_ref(amax, eps, ue8m0: bool, rule: str = "sglang_cuda") -> np.ndarray:
    """Fp8GroupRule: max(amax, eps)/448; UE8M0 floored at 1e-10 ("sglang_cuda",
    per_token_group_quant_8bit) or not ("deep_gemm_silu_post", _silu_and_mul_post_quant_kernel)."""
    if rule not in FP8_GROUP_RULES:
        raise ValueError(f"fp8_group_scale_ref: rule must be one of {FP8_GROUP_RULES}, got {rule!r}")
    s = fp8_dynamic_scale_ref(amax, eps)
    if not ue8m0:
        return s
    return ue8m0_round_up_floored_ref(s) if rule == "sglang_cuda" else ue8m0_round_up_ref(s)


def fp8_group_rule_ref(x, group_size: int, eps, ue8m0: bool, rule: str = "sglang_cuda"):
    """Groups of group_size along the last dim (K % G == 0): (codes, scales [..., K/G])."""
    x = as_f32(x)
    k = x.shape[-1]
    g = x.reshape(x.shape[:-1] + (k // group_size, group_size))
    s = fp8_group_scale_ref(amax_ref(g, axis=-1, keepdims=True), eps, ue8m0, rule)
    return fp8_quantize_div_rule_ref(g, s).reshape(x.shape), s[..., 0]


def fp8_block_scale_ref(amax, eps, ue8m0: bool) -> np.ndarray:
    """DeepGEMM per_block_cast_to_fp8's tile scale: max(amax, eps)/448, UE8M0 2^ceil(log2 s)."""
    s = fp8_dynamic_scale_ref(amax, eps)
    return ue8m0_round_up_ref(s) if ue8m0 else s


def fp8_block_rule_ref(w, block_n: int, block_k: int, eps, ue8m0: bool):
    """Tiles of w [..., N, K] (edges partial): (codes, scales [..., ceil(N/bn), ceil(K/bk)]),
    q = e4m3(clamp(x · fp32(1/s)))."""
    w = as_f32(w)
    n, k = w.shape[-2:]
    nb, kb = -(-n // block_n), -(-k // block_k)
    padded = np.zeros(w.shape[:-2] + (nb * block_n, kb * block_k), F32)
    padded[..., :n, :k] = np.abs(w)
    tiles = padded.reshape(w.shape[:-2] + (nb, block_n, kb, block_k))
    s = fp8_block_scale_ref(tiles.max(axis=(-3, -1)), eps, ue8m0)
    s_full = np.repeat(np.repeat(s, block_n, axis=-2), block_k, axis=-1)[..., :n, :k]
    return fp8_quantize_mul_rule_ref(w, F32(1.0) / s_full), s


# ---------------------------------------------------------------------------------------------
# FP8 E4M3 quantizers (twins of moecore.formats; validated).


_f32 = as_f32


def _check_finite(x, api):
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{api}: input must be finite")


def quantize_fp8_static_ref(x, scale: float) -> np.ndarray:
    x = _f32(x)
    _check_finite(x, "quantize_fp8_static_ref")
    return fp8_static_rule_ref(x, scale)


def quantize_fp8_per_tensor_ref(x, eps: float = 1e-10):
    x = _f32(x)
    _check_finite(x, "quantize_fp8_per_tensor_ref")
    s = F32(fp8_dynamic_scale_ref(amax_ref(x), eps))
    return fp8_static_rule_ref(x, s), np.array([s], dtype=F32)


def quantize_fp8_per_row_ref(x, eps: float = 1e-10):
    """Per-channel (weights [..., N, K]) and per-token (activations [..., T, H]) alike."""
    x = _f32(x)
    _check_finite(x, "quantize_fp8_per_row_ref")
    return fp8_per_token_rule_ref(x, eps)


quantize_fp8_per_channel_ref = quantize_fp8_per_row_ref
quantize_fp8_per_token_ref = quantize_fp8_per_row_ref


def quantize_fp8_per_token_group_ref(x, group_size: int = 128, eps: float = 1e-10,
                                     scale_ue8m0: bool = False, rule: str = "sglang_cuda"):
    x = _f32(x)
    _check_finite(x, "quantize_fp8_per_token_group_ref")
    k = x.shape[-1]
    if k % group_size:
        raise ValueError(f"last dim {k} is not a multiple of group_size={group_size}")
    return fp8_group_rule_ref(x, group_size, eps, scale_ue8m0, rule)


def quantize_fp8_block_ref(w, block_n: int = 128, block_k: int = 128, eps: float = 1e-10,
                           scale_ue8m0: bool = False):
    """2-D tiles of w [..., N, K]; edge tiles partial; scale [..., ceil(N/bn), ceil(K/bk)]."""
    w = _f32(w)
    _check_finite(w, "quantize_fp8_block_ref")
    return fp8_block_rule_ref(w, block_n, block_k, eps, scale_ue8m0)


def dequantize_fp8_block_ref(q, scale, block_n: int, block_k: int, out_dtype: str = "f32"):
    """x = decode(q) · scale[n/bn, k/bk], fp32 multiply, rounded to out_dtype."""
    q = np.asarray(q).view(np.uint8)
    s = np.asarray(scale, dtype=F32)
    n, k = q.shape[-2:]
    s_full = np.repeat(np.repeat(s, block_n, axis=-2), block_k, axis=-1)[..., :n, :k]
    return round_to(decode_fp8_ref(q) * s_full, out_dtype)


# ---------------------------------------------------------------------------------------------
# NVFP4 (spec §7.2, in the order of sglang's ref_nvfp4_quant and its CUDA kernel).


def nvfp4_global_scales_ref(x, per_leading: bool = True) -> np.ndarray:
    x = _f32(x)
    _check_finite(x, "nvfp4_global_scales_ref")
    if per_leading:
        amax = np.abs(x).reshape(x.shape[0], -1).max(axis=1).astype(F32)
    else:
        amax = np.array([np.max(np.abs(x))], F32)
    with np.errstate(divide="ignore"):
        gs = F32(E4M3_MAX * E2M1_MAX) / amax
    return np.where(amax == 0, F32(1), gs).astype(F32)


def _per_row_global(gs, x):
    gs = np.asarray(gs, dtype=F32).reshape(-1)
    if gs.size == 1:
        return np.full(x.shape[:-1] + (1,), gs[0], F32)
    return np.broadcast_to(gs.reshape((-1,) + (1,) * (x.ndim - 1)), x.shape[:-1] + (1,))


def quantize_nvfp4_ref(x, global_scale):
    """x [..., K] → (packed uint8 [..., K/2], e4m3 codes uint8 [..., K/16])."""
    x = _f32(x)
    _check_finite(x, "quantize_nvfp4_ref")
    k = x.shape[-1]
    if k % NVFP4_BLOCK:
        raise ValueError(f"last dim {k} is not a multiple of 16")
    gs = _per_row_global(global_scale, x)[..., None]  # [..., 1, 1]
    b = x.reshape(x.shape[:-1] + (k // NVFP4_BLOCK, NVFP4_BLOCK))
    vmax = np.max(np.abs(b), axis=-1, keepdims=True)
    s = np.minimum(gs * (vmax * (F32(1) / F32(6))), F32(E4M3_MAX))
    code = encode_fp8_ref(s)
    s8 = decode_fp8_ref(code)
    inv_gs = F32(1) / gs
    with np.errstate(divide="ignore"):
        inv = np.where(s8 != 0, F32(1) / (s8 * inv_gs), F32(0)).astype(F32)
    y = np.clip(b * inv, F32(-E2M1_MAX), F32(E2M1_MAX))
    nib = encode_e2m1_ref(y, "rne").reshape(x.shape)
    return pack_e2m1_ref(nib), code[..., 0]


def nvfp4_code_values_ref(q, block_scale) -> np.ndarray:
    """Packed e2m1 [..., K/2] and e4m3 block scales [..., K/16] → the exact values e2m1 · s8."""
    vals = decode_e2m1_ref(unpack_e2m1_ref(np.asarray(q).view(np.uint8)))
    s = decode_fp8_ref(np.asarray(block_scale).view(np.uint8))
    return (vals * np.repeat(s, NVFP4_BLOCK, axis=-1)).astype(F32)


def dequantize_nvfp4_ref(q, block_scale, global_scale=1.0, out_dtype: str = "f32"):
    """x = (e2m1 · s_e4m3) / gs in fp32, rounded to out_dtype."""
    vals = nvfp4_code_values_ref(q, block_scale)
    return round_to(vals / _per_row_global(global_scale, vals), out_dtype)


# ---------------------------------------------------------------------------------------------
# MXFP4 (OCP MX v1.0; spec §7.3).


def quantize_mxfp4_ref(x, rounding: str = "sglang_ceil"):
    """x [..., K] → (packed uint8 [..., K/2], e8m0 bytes uint8 [..., K/32])."""
    x = _f32(x)
    _check_finite(x, "quantize_mxfp4_ref")
    k = x.shape[-1]
    if k % MXFP4_BLOCK:
        raise ValueError(f"last dim {k} is not a multiple of 32")
    b = x.reshape(x.shape[:-1] + (k // MXFP4_BLOCK, MXFP4_BLOCK))
    amax = np.max(np.abs(b), axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        if rounding == "sglang_ceil":
            descale = amax / F32(E2M1_MAX)
            e = np.maximum(ceil_log2_ref(np.where(descale == 0, 1, descale)), -127)
            e = np.where(descale == 0, -127, e)
            ties = "ties_down"
        elif rounding == "ocp_floor":
            e = np.clip(floor_log2_ref(np.where(amax == 0, 1, amax)) - 2, -127, 127)
            e = np.where(amax == 0, -127, e)
            ties = "rne"
        else:
            raise ValueError(f"rounding must be 'sglang_ceil' or 'ocp_floor', got {rounding!r}")
    y = b / pow2_f32(e)
    nib = encode_e2m1_ref(y, ties).reshape(x.shape)
    return pack_e2m1_ref(nib), (e[..., 0] + 127).astype(np.uint8)


def dequantize_mxfp4_ref(q, scale, out_dtype: str = "f32"):
    vals = decode_e2m1_ref(unpack_e2m1_ref(np.asarray(q).view(np.uint8)))
    s = e8m0_to_scales_ref(np.asarray(scale).view(np.uint8))
    return round_to(vals * np.repeat(s, MXFP4_BLOCK, axis=-1), out_dtype)


# ---------------------------------------------------------------------------------------------
# INT8 symmetric per row (sglang's per_token_quant_int8 Triton kernel).


def int8_per_token_rule_ref(x, eps=1e-10):
    """a = max(amax, eps), s = a/127, q = round_half_away(x · fp32(127/a)) (libdevice.round),
    clamped to ±127 (unreachable for finite x), NaN → 0. Returns (int8 codes, s [..., 1])."""
    x = as_f32(x)
    a = np.fmax(amax_ref(x, axis=-1, keepdims=True), F32(eps)).astype(F32)
    with np.errstate(invalid="ignore"):
        v = (x * (F32(127) / a)).astype(F32).astype(np.float64)
    r = np.sign(v) * np.floor(np.abs(v) + 0.5)  # exact in float64 for |v| < 2^52
    r = np.where(np.isnan(r), 0.0, np.clip(r, -127, 127))
    return r.astype(np.int8), (a / F32(127)).astype(F32)


def quantize_int8_per_row_ref(x, eps: float = 1e-10):
    """→ (int8 codes, scale f32 [..., 1]) by int8_per_token_rule_ref (ties away from zero)."""
    x = _f32(x)
    _check_finite(x, "quantize_int8_per_row_ref")
    return int8_per_token_rule_ref(x, eps)


quantize_int8_per_channel_ref = quantize_int8_per_row_ref
quantize_int8_per_token_ref = quantize_int8_per_row_ref


def dequantize_int8_per_row_ref(q, scale, out_dtype: str = "f32"):
    x = np.asarray(q, dtype=np.int8).astype(F32) * np.asarray(scale, dtype=F32)
    return round_to(x, out_dtype)


__all__ = [
    "as_f32", "amax_ref", "fp8_dynamic_scale_ref", "ue8m0_round_up_ref",
    "ue8m0_round_up_floored_ref", "fp8_quantize_mul_rule_ref", "fp8_quantize_div_rule_ref",
    "fp8_static_rule_ref", "fp8_per_token_rule_ref", "FP8_GROUP_RULES", "fp8_group_scale_ref",
    "fp8_group_rule_ref", "fp8_block_scale_ref", "fp8_block_rule_ref", "int8_per_token_rule_ref",
    "nvfp4_code_values_ref",
    "fp8_e4m3_values", "fp8_e5m2_values", "e2m1_values", "e8m0_values",
    "encode_fp8_ref", "decode_fp8_ref", "encode_e2m1_ref", "decode_e2m1_ref",
    "pack_e2m1_ref", "unpack_e2m1_ref", "ceil_log2_ref", "floor_log2_ref",
    "round_scales_ue8m0_ref", "scales_to_e8m0_ref", "e8m0_to_scales_ref",
    "pack_ue8m0_ref", "unpack_ue8m0_ref",
    "quantize_fp8_static_ref", "quantize_fp8_per_tensor_ref", "quantize_fp8_per_row_ref",
    "quantize_fp8_per_channel_ref", "quantize_fp8_per_token_ref",
    "quantize_fp8_per_token_group_ref", "quantize_fp8_block_ref", "dequantize_fp8_block_ref",
    "nvfp4_global_scales_ref", "quantize_nvfp4_ref", "dequantize_nvfp4_ref",
    "quantize_mxfp4_ref", "dequantize_mxfp4_ref",
    "quantize_int8_per_row_ref", "quantize_int8_per_channel_ref", "quantize_int8_per_token_ref",
    "dequantize_int8_per_row_ref",
]
