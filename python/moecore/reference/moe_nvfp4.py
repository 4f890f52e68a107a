"""Golden numpy twins of the FlashInfer runner contracts (cpp/moecore/runner/backends/
flashinfer_cutlass.cpp and flashinfer_cutedsl.cpp) and of ModelOptNvFp4FusedMoEMethod's weight
processing (cpp/moecore/quant/modelopt_nvfp4.cpp). Must never import the compiled extension.

Arithmetic follows the contracts literally in float32: every GEMM is the canonical dot of
cpp/moecore/kernels/gemm.h (16 fp32 lanes, lane j sums a[k]·w[k] for k ≡ j mod 16 in increasing
k, then the lanes fold 8, 4, 2, 1), quantized operands enter as their exact values (e2m1 · e4m3
block scale, decoded e4m3 codes), alpha / dequant factors multiply the fp32 dot, and values are
rounded to the activation dtype at the contract's points. The NVFP4 and FP8 quantizers are the
formats twins in ``moecore.reference.quant``; layouts come from ``moecore.reference.layout``. The
only libm difference left is exp/erf (numpy vs the C library), which can flip a rare last bit.
"""

from __future__ import annotations

import math

import numpy as np

from ..dtypes import round_to
from .layout import (
    interleave_w13_halves_ref,
    nvfp4_scales_mma_view_ref,
    swizzle_nvfp4_scales_ref,
    unswizzle_nvfp4_scales_ref,
)
from .quant import (
    decode_fp8_ref,
    fp8_quantize_mul_rule_ref,
    nvfp4_code_values_ref,
    quantize_nvfp4_ref,
)

__all__ = [
    "canonical_dot_f32",
    "cutedsl_quant_scale_to_scalar_ref",
    "cutedsl_v1_masked_ref",
    "cutedsl_v2_moe_ref",
    "flashinfer_cutlass_moe_ref",
    "linear_scales_from_mma_ref",
    "nvfp4_quant_dequant_codes_ref",
    "nvfp4_values_ref",
    "process_modelopt_nvfp4_ref",
    "resolve_cutedsl_standard_scales_ref",
]

F32 = np.float32
NVFP4_BLOCK = 16
CUTEDSL_GROUP = 64
_ERF = np.vectorize(math.erf, otypes=[np.float64])


# ---------------------------------------------------------------------------------------------
# Building blocks.


