"""Expert compute of every executable runner path vs the numpy reference.

Oracle: ``moecore.reference.fused_moe_ref(..., contract=<backend>)``, which implements the
backend's numeric contract with the same rounding points (itself checked against torch in
test_reference_moe.py). Paths come from the registries (each runner backend, fused and
forced-unfused), ISA levels from ``available_isa_levels()``; tolerances from the one table in
``moecore.testing``. Also bitwise: across ISA levels and thread counts, fused vs unfused, and
batch invariance (a token alone vs in batches of 2, 7, 64).
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest

import moecore
from moecore.reference import fused_moe_ref
from moecore.testing import (
    assert_bitwise_equal,
    assert_close,
    assert_isa_levels_agree,
    is_close,
    make_moe_problem,
)
from moecore.testing.params import DTYPES, isa_levels, path_params, runner_paths

PATHS = runner_paths()
ISAS = isa_levels()
BEST_ISA = moecore.detected_isa_level()

# (activation, is_gated) with readable ids.
ACTIVATIONS = [
    pytest.param("silu", True, id="silu-gated"),
    pytest.param("gelu", True, id="gelu-gated"),
    pytest.param("gelu_tanh", True, id="gelu_tanh-gated"),
    pytest.param("silu", False, id="silu-plain"),
    pytest.param("gelu", False, id="gelu-plain"),
    pytest.param("relu2", False, id="relu2-plain"),
]

# (T, E, k, H, I): every T of TESTING.md, E ∈ {1, 4, 8}, k ∈ {1, 2, 4}, H/I both multiples of
# 16 and not (the kernels' 16-lane tails).
SHAPES = [
    pytest.param(0, 4, 2, 40, 24, id="T0-E4-k2-H40-I24"),
    pytest.param(1, 1, 1, 40, 24, id="T1-E1-k1-H40-I24"),
    pytest.param(2, 4, 4, 32, 16, id="T2-E4-k4-H32-I16"),
    pytest.param(3, 8, 1, 17, 9, id="T3-E8-k1-H17-I9"),
    pytest.param(7, 8, 4, 40, 24, id="T7-E8-k4-H40-I24"),
    pytest.param(64, 8, 2, 64, 48, id="T64-E8-k2-H64-I48"),
    pytest.param(513, 4, 2, 40, 24, id="T513-E4-k2-H40-I24"),
]

RUNNER_KEYS = ("activation", "gemm1_alpha", "gemm1_clamp_limit", "gemm1_beta", "swiglu_limit",
               "apply_router_weight_on_input", "routed_scaling_factor", "no_combine")


@pytest.fixture
def num_threads():
    """Sets moecore's thread count for a test and restores it afterwards."""
    previous = moecore.get_num_threads()
    yield moecore.set_num_threads
    moecore.set_num_threads(previous)


def _seed(*parts) -> int:
    """A stable seed per test case (Python's hash() is salted per process)."""
    return zlib.crc32("-".join(str(p) for p in parts).encode())


def run_moe(path, problem, *, isa=None, x=None, topk_weights=None, topk_ids=None, **opts):
    """Runs `problem` on `path` with MoeRunnerConfig(is_gated=problem.gated, **opts)."""
    runner = path.runner(is_gated=problem.gated, isa_level=isa, **opts)
    topk = moecore.StandardTopKOutput(
        problem.topk_weights if topk_weights is None else topk_weights,
        problem.topk_ids if topk_ids is None else topk_ids,
    )
    dispatch = moecore.StandardDispatchOutput(problem.x if x is None else x, topk_output=topk)
    return runner.run(dispatch, path.quant_info(**problem.quant_info_kwargs())).hidden_states


def reference(path, problem, **opts):
    kwargs = problem.ref_kwargs()
    kwargs.update({k: v for k, v in opts.items() if k in RUNNER_KEYS})
    return fused_moe_ref(contract=path.backend, **kwargs)


