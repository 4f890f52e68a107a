"""Seeded test data for moecore: MoE problems whose arrays go straight into the Python API
(bf16 as ml_dtypes arrays). Every generator takes a ``np.random.Generator``; no global state.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np

from ..dtypes import to_bf16

__all__ = ["MoeProblem", "make_moe_problem", "cast", "random_routing"]


def cast(a: np.ndarray, dtype: str) -> np.ndarray:
    """fp32 values → an array of moecore dtype "f32", "f16" or "bf16" (RNE)."""
    a = np.asarray(a, dtype=np.float32)
    if dtype == "f32":
        return a.copy()
    if dtype == "f16":
        return a.astype(np.float16)
    if dtype == "bf16":
        out = to_bf16(a)
        if not isinstance(out, np.ndarray):
            raise RuntimeError("moecore.testing needs ml_dtypes for bf16 arrays")
        return out
    raise ValueError(f"cast: expected f32, f16 or bf16, got {dtype!r}")


def random_routing(rng: np.random.Generator, num_tokens: int, num_experts: int, top_k: int):
    """Distinct ids per token (uniform) and positive weights summing to 1: (weights f32 [T, k],
    ids i32 [T, k]). Independent of moecore's router so expert compute tests stand alone."""
    if top_k > num_experts:
        raise ValueError(f"random_routing: top_k {top_k} > num_experts {num_experts}")
    keys = rng.random((num_tokens, num_experts))
    ids = np.argsort(keys, axis=1)[:, :top_k].astype(np.int32)
    w = rng.random((num_tokens, top_k)).astype(np.float32) + np.float32(0.1)
    w = (w / w.sum(axis=1, keepdims=True)).astype(np.float32)
    return w, ids


@dataclass
class MoeProblem:
    """One MoE expert-compute problem. Arrays are in `dtype` (weights and x), biases in
    `bias_dtype`, topk_weights f32, topk_ids i32, router_logits f32 [T, E]."""

    dtype: str
    x: np.ndarray
    w13: np.ndarray
    w2: np.ndarray
    topk_weights: np.ndarray
    topk_ids: np.ndarray
    router_logits: np.ndarray
    b13: Optional[np.ndarray] = None
    b2: Optional[np.ndarray] = None
    gated: bool = True
    meta: dict = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return self.x.shape[0]

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]

    @property
    def top_k(self) -> int:
        return self.topk_ids.shape[1]

    def with_routing(self, topk_weights, topk_ids) -> "MoeProblem":
        return replace(self, topk_weights=np.asarray(topk_weights, np.float32),
                       topk_ids=np.asarray(topk_ids, np.int32))

    def with_x(self, x) -> "MoeProblem":
        return replace(self, x=x)

    def ref_kwargs(self) -> dict:
        """Array keywords for moecore.reference.fused_moe_ref (positional ones included)."""
        return dict(x=self.x, w13=self.w13, w2=self.w2, topk_weights=self.topk_weights,
                    topk_ids=self.topk_ids, b13=self.b13, b2=self.b2, is_gated=self.gated,
                    act_dtype=self.dtype)

    def quant_info_kwargs(self) -> dict:
        """Keywords of the unquantized QuantInfo classes."""
        return dict(w13_weight=self.w13, w2_weight=self.w2, b13=self.b13, b2=self.b2)


def make_moe_problem(
    rng: np.random.Generator,
    T: int,
    E: int,
    H: int,
    I: int,  # noqa: E741 - the spec's shape letter
    k: int,
    dtype: str = "f32",
    gated: bool = True,
    bias: bool = False,
    scale: float = 1.0,
    bias_dtype: Optional[str] = None,
    bias_scale: float = 0.5,
    w2_scale: Optional[float] = None,
) -> MoeProblem:
    """x ~ N(0, 1); W13 ~ N(0, scale²/H), W2 ~ N(0, w2_scale²/I) (w2_scale defaults to scale)
    so GEMM outputs stay O(scale); a large `scale` with a small `w2_scale` reaches clamp limits
    without large cancelling terms in GEMM2; biases ~ N(0, bias_scale²) in bias_dtype (default:
    dtype); routing from random_routing and router_logits ~ N(0, 1) (not tied to the ids). All
    rounded RNE to `dtype`."""
    n1 = 2 * I if gated else I
    x = rng.standard_normal((T, H)).astype(np.float32)
    w13 = (rng.standard_normal((E, n1, H)) * (scale / np.sqrt(H))).astype(np.float32)
    s2 = scale if w2_scale is None else w2_scale
    w2 = (rng.standard_normal((E, H, I)) * (s2 / np.sqrt(I))).astype(np.float32)
    weights, ids = random_routing(rng, T, E, k)
    logits = rng.standard_normal((T, E)).astype(np.float32)
    bd = bias_dtype or dtype
    b13 = cast(rng.standard_normal((E, n1)) * bias_scale, bd) if bias else None
    b2 = cast(rng.standard_normal((E, H)) * bias_scale, bd) if bias else None
    return MoeProblem(dtype=dtype, x=cast(x, dtype), w13=cast(w13, dtype), w2=cast(w2, dtype),
                      topk_weights=weights, topk_ids=ids, router_logits=logits, b13=b13, b2=b2,
                      gated=gated, meta=dict(T=T, E=E, H=H, I=I, k=k))

