"""Runner backend flashinfer_cutlass (fused-only; keys (none|flashinfer, flashinfer_cutlass)):
each quant type ("bf16", "fp8", "fp4") against its numpy twin in moecore.reference.moe_nvfp4,
the NVFP4 algebra against a float64 dequantized oracle, the input quantization bit-exact against
the reference quantizer, EP offsets, routed scaling, R9 (empty input), R15 guards, determinism
and batch invariance, and a bad-input table.
"""

from __future__ import annotations

import re
import zlib

import ml_dtypes
import moecore
import moecore.formats as mf
import numpy as np
import pytest
from moecore.dtypes import to_f32
from moecore.reference import moe_nvfp4 as R
from moecore.reference import quant as RQ
from moecore.testing import (
    assert_bitwise_equal,
    assert_close,
    assert_isa_levels_agree,
    error_stats,
)
from moecore.testing import nvfp4 as N

_m = moecore._moecore
Info = _m.FlashInferCutlassMoeQuantInfo
BF16 = ml_dtypes.bfloat16
F32 = np.float32
L = re.escape
BACKEND = "flashinfer_cutlass"


def _ref(problem, **extra):
    kw = dict(problem["kwargs"])
    qt = kw.pop("quant_type")
    w13, w2 = kw.pop("w13_weight"), kw.pop("w2_weight")
    kw.pop("moe_ep_size", None)
    kw.pop("moe_ep_rank", None)
    return R.flashinfer_cutlass_moe_ref(
        problem["x"],
        problem["topk_ids"],
        problem["topk_weights"],
        quant_type=qt,
        w13=w13,
        w2=w2,
        **kw,
        **extra,
    )


def _make(quant_type, rng, t, e, h, i, k, gated=True, **kw):
    if quant_type == "fp4":
        return N.make_fp4_moe(rng, t, e, h, i, k, gated=gated, **kw)
    if quant_type == "fp8":
        return N.make_fp8_moe(rng, t, e, h, i, k, gated=gated, **kw)
    return N.make_bf16_moe(rng, t, e, h, i, k, gated=gated, **kw)


ACTS = [("silu", True), ("gelu", True), ("relu2", False)]


# ---------------------------------------------------------------------------------------------
# Each quant type against its numpy twin.


@pytest.mark.parametrize("quant_type", ["bf16", "fp8", "fp4"])
@pytest.mark.parametrize("act,gated", ACTS, ids=[a for a, _ in ACTS])
@pytest.mark.parametrize(
    "t,e,h,i,k", [(1, 4, 32, 16, 1), (7, 5, 48, 32, 2), (64, 8, 64, 48, 3)], ids=["T1", "T7", "T64"]
)
def test_matches_reference(quant_type, act, gated, t, e, h, i, k):
    # A seed of the parameters that is the same in every process (hash() of a str is not).
    rng = np.random.default_rng(zlib.crc32(f"{quant_type}-{act}-{t}".encode()))
    p = _make(quant_type, rng, t, e, h, i, k, gated=gated)
    out = N.run_runner(BACKEND, p, Info(**p["kwargs"]), activation=act, is_gated=gated)
    ref = _ref(p, activation=act, is_gated=gated)
    want_dtype = BF16 if quant_type == "fp4" else p["x"].dtype
    assert out.dtype == want_dtype and out.shape == (t, h)
    assert_close(to_f32(out), ref, "bf16")
    # The scalar row and its twin agree bit for bit in practice (the same fp32 order; only libm
    # exp/erf could flip a last bit). Faster levels sum in another order, and an intermediate
    # rounded to bf16 carries a last-bit difference to many outputs.
    scalar = N.run_runner(
        BACKEND, p, Info(**p["kwargs"]), activation=act, is_gated=gated, isa_level="scalar"
    )
    assert np.mean(to_f32(scalar) == ref) > 0.99


