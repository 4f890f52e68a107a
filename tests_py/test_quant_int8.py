"""INT8 MoE through the triton backend: W8A8 (use_int8_w8a8, per-channel weights, per-token
dynamic int8 activations) and W8A16 (use_int8_w8a16), and the W8A8Int8MoEMethod /
W8A16Int8MoEMethod quant methods.

Oracle: ``moecore.reference.moe_fp8`` (pure numpy): the per-token INT8 quantizer bit for bit
(sglang's per_token_quant_int8: 127/amax multiply, round half away from zero), MoE outputs with
the "bf16" tolerance row. Also bitwise: fused vs forced-permute, thread counts and ISA levels,
batch invariance; R9 empty input; TP=2 slices summing to the full layer; a bad-input table.
"""

from __future__ import annotations

import zlib

import ml_dtypes
import moecore
import numpy as np
import pytest
from moecore import _moecore as M
from moecore.reference import moe_fp8 as R
from moecore.reference.quant import quantize_int8_per_row_ref
from moecore.testing import (
    assert_bitwise_equal,
    assert_close,
    assert_isa_levels_agree,
    make_moe_problem,
)
from moecore.testing.params import isa_levels

OPS = M.fp8_int8_ops
F32 = np.float32
BF16 = ml_dtypes.bfloat16
QUANTS = ["int8_w8a8", "int8_w8a16"]


def _seed(*parts) -> int:
    return zlib.crc32("-".join(str(p) for p in parts).encode())


@pytest.fixture
def num_threads():
    previous = moecore.get_num_threads()
    yield moecore.set_num_threads
    moecore.set_num_threads(previous)


# ---------------------------------------------------------------------------------------------
# The per-token INT8 activation quantizer.


def test_int8_quantizer_rounds_half_away_from_zero():
    # amax = 127 → 127/amax = 1: the ties are exact, and libdevice.round moves them away from
    # zero (numpy's rint, round half to even, would give 2, -2, 0, -0, 2).
    x = np.array([[127.0, 2.5, -2.5, 0.5, -0.5, 1.5, -126.5, 0.49999997]], F32)
    q, s = OPS.quantize_activation(x, "int8_per_token")
    assert q.dtype == np.int8
    assert list(q[0]) == [127, 3, -3, 1, -1, 2, -127, 0]
    assert s[0, 0] == F32(1.0)
    assert_bitwise_equal(q, R.quantize_activation_ref(x, "int8_per_token")[0])


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("shape", [(0, 64), (1, 40), (9, 96), (64, 200)], ids=str)
def test_int8_quantizer_bitexact(shape, dtype):
    rng = np.random.default_rng(_seed("int8", shape, dtype))
    x = (rng.standard_normal(shape) * 2).astype(F32)
    if shape[0] > 2:
        x[1] = 0  # eps path: a = 1e-10
        x[2] *= F32(1e-12)
    x = x.astype({"f32": F32, "f16": np.float16, "bf16": BF16}[dtype])
    q, s = OPS.quantize_activation(x, "int8_per_token")
    rq, rs = R.quantize_activation_ref(x, "int8_per_token")
    assert_bitwise_equal(q, rq)
    assert_bitwise_equal(np.asarray(s), rs)


# ---------------------------------------------------------------------------------------------
# The triton backend.


