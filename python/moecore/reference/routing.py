"""Golden routing (sglang's ``select_experts``) in plain numpy, the twin of cpp/moecore/routing.

Written for clarity, not speed: whole-batch numpy ops with the same numeric recipe that the C++
core documents (scores in float64 rounded once to float32, weights in float32 in column order),
so ids match exactly and weights to ~1 ulp. Must never import the compiled extension or torch.
"""

from __future__ import annotations

import numpy as np

__all__ = ["compute_scores_ref", "select_experts_ref", "topk_order_ref"]

_SCORING_FUNCS = ("softmax", "sigmoid", "sqrtsoftplus")


def compute_scores_ref(logits, scoring_func: str) -> np.ndarray:
    """Scores f32 [T, E] of logits [T, E] (any float dtype; read exactly as float32).

    Evaluated in float64 and rounded once to float32, as the C++ core does:
    softmax ``exp(x - max x) / sum``, sigmoid ``1 / (1 + exp(-x))`` and sqrtsoftplus
    ``sqrt(max(x, 0) + log1p(exp(-|x|)))`` (softplus in its overflow-free form).
    """
    x = np.asarray(logits).astype(np.float32).astype(np.float64)
    with np.errstate(over="ignore"):  # exp(-x) = inf for x < -709 gives sigmoid 0, as intended
        if scoring_func == "softmax":
            e = np.exp(x - x.max(axis=-1, keepdims=True))
            scores = e / e.sum(axis=-1, keepdims=True)
        elif scoring_func == "sigmoid":
            scores = 1.0 / (1.0 + np.exp(-x))
        elif scoring_func == "sqrtsoftplus":
            scores = np.sqrt(np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x))))
        else:
            raise ValueError(
                f"select_experts: expected scoring_func in {_SCORING_FUNCS}, got {scoring_func!r}"
            )
    return scores.astype(np.float32)


def topk_order_ref(keys: np.ndarray, k: int) -> np.ndarray:
    """Column indices of the k largest keys per row: descending key, ties to the lower index.

    A stable sort of the negated keys keeps equal keys in index order (negation is exact).
    """
    return np.argsort(-keys, axis=-1, kind="stable")[:, :k]


def _row_sum_in_column_order(w: np.ndarray) -> np.ndarray:
    # numpy's pairwise sum regroups additions for 8+ columns; the core adds left to right.
    total = np.zeros(w.shape[0], dtype=np.float32)
    for j in range(w.shape[1]):
        total = total + w[:, j]
    return total


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(f"select_experts: expected {message}")


