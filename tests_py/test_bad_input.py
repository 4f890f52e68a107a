"""Bad input through every public entry point (TESTING.md category 8).

One table of cases. Each case is a callable that receives a ``watch`` function, builds fresh
seeded inputs, registers every array the call could write into (hidden_states with
inplace=True, the layer's parameters for weight_loader, the dispatcher's inputs) and makes one
call that must fail. The test asserts the moecore exception class, the built-in it derives from
(ValueError, TypeError, NotImplementedError, IndexError, AssertionError), a message pattern,
and that every watched buffer is byte-identical afterwards (nothing half-written).

Routing's own bad inputs (select_experts on bad logits/configs) live in test_routing.py; only
non-array arguments to select_experts are covered here.
"""

from __future__ import annotations

import os
import re

import ml_dtypes
import moecore
import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

BUILTIN = {
    moecore.InvalidArgumentError: ValueError,
    moecore.DTypeError: TypeError,
    moecore.UnsupportedError: NotImplementedError,
    moecore.OutOfRangeError: IndexError,
    moecore.ContractAssertionError: AssertionError,
    moecore.InternalError: RuntimeError,
}

Inv = moecore.InvalidArgumentError
DT = moecore.DTypeError
Uns = moecore.UnsupportedError
OOR = moecore.OutOfRangeError
CA = moecore.ContractAssertionError

T, H, I, E, K = 5, 16, 8, 4, 2
L = re.escape  # literal message fragments

_ALL_ISA = ["scalar", "avx2", "avx512", "avx512_bf16", "amx"]


def _unavailable_isa():
    missing = [lvl for lvl in _ALL_ISA if lvl not in moecore.available_isa_levels()]
    if not missing:
        pytest.skip("every ISA level is available on this machine")
    return missing[0]


# ---------------------------------------------------------------------------------------------
# Data and helpers


def _data(seed=0, dtype=np.float32, t=T, h=H, i=I, e=E, k=K, gated=True):
    rng = np.random.default_rng(seed)
    n1 = 2 * i if gated else i
    return {
        "x": rng.standard_normal((t, h)).astype(dtype),
        "w13": (rng.standard_normal((e, n1, h)) * 0.1).astype(dtype),
        "w2": (rng.standard_normal((e, h, i)) * 0.1).astype(dtype),
        "ids": rng.integers(0, e, (t, k)).astype(np.int32),
        "wts": rng.random((t, k)).astype(np.float32),
    }


class _Watch:
    """Remembers the bytes of every array handed to it; assert_unchanged compares them."""

    def __init__(self):
        self.items = []

    def __call__(self, a):
        arr = a.array if isinstance(a, moecore.Tagged) else a
        if isinstance(arr, np.ndarray):
            self.items.append((arr, _bytes_of(arr)))
        return a

    def assert_unchanged(self):
        for i, (arr, before) in enumerate(self.items):
            assert _bytes_of(arr) == before, f"watched buffer #{i} {arr.shape} was modified"


def _bytes_of(arr):
    # Raw element bytes in logical order (works for strided and read-only arrays).
    if arr.dtype == object:
        return repr(arr.tolist())
    return arr.tobytes(order="C")


_DEFAULT = object()


def _run(
    w,
    backend="triton",
    *,
    x=_DEFAULT,
    w13=_DEFAULT,
    w2=_DEFAULT,
    b13=None,
    b2=None,
    ids=_DEFAULT,
    wts=_DEFAULT,
    quant=_DEFAULT,
    dispatch=_DEFAULT,
    a2a=None,
    seed=0,
    dtype=np.float32,
    **cfg,
):
    """Builds a runner and runs one call; defaults are a valid seeded problem with inplace=True
    (so hidden_states is the output buffer). Every array argument is watched."""
    d = _data(seed, dtype, gated=cfg.get("is_gated", True))
    x = d["x"] if x is _DEFAULT else x
    w13 = d["w13"] if w13 is _DEFAULT else w13
    w2 = d["w2"] if w2 is _DEFAULT else w2
    ids = d["ids"] if ids is _DEFAULT else ids
    wts = d["wts"] if wts is _DEFAULT else wts
    for a in (x, w13, w2, b13, b2, ids, wts):
        w(a)
    cfg.setdefault("inplace", True)
    runner = moecore.MoeRunner(backend, moecore.MoeRunnerConfig(**cfg), a2a_backend=a2a)
    if quant is _DEFAULT:
        cls = (
            moecore.TorchNativeMoeQuantInfo
            if backend == "torch_native"
            else moecore.TritonMoeQuantInfo
        )
        quant = cls(w13_weight=w13, w2_weight=w2, b13=b13, b2=b2)
    if dispatch is _DEFAULT:
        dispatch = moecore.StandardDispatchOutput(
            x, topk_output=moecore.StandardTopKOutput(wts, ids)
        )
    return runner.run(dispatch, quant)


def _runner(backend="triton", a2a=None, lora=False, **cfg):
    return moecore.MoeRunner(
        backend, moecore.MoeRunnerConfig(**cfg), a2a_backend=a2a, lora_enabled=lora
    )


def _ro(a):
    a = a.copy()
    a.flags.writeable = False
    return a


def _bf16(a):
    return a.astype(ml_dtypes.bfloat16)


def _strided_inner(a):
    """Same values, inner stride 2 elements."""
    wide = np.repeat(a, 2, axis=-1)
    return wide[..., ::2]


def _unaligned_rows(a):
    """A float32 view whose row stride is not a multiple of 4 bytes."""
    t, h = a.shape
    raw = np.zeros(t * (h * 4 + 2) + 8, np.uint8)
    v = np.ndarray((t, h), dtype=np.float32, buffer=raw, offset=0, strides=(h * 4 + 2, 4))
    return v


def _overlapping_rows(a):
    """A writable [T, H] view whose rows all alias one row (row stride 0)."""
    base = a[:1].copy()
    return as_strided(base, shape=a.shape, strides=(0, a.strides[1]), writeable=True)


def _tqi(**kw):
    d = _data()
    kw.setdefault("w13_weight", d["w13"])
    kw.setdefault("w2_weight", d["w2"])
    return moecore.TritonMoeQuantInfo(**kw)


def _tnqi(**kw):
    d = _data()
    kw.setdefault("w13_weight", d["w13"])
    kw.setdefault("w2_weight", d["w2"])
    return moecore.TorchNativeMoeQuantInfo(**kw)


def _topk(t=T, k=K):
    d = _data(t=t, k=k)
    return moecore.StandardTopKOutput(d["wts"], d["ids"])


def _layer(w=None, **kw):
    args = {
        "num_experts": E,
        "hidden_size": H,
        "intermediate_size": I,
        "topk_config": moecore.TopKConfig(top_k=K),
        "params_dtype": "f32",
    }
    args.update(kw)
    layer = moecore.FusedMoE(**args)
    if w is not None:
        for p in layer.named_parameters().values():
            w(p)
    return layer


def _load(w, param, loaded, shard, expert, **layer_kw):
    layer = _layer(w, **layer_kw)
    w(loaded)
    return layer.weight_loader(param, loaded, "ckpt." + param, shard, expert)


def _dispatch(
    w,
    x=_DEFAULT,
    ids=_DEFAULT,
    wts=_DEFAULT,
    num_experts=9,
    ep_size=2,
    ep_rank=1,
    shared=1,
    topk=_DEFAULT,
):
    d = _data(k=3)
    x = d["x"] if x is _DEFAULT else x
    ids = np.array([[0, 4, 8]] * T, np.int32) if ids is _DEFAULT else ids
    wts = d["wts"] if wts is _DEFAULT else wts
    for a in (x, ids, wts):
        w(a)
    disp = moecore.StandardDispatcher(
        num_experts, ep_size=ep_size, ep_rank=ep_rank, num_fused_shared_experts=shared
    )
    if topk is _DEFAULT:
        topk = moecore.StandardTopKOutput(wts, ids)
    return disp.dispatch(x, topk)


def _with_env(name, value, fn):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        return fn()
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def _register_then_unregister_fused(fn):
    try:
        moecore.register_fused_func("customized", "triton", fn)
    finally:
        moecore.unregister_fused_func("customized", "triton")


def _set_isa_unavailable():
    before = moecore.get_isa_level()
    try:
        moecore.set_isa_level(_unavailable_isa())
    finally:
        assert moecore.get_isa_level() == before


def _set_threads(n):
    before = moecore.get_num_threads()
    try:
        moecore.set_num_threads(n)
    finally:
        assert moecore.get_num_threads() == before


class _FormatOnly:
    """A harness-side dispatch output / combine input with only a format."""

    def __init__(self, fmt):
        self.format = fmt


# ---------------------------------------------------------------------------------------------
# The table: (callable(watch), moecore exception class, message regex, id)

P = pytest.param
_D = _data  # shorthand inside lambdas

CONFIG_CASES = [
    P(
        lambda w: moecore.MoeRunnerConfig(isa_level="nope"),
        Inv,
        L("unknown ISA level 'nope'"),
        id="config-isa-level-unknown",
    ),
    P(
        lambda w: moecore.MoeRunnerConfig(isa_level="AVX512"),
        Inv,
        L("unknown ISA level 'AVX512'"),
        id="config-isa-level-wrong-case",
    ),
    P(
        lambda w: moecore.MoeRunnerConfig(isa_level=5),
        DT,
        "isa_level",
        id="config-isa-level-not-a-string",
    ),
    P(
        lambda w: moecore.MoeRunnerConfig(params_dtype="nope"),
        Inv,
        L("unknown dtype 'nope'"),
        id="config-params-dtype-unknown-name",
    ),
    P(
        lambda w: moecore.MoeRunnerConfig(params_dtype=np.float64),
        DT,
        "unsupported dtype float64",
        id="config-params-dtype-float64",
    ),
    P(
        lambda w: moecore.MoeRunnerConfig(params_dtype=object()),
        DT,
        "expected a dtype",
        id="config-params-dtype-object",
    ),
]