def check_against_reference(path, problem, *, isa=None, **opts):
    """moecore's output has the input dtype and the right shape and is close to the reference
    under the dtype's tolerance row. Returns (out, ref)."""
    out = run_moe(path, problem, isa=isa, **opts)
    ref = reference(path, problem, **opts)
    k = problem.top_k
    shape = (problem.num_tokens, k, problem.x.shape[1]) if opts.get("no_combine") else (
        problem.num_tokens, problem.x.shape[1])
    assert out.shape == shape, f"output shape {out.shape}, expected {shape}"
    assert out.dtype == problem.x.dtype, f"output dtype {out.dtype}, expected {problem.x.dtype}"
    assert_close(out, ref, problem.dtype, what=f"{path.id} {problem.dtype} {opts}")
    return out, ref


# --------------------------------------------------------------------------------------------
# Against the reference
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("activation,gated", ACTIVATIONS)
@pytest.mark.parametrize("path,dtype,isa", path_params(PATHS, DTYPES, ISAS))
def test_activation(path, dtype, isa, activation, gated):
    rng = np.random.default_rng(_seed("act", dtype, activation, gated))
    p = make_moe_problem(rng, T=64, E=8, H=40, I=24, k=2, dtype=dtype, gated=gated)
    check_against_reference(path, p, isa=isa, activation=activation)


@pytest.mark.parametrize("T,E,k,H,I", SHAPES)
@pytest.mark.parametrize("path,dtype,isa", path_params(PATHS, DTYPES, ISAS))
def test_shapes(path, dtype, isa, T, E, k, H, I):  # noqa: E741
    rng = np.random.default_rng(_seed("shape", dtype, T, E, k, H, I))
    p = make_moe_problem(rng, T=T, E=E, H=H, I=I, k=k, dtype=dtype)
    check_against_reference(path, p, isa=isa)


@pytest.mark.parametrize("bias_dtype", ["f32", "act"])
@pytest.mark.parametrize("activation,gated", ACTIVATIONS[:1] + ACTIVATIONS[-1:])
@pytest.mark.parametrize("path,dtype", path_params(PATHS, DTYPES))
def test_bias(path, dtype, activation, gated, bias_dtype):
    rng = np.random.default_rng(_seed("bias", dtype, activation, bias_dtype))
    p = make_moe_problem(rng, T=7, E=4, H=40, I=24, k=2, dtype=dtype, gated=gated, bias=True,
                         bias_dtype=dtype if bias_dtype == "act" else "f32")
    _, ref = check_against_reference(path, p, isa=BEST_ISA, activation=activation)
    unbiased = reference(path, dataclasses.replace(p, b13=None, b2=None), activation=activation)
    assert not is_close(ref, unbiased, dtype), "biases did not change the reference"


# The clamp options need GEMM1 values beyond the limit: scale 4 gives |h1| up to ~15; a small W2
# keeps GEMM2's terms from cancelling at that size.
CLAMPS = [
    pytest.param(dict(gemm1_alpha=1.702, gemm1_clamp_limit=7.0), False, id="gptoss"),
    pytest.param(dict(gemm1_alpha=1.702, gemm1_clamp_limit=7.0, gemm1_beta=0.5), True,
                 id="gptoss-beta-bias"),
    pytest.param(dict(gemm1_alpha=1.0, gemm1_clamp_limit=2.0, gemm1_beta=0.0), False,
                 id="gptoss-beta0"),
    pytest.param(dict(swiglu_limit=3.0), False, id="swiglu_limit"),
    pytest.param(dict(swiglu_limit=1.0), True, id="swiglu_limit-bias"),
]


@pytest.mark.parametrize("opts,bias", CLAMPS)
@pytest.mark.parametrize("path,dtype", path_params(PATHS, DTYPES))
def test_clamped_swiglu(path, dtype, opts, bias):
    rng = np.random.default_rng(_seed("clamp", dtype, sorted(opts.items()), bias))
    p = make_moe_problem(rng, T=64, E=4, H=40, I=24, k=2, dtype=dtype, bias=bias, scale=4.0,
                         w2_scale=0.25)
    _, ref = check_against_reference(path, p, isa=BEST_ISA, **opts)
    plain = reference(path, p)
    assert not is_close(ref, plain, dtype), "the clamp did not change the reference"


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("path,dtype", path_params(PATHS, DTYPES))
def test_routed_scaling_factor_applied_once(path, dtype, k):
    rng = np.random.default_rng(_seed("rsf", dtype, k))
    p = make_moe_problem(rng, T=7, E=8, H=40, I=24, k=k, dtype=dtype)
    rsf = 2.5
    out, _ = check_against_reference(path, p, isa=BEST_ISA, routed_scaling_factor=rsf)
    unscaled = reference(path, p)
    # Exactly once: rsf × the unscaled reference, not 1× and not rsf²×.
    assert_close(out, rsf * unscaled.astype(np.float64), dtype, what="out vs rsf·ref(no rsf)")
    assert not is_close(out, unscaled, dtype)
    assert not is_close(out, rsf * rsf * unscaled.astype(np.float64), dtype)