@pytest.mark.parametrize("x_dtype", [np.float32, np.float16, BF16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("quant_type", ["fp8", "fp4"])
def test_input_dtypes_and_output_dtype(quant_type, x_dtype):
    rng = np.random.default_rng(3)
    p = _make(quant_type, rng, 9, 4, 32, 32, 2, x_dtype=x_dtype)
    out = N.run_runner(BACKEND, p, Info(**p["kwargs"]))
    assert out.dtype == (BF16 if quant_type == "fp4" else np.dtype(x_dtype))
    assert_close(to_f32(out), _ref(p), "bf16")
    kw = dict(p["kwargs"], output_dtype="f32")
    out32 = N.run_runner(BACKEND, p, Info(**kw))
    assert out32.dtype == np.float32
    assert_close(out32, _ref(p, output_dtype="f32"), "f32")


def test_fp4_algebra_against_float64_dequantized_oracle():
    """alpha · Σ (qa·sa)(qw·sw) must equal Σ x̂·ŵ of the dequantized operands (x̂ = q·s/gs):
    checked against an independent float64 loop over dequantized weights and activations."""
    rng = np.random.default_rng(11)
    t, e, h, i, k = 16, 4, 64, 32, 2
    p = N.make_fp4_moe(rng, t, e, h, i, k)
    out = to_f32(N.run_runner(BACKEND, p, Info(**p["kwargs"])))
    ex = p["experts"]
    w13 = mf.dequantize_nvfp4(ex.w13, ex.w13_sf, ex.w13_gs).astype(np.float64)  # [Gate; Up]
    w2 = mf.dequantize_nvfp4(ex.w2, ex.w2_sf, ex.w2_gs).astype(np.float64)
    a1, a2 = p["a1_gs"], p["a2_gs"]
    xq, xs = RQ.quantize_nvfp4_ref(np.asarray(p["x"], F32), a1)
    x = RQ.dequantize_nvfp4_ref(xq, xs, a1).astype(np.float64)
    ref = np.zeros((t, h))
    for tt in range(t):
        for j in range(k):
            ei = p["topk_ids"][tt, j]
            h1 = w13[ei] @ x[tt]
            g, u = h1[:i], h1[i:]
            act = (g / (1 + np.exp(-g)) * u).astype(F32)
            hq, hs = RQ.quantize_nvfp4_ref(act[None], a2)
            h2 = RQ.dequantize_nvfp4_ref(hq, hs, a2)[0].astype(np.float64)
            ref[tt] += p["topk_weights"][tt, j] * (w2[ei] @ h2)
    stats = error_stats(out, ref)
    # bf16 rounding of h1/h2/y (and the rare fp4 code it flips) only: far below FP4's own error.
    assert stats["nmse"] < 1e-3 and stats["cosine"] > 0.999, stats


def test_input_quantization_bit_exact_against_reference_quantizer():
    """Feeding x pre-quantized by the numpy quantizer (swizzled scales, as after the FP4
    all-gather) gives the same bytes as letting the backend quantize x: the backend's NVFP4
    input codes are bit-exact twins of moecore.reference.quant.quantize_nvfp4_ref."""
    rng = np.random.default_rng(5)
    p = N.make_fp4_moe(rng, 33, 4, 64, 32, 2)
    out = N.run_runner(BACKEND, p, Info(**p["kwargs"]))
    xq, xs = RQ.quantize_nvfp4_ref(np.asarray(p["x"], F32), p["a1_gs"])
    xs_sw = mf.swizzle_nvfp4_scales(xs.view(ml_dtypes.float8_e4m3fn))
    for a2a in ("none", "flashinfer"):
        pre = N.run_runner(
            BACKEND, p, Info(**p["kwargs"]), a2a=a2a, x=xq, hidden_states_scale=xs_sw
        )
        assert_bitwise_equal(pre, out, what=f"pre-quantized input ({a2a})")
    assert_close(
        to_f32(out),
        R.flashinfer_cutlass_moe_ref(
            xq,
            p["topk_ids"],
            p["topk_weights"],
            quant_type="fp4",
            w13=p["kwargs"]["w13_weight"],
            w2=p["kwargs"]["w2_weight"],
            quant_scales=p["kwargs"]["quant_scales"],
            hidden_states_scale=xs_sw,
        ),
        "bf16",
    )


# ---------------------------------------------------------------------------------------------
# Expert parallelism, routed scaling, the flashinfer a2a key.


@pytest.mark.parametrize("quant_type", ["bf16", "fp8", "fp4"])
def test_ep_ranks_take_global_ids_and_sum_to_full(quant_type):
    rng = np.random.default_rng(21)
    t, e, h, i, k = 12, 6, 32, 32, 3
    full = _make(quant_type, rng, t, e, h, i, k)
    out_full = to_f32(N.run_runner(BACKEND, full, Info(**full["kwargs"])))
    total = np.zeros_like(out_full)
    for rank in range(2):
        kw = dict(full["kwargs"])
        sl = slice(rank * e // 2, (rank + 1) * e // 2)
        kw["w13_weight"] = np.ascontiguousarray(kw["w13_weight"][sl])
        kw["w2_weight"] = np.ascontiguousarray(kw["w2_weight"][sl])
        if quant_type == "fp8":
            qs = list(kw["quant_scales"])
            qs[0], qs[2] = qs[0][sl].copy(), qs[2][sl].copy()
            kw["quant_scales"] = qs
        if quant_type == "fp4":
            qs = list(kw["quant_scales"])
            qs[1], qs[4] = np.ascontiguousarray(qs[1][sl]), np.ascontiguousarray(qs[4][sl])
            qs[2], qs[5] = qs[2][sl].copy(), qs[5][sl].copy()
            kw["quant_scales"] = qs
        kw.update(moe_ep_size=2, moe_ep_rank=rank)
        part = N.run_runner(BACKEND, full, Info(**kw))
        ref = R.flashinfer_cutlass_moe_ref(
            full["x"],
            full["topk_ids"],
            full["topk_weights"],
            quant_type=quant_type,
            w13=kw["w13_weight"],
            w2=kw["w2_weight"],
            quant_scales=kw.get("quant_scales"),
            moe_ep_size=2,
            moe_ep_rank=rank,
        )
        assert_close(to_f32(part), ref, "bf16", what=f"rank {rank}")
        total += to_f32(part)
    assert_close(total, out_full, "bf16_vs_exact", what="sum over EP ranks")


@pytest.mark.parametrize("quant_type", ["bf16", "fp8", "fp4"])
@pytest.mark.parametrize("apply_rsf", [True, False])
def test_routed_scaling_factor_applied_once_and_only_for_bf16_fp8(quant_type, apply_rsf):
    rng = np.random.default_rng(8)
    p = _make(quant_type, rng, 10, 4, 32, 16, 2)
    rsf = 2.5
    out = N.run_runner(
        BACKEND,
        p,
        Info(**p["kwargs"], apply_routed_scaling_factor=apply_rsf),
        routed_scaling_factor=rsf,
    )
    plain = N.run_runner(BACKEND, p, Info(**p["kwargs"]))
    ref = _ref(p, routed_scaling_factor=rsf, apply_routed_scaling_factor=apply_rsf)
    assert_close(to_f32(out), ref, "bf16")
    if quant_type == "fp4" or not apply_rsf:
        assert_bitwise_equal(out, plain)
    else:  # sglang multiplies the finished output: one extra rounding, exactly once
        from moecore.dtypes import round_to

        expect = round_to(to_f32(plain) * F32(rsf), "bf16" if out.dtype == BF16 else "f32")
        assert np.array_equal(to_f32(out), expect)


def test_flashinfer_a2a_key_equals_none_and_accepts_the_invalid_token_id():
    rng = np.random.default_rng(9)
    p = N.make_fp4_moe(rng, 8, 4, 32, 32, 2)
    base = N.run_runner(BACKEND, p, Info(**p["kwargs"]))
    assert_bitwise_equal(N.run_runner(BACKEND, p, Info(**p["kwargs"]), a2a="flashinfer"), base)
    ids = p["topk_ids"].copy()
    ids[:, 1] = 4  # FlashinferDispatcher's invalid-token id = num_experts
    q = dict(p, topk_ids=ids)
    out = N.run_runner(BACKEND, q, Info(**p["kwargs"]), a2a="flashinfer")
    assert_close(to_f32(out), _ref(q), "bf16")
    with pytest.raises(moecore.OutOfRangeError, match=L("expected topk_ids in [-1, 4)")):
        N.run_runner(BACKEND, q, Info(**p["kwargs"]), a2a="none")


def test_minus_one_ids_contribute_nothing_and_bypassed_topk_is_materialised():
    rng = np.random.default_rng(10)
    p = N.make_fp4_moe(rng, 6, 4, 32, 32, 2)
    ids = p["topk_ids"].copy()
    ids[::2, 0] = -1
    q = dict(p, topk_ids=ids)
    out = N.run_runner(BACKEND, q, Info(**p["kwargs"]))
    assert_close(to_f32(out), _ref(q), "bf16")
    # R8: a bypassed top-k is routed with to_standard() first.
    logits = rng.standard_normal((6, 4)).astype(F32)
    cfg = moecore.TopKConfig(top_k=2)
    std = moecore.select_experts(p["x"], logits, cfg)
    by = moecore.BypassedTopKOutput(p["x"], logits, cfg)
    runner = moecore.MoeRunner(BACKEND, moecore.MoeRunnerConfig(inplace=False))
    a = runner.run(moecore.StandardDispatchOutput(p["x"], topk_output=std), Info(**p["kwargs"]))
    b = runner.run(moecore.StandardDispatchOutput(p["x"], topk_output=by), Info(**p["kwargs"]))
    assert_bitwise_equal(a.hidden_states, b.hidden_states)


# ---------------------------------------------------------------------------------------------
# R9, determinism, batch invariance.


@pytest.mark.parametrize("quant_type", ["bf16", "fp8", "fp4"])
def test_R9_empty_input_returns_empty_output(quant_type):
    rng = np.random.default_rng(12)
    p = _make(quant_type, rng, 0, 4, 32, 16, 2)
    assert p["x"].shape == (0, 32)
    out = N.run_runner(BACKEND, p, Info(**p["kwargs"]))
    assert out.shape == (0, 32)
    assert out.dtype == (BF16 if quant_type == "fp4" else p["x"].dtype)


def test_deterministic_across_threads_and_batch_invariant():
    rng = np.random.default_rng(13)
    p = N.make_fp4_moe(rng, 40, 6, 64, 32, 3)
    before = moecore.get_num_threads()
    try:
        moecore.set_num_threads(1)
        one = N.run_runner(BACKEND, p, Info(**p["kwargs"]))
        moecore.set_num_threads(2)
        two = N.run_runner(BACKEND, p, Info(**p["kwargs"]))
    finally:
        moecore.set_num_threads(before)
    assert_bitwise_equal(one, two, what="1 vs 2 threads")
    for tok in (0, 17, 39):
        alone = dict(
            p,
            x=p["x"][tok : tok + 1].copy(),
            topk_ids=p["topk_ids"][tok : tok + 1].copy(),
            topk_weights=p["topk_weights"][tok : tok + 1].copy(),
        )
        assert_bitwise_equal(
            N.run_runner(BACKEND, alone, Info(**p["kwargs"]))[0],
            one[tok],
            what=f"token {tok} alone vs in the batch",
        )


# ---------------------------------------------------------------------------------------------
# R15 guards and the activation mapping.


def test_R15_rejects_apply_router_weight_on_input():
    p = N.make_fp4_moe(np.random.default_rng(1), 4, 4, 32, 16, 1)
    with pytest.raises(
        AssertionError, match="apply_router_weight_on_input is not supported for Flashinfer"
    ):
        N.run_runner(BACKEND, p, Info(**p["kwargs"]), apply_router_weight_on_input=True)


@pytest.mark.parametrize(
    "act,gated,exc,msg",
    [
        (
            "silu",
            False,
            AssertionError,
            "Activation 'silu' (is_gated=False) maps to Silu, which is not supported by flashinfer cutlass moe.",
        ),
        (
            "gelu",
            False,
            AssertionError,
            "Activation 'gelu' (is_gated=False) maps to Gelu, which is not supported",
        ),
        ("gelu_tanh", True, AssertionError, "maps to no FlashInfer ActivationType"),
        ("swish", True, ValueError, "Unsupported activation: activation='swish'"),
    ],
    ids=["silu-nongated", "gelu-nongated", "gelu_tanh", "unknown"],
)
def test_R15_activation_mapping(act, gated, exc, msg):
    p = N.make_fp4_moe(np.random.default_rng(2), 4, 4, 32, 16, 1, gated=gated)
    with pytest.raises(exc, match=L(msg)):
        N.run_runner(BACKEND, p, Info(**p["kwargs"]), activation=act, is_gated=gated)


def test_fused_only_registration():
    keys = {(a, r) for a, r, _ in moecore.registered_fused_funcs() if r == BACKEND}
    assert keys == {("none", BACKEND), ("flashinfer", BACKEND)}
    assert BACKEND not in {b for b, _ in moecore.registered_runner_cores()}
    with pytest.raises(
        NotImplementedError, match=L("requires a fused func for a2a backend deepep")
    ):
        moecore.MoeRunner(BACKEND, moecore.MoeRunnerConfig(), a2a_backend="deepep")


# ---------------------------------------------------------------------------------------------
# Bad input: each case makes one failing call; nothing is written.


def _fp4_case(mutate, seed=0):
    def call():
        p = N.make_fp4_moe(np.random.default_rng(seed), 4, 4, 32, 32, 2)
        kw = dict(p["kwargs"])
        qs = list(kw["quant_scales"])
        cfg = {}
        p, kw, qs, cfg = mutate(p, kw, qs, cfg) or (p, kw, qs, cfg)
        kw["quant_scales"] = qs
        return N.run_runner(BACKEND, p, Info(**kw), **cfg)

    return call


def _set(i, value):
    def m(p, kw, qs, cfg):
        qs[i] = value(qs[i]) if callable(value) else value

    return m


def _poke_byte(i, code):
    def m(p, kw, qs, cfg):
        a = np.ascontiguousarray(qs[i]).copy()
        a.view(np.uint8).reshape(-1)[0] = code
        qs[i] = a

    return m


def _weights(**changes):
    def m(p, kw, qs, cfg):
        kw.update({k: (v(kw[k]) if callable(v) else v) for k, v in changes.items()})

    return m


def _problem(**changes):
    def m(p, kw, qs, cfg):
        p.update({k: (v(p[k]) if callable(v) else v) for k, v in changes.items()})

    return m


BAD = [
    ("a1-nan", _set(0, np.array([np.nan], F32)), ValueError, "a1_gscale) finite and > 0, got nan"),
    ("a1-zero", _set(0, np.array([0.0], F32)), ValueError, "a1_gscale) finite and > 0, got 0"),
    (
        "a1-negative",
        _set(0, np.array([-2.0], F32)),
        ValueError,
        "a1_gscale) finite and > 0, got -2",
    ),
    ("a2-inf", _set(3, np.array([np.inf], F32)), ValueError, "a2_gscale) finite and > 0, got inf"),
    (
        "a1-two-values",
        _set(0, np.array([1.0, 2.0], F32)),
        ValueError,
        "a1_gscale) to hold one value",
    ),
    ("a1-f16", _set(0, np.array([1.0], np.float16)), TypeError, "a1_gscale) float32"),
    (
        "g1-nan",
        _set(2, lambda a: np.where(np.arange(a.size) == 1, np.nan, a).astype(F32)),
        ValueError,
        "g1_alphas) finite and >= 0, got nan for expert 1",
    ),
    ("g2-negative", _set(5, lambda a: -a), ValueError, "g2_alphas) finite and >= 0"),
    ("g1-wrong-len", _set(2, lambda a: a[:3].copy()), ValueError, "g1_alphas) [4]"),
    (
        "sf13-f32",
        _set(1, lambda a: np.asarray(a, F32)),
        TypeError,
        "float8_e4m3fn (or its uint8 / int32 view)",
    ),
    (
        "sf13-unpadded",
        _set(1, lambda a: np.ascontiguousarray(a[:, :64])),
        ValueError,
        "128x4-swizzled [4, 128, 4]",
    ),
    ("sf2-nan-code", _poke_byte(4, 0x7F), ValueError, "w2 block scales) finite and >= 0"),
    ("sf13-negative", _poke_byte(1, 0x88), ValueError, "w13 block scales) finite and >= 0"),
    (
        "w13-f32",
        _weights(w13_weight=lambda w: w.astype(F32)),
        TypeError,
        "w13_weight uint8 (packed e2m1",
    ),
    (
        "w13-wrong-rows",
        _weights(w13_weight=lambda w: np.ascontiguousarray(w[:, :32])),
        ValueError,
        "expected w13_weight [4, 64, 16]",
    ),
    (
        "k-not-16",
        _weights(w2_weight=lambda w: np.zeros((4, 32, 12), np.uint8)),
        ValueError,
        "multiples of 16 (K of both GEMMs), got H = 32, I = 24",
    ),
    (
        "x-u8-without-scale",
        _problem(x=lambda x: np.zeros((4, 16), np.uint8)),
        TypeError,
        "expected hidden_states f32, f16 or bf16",
    ),
    (
        "x-wrong-width",
        _problem(x=lambda x: np.zeros((4, 48), F32)),
        ValueError,
        "expected hidden_states [T, 32]",
    ),
    (
        "id-out-of-range",
        _problem(topk_ids=lambda i: np.where(i == i[0, 0], 9, i).astype(np.int32)),
        IndexError,
        "expected topk_ids in [-1, 4)",
    ),
    (
        "weights-f64",
        _problem(topk_weights=lambda w: w.astype(np.float64)),
        TypeError,
        "unsupported dtype float64",
    ),
]


@pytest.mark.parametrize("name,mutate,exc,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input(name, mutate, exc, msg):
    with pytest.raises(exc, match=L(msg)):
        _fp4_case(mutate)()


def test_bad_quant_info_construction():
    w = np.zeros((2, 32, 16), np.uint8)
    with pytest.raises(ValueError, match=L("quant_type 'fp4' needs 6 quant_scales, got 5")):
        Info(quant_type="fp4", w13_weight=w, w2_weight=w, quant_scales=[np.ones(1, F32)] * 5)
    with pytest.raises(
        ValueError, match=L("quant_type must be 'bf16', 'fp8' or 'fp4', got 'nvfp4'")
    ):
        Info(quant_type="nvfp4", w13_weight=w, w2_weight=w)
    with pytest.raises(TypeError, match="Unexpected quant_info type for flashinfer_cutlass"):
        p = N.make_fp4_moe(np.random.default_rng(0), 2, 2, 32, 16, 1)
        N.run_runner(
            BACKEND,
            p,
            moecore.TritonMoeQuantInfo(
                w13_weight=np.zeros((2, 32, 32), F32), w2_weight=np.zeros((2, 32, 16), F32)
            ),
        )


@pytest.mark.parametrize(
    "case",
    [
        "fp8-weights-bf16",
        "fp8-nan-fc1",
        "fp8-zero-input-scale",
        "bf16-mixed-dtypes",
        "bf16-with-scale",
    ],
)
def test_bad_input_fp8_bf16(case):
    rng = np.random.default_rng(4)
    if case.startswith("fp8"):
        p = N.make_fp8_moe(rng, 3, 4, 32, 16, 2)
        kw = dict(p["kwargs"])
        qs = list(kw["quant_scales"])
        if case == "fp8-weights-bf16":
            kw["w13_weight"] = np.zeros((4, 32, 32), BF16)
            exc, msg = TypeError, "quant_type 'fp8' expects float8_e4m3fn weights"
        elif case == "fp8-nan-fc1":
            qs[0] = np.full(4, np.nan, F32)
            exc, msg = ValueError, "quant_scales[0] (fc1_dequant) finite and >= 0"
        else:
            qs[3] = np.zeros(1, F32)
            exc, msg = ValueError, "quant_scales[3] (fc1_input_dequant) finite and > 0, got 0"
        kw["quant_scales"] = qs
        with pytest.raises(exc, match=L(msg)):
            N.run_runner(BACKEND, p, Info(**kw))
    else:
        p = N.make_bf16_moe(rng, 3, 4, 32, 16, 2)
        kw = dict(p["kwargs"])
        if case == "bf16-mixed-dtypes":
            kw["w2_weight"] = kw["w2_weight"].astype(F32)
            with pytest.raises(TypeError, match=L("weights of one dtype")):
                N.run_runner(BACKEND, p, Info(**kw))
        else:
            with pytest.raises(ValueError, match=L("takes no hidden_states_scale")):
                N.run_runner(BACKEND, p, Info(**kw), hidden_states_scale=np.zeros((3, 2), np.uint8))


def test_fp4_block_scales_accepted_as_sglangs_int32_view():
    """sglang passes the swizzled e4m3 block scales viewed as int32; the bytes are the same."""
    p = N.make_fp4_moe(np.random.default_rng(14), 5, 4, 64, 32, 2)
    base = N.run_runner(BACKEND, p, Info(**p["kwargs"]))
    qs = list(p["kwargs"]["quant_scales"])
    qs[1], qs[4] = qs[1].view(np.int32), qs[4].view(np.int32)
    viewed = N.run_runner(BACKEND, p, Info(**dict(p["kwargs"], quant_scales=qs)))
    assert_bitwise_equal(viewed, base)


@pytest.mark.parametrize("level", moecore.available_isa_levels())
@pytest.mark.parametrize("quant_type", ["bf16", "fp4"])
def test_every_isa_level_agrees_with_scalar(quant_type, level):
    p = _make(quant_type, np.random.default_rng(15), 19, 4, 64, 32, 2)
    base = N.run_runner(BACKEND, p, Info(**p["kwargs"]), isa_level="scalar")
    with moecore.isa_level(level):
        got = N.run_runner(BACKEND, p, Info(**p["kwargs"]))
    assert_isa_levels_agree(got, level, base, "scalar", "bf16", what=f"{level} vs scalar")