CONSTRUCTION_CASES = [
    P(
        lambda w: _runner("bogus"),
        Inv,
        L("'bogus' is not a valid MoeRunnerBackend"),
        id="runner-backend-unknown",
    ),
    P(
        lambda w: _runner(""),
        Inv,
        L("'' is not a valid MoeRunnerBackend"),
        id="runner-backend-empty",
    ),
    P(
        lambda w: _runner("TRITON"),
        Inv,
        L("'TRITON' is not a valid MoeRunnerBackend"),
        id="runner-backend-member-name-not-value",
    ),
    P(
        lambda w: _runner(3),
        DT,
        "expected a MoeRunnerBackend or its string value",
        id="runner-backend-int",
    ),
    P(
        lambda w: _runner(None),
        DT,
        "expected a MoeRunnerBackend or its string value",
        id="runner-backend-none",
    ),
    P(
        lambda w: _runner(moecore.MoeA2ABackend.NONE),
        Inv,
        L("'none' is not a valid MoeRunnerBackend"),
        id="runner-backend-enum-of-another-class",
    ),
    P(lambda w: _runner("auto"), Uns, L("'auto' must be resolved"), id="runner-backend-auto"),
    P(
        lambda w: _runner(moecore.MoeRunnerBackend.AUTO),
        Uns,
        L("'auto' must be resolved"),
        id="runner-backend-auto-member",
    ),
    P(lambda w: _runner("triton", lora=True), Uns, "LoRA", id="runner-lora-enabled"),
    P(
        lambda w: _runner("aiter"),
        Uns,
        L("Unsupported runner backend: MoeRunnerBackend.AITER"),
        id="runner-aiter-no-core",
    ),
    P(
        lambda w: _runner("triton_kernel"),
        Uns,
        L("Unsupported runner backend: MoeRunnerBackend.TRITON_KERNELS"),
        id="runner-triton-kernels-no-core",
    ),
    P(
        lambda w: _runner("marlin"),
        Uns,
        L(
            "Runner backend MoeRunnerBackend.MARLIN requires a fused func for a2a backend none, "
            "but none is registered."
        ),
        id="runner-marlin-fused-only",
    ),
    P(
        lambda w: _runner("marlin", a2a="deepep"),
        Uns,
        L("Runner backend MoeRunnerBackend.MARLIN requires a fused func for a2a backend deepep"),
        id="runner-marlin-deepep-fused-only",
    ),
    P(
        lambda w: _runner("triton", a2a="bogus"),
        Inv,
        L("No MoeA2ABackend member for value bogus"),
        id="runner-a2a-unknown",
    ),
    P(lambda w: _runner("triton", a2a=3), DT, "expected a MoeA2ABackend", id="runner-a2a-int"),
    P(
        lambda w: _runner("triton", isa_level=_unavailable_isa()),
        Uns,
        "is not available on this machine",
        id="runner-isa-level-unavailable",
    ),
    P(
        lambda w: _runner("triton", activation="swiglu_oops"),
        Inv,
        L("Unsupported activation: activation='swiglu_oops'"),
        id="runner-activation-unknown",
    ),
    P(
        lambda w: _runner("triton", activation="SILU"),
        Inv,
        L("Unsupported activation: activation='SILU'"),
        id="runner-activation-wrong-case",
    ),
    P(
        lambda w: _runner("triton", activation=""),
        Inv,
        L("Unsupported activation: activation=''"),
        id="runner-activation-empty",
    ),
    P(
        lambda w: _runner("torch_native", activation="situ"),
        Inv,
        L("Unsupported activation: activation='situ'"),
        id="runner-torch-native-activation-unknown",
    ),
    P(
        lambda w: _runner("triton", gemm1_alpha=1.702),
        Inv,
        L("gemm1_clamp_limit is required when gemm1_alpha is set"),
        id="runner-alpha-without-limit",
    ),
    P(
        lambda w: _runner("triton", gemm1_clamp_limit=7.0),
        Inv,
        L("gemm1_clamp_limit without gemm1_alpha"),
        id="runner-limit-without-alpha",
    ),
    P(
        lambda w: _runner("triton", activation="gelu", gemm1_alpha=1.702, gemm1_clamp_limit=7.0),
        Inv,
        L("gemm1_alpha is not supported for gelu"),
        id="runner-alpha-with-gelu",
    ),
    P(
        lambda w: _runner("triton", activation="gelu_tanh", gemm1_clamp_limit=7.0),
        Inv,
        L("gemm1_clamp_limit is not supported for gelu"),
        id="runner-limit-with-gelu-tanh",
    ),
    P(
        lambda w: _runner(
            "triton", activation="relu2", is_gated=False, gemm1_alpha=1.702, gemm1_clamp_limit=7.0
        ),
        Inv,
        L("requires a gated silu activation"),
        id="runner-alpha-with-relu2",
    ),
    P(
        lambda w: _runner("triton", is_gated=False, gemm1_alpha=1.702, gemm1_clamp_limit=7.0),
        Inv,
        L("requires a gated silu activation"),
        id="runner-alpha-with-non-gated-silu",
    ),
    P(
        lambda w: _runner("triton", gemm1_alpha=float("nan"), gemm1_clamp_limit=7.0),
        Inv,
        "expected finite gemm1_alpha",
        id="runner-alpha-nan",
    ),
    P(
        lambda w: _runner("triton", gemm1_alpha=1.702, gemm1_clamp_limit=-1.0),
        Inv,
        "positive gemm1_clamp_limit",
        id="runner-limit-negative",
    ),
    P(
        lambda w: _runner("triton", gemm1_alpha=1.702, gemm1_clamp_limit=float("inf")),
        Inv,
        "positive gemm1_clamp_limit",
        id="runner-limit-inf",
    ),
    P(
        lambda w: _runner("triton", activation="relu2"),
        Inv,
        L("relu2 is a non-gated activation; set is_gated=False"),
        id="runner-relu2-gated",
    ),
    P(
        lambda w: _runner("triton", no_combine=True, inplace=True),
        Inv,
        L("no_combine requires inplace=False"),
        id="runner-no-combine-with-inplace",
    ),
    P(
        lambda w: _runner("torch_native", no_combine=True, inplace=True),
        Inv,
        L("no_combine requires inplace=False"),
        id="runner-torch-native-no-combine-with-inplace",
    ),
    P(
        lambda w: _runner("triton", activation="gelu", swiglu_limit=7.0),
        Inv,
        L("swiglu_limit (DSv4 clamp) requires gated silu"),
        id="runner-swiglu-limit-with-gelu",
    ),
    P(
        lambda w: _runner("triton", swiglu_limit=7.0, gemm1_alpha=1.702, gemm1_clamp_limit=7.0),
        Inv,
        L("swiglu_limit (DSv4 clamp) requires gated silu without gemm1_alpha"),
        id="runner-swiglu-limit-with-alpha",
    ),
    P(
        lambda w: _runner("triton", swiglu_limit=0.0),
        Inv,
        L("expected swiglu_limit > 0"),
        id="runner-swiglu-limit-zero",
    ),
    P(
        lambda w: _runner("triton", routed_scaling_factor=float("inf")),
        Inv,
        "expected a finite routed_scaling_factor",
        id="runner-rsf-inf",
    ),
    P(
        lambda w: _runner("triton", routed_scaling_factor=float("nan")),
        Inv,
        "expected a finite routed_scaling_factor",
        id="runner-rsf-nan",
    ),
    P(
        lambda w: _runner("torch_native", apply_router_weight_on_input=True),
        Uns,
        "apply_router_weight_on_input is not supported",
        id="runner-torch-native-router-weight-on-input",
    ),
    P(
        lambda w: _with_env("SGLANG_CI_DISABLE_MOE_FUSED_FUNC", "maybe", lambda: _runner("triton")),
        Inv,
        L("SGLANG_CI_DISABLE_MOE_FUSED_FUNC: expected 0/1/true/false, got 'maybe'"),
        id="runner-env-disable-fused-func-bad-value",
    ),
]