class IProblem:
    """A MoE problem with int8 per-channel experts."""

    def __init__(self, quant, T, E, H, I, k, dtype="bf16", gated=True, seed=0):
        self.quant = quant
        rng = np.random.default_rng(seed)
        self.p = make_moe_problem(rng, T, E, H, I, k, dtype=dtype, gated=gated)
        self.q13, self.s13 = quantize_int8_per_row_ref(self.p.w13.astype(F32))
        self.q2, self.s2 = quantize_int8_per_row_ref(self.p.w2.astype(F32))

    def quant_info(self, **overrides):
        kw = dict(w13_weight=self.q13, w2_weight=self.q2, use_int8_w8a8=self.quant == "int8_w8a8",
                  use_int8_w8a16=self.quant == "int8_w8a16",
                  per_channel_quant=self.quant == "int8_w8a8", w13_scale=self.s13, w2_scale=self.s2)
        kw.update(overrides)
        return M.TritonMoeQuantInfo(**kw)

    def run(self, fused=True, isa=None, x=None, ids=None, wts=None, **cfg):
        cfg.setdefault("inplace", False)
        cfg.setdefault("is_gated", self.p.gated)
        config = moecore.MoeRunnerConfig(force_unfused=not fused, isa_level=isa, **cfg)
        topk = moecore.StandardTopKOutput(self.p.topk_weights if wts is None else wts,
                                          self.p.topk_ids if ids is None else ids)
        d = moecore.StandardDispatchOutput(self.p.x if x is None else x, topk_output=topk)
        return moecore.MoeRunner("triton", config).run(d, self.quant_info()).hidden_states

    def reference(self, **cfg):
        keys = ("activation", "routed_scaling_factor", "no_combine", "apply_router_weight_on_input")
        return R.fused_moe_w8a8_ref(self.p.x, self.q13, self.q2, self.p.topk_weights,
                                    self.p.topk_ids, quant=self.quant, w13_scale=self.s13,
                                    w2_scale=self.s2, per_channel_quant=True,
                                    is_gated=self.p.gated,
                                    **{k: v for k, v in cfg.items() if k in keys})


GRID = [
    pytest.param(1, 4, 1, 40, 24, id="T1-E4-k1"),
    pytest.param(2, 8, 2, 40, 24, id="T2-E8-k2"),
    pytest.param(3, 4, 3, 36, 20, id="T3-E4-k3"),
    pytest.param(7, 8, 2, 72, 40, id="T7-E8-k2"),
    pytest.param(64, 8, 2, 96, 80, id="T64-E8-k2"),
    pytest.param(513, 4, 2, 48, 32, id="T513-E4-k2"),
]


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("T, E, k, H, I", GRID)
@pytest.mark.parametrize("quant", QUANTS)
def test_triton_int8_matches_reference(quant, T, E, k, H, I, fused):
    ip = IProblem(quant, T, E, H, I, k, seed=_seed(quant, T, E, k))
    out = ip.run(fused=fused)
    assert out.shape == (T, H) and out.dtype == BF16
    assert_close(out, ip.reference(), "bf16", what=f"{quant} T={T}")


@pytest.mark.parametrize("cfg, prob", [
    pytest.param(dict(routed_scaling_factor=0.75), {}, id="rsf"),
    pytest.param(dict(no_combine=True), {}, id="no_combine"),
    pytest.param(dict(activation="gelu"), {}, id="geglu"),
    pytest.param(dict(activation="silu", is_gated=False), dict(gated=False), id="silu-plain"),
    pytest.param({}, dict(dtype="f32"), id="f32"),
    pytest.param({}, dict(dtype="f16"), id="f16"),
    pytest.param(dict(apply_router_weight_on_input=True), dict(k=1), id="weight_on_input"),
])
@pytest.mark.parametrize("quant", QUANTS)
def test_triton_int8_options(quant, cfg, prob):
    prob = dict(prob)
    k = prob.pop("k", 2)
    ip = IProblem(quant, 11, 4, 48, 32, k, seed=_seed("opt", quant, cfg, prob), **prob)
    assert_close(ip.run(**cfg), ip.reference(**cfg), "bf16")


@pytest.mark.parametrize("quant", QUANTS)
def test_triton_int8_fused_equals_forced_permute_and_is_deterministic(quant, num_threads):
    ip = IProblem(quant, 33, 8, 40, 24, 2, seed=_seed("det", quant))
    num_threads(1)
    base = ip.run(isa="scalar")
    assert_bitwise_equal(ip.run(fused=False, isa="scalar"), base)  # same level, same bits
    for threads in (2, 3):
        num_threads(threads)
        for isa in isa_levels():
            assert_isa_levels_agree(ip.run(isa=isa), isa, base, "scalar", "bf16",
                                    what=f"{threads} threads {isa}")
            assert_isa_levels_agree(ip.run(fused=False, isa=isa), isa, base, "scalar", "bf16")