@pytest.mark.parametrize("rsf", [None, 2.5], ids=["no_rsf", "rsf"])
@pytest.mark.parametrize("path,dtype", path_params(PATHS, DTYPES))
def test_no_combine(path, dtype, rsf):
    """[T, k, H] per-slot outputs, weighted by the routed weight, without rsf (spec §7.1)."""
    rng = np.random.default_rng(_seed("nocombine", dtype))
    p = make_moe_problem(rng, T=7, E=4, H=40, I=24, k=2, dtype=dtype)
    p.topk_ids[3, 1] = -1
    out, _ = check_against_reference(path, p, isa=BEST_ISA, no_combine=True,
                                      routed_scaling_factor=rsf)
    assert not np.any(out[3, 1].astype(np.float32)), "a slot with id -1 must be zero"
    summed = out.astype(np.float64).sum(axis=1)
    combined = run_moe(path, p, isa=BEST_ISA)
    assert_close(summed, combined, dtype, what="sum over slots vs combined output")


@pytest.mark.parametrize("path,dtype", path_params(PATHS, DTYPES))
def test_invalid_ids_contribute_nothing(path, dtype):
    rng = np.random.default_rng(_seed("ids-1", dtype))
    p = make_moe_problem(rng, T=7, E=8, H=40, I=24, k=4, dtype=dtype)
    p.topk_ids[0, :] = -1  # a token with no expert at all
    p.topk_ids[2, 1] = -1
    p.topk_ids[5, 3] = -1
    out, _ = check_against_reference(path, p, isa=BEST_ISA)
    assert not np.any(out[0].astype(np.float32)), "a token routed nowhere must give zeros"
    # Same as dropping the slot: weight 0 on any valid id gives the same result.
    dropped = p.topk_ids.copy()
    weights = p.topk_weights.copy()
    for t, j in [(0, 0), (0, 1), (0, 2), (0, 3), (2, 1), (5, 3)]:
        dropped[t, j] = 0
        weights[t, j] = 0.0
    p_zero = p.with_routing(weights, dropped)
    assert_close(out, reference(path, p_zero), dtype, what="ids -1 vs zero-weight slots")


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("path,dtype", path_params(PATHS, DTYPES))
def test_apply_router_weight_on_input(path, dtype, bias):
    """top_k = 1; the reference says which contracts reject it (torch_native, as sglang)."""
    rng = np.random.default_rng(_seed("awoi", dtype, bias))
    p = make_moe_problem(rng, T=7, E=4, H=40, I=24, k=1, dtype=dtype, bias=bias)
    p.topk_weights[:] = rng.uniform(0.2, 0.9, size=p.topk_weights.shape).astype(np.float32)
    try:
        reference(path, p, apply_router_weight_on_input=True)
    except NotImplementedError:
        with pytest.raises(moecore.UnsupportedError, match="apply_router_weight_on_input"):
            run_moe(path, p, isa=BEST_ISA, apply_router_weight_on_input=True)
        return
    _, ref = check_against_reference(path, p, isa=BEST_ISA, apply_router_weight_on_input=True)
    if bias:  # with biases, weighting GEMM1's output differs from weighting the expert output
        assert not is_close(ref, reference(path, p), dtype)