RUN_CASES = [
    # dtypes
    P(
        lambda w: _run(w, x=_D()["x"].astype(np.float64)),
        DT,
        "unsupported dtype float64",
        id="run-x-float64",
    ),
    P(
        lambda w: _run(w, x=_D()["x"].astype(np.int32)),
        DT,
        L("hidden_states dtype must equal the weights' (f32)"),
        id="run-x-int32",
    ),
    P(
        lambda w: _run(w, x=_D()["x"].astype(np.int64)),
        DT,
        L("hidden_states dtype must equal the weights' (f32)"),
        id="run-x-int64",
    ),
    P(
        lambda w: _run(w, x=_D()["x"].astype(np.uint8)),
        DT,
        L("hidden_states dtype must equal the weights'"),
        id="run-x-uint8",
    ),
    P(
        lambda w: _run(w, x=_D()["x"].astype(np.float16)),
        DT,
        L("hidden_states dtype must equal the weights' (f32), got [5, 16] f16"),
        id="run-x-f16-weights-f32",
    ),
    P(
        lambda w: _run(w, x=_bf16(_D()["x"])),
        DT,
        L("hidden_states dtype must equal the weights' (f32)"),
        id="run-x-bf16-weights-f32",
    ),
    P(
        lambda w: _run(w, dtype=np.float16, x=_D()["x"]),
        DT,
        L("hidden_states dtype must equal the weights' (f16)"),
        id="run-x-f32-weights-f16",
    ),
    P(
        lambda w: _run(w, x=_D()["x"].astype(np.complex64)),
        DT,
        "unsupported dtype complex64",
        id="run-x-complex64",
    ),
    P(lambda w: _run(w, x=_D()["x"] > 0), DT, "unsupported dtype bool", id="run-x-bool"),
    P(
        lambda w: _run(w, x=_D()["x"].astype(object)),
        DT,
        "unsupported dtype object",
        id="run-x-object",
    ),
    P(
        lambda w: _run(w, x=np.zeros((T, H), np.uint16)),
        DT,
        L("a uint16 array is ambiguous; tag it, e.g. moecore.tagged(array, 'bf16')"),
        id="run-x-uint16-untagged",
    ),
    P(
        lambda w: _run(w, x=_D()["x"].astype(">f4")),
        DT,
        "byte order|endian",
        id="run-x-big-endian-float32",
    ),
    P(
        lambda w: _run(w, ids=_D()["ids"].astype(">i4")),
        DT,
        "byte order|endian",
        id="run-topk-ids-big-endian-int32",
    ),
    P(
        lambda w: _run(w, x=moecore.tagged(np.zeros((T, H), np.uint8), "bf16")),
        DT,
        "a bf16 tag needs a uint16 array",
        id="run-x-tagged-bf16-wrong-itemsize",
    ),
    P(
        lambda w: _run(w, x=moecore.tagged(np.zeros((T, H), np.float16), "bf16")),
        DT,
        "a bf16 tag needs a uint16 array",
        id="run-x-tagged-bf16-over-float16",
    ),
    P(
        lambda w: _run(w, x=moecore.tagged(np.zeros((T, H), np.uint16), "f32")),
        DT,
        "a f32 tag needs a uint32 array",
        id="run-x-tagged-f32-over-uint16",
    ),
    P(
        lambda w: _run(w, x=moecore.tagged(np.zeros((T, H), np.uint16), "nope")),
        Inv,
        L("unknown dtype 'nope'"),
        id="run-x-tagged-unknown-dtype",
    ),
    P(
        lambda w: _run(w, w13=_D()["w13"].astype(np.float16)),
        DT,
        L("w2_weight dtype must equal w13_weight's (f16)"),
        id="run-w13-f16-w2-f32",
    ),
    P(
        lambda w: _run(w, w13=_D()["w13"].astype(np.int32), w2=_D()["w2"].astype(np.int32)),
        DT,
        "unquantized w13_weight must be f32, f16 or bf16",
        id="run-weights-int32",
    ),
    P(
        lambda w: _run(w, w13=_D()["w13"].astype(np.uint8), w2=_D()["w2"].astype(np.uint8)),
        DT,
        "unquantized w13_weight must be f32, f16 or bf16",
        id="run-weights-uint8",
    ),
    P(
        lambda w: _run(
            w,
            w13=_D()["w13"].astype(ml_dtypes.float8_e4m3fn),
            w2=_D()["w2"].astype(ml_dtypes.float8_e4m3fn),
        ),
        DT,
        "unquantized w13_weight must be f32, f16 or bf16",
        id="run-weights-fp8-unquantized-path",
    ),
    P(
        lambda w: _run(w, w13=_D()["w13"].view(np.uint16)),
        DT,
        "a uint16 array is ambiguous",
        id="run-w13-uint16-untagged",
    ),
    P(
        lambda w: _run(w, ids=_D()["ids"].astype(np.float32)),
        DT,
        "topk_ids must be int32 or int64, got",
        id="run-topk-ids-float32",
    ),
    P(
        lambda w: _run(w, ids=_D()["ids"].astype(np.uint8)),
        DT,
        "topk_ids must be int32 or int64, got",
        id="run-topk-ids-uint8",
    ),
    P(
        lambda w: _run(w, ids=_D()["ids"].astype(np.int16)),
        DT,
        "topk_ids: unsupported dtype int16",
        id="run-topk-ids-int16",
    ),
    P(
        lambda w: _run(w, wts=_D()["wts"].astype(np.float64)),
        DT,
        "topk_weights: unsupported dtype float64",
        id="run-topk-weights-float64",
    ),
    P(
        lambda w: _run(w, wts=_D()["wts"].astype(np.float16)),
        DT,
        "topk_weights must be float32",
        id="run-topk-weights-float16",
    ),
    P(
        lambda w: _run(w, wts=_D()["ids"].copy()),
        DT,
        "topk_weights must be float32",
        id="run-topk-weights-int32",
    ),
    P(
        lambda w: _run(w, b13=np.zeros((E, 2 * I), np.int32)),
        DT,
        "b13 must be f32, f16 or bf16",
        id="run-b13-int32",
    ),
    # shapes
    P(
        lambda w: _run(w, x=_D()["x"][0].copy()),
        Inv,
        L("expected hidden_states [T, 16], got [16] f32"),
        id="run-x-1d",
    ),
    P(
        lambda w: _run(w, x=_D()["x"][None].copy()),
        Inv,
        L("expected hidden_states [T, 16], got [1, 5, 16] f32"),
        id="run-x-3d",
    ),
    P(
        lambda w: _run(w, x=np.array(1.0, np.float32)),
        Inv,
        L("expected hidden_states [T, 16]"),
        id="run-x-0d",
    ),
    P(
        lambda w: _run(w, x=_D()["x"][:, :8].copy()),
        Inv,
        L("expected hidden_states [T, 16], got [5, 8] f32"),
        id="run-x-hidden-mismatch",
    ),
    P(
        lambda w: _run(w, w13=np.zeros((E, 2 * I + 1, H), np.float32)),
        Inv,
        L("w13_weight rows must be 2·I (is_gated=True, I=8)"),
        id="run-w13-rows-not-2I",
    ),
    P(
        lambda w: _run(w, w13=np.zeros((E, I, H), np.float32)),
        Inv,
        L("w13_weight rows must be 2·I"),
        id="run-w13-rows-I-for-gated",
    ),
    P(
        lambda w: _run(
            w, is_gated=False, activation="relu2", w13=np.zeros((E, 2 * I, H), np.float32)
        ),
        Inv,
        L("w13_weight rows must be I (is_gated=False"),
        id="run-w13-rows-2I-for-non-gated",
    ),
    P(
        lambda w: _run(w, w2=np.zeros((E, H + 1, I), np.float32)),
        Inv,
        L("w2_weight must be [E, H, I] = [4, 16, I]"),
        id="run-w2-hidden-mismatch",
    ),
    P(
        lambda w: _run(w, w2=np.zeros((E, H, I + 1), np.float32)),
        Inv,
        L("w13_weight rows must be 2·I (is_gated=True, I=9)"),
        id="run-w2-inter-mismatch",
    ),
    P(
        lambda w: _run(
            w, w13=np.zeros((0, 2 * I, H), np.float32), w2=np.zeros((0, H, I), np.float32)
        ),
        Inv,
        L("expected E, H, I > 0"),
        id="run-zero-experts",
    ),
    P(
        lambda w: _run(
            w,
            x=np.zeros((T, 0), np.float32),
            w13=np.zeros((E, 2 * I, 0), np.float32),
            w2=np.zeros((E, 0, I), np.float32),
        ),
        Inv,
        L("expected E, H, I > 0"),
        id="run-zero-hidden",
    ),
    P(
        lambda w: _run(w, w13=np.zeros((E, 0, H), np.float32), w2=np.zeros((E, H, 0), np.float32)),
        Inv,
        L("expected E, H, I > 0"),
        id="run-zero-intermediate",
    ),
    P(
        lambda w: _run(w, b13=np.zeros((E, 2 * I, 2), np.float32)[:, :, 0]),
        Inv,
        L("expected contiguous b13 [4, 16]"),
        id="run-b13-non-contiguous",
    ),
    P(
        lambda w: _run(w, b2=np.zeros((E, H, 2), np.float32)[:, :, 0]),
        Inv,
        L("expected contiguous b2 [4, 16]"),
        id="run-b2-non-contiguous",
    ),
    P(
        lambda w: _run(w, ids=_D(t=T + 1)["ids"], wts=_D(t=T + 1)["wts"]),
        Inv,
        L("expected topk_ids [5, k], got [6, 2] i32"),
        id="run-topk-rows-mismatch",
    ),
    P(
        lambda w: _run(w, wts=_D(k=3)["wts"]),
        Inv,
        L("topk_weights shape must equal topk_ids'"),
        id="run-topk-weights-shape-mismatch",
    ),
    P(
        lambda w: _run(w, ids=_D()["ids"][:, 0].copy(), wts=_D()["wts"][:, 0].copy()),
        Inv,
        L("expected topk_ids [5, k], got [5] i32"),
        id="run-topk-ids-1d",
    ),
    P(
        lambda w: _run(w, ids=_D()["ids"][None].copy(), wts=_D()["wts"][None].copy()),
        Inv,
        L("expected topk_ids [5, k]"),
        id="run-topk-ids-3d",
    ),
    P(
        lambda w: _run(w, ids=np.zeros((T, 0), np.int32), wts=np.zeros((T, 0), np.float32)),
        Inv,
        L("expected top_k >= 1, got 0"),
        id="run-k-zero",
    ),
    P(
        lambda w: _run(
            w, x=_D()["x"][:0], ids=np.zeros((0, 0), np.int32), wts=np.zeros((0, 0), np.float32)
        ),
        Inv,
        L("expected top_k >= 1, got 0"),
        id="run-k-zero-no-tokens",
    ),
    # strides and memory
    P(
        lambda w: _run(w, x=_strided_inner(_D()["x"])),
        Inv,
        L("hidden_states rows must be contiguous (inner stride 1)"),
        id="run-x-inner-stride-2",
    ),
    P(
        lambda w: _run(w, x=_D()["x"][::-1]),
        Inv,
        "strides must be non-negative",
        id="run-x-negative-row-stride",
    ),
    P(
        lambda w: _run(w, x=_D()["x"][:, ::-1]),
        Inv,
        "strides must be non-negative",
        id="run-x-negative-inner-stride",
    ),
    P(
        lambda w: _run(w, x=_unaligned_rows(_D()["x"])),
        Inv,
        "strides must be non-negative multiples of the item size",
        id="run-x-row-stride-not-itemsize-multiple",
    ),
    P(
        lambda w: _run(w, x=_overlapping_rows(_D()["x"])),
        Inv,
        "rows must be contiguous",
        id="run-x-inplace-overlapping-rows",
    ),
    P(
        lambda w: _run(w, ids=_D()["ids"][::-1]),
        Inv,
        "topk_ids: strides must be non-negative",
        id="run-topk-ids-negative-stride",
    ),
    P(
        lambda w: _run(w, w13=_D()["w13"][:, ::-1]),
        Inv,
        "w13_weight: strides must be non-negative",
        id="run-w13-negative-stride",
    ),
    P(
        lambda w: _run(w, w13=_strided_inner(_D()["w13"])),
        Inv,
        "expert weights must be contiguous",
        id="run-w13-non-contiguous",
    ),
    P(
        lambda w: _run(w, w2=np.asfortranarray(_D()["w2"])),
        Inv,
        "expert weights must be contiguous",
        id="run-w2-fortran-order",
    ),
    P(
        lambda w: _run(w, x=_ro(_D()["x"]), inplace=True),
        Inv,
        L("inplace=True writes the output into hidden_states, which is read-only"),
        id="run-x-read-only-inplace",
    ),
    P(
        lambda w: _run(w, dtype=ml_dtypes.bfloat16, x=_ro(_bf16(_D()["x"])), inplace=True),
        Inv,
        "which is read-only",
        id="run-x-bf16-read-only-inplace",
    ),
    P(
        lambda w: _run(w, x=_ro(_D()["x"]), inplace=True, force_unfused=True),
        Inv,
        "which is read-only",
        id="run-x-read-only-inplace-unfused",
    ),
    # ids out of range
    P(
        lambda w: _run(w, ids=np.full((T, K), E, np.int32)),
        OOR,
        L("topk_ids must be in [-1, 4), got 4 at [0, 0]"),
        id="run-ids-equal-E",
    ),
    P(
        lambda w: _run(w, ids=np.full((T, K), -2, np.int32)),
        OOR,
        L("topk_ids must be in [-1, 4), got -2"),
        id="run-ids-minus-2",
    ),
    P(
        lambda w: _run(w, ids=np.full((T, K), 2**31 - 1, np.int32)),
        OOR,
        L("topk_ids must be in [-1, 4)"),
        id="run-ids-int32-max",
    ),
    P(
        lambda w: _run(w, ids=np.full((T, K), -(2**31), np.int32)),
        OOR,
        L("topk_ids must be in [-1, 4)"),
        id="run-ids-int32-min",
    ),
    P(
        lambda w: _run(w, ids=np.full((T, K), E, np.int64)),
        OOR,
        L("topk_ids must be in [-1, 4), got 4"),
        id="run-ids-int64-equal-E",
    ),
    P(
        lambda w: _run(w, ids=np.full((T, K), 2**32 + 1, np.int64)),
        OOR,
        L("topk_ids must be in [-1, 4)"),
        id="run-ids-int64-2pow32-plus-1",
    ),
    P(
        lambda w: _run(w, ids=np.full((T, K), -(2**32), np.int64)),
        OOR,
        L("topk_ids must be in [-1, 4)"),
        id="run-ids-int64-minus-2pow32",
    ),
    P(
        lambda w: _run(
            w, ids=np.where(np.arange(T * K).reshape(T, K) == T * K - 1, E + 3, 0).astype(np.int32)
        ),
        OOR,
        L("got 7 at [4, 1]"),
        id="run-ids-last-slot-out-of-range",
    ),
    P(
        lambda w: _run(w, ids=np.full((T, K), E, np.int32), force_unfused=True),
        OOR,
        L("topk_ids must be in [-1, 4)"),
        id="run-ids-out-of-range-unfused",
    ),
    P(
        lambda w: _run(w, "torch_native", ids=np.full((T, K), -2, np.int32)),
        OOR,
        L("MoeRunner(torch_native): topk_ids must be in [-1, 4)"),
        id="run-torch-native-ids-minus-2",
    ),
    # quant info
    P(
        lambda w: _run(w, quant=_tnqi()),
        DT,
        L("MoeRunner(triton): expected TritonMoeQuantInfo, got TorchNativeMoeQuantInfo"),
        id="run-triton-with-torch-native-quant-info",
    ),
    P(
        lambda w: _run(w, "torch_native", quant=_tqi()),
        DT,
        L("MoeRunner(torch_native): expected TorchNativeMoeQuantInfo, got TritonMoeQuantInfo"),
        id="run-torch-native-with-triton-quant-info",
    ),
    P(
        lambda w: _run(w, quant=object()),
        DT,
        L("expected TritonMoeQuantInfo, got <Python quant info>"),
        id="run-python-object-quant-info",
    ),
    P(
        lambda w: _run(w, quant=_tnqi(), force_unfused=True),
        DT,
        L("expected TritonMoeQuantInfo"),
        id="run-wrong-quant-info-unfused",
    ),
    P(
        lambda w: _run(w, quant=None),
        Inv,
        L("quant_info: expected a QuantInfo, got None"),
        id="run-quant-info-none",
    ),
    P(
        lambda w: _run(w, dispatch=None),
        Inv,
        "expected a dispatch output, got None",
        id="run-dispatch-output-none",
    ),
    P(
        lambda w: _run(w, dispatch=object()),
        DT,
        "needs a 'format' attribute",
        id="run-dispatch-output-without-format",
    ),
    P(
        lambda w: _run(w, dispatch=_FormatOnly("bogus")),
        Inv,
        L("'bogus' is not a valid DispatchOutputFormat"),
        id="run-dispatch-output-bogus-format",
    ),
    P(
        lambda w: _run(w, dispatch=_FormatOnly(moecore.DispatchOutputFormat.STANDARD)),
        DT,
        L("expected a StandardDispatchOutput"),
        id="run-python-dispatch-output-in-fused-triton",
    ),
    P(
        lambda w: _run(w, dispatch=moecore.StandardCombineInput(_D()["x"])),
        DT,
        L("expected a StandardDispatchOutput"),
        id="run-combine-input-as-dispatch-output",
    ),
    P(
        lambda w: _run(w, quant=_tqi(use_fp8_w8a8=True)),
        DT,
        "use_fp8_w8a8 expects fp8_e4m3fn weights",
        id="run-triton-use-fp8-w8a8",
    ),
    P(
        lambda w: _run(w, quant=_tqi(use_int8_w8a8=True)),
        DT,
        "use_int8_w8a8 expects i8 weights",
        id="run-triton-use-int8-w8a8",
    ),
    P(
        lambda w: _run(w, quant=_tqi(use_int8_w8a16=True)),
        DT,
        "use_int8_w8a16 expects i8 weights",
        id="run-triton-use-int8-w8a16",
    ),
    P(
        lambda w: _run(w, quant=_tqi(use_int4_w4a16=True)),
        Uns,
        L("use_int4_w4a16 (GPTQ/AWQ) is not built"),
        id="run-triton-use-int4-w4a16",
    ),
    P(
        lambda w: _run(
            w, quant=_tqi(use_fp8_w8a8=True, block_shape=[128, 128]), force_unfused=True
        ),
        DT,
        "use_fp8_w8a8 expects fp8_e4m3fn weights",
        id="run-triton-fp8-block-unfused",
    ),
    # config rules enforced at run
    P(
        lambda w: _run(w, apply_router_weight_on_input=True),
        Inv,
        L("Only support topk=1 when `apply_router_weight_on_input` is True"),
        id="run-router-weight-on-input-k2",
    ),
    P(
        lambda w: _run(w, apply_router_weight_on_input=True, force_unfused=True),
        Inv,
        L("Only support topk=1 when `apply_router_weight_on_input` is True"),
        id="run-router-weight-on-input-k2-unfused",
    ),
    P(
        lambda w: _runner("triton").run(None, None, lora_info=object()),
        Inv,
        "lora_info is not supported",
        id="run-lora-info",
    ),
    # torch_native shares the checks
    P(
        lambda w: _run(w, "torch_native", x=_D()["x"].astype(np.float16)),
        DT,
        L("MoeRunner(torch_native): hidden_states dtype must equal the weights'"),
        id="run-torch-native-x-dtype",
    ),
    P(
        lambda w: _run(w, "torch_native", x=_strided_inner(_D()["x"])),
        Inv,
        "rows must be contiguous",
        id="run-torch-native-x-inner-stride",
    ),
    P(
        lambda w: _run(
            w, "torch_native", ids=np.zeros((T, 0), np.int32), wts=np.zeros((T, 0), np.float32)
        ),
        Inv,
        L("expected top_k >= 1"),
        id="run-torch-native-k-zero",
    ),
    P(
        lambda w: _run(w, "torch_native", w2=np.zeros((E, H + 1, I), np.float32)),
        Inv,
        L("MoeRunner(torch_native): w2_weight must be [E, H, I]"),
        id="run-torch-native-w2-shape",
    ),
]