def canonical_dot_f32(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """a [M, K] · w [N, K]ᵀ → [M, N] float32 in gemm.h's canonical order (bit-exact twin)."""
    a = np.asarray(a, dtype=F32)
    w = np.asarray(w, dtype=F32)
    m, k = a.shape
    n = w.shape[0]
    lanes = np.zeros((m, n, 16), dtype=F32)
    for k0 in range(0, k, 16):
        width = min(16, k - k0)
        lanes[:, :, :width] += a[:, None, k0 : k0 + width] * w[None, :, k0 : k0 + width]
    for width in (8, 4, 2, 1):
        lanes[:, :, :width] += lanes[:, :, width : 2 * width]
    return lanes[:, :, 0].copy()


nvfp4_values_ref = nvfp4_code_values_ref  # e2m1 · s8 (formats' nvfp4_code_values_row)


def nvfp4_quant_dequant_codes_ref(x: np.ndarray, global_scale: float) -> np.ndarray:
    """The activation quantizer of both contracts: rows → NVFP4 with `global_scale` → the exact
    code values e2m1 · s8 (the 1/gs factor lives in alpha)."""
    q, sf = quantize_nvfp4_ref(np.asarray(x, dtype=F32), F32(global_scale))
    return nvfp4_code_values_ref(q, sf)


def _fp8_multiply_quant(x: np.ndarray, multiplier) -> np.ndarray:
    """FlashInfer's FP8 input quantizer (formats' fp8_quantize_row_mul) → decoded values."""
    return decode_fp8_ref(fp8_quantize_mul_rule_ref(x, F32(multiplier)))


def linear_scales_from_mma_ref(mma: np.ndarray, rows: int, kb: int) -> np.ndarray:
    """MMA view (32, 4, m_tiles, 4, k_tiles, E) → linear [E, rows, kb] (inverse of
    nvfp4_scales_mma_view_ref composed with the swizzle)."""
    mma = np.asarray(mma)
    _j, _i, mt, _c, kt, e = mma.shape
    swizzled = np.ascontiguousarray(mma.transpose(5, 2, 4, 0, 1, 3)).reshape(e, mt * 128, kt * 4)
    return unswizzle_nvfp4_scales_ref(swizzled, rows, kb)


def _act_dtype_name(dtype) -> str:
    name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    return {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}.get(name, name)


def _activation(name: str, gated: bool, h1: np.ndarray, inter: int, act_dtype: str) -> np.ndarray:
    """cpp apply_activation on canonical [gate | up] rows: fp32 math, one rounding."""
    x = h1.astype(F32)
    g = x[:, :inter] if gated else x
    with np.errstate(over="ignore"):
        if name == "silu":
            act = g / (F32(1) + np.exp(-g))
        elif name == "gelu":
            act = F32(0.5) * g * (F32(1) + _ERF(g * F32(0.70710678118654752)).astype(F32))
        elif name == "relu2":
            r = np.maximum(g, F32(0))
            act = r * r
        else:
            raise ValueError(f"unsupported activation {name!r}")
    act = act.astype(F32)
    if gated:
        act = act * x[:, inter:]
    return round_to(act, act_dtype)


def _canonical_columns(order: str, inter: int, group: int = CUTEDSL_GROUP) -> np.ndarray:
    """Source column of each canonical [gate | up] column for a w13 row order."""
    c = np.arange(2 * inter)
    gate = c < inter
    i = np.where(gate, c, c - inter)
    if order == "gate_up":
        return c
    if order == "up_gate":
        return np.where(gate, inter + i, i)
    if order == "up_gate_interleaved":
        return (2 * (i // group) + gate.astype(np.int64)) * group + i % group
    raise ValueError(order)


def _run_moe(x_rows, local_ids, topk_weights, num_local, expert_fn, out_dtype, hidden):
    """Slots through their experts (act-dtype rows), then Σ_j w_j · y_j in fp32, slot order."""
    t, k = local_ids.shape
    acc = np.zeros((t, hidden), dtype=F32)
    slots = np.zeros((t, k, hidden), dtype=F32)
    for e in range(num_local):
        tt, jj = np.nonzero(local_ids == e)
        if tt.size == 0:
            continue
        slots[tt, jj] = expert_fn(e, x_rows[tt])
    w = np.asarray(topk_weights, dtype=F32)
    for j in range(k):
        valid = local_ids[:, j] >= 0
        acc = np.where(valid[:, None], acc + slots[:, j] * w[:, j : j + 1], acc).astype(F32)
    return round_to(acc, out_dtype)


def _localize(topk_ids, offset: int, num_local: int) -> np.ndarray:
    ids = np.asarray(topk_ids).astype(np.int64)
    inside = (ids >= offset) & (ids < offset + num_local)
    return np.where(inside, ids - offset, -1)


# ---------------------------------------------------------------------------------------------
# The two runner contracts.



def _nvfp4_expert_weights(w13, sf13, w2, sf2, linear_scales):
    """Dequantized NVFP4 expert weights (w13 [E, N1, H], w2 [E, H, I] as float32) from packed
    codes and their block scales; `linear_scales(sf, rows, cols)` turns the backend's scale
    layout (128×4 swizzle or MMA view) into linear [E, rows, cols]."""
    w13 = np.asarray(w13).view(np.uint8)
    w2 = np.asarray(w2).view(np.uint8)
    n1, h, inter = w13.shape[1], w13.shape[2] * 2, w2.shape[2] * 2
    w13v = nvfp4_values_ref(w13, linear_scales(np.asarray(sf13).view(np.uint8), n1, h // 16))
    w2v = nvfp4_values_ref(w2, linear_scales(np.asarray(sf2).view(np.uint8), h, inter // 16))
    return w13v, w2v

def flashinfer_cutlass_moe_ref(
    x,
    topk_ids,
    topk_weights,
    *,
    quant_type: str,
    w13,
    w2,
    quant_scales=None,
    activation: str = "silu",
    is_gated: bool = True,
    output_dtype=None,
    moe_ep_size: int = 1,
    moe_ep_rank: int = 0,
    routed_scaling_factor=None,
    apply_routed_scaling_factor=True,
    hidden_states_scale=None,
) -> np.ndarray:
    """The flashinfer_cutlass contract. w13 is [Up; Gate] when gated. Returns float32 values of
    the output dtype [T, H]. hidden_states_scale (fp4 only): x is packed u8 [T, H/2] and this is
    its 128×4-swizzled e4m3 scale [⌈T/128⌉·128, ⌈H/64⌉·4]."""
    e = np.asarray(w13).shape[0]
    x = np.asarray(x)
    if quant_type == "bf16":
        act_dtype = _act_dtype_name(output_dtype or x.dtype)
        w13v = np.asarray(w13).astype(F32)
        w2v = np.asarray(w2).astype(F32)
        rows = x.astype(F32)
        q1 = q2 = None
        scale1 = scale2 = None
    elif quant_type == "fp8":
        act_dtype = _act_dtype_name(output_dtype or x.dtype)
        fc1_dq, fc2_q, fc2_dq, in_dq = (np.asarray(s, dtype=F32) for s in quant_scales)
        w13v = decode_fp8_ref(np.asarray(w13).view(np.uint8))
        w2v = decode_fp8_ref(np.asarray(w2).view(np.uint8))
        rows = x.astype(F32)
        inv = F32(1) / F32(in_dq.reshape(-1)[0])
        q1 = lambda r: _fp8_multiply_quant(r, inv)
        q2 = lambda r: _fp8_multiply_quant(r, fc2_q.reshape(-1)[0])
        scale1, scale2 = fc1_dq.reshape(-1), fc2_dq.reshape(-1)
    elif quant_type == "fp4":
        act_dtype = _act_dtype_name(output_dtype or "bf16")
        a1, sf13, g1, a2, sf2, g2 = quant_scales
        w13v, w2v = _nvfp4_expert_weights(w13, sf13, w2, sf2, unswizzle_nvfp4_scales_ref)
        h, inter = w13v.shape[2], w2v.shape[2]
        if hidden_states_scale is not None:
            t = x.shape[0]
            xs = unswizzle_nvfp4_scales_ref(
                np.asarray(hidden_states_scale).view(np.uint8), t, h // 16
            )
            rows = nvfp4_values_ref(x.view(np.uint8), xs)
            q1 = None
        else:
            rows = x.astype(F32)
            a1v = F32(np.asarray(a1, dtype=F32).reshape(-1)[0])
            q1 = lambda r: nvfp4_quant_dequant_codes_ref(r, a1v)
        a2v = F32(np.asarray(a2, dtype=F32).reshape(-1)[0])
        q2 = lambda r: nvfp4_quant_dequant_codes_ref(r, a2v)
        scale1, scale2 = np.asarray(g1, F32).reshape(-1), np.asarray(g2, F32).reshape(-1)
    else:
        raise ValueError(f"quant_type must be 'bf16', 'fp8' or 'fp4', got {quant_type!r}")

    hidden = w2v.shape[1]
    inter = w2v.shape[2]
    order = "up_gate" if is_gated else "gate_up"
    cols = _canonical_columns(order, inter) if is_gated else None

    def expert(ei, a):
        a = q1(a) if q1 is not None else a
        h1 = canonical_dot_f32(a, w13v[ei])
        if scale1 is not None:
            h1 = (h1 * scale1[ei]).astype(F32)
        h1 = round_to(h1, act_dtype)
        if cols is not None:
            h1 = h1[:, cols]
        h2 = _activation(activation, is_gated, h1, inter, act_dtype)
        h2 = q2(h2) if q2 is not None else h2
        y = canonical_dot_f32(h2, w2v[ei])
        if scale2 is not None:
            y = (y * scale2[ei]).astype(F32)
        return round_to(y, act_dtype)

    local = _localize(topk_ids, moe_ep_rank * e, e)
    out = _run_moe(rows, local, topk_weights, e, expert, act_dtype, hidden)
    if quant_type != "fp4" and apply_routed_scaling_factor and routed_scaling_factor is not None:
        out = round_to(out * F32(routed_scaling_factor), act_dtype)
    return out


def cutedsl_v2_moe_ref(
    x,
    topk_ids,
    topk_weights,
    *,
    w13,
    w2,
    w13_weight_sf,
    w2_weight_sf,
    w1_alpha,
    w2_alpha,
    a1_scale,
    a2_scale,
    local_expert_offset: int = 0,
    hidden_states_scale=None,
) -> np.ndarray:
    """The flashinfer_cutedsl v2 contract: w13 [Up; Gate] 64-row interleaved, MMA-view scales,
    scalar a1/a2 global scales; bf16 output as float32 values [T, H]. hidden_states_scale: x is
    packed u8 [T, H/2] with linear e4m3 scales [T, H/16] (flashinfer dispatch)."""
    w13v, w2v = _nvfp4_expert_weights(w13, w13_weight_sf, w2, w2_weight_sf,
                                      linear_scales_from_mma_ref)
    e, h, inter = w13v.shape[0], w13v.shape[2], w13v.shape[1] // 2
    a1v = F32(np.asarray(a1_scale, F32).reshape(-1)[0])
    a2v = F32(np.asarray(a2_scale, F32).reshape(-1)[0])
    alpha1 = np.asarray(w1_alpha, F32).reshape(-1)
    alpha2 = np.asarray(w2_alpha, F32).reshape(-1)
    x = np.asarray(x)
    prequantized = hidden_states_scale is not None
    if prequantized:
        rows = nvfp4_values_ref(
            x.view(np.uint8), np.asarray(hidden_states_scale).view(np.uint8).reshape(x.shape[0], -1)
        )
    else:
        rows = x.astype(F32)
    cols = _canonical_columns("up_gate_interleaved", inter)

    def expert(ei, a):
        if not prequantized:
            a = nvfp4_quant_dequant_codes_ref(a, a1v)
        h1 = round_to((canonical_dot_f32(a, w13v[ei]) * alpha1[ei]).astype(F32), "bf16")[:, cols]
        h2 = nvfp4_quant_dequant_codes_ref(_activation("silu", True, h1, inter, "bf16"), a2v)
        return round_to((canonical_dot_f32(h2, w2v[ei]) * alpha2[ei]).astype(F32), "bf16")

    local = _localize(topk_ids, local_expert_offset, e)
    return _run_moe(rows, local, topk_weights, e, expert, "bf16", h)


def cutedsl_v1_masked_ref(
    x,
    masked_m,
    *,
    w13,
    w2,
    w13_weight_sf,
    w2_weight_sf,
    w1_alpha,
    w2_alpha,
    a1_scale,
    a2_scale,
    hidden_states_scale=None,
) -> np.ndarray:
    """The flashinfer_cutedsl v1 contract (flashinfer_cutedsl_moe_masked): w13 [Gate; Up] not
    interleaved, 128×4-swizzled block scales, per-expert alphas and a1/a2 global scales ([E] or
    one value). x: bf16 [E, M, H], or packed u8 [E, M, H/2] with linear e4m3
    hidden_states_scale [E, M, H/16] (NVFP4 dispatch). Only rows [0, masked_m[e]) are read.
    Returns the UNWEIGHTED bf16 output [E, M, H] as float32 values; other rows are zero."""
    w13v, w2v = _nvfp4_expert_weights(w13, w13_weight_sf, w2, w2_weight_sf,
                                      unswizzle_nvfp4_scales_ref)
    e, h, inter = w13v.shape[0], w13v.shape[2], w13v.shape[1] // 2

    def per_expert(v):
        v = np.asarray(v, F32).reshape(-1)
        return np.full(e, v[0], F32) if v.size == 1 else v

    a1, a2 = per_expert(a1_scale), per_expert(a2_scale)
    alpha1, alpha2 = per_expert(w1_alpha), per_expert(w2_alpha)
    x = np.asarray(x)
    out = np.zeros((e, x.shape[1], h), F32)
    for ei in range(e):
        m = int(masked_m[ei])
        if m == 0:
            continue
        if hidden_states_scale is not None:
            xs = np.asarray(hidden_states_scale).view(np.uint8)
            a = nvfp4_values_ref(x.view(np.uint8)[ei, :m], xs[ei, :m])
        else:
            a = nvfp4_quant_dequant_codes_ref(x[ei, :m].astype(F32), a1[ei])
        h1 = round_to((canonical_dot_f32(a, w13v[ei]) * alpha1[ei]).astype(F32), "bf16")
        h2 = nvfp4_quant_dequant_codes_ref(_activation("silu", True, h1, inter, "bf16"), a2[ei])
        out[ei, :m] = round_to((canonical_dot_f32(h2, w2v[ei]) * alpha2[ei]).astype(F32), "bf16")
    return out


# ---------------------------------------------------------------------------------------------
# Weight processing (ModelOptNvFp4FusedMoEMethod, spec §6.4) and the CuteDSL scale helpers.


def cutedsl_quant_scale_to_scalar_ref(quant_scale) -> np.ndarray:
    """sglang's cutedsl_quant_scale_to_scalar: float32 [1] — min (= 1/max raw); 1 value passes;
    empty → 1.0."""
    q = np.asarray(quant_scale, dtype=F32).reshape(-1)
    if q.size == 0:
        return np.ones(1, F32)
    return np.array([np.min(q)], F32)


def _python_shape(shape) -> str:
    shape = tuple(int(s) for s in shape)
    return str(shape)


def _align_scale_to_alpha(scale, alpha_size, name, num_local_experts, num_experts, moe_ep_rank):
    scale = np.asarray(scale, dtype=F32)
    if scale.ndim == 0:
        return np.full(alpha_size, scale, F32)
    if scale.ndim == 2 and scale.shape[1] <= 2:
        scale = scale[:, 0]
    if scale.size == alpha_size:
        return scale.reshape(-1)
    if scale.size == 1:
        return np.full(alpha_size, scale.reshape(-1)[0], F32)
    if (
        num_local_experts is not None
        and num_experts is not None
        and scale.size == num_experts
        and alpha_size == num_local_experts
    ):
        start = moe_ep_rank * num_local_experts
        return scale.reshape(-1)[start : start + num_local_experts]
    raise ValueError(
        f"Unable to align {name} shape={_python_shape(scale.shape)} to alpha "
        f"shape={_python_shape((alpha_size,))} for CuteDSL standard scale resolution."
    )


def resolve_cutedsl_standard_scales_ref(
    *,
    w13_input_scale_quant,
    w2_input_scale_quant,
    g1_alphas,
    g2_alphas,
    w13_weight_scale_2=None,
    w2_weight_scale_2=None,
    num_local_experts=None,
    num_experts=None,
    moe_ep_rank=0,
):
    """sglang's resolve_cutedsl_standard_scales → (w1_alpha, fc2_input_scale, w2_alpha,
    used_input_scale), in float32 with clamp(min=1e-12) on the scalars."""
    eps = F32(1e-12)
    n1, n2 = np.asarray(g1_alphas).size, np.asarray(g2_alphas).size
    fc2 = cutedsl_quant_scale_to_scalar_ref(w2_input_scale_quant)
    used = cutedsl_quant_scale_to_scalar_ref(w13_input_scale_quant)
    fc2c, usedc = np.maximum(fc2[0], eps), np.maximum(used[0], eps)
    args = (num_local_experts, num_experts, moe_ep_rank)
    if w2_weight_scale_2 is not None:
        w2_alpha = _align_scale_to_alpha(w2_weight_scale_2, n2, "w2_weight_scale_2", *args) / fc2c
    else:
        q = np.maximum(
            _align_scale_to_alpha(w2_input_scale_quant, n2, "w2_input_scale_quant", *args), eps
        )
        w2_alpha = (np.asarray(g2_alphas, F32).reshape(-1) * q) / fc2c
    if w13_weight_scale_2 is not None:
        w1_alpha = (
            _align_scale_to_alpha(w13_weight_scale_2, n1, "w13_weight_scale_2", *args) / usedc
        )
    else:
        q = np.maximum(
            _align_scale_to_alpha(w13_input_scale_quant, n1, "w13_input_scale_quant", *args), eps
        )
        w1_alpha = (np.asarray(g1_alphas, F32).reshape(-1) * q) / usedc
    return w1_alpha.astype(F32), fc2, w2_alpha.astype(F32), used


def process_modelopt_nvfp4_ref(
    params: dict, *, backend: str, is_gated: bool = True, ep_size: int = 1, ep_rank: int = 0
) -> dict:
    """ModelOptNvFp4FusedMoEMethod.process_weights_after_loading on loaded parameters (the
    create_weights names) for backend "flashinfer_cutlass" or "flashinfer_cutedsl" (v2). Returns
    the processed tensors by sglang's names (plus, for v2, w1_alpha / w2_alpha /
    fc2_input_scale / used_input_scale of resolve_cutedsl_standard_scales)."""
    w13 = np.asarray(params["w13_weight"]).view(np.uint8)
    w2 = np.asarray(params["w2_weight"]).view(np.uint8)
    s13 = np.asarray(params["w13_weight_scale"]).view(np.uint8)
    s2 = np.asarray(params["w2_weight_scale"]).view(np.uint8)
    ws2_13 = np.asarray(params["w13_weight_scale_2"], F32)
    ws2_2 = np.asarray(params["w2_weight_scale_2"], F32)
    in13 = np.asarray(params["w13_input_scale"], F32)
    in2 = np.asarray(params["w2_input_scale"], F32)
    e = w13.shape[0]
    gate_ws2 = ws2_13[:, 0] if (is_gated and ws2_13.ndim == 2) else ws2_13.reshape(e)
    out = {}
    if backend == "flashinfer_cutedsl":
        i13 = np.full(e, np.max(in13), F32)
        i2 = in2[ep_rank * e : (ep_rank + 1) * e]
    else:
        i13 = np.array([np.max(in13)], F32)
        i2 = np.array([np.max(in2)], F32)
    out["g1_alphas"] = (i13 * gate_ws2).astype(F32)
    out["g2_alphas"] = (i2 * ws2_2).astype(F32)
    out["w13_input_scale_quant"] = (F32(1) / i13).astype(F32)
    out["w2_input_scale_quant"] = (F32(1) / i2).astype(F32)
    if backend == "flashinfer_cutedsl" and is_gated:
        w13 = interleave_w13_halves_ref(w13, CUTEDSL_GROUP, 1)
        s13 = interleave_w13_halves_ref(s13, CUTEDSL_GROUP, 1)
    sw13 = swizzle_nvfp4_scales_ref(s13)
    pad = sw13.shape[1] - w13.shape[1]
    if pad:
        if is_gated:
            raise AssertionError(
                "The intermediate size required padding, but padding is also "
                "implemented for gated activations"
            )
        w13 = np.pad(w13, ((0, 0), (0, pad), (0, 0)))
        w2 = np.pad(w2, ((0, 0), (0, 0), (0, pad // 2)))
        s2 = np.pad(s2, ((0, 0), (0, 0), (0, pad // 16)))
    sw2 = swizzle_nvfp4_scales_ref(s2)
    out.update(
        w13_weight=w13,
        w2_weight=w2,
        w13_weight_scale=s13,
        w2_weight_scale=s2,
        w13_blockscale_swizzled=sw13,
        w2_blockscale_swizzled=sw2,
    )
    if backend == "flashinfer_cutedsl":
        out["w13_blockscale_mma"] = nvfp4_scales_mma_view_ref(sw13)
        out["w2_blockscale_mma"] = nvfp4_scales_mma_view_ref(sw2)
        w1a, fc2, w2a, used = resolve_cutedsl_standard_scales_ref(
            w13_input_scale_quant=out["w13_input_scale_quant"],
            w2_input_scale_quant=out["w2_input_scale_quant"],
            g1_alphas=out["g1_alphas"],
            g2_alphas=out["g2_alphas"],
            w13_weight_scale_2=ws2_13,
            w2_weight_scale_2=ws2_2,
            num_local_experts=e,
            num_experts=in2.shape[0],
            moe_ep_rank=ep_rank,
        )
        out.update(w1_alpha=w1a, fc2_input_scale=fc2, w2_alpha=w2a, used_input_scale=used)
    return out
