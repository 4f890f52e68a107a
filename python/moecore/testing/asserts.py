"""Comparison asserts for moecore's tests: tolerance checks that report NMSE, max abs error and
cosine, reject NaN/Inf produced from finite inputs, and bitwise equality.
"""

from __future__ import annotations

import numpy as np

from .tolerances import Tolerance, tolerance

__all__ = ["assert_close", "assert_bitwise_equal", "error_stats", "is_close"]


def _as_f64(a) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype == np.float64:
        return a
    if a.dtype.kind in "fV" or a.dtype.name == "bfloat16":
        return a.astype(np.float32).astype(np.float64)
    return a.astype(np.float64)


def error_stats(actual, expected) -> dict:
    """NMSE Σ(a−e)²/Σe², max abs error (and where), max relative error and cosine similarity."""
    a, e = _as_f64(actual), _as_f64(expected)
    stats = {"shape": a.shape, "nmse": 0.0, "max_abs": 0.0, "argmax_abs": None, "max_rel": 0.0,
             "cosine": 1.0}
    if a.size == 0:
        return stats
    with np.errstate(all="ignore"):  # inf − inf and 0/0 are handled below, not warned about
        return _fill_stats(stats, a, e)


def _fill_stats(stats: dict, a: np.ndarray, e: np.ndarray) -> dict:
    finite = np.isfinite(a) & np.isfinite(e)
    diff = np.where(finite, np.abs(a - e), np.inf)
    idx = np.unravel_index(int(np.argmax(diff)), diff.shape)
    energy = float(np.sum(np.where(finite, e, 0.0) ** 2))
    err = float(np.sum(np.where(finite, diff, 0.0) ** 2))
    stats["max_abs"] = float(diff[idx])
    stats["argmax_abs"] = tuple(int(i) for i in idx)
    stats["nmse"] = err / energy if energy > 0 else (0.0 if err == 0 else float("inf"))
    rel = np.where(e != 0, diff / np.abs(e), np.where(diff == 0, 0.0, np.inf))
    rel = np.where(finite, rel, np.inf)
    stats["max_rel"] = float(np.max(rel))
    na = float(np.linalg.norm(np.where(finite, a, 0.0)))
    ne = float(np.linalg.norm(np.where(finite, e, 0.0)))
    if na == 0 and ne == 0:
        stats["cosine"] = 1.0
    elif na == 0 or ne == 0:
        stats["cosine"] = 0.0
    else:
        stats["cosine"] = float(np.sum(np.where(finite, a * e, 0.0)) / (na * ne))
    return stats


def _describe(stats, tol: Tolerance, what: str, extra: str = "") -> str:
    where = stats["argmax_abs"]
    return (
        f"{what}: {extra}NMSE={stats['nmse']:.3e}, max abs error={stats['max_abs']:.3e}"
        f" at {where}, max rel error={stats['max_rel']:.3e}, cosine={stats['cosine']:.9f}"
        f" (shape {stats['shape']}; tolerance atol={tol.atol:g}, rtol={tol.rtol:g}, "
        f"nmse={tol.nmse})"
    )


def is_close(actual, expected, kind) -> bool:
    """Whether assert_close(actual, expected, kind) would pass."""
    try:
        assert_close(actual, expected, kind)
    except AssertionError:
        return False
    return True


