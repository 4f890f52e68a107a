"""moecore.testing itself: the asserts fail when they should (tolerance, NMSE, NaN/Inf, shape,
bitwise), the data generators are seeded and typed for the API, and the test parameters come
from the registries. Oracle: hand-built arrays with known differences, and the registries.
"""

from __future__ import annotations

import numpy as np
import pytest

import moecore
from moecore.testing import (
    TOLERANCES,
    assert_bitwise_equal,
    assert_close,
    make_moe_problem,
    tolerance_for_dtype,
)
from moecore.testing.params import (
    isa_levels,
    path_params,
    quant_info_class,
    runner_backends,
    runner_paths,
)


def test_assert_close_passes_within_and_fails_outside_tolerance():
    e = np.linspace(-2.0, 2.0, 101).astype(np.float32)
    assert_close(e + np.float32(5e-6), e, "f32")
    with pytest.raises(AssertionError, match=r"NMSE=.*max abs error=.*cosine="):
        assert_close(e + np.float32(1e-4), e, "f32")


def test_assert_close_enforces_nmse():
    """Every element within atol/rtol, but a systematic 0.9 % bias breaks the bf16 NMSE bound."""
    e = np.ones(1000)
    assert_close(e * 1.002, e, "bf16")
    with pytest.raises(AssertionError, match="NMSE above bound"):
        assert_close(e * 1.009, e, "bf16")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_assert_close_rejects_non_finite(bad):
    e = np.ones((4, 4), np.float32)
    a = e.copy()
    a[2, 3] = bad
    with pytest.raises(AssertionError, match=r"non-finite values in actual.*\(2, 3\)"):
        assert_close(a, e, "bf16")
    with pytest.raises(AssertionError, match="non-finite"):
        assert_close(e, a, "bf16")
    assert_close(a, a, "f32", allow_nonfinite=True)


def test_assert_close_rejects_shape_mismatch():
    with pytest.raises(AssertionError, match="shape"):
        assert_close(np.zeros((2, 3)), np.zeros((3, 2)), "f32")


def test_assert_bitwise_equal():
    a = np.array([0.0, 1.0, 2.0], np.float32)
    assert_bitwise_equal(a, a.copy())
    with pytest.raises(AssertionError, match="not bitwise equal"):
        assert_bitwise_equal(a, -a)  # +0 vs -0 differ in bits
    with pytest.raises(AssertionError, match="dtype/shape"):
        assert_bitwise_equal(a, a.astype(np.float64))
    with pytest.raises(AssertionError, match="not bitwise equal"):
        assert_close(a, np.nextafter(a, np.float32(3)), "bitwise")


def test_tolerance_table_rows():
    assert TOLERANCES["f32"].atol == TOLERANCES["f32"].rtol == 1e-5
    assert (TOLERANCES["bf16"].atol, TOLERANCES["bf16"].rtol, TOLERANCES["bf16"].nmse) == (
        1e-2, 1e-2, 1e-5)
    assert TOLERANCES["routing_weights"].atol == 1e-6
    assert TOLERANCES["bitwise"].bitwise
    assert tolerance_for_dtype(np.float16) is TOLERANCES["f16"]
    with pytest.raises(KeyError, match="no tolerance row"):
        assert_close(np.zeros(1), np.zeros(1), "f8")


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_make_moe_problem_is_seeded_and_typed(dtype):
    a = make_moe_problem(np.random.default_rng(7), T=5, E=4, H=24, I=8, k=2, dtype=dtype,
                         bias=True, bias_dtype="f32")
    b = make_moe_problem(np.random.default_rng(7), T=5, E=4, H=24, I=8, k=2, dtype=dtype,
                         bias=True, bias_dtype="f32")
    want = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[dtype]
    for name in ("x", "w13", "w2"):
        assert getattr(a, name).dtype.name == want
        assert_bitwise_equal(getattr(a, name), getattr(b, name), what=name)
    assert a.w13.shape == (4, 16, 24) and a.w2.shape == (4, 24, 8)
    assert a.b13.dtype == np.float32 and a.b13.shape == (4, 16) and a.b2.shape == (4, 24)
    assert a.topk_ids.dtype == np.int32 and a.topk_weights.dtype == np.float32
    assert all(len(set(row)) == 2 for row in a.topk_ids.tolist())  # distinct experts
    np.testing.assert_allclose(a.topk_weights.sum(axis=1), 1.0, rtol=1e-6)


def test_paths_come_from_the_registries():
    """Every backend with an unquantized QuantInfo class appears once per registered way to
    run it (other tests may register Python-only backends; those have no QuantInfo here)."""
    ids = {p.id for p in runner_paths()}
    backends = runner_backends()
    assert {"triton", "torch_native"} <= set(backends)  # the two built-in unquantized cores
    for a2a, backend, _ in moecore.registered_fused_funcs():
        if a2a == "none" and backend in backends:
            assert f"{backend}-fused" in ids
    for backend in backends:
        assert f"{backend}-unfused" in ids
    assert quant_info_class("torch_native") is moecore.TorchNativeMoeQuantInfo
    assert isa_levels() == list(moecore.available_isa_levels())
    assert "scalar" in isa_levels()
    params = path_params(runner_paths()[:1], ["bf16"], isa_levels()[:1])
    assert params[0].id == f"{runner_paths()[0].id}-bf16-{isa_levels()[0]}"