QUANT_INFO_CASES = [
    P(
        lambda w: _tqi(w13_weight=np.zeros((E, H), np.float32)),
        Inv,
        L("TritonMoeQuantInfo: w13_weight must be [E, 2I, H], got [4, 16] f32"),
        id="triton-info-w13-2d",
    ),
    P(
        lambda w: _tqi(w13_weight=np.zeros((1, E, 2 * I, H), np.float32)),
        Inv,
        L("TritonMoeQuantInfo: w13_weight must be [E, 2I, H]"),
        id="triton-info-w13-4d",
    ),
    P(
        lambda w: _tqi(w2_weight=np.zeros((H, I), np.float32)),
        Inv,
        L("TritonMoeQuantInfo: w2_weight must be [E, H, I] with E = 4, got [16, 8] f32"),
        id="triton-info-w2-2d",
    ),
    P(
        lambda w: _tqi(w2_weight=np.zeros((E - 1, H, I), np.float32)),
        Inv,
        L("w2_weight must be [E, H, I] with E = 4, got [3, 16, 8] f32"),
        id="triton-info-w2-expert-mismatch",
    ),
    P(
        lambda w: _tqi(b13=np.zeros((E, 2 * I - 1), np.float32)),
        Inv,
        L("TritonMoeQuantInfo: b13 must be [4, 16], got [4, 15] f32"),
        id="triton-info-b13-shape",
    ),
    P(
        lambda w: _tqi(b13=np.zeros((2 * I,), np.float32)),
        Inv,
        L("b13 must be [4, 16]"),
        id="triton-info-b13-1d",
    ),
    P(
        lambda w: _tqi(b2=np.zeros((E,), np.float32)),
        Inv,
        L("b2 must be [4, 16], got [4] f32"),
        id="triton-info-b2-1d",
    ),
    P(
        lambda w: _tqi(b2=np.zeros((E, H + 1), np.float32)),
        Inv,
        L("b2 must be [4, 16]"),
        id="triton-info-b2-shape",
    ),
    P(
        lambda w: _tqi(block_shape=[0, 128]),
        Inv,
        L("block_shape must be [block_n, block_k] > 0"),
        id="triton-info-block-shape-zero",
    ),
    P(
        lambda w: _tqi(block_shape=[-128, 128]),
        Inv,
        L("block_shape must be [block_n, block_k] > 0"),
        id="triton-info-block-shape-negative",
    ),
    P(
        lambda w: _tqi(block_shape=[128]),
        Inv,
        L("block_shape must be [block_n, block_k] > 0"),
        id="triton-info-block-shape-one-entry",
    ),
    P(
        lambda w: _tqi(block_shape=[128, 128, 1]),
        Inv,
        L("block_shape must be [block_n, block_k] > 0"),
        id="triton-info-block-shape-three-entries",
    ),
    P(
        lambda w: _tqi(w13_weight=None),
        Inv,
        L("TritonMoeQuantInfo.w13_weight: expected a numpy array, got None"),
        id="triton-info-w13-none",
    ),
    P(
        lambda w: _tqi(w2_weight=None),
        Inv,
        L("TritonMoeQuantInfo.w2_weight: expected a numpy array, got None"),
        id="triton-info-w2-none",
    ),
    P(
        lambda w: _tqi(w13_weight=[[[0.0]]]),
        DT,
        L("TritonMoeQuantInfo.w13_weight: expected a numpy array"),
        id="triton-info-w13-list",
    ),
    P(
        lambda w: _tqi(w13_weight=_D()["w13"].astype(np.float64)),
        DT,
        "unsupported dtype float64",
        id="triton-info-w13-float64",
    ),
    P(
        lambda w: _tqi(w13_scale=[1.0]),
        DT,
        L("TritonMoeQuantInfo.w13_scale: expected a numpy array"),
        id="triton-info-scale-list",
    ),
    P(
        lambda w: _tnqi(w13_weight=np.zeros((E, H), np.float32)),
        Inv,
        L("TorchNativeMoeQuantInfo: w13_weight must be [E, 2I, H]"),
        id="torch-native-info-w13-2d",
    ),
    P(
        lambda w: _tnqi(w2_weight=np.zeros((E + 1, H, I), np.float32)),
        Inv,
        L("TorchNativeMoeQuantInfo: w2_weight must be [E, H, I] with E = 4"),
        id="torch-native-info-w2-expert-mismatch",
    ),
    P(
        lambda w: _tnqi(b13=np.zeros((E, 1), np.float32)),
        Inv,
        L("TorchNativeMoeQuantInfo: b13 must be [4, 16]"),
        id="torch-native-info-b13-shape",
    ),
    P(
        lambda w: _tnqi(b2=np.zeros((E + 1, H), np.float32)),
        Inv,
        L("TorchNativeMoeQuantInfo: b2 must be [4, 16]"),
        id="torch-native-info-b2-shape",
    ),
    P(
        lambda w: _tnqi(w2_weight=None),
        Inv,
        "expected a numpy array, got None",
        id="torch-native-info-w2-none",
    ),
    P(
        lambda w: _tnqi(w2_weight=_D()["w2"].view(np.uint16)),
        DT,
        "a uint16 array is ambiguous",
        id="torch-native-info-w2-uint16-untagged",
    ),
]

