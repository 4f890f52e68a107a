"""Golden MoE expert compute (spec §7.1, §7.6) in plain numpy, the twin of cpp/moecore/runner.

``fused_moe_ref`` implements each runner backend's numeric contract literally (the comments at
the top of cpp/moecore/runner/backends/{triton,torch_native}.cpp), with the same rounding points,
plus an ``"exact"`` contract (float64 throughout, never rounded) for oracle comparisons.
Must never import the compiled extension or torch; written for clarity, not speed.

Accumulation and rounding: every dot product (GEMM1, GEMM2) and every sum (the top-k combine)
is evaluated in float64; every elementwise step (bias, routed weight, activation, scaling
factor) is evaluated in float64 as well. At each point where the backend stores a value in the
activation dtype, the float64 value is rounded to float32 and then to the activation dtype
(round to nearest even, ``moecore.dtypes.round_to``). The kernels accumulate in float32 in a
fixed order, so the reference differs from them only by float32 accumulation error — far below
the tolerances in ``moecore.testing.tolerances`` — and by the rare act-dtype rounding flip it
causes.
"""

from __future__ import annotations

import math

import numpy as np

from ..dtypes import round_to

__all__ = ["fused_moe_ref", "moe_layer_ref", "activation_ref", "CONTRACTS", "ACTIVATIONS"]

CONTRACTS = ("triton", "torch_native", "exact")
ACTIVATIONS = {"silu": True, "gelu": True, "gelu_tanh": True, "relu2": False}  # name → may gate

_ERF = np.vectorize(math.erf, otypes=[np.float64])
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _dtype_name(a) -> str:
    """moecore's name for an array's dtype: f32 (also for float64), f16 or bf16."""
    name = np.asarray(a).dtype.name
    if name in ("float32", "float64"):
        return "f32"
    if name == "float16":
        return "f16"
    if name == "bfloat16":
        return "bf16"
    raise ValueError(f"fused_moe_ref: expected f32, f16 or bf16 arrays, got dtype {name}")


def _f64(a) -> np.ndarray:
    """Any f32/f16/bf16 (ml_dtypes) array widened exactly to float64."""
    a = np.asarray(a)
    if a.dtype == np.float64:
        return a
    return a.astype(np.float32).astype(np.float64)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-x) = inf for very negative x gives σ = 0, as in C
        return 1.0 / (1.0 + np.exp(-x))


def activation_ref(name: str, x: np.ndarray) -> np.ndarray:
    """The unary activations of spec §7.6 in float64: silu, gelu (erf), gelu_tanh, relu2."""
    x = np.asarray(x, dtype=np.float64)
    if name == "silu":
        return x * _sigmoid(x)
    if name == "gelu":
        return 0.5 * x * (1.0 + _ERF(x / math.sqrt(2.0)))
    if name == "gelu_tanh":
        return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3)))
    if name == "relu2":
        r = np.maximum(x, 0.0)
        return r * r
    raise ValueError(f"Unsupported activation: activation={name!r}")


class _Rounder:
    """Rounds float64 values at a contract's rounding points (identity for "exact")."""

    def __init__(self, contract: str, act_dtype: str):
        self.exact = contract == "exact"
        self.act_dtype = act_dtype

    def __call__(self, v: np.ndarray) -> np.ndarray:
        if self.exact:
            return v
        return round_to(np.asarray(v, dtype=np.float64).astype(np.float32), self.act_dtype).astype(
            np.float64
        )


def _gated_activation(h1, inter, *, activation, gemm1_alpha, gemm1_clamp_limit, gemm1_beta,
                      swiglu_limit, round_before_mul, rnd):
    """h1 [m, 2I] (act-dtype values) → [m, I] with the contract's rounding."""
    if gemm1_alpha is not None:
        # GPT-OSS clamped SwiGLU on interleaved columns; one rounding in every contract.
        limit = float(np.float32(gemm1_clamp_limit))
        alpha = float(np.float32(gemm1_alpha))
        beta = float(np.float32(1.0 if gemm1_beta is None else gemm1_beta))
        gate = np.minimum(h1[:, 0::2], limit)
        up = np.clip(h1[:, 1::2], -limit, limit)
        return rnd(gate * _sigmoid(alpha * gate) * (up + beta))
    gate, up = h1[:, :inter], h1[:, inter:]
    if swiglu_limit is not None:  # DSv4 clamp on halves
        limit = float(np.float32(swiglu_limit))
        gate = np.minimum(gate, limit)
        up = np.clip(up, -limit, limit)
    act = activation_ref(activation, gate)
    if round_before_mul:  # SiluAndMul/GeluAndMul.forward_native: act(gate) is stored first
        act = rnd(act)
    return rnd(act * up)


