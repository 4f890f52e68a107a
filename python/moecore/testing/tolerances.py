"""The one tolerance table of moecore's tests (TESTING.md, "Tolerances"). Tests name a row by key;
no test writes its own atol/rtol. Add a row here, with its justification, when a new path needs
one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["Tolerance", "TOLERANCES", "tolerance", "tolerance_for_dtype"]


@dataclass(frozen=True)
class Tolerance:
    """Elementwise |actual − expected| ≤ atol + rtol·|expected|, and (when set) the normalised
    mean squared error Σ(a − e)² / Σe² ≤ nmse. bitwise=True means identical bytes."""

    atol: float = 0.0
    rtol: float = 0.0
    nmse: Optional[float] = None
    bitwise: bool = False


TOLERANCES = {
    # fp32 activations and weights vs a reference with the same rounding points: only fp32
    # accumulation order differs (TESTING.md).
    "f32": Tolerance(atol=1e-5, rtol=1e-5),
    # bf16 activations and weights, fp32 accumulation, bf16 out (TESTING.md). One bf16 ulp is at
    # most 2^-7 relative, so a single rounding flip passes; a systematic error does not (NMSE).
    "bf16": Tolerance(atol=1e-2, rtol=1e-2, nmse=1e-5),
    # f16 (TESTING.md leaves it open). f16 has 10 mantissa bits, unit roundoff u = 2^-11 ≈ 4.9e-4;
    # the reference rounds at the same points, so disagreements are single-ulp flips of an
    # intermediate (≤ 2u relative) propagated through at most one GEMM: atol = rtol = 4u ≈ 2e-3
    # covers that with a 2× margin, and NMSE ≤ 1e-6 (≈ 4u², i.e. bf16's bound scaled by the
    # 2^6 ratio of the squared unit roundoffs, rounded up) catches systematic drift.
    "f16": Tolerance(atol=2e-3, rtol=2e-3, nmse=1e-6),
    # float64 computations of the same math by two independent implementations (reference
    # self-checks against torch in float64): only summation order differs.
    "f64": Tolerance(atol=1e-12, rtol=1e-12),
    # routing: weights to 1e-6 (ids are compared exactly, separately).
    "routing_weights": Tolerance(atol=1e-6, rtol=1e-6),
    # determinism, parity, codecs and layouts.
    "bitwise": Tolerance(bitwise=True),
}


def tolerance(kind) -> Tolerance:
    """The table row named `kind` (a Tolerance passes through)."""
    if isinstance(kind, Tolerance):
        return kind
    try:
        return TOLERANCES[kind]
    except KeyError:
        raise KeyError(f"no tolerance row {kind!r}; rows: {sorted(TOLERANCES)}") from None


def tolerance_for_dtype(dtype) -> Tolerance:
    """The output-dtype row: "f32", "f16" or "bf16" (names or numpy/ml_dtypes dtypes)."""
    import numpy as np

    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    name = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64"}.get(name, name)
    return tolerance(name)
