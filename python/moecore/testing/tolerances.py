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
    # A whole low-precision pipeline (act-dtype storage at every rounding point of a contract)
    # vs float64 math with no rounding (contract="exact" and float64 oracles). About four
    # roundings, each of relative error ≤ u (bf16 u = 2^-8, f16 u = 2^-11), feed GEMM2, so the
    # output error is a few u times the size of GEMM2's terms. Measured on O(1) data (10 seeds,
    # both contracts): bf16 max |err| 2.3e-2, NMSE 2e-5; f16 max |err| 3e-3, NMSE 3e-7. The rows
    # keep ≥ 2× margin elementwise and ≥ 3× on NMSE. f32 pipelines use the "f32" bound.
    "bf16_vs_exact": Tolerance(atol=5e-2, rtol=5e-2, nmse=1e-4),
    "f16_vs_exact": Tolerance(atol=1e-2, rtol=1e-2, nmse=1e-6),
    "f32_vs_exact": Tolerance(atol=1e-5, rtol=1e-5),
    # Benchmark peer checks (python -m moecore bench): a contract that quantizes activations
    # (per-token-group fp8 e4m3, per-token int8; nvfp4 e2m1 16-blocks) vs a PyTorch peer on the
    # same dequantized weights with unquantized bf16/fp32 activations. The difference is the
    # activation rounding of both GEMM inputs: e4m3 has unit roundoff u = 2^-4, so each operand
    # adds relative noise of variance ≈ u²/3 ≈ 1.3e-3 (int8 per-token: ≈ 1e-4); e2m1 has u = 2^-2
    # (≈ 2e-2 per operand). Measured (three shapes up to H = 2880, M ∈ {1, 7, 64}):
    # fp8 NMSE ≤ 2.3e-3, max |err| 6.5e-2; int8 NMSE ≤ 6.5e-4, max |err| 7.5e-2; nvfp4 NMSE
    # ≤ 3.5e-2, max |err| 0.35 (outputs of magnitude ≤ 2.3). The rows keep ≥ 2× margin
    # elementwise and ≥ 3× on NMSE; a wrong scale or layout gives NMSE ≈ 1.
    "peer_w8a8_act": Tolerance(atol=0.15, rtol=0.15, nmse=1e-2),
    "peer_nvfp4_act": Tolerance(atol=0.7, rtol=0.7, nmse=0.1),
    # float64 computations of the same math by two independent implementations (reference
    # self-checks against torch in float64): only summation order differs.
    "f64": Tolerance(atol=1e-12, rtol=1e-12),
    # routing: weights to 1e-6 (ids are compared exactly, separately).
    "routing_weights": Tolerance(atol=1e-6, rtol=1e-6),
    # sglang's test_cutedsl_moe.py v1 checks (test_v1_masked_kernel_*): the kernel's weighted
    # sum vs a float reference of dequantized FP4 operands, assert_close(atol=5e-2, rtol=5e-2);
    # the R4 test needs the same bound to show that v2-layout weights fail it.
    "sglang_cutedsl_v1": Tolerance(atol=5e-2, rtol=5e-2),
    # sglang's test_v2_ep_sharded_allreduce: Σ of the EP ranks' bf16 partial outputs vs the
    # full-expert bf16 output within 1e-2 (each side rounded to bf16 once per rank).
    "sglang_cutedsl_ep_sum": Tolerance(atol=1e-2, rtol=1e-2),
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
    aliases = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64"}
    name = aliases.get(name, name)
    return tolerance(name)