def _check_args(x, w13, w2, topk_weights, topk_ids, b13, b2, activation, is_gated, gemm1_alpha,
                gemm1_clamp_limit, swiglu_limit, apply_router_weight_on_input, contract):
    if contract not in CONTRACTS:
        raise ValueError(f"fused_moe_ref: expected contract in {CONTRACTS}, got {contract!r}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"Unsupported activation: activation={activation!r}")
    if is_gated and not ACTIVATIONS[activation]:
        raise ValueError(f"fused_moe_ref: {activation} is a non-gated activation")
    if (gemm1_alpha is None) != (gemm1_clamp_limit is None):
        raise ValueError("fused_moe_ref: gemm1_alpha and gemm1_clamp_limit go together")
    if (gemm1_alpha is not None or swiglu_limit is not None) and not (
        is_gated and activation == "silu"
    ):
        raise ValueError("fused_moe_ref: clamped SwiGLU needs a gated silu activation")
    if gemm1_alpha is not None and swiglu_limit is not None:
        raise ValueError("fused_moe_ref: gemm1_alpha and swiglu_limit are exclusive")
    if x.ndim != 2 or w13.ndim != 3 or w2.ndim != 3:
        raise ValueError("fused_moe_ref: expected x [T, H], w13 [E, N1, H], w2 [E, H, I]")
    num_experts, n1, hidden = w13.shape
    inter = w2.shape[2]
    if w2.shape[:2] != (num_experts, hidden) or n1 != (2 if is_gated else 1) * inter:
        raise ValueError(f"fused_moe_ref: inconsistent w13 {w13.shape} and w2 {w2.shape}")
    if x.shape[1] != hidden:
        raise ValueError(f"fused_moe_ref: x {x.shape} does not match H={hidden}")
    if topk_ids.shape != topk_weights.shape or topk_ids.ndim != 2 or topk_ids.shape[0] != len(x):
        raise ValueError("fused_moe_ref: expected topk_ids and topk_weights [T, k]")
    if topk_ids.size and (topk_ids.min() < -1 or topk_ids.max() >= num_experts):
        raise ValueError(f"fused_moe_ref: topk_ids must be in [-1, {num_experts})")
    if b13 is not None and np.shape(b13) != (num_experts, n1):
        raise ValueError(f"fused_moe_ref: expected b13 [{num_experts}, {n1}]")
    if b2 is not None and np.shape(b2) != (num_experts, hidden):
        raise ValueError(f"fused_moe_ref: expected b2 [{num_experts}, {hidden}]")
    if apply_router_weight_on_input:
        if contract == "torch_native":
            raise NotImplementedError(
                "fused_moe_ref(torch_native): apply_router_weight_on_input is not supported"
            )
        if contract == "triton" and topk_ids.shape[1] != 1:
            raise ValueError("Only support topk=1 when `apply_router_weight_on_input` is True")


def fused_moe_ref(
    x,
    w13,
    w2,
    topk_weights,
    topk_ids,
    *,
    b13=None,
    b2=None,
    activation: str = "silu",
    is_gated: bool = True,
    gemm1_alpha=None,
    gemm1_clamp_limit=None,
    gemm1_beta=None,
    swiglu_limit=None,
    apply_router_weight_on_input: bool = False,
    routed_scaling_factor=None,
    no_combine: bool = False,
    act_dtype: str | None = None,
    contract: str = "triton",
) -> np.ndarray:
    """The MoE expert compute of spec §7.1 under one backend's numeric contract.

    x [T, H], w13 [E, 2I, H] (gated: gate = rows [0, I), up = rows [I, 2I); with gemm1_alpha
    interleaved: gate = even rows, up = odd rows) or [E, I, H] (non-gated), w2 [E, H, I], all
    f32/f16/bf16 (ml_dtypes); b13 [E, N1], b2 [E, H] optional (any of those dtypes);
    topk_weights f32 [T, k], topk_ids int [T, k] with −1 = "no expert" (contributes nothing).
    act_dtype: "f32", "f16" or "bf16"; None means x's dtype.

    contract "triton":  h1 = r(x·W13ᵀ + b13 [× w if apply_router_weight_on_input]);
      h2 = r(act(h1)) (one rounding); y = r(h2·W2ᵀ + b2 [× w otherwise]);
      out = r(rsf · Σ_j y_j). no_combine → y [T, k, H] (weighted, no rsf).
    contract "torch_native": h1 = r(x·W13ᵀ + b13); gated: h2 = r(r(act(gate))·up) (clamped
      SwiGLU: one rounding); y = r(h2·W2ᵀ + b2); out = r(rsf · Σ_j w_j·y_j).
      no_combine → r(w_j·y_j) [T, k, H] (weighted per spec §7.1, no rsf).
      apply_router_weight_on_input raises NotImplementedError.
    contract "exact": the same math in float64 with no rounding at all (the triton placement of
      the routed weight).
    r = round to act_dtype (via float32). rsf = routed_scaling_factor as float32, or 1.

    Returns float32 values (exactly representable in act_dtype) for "triton"/"torch_native",
    float64 for "exact"; shape [T, H], or [T, k, H] with no_combine.
    """
    x_arr, w13_arr, w2_arr = np.asarray(x), np.asarray(w13), np.asarray(w2)
    ids = np.asarray(topk_ids).astype(np.int64)
    weights = np.asarray(topk_weights, dtype=np.float32).astype(np.float64)
    _check_args(x_arr, w13_arr, w2_arr, weights, ids, b13, b2, activation, is_gated, gemm1_alpha,
                gemm1_clamp_limit, swiglu_limit, apply_router_weight_on_input, contract)
    if act_dtype is None:
        act_dtype = _dtype_name(x_arr)
    if act_dtype not in ("f32", "f16", "bf16"):
        raise ValueError(f"fused_moe_ref: expected act_dtype f32, f16 or bf16, got {act_dtype!r}")
    rnd = _Rounder(contract, act_dtype)
    rsf = 1.0 if routed_scaling_factor is None else float(np.float32(routed_scaling_factor))

    xs, w13s, w2s = _f64(x_arr), _f64(w13_arr), _f64(w2_arr)
    b13s = None if b13 is None else _f64(b13)
    b2s = None if b2 is None else _f64(b2)
    num_tokens, top_k = ids.shape
    hidden, inter = w2s.shape[1], w2s.shape[2]
    weight_on_input = apply_router_weight_on_input

    # y[t, j]: the (token, slot) expert output, rounded as the backend stores it. The triton
    # contract folds the routed weight into GEMM1 or GEMM2; torch_native applies it in combine.
    y = np.zeros((num_tokens, top_k, hidden), dtype=np.float64)
    for e in range(w13s.shape[0]):
        tok, slot = np.nonzero(ids == e)
        if tok.size == 0:
            continue
        w_rows = weights[tok, slot][:, None]
        h1 = xs[tok] @ w13s[e].T
        if b13s is not None:
            h1 = h1 + b13s[e]
        if weight_on_input:
            h1 = h1 * w_rows
        h1 = rnd(h1)
        if is_gated:
            h2 = _gated_activation(
                h1, inter, activation=activation, gemm1_alpha=gemm1_alpha,
                gemm1_clamp_limit=gemm1_clamp_limit, gemm1_beta=gemm1_beta,
                swiglu_limit=swiglu_limit, round_before_mul=contract == "torch_native", rnd=rnd)
        else:
            h2 = rnd(activation_ref(activation, h1))
        out = h2 @ w2s[e].T
        if b2s is not None:
            out = out + b2s[e]
        if contract != "torch_native" and not weight_on_input:
            out = out * w_rows
        y[tok, slot] = rnd(out)

    if contract == "torch_native":
        weighted = y * np.where(ids >= 0, weights, 0.0)[:, :, None]
        if no_combine:
            return rnd(weighted).astype(np.float32)
        return rnd(rsf * _sum_slots(weighted)).astype(np.float32)
    if no_combine:
        return y if contract == "exact" else y.astype(np.float32)
    out = rnd(rsf * _sum_slots(y))
    return out if contract == "exact" else out.astype(np.float32)


def _sum_slots(y: np.ndarray) -> np.ndarray:
    """Σ over slots in slot order (float64); [T, k, H] → [T, H]."""
    total = np.zeros((y.shape[0], y.shape[2]), dtype=np.float64)
    for j in range(y.shape[1]):
        total = total + y[:, j]
    return total


def moe_layer_ref(
    x,
    router_logits,
    w13,
    w2,
    *,
    top_k: int,
    renormalize: bool = True,
    scoring_func: str = "softmax",
    use_grouped_topk: bool = False,
    topk_group=None,
    num_expert_group=None,
    correction_bias=None,
    topk_routed_scaling_factor=None,
    apply_routed_scaling_factor_on_output: bool = False,
    num_fused_shared_experts: int = 0,
    fused_shared_experts_scaling_factor=None,
    num_token_non_padded=None,
    **expert_kwargs,
):
    """A whole MoE layer: routing (``select_experts_ref``) then ``fused_moe_ref``.

    The routing keywords are ``select_experts_ref``'s (``topk_routed_scaling_factor`` is its
    ``routed_scaling_factor``, i.e. TopKConfig's); ``expert_kwargs`` go to ``fused_moe_ref``
    (b13, b2, activation, routed_scaling_factor — the runner's —, contract, ...). w13/w2 hold
    every expert the ids can name, fused shared experts last. Returns (out, weights, ids).
    """
    from .routing import select_experts_ref

    weights, ids = select_experts_ref(
        router_logits,
        top_k=top_k,
        renormalize=renormalize,
        scoring_func=scoring_func,
        use_grouped_topk=use_grouped_topk,
        topk_group=topk_group,
        num_expert_group=num_expert_group,
        correction_bias=correction_bias,
        routed_scaling_factor=topk_routed_scaling_factor,
        apply_routed_scaling_factor_on_output=apply_routed_scaling_factor_on_output,
        num_fused_shared_experts=num_fused_shared_experts,
        fused_shared_experts_scaling_factor=fused_shared_experts_scaling_factor,
        num_token_non_padded=num_token_non_padded,
    )
    out = fused_moe_ref(x, w13, w2, weights, ids, **expert_kwargs)
    return out, weights, ids
