"""Golden MXFP4 MoE (spec §6.5, §6.8 "FlashInfer MXFP4", §7.3, §7.6) in plain numpy, the twin of
cpp/moecore/runner/backends/flashinfer_mxfp4.cpp and cpp/moecore/quant/mxfp4.cpp.

* ``gpt_oss_sm90_layout_ref`` / ``dsv4_sm90_layout_ref``: the SM90 cutlass weight processing of
  sglang's ``Mxfp4MoEMethod._process_weights_for_sm90_cutlass`` and
  ``Mxfp4FlashinferCutlassMoEMethod.process_weights_after_loading``, done "by hand" (slicing,
  zero buffers, concatenation) — the manual construction sglang's tests compare against.
* ``flashinfer_mxfp4_moe_ref``: the backend's numeric contract on the *logical* (not
  byte-interleaved) weights: bf16 activations, exactly dequantized MXFP4 weights, float64 dot
  products and sums, rounding (via float32) to bf16 at the contract's points: GEMM1 + b13, the
  SwiGLU, GEMM2, and the finalize Σ_j w_j·(y_j + b2). It differs from the kernel only by the
  kernel's float32 accumulation order (and the rare bf16 rounding flip that causes).

Never imports the compiled extension or torch.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import round_to
from .layout import (
    interleave_moe_scales_for_sm90_mixed_gemm_ref,
    interleave_moe_weights_for_sm90_mixed_gemm_ref,
)
from .quant import dequantize_mxfp4_ref, scales_to_e8m0_ref

__all__ = [
    "GPT_OSS_SWIGLU",
    "dsv4_sm90_layout_ref",
    "flashinfer_mxfp4_moe_ref",
    "gpt_oss_sm90_layout_ref",
    "round_up",
]

MXFP4_BLOCK = 32
SM90_ALIGN = 128
GPT_OSS_SWIGLU = (1.702, 1.0, 7.0)  # alpha, beta, limit


def round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _bf16(v) -> np.ndarray:
    """float64 (or float32) values → bf16 precision, as float64 (rounded via float32)."""
    return round_to(np.asarray(v, dtype=np.float64).astype(np.float32), "bf16").astype(np.float64)


def _f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float32).astype(np.float64)


def _sm90(weight, scale, interleave: bool):
    if not interleave:
        return weight, scale
    return (interleave_moe_weights_for_sm90_mixed_gemm_ref(weight),
            interleave_moe_scales_for_sm90_mixed_gemm_ref(scale, MXFP4_BLOCK))


def gpt_oss_sm90_layout_ref(w13, w13_scale, w13_bias, w2, w2_scale, w2_bias, *, hidden: int,
                            inter: int, interleave: bool = True) -> dict:
    """GPT-OSS buffers as loaded (rows [g0, u0, g1, u1, …]): w13 u8 [E, 2·Ip, H/2], w13_scale u8
    [E, 2·Ip, H/32], w13_bias bf16 [E, 2·Ip], w2 u8 [E, H, Ip/2], w2_scale u8 [E, H, Ip/32],
    w2_bias bf16 [E, H] (Ip ≥ inter, the extra rows zero) → the processed tensors: halved
    [up ; gate] with each half zero-padded to Np = round_up(inter, 128) rows and K to
    Kp = round_up(hidden, 128); w2 [E, Kp, Np/2]; then (interleave=True) FlashInfer's SM90 byte
    interleave and scale fold. Keys: w13_weight, w13_weight_scale, w13_weight_bias, w2_weight,
    w2_weight_scale, w2_weight_bias, swiglu_alpha, swiglu_beta, swiglu_limit."""
    w13, w13_scale, w2, w2_scale = (np.asarray(a).view(np.uint8)
                                    for a in (w13, w13_scale, w2, w2_scale))
    num_experts, rows, _ = w13.shape
    n_un = rows // 2
    np_, kp = round_up(inter, SM90_ALIGN), round_up(hidden, SM90_ALIGN)

    def up_gate(t, last_un, last_pad):
        out = np.zeros((num_experts, 2 * np_) + ((last_pad,) if t.ndim == 3 else ()), t.dtype)
        gate, up = t[:, 0::2], t[:, 1::2]
        out[:, :n_un, ..., :last_un] = up
        out[:, np_:np_ + n_un, ..., :last_un] = gate
        return out

    def pad_w2(t, last_pad):
        out = np.zeros((num_experts, kp) + ((last_pad,) if t.ndim == 3 else ()), t.dtype)
        if t.ndim == 3:
            out[:, :hidden, :t.shape[2]] = t
        else:
            out[:, :hidden] = t
        return out

    b13 = np.asarray(w13_bias)
    w13p = up_gate(w13, hidden // 2, kp // 2)
    w13sp = up_gate(w13_scale, hidden // MXFP4_BLOCK, kp // MXFP4_BLOCK)
    b13p = np.zeros((num_experts, 2 * np_), b13.dtype)
    b13p[:, :n_un] = b13[:, 1::2]
    b13p[:, np_:np_ + n_un] = b13[:, 0::2]
    w2p = pad_w2(w2, np_ // 2)
    w2sp = pad_w2(w2_scale, np_ // MXFP4_BLOCK)
    b2p = pad_w2(np.asarray(w2_bias), None)
    w13o, w13so = _sm90(w13p, w13sp, interleave)
    w2o, w2so = _sm90(w2p, w2sp, interleave)
    alpha, beta, limit = GPT_OSS_SWIGLU
    return {
        "w13_weight": w13o, "w13_weight_scale": w13so, "w13_weight_bias": b13p,
        "w2_weight": w2o, "w2_weight_scale": w2so, "w2_weight_bias": b2p,
        "swiglu_alpha": np.full(num_experts, alpha, np.float32),
        "swiglu_beta": np.full(num_experts, beta, np.float32),
        "swiglu_limit": np.full(num_experts, limit, np.float32),
    }


def dsv4_sm90_layout_ref(w13, w13_scale, w2, w2_scale, *, interleave: bool = True) -> dict:
    """DSv4 FP4-expert buffers: w13 int8/uint8 [E, 2I, H/2] as [w1; w3], f32 power-of-two scales
    [E, 2I, H/32]; w2 [E, H, I/2], scales [E, H, I/32] → [w3; w1] (= [up; gate]) bytes and E8M0
    scale bytes, then (interleave=True) the SM90 interleave and fold. Keys: w13_weight,
    w13_weight_scale_inv, w2_weight, w2_weight_scale_inv."""
    w13 = np.asarray(w13).view(np.uint8)
    half = w13.shape[1] // 2
    w31 = np.concatenate([w13[:, half:], w13[:, :half]], axis=1)
    s13 = scales_to_e8m0_ref(w13_scale)
    s31 = np.concatenate([s13[:, half:], s13[:, :half]], axis=1)
    w13o, s13o = _sm90(w31, s31, interleave)
    w2o, s2o = _sm90(np.asarray(w2).view(np.uint8), scales_to_e8m0_ref(w2_scale), interleave)
    return {"w13_weight": w13o, "w13_weight_scale_inv": s13o, "w2_weight": w2o,
            "w2_weight_scale_inv": s2o}


def flashinfer_mxfp4_moe_ref(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, *,
                             w13_bias=None, w2_bias=None, swiglu_alpha=None, swiglu_beta=None,
                             swiglu_limit=None, padded_hidden=None, ep_size: int = 1,
                             ep_rank: int = 0) -> np.ndarray:
    """The flashinfer_mxfp4 fused func on logical weights.

    x bf16 (or any float array holding bf16 values) [T, H]; topk_ids int [T, k] (global ids,
    −1 = none; ids outside this EP rank's [ep_rank·E, (ep_rank+1)·E) contribute nothing);
    topk_weights f32 [T, k]; w13 packed u8 [E, 2N, K/2] halved [up ; gate] with linear E8M0
    scales [E, 2N, K/32]; w2 [E, K, N/2] with scales [E, K, N/32]; biases bf16 [E, 2N] / [E, K];
    swiglu_* f32 [E] (all or none). x is zero-padded to K when padded_hidden is set (and must
    then equal K), the output trimmed back to H.

    Contract: h1 = r(x·W13ᵀ + b13); up = h1[:, :N], gate = h1[:, N:];
    with swiglu: g = min(gate, L), u = clip(up, −L, L), h2 = r(g·σ(α·g)·(u + β));
    without: h2 = r(silu(gate)·up); y = r(h2·W2ᵀ); out = r(Σ_j w_j·(y_j + b2)).
    r = round to bf16 via float32. Returns float32 [T, H] (bf16 values).
    """
    x = _f64(x)
    ids = np.asarray(topk_ids).astype(np.int64)
    wts = np.asarray(topk_weights, dtype=np.float32).astype(np.float64)
    given = sum(t is not None for t in (swiglu_alpha, swiglu_beta, swiglu_limit))
    if given not in (0, 3):
        raise ValueError("flashinfer_mxfp4_moe_ref: swiglu_alpha/beta/limit go together")
    w13d = dequantize_mxfp4_ref(w13, w13_scale).astype(np.float64)
    w2d = dequantize_mxfp4_ref(w2, w2_scale).astype(np.float64)
    num_experts, two_n, k = w13d.shape
    n = two_n // 2
    tokens, hidden = x.shape
    if padded_hidden is not None and padded_hidden != hidden:
        x = np.concatenate([x, np.zeros((tokens, padded_hidden - hidden))], axis=1)
    if x.shape[1] != k:
        raise ValueError(f"flashinfer_mxfp4_moe_ref: x width {x.shape[1]} != K = {k}")
    b13 = None if w13_bias is None else _f64(w13_bias)
    b2 = None if w2_bias is None else _f64(w2_bias)
    ys = np.zeros((tokens, ids.shape[1], k), dtype=np.float64)  # w_j·(y_j + b2) per slot
    local = ids - ep_rank * num_experts
    for e in range(num_experts):
        tok, slot = np.nonzero(local == e)
        if tok.size == 0:
            continue
        h1 = x[tok] @ w13d[e].T
        if b13 is not None:
            h1 = h1 + b13[e]
        h1 = _bf16(h1)
        up, gate = h1[:, :n], h1[:, n:]
        if given == 3:
            alpha, beta, limit = (float(np.float32(np.asarray(t)[e]))
                                  for t in (swiglu_alpha, swiglu_beta, swiglu_limit))
            g = np.minimum(gate, limit)
            u = np.clip(up, -limit, limit)
            h2 = _bf16(g / (1.0 + np.exp(-alpha * g)) * (u + beta))
        else:
            h2 = _bf16(gate / (1.0 + np.exp(-gate)) * up)
        y = _bf16(h2 @ w2d[e].T)
        if b2 is not None:
            y = y + b2[e]
        ys[tok, slot] = wts[tok, slot][:, None] * y
    out = np.zeros((tokens, k), dtype=np.float64)
    for j in range(ids.shape[1]):  # slot order
        out = out + ys[:, j]
    return _bf16(out)[:, :hidden].astype(np.float32)