@pytest.mark.parametrize("layout", ["cols", "rows"], ids=["big[:,:H]", "big[::2]"])
@pytest.mark.parametrize("path,dtype", path_params(PATHS, DTYPES))
def test_strided_hidden_states(path, dtype, layout):
    rng = np.random.default_rng(_seed("strided", dtype, layout))
    p = make_moe_problem(rng, T=7, E=4, H=40, I=24, k=2, dtype=dtype)
    if layout == "cols":
        big = np.zeros((7, 56), dtype=p.x.dtype)
        big[:, :40] = p.x
        x = big[:, :40]
    else:
        big = np.zeros((14, 40), dtype=p.x.dtype)
        big[::2] = p.x
        x = big[::2]
    assert not x.flags.c_contiguous
    before = big.copy()
    out = run_moe(path, p, isa=BEST_ISA, x=x)
    assert_bitwise_equal(big, before, what="hidden_states storage (inplace=False)")
    assert_close(out, reference(path, p), dtype)
    assert_bitwise_equal(out, run_moe(path, p, isa=BEST_ISA), what="strided vs contiguous")


# --------------------------------------------------------------------------------------------
# Bitwise determinism and parity
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("H,I", [(40, 24), (64, 48)], ids=["H40-I24", "H64-I48"])
@pytest.mark.parametrize("path,dtype", path_params(PATHS, DTYPES))
def test_isa_levels_and_threads_bitwise(path, dtype, H, I, num_threads):  # noqa: E741
    """Every ISA level × threads {1, 2} matches the reference; each level is bitwise equal across
    threads and runs, and the canonical-order levels are bitwise equal to each other."""
    rng = np.random.default_rng(_seed("isa", dtype, H))
    p = make_moe_problem(rng, T=64, E=8, H=H, I=I, k=2, dtype=dtype, bias=True)
    ref = reference(path, p)
    first = None
    for isa in ISAS:
        level_first = None
        for n in (1, 2):
            num_threads(n)
            assert moecore.get_num_threads() == n
            out = run_moe(path, p, isa=isa)
            assert_close(out, ref, dtype, what=f"isa={isa} threads={n}")
            if level_first is None:
                level_first = out
            else:
                assert_bitwise_equal(out, level_first, what=f"isa={isa} threads={n} vs threads=1")
            assert_bitwise_equal(run_moe(path, p, isa=isa), out, what="repeated run")
        if first is None:
            first = (level_first, isa)
        else:
            assert_isa_levels_agree(level_first, isa, first[0], first[1], dtype)
        with moecore.isa_level(isa):  # the process-wide level, read when the runner is built
            assert_bitwise_equal(run_moe(path, p), level_first, what=f"moecore.isa_level({isa!r})")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", sorted({p.backend for p in PATHS}))
def test_fused_equals_unfused_bitwise(backend, dtype, isa):
    paths = {p.fused: p for p in PATHS if p.backend == backend}
    if len(paths) < 2:
        pytest.skip(f"{backend} has only one registered path")
    rng = np.random.default_rng(_seed("fused", dtype, isa))
    p = make_moe_problem(rng, T=64, E=8, H=40, I=24, k=4, dtype=dtype, bias=True)
    p.topk_ids[1, 2] = -1
    for opts in ({}, {"routed_scaling_factor": 1.75}, {"no_combine": True}):
        fused = run_moe(paths[True], p, isa=isa, **opts)
        unfused = run_moe(paths[False], p, isa=isa, **opts)
        assert_bitwise_equal(fused, unfused, what=f"{backend} fused vs unfused {opts}")


@pytest.mark.parametrize("path,dtype", path_params(PATHS, DTYPES))
def test_batch_invariance_bitwise(path, dtype):
    """A token's output does not depend on which other tokens share its batch."""
    rng = np.random.default_rng(_seed("batch", dtype))
    p = make_moe_problem(rng, T=64, E=8, H=40, I=24, k=2, dtype=dtype, bias=True)
    full = run_moe(path, p, isa=BEST_ISA)
    assert_close(full, reference(path, p), dtype)

    def sub(rows):
        q = p.with_routing(p.topk_weights[rows], p.topk_ids[rows]).with_x(p.x[rows])
        return run_moe(path, q, isa=BEST_ISA)

    for b in (2, 7):
        rows = np.arange(b)
        assert_bitwise_equal(sub(rows), full[rows], what=f"batch of {b} vs batch of 64")
    for t in (0, 5, 63):
        assert_bitwise_equal(sub(np.array([t])), full[t:t + 1], what=f"token {t} alone vs 64")
    shuffled = rng.permutation(64)[:7]
    assert_bitwise_equal(sub(shuffled), full[shuffled], what="7 shuffled tokens vs 64")
