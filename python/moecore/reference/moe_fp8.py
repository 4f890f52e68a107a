"""Golden numpy twins of moecore's 8-bit MoE contracts (FP8 E4M3 and INT8).

The activation-rule dispatch of cpp/moecore/runner/quant_compute.cpp (the rules themselves are
``moecore.reference.quant``'s, one function per sglang kernel, as in formats/quantize.h), the quantized
contract of cpp/moecore/runner/backends/triton.cpp, cpp/moecore/runner/backends/deep_gemm.cpp
(preprocess, the expert compute on the masked and contiguous layouts, post_reorder) and the
weight processing of cpp/moecore/quant/{fp8,modelopt_fp8}.cpp. Must never import the compiled
extension or torch.

Bit-exact parts repeat the kernels' float32 operation order with float32 numpy arithmetic (IEEE,
round to nearest even): every activation quantizer, the weight requantizers, the DeepGEMM
preprocess and post_reorder. The GEMMs are evaluated in float64 from the exact codes and scales
(Σ_b (dot_b · sa) · sw), rounded to the activation dtype where the backend stores a value, so
they differ from the kernels' fp32 accumulation only by accumulation error and the rare rounding
flip it causes (compare them with the tolerance table, not bitwise).

Codes are uint8 arrays (E4M3) or int8 arrays (INT8); scales float32.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import round_to
from .moe import _gated_activation, _Rounder, _sum_slots, activation_ref
from .quant import (
    amax_ref,
    as_f32,
    decode_fp8_ref,
    fp8_block_scale_ref,
    fp8_dynamic_scale_ref,
    fp8_group_rule_ref,
    fp8_per_token_rule_ref,
    fp8_quantize_mul_rule_ref,
    fp8_static_rule_ref,
    int8_per_token_rule_ref,
)

__all__ = [
    "ACT_QUANT_RULES",
    "quantize_activation_ref",
    "fp8_quant_scaled_ref",
    "requantize_w13_to_max_scale_ref",
    "quantize_weight_per_expert_ref",
    "quantize_weight_per_channel_ref",
    "requantize_block_ue8m0_ref",
    "expand_per_tensor_to_blocks_ref",
    "fused_moe_w8a8_ref",
    "triton_act_rules",
    "deep_gemm_preprocess_ref",
    "deep_gemm_post_reorder_ref",
    "deep_gemm_moe_ref",
    "deep_gemm_masked_core_ref",
    "deep_gemm_contiguous_core_ref",
    "contiguous_segments_ref",
    "modelopt_cutlass_scales_ref",
    "pad_intermediate_ref",
]

F32 = np.float32
EPS = F32(1e-10)
DEEP_GEMM_BLOCK = 128

ACT_QUANT_RULES = ("fp8_static", "fp8_per_tensor", "fp8_per_token", "fp8_per_token_group",
                   "fp8_silu_post_group", "int8_per_token")


# ---------------------------------------------------------------------------------------------
# Activation quantizers (quant_compute.h), float32 in sglang's operation order.


_rows_f32 = as_f32
fp8_quant_scaled_ref = fp8_static_rule_ref  # the static per-tensor rule, under its old name


def quantize_activation_ref(x, rule: str, scale=None, group_size: int = 128,
                            scale_ue8m0: bool = False):
    """The twin of fp8_int8_ops.quantize_activation: x [rows, K] → (codes, scales).

    fp8_static: q = e4m3(clamp(x·(1/scale))), scale [1]. fp8_per_tensor: scale = amax(x)/448 over
    all of x, then as static. fp8_per_token: s = amax_row/448, inv = s ? 1/s : 0, q =
    e4m3(clamp(x·inv)), scale [rows, 1]. fp8_per_token_group / fp8_silu_post_group: per group of
    group_size, a = max(amax, 1e-10), s = a/448 (UE8M0: 2^ceil(log2 max(s, 1e-10)) resp.
    2^ceil(log2 s)), q = e4m3(clamp(x / s)), scale [rows, K/group]. int8_per_token: a =
    max(amax, 1e-10), s = a/127, q = round_half_away(x · (127/a)), scale [rows, 1].
    """
    x = _rows_f32(x)
    if x.ndim != 2:
        raise ValueError("quantize_activation_ref: expected x [rows, K]")
    if rule == "fp8_static":
        return fp8_static_rule_ref(x, scale), np.array([scale], F32)
    if rule == "fp8_per_tensor":
        s = F32(fp8_dynamic_scale_ref(amax_ref(x), 0.0))
        return fp8_static_rule_ref(x, s), np.array([s], F32)
    if rule == "fp8_per_token":
        return fp8_per_token_rule_ref(x, 0.0)
    if rule in ("fp8_per_token_group", "fp8_silu_post_group"):
        if x.shape[1] % group_size:
            raise ValueError(f"quantize_activation_ref: K={x.shape[1]} % {group_size} != 0")
        group_rule = "sglang_cuda" if rule == "fp8_per_token_group" else "deep_gemm_silu_post"
        return fp8_group_rule_ref(x, group_size, EPS, scale_ue8m0, group_rule)
    if rule == "int8_per_token":
        return int8_per_token_rule_ref(x, EPS)
    raise ValueError(f"quantize_activation_ref: unknown rule {rule!r}")


# ---------------------------------------------------------------------------------------------
# FP8 weight processing (quant/fp8.cpp).


def _codes(w) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(w)).view(np.uint8)


def requantize_w13_to_max_scale_ref(w13, scales, inter: int, shard_cols=(0, 1)):
    """sglang's per-expert requant of w13 (Fp8MoEMethod / ModelOptFp8MoEMethod): shard s (rows
    [s·I, (s+1)·I)) → dq = fp16(q · scales[e, shard_cols[s]]), q' = e4m3(clamp(dq · (1/max_e))).
    Returns (codes uint8, max_e float32 [E])."""
    q = _codes(w13).copy()
    s = np.asarray(scales, F32)
    smax = s.max(axis=1).astype(F32)
    for e in range(q.shape[0]):
        for shard, col in enumerate(shard_cols):
            rows = slice(shard * inter, (shard + 1) * inter)
            dq = (decode_fp8_ref(q[e, rows]) * s[e, col]).astype(F32).astype(np.float16)
            q[e, rows] = fp8_static_rule_ref(dq.astype(F32), smax[e])
    return q, smax


def quantize_weight_per_expert_ref(w):
    """scaled_fp8_quant per expert: s = amax/448 (no eps), q = e4m3(clamp(x · (1/s)))."""
    x = _rows_f32(w)
    out = np.empty(x.shape, np.uint8)
    scales = np.empty(x.shape[0], F32)
    for e in range(x.shape[0]):
        scales[e] = F32(fp8_dynamic_scale_ref(amax_ref(x[e]), 0.0))
        out[e] = fp8_static_rule_ref(x[e], scales[e])
    return out, scales


def quantize_weight_per_channel_ref(w):
    """Per output row with the per-token rule: scales [E, N, 1]."""
    x = _rows_f32(w)
    e, n, k = x.shape
    q, s = fp8_per_token_rule_ref(x.reshape(e * n, k), 0.0)
    return q.reshape(e, n, k), s.reshape(e, n, 1)


def requantize_block_ue8m0_ref(w, scale):
    """DeepGEMM UE8M0 requant of 128×128 blocks: x = bf16(q · s); per tile amax clamped at 1e-4;
    s' = 2^ceil(log2(amax/448)); q' = e4m3(x · (1/s')). Returns (codes, scales)."""
    q = _codes(w)
    s = np.asarray(scale, F32)
    e, n, k = q.shape
    b = DEEP_GEMM_BLOCK
    s_full = np.repeat(np.repeat(s, b, axis=1), b, axis=2)[:, :n, :k]
    x = round_to((decode_fp8_ref(q) * s_full).astype(F32), "bf16")
    nb, kb = -(-n // b), -(-k // b)
    pad = np.zeros((e, nb * b, kb * b), F32)
    pad[:, :n, :k] = np.abs(x)
    amax = pad.reshape(e, nb, b, kb, b).max(axis=(2, 4)).astype(F32)
    sf = fp8_block_scale_ref(amax, 1e-4, True)
    sf_full = np.repeat(np.repeat(sf, b, axis=1), b, axis=2)[:, :n, :k]
    return fp8_quantize_mul_rule_ref(x, F32(1.0) / sf_full), sf


def expand_per_tensor_to_blocks_ref(scale, n: int, k: int):
    s = np.asarray(scale, F32)
    return np.broadcast_to(s[:, None, None], (s.shape[0], -(-n // 128), -(-k // 128))).copy()


# ---------------------------------------------------------------------------------------------
# The triton backend's quantized contract.


def triton_act_rules(quant: str, *, per_channel_quant=False, block_shape=None,
                     a13_scale=None, a2_scale=None):
    """The activation rules (GEMM1 input, GEMM2 input) the triton backend applies."""
    if quant == "int8_w8a16":
        return None, None
    if quant == "int8_w8a8":
        return "int8_per_token", "int8_per_token"
    if block_shape is not None:
        return "fp8_per_token_group", "fp8_per_token_group"
    dynamic = "fp8_per_token" if per_channel_quant else "fp8_per_tensor"
    return ("fp8_static" if a13_scale is not None else dynamic,
            "fp8_static" if a2_scale is not None else dynamic)


def _weight_scales(quant, scale, n, k, block_shape, per_channel_quant):
    """Weight scales of one expert as [N, nb] per (row, K block), nb = 1 when not blocked."""
    s = np.asarray(scale, F32)
    if quant == "fp8_w8a8" and block_shape is not None:
        return np.repeat(s, block_shape[0], axis=0)[:n]
    if quant == "fp8_w8a8" and not per_channel_quant:
        return np.full((n, 1), s, F32)
    return s.reshape(n, 1)


def _scaled_gemm(a_codes, a_scales, w_codes, w_scales, block_k):
    """Σ_b (dot_b(a, w) · sa[:, b]) · sw[:, b] in float64; a [m, K], w [N, K], a_scales [m, nb]
    or [m, 1] (None: ones), w_scales [N, nb] or [N, 1]; block_k None: one block."""
    a = np.asarray(a_codes, np.float64)
    w = np.asarray(w_codes, np.float64)
    k = a.shape[1]
    bk = k if block_k is None else block_k
    sa_all = None if a_scales is None else np.asarray(a_scales, np.float64)
    sw_all = np.asarray(w_scales, np.float64)
    out = np.zeros((a.shape[0], w.shape[0]), np.float64)
    for b, k0 in enumerate(range(0, k, bk)):
        part = a[:, k0:k0 + bk] @ w[:, k0:k0 + bk].T
        if sa_all is not None:
            part = part * sa_all[:, min(b, sa_all.shape[1] - 1)][:, None]
        out = out + part * sw_all[:, min(b, sw_all.shape[1] - 1)][None, :]
    return out


def _decode_weights(quant, w):
    if quant == "fp8_w8a8":
        return decode_fp8_ref(_codes(w)).astype(np.float64)
    return np.asarray(w, np.int8).astype(np.float64)


def _quantize_rows(rule, rows, scale, group):
    """(decoded codes float64, scales [m, nb]) of one GEMM input; rule None: unquantized."""
    if rule is None:
        return np.asarray(rows, np.float64), None
    q, s = quantize_activation_ref(rows, rule, scale=scale, group_size=group)
    codes = q.astype(np.float64) if rule == "int8_per_token" else decode_fp8_ref(q).astype(np.float64)
    s = np.asarray(s, F32)
    if s.size == 1 and rule == "fp8_static":
        s = np.full((rows.shape[0], 1), s.reshape(-1)[0], F32)
    return codes, s


def fused_moe_w8a8_ref(x, w13, w2, topk_weights, topk_ids, *, quant: str, w13_scale, w2_scale,
                       a13_scale=None, a2_scale=None, per_channel_quant: bool = False,
                       block_shape=None, b13=None, b2=None, activation: str = "silu",
                       is_gated: bool = True, gemm1_alpha=None, gemm1_clamp_limit=None,
                       gemm1_beta=None, swiglu_limit=None,
                       apply_router_weight_on_input: bool = False,
                       routed_scaling_factor=None, no_combine: bool = False, act_dtype=None):
    """The triton backend's quantized contract (triton.cpp). quant: "fp8_w8a8", "int8_w8a8" or
    "int8_w8a16"; weights as e4m3 (ml_dtypes or uint8 codes) / int8 arrays with the scales of
    TritonMoeQuantInfo; a13_scale / a2_scale: static per-tensor scales (floats) or None.

    GEMM input A → codes and scales by triton_act_rules (dynamic per-tensor: amax over all of x for
    GEMM1, over every (token, slot) activation row for GEMM2); h1 = r(Σ_b (dot_b·sa)·sw + b13
    [× w]); h2 = r(act(h1)); y = r(Σ_b … + b2 [× w]); out = r(rsf · Σ_j y_j) (no_combine: y).
    r = round to act_dtype (x's dtype by default). Returns float32 values.
    """
    xs = _rows_f32(x)
    if act_dtype is None:
        name = np.asarray(x).dtype.name
        act_dtype = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[name]
    rnd = _Rounder("triton", act_dtype)
    ids = np.asarray(topk_ids).astype(np.int64)
    wts = np.asarray(topk_weights, F32).astype(np.float64)
    n1, hidden = np.asarray(w13).shape[1:]
    inter = np.asarray(w2).shape[2]
    num_experts = np.asarray(w13).shape[0]
    t, k = ids.shape
    q1, q2 = triton_act_rules(quant, per_channel_quant=per_channel_quant, block_shape=block_shape,
                              a13_scale=a13_scale, a2_scale=a2_scale)
    group = None if block_shape is None else block_shape[1]
    bk = group
    s1 = a13_scale
    if q1 == "fp8_per_tensor":
        s1 = F32(fp8_dynamic_scale_ref(amax_ref(xs), 0.0))
        q1 = "fp8_static"
    a_codes, a_scales = _quantize_rows(q1, xs, s1, group)
    w13c, w2c = _decode_weights(quant, w13), _decode_weights(quant, w2)
    rsf = 1.0 if routed_scaling_factor is None else float(F32(routed_scaling_factor))
    h2 = np.zeros((t, k, inter), np.float64)
    for e in range(num_experts):
        tok, slot = np.nonzero(ids == e)
        if tok.size == 0:
            continue
        sw = _weight_scales(quant, np.asarray(w13_scale)[e], n1, hidden, block_shape,
                            per_channel_quant)
        h1 = _scaled_gemm(a_codes[tok], None if a_scales is None else a_scales[tok], w13c[e], sw, bk)
        if b13 is not None:
            h1 = h1 + _rows_f32(b13)[e].astype(np.float64)
        if apply_router_weight_on_input:
            h1 = h1 * wts[tok, slot][:, None]
        h1 = rnd(h1)
        if is_gated:
            act = _gated_activation(h1, inter, activation=activation, gemm1_alpha=gemm1_alpha,
                                    gemm1_clamp_limit=gemm1_clamp_limit, gemm1_beta=gemm1_beta,
                                    swiglu_limit=swiglu_limit, round_before_mul=False, rnd=rnd)
        else:
            act = rnd(activation_ref(activation, h1))
        h2[tok, slot] = act
    s2 = a2_scale
    if q2 == "fp8_per_tensor":
        valid = ids >= 0
        s2 = F32(fp8_dynamic_scale_ref(amax_ref(h2[valid]), 0.0)) if valid.any() else F32(0)
        q2 = "fp8_static"
    y = np.zeros((t, k, hidden), np.float64)
    for e in range(num_experts):
        tok, slot = np.nonzero(ids == e)
        if tok.size == 0:
            continue
        c2, s2r = _quantize_rows(q2, h2[tok, slot].astype(F32), s2, group)
        sw = _weight_scales(quant, np.asarray(w2_scale)[e], hidden, inter, block_shape,
                            per_channel_quant)
        out = _scaled_gemm(c2, s2r, w2c[e], sw, bk)
        if b2 is not None:
            out = out + _rows_f32(b2)[e].astype(np.float64)
        if not apply_router_weight_on_input:
            out = out * wts[tok, slot][:, None]
        y[tok, slot] = rnd(out)
    if no_combine:
        return y.astype(F32)
    return rnd(rsf * _sum_slots(y)).astype(F32)


# ---------------------------------------------------------------------------------------------
# The deep_gemm backend.


def deep_gemm_preprocess_ref(topk_ids, num_local_experts: int, hidden_states, use_fp8=True,
                             scale_ue8m0=False):
    """moe_ep_deepgemm_preprocess: stable sort by expert, masked_m, m_max = (T // 256 + 1)·256,
    expected_m = ⌈T·k/E⌉, src2dst = e·m_max + rank (−1 for ids −1), rows gathered into
    [E, m_max, H] (e4m3 codes + f32 scales [E, m_max, H/128] per-token-group, or bf16 values)."""
    ids = np.asarray(topk_ids).astype(np.int64)
    x = _rows_f32(hidden_states)
    t, k = ids.shape
    h = x.shape[1]
    e_loc = num_local_experts
    m_max = (t // 256 + 1) * 256
    masked = np.zeros(e_loc, np.int32)
    src2dst = np.full(t * k, -1, np.int32)
    for s, e in enumerate(ids.reshape(-1)):
        if e >= 0:
            src2dst[s] = e * m_max + masked[e]
            masked[e] += 1
    out = {"masked_m": masked, "expected_m": 0 if t * k == 0 else (t * k - 1) // e_loc + 1,
           "src2dst": src2dst, "m_max": m_max}
    if use_fp8:
        q, s = quantize_activation_ref(x, "fp8_per_token_group", group_size=DEEP_GEMM_BLOCK,
                                       scale_ue8m0=scale_ue8m0)
        hs = np.zeros((e_loc * m_max, h), np.uint8)
        hsc = np.zeros((e_loc * m_max, h // DEEP_GEMM_BLOCK), F32)
        for src, dst in enumerate(src2dst):
            if dst >= 0:
                hs[dst] = q[src // k]
                hsc[dst] = s[src // k]
        out["hidden_states"] = hs.reshape(e_loc, m_max, h)
        out["hidden_states_scale"] = hsc.reshape(e_loc, m_max, -1)
    else:
        hs = np.zeros((e_loc * m_max, h), F32)
        for src, dst in enumerate(src2dst):
            if dst >= 0:
                hs[dst] = x[src // k]
        out["hidden_states"] = hs.reshape(e_loc, m_max, h)
        out["hidden_states_scale"] = None
    return out


def deep_gemm_post_reorder_ref(down_output, src2dst, topk_ids, topk_weights,
                               routed_scaling_factor=None):
    """post_reorder_triton_kernel (bf16 accumulation: every product and add rounded to bf16) then
    × routed_scaling_factor (one more bf16 rounding). Returns bf16 values as float32 [T, H]."""
    d = _rows_f32(np.asarray(down_output).reshape(-1, np.asarray(down_output).shape[-1]))
    ids = np.asarray(topk_ids).astype(np.int64)
    w = round_to(np.asarray(topk_weights, F32), "bf16")
    dst = np.asarray(src2dst).reshape(ids.shape)
    t, k = ids.shape
    acc = np.zeros((t, d.shape[1]), F32)
    for j in range(k):
        valid = ids[:, j] >= 0
        rows = np.where(valid, dst[:, j], 0)
        p = round_to((d[rows] * w[:, j][:, None]).astype(F32), "bf16")
        acc = np.where(valid[:, None], round_to((acc + p).astype(F32), "bf16"), acc)
    if routed_scaling_factor is not None:
        acc = round_to((acc * F32(routed_scaling_factor)).astype(F32), "bf16")
    return acc


def _deep_gemm_expert_rows(rows, row_scales, e, w13, w2, *, use_fp8, w13_scale, w2_scale,
                           scale_ue8m0, swiglu_limit):
    """The per-row core contract for rows of expert e (shared by both layouts): h1 = bf16(GEMM1),
    a = bf16(bf16(silu(gate)) · up) (DSv4 clamp with swiglu_limit), FP8: a quantized per 1×128
    group with the silu-post rule, y = bf16(GEMM2). rows: e4m3 codes (uint8) + f32 scales
    [m, H/128], or bf16/f32 values. Returns bf16 values as float32 [m, H]."""
    inter = np.asarray(w2).shape[2]
    h = np.asarray(w2).shape[1]
    rnd = _Rounder("triton", "bf16")
    if use_fp8:
        w13c, w2c = decode_fp8_ref(_codes(w13)[e]), decode_fp8_ref(_codes(w2)[e])
        h1 = _scaled_gemm(decode_fp8_ref(_codes(rows)), row_scales, w13c,
                          np.repeat(np.asarray(w13_scale, F32)[e], DEEP_GEMM_BLOCK, 0)[:2 * inter],
                          DEEP_GEMM_BLOCK)
    else:
        w13c, w2c = _rows_f32(np.asarray(w13)[e]), _rows_f32(np.asarray(w2)[e])
        h1 = _rows_f32(rows).astype(np.float64) @ w13c.astype(np.float64).T
    h1 = rnd(h1)
    act = _gated_activation(h1, inter, activation="silu", gemm1_alpha=None,
                            gemm1_clamp_limit=None, gemm1_beta=None,
                            swiglu_limit=swiglu_limit, round_before_mul=True, rnd=rnd)
    if use_fp8:
        q, s = quantize_activation_ref(act.astype(F32), "fp8_silu_post_group",
                                       group_size=DEEP_GEMM_BLOCK, scale_ue8m0=scale_ue8m0)
        y = _scaled_gemm(decode_fp8_ref(q), s, w2c,
                         np.repeat(np.asarray(w2_scale, F32)[e], DEEP_GEMM_BLOCK, 0)[:h],
                         DEEP_GEMM_BLOCK)
    else:
        y = act @ w2c.astype(np.float64).T
    return np.asarray(rnd(y), F32)


def deep_gemm_masked_core_ref(hidden_states, hidden_states_scale, masked_m, w13, w2, *,
                              use_fp8: bool, w13_scale=None, w2_scale=None,
                              scale_ue8m0: bool = False, swiglu_limit=None):
    """The deep_gemm core on the masked layout: hidden_states [E, m_max, H] (+ scales
    [E, m_max, H/128]), masked_m [E] → bf16 values as float32 [E, m_max, H], rows past
    masked_m[e] zero."""
    hs = np.asarray(hidden_states)
    num_experts, m_max, h = hs.shape
    down = np.zeros((num_experts, m_max, h), F32)
    for e in range(num_experts):
        m = int(masked_m[e])
        if m:
            down[e, :m] = _deep_gemm_expert_rows(
                hs[e, :m], None if not use_fp8 else np.asarray(hidden_states_scale)[e, :m], e,
                w13, w2, use_fp8=use_fp8, w13_scale=w13_scale, w2_scale=w2_scale,
                scale_ue8m0=scale_ue8m0, swiglu_limit=swiglu_limit)
    return down


def contiguous_segments_ref(m_indices, num_experts: int):
    """[(expert, first row, rows)] of a contiguous-layout m_indices (sglang's ep_scatter: each
    expert's rows one run starting on a 128-row boundary, −1 padding, len % 128 == 0). Raises
    ValueError for any other layout (IndexError for ids outside [−1, E))."""
    ids = np.asarray(m_indices)
    if ids.dtype != np.int32 or ids.ndim != 1:
        raise TypeError(f"m_indices: expected int32 [M], got {ids.dtype} {ids.shape}")
    if len(ids) % DEEP_GEMM_BLOCK:
        raise ValueError(f"m_indices: expected M a multiple of 128, got {len(ids)}")
    segments, seen, r = [], set(), 0
    while r < len(ids):
        e = int(ids[r])
        if not -1 <= e < num_experts:
            raise IndexError(f"m_indices must be in [-1, {num_experts}), got {e} at row {r}")
        end = r + 1
        while end < len(ids) and ids[end] == e:
            end += 1
        if e >= 0:
            if e in seen:
                raise ValueError(f"m_indices: the rows of expert {e} must be contiguous")
            if r % DEEP_GEMM_BLOCK:
                raise ValueError(f"m_indices: expert {e} starts at row {r}, not on a 128-row "
                                 "boundary")
            seen.add(e)
            segments.append((e, r, end - r))
        r = end
    return segments


def deep_gemm_contiguous_core_ref(hidden_states, hidden_states_scale, m_indices, w13, w2, *,
                                  use_fp8: bool, w13_scale=None, w2_scale=None,
                                  scale_ue8m0: bool = False, swiglu_limit=None):
    """The deep_gemm core on the contiguous layout: hidden_states [M, H] (+ scales [M, H/128]),
    m_indices int32 [M] (expert per row, −1 padding) → bf16 values as float32 [M, H], padding
    rows zero. Same per-row contract as the masked layout."""
    hs = np.asarray(hidden_states)
    down = np.zeros(hs.shape, F32)
    for e, r0, m in contiguous_segments_ref(m_indices, np.asarray(w13).shape[0]):
        down[r0:r0 + m] = _deep_gemm_expert_rows(
            hs[r0:r0 + m], None if not use_fp8 else np.asarray(hidden_states_scale)[r0:r0 + m],
            e, w13, w2, use_fp8=use_fp8, w13_scale=w13_scale, w2_scale=w2_scale,
            scale_ue8m0=scale_ue8m0, swiglu_limit=swiglu_limit)
    return down


def deep_gemm_moe_ref(x, w13, w2, topk_weights, topk_ids, *, use_fp8: bool, w13_scale=None,
                      w2_scale=None, scale_ue8m0: bool = False, swiglu_limit=None,
                      routed_scaling_factor=None, return_down_output=False):
    """The deep_gemm contract (deep_gemm.cpp): preprocess, the masked core, then post_reorder
    and routed scaling."""
    num_experts = np.asarray(w13).shape[0]
    pre = deep_gemm_preprocess_ref(topk_ids, num_experts, x, use_fp8, scale_ue8m0)
    down = deep_gemm_masked_core_ref(pre["hidden_states"], pre["hidden_states_scale"],
                                     pre["masked_m"], w13, w2, use_fp8=use_fp8,
                                     w13_scale=w13_scale, w2_scale=w2_scale,
                                     scale_ue8m0=scale_ue8m0, swiglu_limit=swiglu_limit)
    out = deep_gemm_post_reorder_ref(down, pre["src2dst"], topk_ids, topk_weights,
                                     routed_scaling_factor)
    return (out, down) if return_down_output else out


# ---------------------------------------------------------------------------------------------
# ModelOpt FP8 on flashinfer_cutlass (quant/modelopt_fp8.cpp).


def modelopt_cutlass_scales_ref(w13_scale, w2_scale, w13_input_scale, w2_input_scale):
    """[fc1_dequant [E], fc2_quant [1], fc2_dequant [E], fc1_input_dequant [1]] in fp32:
    w13_scale·in13, 1/in2, in2·w2_scale, in13 (in13/in2: the max-reduced input scales)."""
    in13 = F32(np.max(np.asarray(w13_input_scale, F32)))
    in2 = F32(np.max(np.asarray(w2_input_scale, F32)))
    return [(np.asarray(w13_scale, F32) * in13).astype(F32), np.array([F32(1.0) / in2], F32),
            (in2 * np.asarray(w2_scale, F32)).astype(F32), np.array([in13], F32)]


def pad_intermediate_ref(w13, w2, align: int = 16, gated: bool = True):
    """Zero-pads I to a multiple of `align`: each gated half of w13 [E, 2I, H] separately, w2
    [E, H, I] on its last dim. Works on any dtype (zero bytes)."""
    w13 = np.asarray(w13)
    w2 = np.asarray(w2)
    inter = w2.shape[2]
    ip = -(-inter // align) * align
    if ip == inter:
        return w13, w2
    pad13 = [(0, 0), (0, ip - inter), (0, 0)]
    if gated:
        halves = [np.pad(h.view(np.uint8), pad13).view(w13.dtype)
                  for h in (w13[:, :inter], w13[:, inter:])]
        n13 = np.concatenate(halves, axis=1)
    else:
        n13 = np.pad(w13.view(np.uint8), pad13).view(w13.dtype)
    n2 = np.pad(w2.view(np.uint8), [(0, 0), (0, 0), (0, ip - inter)]).view(w2.dtype)
    return n13, n2