@pytest.mark.parametrize("quant", QUANTS)
def test_triton_int8_batch_invariance(quant):
    ip = IProblem(quant, 64, 8, 40, 24, 2, seed=_seed("bi", quant))
    full = ip.run()
    for t in (0, 31, 63):
        alone = ip.run(x=ip.p.x[t:t + 1], ids=ip.p.topk_ids[t:t + 1], wts=ip.p.topk_weights[t:t + 1])
        assert_bitwise_equal(alone, full[t:t + 1], what=f"token {t}")
        seven = [t] + [(t + j * 9) % 64 for j in range(1, 7)]
        part = ip.run(x=ip.p.x[seven], ids=ip.p.topk_ids[seven], wts=ip.p.topk_weights[seven])
        assert_bitwise_equal(part[:1], full[t:t + 1], what=f"token {t} in a batch of 7")


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("quant", QUANTS)
def test_R9_triton_int8_empty_input(quant, fused):
    ip = IProblem(quant, 0, 4, 40, 24, 2)
    out = ip.run(fused=fused)
    assert out.shape == (0, 40) and out.dtype == BF16


@pytest.mark.parametrize("quant", QUANTS)
def test_R14_triton_int8_ids_minus_one(quant):
    ip = IProblem(quant, 6, 4, 40, 24, 2, seed=3)
    ids = ip.p.topk_ids.copy()
    ids[:, 0] = -1
    assert_bitwise_equal(ip.run(ids=ids), ip.run(ids=ip.p.topk_ids[:, 1:].copy(),
                                                 wts=ip.p.topk_weights[:, 1:].copy()))


# ---------------------------------------------------------------------------------------------
# The INT8 quant methods through FusedMoE.


METHODS = {"int8_w8a8": M.W8A8Int8MoEMethod, "int8_w8a16": M.W8A16Int8MoEMethod}


def _checkpoint(E, H, I_full, seed):
    rng = np.random.default_rng(seed)
    ck = {}
    for e in range(E):
        for name, shape in (("w1", (I_full, H)), ("w3", (I_full, H)), ("w2", (H, I_full))):
            w = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(F32)
            ck[name, e] = quantize_int8_per_row_ref(w)
    return ck


def _int8_layer(quant, ck, E, H, I_full, tp_size=1, tp_rank=0, backend=None):
    layer = moecore.FusedMoE(num_experts=E, hidden_size=H, intermediate_size=I_full,
                             topk_config=moecore.TopKConfig(top_k=2), params_dtype="bf16",
                             tp_size=tp_size, tp_rank=tp_rank, quant_method=METHODS[quant](),
                             runner_backend=backend)
    for e in range(E):
        for shard in ("w1", "w3", "w2"):
            prefix = "w2" if shard == "w2" else "w13"
            q, s = ck[shard, e]
            layer.weight_loader(f"{prefix}_weight", q, "w", shard, e)
            layer.weight_loader(f"{prefix}_weight_scale", s, "s", shard, e)
    return layer


@pytest.mark.parametrize("quant", QUANTS)
def test_int8_method_parameters_and_end_to_end(quant):
    E, H, I = 4, 48, 32
    ck = _checkpoint(E, H, I, seed=_seed("e2e", quant))
    layer = _int8_layer(quant, ck, E, H, I)
    shapes = {n: (a.shape, a.dtype) for n, a in layer.named_parameters().items()}
    assert shapes == {"w13_weight": ((E, 2 * I, H), np.dtype(np.int8)),
                      "w2_weight": ((E, H, I), np.dtype(np.int8)),
                      "w13_weight_scale": ((E, 2 * I, 1), np.dtype(F32)),
                      "w2_weight_scale": ((E, H, 1), np.dtype(F32))}
    layer.process_weights_after_loading()
    q = layer.quant_method.quant_info(layer)
    assert q.use_int8_w8a8 == (quant == "int8_w8a8") and q.use_int8_w8a16 == (quant == "int8_w8a16")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((12, H)).astype(BF16)
    ids = np.stack([rng.permutation(E)[:2] for _ in range(12)]).astype(np.int32)
    wts = rng.random((12, 2)).astype(F32)
    out = layer.forward_topk(x, moecore.StandardTopKOutput(wts, ids))
    ref = R.fused_moe_w8a8_ref(x, q.w13_weight, q.w2_weight, wts, ids, quant=quant,
                               w13_scale=q.w13_scale, w2_scale=q.w2_scale, per_channel_quant=True)
    assert_close(out, ref, "bf16")


