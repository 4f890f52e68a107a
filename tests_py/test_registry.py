"""The registries and the enum vocabulary.

What the compiled core registers at import (fused funcs, pre/post permutes, runner cores) must
equal an expected table; extra entries are allowed only when they come from Python (origin
"python:..."; other tests register temporarily). Each built-in entry's origin is its backend file,
and that file's opener names the keys it registers (STYLE.md). The enums must equal the member
tables of spec/sglang-moe-architecture.md §2 (written out here: this is the expected table), with
sglang's predicates. moe_backend_context must restore the process-wide backends even when its
block raises, and a runner or layer built inside it keeps what it was built with (R17).
"""

from __future__ import annotations

import pathlib
import re

import moecore
import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------------------------
# Expected registry (this build: the unquantized triton and torch_native backends)

EXPECTED_FUSED = {("none", "triton"), ("none", "torch_native"),
                  ("none", "flashinfer_cutlass"), ("flashinfer", "flashinfer_cutlass"),
                  ("none", "flashinfer_cutedsl"), ("flashinfer", "flashinfer_cutedsl"),
                  ("deepep", "flashinfer_cutedsl"), ("none", "flashinfer_mxfp4")}
EXPECTED_PRE = {("standard", "triton"), ("standard", "torch_native"), ("standard", "deep_gemm"),
                ("deepep_ll", "deep_gemm"), ("deepep_normal", "deep_gemm")}
EXPECTED_POST = {("triton", "standard"), ("torch_native", "standard"), ("deep_gemm", "standard"),
                 ("deep_gemm", "deepep_ll"), ("deep_gemm", "deepep_normal")}
EXPECTED_CORES = {"triton", "torch_native", "deep_gemm"}
ORIGIN_FILE = {
    "triton": "cpp/moecore/runner/backends/triton.cpp",
    "torch_native": "cpp/moecore/runner/backends/torch_native.cpp",
    "flashinfer_cutlass": "cpp/moecore/runner/backends/flashinfer_cutlass.cpp",
    "flashinfer_cutedsl": "cpp/moecore/runner/backends/flashinfer_cutedsl.cpp",
    "flashinfer_mxfp4": "cpp/moecore/runner/backends/flashinfer_mxfp4.cpp",
    "deep_gemm": "cpp/moecore/runner/backends/deep_gemm.cpp",
}


def _split(entries, key_len):
    """(built-in keys → origin, python entries) from [(key..., origin)]."""
    builtin, python = {}, []
    for entry in entries:
        key, origin = tuple(entry[:key_len]), entry[key_len]
        if origin.startswith("python:"):
            python.append(entry)
        else:
            builtin[key if key_len > 1 else key[0]] = origin
    return builtin, python


@pytest.mark.parametrize(
    "name, listing, key_len, expected, runner_pos",
    [
        ("fused", moecore.registered_fused_funcs, 2, EXPECTED_FUSED, 1),
        ("pre-permute", moecore.registered_pre_permutes, 2, EXPECTED_PRE, 1),
        ("post-permute", moecore.registered_post_permutes, 2, EXPECTED_POST, 0),
        ("runner-core", moecore.registered_runner_cores, 1, EXPECTED_CORES, None),
    ],
)
def test_registered_keys_equal_expected_table(name, listing, key_len, expected, runner_pos):
    builtin, python = _split(listing(), key_len)
    assert set(builtin) == expected, f"{name}: built-in keys differ from the expected table"
    for key, origin in builtin.items():
        runner = key if runner_pos is None else key[runner_pos]
        assert origin == ORIGIN_FILE[runner], f"{name} {key}: origin {origin!r}"
    for entry in python:  # only temporary registrations by tests, never over a built-in key
        key = tuple(entry[:key_len]) if key_len > 1 else entry[0]
        assert key not in expected


def test_backend_file_opener_names_its_keys():
    """Each backend file's opening comment lists what it registers (STYLE.md)."""
    for runner, rel in ORIGIN_FILE.items():
        opener = " ".join(
            line.lstrip("/ ").strip()
            for line in (REPO / rel).read_text().splitlines()[:12]
            if line.startswith("//")
        )
        opener = re.sub(r"\s+", " ", opener)
        if runner in EXPECTED_CORES:  # fused-only backends have no runner core
            assert f"runner core {runner.upper()}" in opener
        for a2a, r, origin in moecore.registered_fused_funcs():
            if origin == rel:
                assert f"fused func ({a2a}, {r})" in opener
        for fmt, r, origin in moecore.registered_pre_permutes():
            if origin == rel:
                assert f"pre-permute ({fmt}, {r})" in opener
        for r, fmt, origin in moecore.registered_post_permutes():
            if origin == rel:
                assert f"post-permute ({r}, {fmt})" in opener


