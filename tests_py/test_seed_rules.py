"""The seed-PR rules of spec/sglang-moe-architecture.md §9 that apply to the unquantized stage,
one named test (or parametrised family) per rule: R1 fused-only backends, R2 duplicate
registration, R3 fused-func precedence and the forced permute path (including Python-registered
fused funcs, permutes and runner cores sharing one running_state), R9 empty input, R14 standard
dispatcher local ids and expert-parallel sums, R15 activation guards, R16 top_k = 1 with a routed
scaling factor.

R4–R8 and R10–R13 concern CuteDSL, DeepEP, DeepGEMM, MXFP4 and FlashInfer paths that moecore
does not execute yet; R17 (backend swap after construction) is in test_registry.py.
"""

from __future__ import annotations

import re

import ml_dtypes
import moecore
import numpy as np
import pytest

T, H, I, E, K = 7, 32, 16, 6, 2
FP32_TOL = 1e-5  # TESTING.md: fp32 atol = rtol = 1e-5

EXECUTABLE = ["triton", "torch_native"]


def _problem(seed, t=T, h=H, i=I, e=E, k=K, dtype=np.float32, gated=True):
    rng = np.random.default_rng(seed)
    n1 = 2 * i if gated else i
    return {
        "x": rng.standard_normal((t, h)).astype(dtype),
        "w13": (rng.standard_normal((e, n1, h)) * 0.2).astype(dtype),
        "w2": (rng.standard_normal((e, h, i)) * 0.2).astype(dtype),
        "ids": np.stack([rng.permutation(e)[:k] for _ in range(t)]).astype(np.int32).reshape(t, k),
        "wts": rng.random((t, k)).astype(np.float32),
    }


def _quant(backend, p):
    cls = (
        moecore.TorchNativeMoeQuantInfo if backend == "torch_native" else moecore.TritonMoeQuantInfo
    )
    return cls(w13_weight=p["w13"], w2_weight=p["w2"])


def _dispatch(x, ids, wts):
    return moecore.StandardDispatchOutput(x, topk_output=moecore.StandardTopKOutput(wts, ids))


def _run(backend, p, x=None, ids=None, wts=None, a2a=None, **cfg):
    cfg.setdefault("inplace", False)
    runner = moecore.MoeRunner(backend, moecore.MoeRunnerConfig(**cfg), a2a_backend=a2a)
    x = p["x"] if x is None else x
    ids = p["ids"] if ids is None else ids
    wts = p["wts"] if wts is None else wts
    return runner.run(_dispatch(x, ids, wts), _quant(backend, p)).hidden_states


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