DISPATCH_TYPE_CASES = [
    P(
        lambda w: moecore.StandardDispatchOutput(w(_D()["x"])),
        Inv,
        L("StandardDispatchOutput: topk_output is required"),
        id="dispatch-output-no-topk",
    ),
    P(
        lambda w: moecore.StandardDispatchOutput(None, topk_output=_topk()),
        Inv,
        L("StandardDispatchOutput.hidden_states: expected a numpy array, got None"),
        id="dispatch-output-hidden-none",
    ),
    P(
        lambda w: moecore.StandardDispatchOutput([[1.0]], topk_output=_topk()),
        DT,
        L("StandardDispatchOutput.hidden_states: expected a numpy array, got ") + "(<class ')?list",
        id="dispatch-output-hidden-list",
    ),
    P(
        lambda w: moecore.StandardDispatchOutput(w(_D()["x"]), topk_output=(1, 2)),
        DT,
        L("topk_output: expected a StandardTopKOutput or BypassedTopKOutput, got ")
        + "(<class ')?tuple",
        id="dispatch-output-topk-tuple",
    ),
    P(
        lambda w: moecore.StandardDispatchOutput(w(_D()["x"]), topk_output={"topk_ids": 1}),
        DT,
        L("topk_output: expected a StandardTopKOutput or BypassedTopKOutput"),
        id="dispatch-output-topk-dict",
    ),
    P(
        lambda w: moecore.StandardDispatchOutput(
            w(_D()["x"]), hidden_states_scale=[1.0], topk_output=_topk()
        ),
        DT,
        L("StandardDispatchOutput.hidden_states_scale: expected a numpy array"),
        id="dispatch-output-scale-list",
    ),
    P(
        lambda w: moecore.StandardDispatchOutput(
            w(_D()["x"]), topk_output=_topk(), hidden_states_pre_quant=np.zeros(3, np.float64)
        ),
        DT,
        "hidden_states_pre_quant: unsupported dtype float64",
        id="dispatch-output-pre-quant-float64",
    ),
    P(
        lambda w: moecore.StandardDispatchOutput(_D()["x"].astype(np.float64), topk_output=_topk()),
        DT,
        "unsupported dtype float64",
        id="dispatch-output-hidden-float64",
    ),
    P(
        lambda w: moecore.StandardDispatchOutput(_D()["x"][::-1], topk_output=_topk()),
        Inv,
        "strides must be non-negative",
        id="dispatch-output-hidden-negative-stride",
    ),
    P(
        lambda w: moecore.StandardCombineInput(None),
        Inv,
        L("StandardCombineInput.hidden_states: expected a numpy array, got None"),
        id="combine-input-none",
    ),
    P(
        lambda w: moecore.StandardCombineInput([1.0]),
        DT,
        L("StandardCombineInput.hidden_states: expected a numpy array"),
        id="combine-input-list",
    ),
    P(
        lambda w: moecore.StandardCombineInput(np.zeros((T, H))),
        DT,
        "unsupported dtype float64",
        id="combine-input-float64",
    ),
    P(
        lambda w: moecore.StandardCombineInput(np.zeros((T, H), np.uint16)),
        DT,
        "a uint16 array is ambiguous",
        id="combine-input-uint16-untagged",
    ),
    P(
        lambda w: moecore.StandardTopKOutput(None, _D()["ids"]),
        Inv,
        L("topk_weights: expected a numpy array, got None"),
        id="topk-output-weights-none",
    ),
    P(
        lambda w: moecore.StandardTopKOutput(_D()["wts"], [[0, 1]]),
        DT,
        L("topk_ids: expected a numpy array"),
        id="topk-output-ids-list",
    ),
]

DISPATCHER_CASES = [
    P(
        lambda w: moecore.StandardDispatcher(8, ep_size=2, ep_rank=2),
        OOR,
        L("StandardDispatcher: expected ep_rank in [0, 2), got 2"),
        id="dispatcher-ep-rank-equal-size",
    ),
    P(
        lambda w: moecore.StandardDispatcher(8, ep_size=2, ep_rank=-1),
        OOR,
        L("expected ep_rank in [0, 2), got -1"),
        id="dispatcher-ep-rank-negative",
    ),
    P(
        lambda w: moecore.StandardDispatcher(8, ep_size=0),
        Inv,
        L("expected ep_size >= 1, got 0"),
        id="dispatcher-ep-size-zero",
    ),
    P(
        lambda w: moecore.StandardDispatcher(8, ep_size=3),
        Inv,
        L("routed experts (8) must divide evenly over ep_size 3"),
        id="dispatcher-experts-not-dividing",
    ),
    P(
        lambda w: moecore.StandardDispatcher(9, ep_size=2, num_fused_shared_experts=2),
        Inv,
        L("routed experts (7) must divide evenly over ep_size 2"),
        id="dispatcher-routed-experts-not-dividing-with-shared",
    ),
    P(
        lambda w: moecore.StandardDispatcher(4, num_fused_shared_experts=4),
        Inv,
        L("expected num_experts > num_fused_shared_experts >= 0, got 4 and 4"),
        id="dispatcher-all-experts-shared",
    ),
    P(
        lambda w: moecore.StandardDispatcher(4, num_fused_shared_experts=-1),
        Inv,
        L("expected num_experts > num_fused_shared_experts >= 0"),
        id="dispatcher-shared-negative",
    ),
    P(
        lambda w: moecore.StandardDispatcher(0),
        Inv,
        L("expected num_experts > num_fused_shared_experts"),
        id="dispatcher-zero-experts",
    ),
    P(
        lambda w: moecore.StandardDispatcher(4, runner_backend="bogus"),
        Inv,
        L("'bogus' is not a valid MoeRunnerBackend"),
        id="dispatcher-runner-backend-unknown",
    ),
    P(
        lambda w: _dispatch(w, ids=np.array([[0, 9, 8]] * T, np.int32)),
        OOR,
        L("StandardDispatcher.dispatch: topk_ids must be in [-1, 9), got 9 at [0, 1]"),
        id="dispatch-ids-equal-E",
    ),
    P(
        lambda w: _dispatch(w, ids=np.array([[0, -2, 8]] * T, np.int32)),
        OOR,
        L("topk_ids must be in [-1, 9), got -2"),
        id="dispatch-ids-minus-2",
    ),
    P(
        lambda w: _dispatch(w, ids=np.array([[0, 2**32, 8]] * T, np.int64)),
        OOR,
        L("topk_ids must be in [-1, 9), got 4294967296"),
        id="dispatch-ids-int64-2pow32",
    ),
    P(
        lambda w: _dispatch(w, ids=np.array([[0, 1, 8]] * T, np.float32)),
        DT,
        "StandardDispatcher.dispatch: topk_ids must be int32 or int64",
        id="dispatch-ids-float32",
    ),
    P(
        lambda w: _dispatch(w, ids=np.array([0, 1, 8], np.int32), wts=np.ones(3, np.float32)),
        Inv,
        L("StandardDispatcher.dispatch: expected topk_ids [T, k], got [3] i32"),
        id="dispatch-ids-1d",
    ),
    P(
        lambda w: _dispatch(w, x=None),
        Inv,
        L("StandardDispatcher.dispatch: hidden_states: expected a numpy array, got None"),
        id="dispatch-hidden-none",
    ),
    P(
        lambda w: _dispatch(w, x=[[1.0]]),
        DT,
        "hidden_states: expected a numpy array",
        id="dispatch-hidden-list",
    ),
    P(
        lambda w: _dispatch(w, topk=(np.ones((T, 3), np.float32), np.zeros((T, 3), np.int32))),
        DT,
        L("topk_output: expected a StandardTopKOutput or BypassedTopKOutput"),
        id="dispatch-topk-tuple",
    ),
    P(
        lambda w: moecore.StandardDispatcher(4).combine(object()),
        DT,
        "needs a 'format' attribute",
        id="dispatcher-combine-object",
    ),
    P(
        lambda w: moecore.StandardDispatcher(4).combine(_FormatOnly("standard")),
        DT,
        L("StandardDispatcher.combine: expected a StandardCombineInput"),
        id="dispatcher-combine-python-object",
    ),
    P(
        lambda w: moecore.StandardDispatcher(4).combine(_FormatOnly("bogus")),
        Inv,
        L("'bogus' is not a valid DispatchOutputFormat"),
        id="dispatcher-combine-bogus-format",
    ),
]

LAYER_CASES = [
    P(
        lambda w: _layer(tp_size=3),
        Inv,
        L("FusedMoE: intermediate_size 8 must divide evenly over tp_size 3"),
        id="layer-intermediate-not-divisible-by-tp",
    ),
    P(
        lambda w: _layer(tp_size=2, tp_rank=2),
        OOR,
        L("FusedMoE: rank out of range (tp 2/2, ep 0/1)"),
        id="layer-tp-rank-equal-size",
    ),
    P(
        lambda w: _layer(tp_rank=-1),
        OOR,
        L("rank out of range (tp -1/1"),
        id="layer-tp-rank-negative",
    ),
    P(
        lambda w: _layer(ep_size=2, ep_rank=2),
        OOR,
        L("rank out of range (tp 0/1, ep 2/2)"),
        id="layer-ep-rank-equal-size",
    ),
    P(
        lambda w: _layer(tp_size=0),
        Inv,
        L("expected tp_size, ep_size >= 1"),
        id="layer-tp-size-zero",
    ),
    P(
        lambda w: _layer(ep_size=0),
        Inv,
        L("expected tp_size, ep_size >= 1"),
        id="layer-ep-size-zero",
    ),
    P(
        lambda w: _layer(ep_size=3),
        Inv,
        L("routed experts (4) must divide evenly over ep_size 3"),
        id="layer-experts-not-divisible-by-ep",
    ),
    P(
        lambda w: _layer(hidden_size=0),
        Inv,
        L("expected hidden_size and intermediate_size > 0, got 0 and 8"),
        id="layer-hidden-zero",
    ),
    P(
        lambda w: _layer(intermediate_size=0),
        Inv,
        L("expected hidden_size and intermediate_size > 0"),
        id="layer-intermediate-zero",
    ),
    P(
        lambda w: _layer(a2a_backend="deepep"),
        Inv,
        L("FusedMoE: a2a backend 'deepep' needs a transport"),
        id="layer-a2a-deepep",
    ),
    P(
        lambda w: _layer(a2a_backend="flashinfer"),
        Inv,
        L("a2a backend 'flashinfer'"),
        id="layer-a2a-flashinfer",
    ),
    P(
        lambda w: _layer(a2a_backend="bogus"),
        Inv,
        L("No MoeA2ABackend member for value bogus"),
        id="layer-a2a-unknown",
    ),
    P(
        lambda w: _layer(topk_config=moecore.TopKConfig(top_k=0)),
        Inv,
        L("expected top_k >= 1, got 0"),
        id="layer-topk-zero",
    ),
    P(
        lambda w: _layer(topk_config=moecore.TopKConfig(top_k=E + 1)),
        Inv,
        L("expected routed top-k (top_k - num_fused_shared_experts = 5 - 0) in [1, 4]"),
        id="layer-topk-greater-than-experts",
    ),
    P(
        lambda w: _layer(
            num_experts=E + 1, topk_config=moecore.TopKConfig(top_k=1, num_fused_shared_experts=1)
        ),
        Inv,
        L("expected routed top-k (top_k - num_fused_shared_experts = 1 - 1)"),
        id="layer-topk-only-shared",
    ),
    P(
        lambda w: _layer(topk_config=moecore.TopKConfig(top_k=2, use_grouped_topk=True)),
        Inv,
        "expected num_expert_group and topk_group with use_grouped_topk",
        id="layer-grouped-topk-without-groups",
    ),
    P(
        lambda w: _layer(params_dtype="i32"),
        DT,
        L("params_dtype must be f32, f16 or bf16, got i32"),
        id="layer-params-dtype-int32",
    ),
    P(
        lambda w: _layer(params_dtype="nope"),
        Inv,
        L("unknown dtype 'nope'"),
        id="layer-params-dtype-unknown",
    ),
    P(
        lambda w: _layer(runner_config=moecore.MoeRunnerConfig(activation="nope", inplace=False)),
        Inv,
        L("Unsupported activation: activation='nope'"),
        id="layer-bad-activation",
    ),
    P(
        lambda w: _layer(runner_config=moecore.MoeRunnerConfig(no_combine=True, inplace=True)),
        Inv,
        L("no_combine requires inplace=False"),
        id="layer-no-combine-with-inplace",
    ),
    P(
        lambda w: _layer(runner_backend="bogus"),
        Inv,
        L("'bogus' is not a valid MoeRunnerBackend"),
        id="layer-runner-backend-unknown",
    ),
    P(
        lambda w: _layer(runner_backend="marlin").process_weights_after_loading(),
        Uns,
        L(
            "runner backend 'marlin' is not supported for unquantized MoE (supported: auto, triton, "
            "torch_native, deep_gemm)"
        ),
        id="layer-marlin-unquantized",
    ),
    P(
        lambda w: _layer(runner_backend="deep_gemm").process_weights_after_loading(),
        DT,
        L("runner backend 'deep_gemm' runs DeepGEMM BF16, which needs bf16 weights"),
        id="layer-deep-gemm-unquantized-f32",
    ),
    P(
        lambda w: _layer().forward(w(_D()["x"]), w(_D()["x"][:, :E].copy())),
        Inv,
        L("FusedMoE.forward: call process_weights_after_loading() first"),
        id="layer-forward-before-process-weights",
    ),
    P(
        lambda w: _layer().forward_topk(w(_D()["x"]), _topk()),
        Inv,
        L("call process_weights_after_loading() first"),
        id="layer-forward-topk-before-process-weights",
    ),
    P(
        lambda w: _processed_layer().forward(
            w(_D()["x"].astype(np.float16)), _D()["x"][:, :E].copy()
        ),
        DT,
        L("hidden_states dtype must equal the weights' (f32)"),
        id="layer-forward-x-dtype",
    ),
    P(
        lambda w: _processed_layer().forward(None, _D()["x"][:, :E].copy()),
        Inv,
        L("FusedMoE.forward: hidden_states: expected a numpy array, got None"),
        id="layer-forward-x-none",
    ),
    P(
        lambda w: _processed_layer().forward_topk(w(_D()["x"]), (_D()["wts"], _D()["ids"])),
        DT,
        "topk_output",
        id="layer-forward-topk-tuple",
    ),
]