def test_int8_w8a16_method_tp2_slices_sum_to_full_layer():
    """W8A16 quantizes nothing per rank, so the two TP ranks' outputs sum to the full layer up to
    fp32 summation order (f32 activations: no bf16 rounding of the partial outputs)."""
    E, H, I = 4, 48, 64
    ck = _checkpoint(E, H, I, seed=5)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((9, H)).astype(F32)
    ids = np.stack([rng.permutation(E)[:2] for _ in range(9)]).astype(np.int32)
    topk = moecore.StandardTopKOutput(rng.random((9, 2)).astype(F32), ids)
    outs = []
    for tp_size, rank in ((1, 0), (2, 0), (2, 1)):
        layer = _int8_layer("int8_w8a16", ck, E, H, I, tp_size, rank)
        layer.process_weights_after_loading()
        outs.append(layer.forward_topk(x, topk))
    assert_close(outs[1] + outs[2], outs[0], "f32")


def test_int8_w8a8_method_tp2_slices_sum_close_to_full_layer():
    """W8A8 quantizes each rank's GEMM2 input per token over the rank's half of I (as sglang),
    so the sum equals the full layer up to that quantization difference."""
    E, H, I = 4, 48, 64
    ck = _checkpoint(E, H, I, seed=6)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((9, H)).astype(F32)
    ids = np.stack([rng.permutation(E)[:2] for _ in range(9)]).astype(np.int32)
    topk = moecore.StandardTopKOutput(rng.random((9, 2)).astype(F32), ids)
    outs = []
    for tp_size, rank in ((1, 0), (2, 0), (2, 1)):
        layer = _int8_layer("int8_w8a8", ck, E, H, I, tp_size, rank)
        layer.process_weights_after_loading()
        outs.append(layer.forward_topk(x, topk))
    assert_close(outs[1] + outs[2], outs[0], "bf16_vs_exact")


def test_int8_method_backend_errors():
    ck = _checkpoint(2, 16, 8, seed=0)
    with pytest.raises(NotImplementedError, match="not supported for INT8 MoE"):
        _int8_layer("int8_w8a8", ck, 2, 16, 8, backend="deep_gemm").process_weights_after_loading()
    with pytest.raises(NotImplementedError, match="INT8 experts have no biases"):
        moecore.FusedMoE(num_experts=2, hidden_size=16, intermediate_size=8, with_bias=True,
                         topk_config=moecore.TopKConfig(top_k=1), quant_method=M.W8A8Int8MoEMethod())


# ---------------------------------------------------------------------------------------------
# Bad input.


def _case(quant="int8_w8a8", **overrides):
    def call():
        ip = IProblem(quant, 5, 4, 40, 24, 2, seed=1)
        q = ip.quant_info(**{k: (v(ip) if callable(v) else v) for k, v in overrides.items()})
        moecore.MoeRunner("triton", moecore.MoeRunnerConfig(inplace=False)).run(
            moecore.StandardDispatchOutput(ip.p.x, topk_output=moecore.StandardTopKOutput(
                ip.p.topk_weights, ip.p.topk_ids)), q)
    return call


