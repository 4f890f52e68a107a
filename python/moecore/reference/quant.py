"""Pure-numpy twins of moecore's scalar codecs and block quantizers (cpp/moecore/formats/).

Written independently of the C++: encoders search each format's value table for the nearest
value (ties to the even code, or down for sglang's MXFP4 rule) instead of manipulating bits, and
log2 rules use ``np.frexp``. The quantizers repeat the documented fp32 operation order (spec
§7.2–§7.4) with float32 numpy arrays, so results are bit-exact twins of the C++. Codes are
returned as raw uint8 (fp8, e8m0, packed e2m1) and scales as float32 unless stated.
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
    """2^ceil(log2 s), at least 2^-127."""
    s = np.asarray(scale, dtype=F32)
    return pow2_f32(np.maximum(ceil_log2_ref(s), -127))


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
# FP8 E4M3 quantizers: q = sat(x / s) in fp32, s = max(amax, eps) / 448.


def _f32(x) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype.name == "bfloat16" or x.dtype == np.float16:
        return x.astype(F32)
    return np.asarray(x, dtype=F32)


def _check_finite(x, api):
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{api}: input must be finite")


def _dynamic_scale(amax, eps, ue8m0=False):
    s = np.maximum(np.asarray(amax, dtype=F32), F32(eps)) / F32(E4M3_MAX)
    return round_scales_ue8m0_ref(s) if ue8m0 else s.astype(F32)


def quantize_fp8_static_ref(x, scale: float) -> np.ndarray:
    x = _f32(x)
    _check_finite(x, "quantize_fp8_static_ref")
    return encode_fp8_ref(x / F32(scale))


def quantize_fp8_per_tensor_ref(x, eps: float = 1e-10):
    x = _f32(x)
    _check_finite(x, "quantize_fp8_per_tensor_ref")
    s = _dynamic_scale(np.max(np.abs(x)) if x.size else F32(0), eps)
    return encode_fp8_ref(x / s), np.array([s], dtype=F32)


def quantize_fp8_per_row_ref(x, eps: float = 1e-10):
    """Per-channel (weights [..., N, K]) and per-token (activations [..., T, H]) alike."""
    x = _f32(x)
    _check_finite(x, "quantize_fp8_per_row_ref")
    if x.shape[-1]:
        amax = np.max(np.abs(x), axis=-1, keepdims=True)
    else:
        amax = np.zeros(x.shape[:-1] + (1,), F32)
    s = _dynamic_scale(amax, eps)
    return encode_fp8_ref(x / s), s


quantize_fp8_per_channel_ref = quantize_fp8_per_row_ref
quantize_fp8_per_token_ref = quantize_fp8_per_row_ref


def quantize_fp8_per_token_group_ref(x, group_size: int = 128, eps: float = 1e-10,
                                     scale_ue8m0: bool = False):
    x = _f32(x)
    _check_finite(x, "quantize_fp8_per_token_group_ref")
    k = x.shape[-1]
    if k % group_size:
        raise ValueError(f"last dim {k} is not a multiple of group_size={group_size}")
    g = x.reshape(x.shape[:-1] + (k // group_size, group_size))
    s = _dynamic_scale(np.max(np.abs(g), axis=-1, keepdims=True), eps, scale_ue8m0)
    return encode_fp8_ref(g / s).reshape(x.shape), s[..., 0]


def quantize_fp8_block_ref(w, block_n: int = 128, block_k: int = 128, eps: float = 1e-10,
                           scale_ue8m0: bool = False):
    """2-D tiles of w [..., N, K]; edge tiles partial; scale [..., ceil(N/bn), ceil(K/bk)]."""
    w = _f32(w)
    _check_finite(w, "quantize_fp8_block_ref")
    n, k = w.shape[-2:]
    nb, kb = -(-n // block_n), -(-k // block_k)
    padded = np.zeros(w.shape[:-2] + (nb * block_n, kb * block_k), F32)
    padded[..., :n, :k] = np.abs(w)
    tiles = padded.reshape(w.shape[:-2] + (nb, block_n, kb, block_k))
    s = _dynamic_scale(tiles.max(axis=(-3, -1)), eps, scale_ue8m0)
    s_full = np.repeat(np.repeat(s, block_n, axis=-2), block_k, axis=-1)[..., :n, :k]
    return encode_fp8_ref(w / s_full), s


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


def dequantize_nvfp4_ref(q, block_scale, global_scale=1.0, out_dtype: str = "f32"):
    """x = (e2m1 · s_e4m3) / gs in fp32, rounded to out_dtype."""
    vals = decode_e2m1_ref(unpack_e2m1_ref(np.asarray(q).view(np.uint8)))
    s = decode_fp8_ref(np.asarray(block_scale).view(np.uint8))
    s_full = np.repeat(s, NVFP4_BLOCK, axis=-1)
    gs = _per_row_global(global_scale, vals)
    return round_to((vals * s_full) / gs, out_dtype)


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
# INT8 symmetric per row (sglang's w8a8 int8 reference).


def quantize_int8_per_row_ref(x, eps: float = 1e-10):
    """→ (int8 codes, scale f32 [..., 1]); q = rint(x · (127 / amax')), s = amax' / 127."""
    x = _f32(x)
    _check_finite(x, "quantize_int8_per_row_ref")
    amax = np.maximum(np.max(np.abs(x), axis=-1, keepdims=True), F32(eps)).astype(F32)
    q = np.clip(np.rint(x * (F32(127) / amax)), -127, 127).astype(np.int8)
    return q, (amax / F32(127)).astype(F32)


quantize_int8_per_channel_ref = quantize_int8_per_row_ref
quantize_int8_per_token_ref = quantize_int8_per_row_ref


def dequantize_int8_per_row_ref(q, scale, out_dtype: str = "f32"):
    x = np.asarray(q, dtype=np.int8).astype(F32) * np.asarray(scale, dtype=F32)
    return round_to(x, out_dtype)


__all__ = [
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