def _processed_layer(**kw):
    layer = _layer(**kw)
    layer.process_weights_after_loading()
    return layer


_W1 = lambda: np.ones((I, H), np.float32)
_W2 = lambda: np.ones((H, I), np.float32)

WEIGHT_LOADER_CASES = [
    P(
        lambda w: _load(w, "w13_weight", _W1(), "w4", 0),
        Inv,
        L("FusedMoE.weight_loader: shard_id must be 'w1', 'w2' or 'w3', got 'w4'"),
        id="loader-shard-id-unknown",
    ),
    P(
        lambda w: _load(w, "w13_weight", _W1(), "", 0),
        Inv,
        L("shard_id must be 'w1', 'w2' or 'w3', got ''"),
        id="loader-shard-id-empty",
    ),
    P(
        lambda w: _load(w, "w13_weight", _W1(), "W1", 0),
        Inv,
        L("got 'W1'"),
        id="loader-shard-id-upper-case",
    ),
    P(
        lambda w: _load(w, "w13_weight", _W1().astype(np.float16), "w1", 0),
        DT,
        L("FusedMoE.weight_loader: w13_weight holds f32, got [8, 16] f16"),
        id="loader-dtype-f16-into-f32",
    ),
    P(
        lambda w: _load(w, "w13_weight", _bf16(_W1()), "w1", 0, params_dtype="f16"),
        DT,
        L("w13_weight holds f16, got [8, 16] bf16"),
        id="loader-dtype-bf16-into-f16",
    ),
    P(
        lambda w: _load(w, "w2_weight", _W2().astype(np.float64), "w2", 0),
        DT,
        "unsupported dtype float64",
        id="loader-dtype-float64",
    ),
    P(
        lambda w: _load(w, "w13_weight", np.ones((I, H), np.uint16), "w1", 0, params_dtype="bf16"),
        DT,
        "a uint16 array is ambiguous",
        id="loader-uint16-untagged",
    ),
    P(
        lambda w: _load(w, "w13_weight", np.ones((I, H - 1), np.float32), "w1", 0),
        Inv,
        L("expected w13_weight shard 'w1' [8, 16], got [8, 15] f32"),
        id="loader-w1-shape",
    ),
    P(
        lambda w: _load(w, "w13_weight", np.ones((2 * I, H), np.float32), "w3", 0),
        Inv,
        L("expected w13_weight shard 'w3' [8, 16], got [16, 16] f32"),
        id="loader-w3-fused-shape",
    ),
    P(
        lambda w: _load(w, "w13_weight", np.ones((I // 2, H), np.float32), "w1", 0, tp_size=2),
        Inv,
        L("expected w13_weight shard 'w1' [8, 16], got [4, 16] f32"),
        id="loader-w1-already-tp-sliced",
    ),
    P(
        lambda w: _load(w, "w2_weight", np.ones((I, H), np.float32), "w2", 0),
        Inv,
        L("expected w2_weight shard 'w2' [16, 8], got [8, 16] f32"),
        id="loader-w2-transposed",
    ),
    P(
        lambda w: _load(w, "w13_weight", np.ones((H,), np.float32), "w1", 0),
        Inv,
        L("expected w13_weight shard 'w1' [8, 16], got [16] f32"),
        id="loader-1d-weight",
    ),
    P(
        lambda w: _load(w, "w13_weight", np.ones((1, I, H), np.float32), "w1", 0),
        Inv,
        L("expected w13_weight shard 'w1' [8, 16], got [1, 8, 16] f32"),
        id="loader-3d-weight",
    ),
    P(
        lambda w: _load(w, "w13_weight", None, "w1", 0),
        Inv,
        L("weight_loader: loaded_weight: expected a numpy array, got None"),
        id="loader-weight-none",
    ),
    P(
        lambda w: _load(w, "w13_weight", [[1.0]], "w1", 0),
        DT,
        "loaded_weight: expected a numpy array",
        id="loader-weight-list",
    ),
    P(
        lambda w: _load(w, "w13_weight", _W1()[::-1], "w1", 0),
        Inv,
        "strides must be non-negative",
        id="loader-weight-negative-stride",
    ),
    P(
        lambda w: _load(w, "w13_weight", _W1(), "w1", E),
        OOR,
        L("FusedMoE.weight_loader: expert_id must be in [0, 4), got 4"),
        id="loader-expert-id-equal-E",
    ),
    P(
        lambda w: _load(w, "w13_weight", _W1(), "w1", -1),
        OOR,
        L("expert_id must be in [0, 4), got -1"),
        id="loader-expert-id-negative",
    ),
    P(
        lambda w: _load(w, "w2_weight", _W2(), "w2", 2**40),
        OOR,
        L("expert_id must be in [0, 4)"),
        id="loader-expert-id-huge",
    ),
    P(
        lambda w: _load(w, "w13_weight", _W1(), "w1", E, ep_size=2, ep_rank=1),
        OOR,
        L("expert_id must be in [0, 4), got 4"),
        id="loader-expert-id-out-of-range-ep",
    ),
    P(
        lambda w: _load(w, "w13_weight", _W2(), "w2", 0),
        Inv,
        L("shard 'w2' does not belong to w13_weight"),
        id="loader-w2-shard-into-w13",
    ),
    P(
        lambda w: _load(w, "w2_weight", _W1(), "w1", 0),
        Inv,
        L("shard 'w1' does not belong to w2_weight"),
        id="loader-w1-shard-into-w2",
    ),
    P(
        lambda w: _load(w, "w2_weight", _W1(), "w3", 0),
        Inv,
        L("shard 'w3' does not belong to w2_weight"),
        id="loader-w3-shard-into-w2",
    ),
    P(
        lambda w: _load(
            w,
            "w13_weight",
            _W1(),
            "w3",
            0,
            runner_config=moecore.MoeRunnerConfig(
                activation="relu2", is_gated=False, inplace=False
            ),
        ),
        Inv,
        L("shard 'w3' needs a gated layer"),
        id="loader-w3-on-non-gated",
    ),
    P(
        lambda w: _load(w, "w1_weight", _W1(), "w1", 0),
        Inv,
        L("FusedMoE: no parameter 'w1_weight' (have: w13_weight, w2_weight)"),
        id="loader-unknown-parameter",
    ),
    P(
        lambda w: _load(w, "w13_weight_bias", np.ones((I,), np.float32), "w1", 0),
        Inv,
        L("no parameter 'w13_weight_bias'"),
        id="loader-bias-without-with-bias",
    ),
    P(
        lambda w: _load(
            w, "w13_weight_bias", np.ones((I - 1,), np.float32), "w1", 0, with_bias=True
        ),
        Inv,
        L("expected w13_weight_bias shard 'w1' [8], got [7] f32"),
        id="loader-w13-bias-shape",
    ),
    P(
        lambda w: _load(w, "w2_weight_bias", np.ones((1, H), np.float32), "w2", 0, with_bias=True),
        Inv,
        L("expected w2_weight_bias shard 'w2' [16], got [1, 16] f32"),
        id="loader-w2-bias-2d",
    ),
    P(
        lambda w: _load(w, "w2_weight_bias", np.ones((H,), np.float32), "w1", 0, with_bias=True),
        Inv,
        L("shard 'w1' does not belong to w2_weight_bias"),
        id="loader-w2-bias-wrong-shard",
    ),
    P(
        lambda w: _load(w, "w13_weight_bias", np.ones((I,), np.float16), "w1", 0, with_bias=True),
        DT,
        L("w13_weight_bias holds f32, got [8] f16"),
        id="loader-bias-dtype",
    ),
]

PROCESS_CASES = [
    P(
        lambda w: _set_threads(0),
        Inv,
        L("set_num_threads: expected 1..1024, got 0"),
        id="set-num-threads-zero",
    ),
    P(
        lambda w: _set_threads(-1),
        Inv,
        L("set_num_threads: expected 1..1024, got -1"),
        id="set-num-threads-negative",
    ),
    P(
        lambda w: _set_threads(2000),
        Inv,
        L("set_num_threads: expected 1..1024, got 2000"),
        id="set-num-threads-too-many",
    ),
    P(
        lambda w: moecore.set_isa_level("nope"),
        Inv,
        L("unknown ISA level 'nope' (valid: scalar, avx2, avx512"),
        id="set-isa-level-unknown",
    ),
    P(
        lambda w: _set_isa_unavailable(),
        Uns,
        "is not available on this machine and build",
        id="set-isa-level-unavailable",
    ),
    P(
        lambda w: moecore.set_moe_a2a_backend("bogus"),
        Inv,
        L("No MoeA2ABackend member for value bogus"),
        id="set-a2a-backend-unknown",
    ),
    P(
        lambda w: moecore.set_moe_runner_backend("bogus"),
        Inv,
        L("'bogus' is not a valid MoeRunnerBackend"),
        id="set-runner-backend-unknown",
    ),
    P(
        lambda w: moecore.set_deepep_mode("bogus"),
        Inv,
        L("'bogus' is not a valid DeepEPMode (valid: normal, low_latency, auto)"),
        id="set-deepep-mode-unknown",
    ),
    P(
        lambda w: moecore.MoeRunnerBackend("bogus"),
        ValueError,
        L("'bogus' is not a valid MoeRunnerBackend"),
        id="enum-runner-backend-unknown",
    ),
    P(
        lambda w: moecore.MoeRunnerBackend("TRITON"),
        ValueError,
        L("'TRITON' is not a valid MoeRunnerBackend"),
        id="enum-runner-backend-member-name",
    ),
    P(
        lambda w: moecore.MoeA2ABackend("bogus"),
        ValueError,
        "^" + L("No MoeA2ABackend member for value bogus") + "$",
        id="enum-a2a-backend-unknown",
    ),
    P(
        lambda w: moecore.DeepEPMode("bogus"),
        ValueError,
        L("'bogus' is not a valid DeepEPMode"),
        id="enum-deepep-mode-unknown",
    ),
    P(
        lambda w: moecore.DispatchOutputFormat("bogus"),
        ValueError,
        L("'bogus' is not a valid DispatchOutputFormat"),
        id="enum-dispatch-format-unknown",
    ),
    P(
        lambda w: moecore.TopKOutputFormat(7),
        ValueError,
        "7 is not a valid TopKOutputFormat",
        id="enum-topk-format-unknown",
    ),
    P(
        lambda w: moecore.select_experts(None, [[1.0, 2.0]], moecore.TopKConfig(top_k=1)),
        DT,
        L("select_experts: router_logits: expected a numpy array, got ") + "(<class ')?list",
        id="select-experts-logits-list",
    ),
    P(
        lambda w: moecore.select_experts(
            [[1.0]], np.zeros((1, E), np.float32), moecore.TopKConfig(top_k=1)
        ),
        DT,
        L("select_experts: hidden_states: expected a numpy array, got ") + "(<class ')?list",
        id="select-experts-hidden-list",
    ),
    P(
        lambda w: moecore.select_experts(None, None, moecore.TopKConfig(top_k=1)),
        Inv,
        L("select_experts: router_logits: expected a numpy array, got None"),
        id="select-experts-logits-none",
    ),
    P(
        lambda w: moecore.select_experts(None, 3.0, moecore.TopKConfig(top_k=1)),
        DT,
        L("router_logits: expected a numpy array, got ") + "(<class ')?float",
        id="select-experts-logits-scalar",
    ),
    P(
        lambda w: moecore.tagged([1, 2], "bf16"),
        DT,
        L("tagged: expected a numpy array, got list"),
        id="tagged-list",
    ),
    P(
        lambda w: moecore.StandardCombineInput(moecore.tagged(np.zeros((3, 4), np.int16), "bf16")),
        DT,
        "a bf16 tag needs a uint16 array",
        id="tagged-bf16-over-int16",
    ),
    P(
        lambda w: moecore.StandardCombineInput(moecore.tagged(np.zeros((3, 4), np.uint32), "f16")),
        DT,
        "a f16 tag needs a uint16 array",
        id="tagged-f16-over-uint32",
    ),
    P(
        lambda w: moecore.StandardCombineInput(
            moecore.tagged(np.zeros((3, 4), np.uint16), "fp8_e4m3fn")
        ),
        DT,
        "a fp8_e4m3fn tag needs a uint8 array",
        id="tagged-fp8-over-uint16",
    ),
    P(
        lambda w: moecore.StandardCombineInput(
            moecore.tagged(np.zeros((3, 4), np.uint16)[::-1], "bf16")
        ),
        Inv,
        "strides must be non-negative",
        id="tagged-negative-stride",
    ),
    P(
        lambda w: moecore.dtypes.to_f32(np.zeros(3, np.uint16)),
        DT,
        "a uint16 array is ambiguous",
        id="dtypes-to-f32-uint16",
    ),
    P(
        lambda w: moecore.dtypes.round_to(np.zeros(3, np.float32), "f8"),
        Inv,
        L("round_to: unknown dtype 'f8'"),
        id="dtypes-round-to-unknown",
    ),
    P(
        lambda w: moecore.register_fused_func("bogus", "triton", lambda *a: None),
        Inv,
        L("No MoeA2ABackend member for value bogus"),
        id="register-fused-unknown-a2a",
    ),
    P(
        lambda w: moecore.register_fused_func("none", "bogus", lambda *a: None),
        Inv,
        L("'bogus' is not a valid MoeRunnerBackend"),
        id="register-fused-unknown-runner",
    ),
    P(
        lambda w: moecore.register_pre_permute("bogus", "triton", lambda *a: None),
        Inv,
        L("'bogus' is not a valid DispatchOutputFormat"),
        id="register-pre-permute-unknown-format",
    ),
    P(
        lambda w: moecore.register_post_permute("triton", "bogus", lambda *a: None),
        Inv,
        L("'bogus' is not a valid DispatchOutputFormat"),
        id="register-post-permute-unknown-format",
    ),
    P(
        lambda w: moecore.register_runner_core("bogus", lambda c: None),
        Inv,
        L("'bogus' is not a valid MoeRunnerBackend"),
        id="register-runner-core-unknown",
    ),
    P(
        lambda w: moecore.register_runner_core("triton", lambda c: None),
        Inv,
        L("Runner core for triton is already registered."),
        id="register-runner-core-built-in",
    ),
    P(
        lambda w: moecore.register_fused_func("none", "triton", lambda *a: None),
        Inv,
        L("Fused function for none to triton is already registered."),
        id="register-fused-built-in",
    ),
    P(
        lambda w: moecore.unregister_fused_func("bogus", "triton"),
        Inv,
        L("No MoeA2ABackend member for value bogus"),
        id="unregister-fused-unknown-a2a",
    ),
    P(
        lambda w: _register_then_unregister_fused(5),
        DT,
        "expected a callable, got int",
        id="register-fused-not-callable",
    ),
]

# ---------------------------------------------------------------------------------------------
# Expert parallelism: transports, the DeepEP / FlashInfer dispatchers, ExpertParallelGroup.

EP_H = 128


def _deepep(ranks=1, **kw):
    args = dict(num_experts=4, num_local_experts=4 // ranks, hidden_size=EP_H, top_k=2,
                num_max_dispatch_tokens_per_rank=4)
    args.update(kw)
    return moecore.DeepEPDispatcher(moecore.LoopbackGroup(ranks).transport(0), **args)


def _flashinfer(**kw):
    args = dict(num_experts=4, num_local_experts=4, hidden_size=EP_H, top_k=2)
    args.update(kw)
    return moecore.FlashinferDispatcher(moecore.LoopbackGroup(1).transport(0), **args)


def _ep_batch(w, t=3, dtype=ml_dtypes.bfloat16, ids=None, h=EP_H):
    x = w(np.ones((t, h), dtype))
    ids = w(np.array([[0, 1]] * t, np.int32) if ids is None else ids)
    return x, moecore.StandardTopKOutput(w(np.full(ids.shape, 0.5, np.float32)), ids)


def _ep_dispatch(w, d=None, **kw):
    x, topk = _ep_batch(w, **kw)
    return (d or _deepep()).dispatch(x, topk)


def _deepep_with(mode, config, w):
    d = _deepep(mode=mode)
    d.set_quant_config(config)
    return _ep_dispatch(w, d)


def _deepep_combine_wrong_format(w):
    d = _deepep(mode="low_latency")
    _ep_dispatch(w, d)
    d.combine(moecore.DeepEPNormalCombineInput(w(np.zeros((3, 2, EP_H), ml_dtypes.bfloat16)),
                                               np.zeros((3, 2), np.int32),
                                               np.zeros((3, 2), np.float32)))


def _deepep_combine_bad_shape(w):
    d = _deepep(mode="low_latency")
    _ep_dispatch(w, d)
    d.combine(moecore.DeepEPLLCombineInput(w(np.zeros((4, 3, EP_H), ml_dtypes.bfloat16)),
                                           np.zeros((3, 2), np.int32),
                                           np.zeros((3, 2), np.float32)))


def _deepep_combine_f32(w):
    d = _deepep(mode="normal")
    _ep_dispatch(w, d)
    d.combine(moecore.DeepEPNormalCombineInput(w(np.zeros((3, 2, EP_H), np.float32)),
                                               np.zeros((3, 2), np.int32),
                                               np.zeros((3, 2), np.float32)))


def _deepep_twice(w):
    d = _deepep()
    x, topk = _ep_batch(w)
    d.dispatch_a(x, topk)
    d.dispatch_a(x, topk)


def _flashinfer_combine_bad_shape(w):
    d = _flashinfer()
    _ep_dispatch(w, d)
    d.combine(moecore.FlashinferCombineInput(w(np.zeros((2, EP_H), ml_dtypes.bfloat16))))


def _group(ranks=2, **kw):
    args = dict(num_experts=4, hidden_size=EP_H, intermediate_size=64,
                topk_config=moecore.TopKConfig(top_k=2), runner_backend="deep_gemm",
                num_max_dispatch_tokens_per_rank=4)
    args.update(kw)
    return moecore.ExpertParallelGroup(ranks, **args)


def _group_forward(w, hidden, logits, ranks=2):
    g = _group(ranks)
    g.process_weights_after_loading()
    return g.forward([w(h) for h in hidden], [w(x) for x in logits], is_extend_in_batch=True)


_BF = ml_dtypes.bfloat16
EP_CASES = [
    P(lambda w: moecore.LoopbackGroup(0), Inv, L("expected 1..1024 ranks, got 0"), id="loopback-zero-ranks"),
    P(lambda w: moecore.LoopbackGroup(2).transport(2), OOR, L("rank must be in [0, 2), got 2"), id="loopback-rank-out-of-range"),
    P(lambda w: moecore.DeepEPDispatcher(None, num_experts=4, num_local_experts=4, hidden_size=8, top_k=1), Inv, L("a transport is required"), id="deepep-no-transport"),
    P(lambda w: _deepep(num_local_experts=3), Inv, L("must divide evenly over 1 ranks"), id="deepep-uneven-experts"),
    P(lambda w: _deepep(ranks=3), Inv, L("num_experts (4) must divide evenly over 3 ranks"), id="deepep-experts-not-dividing-ranks"),
    P(lambda w: _deepep(top_k=5), Inv, L("expected top_k in [1, 4], got 5"), id="deepep-topk-too-large"),
    P(lambda w: _deepep(hidden_size=0), Inv, L("expected hidden_size and num_experts > 0"), id="deepep-zero-hidden"),
    P(lambda w: _deepep(num_max_dispatch_tokens_per_rank=1025), Inv, L("must be in [1, 1024], got 1025"), id="deepep-capacity-above-1024"),
    P(lambda w: _deepep(expert_alignment=0), Inv, L("expected expert_alignment >= 1"), id="deepep-alignment-zero"),
    P(lambda w: _deepep(mode="sometimes"), Inv, "DeepEPMode", id="deepep-unknown-mode"),
    P(lambda w: _deepep(round_scale=True, runner_backend="cutlass"), Inv, L("round_scale/use_ue8m0 apply only to an FP8 payload"), id="deepep-R5-round-scale-bf16"),
    P(lambda w: _deepep(use_ue8m0=True, runner_backend="flashinfer_cutedsl"), Inv, L("round_scale/use_ue8m0"), id="deepep-R5-ue8m0-bf16"),
    P(lambda w: _ep_dispatch(w, dtype=np.float32), DT, "hidden_states dtype must equal", id="deepep-hidden-f32"),
    P(lambda w: _ep_dispatch(w, h=64), Inv, L("expected hidden_states [T, 128]"), id="deepep-hidden-wrong-width"),
    P(lambda w: _ep_dispatch(w, ids=np.array([[0, 4]] * 3, np.int32)), OOR, L("topk_ids must be in [-1, 4), got 4"), id="deepep-id-too-large"),
    P(lambda w: _ep_dispatch(w, ids=np.array([[0, -2]] * 3, np.int32)), OOR, L("got -2"), id="deepep-id-below-minus-one"),
    P(lambda w: _ep_dispatch(w, ids=np.array([[0]] * 3, np.int32)), Inv, L("expected top_k 2 ids per token, got 1"), id="deepep-wrong-topk-width"),
    P(lambda w: _ep_dispatch(w, ids=np.array([[0, 1]] * 3, np.float32)), DT, "topk_ids must be int32 or int64", id="deepep-float-ids"),
    P(lambda w: _ep_dispatch(w, _deepep(mode="low_latency"), t=5), Inv, L("low-latency dispatch of 5 tokens exceeds num_max_dispatch_tokens_per_rank = 4"), id="deepep-ll-capacity-overflow"),
    P(lambda w: _deepep_with("low_latency", {"input_global_scale": -1.0}, w), Inv, L("input_global_scale'] must be finite and > 0"), id="deepep-negative-global-scale"),
    P(lambda w: _deepep_with("low_latency", {"input_global_scale": np.ones(2, np.float32)}, w), DT, L("must hold one float32 value"), id="deepep-global-scale-two-values"),
    P(lambda w: _deepep_with("low_latency", {"dispatcher_output_dtype": "int8"}, w), Uns, L("'int8' is not supported"), id="deepep-int8-payload"),
    P(lambda w: _deepep_with("low_latency", {"dispatcher_output_dtype": "fp16"}, w), Inv, L("expected dispatcher_output_dtype bf16, fp8 or nvfp4, got 'fp16'"), id="deepep-unknown-payload"),
    P(lambda w: _deepep_with("low_latency", {"dispatcher_output_dtype": "nvfp4"}, w), Inv, L("an NVFP4 payload needs quant_config['input_global_scale']"), id="deepep-nvfp4-without-scale"),
    P(lambda w: _deepep_with("low_latency", {"dispatcher_output_dtype": 3}, w), DT, L("must be a string"), id="deepep-payload-not-string"),
    P(lambda w: _deepep().dispatch_b(), CA, L("dispatch_b: called in stage INITIAL, expected AFTER_DISPATCH_A"), id="deepep-dispatch-b-first"),
    P(lambda w: _deepep().combine_b(), CA, L("combine_b: called in stage INITIAL"), id="deepep-combine-b-first"),
    P(_deepep_twice, CA, L("dispatch_a: called in stage AFTER_DISPATCH_A, expected INITIAL"), id="deepep-dispatch-a-twice"),
    P(_deepep_combine_wrong_format, DT, L("this round ran low_latency, so expected a DeepEPLLCombineInput"), id="deepep-combine-wrong-format"),
    P(_deepep_combine_bad_shape, Inv, L("expected contiguous hidden_states [4, 4, 128]"), id="deepep-combine-bad-shape"),
    P(_deepep_combine_f32, DT, L("expected bf16 expert outputs"), id="deepep-combine-f32"),
    P(lambda w: _flashinfer(num_local_experts=2), Inv, L("must divide evenly over 1 ranks"), id="flashinfer-uneven-experts"),
    P(lambda w: _flashinfer(top_k=0), Inv, L("expected top_k in [1, 4], got 0"), id="flashinfer-topk-zero"),
    P(lambda w: _ep_dispatch(w, _flashinfer(), dtype=np.float32), DT, "hidden_states dtype must equal", id="flashinfer-hidden-f32"),
    P(lambda w: _ep_dispatch(w, _flashinfer(), ids=np.array([[0, 9]] * 3, np.int32)), OOR, L("got 9"), id="flashinfer-id-too-large"),
    P(lambda w: _flashinfer().combine(moecore.FlashinferCombineInput(np.zeros((1, EP_H), _BF))), CA, L("called before dispatch"), id="flashinfer-combine-first"),
    P(_flashinfer_combine_bad_shape, Inv, L("expected contiguous hidden_states [3, 128]"), id="flashinfer-combine-bad-shape"),
    P(lambda w: _group(a2a_backend="none"), Inv, L("expected a2a_backend deepep or flashinfer, got 'none'"), id="ep-group-a2a-none"),
    P(lambda w: _group(ranks=3), Inv, L("num_experts (4) must divide evenly over 3 ranks"), id="ep-group-uneven"),
    P(lambda w: _group(quant_method=5), DT, L("quant_method must be a callable"), id="ep-group-method-not-callable"),
    P(lambda w: _group(a2a_backend="mooncake"), Inv, L("got 'mooncake'"), id="ep-group-mooncake"),
    P(lambda w: _group(runner_backend="triton"), CA, L("Unquantized DeepEP low-latency MoE requires DeepGEMM BF16"), id="ep-group-R6-triton"),
    P(lambda w: _group(deepep_mode="normal"), Uns, L("legacy DeepEPMoE path"), id="ep-group-legacy-path"),
    P(lambda w: _group(runner_backend="marlin"), Uns, L("requires a fused func for a2a backend deepep"), id="ep-group-R1-marlin"),
    P(lambda w: _group_forward(w, [np.ones((2, EP_H), _BF)], [np.ones((2, 4), np.float32)]), Inv, L("expected one entry per rank (2), got 1"), id="ep-group-forward-one-rank-given"),
    P(lambda w: _group_forward(w, [np.ones((2, EP_H), _BF), np.ones((2, 64), _BF)], [np.ones((2, 4), np.float32)] * 2), Inv, L("expected hidden_states [T, 128]"), id="ep-group-forward-bad-width"),
    P(lambda w: _group(ranks=2).layers[0].dispatcher.dispatch_b(), CA, L("called in stage INITIAL"), id="ep-group-layer-dispatcher-order"),
    P(lambda w: moecore.FusedMoE(num_experts=4, hidden_size=EP_H, intermediate_size=64, topk_config=moecore.TopKConfig(top_k=2), a2a_backend="deepep", runner_backend="deep_gemm"), Inv, L("needs a transport"), id="layer-deepep-no-transport"),
    P(lambda w: moecore.FusedMoE(num_experts=4, hidden_size=EP_H, intermediate_size=64, topk_config=moecore.TopKConfig(top_k=2), a2a_backend="deepep", runner_backend="deep_gemm", transport=moecore.LoopbackGroup(2).transport(1)), Inv, L("ep_size/ep_rank (1/0) must match the transport (2/1)"), id="layer-deepep-transport-mismatch"),
]


CASES = (
    CONFIG_CASES
    + CONSTRUCTION_CASES
    + RUN_CASES
    + QUANT_INFO_CASES
    + DISPATCH_TYPE_CASES
    + DISPATCHER_CASES
    + LAYER_CASES
    + WEIGHT_LOADER_CASES
    + PROCESS_CASES
    + EP_CASES
)


@pytest.mark.parametrize("call, exc, pattern", CASES)
def test_bad_input(call, exc, pattern):
    watch = _Watch()
    with pytest.raises(exc, match=pattern) as info:
        call(watch)
    if exc in BUILTIN:
        assert isinstance(info.value, moecore.MoecoreError)
        assert isinstance(info.value, BUILTIN[exc])
    watch.assert_unchanged()


def test_case_count():
    """TESTING.md asks for a large bad-input table; keep it from silently shrinking."""
    assert len(CASES) >= 150
    ids = [p.id for p in CASES]
    assert len(ids) == len(set(ids)), "duplicate case ids"


def test_failed_run_leaves_runner_usable():
    """A failing call must not poison the runner: the next good call gives the same output as a
    fresh runner's."""
    d = _data(seed=3)
    runner = moecore.MoeRunner("triton", moecore.MoeRunnerConfig(inplace=False))
    q = moecore.TritonMoeQuantInfo(w13_weight=d["w13"], w2_weight=d["w2"])
    good = moecore.StandardDispatchOutput(
        d["x"], topk_output=moecore.StandardTopKOutput(d["wts"], d["ids"])
    )
    bad = moecore.StandardDispatchOutput(
        d["x"], topk_output=moecore.StandardTopKOutput(d["wts"], np.full((T, K), E, np.int32))
    )
    with pytest.raises(moecore.OutOfRangeError):
        runner.run(bad, q)
    fresh = moecore.MoeRunner("triton", moecore.MoeRunnerConfig(inplace=False)).run(good, q)
    assert np.array_equal(runner.run(good, q).hidden_states, fresh.hidden_states)


def test_failed_weight_loader_leaves_layer_loadable():
    """After a rejected shard, loading the right shard still lands in the right rows."""
    layer = _layer()
    with pytest.raises(moecore.InvalidArgumentError):
        layer.weight_loader("w13_weight", np.ones((I, H - 1), np.float32), "w", "w1", 1)
    w1 = np.arange(I * H, dtype=np.float32).reshape(I, H)
    assert layer.weight_loader("w13_weight", w1, "w", "w1", 1) is True
    w13 = layer.parameter("w13_weight")
    assert np.array_equal(w13[1, :I], w1)
    assert not w13[0].any() and not w13[1, I:].any()


def test_binding_signature_errors_are_type_errors():
    """Wrong argument kinds rejected by the binding's signature surface as TypeError (pybind11's
    own, not a MoecoreError): a missing required keyword, a positional-only misuse, a non-config
    object."""
    d = _data()
    with pytest.raises(TypeError):
        moecore.TritonMoeQuantInfo(w13_weight=d["w13"])  # w2_weight missing
    with pytest.raises(TypeError):
        moecore.TritonMoeQuantInfo(d["w13"], d["w2"])  # keyword-only
    with pytest.raises(TypeError):
        moecore.MoeRunner("triton", {"inplace": False})
    with pytest.raises(TypeError):
        moecore.MoeRunnerConfig(activation=5)