BAD = [
    ("w8a8-not-per-channel", _case(per_channel_quant=False), AssertionError,
     "int8 quantization only supports channel-wise quantization except for block-wise quantization"),
    ("w8a8-block", _case(block_shape=[64, 64]), NotImplementedError, "block-wise int8 w8a8"),
    ("w8a16-block", _case("int8_w8a16", block_shape=[32, 64]), NotImplementedError, "grouped GPTQ/AWQ"),
    ("w8a8-a13-given", _case(a13_scale=np.ones(1, F32)), ValueError, "a13_scale and a2_scale must be None"),
    ("w8a16-a2-given", _case("int8_w8a16", a2_scale=np.ones(1, F32)), ValueError, "does not quantize activations"),
    ("weights-uint8", _case(w13_weight=lambda ip: ip.q13.view(np.uint8)), TypeError, "expects i8 weights"),
    ("weights-bf16", _case("int8_w8a16", w2_weight=lambda ip: ip.p.w2), TypeError, "expects i8 weights"),
    ("scale-shape", _case(w13_scale=lambda ip: np.ones((4, 48, 2), F32)), ValueError, "expected w13_scale [4, 48] or [4, 48, 1]"),
    ("scale-per-tensor", _case(w2_scale=lambda ip: np.ones(4, F32)), ValueError, "expected w2_scale [4, 40]"),
    ("scale-missing", _case(w13_scale=None), ValueError, "w13_scale is required"),
    ("scale-negative", _case(w13_scale=lambda ip: -ip.s13), ValueError, "w13_scale must be finite and >= 0"),
    ("scale-nan", _case("int8_w8a16", w2_scale=lambda ip: np.full(ip.s2.shape, np.nan, F32)), ValueError, "w2_scale must be finite"),
    ("scale-f16", _case(w13_scale=lambda ip: ip.s13.astype(np.float16)), TypeError, "w13_scale must be float32"),
    ("w2-shape", _case(w2_weight=lambda ip: ip.q2[:, :, :12].copy()), ValueError, "w13_weight rows must be 2·I"),
]


@pytest.mark.parametrize("call, exc, text", [pytest.param(c, e, t, id=i) for i, c, e, t in BAD])
def test_int8_bad_input(call, exc, text):
    with pytest.raises(exc) as info:
        call()
    assert text in str(info.value), str(info.value)


@pytest.mark.parametrize("fused", [True, False])
def test_a_call_checks_the_scales_of_the_experts_it_runs(fused):
    """A call reads the scales of its routed experts only, and checks those: a NaN scale of an
    expert no token reaches leaves the result unchanged, one of a routed expert raises with its
    index in the whole tensor, and a prepared run (which replays any routing) checks them all."""
    ip = IProblem("int8_w8a8", 6, 5, 40, 24, 2, seed=4)
    ids = np.array([[0, 2], [2, 4], [4, 0], [0, 2], [2, 4], [4, 0]], np.int32)
    config = moecore.MoeRunnerConfig(inplace=False, force_unfused=not fused)
    dispatch = moecore.StandardDispatchOutput(
        ip.p.x, topk_output=moecore.StandardTopKOutput(ip.p.topk_weights, ids))
    run = lambda **scales: moecore.MoeRunner("triton", config).run(
        dispatch, ip.quant_info(**scales)).hidden_states
    unrouted = ip.s13.copy()
    unrouted[3, 7] = np.nan
    np.testing.assert_array_equal(run(w13_scale=unrouted), run())
    routed = ip.s2.copy()
    routed[4, 5] = -1.0
    with pytest.raises(ValueError, match=r"w2_scale must be finite and >= 0, got -1 at \[4, 5"):
        run(w2_scale=routed)
    with pytest.raises(ValueError, match=r"w13_scale must be finite and >= 0, got nan at \[3, 7"):
        moecore.MoeRunner("triton", config).prepare(dispatch, ip.quant_info(w13_scale=unrouted))


def test_reference_w8a16_equals_the_dense_reference_on_dequantized_weights():
    """Cross-check of moe_fp8's contract plumbing against moe.fused_moe_ref: W8A16 quantizes no
    activation, so it is the dense triton contract on the dequantized weights q · s."""
    from moecore.reference import fused_moe_ref

    ip = IProblem("int8_w8a16", 23, 6, 40, 24, 3, seed=9)
    deq13 = ip.q13.astype(np.float64) * ip.s13.astype(np.float64)
    deq2 = ip.q2.astype(np.float64) * ip.s2.astype(np.float64)
    dense = fused_moe_ref(ip.p.x, deq13, deq2, ip.p.topk_weights, ip.p.topk_ids,
                          act_dtype="bf16", routed_scaling_factor=1.5)
    assert_close(ip.reference(routed_scaling_factor=1.5), dense, "f32")