def test_registration_errors_empty():
    assert moecore._moecore.registration_errors() == []


def test_get_fused_func_reflects_registry():
    assert moecore.get_fused_func("none", "triton") is not None
    assert (
        moecore.get_fused_func(moecore.MoeA2ABackend.NONE, moecore.MoeRunnerBackend.TORCH_NATIVE)
        is not None
    )
    assert moecore.get_fused_func("deepep", "triton") is None
    assert moecore.get_fused_func(None, "triton") is not None  # MoeA2ABackend(None) is NONE


def test_get_fused_func_is_callable_like_sglangs():
    """The returned callable runs the registered fused func: same bits as MoeRunner.run."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 16)).astype(np.float32)
    w13 = (rng.standard_normal((4, 16, 16)) * 0.2).astype(np.float32)
    w2 = (rng.standard_normal((4, 16, 8)) * 0.2).astype(np.float32)
    logits = rng.standard_normal((5, 4)).astype(np.float32)
    topk = moecore.select_experts(x, logits, moecore.TopKConfig(top_k=2))
    config = moecore.MoeRunnerConfig(inplace=False)
    dispatch = moecore.StandardDispatchOutput(x, topk_output=topk)
    info = moecore.TritonMoeQuantInfo(w13_weight=w13, w2_weight=w2)
    fused = moecore.get_fused_func("none", "triton")
    direct = fused(dispatch, info, config).hidden_states
    via_runner = moecore.MoeRunner("triton", config).run(dispatch, info).hidden_states
    assert np.array_equal(direct, via_runner)


def test_decorator_forms_return_the_function_unchanged():
    def fused(dispatch_output, quant_info, config):
        return moecore.StandardCombineInput(dispatch_output.hidden_states)

    def pre(d, q, c, s):
        return d

    def post(o, q, c, s):
        return o

    decorated = moecore.register_fused_func("customized", "torch_native")(fused)
    try:
        assert decorated is fused
        origins = {(a, r): o for a, r, o in moecore.registered_fused_funcs()}
        assert origins[("customized", "torch_native")] == f"python:{__name__}.{fused.__qualname__}"
        # Direct form returns the function too.
        assert moecore.register_pre_permute("flashinfer", "triton", pre) is pre
        assert moecore.register_post_permute("triton", "flashinfer")(post) is post
        assert ("flashinfer", "triton") in {(f, r) for f, r, _ in moecore.registered_pre_permutes()}
        assert ("triton", "flashinfer") in {
            (r, f) for r, f, _ in moecore.registered_post_permutes()
        }
    finally:
        assert moecore.unregister_fused_func("customized", "torch_native")
        moecore.unregister_pre_permute("flashinfer", "triton")
        moecore.unregister_post_permute("triton", "flashinfer")
    assert ("customized", "torch_native") not in {
        (a, r) for a, r, _ in moecore.registered_fused_funcs()
    }


# ---------------------------------------------------------------------------------------------
# Enums: spec §2 tables

SPEC_RUNNER_BACKENDS = {  # §2.1
    "AUTO": "auto",
    "DEEP_GEMM": "deep_gemm",
    "TRITON": "triton",
    "TRITON_KERNELS": "triton_kernel",
    "FLASHINFER_TRTLLM": "flashinfer_trtllm",
    "FLASHINFER_TRTLLM_ROUTED": "flashinfer_trtllm_routed",
    "FLASHINFER_CUTLASS": "flashinfer_cutlass",
    "FLASHINFER_MXFP4": "flashinfer_mxfp4",
    "FLASHINFER_CUTEDSL": "flashinfer_cutedsl",
    "CUTLASS": "cutlass",
    "MARLIN": "marlin",
    "AITER": "aiter",
}
# §2.1 "(newer) members seen in other versions"; where the spec gives no value, the value is the
# one in sglang's newer python/sglang/srt/layers/moe/utils.py (HPC_OPS "hpc_ops",
# EXPERIMENTAL_SGL_MARLIN, INTEL_XPU appear there too).
SPEC_RUNNER_BACKENDS_NEWER = {
    "HPC_OPS": "hpc_ops",
    "FLASHINFER_MEGAMOE": "flashinfer_megamoe",
    "EXPERIMENTAL_SGL_TRTLLM": "experimental_sgl_trtllm",
    "EXPERIMENTAL_SGL_MARLIN": "experimental_sgl_marlin",
    "ASCEND": "ascend",
    "HUMMING": "humming",
    "INTEL_XPU": "intel_xpu",
    "TORCH_NATIVE": "torch_native",
}
SPEC_A2A_BACKENDS = {  # §2.2
    "NONE": "none",
    "DEEPEP": "deepep",
    "MOONCAKE": "mooncake",
    "NIXL": "nixl",
    "MORI": "mori",
    "ASCEND_FUSEEP": "ascend_fuseep",
    "FLASHINFER": "flashinfer",
    "MEGAMOE": "megamoe",
    "CUSTOMIZED": "customized",
}
SPEC_DEEPEP_MODES = {"NORMAL": "normal", "LOW_LATENCY": "low_latency", "AUTO": "auto"}  # §2.3
SPEC_TOPK_FORMATS = {"STANDARD": 1, "TRITON_KERNEL": 2, "BYPASSED": 3}  # §2.5
SPEC_DISPATCH_FORMATS = {
    "STANDARD": "standard",
    "DEEPEP_NORMAL": "deepep_normal",
    "DEEPEP_LL": "deepep_ll",
}
SPEC_DISPATCH_FORMATS_NEWER = {"FLASHINFER": "flashinfer"}  # §2.6 (newer); value not in the spec
# §4.2: backends whose runner_core is None (MARLIN: unless LoRA).
SPEC_FUSED_ONLY = {
    "FLASHINFER_TRTLLM",
    "FLASHINFER_TRTLLM_ROUTED",
    "FLASHINFER_CUTEDSL",
    "FLASHINFER_CUTLASS",
    "FLASHINFER_MXFP4",
    "CUTLASS",
    "HPC_OPS",
    "MARLIN",
}
SPEC_WITH_CORE = {"AUTO", "DEEP_GEMM", "TRITON", "TRITON_KERNELS", "AITER", "TORCH_NATIVE"}


def _members(enum_cls):
    return {m.name: m.value for m in enum_cls}


@pytest.mark.parametrize(
    "enum_cls, expected",
    [
        (moecore.MoeRunnerBackend, {**SPEC_RUNNER_BACKENDS, **SPEC_RUNNER_BACKENDS_NEWER}),
        (moecore.MoeA2ABackend, SPEC_A2A_BACKENDS),
        (moecore.DeepEPMode, SPEC_DEEPEP_MODES),
        (moecore.TopKOutputFormat, SPEC_TOPK_FORMATS),
        (moecore.DispatchOutputFormat, {**SPEC_DISPATCH_FORMATS, **SPEC_DISPATCH_FORMATS_NEWER}),
        (moecore.CombineInputFormat, {**SPEC_DISPATCH_FORMATS, **SPEC_DISPATCH_FORMATS_NEWER}),
    ],
    ids=lambda v: getattr(v, "__name__", "table"),
)
def test_enum_members_equal_spec(enum_cls, expected):
    assert _members(enum_cls) == expected
    for name, value in expected.items():
        assert enum_cls(value) is enum_cls[name]


def test_spec_base_members_in_spec_order():
    names = [m.name for m in moecore.MoeRunnerBackend]
    assert [n for n in names if n in SPEC_RUNNER_BACKENDS] == list(SPEC_RUNNER_BACKENDS)
    assert [m.name for m in moecore.MoeA2ABackend] == list(SPEC_A2A_BACKENDS)
    assert [m.name for m in moecore.DeepEPMode] == list(SPEC_DEEPEP_MODES)


def test_topk_output_format_is_int_enum():
    assert moecore.TopKOutputFormat.BYPASSED == 3
    assert isinstance(moecore.TopKOutputFormat.STANDARD, int)


def test_fused_only_backends_match_spec():
    fused_only = {m.name for m in moecore.MoeRunnerBackend if m.is_fused_only()}
    assert SPEC_FUSED_ONLY <= fused_only
    assert not (SPEC_WITH_CORE & fused_only)


@pytest.mark.parametrize(
    "enum_cls",
    [
        moecore.MoeRunnerBackend,
        moecore.MoeA2ABackend,
        moecore.DeepEPMode,
        moecore.DispatchOutputFormat,
        moecore.CombineInputFormat,
        moecore.TopKOutputFormat,
    ],
    ids=lambda c: c.__name__,
)
def test_is_member_predicates(enum_cls):
    for member in enum_cls:
        for other in enum_cls:
            assert getattr(member, f"is_{other.name.lower()}")() is (member is other)


def test_named_predicates():
    B, A, M = moecore.MoeRunnerBackend, moecore.MoeA2ABackend, moecore.DeepEPMode
    assert B.TRITON.is_triton() and not B.TRITON.is_triton_kernels()
    assert B("triton_kernel").is_triton_kernels()
    assert B.FLASHINFER_CUTEDSL.is_flashinfer_cutedsl()
    assert A(None) is A.NONE and A.NONE.is_none()
    assert {a.name for a in A if a.supports_aiter()} == {
        "NONE",
        "DEEPEP",
        "MOONCAKE",
        "NIXL",
        "MORI",
    }
    assert {a.name for a in A if a.is_deepep_class_backend()} == {"DEEPEP", "MOONCAKE", "MORI"}
    assert M.AUTO.resolve(True) is M.NORMAL
    assert M.AUTO.resolve(False) is M.LOW_LATENCY
    assert M.NORMAL.resolve(False) is M.NORMAL
    assert M.LOW_LATENCY.resolve(True) is M.LOW_LATENCY
    assert [m.enable_normal() for m in (M.NORMAL, M.LOW_LATENCY, M.AUTO)] == [True, False, True]
    assert [m.enable_low_latency() for m in (M.NORMAL, M.LOW_LATENCY, M.AUTO)] == [
        False,
        True,
        True,
    ]
    D = moecore.DispatchOutputFormat
    assert [d.is_deepep() for d in D] == [d.name in ("DEEPEP_NORMAL", "DEEPEP_LL") for d in D]


def test_formats_of_bound_objects():
    x = np.zeros((2, 4), np.float32)
    topk = moecore.StandardTopKOutput(np.ones((2, 1), np.float32), np.zeros((2, 1), np.int32))
    assert topk.format is moecore.TopKOutputFormat.STANDARD
    assert (
        moecore.StandardDispatchOutput(x, topk_output=topk).format
        is moecore.DispatchOutputFormat.STANDARD
    )
    assert moecore.StandardCombineInput(x).format is moecore.CombineInputFormat.STANDARD


# ---------------------------------------------------------------------------------------------
# Process-wide backends and moe_backend_context (R17-style)


def _state():
    return (
        moecore.get_moe_a2a_backend(),
        moecore.get_moe_runner_backend(),
        moecore.get_deepep_mode(),
    )


def test_defaults():
    assert _state() == (
        moecore.MoeA2ABackend.NONE,
        moecore.MoeRunnerBackend.AUTO,
        moecore.DeepEPMode.AUTO,
    )


def test_moe_backend_context_sets_and_restores():
    before = _state()
    with moecore.moe_backend_context(
        a2a_backend="deepep", runner_backend="triton", deepep_mode="low_latency"
    ):
        assert _state() == (
            moecore.MoeA2ABackend.DEEPEP,
            moecore.MoeRunnerBackend.TRITON,
            moecore.DeepEPMode.LOW_LATENCY,
        )
        with moecore.moe_backend_context(a2a_backend=moecore.MoeA2ABackend.FLASHINFER):
            assert _state()[0] is moecore.MoeA2ABackend.FLASHINFER
            assert _state()[1] is moecore.MoeRunnerBackend.TRITON  # untouched
        assert _state()[0] is moecore.MoeA2ABackend.DEEPEP
    assert _state() == before


def test_moe_backend_context_restores_when_block_raises():
    before = _state()

    class Stop(Exception):
        pass

    with (
        pytest.raises(Stop),
        moecore.moe_backend_context(a2a_backend="mooncake", deepep_mode="normal"),
    ):
        assert _state()[0] is moecore.MoeA2ABackend.MOONCAKE
        raise Stop
    assert _state() == before
    # A bad value part-way through setting: what was set is restored too.
    with (
        pytest.raises(moecore.InvalidArgumentError),
        moecore.moe_backend_context(a2a_backend="deepep", runner_backend="bogus"),
    ):
        pass
    assert _state() == before


def test_runner_keeps_a2a_backend_built_in_context():
    """R17: what a runner resolves from the process-wide state is fixed at construction and
    survives a later swap (sglang's speculative-decoding backend swap)."""
    with moecore.moe_backend_context(a2a_backend="flashinfer"):
        runner = moecore.MoeRunner("triton", moecore.MoeRunnerConfig(inplace=False))
        assert runner.a2a_backend is moecore.MoeA2ABackend.FLASHINFER
        assert runner.uses_fused_func is False  # no (flashinfer, triton) fused func
    assert moecore.get_moe_a2a_backend() is moecore.MoeA2ABackend.NONE
    assert runner.a2a_backend is moecore.MoeA2ABackend.FLASHINFER
    assert runner.uses_fused_func is False
    outside = moecore.MoeRunner("triton", moecore.MoeRunnerConfig(inplace=False))
    assert outside.a2a_backend is moecore.MoeA2ABackend.NONE and outside.uses_fused_func is True
    # Both still compute the same thing (fused vs permute path).
    rng = np.random.default_rng(17)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    q = moecore.TritonMoeQuantInfo(
        w13_weight=rng.standard_normal((3, 8, 8)).astype(np.float32),
        w2_weight=rng.standard_normal((3, 8, 4)).astype(np.float32),
    )
    d = moecore.StandardDispatchOutput(
        x,
        topk_output=moecore.StandardTopKOutput(
            rng.random((4, 2)).astype(np.float32),
            np.array([[0, 1], [1, 2], [2, 0], [0, 2]], np.int32),
        ),
    )
    with moecore.moe_backend_context(a2a_backend="deepep"):
        assert np.array_equal(runner.run(d, q).hidden_states, outside.run(d, q).hidden_states)


def test_runner_fixes_its_gemm_kernel_when_built(monkeypatch):
    """MOECORE_AMX_FLOAT_TILES is read once, when a runner is built (amx_float_tiles None); the
    config names the kernel row its backends build with."""
    assert moecore.MoeRunnerConfig().amx_float_tiles is None
    monkeypatch.setenv("MOECORE_AMX_FLOAT_TILES", "1")
    runner = moecore.MoeRunner("triton", moecore.MoeRunnerConfig(inplace=False))
    monkeypatch.delenv("MOECORE_AMX_FLOAT_TILES")
    level = runner.config.isa_level
    assert runner.config.amx_float_tiles is True
    assert runner.config.gemm_kernel == ("amx_float_tiles" if level == "amx" else level)
    off = moecore.MoeRunner("triton", moecore.MoeRunnerConfig(amx_float_tiles=False))
    assert off.config.amx_float_tiles is False and off.config.gemm_kernel == level
    monkeypatch.setenv("MOECORE_AMX_FLOAT_TILES", "sometimes")
    with pytest.raises(moecore.InvalidArgumentError, match="MOECORE_AMX_FLOAT_TILES"):
        moecore.MoeRunner("triton", moecore.MoeRunnerConfig())
    assert runner.config.gemm_kernel == ("amx_float_tiles" if level == "amx" else level)


def test_layer_keeps_runner_backend_built_in_context():
    """A layer built under runner_backend='torch_native' keeps it when the runner is created
    after the context has exited; 'auto' layers resolve to triton."""
    cfg = moecore.TopKConfig(top_k=2)
    with moecore.moe_backend_context(runner_backend="torch_native"):
        layer = moecore.FusedMoE(
            num_experts=4, hidden_size=8, intermediate_size=4, topk_config=cfg, params_dtype="f32"
        )
    assert moecore.get_moe_runner_backend() is moecore.MoeRunnerBackend.AUTO
    layer.process_weights_after_loading()
    assert layer.runner_backend is moecore.MoeRunnerBackend.TORCH_NATIVE
    assert layer.runner.runner_backend is moecore.MoeRunnerBackend.TORCH_NATIVE
    auto = moecore.FusedMoE(
        num_experts=4, hidden_size=8, intermediate_size=4, topk_config=cfg, params_dtype="f32"
    )
    with moecore.moe_backend_context(runner_backend="torch_native"):
        auto.process_weights_after_loading()
    assert auto.runner_backend is moecore.MoeRunnerBackend.AUTO
    assert auto.runner.runner_backend is moecore.MoeRunnerBackend.TRITON