def assert_close(actual, expected, kind, *, what: str = "output", allow_nonfinite: bool = False):
    """Asserts actual ≈ expected under the tolerance row `kind` (a key of TOLERANCES, or a
    Tolerance). Fails on a shape mismatch, on NaN/Inf in `actual` (or in `expected`, which
    must come from finite inputs too) unless allow_nonfinite, on any element with
    |a − e| > atol + rtol·|e|, and on NMSE above the row's bound. The message reports NMSE,
    max abs error (with its index), max relative error and cosine."""
    tol = tolerance(kind)
    if tol.bitwise:
        assert_bitwise_equal(actual, expected, what=what)
        return
    a, e = _as_f64(actual), _as_f64(expected)
    if a.shape != e.shape:
        raise AssertionError(f"{what}: shape {a.shape} != expected shape {e.shape}")
    stats = error_stats(a, e)
    if not allow_nonfinite:
        bad_a, bad_e = ~np.isfinite(a), ~np.isfinite(e)
        if bad_a.any() or bad_e.any():
            side = "actual" if bad_a.any() else "expected"
            first = tuple(int(i) for i in np.argwhere(bad_a if bad_a.any() else bad_e)[0])
            raise AssertionError(
                _describe(stats, tol, what, f"{int(bad_a.sum())} non-finite values in actual, "
                          f"{int(bad_e.sum())} in expected (first in {side} at {first}); ")
            )
    else:
        same = (np.isnan(a) == np.isnan(e)) & (np.isinf(a) == np.isinf(e))
        same &= ~np.isinf(a) | (a == e)
        if not same.all():
            raise AssertionError(_describe(stats, tol, what, "non-finite values differ; "))
    if a.size == 0:
        return
    finite = np.isfinite(a) & np.isfinite(e)
    with np.errstate(all="ignore"):
        excess = np.where(finite, np.abs(a - e) - (tol.atol + tol.rtol * np.abs(e)), 0.0)
    n_bad = int(np.sum(excess > 0))
    if n_bad:
        raise AssertionError(
            _describe(stats, tol, what, f"{n_bad} of {a.size} elements out of tolerance; ")
        )
    if tol.nmse is not None and stats["nmse"] > tol.nmse:
        raise AssertionError(_describe(stats, tol, what, "NMSE above bound; "))


def assert_bitwise_equal(actual, expected, *, what: str = "output"):
    """Asserts identical dtype, shape and bytes (so +0/−0 and NaN payloads count)."""
    a, e = np.asarray(actual), np.asarray(expected)
    if a.dtype != e.dtype or a.shape != e.shape:
        raise AssertionError(
            f"{what}: dtype/shape {a.dtype}{list(a.shape)} != expected {e.dtype}{list(e.shape)}"
        )
    ab = np.ascontiguousarray(a).view(np.uint8).reshape(a.shape + (-1,)) if a.size else a
    eb = np.ascontiguousarray(e).view(np.uint8).reshape(e.shape + (-1,)) if e.size else e
    if a.size == 0 or np.array_equal(ab, eb):
        return
    differ = np.any(ab != eb, axis=-1)
    first = tuple(int(i) for i in np.argwhere(differ)[0])
    stats = error_stats(a, e) if a.dtype.kind == "f" or a.dtype.name == "bfloat16" else None
    detail = (
        f", max abs difference={stats['max_abs']:.3e} at {stats['argmax_abs']}" if stats else ""
    )
    raise AssertionError(
        f"{what}: not bitwise equal: {int(differ.sum())} of {differ.size} elements differ, "
        f"first at {first} ({a[first]!r} vs {e[first]!r}){detail}"
    )


# ISA levels whose kernels add every dot in the canonical order of kernels/gemm.h: their results
# are bitwise equal. avx512_bf16 and amx multiply bf16-exact operands in their instructions' own
# order: deterministic, but equal to the canonical levels only within tolerance.
CANONICAL_ORDER_LEVELS = ("scalar", "avx2", "avx512")


def assert_isa_levels_agree(actual, actual_level: str, expected, expected_level: str, kind, *,
                            what: str = "output"):
    """The same run at two ISA levels: bitwise equal when both levels share the canonical order,
    else within ``kind``'s tolerance."""
    if actual_level in CANONICAL_ORDER_LEVELS and expected_level in CANONICAL_ORDER_LEVELS:
        assert_bitwise_equal(actual, expected, what=what)
    else:
        assert_close(actual, expected, kind, what=f"{what} ({actual_level} vs {expected_level})")
