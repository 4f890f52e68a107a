"""Golden numpy twins of moecore's 8-bit MoE contracts (FP8 E4M3 and INT8).

The twin of cpp/moecore/runner/quant_compute.cpp (sglang's activation quantizers), the quantized
contract of cpp/moecore/runner/backends/triton.cpp, cpp/moecore/runner/backends/deep_gemm.cpp
(preprocess, masked expert compute, post_reorder) and the weight processing of
cpp/moecore/quant/{fp8,modelopt_fp8}.cpp. Must never import the compiled extension or torch.

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
from .quant import ceil_log2_ref, decode_fp8_ref, encode_fp8_ref, pow2_f32

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
    "modelopt_cutlass_scales_ref",
    "pad_intermediate_ref",
]

F32 = np.float32
FP8_MAX = F32(448.0)
EPS = F32(1e-10)
DEEP_GEMM_BLOCK = 128

ACT_QUANT_RULES = ("fp8_static", "fp8_per_tensor", "fp8_per_token", "fp8_per_token_group",
                   "fp8_silu_post_group", "int8_per_token")


# ---------------------------------------------------------------------------------------------
# Activation quantizers (quant_compute.h), float32 in sglang's operation order.


def _rows_f32(x) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype.name == "bfloat16" or x.dtype == np.float16:
        return x.astype(F32)
    return np.asarray(x, dtype=F32)


def _e4m3_clamped(v) -> np.ndarray:
    """CUDA fmax(fmin(v, 448), −448) then e4m3 RNE: NaN becomes +448 (fmin drops NaN)."""
    v = np.fmax(np.fmin(np.asarray(v, F32), FP8_MAX), -FP8_MAX)
    return encode_fp8_ref(v)


def _amax(x, axis=None, keepdims=False):
    """max |x| with NaN ignored (fmaxf), 0 for empty input."""
    a = np.abs(np.asarray(x, F32))
    if a.size == 0:
        shape = () if axis is None else tuple(1 if keepdims and i == axis % a.ndim else s
                                              for i, s in enumerate(a.shape)
                                              if keepdims or i != axis % a.ndim)
        return np.zeros(shape, F32)
    return np.fmax.reduce(np.where(np.isnan(a), F32(0), a), axis=axis, keepdims=keepdims).astype(F32)


def fp8_quant_scaled_ref(x, scale) -> np.ndarray:
    """Static per-tensor rule: q = e4m3(clamp(x · fp32(1/scale), ±448)) (jit per_tensor_quant_fp8).
    Also the dynamic per-tensor rule with scale = amax/448 (scale 0 → 1/0 = inf → NaN → +448)."""
    x = _rows_f32(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = F32(1.0) / F32(scale)
        return _e4m3_clamped(x * inv)


def _fp8_per_token(x):
    s = (_amax(x, axis=-1, keepdims=True) / FP8_MAX).astype(F32)
    with np.errstate(divide="ignore"):
        inv = np.where(s == 0, F32(0), F32(1.0) / np.where(s == 0, F32(1), s)).astype(F32)
    return _e4m3_clamped(x * inv), s


def _fp8_group(x, group, ue8m0, rule):
    rows, k = x.shape
    g = x.reshape(rows, k // group, group)
    a = np.fmax(_amax(g, axis=-1, keepdims=True), EPS)
    s = (a / FP8_MAX).astype(F32)
    if ue8m0:
        floored = np.fmax(s, EPS) if rule == "fp8_per_token_group" else s
        s = pow2_f32(ceil_log2_ref(floored))
    q = _e4m3_clamped(g / s)
    return q.reshape(rows, k), s[..., 0]


def _int8_per_token(x):
    a = np.fmax(_amax(x, axis=-1, keepdims=True), EPS)
    s = (a / F32(127)).astype(F32)
    mul = (F32(127) / a).astype(F32)
    v = (x * mul).astype(F32).astype(np.float64)
    r = np.trunc(v)  # libdevice.round: half away from zero, exact in float64
    r = r + np.where(np.abs(v - r) >= 0.5, np.sign(v), 0.0)
    r = np.where(np.isnan(r), 0.0, np.clip(r, -128, 127))
    return r.astype(np.int8), s


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
        return fp8_quant_scaled_ref(x, scale), np.array([scale], F32)
    if rule == "fp8_per_tensor":
        s = F32(_amax(x) / FP8_MAX)
        return fp8_quant_scaled_ref(x, s), np.array([s], F32)
    if rule == "fp8_per_token":
        return _fp8_per_token(x)
    if rule in ("fp8_per_token_group", "fp8_silu_post_group"):
        if x.shape[1] % group_size:
            raise ValueError(f"quantize_activation_ref: K={x.shape[1]} % {group_size} != 0")
        return _fp8_group(x, group_size, scale_ue8m0, rule)
    if rule == "int8_per_token":
        return _int8_per_token(x)
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
            q[e, rows] = fp8_quant_scaled_ref(dq.astype(F32), smax[e])
    return q, smax


def quantize_weight_per_expert_ref(w):
    """scaled_fp8_quant per expert: s = amax/448 (no eps), q = e4m3(clamp(x · (1/s)))."""
    x = _rows_f32(w)
    out = np.empty(x.shape, np.uint8)
    scales = np.empty(x.shape[0], F32)
    for e in range(x.shape[0]):
        scales[e] = F32(_amax(x[e]) / FP8_MAX)
        out[e] = fp8_quant_scaled_ref(x[e], scales[e])
    return out, scales


def quantize_weight_per_channel_ref(w):
    """Per output row with the per-token rule: scales [E, N, 1]."""
    x = _rows_f32(w)
    e, n, k = x.shape
    q, s = _fp8_per_token(x.reshape(e * n, k))
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
    sf = pow2_f32(ceil_log2_ref((np.maximum(amax, F32(1e-4)) / FP8_MAX).astype(F32)))
    sf_full = np.repeat(np.repeat(sf, b, axis=1), b, axis=2)[:, :n, :k]
    return encode_fp8_ref((x * (F32(1.0) / sf_full)).astype(F32)), sf


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
        s1 = F32(_amax(xs) / FP8_MAX)
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
        s2 = F32(_amax(h2[valid].astype(F32)) / FP8_MAX) if valid.any() else F32(0)
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


def deep_gemm_moe_ref(x, w13, w2, topk_weights, topk_ids, *, use_fp8: bool, w13_scale=None,
                      w2_scale=None, scale_ue8m0: bool = False, swiglu_limit=None,
                      routed_scaling_factor=None, return_down_output=False):
    """The deep_gemm contract (deep_gemm.cpp): preprocess, per expert row h1 = bf16(GEMM1),
    a = bf16(bf16(silu(gate)) · up) (DSv4 clamp with swiglu_limit), FP8: a quantized per 1×128
    group with the silu-post rule, y = bf16(GEMM2); then post_reorder and routed scaling."""
    num_experts = np.asarray(w13).shape[0]
    inter = np.asarray(w2).shape[2]
    pre = deep_gemm_preprocess_ref(topk_ids, num_experts, x, use_fp8, scale_ue8m0)
    m_max, h = pre["m_max"], np.asarray(x).shape[1]
    rnd = _Rounder("triton", "bf16")
    down = np.zeros((num_experts, m_max, h), F32)
    if use_fp8:
        w13c, w2c = decode_fp8_ref(_codes(w13)), decode_fp8_ref(_codes(w2))
    else:
        w13c, w2c = _rows_f32(w13), _rows_f32(w2)
    for e in range(num_experts):
        m = int(pre["masked_m"][e])
        if m == 0:
            continue
        if use_fp8:
            a = decode_fp8_ref(pre["hidden_states"][e, :m])
            h1 = _scaled_gemm(a, pre["hidden_states_scale"][e, :m], w13c[e],
                              np.repeat(np.asarray(w13_scale, F32)[e], DEEP_GEMM_BLOCK, 0)[:2 * inter],
                              DEEP_GEMM_BLOCK)
        else:
            h1 = np.asarray(pre["hidden_states"][e, :m], np.float64) @ w13c[e].astype(np.float64).T
        h1 = rnd(h1)
        act = _gated_activation(h1, inter, activation="silu", gemm1_alpha=None,
                                gemm1_clamp_limit=None, gemm1_beta=None,
                                swiglu_limit=swiglu_limit, round_before_mul=True, rnd=rnd)
        if use_fp8:
            q, s = quantize_activation_ref(act.astype(F32), "fp8_silu_post_group",
                                           group_size=DEEP_GEMM_BLOCK, scale_ue8m0=scale_ue8m0)
            y = _scaled_gemm(decode_fp8_ref(q), s, w2c[e],
                             np.repeat(np.asarray(w2_scale, F32)[e], DEEP_GEMM_BLOCK, 0)[:h],
                             DEEP_GEMM_BLOCK)
        else:
            y = act @ w2c[e].astype(np.float64).T
        down[e, :m] = rnd(y)
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