def _assert_bitwise(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert np.array_equal(_bits(a), _bits(b)), (
        f"max diff {np.abs(a.astype(np.float64) - b.astype(np.float64)).max()}"
    )


# ---------------------------------------------------------------------------------------------
# R1


FUSED_ONLY = [b.value for b in moecore.MoeRunnerBackend if b.is_fused_only()]


@pytest.mark.parametrize("a2a", ["deepep", "none", "megamoe"])
@pytest.mark.parametrize("backend", FUSED_ONLY)
def test_R1_fused_only_backend_without_fused_func(backend, a2a):
    if moecore.get_fused_func(a2a, backend):
        pytest.skip(f"a fused func is registered for ({a2a}, {backend})")
    member = moecore.MoeRunnerBackend(backend).name
    expected = (
        f"Runner backend MoeRunnerBackend.{member} requires a fused func for a2a backend "
        f"{a2a}, but none is registered."
    )
    with pytest.raises(moecore.UnsupportedError, match="^" + re.escape(expected) + "$") as info:
        moecore.MoeRunner(backend, moecore.MoeRunnerConfig(), a2a_backend=a2a)
    assert isinstance(info.value, NotImplementedError)
    # The process-wide a2a backend (sglang's get_moe_a2a_backend()) gives the same answer.
    with (
        moecore.moe_backend_context(a2a_backend=a2a),
        pytest.raises(NotImplementedError, match="^" + re.escape(expected) + "$"),
    ):
        moecore.MoeRunner(backend, moecore.MoeRunnerConfig())


def test_R1_marlin_deepep_exact_sglang_text():
    with pytest.raises(NotImplementedError) as info:
        moecore.MoeRunner(
            moecore.MoeRunnerBackend.MARLIN, moecore.MoeRunnerConfig(), a2a_backend="deepep"
        )
    assert str(info.value) == (
        "Runner backend MoeRunnerBackend.MARLIN requires a fused func for a2a "
        "backend deepep, but none is registered."
    )


def _non_executable_non_fused_only():
    cores = {b for b, _ in moecore.registered_runner_cores()}
    return [
        b.value
        for b in moecore.MoeRunnerBackend
        if not b.is_fused_only() and b.value not in cores and b.value != "auto"
    ]


@pytest.mark.parametrize("backend", _non_executable_non_fused_only())
def test_R1_backend_without_core(backend):
    if backend in {b for b, _ in moecore.registered_runner_cores()}:
        pytest.skip(f"a runner core for {backend} was registered by another test")
    member = moecore.MoeRunnerBackend(backend).name
    with pytest.raises(
        moecore.UnsupportedError,
        match="^" + re.escape(f"Unsupported runner backend: MoeRunnerBackend.{member}"),
    ):
        moecore.MoeRunner(backend, moecore.MoeRunnerConfig())


def test_R1_deep_gemm_text():
    if "deep_gemm" in {b for b, _ in moecore.registered_runner_cores()}:
        pytest.skip("deep_gemm has a runner core in this build")
    with pytest.raises(
        NotImplementedError,
        match="^" + re.escape("Unsupported runner backend: MoeRunnerBackend.DEEP_GEMM"),
    ):
        moecore.MoeRunner("deep_gemm", moecore.MoeRunnerConfig())


def test_R1_fused_only_backend_with_a_registered_fused_func_builds_for_that_a2a_only():
    calls = []

    def marlin_deepep(dispatch_output, quant_info, config):
        calls.append(quant_info)
        return moecore.StandardCombineInput(dispatch_output.hidden_states)

    moecore.register_fused_func("deepep", "marlin", marlin_deepep)
    try:
        runner = moecore.MoeRunner(
            "marlin", moecore.MoeRunnerConfig(inplace=False), a2a_backend="deepep"
        )
        assert runner.uses_fused_func and not runner.has_runner_core
        p = _problem(1)
        token = object()
        out = runner.run(_dispatch(p["x"], p["ids"], p["wts"]), token)
        assert calls == [token]
        assert np.shares_memory(out.hidden_states, p["x"])
        with pytest.raises(
            NotImplementedError, match="for a2a backend none, but none is registered"
        ):
            moecore.MoeRunner("marlin", moecore.MoeRunnerConfig(), a2a_backend="none")
        # Disabling fused funcs cannot work for a backend that has nothing else.
        with pytest.raises(moecore.UnsupportedError, match="is fused-only"):
            moecore.MoeRunner(
                "marlin", moecore.MoeRunnerConfig(force_unfused=True), a2a_backend="deepep"
            )
    finally:
        assert moecore.unregister_fused_func("deepep", "marlin")


# ---------------------------------------------------------------------------------------------
# R2


def _noop(*args):
    raise AssertionError("never called")


def test_R2_duplicate_registration():
    # Fused func: twice under a new key, and over a built-in key.
    moecore.register_fused_func("flashinfer", "torch_native", _noop)
    try:
        with pytest.raises(
            moecore.InvalidArgumentError,
            match="^"
            + re.escape("Fused function for flashinfer to torch_native is already registered.")
            + "$",
        ) as info:
            moecore.register_fused_func("flashinfer", "torch_native", lambda *a: None)
        assert isinstance(info.value, ValueError)
    finally:
        assert moecore.unregister_fused_func("flashinfer", "torch_native") is True
    assert moecore.unregister_fused_func("flashinfer", "torch_native") is False
    with pytest.raises(
        ValueError,
        match="^" + re.escape("Fused function for none to triton is already registered.") + "$",
    ):
        moecore.register_fused_func("none", "triton", _noop)
    with pytest.raises(
        ValueError,
        match="^"
        + re.escape("Fused function for none to torch_native is already registered.")
        + "$",
    ):
        moecore.register_fused_func(
            moecore.MoeA2ABackend.NONE, moecore.MoeRunnerBackend.TORCH_NATIVE, _noop
        )

    # Pre-permute.
    moecore.register_pre_permute("deepep_ll", "triton", _noop)
    try:
        with pytest.raises(
            ValueError,
            match="^"
            + re.escape("Pre-permute method for deepep_ll to triton is already registered.")
            + "$",
        ):
            moecore.register_pre_permute("deepep_ll", "triton", _noop)
    finally:
        assert moecore.unregister_pre_permute("deepep_ll", "triton")
    with pytest.raises(
        ValueError,
        match="^"
        + re.escape("Pre-permute method for standard to triton is already registered.")
        + "$",
    ):
        moecore.register_pre_permute("standard", "triton", _noop)

    # Post-permute.
    moecore.register_post_permute("triton", "deepep_ll", _noop)
    try:
        with pytest.raises(
            ValueError,
            match="^"
            + re.escape("Post-permute method for triton to deepep_ll is already registered.")
            + "$",
        ):
            moecore.register_post_permute("triton", "deepep_ll", _noop)
    finally:
        assert moecore.unregister_post_permute("triton", "deepep_ll")
    with pytest.raises(
        ValueError,
        match="^"
        + re.escape("Post-permute method for torch_native to standard is already registered.")
        + "$",
    ):
        moecore.register_post_permute("torch_native", "standard", _noop)

    # The built-ins are untouched by the failed registrations.
    keys = {(a, r) for a, r, _ in moecore.registered_fused_funcs()}
    assert {("none", "triton"), ("none", "torch_native")} <= keys
    assert ("flashinfer", "torch_native") not in keys
    origins = {(a, r): o for a, r, o in moecore.registered_fused_funcs()}
    assert not origins[("none", "triton")].startswith("python:")


def test_R2_unregistered_permute_is_an_assertion():
    class DeepEPLLOutput:
        format = moecore.DispatchOutputFormat.DEEPEP_LL

    runner = moecore.MoeRunner(
        "torch_native", moecore.MoeRunnerConfig(inplace=False, force_unfused=True)
    )
    with pytest.raises(
        AssertionError,
        match="^"
        + re.escape("Pre-permute function for deepep_ll to torch_native is not registered")
        + "$",
    ):
        runner.run(DeepEPLLOutput(), _quant("torch_native", _problem(0)))


# ---------------------------------------------------------------------------------------------
# R3


@pytest.mark.parametrize("backend", EXECUTABLE)
def test_R3_fused_func_precedence_and_forced_permute_path(backend, monkeypatch):
    p = _problem(3)
    monkeypatch.delenv("SGLANG_CI_DISABLE_MOE_FUSED_FUNC", raising=False)
    fused = moecore.MoeRunner(backend, moecore.MoeRunnerConfig(inplace=False))
    forced = moecore.MoeRunner(backend, moecore.MoeRunnerConfig(inplace=False, force_unfused=True))
    assert fused.uses_fused_func is True and fused.has_runner_core is True
    assert forced.uses_fused_func is False and forced.has_runner_core is True
    monkeypatch.setenv("SGLANG_CI_DISABLE_MOE_FUSED_FUNC", "1")
    by_env = moecore.MoeRunner(backend, moecore.MoeRunnerConfig(inplace=False))
    assert by_env.uses_fused_func is False
    monkeypatch.setenv("SGLANG_CI_DISABLE_MOE_FUSED_FUNC", "0")
    assert (
        moecore.MoeRunner(backend, moecore.MoeRunnerConfig(inplace=False)).uses_fused_func is True
    )
    monkeypatch.delenv("SGLANG_CI_DISABLE_MOE_FUSED_FUNC")
    # The flag is read at construction: a built runner keeps its choice.
    assert by_env.uses_fused_func is False

    q = _quant(backend, p)
    d = _dispatch(p["x"], p["ids"], p["wts"])
    a = fused.run(d, q).hidden_states
    _assert_bitwise(a, forced.run(d, q).hidden_states)
    _assert_bitwise(a, by_env.run(d, q).hidden_states)
    assert np.isfinite(a).all() and np.abs(a).max() > 0


def test_R3_python_fused_func_takes_precedence():
    p = _problem(4)
    seen = []

    def flashinfer_triton(dispatch_output, quant_info, config):
        seen.append(
            (
                dispatch_output.format,
                type(quant_info).__name__,
                config.inplace,
                config.routed_scaling_factor,
            )
        )
        return moecore.StandardCombineInput(np.full((T, H), 7.0, np.float32))

    before = moecore.MoeRunner(
        "triton", moecore.MoeRunnerConfig(inplace=False), a2a_backend="flashinfer"
    )
    assert before.uses_fused_func is False  # no fused func for (flashinfer, triton): permutes
    moecore.register_fused_func("flashinfer", "triton", flashinfer_triton)
    try:
        assert moecore.get_fused_func("flashinfer", "triton") is not None
        runner = moecore.MoeRunner(
            "triton",
            moecore.MoeRunnerConfig(inplace=False, routed_scaling_factor=1.5),
            a2a_backend="flashinfer",
        )
        assert runner.uses_fused_func is True
        assert runner.a2a_backend is moecore.MoeA2ABackend.FLASHINFER
        out = runner.run(_dispatch(p["x"], p["ids"], p["wts"]), _quant("triton", p))
        assert seen == [(moecore.DispatchOutputFormat.STANDARD, "TritonMoeQuantInfo", False, 1.5)]
        assert np.array_equal(out.hidden_states, np.full((T, H), 7.0, np.float32))
        # A runner built before the registration keeps the permute path (resolved at
        # construction, like sglang's fused func).
        _assert_bitwise(
            before.run(_dispatch(p["x"], p["ids"], p["wts"]), _quant("triton", p)).hidden_states,
            _run("triton", p),
        )
        # force_unfused skips it.
        forced = moecore.MoeRunner(
            "triton",
            moecore.MoeRunnerConfig(inplace=False, force_unfused=True),
            a2a_backend="flashinfer",
        )
        assert forced.uses_fused_func is False
        forced.run(_dispatch(p["x"], p["ids"], p["wts"]), _quant("triton", p))
        assert len(seen) == 1
    finally:
        assert moecore.unregister_fused_func("flashinfer", "triton")
    assert (
        moecore.MoeRunner(
            "triton", moecore.MoeRunnerConfig(), a2a_backend="flashinfer"
        ).uses_fused_func
        is False
    )


def test_R3_python_fused_func_exception_reaches_caller():
    class Boom(Exception):
        pass

    def failing(dispatch_output, quant_info, config):
        raise Boom("from the fused func")

    moecore.register_fused_func("customized", "triton", failing)
    try:
        runner = moecore.MoeRunner(
            "triton", moecore.MoeRunnerConfig(inplace=False), a2a_backend="customized"
        )
        p = _problem(5)
        with pytest.raises(Boom, match="from the fused func"):
            runner.run(_dispatch(p["x"], p["ids"], p["wts"]), _quant("triton", p))
    finally:
        moecore.unregister_fused_func("customized", "triton")


# A Python runner core for "aiter": the registry has no unregister for cores, so it is registered
# once per process (origin "python:...", which test_registry allows).
_AITER_LOG: list = []


class _PythonAiterCore:
    def __init__(self, config):
        self.config = config

    def run(self, runner_input, quant_info, running_state):
        _AITER_LOG.append(("core", sorted(running_state)))
        assert running_state["pre"] == "sorted"
        x, ids, _wts = runner_input
        w13, w2 = quant_info
        running_state["core"] = True
        # A tiny dense reference: per (token, slot) SwiGLU expert output.
        out = np.zeros(ids.shape + (x.shape[1],), np.float32)
        for t in range(ids.shape[0]):
            for j in range(ids.shape[1]):
                e = ids[t, j]
                if e < 0:
                    continue
                h = w13[e] @ x[t]
                g, u = h[: h.size // 2], h[h.size // 2 :]
                out[t, j] = w2[e] @ (g / (1 + np.exp(-g)) * u)
        return out


def _ensure_python_aiter_core():
    if not any(b == "aiter" for b, _ in moecore.registered_runner_cores()):
        moecore.register_runner_core("aiter", _PythonAiterCore)


def test_R3_python_permutes_and_runner_core(monkeypatch):
    monkeypatch.delenv("SGLANG_CI_DISABLE_MOE_FUSED_FUNC", raising=False)
    _ensure_python_aiter_core()
    _AITER_LOG.clear()

    def pre(dispatch_output, quant_info, config, running_state):
        _AITER_LOG.append(("pre", sorted(running_state)))
        running_state["pre"] = "sorted"
        t = dispatch_output.topk_output
        return (dispatch_output.hidden_states, t.topk_ids, t.topk_weights)

    def post(runner_output, quant_info, config, running_state):
        _AITER_LOG.append(("post", sorted(running_state)))
        assert running_state["core"] is True
        return moecore.StandardCombineInput(runner_output.sum(axis=1).astype(np.float32))

    moecore.register_pre_permute("standard", "aiter", pre)
    moecore.register_post_permute("aiter", "standard", post)
    try:
        runner = moecore.MoeRunner("aiter", moecore.MoeRunnerConfig(inplace=False))
        assert runner.uses_fused_func is False and runner.has_runner_core is True
        assert runner.runner_backend is moecore.MoeRunnerBackend.AITER
        p = _problem(6)
        wts = np.ones_like(p["wts"])
        out = runner.run(_dispatch(p["x"], p["ids"], wts), (p["w13"], p["w2"])).hidden_states
        assert _AITER_LOG == [("pre", []), ("core", ["pre"]), ("post", ["core", "pre"])]
        # Same as moecore's torch_native runner with unit weights (fp32 tolerance).
        ref = _run("torch_native", p, wts=wts)
        np.testing.assert_allclose(out, ref, atol=FP32_TOL, rtol=FP32_TOL)
        # Each run gets a fresh running_state.
        _AITER_LOG.clear()
        runner.run(_dispatch(p["x"], p["ids"], wts), (p["w13"], p["w2"]))
        assert _AITER_LOG[0] == ("pre", [])
    finally:
        moecore.unregister_pre_permute("standard", "aiter")
        moecore.unregister_post_permute("aiter", "standard")


def test_R3_missing_permute_for_dispatch_format():
    class DeepEPLLOutput:
        format = moecore.DispatchOutputFormat.DEEPEP_LL

    p = _problem(7)
    runner = moecore.MoeRunner("triton", moecore.MoeRunnerConfig(inplace=False, force_unfused=True))
    with pytest.raises(
        moecore.ContractAssertionError,
        match="^"
        + re.escape("Pre-permute function for deepep_ll to triton is not registered")
        + "$",
    ) as info:
        runner.run(DeepEPLLOutput(), _quant("triton", p))
    assert isinstance(info.value, AssertionError)

    # Pre registered but no post: the post lookup fails before the pre runs.
    calls = []

    class DeepEPNormalOutput:
        format = "deepep_normal"

    moecore.register_pre_permute("deepep_normal", "triton", lambda *a: calls.append(a))
    try:
        runner = moecore.MoeRunner(
            "triton", moecore.MoeRunnerConfig(inplace=False, force_unfused=True)
        )
        with pytest.raises(
            AssertionError,
            match="^"
            + re.escape("Post-permute function for triton to deepep_normal is not registered")
            + "$",
        ):
            runner.run(DeepEPNormalOutput(), _quant("triton", p))
        assert calls == []
    finally:
        moecore.unregister_pre_permute("deepep_normal", "triton")


# ---------------------------------------------------------------------------------------------
# R9

DTYPES = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}
OUTPUT_MODES = {
    "out-of-place": {"inplace": False},
    "inplace": {"inplace": True},
    "no-combine": {"inplace": False, "no_combine": True},
}


@pytest.mark.parametrize("mode", list(OUTPUT_MODES))
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("backend", EXECUTABLE)
def test_R9_empty_input(backend, dtype, fused, mode):
    p = _problem(9, dtype=DTYPES[dtype])
    x = p["x"][:0]  # [0, H], a view with ordinary strides
    ids, wts = p["ids"][:0], p["wts"][:0]
    cfg = dict(OUTPUT_MODES[mode], force_unfused=not fused)
    runner = moecore.MoeRunner(backend, moecore.MoeRunnerConfig(**cfg))
    assert runner.uses_fused_func is fused
    out = runner.run(_dispatch(x, ids, wts), _quant(backend, p)).hidden_states
    expected_shape = (0, K, H) if mode == "no-combine" else (0, H)
    assert out.shape == expected_shape
    assert out.dtype == np.dtype(DTYPES[dtype])


@pytest.mark.parametrize("make", ["np.empty", "np.zeros"])
@pytest.mark.parametrize("backend", EXECUTABLE)
def test_R9_empty_input_fresh_arrays(backend, make):
    """numpy ≥ 2 gives fresh zero-size arrays all-zero strides; they are still valid [0, H]
    inputs."""
    p = _problem(9)
    alloc = getattr(np, make.split(".")[1])
    x = alloc((0, H), np.float32)
    ids, wts = alloc((0, K), np.int32), alloc((0, K), np.float32)
    out = (
        moecore.MoeRunner(backend, moecore.MoeRunnerConfig(inplace=False))
        .run(_dispatch(x, ids, wts), _quant(backend, p))
        .hidden_states
    )
    assert out.shape == (0, H) and out.dtype == np.float32


def test_R9_empty_input_through_layer_and_dispatcher():
    layer = moecore.FusedMoE(
        num_experts=E + 1,
        hidden_size=H,
        intermediate_size=I,
        topk_config=moecore.TopKConfig(top_k=3, num_fused_shared_experts=1),
        params_dtype="f32",
        ep_size=2,
        ep_rank=1,
    )
    layer.process_weights_after_loading()
    x = np.ones((3, H), np.float32)[:0]
    logits = np.ones((3, E), np.float32)[:0]
    out = layer.forward(x, logits)
    assert out.shape == (0, H) and out.dtype == np.float32
    d = layer.dispatcher.dispatch(
        x,
        moecore.StandardTopKOutput(np.ones((1, 3), np.float32)[:0], np.ones((1, 3), np.int32)[:0]),
    )
    assert d.topk_output.topk_ids.shape == (0, 3)


# ---------------------------------------------------------------------------------------------
# R14


def _expected_mapping(num_experts, shared, ep_size, rank):
    routed = num_experts - shared
    local = routed // ep_size
    m = np.full(num_experts, -1, np.int32)
    m[rank * local : (rank + 1) * local] = np.arange(local)
    if shared:
        m[-shared:] = np.arange(local, local + shared)
    return m


@pytest.mark.parametrize("shared", [0, 1, 2])
@pytest.mark.parametrize("ep_size", [2, 4])
def test_R14_standard_dispatcher_local_ids(ep_size, shared):
    routed = 8
    num_experts = routed + shared
    rng = np.random.default_rng(14)
    ids = rng.integers(-1, num_experts, (11, 3)).astype(np.int32)
    ids[0, 0] = -1  # −1 must stay −1, not map[-1] (the last, possibly shared, expert)
    ids[1, :] = num_experts - 1
    x = rng.standard_normal((11, H)).astype(np.float32)
    wts = rng.random((11, 3)).astype(np.float32)
    for rank in range(ep_size):
        disp = moecore.StandardDispatcher(
            num_experts, ep_size=ep_size, ep_rank=rank, num_fused_shared_experts=shared
        )
        expected_map = _expected_mapping(num_experts, shared, ep_size, rank)
        assert np.array_equal(disp.local_expert_mapping, expected_map)
        assert disp.num_local_experts == routed // ep_size + shared
        for id_dtype in (np.int32, np.int64):
            out = disp.dispatch(x, moecore.StandardTopKOutput(wts, ids.astype(id_dtype)))
            local = out.topk_output.topk_ids
            want = np.where(ids < 0, -1, expected_map[np.maximum(ids, 0)])
            assert np.array_equal(local, want)
            assert local[0, 0] == -1
            assert np.shares_memory(out.hidden_states, x)
            assert np.array_equal(out.topk_output.topk_weights, wts)


def test_R14_ep_size_one_keeps_global_ids():
    disp = moecore.StandardDispatcher(8)
    assert disp.local_expert_mapping is None
    ids = np.array([[0, 7, -1]], np.int32)
    out = disp.dispatch(
        np.zeros((1, 4), np.float32), moecore.StandardTopKOutput(np.ones((1, 3), np.float32), ids)
    )
    assert np.array_equal(out.topk_output.topk_ids, ids)


def test_R14_global_id_backends_skip_the_mapping():
    disp = moecore.StandardDispatcher(8, ep_size=2, ep_rank=1, runner_backend="flashinfer_cutlass")
    assert disp.local_expert_mapping is None


@pytest.mark.parametrize("backend", EXECUTABLE)
def test_R14_minus_one_contributes_zero(backend):
    """A slot with id −1 gives the same output, bit for bit, as the problem without that slot."""
    p = _problem(15, k=3)
    ids = p["ids"].copy()
    ids[::2, 1] = -1
    full = _run(backend, p, ids=ids)
    rows = slice(0, None, 2)
    without = _run(
        backend,
        p,
        x=p["x"][rows].copy(),
        ids=np.ascontiguousarray(ids[rows][:, [0, 2]]),
        wts=np.ascontiguousarray(p["wts"][rows][:, [0, 2]]),
    )
    _assert_bitwise(full[rows], without)
    all_minus_one = _run(backend, p, ids=np.full_like(ids, -1))
    assert not all_minus_one.any()


def _ep_layer(num_routed, shared, ep_size, ep_rank, weights, topk_config, backend):
    layer = moecore.FusedMoE(
        num_experts=num_routed + shared,
        hidden_size=H,
        intermediate_size=I,
        topk_config=topk_config,
        params_dtype="f32",
        ep_size=ep_size,
        ep_rank=ep_rank,
        runner_backend=backend,
    )
    w1, w3, w2 = weights
    for e in range(num_routed + shared):
        if e >= num_routed and ep_rank != 0:
            continue  # the shared expert's output is counted once: on rank 0
        loaded = [
            layer.weight_loader("w13_weight", w1[e], "experts.w1", "w1", e),
            layer.weight_loader("w13_weight", w3[e], "experts.w3", "w3", e),
            layer.weight_loader("w2_weight", w2[e], "experts.w2", "w2", e),
        ]
        owner = e >= num_routed or e // (num_routed // ep_size) == ep_rank
        assert loaded == [owner] * 3
    layer.process_weights_after_loading()
    return layer


@pytest.mark.parametrize("backend", EXECUTABLE)
@pytest.mark.parametrize("shared", [0, 1])
@pytest.mark.parametrize("ep_size", [2, 4])
def test_R14_ep_slices_sum_to_full_layer(ep_size, shared, backend):
    num_routed = 8
    rng = np.random.default_rng(140 + ep_size + shared)
    n = num_routed + shared
    weights = (
        (rng.standard_normal((n, I, H)) * 0.2).astype(np.float32),
        (rng.standard_normal((n, I, H)) * 0.2).astype(np.float32),
        (rng.standard_normal((n, H, I)) * 0.2).astype(np.float32),
    )
    cfg = moecore.TopKConfig(
        top_k=2 + shared,
        num_fused_shared_experts=shared,
        routed_scaling_factor=2.0 if shared else None,
    )
    x = rng.standard_normal((13, H)).astype(np.float32)
    logits = rng.standard_normal((13, num_routed)).astype(np.float32)
    full = _ep_layer(num_routed, shared, 1, 0, weights, cfg, backend).forward(x, logits)
    parts = [
        _ep_layer(num_routed, shared, ep_size, r, weights, cfg, backend).forward(x, logits)
        for r in range(ep_size)
    ]
    total = np.sum(parts, axis=0, dtype=np.float32)
    np.testing.assert_allclose(total, full, atol=FP32_TOL, rtol=FP32_TOL)
    assert np.abs(full).max() > 0.1
    for part in parts:  # every rank contributes something somewhere, and not everything
        assert not np.allclose(part, full)


# ---------------------------------------------------------------------------------------------
# R15


R15_CASES = [
    pytest.param(
        {"activation": "swiglu_oops"},
        moecore.InvalidArgumentError,
        "^" + re.escape("Unsupported activation: activation='swiglu_oops'") + "$",
        id="unknown-activation",
    ),
    pytest.param(
        {"activation": "gelu", "gemm1_alpha": 1.702, "gemm1_clamp_limit": 7.0},
        moecore.InvalidArgumentError,
        re.escape("gemm1_alpha is not supported for gelu"),
        id="alpha-with-gelu",
    ),
    pytest.param(
        {"activation": "gelu", "gemm1_clamp_limit": 7.0},
        moecore.InvalidArgumentError,
        re.escape("gemm1_clamp_limit is not supported for gelu"),
        id="limit-with-gelu",
    ),
    pytest.param(
        {"gemm1_alpha": 1.702},
        moecore.InvalidArgumentError,
        re.escape("gemm1_clamp_limit is required when gemm1_alpha is set"),
        id="alpha-without-limit",
    ),
    pytest.param(
        {"no_combine": True, "inplace": True},
        moecore.InvalidArgumentError,
        re.escape("no_combine requires inplace=False"),
        id="no-combine-inplace",
    ),
]


@pytest.mark.parametrize("backend", EXECUTABLE)
@pytest.mark.parametrize("cfg, exc, pattern", R15_CASES)
def test_R15_activation_guards(backend, cfg, exc, pattern):
    with pytest.raises(exc, match=pattern):
        runner = moecore.MoeRunner(backend, moecore.MoeRunnerConfig(**cfg))
        # Built (no guard fired) and kept the configuration it was given.
        assert runner.runner_backend.value == backend
        for name, value in cfg.items():
            assert getattr(runner.config, name) == pytest.approx(value)
    with pytest.raises(exc, match=pattern):
        moecore.FusedMoE(
            num_experts=E,
            hidden_size=H,
            intermediate_size=I,
            topk_config=moecore.TopKConfig(top_k=K),
            params_dtype="f32",
            runner_backend=backend,
            runner_config=moecore.MoeRunnerConfig(**cfg),
        )


def test_R15_torch_native_rejects_apply_router_weight_on_input():
    with pytest.raises(moecore.UnsupportedError, match="apply_router_weight_on_input") as info:
        moecore.MoeRunner(
            "torch_native", moecore.MoeRunnerConfig(apply_router_weight_on_input=True)
        )
    assert isinstance(info.value, NotImplementedError)


def test_R15_triton_router_weight_on_input_needs_top1():
    p = _problem(16, k=2)
    with pytest.raises(
        ValueError,
        match="^"
        + re.escape("Only support topk=1 when `apply_router_weight_on_input` is True")
        + "$",
    ):
        _run("triton", p, apply_router_weight_on_input=True)
    p1 = _problem(16, k=1)
    out = _run("triton", p1, apply_router_weight_on_input=True)
    assert out.shape == (T, H) and np.isfinite(out).all()


@pytest.mark.parametrize("backend", EXECUTABLE)
def test_R15_valid_activations_build(backend):
    for cfg in (
        {},
        {"activation": "gelu"},
        {"activation": "gelu_tanh"},
        {"activation": "relu2", "is_gated": False},
        {"activation": "silu", "is_gated": False},
        {"gemm1_alpha": 1.702, "gemm1_clamp_limit": 7.0},
        {"no_combine": True, "inplace": False},
    ):
        runner = moecore.MoeRunner(backend, moecore.MoeRunnerConfig(**cfg))
        # Built (no guard fired) and kept the configuration it was given.
        assert runner.runner_backend.value == backend
        for name, value in cfg.items():
            assert getattr(runner.config, name) == pytest.approx(value)


# ---------------------------------------------------------------------------------------------
# R16


def _dyadic_problem(seed, dtype, t=9, h=8, i=4, e=3):
    """Inputs whose whole expert computation is exact in fp32 and bf16 (relu2, values in
    {-1, 0, 1}·2^-j, router weights powers of two), so the only rounding left is the final one."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-1, 2, (t, h)).astype(np.float32)
    w13 = rng.integers(-1, 2, (e, i, h)).astype(np.float32) * 0.5
    w2 = rng.integers(-1, 2, (e, h, i)).astype(np.float32) * 0.5
    ids = rng.integers(0, e, (t, 1)).astype(np.int32)
    wts = rng.choice(np.array([0.25, 0.5, 1.0], np.float32), (t, 1))
    return {
        "x": x.astype(dtype),
        "w13": w13.astype(dtype),
        "w2": w2.astype(dtype),
        "ids": ids,
        "wts": wts,
        "f32": (x, w13, w2),
    }


def _relu2_expert_out(x, w13, w2, ids):
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        e = ids[t, 0]
        h = np.maximum(w13[e] @ x[t], 0.0) ** 2
        out[t] = w2[e] @ h
    return out


@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "inplace"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("backend", EXECUTABLE)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_R16_topk1_routed_scaling(dtype, backend, fused, inplace):
    rsf = 2.5
    p = _dyadic_problem(16, DTYPES[dtype])
    x32, w13_32, w2_32 = p["f32"]
    expert_out = _relu2_expert_out(x32, w13_32, w2_32, p["ids"])
    expected = (np.float32(rsf) * p["wts"] * expert_out).astype(np.float32).astype(DTYPES[dtype])
    x = p["x"].copy()
    cfg = {
        "activation": "relu2",
        "is_gated": False,
        "routed_scaling_factor": rsf,
        "inplace": inplace,
        "force_unfused": not fused,
    }
    runner = moecore.MoeRunner(backend, moecore.MoeRunnerConfig(**cfg))
    q = moecore.TorchNativeMoeQuantInfo if backend == "torch_native" else moecore.TritonMoeQuantInfo
    q = q(w13_weight=p["w13"], w2_weight=p["w2"])
    out = runner.run(_dispatch(x, p["ids"], p["wts"]), q).hidden_states
    _assert_bitwise(out, expected)
    assert np.abs(expected.astype(np.float32)).max() > 1.0  # the data is not trivially zero
    # Repeated runs give the same bits (no uninitialised buffer is summed).
    again = runner.run(_dispatch(p["x"].copy(), p["ids"], p["wts"]), q).hidden_states
    _assert_bitwise(again, expected)


@pytest.mark.parametrize("rsf", [None, 1.0, 2.5])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("backend", EXECUTABLE)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_R16_topk1_equals_topk2_with_minus_one(dtype, backend, fused, rsf):
    p = _problem(161, k=1, dtype=DTYPES[dtype])
    ids2 = np.concatenate([p["ids"], np.full((T, 1), -1, np.int32)], axis=1)
    wts2 = np.concatenate([p["wts"], np.full((T, 1), 0.37, np.float32)], axis=1)
    cfg = {"routed_scaling_factor": rsf, "force_unfused": not fused}
    one = _run(backend, p, **cfg)
    two = _run(backend, p, ids=ids2, wts=wts2, **cfg)
    _assert_bitwise(one, two)
    if rsf == 2.5:
        base = _run(backend, p, routed_scaling_factor=1.0, force_unfused=not fused)
        scaled = base.astype(np.float32) * np.float32(2.5)
        tol = FP32_TOL if dtype == "f32" else 1e-2
        np.testing.assert_allclose(one.astype(np.float32), scaled, atol=tol, rtol=tol)