def select_experts_ref(
    router_logits,
    *,
    top_k: int,
    use_grouped_topk: bool = False,
    topk_group=None,
    num_expert_group=None,
    renormalize: bool = True,
    num_fused_shared_experts: int = 0,
    correction_bias=None,
    routed_scaling_factor=None,
    apply_routed_scaling_factor_on_output: bool = False,
    fused_shared_experts_scaling_factor=None,
    scoring_func: str = "softmax",
    num_token_non_padded=None,
):
    """Returns (topk_weights f32 [T, top_k], topk_ids int32 [T, top_k]) for logits [T, E].

    Semantics (moecore's, documented in cpp/moecore/routing/topk.h):
    * grouped without correction_bias: softmax, group score = max, keep ``topk_group`` groups;
      grouped with correction_bias: sigmoid, group score = sum of the two largest biased scores.
      Like sglang, the grouped paths ignore ``scoring_func``. Dropped groups' experts cannot be
      chosen.
    * otherwise ``scoring_func`` over all experts; a correction_bias only chooses experts.
    * columns in descending selection score, ties to the lower expert id; the last
      ``num_fused_shared_experts`` (S) columns hold ids E..E+S-1 with weight
      ``sum(routed) / routed_scaling_factor`` (factor 1 when absent).
    * renormalize divides all columns by the routed sum (not when it is 0), then, only inside
      renormalize, multiplies by routed_scaling_factor if apply_routed_scaling_factor_on_output;
      fused_shared_experts_scaling_factor multiplies the shared columns last.
    * rows at or past num_token_non_padded get ids -1 and weight 0.
    """
    x = np.asarray(router_logits)
    _check(x.ndim == 2, f"router_logits of rank 2 [T, E], got shape {x.shape}")
    x = x.astype(np.float32)
    num_tokens, num_experts = x.shape
    num_shared = int(num_fused_shared_experts)
    routed_k = top_k - num_shared
    _check(top_k >= 1, f"top_k >= 1, got {top_k}")
    _check(num_shared >= 0, f"num_fused_shared_experts >= 0, got {num_shared}")
    _check(1 <= routed_k <= num_experts, f"routed top-k in [1, {num_experts}], got {routed_k}")
    real = num_tokens if num_token_non_padded is None else int(num_token_non_padded)
    _check(0 <= real <= num_tokens, f"num_token_non_padded in [0, {num_tokens}], got {real}")
    _check(
        np.isfinite(x[:real]).all(), "finite router_logits in the non-padded rows, got NaN or inf"
    )
    bias = None
    if correction_bias is not None:
        bias = np.asarray(correction_bias)
        _check(bias.dtype == np.float32, f"correction_bias of dtype float32, got {bias.dtype}")
        _check(bias.shape == (num_experts,), f"correction_bias of shape [{num_experts}]")
    _check(
        not apply_routed_scaling_factor_on_output or routed_scaling_factor is not None,
        "routed_scaling_factor with apply_routed_scaling_factor_on_output=True, got None",
    )
    rsf = np.float32(1.0 if routed_scaling_factor is None else routed_scaling_factor)
    _check(np.isfinite(rsf) and rsf > 0, f"routed_scaling_factor finite and > 0, got {rsf}")

    rows = x[:real]
    if use_grouped_topk:
        _check(
            num_expert_group is not None and topk_group is not None,
            "num_expert_group and topk_group with use_grouped_topk",
        )
        _check(num_experts % num_expert_group == 0, "num_expert_group to divide E")
        _check(1 <= topk_group <= num_expert_group, "topk_group in [1, num_expert_group]")
        per_group = num_experts // num_expert_group
        _check(routed_k <= topk_group * per_group, "routed top-k <= topk_group * per group")
        scores = compute_scores_ref(rows, "sigmoid" if bias is not None else "softmax")
        keys = scores + bias if bias is not None else scores
        grouped = keys.reshape(real, num_expert_group, per_group)
        if bias is None:
            group_scores = grouped.max(axis=-1)
        else:
            _check(per_group >= 2, "at least 2 experts per group for biased grouped top-k")
            top2 = np.sort(grouped, axis=-1)[..., -2:]
            group_scores = top2[..., 1] + top2[..., 0]
        kept_groups = topk_order_ref(group_scores, topk_group)
        kept = np.zeros((real, num_expert_group), dtype=bool)
        np.put_along_axis(kept, kept_groups, True, axis=-1)
        keys = np.where(np.repeat(kept, per_group, axis=-1), keys, np.float32(-np.inf))
    else:
        scores = compute_scores_ref(rows, scoring_func)
        keys = scores + bias if bias is not None else scores

    routed_ids = topk_order_ref(keys, routed_k)
    routed_w = np.take_along_axis(scores, routed_ids, axis=-1)
    routed_sum = _row_sum_in_column_order(routed_w)

    weights = np.zeros((real, top_k), dtype=np.float32)
    ids = np.zeros((real, top_k), dtype=np.int32)
    weights[:, :routed_k] = routed_w
    ids[:, :routed_k] = routed_ids
    weights[:, routed_k:] = (routed_sum / rsf)[:, None]
    ids[:, routed_k:] = num_experts + np.arange(num_shared, dtype=np.int32)
    if renormalize:
        divisor = np.where(routed_sum > 0, routed_sum, np.float32(1.0))
        weights = weights / divisor[:, None]
        if apply_routed_scaling_factor_on_output:
            weights = weights * rsf
    if fused_shared_experts_scaling_factor is not None:
        weights[:, routed_k:] *= np.float32(fused_shared_experts_scaling_factor)

    out_w = np.zeros((num_tokens, top_k), dtype=np.float32)
    out_ids = np.full((num_tokens, top_k), -1, dtype=np.int32)
    out_w[:real] = weights
    out_ids[:real] = ids
    return out_w, out_ids
