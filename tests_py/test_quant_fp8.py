"""FP8 MoE: sglang's activation quantizers, the triton backend's use_fp8_w8a8 contract, the
deep_gemm backend, Fp8MoEMethod and ModelOptFp8MoEMethod.

Oracle: ``moecore.reference.moe_fp8`` (pure numpy). Quantized activations, weight processing,
the DeepGEMM preprocess and post_reorder are compared bit for bit; MoE outputs with the "bf16"
tolerance row (TESTING.md: activation-quantized paths → output as bf16). Also bitwise: fused vs
forced-permute, thread counts and ISA levels, batch invariance (except the documented
batch-dependent per-tensor dynamic mode), and the deep_gemm core's contiguous (m_indices) layout
against its masked layout. Named seed-rule tests: R9 (empty input), R10 (ModelOpt
FP8 on flashinfer_cutlass with I % 16 != 0), R14 (ids −1), R15 (DeepGEMM needs gated silu).
"""

from __future__ import annotations

import zlib

import ml_dtypes
import moecore
import numpy as np
import pytest
from moecore import _moecore as M
from moecore.reference import moe_fp8 as R
from moecore.reference.quant import quantize_fp8_block_ref
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
FP8 = ml_dtypes.float8_e4m3fn


def _seed(*parts) -> int:
    return zlib.crc32("-".join(str(p) for p in parts).encode())


def f8(codes):
    return np.ascontiguousarray(np.asarray(codes, np.uint8)).view(FP8)


def u8(a):
    return np.ascontiguousarray(np.asarray(a)).view(np.uint8)


def _cast(a, dtype):
    return np.asarray(a, F32).astype({"f32": F32, "f16": np.float16, "bf16": BF16}[dtype])


@pytest.fixture
def num_threads():
    previous = moecore.get_num_threads()
    yield moecore.set_num_threads
    moecore.set_num_threads(previous)


# ---------------------------------------------------------------------------------------------
# Activation quantizers: bit-exact against the reference.

ACT_RULES = [
    pytest.param("fp8_static", False, id="fp8_static"),
    pytest.param("fp8_per_tensor", False, id="fp8_per_tensor"),
    pytest.param("fp8_per_token", False, id="fp8_per_token"),
    pytest.param("fp8_per_token_group", False, id="fp8_per_token_group"),
    pytest.param("fp8_per_token_group", True, id="fp8_per_token_group-ue8m0"),
    pytest.param("fp8_silu_post_group", False, id="fp8_silu_post_group"),
    pytest.param("fp8_silu_post_group", True, id="fp8_silu_post_group-ue8m0"),
]


def _act_rows(rng, rows, k, dtype):
    x = rng.standard_normal((rows, k)).astype(F32) * F32(3.0)
    if rows >= 4:
        x[1] = 0.0  # an all-zero row (scale 0 / eps paths)
        x[2] *= F32(1e-9)  # below the 1e-10·448 UE8M0 floor
        x[3] *= F32(1e3)  # large values
    return _cast(x, dtype)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("shape", [(0, 256), (1, 128), (7, 256), (64, 384)], ids=str)
@pytest.mark.parametrize("rule, ue8m0", ACT_RULES)
def test_activation_quantizer_bitexact(rule, ue8m0, shape, dtype):
    rng = np.random.default_rng(_seed(rule, ue8m0, shape, dtype))
    x = _act_rows(rng, *shape, dtype)
    scale = 0.0137 if rule == "fp8_static" else None
    q, s = OPS.quantize_activation(x, rule, scale=scale, group_size=128, scale_ue8m0=ue8m0)
    rq, rs = R.quantize_activation_ref(x, rule, scale=scale, group_size=128, scale_ue8m0=ue8m0)
    assert q.dtype == FP8 and q.shape == shape
    assert_bitwise_equal(u8(q), rq, what=f"{rule} codes")
    assert_bitwise_equal(np.asarray(s, F32), np.asarray(rs, F32), what=f"{rule} scales")


def test_static_quantizer_saturates_and_maps_nan_like_cuda():
    x = np.array([[1e6, -1e6, np.inf, -np.inf, np.nan, 448.0, 449.0, -464.0]], F32)
    q, _ = OPS.quantize_activation(x, "fp8_static", scale=1.0)
    # fmax(fmin(v, 448), -448): overflow saturates, NaN → +448 (fminf drops NaN).
    assert list(u8(q)[0]) == [0x7E, 0xFE, 0x7E, 0xFE, 0x7E, 0x7E, 0x7E, 0xFE]
    assert_bitwise_equal(u8(q), R.quantize_activation_ref(x, "fp8_static", scale=1.0)[0])


def test_dynamic_scales_of_zero_input_mirror_sglang():
    z = np.zeros((2, 128), F32)
    q, s = OPS.quantize_activation(z, "fp8_per_tensor")
    assert s[0] == 0 and np.all(u8(q) == 0x7E)  # 0 · (1/0) = NaN → +448, times scale 0
    q, s = OPS.quantize_activation(z, "fp8_per_token")
    assert np.all(s == 0) and np.all(u8(q) == 0)  # per-token: inv = 0 when s = 0
    q, s = OPS.quantize_activation(z, "fp8_per_token_group")
    assert np.all(s == F32(1e-10) / F32(448)) and np.all(u8(q) == 0)


def test_ue8m0_rules_differ_only_below_the_scale_floor():
    x = np.full((1, 128), 1e-9, F32)  # amax/448 ≈ 2.2e-12 < 1e-10
    _, s_group = OPS.quantize_activation(x, "fp8_per_token_group", scale_ue8m0=True)
    _, s_silu = OPS.quantize_activation(x, "fp8_silu_post_group", scale_ue8m0=True)
    assert s_group[0, 0] == 2.0**-33  # 2^ceil(log2 max(s, 1e-10))
    assert s_silu[0, 0] == 2.0**-38  # 2^ceil(log2 s)
    y = np.full((1, 128), 3.0, F32)
    assert_bitwise_equal(OPS.quantize_activation(y, "fp8_per_token_group", scale_ue8m0=True)[1],
                         OPS.quantize_activation(y, "fp8_silu_post_group", scale_ue8m0=True)[1])


# ---------------------------------------------------------------------------------------------
# Weight processing: bit-exact against the reference.


@pytest.mark.parametrize("cols", [(0, 1), (1, 0)], ids=["w1w3", "w3w1"])
@pytest.mark.parametrize("scale_range", [(1e-3, 1e-1), (1e-6, 1e-4)], ids=["normal", "fp16-subnormal"])
def test_requantize_w13_to_max_scale_bitexact(cols, scale_range):
    rng = np.random.default_rng(_seed("requant", cols, scale_range))
    E, I, H = 3, 24, 40
    codes = rng.integers(0, 256, (E, 2 * I, H), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0  # no NaN codes
    scales = rng.uniform(*scale_range, (E, 2)).astype(F32)
    q, m = OPS.requantize_w13_to_max_scale(f8(codes), scales, I, list(cols))
    rq, rm = R.requantize_w13_to_max_scale_ref(codes, scales, I, cols)
    assert_bitwise_equal(u8(q), rq, what="requantized w13")
    assert_bitwise_equal(np.asarray(m), rm, what="max scales")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_weight_quantization_at_load_bitexact(dtype):
    rng = np.random.default_rng(_seed("wq", dtype))
    w = _cast(rng.standard_normal((3, 20, 36)) * 0.1, dtype)
    w[1] = 0  # an all-zero expert: sglang gives scale 0 and +448 codes
    q, s = OPS.quantize_weight_per_expert(w)
    rq, rs = R.quantize_weight_per_expert_ref(w)
    assert_bitwise_equal(u8(q), rq)
    assert_bitwise_equal(np.asarray(s), rs)
    assert s[1] == 0 and np.all(u8(q)[1] == 0x7E)
    q, s = OPS.quantize_weight_per_channel(w)
    rq, rs = R.quantize_weight_per_channel_ref(w)
    assert s.shape == (3, 20, 1)
    assert_bitwise_equal(u8(q), rq)
    assert_bitwise_equal(np.asarray(s), rs)


def test_requantize_block_ue8m0_bitexact():
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((2, 200, 320)) * 0.05).astype(F32)
    q, s = quantize_fp8_block_ref(w, 128, 128)
    nq, ns = OPS.requantize_block_ue8m0(f8(q), s)
    rq, rs = R.requantize_block_ue8m0_ref(q, s)
    assert_bitwise_equal(u8(nq), rq)
    assert_bitwise_equal(np.asarray(ns), rs)
    assert np.all(np.frexp(ns)[0] == 0.5)  # powers of two


# ---------------------------------------------------------------------------------------------
# The triton backend, use_fp8_w8a8.

# scheme id → (weight scheme, static activations, block_shape)
SCHEMES = {
    "per_tensor-static": ("tensor", True, None),
    "per_tensor-dynamic": ("tensor", False, None),
    "per_channel-static": ("channel", True, None),
    "per_channel-dynamic": ("channel", False, None),
    "block64x64": ("block", False, (64, 64)),
    "block128x64": ("block", False, (128, 64)),
}
BATCH_INVARIANT = [s for s in SCHEMES if s != "per_tensor-dynamic"]


def quantize_experts(w, kind, block=None):
    """fp32 experts [E, N, K] → (e4m3 codes, scales) in the scheme's TritonMoeQuantInfo layout."""
    w = np.asarray(w, F32)
    if kind == "tensor":
        q, s = R.quantize_weight_per_expert_ref(w)
    elif kind == "channel":
        q, s = R.quantize_weight_per_channel_ref(w)
    else:
        q, s = quantize_fp8_block_ref(w, *block)
    return f8(q), np.asarray(s, F32)


class QProblem:
    """A MoE problem with fp8 experts (codes + scales) for one scheme."""

    def __init__(self, scheme, T, E, H, I, k, dtype="bf16", gated=True, bias=False, seed=0):
        self.scheme = scheme
        kind, static, block = SCHEMES[scheme]
        rng = np.random.default_rng(seed)
        self.p = make_moe_problem(rng, T, E, H, I, k, dtype=dtype, gated=gated, bias=bias)
        self.q13, self.s13 = quantize_experts(self.p.w13, kind, block)
        self.q2, self.s2 = quantize_experts(self.p.w2, kind, block)
        self.per_channel = kind == "channel"
        self.block = block
        self.a13 = F32(max(float(np.abs(self.p.x.astype(F32)).max(initial=0)), 1.0) / 448 * 1.25) if static else None
        self.a2 = F32(0.004) if static else None

    def quant_info(self, **overrides):
        kw = dict(w13_weight=self.q13, w2_weight=self.q2, b13=self.p.b13, b2=self.p.b2,
                  use_fp8_w8a8=True, per_channel_quant=self.per_channel, w13_scale=self.s13,
                  w2_scale=self.s2,
                  a13_scale=None if self.a13 is None else np.array([self.a13], F32),
                  a2_scale=None if self.a2 is None else np.array([self.a2], F32),
                  block_shape=None if self.block is None else list(self.block))
        kw.update(overrides)
        return M.TritonMoeQuantInfo(**kw)

    def run(self, fused=True, isa=None, x=None, ids=None, wts=None, **cfg):
        cfg.setdefault("inplace", False)
        cfg.setdefault("is_gated", self.p.gated)
        config = moecore.MoeRunnerConfig(force_unfused=not fused, isa_level=isa, **cfg)
        topk = moecore.StandardTopKOutput(self.p.topk_weights if wts is None else wts,
                                          self.p.topk_ids if ids is None else ids)
        dispatch = moecore.StandardDispatchOutput(self.p.x if x is None else x, topk_output=topk)
        return moecore.MoeRunner("triton", config).run(dispatch, self.quant_info()).hidden_states

    def reference(self, **cfg):
        keys = ("activation", "gemm1_alpha", "gemm1_clamp_limit", "gemm1_beta", "swiglu_limit",
                "apply_router_weight_on_input", "routed_scaling_factor", "no_combine")
        return R.fused_moe_w8a8_ref(
            self.p.x, self.q13, self.q2, self.p.topk_weights, self.p.topk_ids, quant="fp8_w8a8",
            w13_scale=self.s13, w2_scale=self.s2, a13_scale=self.a13, a2_scale=self.a2,
            per_channel_quant=self.per_channel, block_shape=self.block, b13=self.p.b13,
            b2=self.p.b2, is_gated=self.p.gated, **{k: v for k, v in cfg.items() if k in keys})


def _dims(scheme, H, I):
    """Block schemes need H and I multiples of block_k."""
    if SCHEMES[scheme][2] is None:
        return H, I
    bk = SCHEMES[scheme][2][1]
    return -(-H // bk) * bk, -(-I // bk) * bk


# (T, E, k, H, I) over TESTING.md's T values; H/I not multiples of 16 where the scheme allows.
GRID = [
    pytest.param(1, 4, 1, 40, 24, id="T1-E4-k1"),
    pytest.param(2, 8, 2, 40, 24, id="T2-E8-k2"),
    pytest.param(3, 4, 3, 36, 20, id="T3-E4-k3"),
    pytest.param(7, 8, 2, 72, 40, id="T7-E8-k2"),
    pytest.param(64, 8, 2, 96, 80, id="T64-E8-k2"),
]


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("T, E, k, H, I", GRID)
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_triton_fp8_matches_reference(scheme, T, E, k, H, I, fused):
    H, I = _dims(scheme, H, I)
    qp = QProblem(scheme, T, E, H, I, k, seed=_seed(scheme, T, E, k))
    out = qp.run(fused=fused)
    assert out.shape == (T, H) and out.dtype == BF16
    assert_close(out, qp.reference(), "bf16", what=f"triton fp8 {scheme} T={T}")


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_triton_fp8_large_batch(scheme):
    H, I = _dims(scheme, 64, 48)
    qp = QProblem(scheme, 513, 4, H, I, 2, seed=_seed("large", scheme))
    assert_close(qp.run(), qp.reference(), "bf16", what=f"triton fp8 {scheme} T=513")


@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("scheme", ["per_tensor-static", "per_channel-dynamic", "block64x64"])
def test_triton_fp8_other_activation_dtypes(scheme, dtype):
    H, I = _dims(scheme, 64, 48)
    qp = QProblem(scheme, 9, 4, H, I, 2, dtype=dtype, seed=_seed("dt", scheme, dtype))
    out = qp.run()
    assert out.dtype == np.dtype({"f32": F32, "f16": np.float16}[dtype])
    assert_close(out, qp.reference(), "bf16")


OPTIONS = [
    pytest.param(dict(routed_scaling_factor=2.5), {}, id="rsf"),
    pytest.param(dict(no_combine=True), {}, id="no_combine"),
    pytest.param(dict(activation="gelu"), {}, id="geglu"),
    pytest.param(dict(activation="relu2", is_gated=False), dict(gated=False), id="relu2"),
    pytest.param(dict(swiglu_limit=0.5), {}, id="swiglu_limit"),
    pytest.param(dict(gemm1_alpha=1.702, gemm1_clamp_limit=0.7), {}, id="gpt_oss"),
    pytest.param({}, dict(bias=True), id="bias"),
    pytest.param(dict(apply_router_weight_on_input=True), dict(k=1), id="weight_on_input"),
]


@pytest.mark.parametrize("cfg, prob", OPTIONS)
@pytest.mark.parametrize("scheme", ["per_tensor-dynamic", "per_channel-static", "block64x64"])
def test_triton_fp8_runner_options(scheme, cfg, prob):
    H, I = _dims(scheme, 64, 48)
    prob = dict(prob)
    k = prob.pop("k", 2)
    qp = QProblem(scheme, 11, 4, H, I, k, seed=_seed("opt", scheme, cfg, prob), **prob)
    assert_close(qp.run(**cfg), qp.reference(**cfg), "bf16", what=f"{scheme} {cfg} {prob}")


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_triton_fp8_fused_equals_forced_permute_bitwise(scheme):
    H, I = _dims(scheme, 40, 24)
    qp = QProblem(scheme, 19, 4, H, I, 2, seed=_seed("fused", scheme))
    assert_bitwise_equal(qp.run(fused=True), qp.run(fused=False))


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_triton_fp8_deterministic_across_threads_and_isa(scheme, num_threads):
    H, I = _dims(scheme, 40, 24)
    qp = QProblem(scheme, 33, 8, H, I, 2, seed=_seed("det", scheme))
    num_threads(1)
    base = qp.run(isa="scalar")
    for threads in (1, 2, 3):
        num_threads(threads)
        for isa in isa_levels():
            assert_isa_levels_agree(qp.run(isa=isa), isa, base, "scalar", "bf16",
                                    what=f"{threads} threads, {isa}")


@pytest.mark.parametrize("scheme", BATCH_INVARIANT)
def test_triton_fp8_batch_invariance(scheme):
    H, I = _dims(scheme, 40, 24)
    qp = QProblem(scheme, 64, 8, H, I, 2, seed=_seed("bi", scheme))
    full = qp.run()
    for t in (0, 7, 63):
        alone = qp.run(x=qp.p.x[t:t + 1], ids=qp.p.topk_ids[t:t + 1], wts=qp.p.topk_weights[t:t + 1])
        assert_bitwise_equal(alone, full[t:t + 1], what=f"token {t} alone vs in a batch of 64")
        pair = [t, (t + 5) % 64]
        two = qp.run(x=qp.p.x[pair], ids=qp.p.topk_ids[pair], wts=qp.p.topk_weights[pair])
        assert_bitwise_equal(two[:1], full[t:t + 1], what=f"token {t} in a batch of 2")


def test_triton_fp8_per_tensor_dynamic_is_batch_dependent():
    """The one documented exception: dynamic per-tensor scales are the batch's amax / 448."""
    qp = QProblem("per_tensor-dynamic", 8, 4, 40, 24, 2, seed=11)
    x = qp.p.x.copy()
    x[5] = (x[5].astype(F32) * 50).astype(BF16)  # a loud neighbour raises the batch amax
    alone = qp.run(x=x[:1], ids=qp.p.topk_ids[:1], wts=qp.p.topk_weights[:1])
    together = qp.run(x=x)
    assert not np.array_equal(u8(alone), u8(together[:1]))
    # GEMM1's dynamic scale is exactly amax(x)/448: the same as passing that scale statically.
    s1 = F32(np.abs(x.astype(F32)).max() / F32(448))
    a2 = np.array([0.004], F32)
    dyn = qp.quant_info(a2_scale=a2)
    sta = qp.quant_info(a13_scale=np.array([s1], F32), a2_scale=a2)
    cfg = moecore.MoeRunnerConfig(inplace=False)
    d = moecore.StandardDispatchOutput(x, topk_output=moecore.StandardTopKOutput(
        qp.p.topk_weights, qp.p.topk_ids))
    assert_bitwise_equal(moecore.MoeRunner("triton", cfg).run(d, dyn).hidden_states,
                         moecore.MoeRunner("triton", cfg).run(d, sta).hidden_states)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_R9_triton_fp8_empty_input(scheme, fused):
    H, I = _dims(scheme, 40, 24)
    qp = QProblem(scheme, 0, 4, H, I, 2, seed=1)
    out = qp.run(fused=fused)
    assert out.shape == (0, H) and out.dtype == BF16
    assert qp.run(fused=fused, no_combine=True).shape == (0, 2, H)


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_R14_triton_fp8_ids_minus_one_contribute_nothing(scheme):
    H, I = _dims(scheme, 40, 24)
    qp = QProblem(scheme, 6, 4, H, I, 2, seed=_seed("r14", scheme))
    ids = qp.p.topk_ids.copy()
    ids[:, 1] = -1
    out = qp.run(ids=ids)
    reduced = qp.run(ids=qp.p.topk_ids[:, :1].copy(), wts=qp.p.topk_weights[:, :1].copy())
    assert_bitwise_equal(out, reduced)


# ---------------------------------------------------------------------------------------------
# The deep_gemm backend.


class DGProblem:
    """bf16 tokens and FP8-block (or BF16) experts for the deep_gemm runner."""

    def __init__(self, T, E, H, I, k, use_fp8=True, ue8m0=False, seed=0, minus_one=False):
        rng = np.random.default_rng(seed)
        self.p = make_moe_problem(rng, T, E, H, I, k, dtype="bf16")
        self.use_fp8, self.ue8m0 = use_fp8, ue8m0
        self.ids = self.p.topk_ids.copy()
        if minus_one and T:
            self.ids[::3, -1] = -1
        if use_fp8:
            q13, s13 = quantize_fp8_block_ref(self.p.w13.astype(F32))
            q2, s2 = quantize_fp8_block_ref(self.p.w2.astype(F32))
            if ue8m0:
                q13, s13 = R.requantize_block_ue8m0_ref(q13, s13)
                q2, s2 = R.requantize_block_ue8m0_ref(q2, s2)
            self.w13, self.w2, self.s13, self.s2 = f8(q13), f8(q2), s13, s2
        else:
            self.w13, self.w2, self.s13, self.s2 = self.p.w13, self.p.w2, None, None

    def quant_info(self, **kw):
        args = dict(w13_weight=self.w13, w2_weight=self.w2, use_fp8=self.use_fp8)
        if self.use_fp8:
            args.update(w13_scale=self.s13, w2_scale=self.s2, block_shape=[128, 128],
                        scale_ue8m0=self.ue8m0)
        args.update(kw)
        return M.DeepGemmMoeQuantInfo(**args)

    def run(self, x=None, ids=None, wts=None, isa=None, **cfg):
        cfg.setdefault("inplace", False)
        runner = moecore.MoeRunner("deep_gemm", moecore.MoeRunnerConfig(isa_level=isa, **cfg))
        topk = moecore.StandardTopKOutput(self.p.topk_weights if wts is None else wts,
                                          self.ids if ids is None else ids)
        d = moecore.StandardDispatchOutput(self.p.x if x is None else x, topk_output=topk)
        return runner.run(d, self.quant_info()).hidden_states

    def reference(self, **cfg):
        return R.deep_gemm_moe_ref(self.p.x, self.w13, self.w2, self.p.topk_weights, self.ids,
                                   use_fp8=self.use_fp8, w13_scale=self.s13, w2_scale=self.s2,
                                   scale_ue8m0=self.ue8m0, **cfg)


DG_FLOWS = [pytest.param(True, False, id="fp8"), pytest.param(True, True, id="fp8-ue8m0"),
            pytest.param(False, False, id="bf16")]


@pytest.mark.parametrize("use_fp8, ue8m0", DG_FLOWS)
@pytest.mark.parametrize("T", [0, 1, 3, 7, 64, 300])
def test_deep_gemm_preprocess_bitexact(T, use_fp8, ue8m0):
    dg = DGProblem(T, 4, 256, 128, 3, use_fp8, ue8m0, seed=_seed("pre", T), minus_one=True)
    x = dg.p.x.copy()
    if T > 2:
        x[2] = 0  # zero row: eps path
    got = OPS.deep_gemm_preprocess(dg.ids, 4, x, use_fp8=use_fp8, scale_ue8m0=ue8m0)
    ref = R.deep_gemm_preprocess_ref(dg.ids, 4, x, use_fp8, ue8m0)
    assert got["m_max"] == ref["m_max"] == (T // 256 + 1) * 256
    assert got["expected_m"] == ref["expected_m"]
    assert_bitwise_equal(got["masked_m"], ref["masked_m"])
    assert_bitwise_equal(got["src2dst"], ref["src2dst"])
    assert int(got["masked_m"].sum()) == int((dg.ids >= 0).sum())
    if use_fp8:
        assert_bitwise_equal(u8(got["hidden_states"]), ref["hidden_states"])
        assert_bitwise_equal(got["hidden_states_scale"], ref["hidden_states_scale"])
    else:
        assert got["hidden_states_scale"] is None
        assert_bitwise_equal(got["hidden_states"].astype(F32), ref["hidden_states"])


@pytest.mark.parametrize("rsf", [None, 2.5])
def test_deep_gemm_post_reorder_bitexact(rsf):
    rng = np.random.default_rng(5)
    T, E, k, H = 33, 4, 3, 256
    ids = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32)
    ids[::4, 1] = -1
    pre = R.deep_gemm_preprocess_ref(ids, E, np.zeros((T, H), BF16), use_fp8=False)
    down = rng.standard_normal((E, pre["m_max"], H)).astype(BF16)
    wts = rng.random((T, k)).astype(F32)
    got = OPS.deep_gemm_post_reorder(down, pre["src2dst"], ids, wts, rsf)
    assert got.dtype == BF16 and got.shape == (T, H)
    assert_bitwise_equal(got.astype(F32), R.deep_gemm_post_reorder_ref(down, pre["src2dst"], ids,
                                                                       wts, rsf))


@pytest.mark.parametrize("use_fp8, ue8m0", DG_FLOWS)
@pytest.mark.parametrize("T, E, k", [(1, 4, 1), (3, 4, 2), (7, 8, 2), (64, 8, 3), (300, 4, 2)],
                         ids=lambda v: str(v))
def test_deep_gemm_matches_reference(T, E, k, use_fp8, ue8m0):
    dg = DGProblem(T, E, 256, 128, k, use_fp8, ue8m0, seed=_seed("dg", T, E, k, use_fp8, ue8m0),
                   minus_one=True)
    out = dg.run(routed_scaling_factor=1.5)
    assert out.shape == (T, 256) and out.dtype == BF16
    assert_close(out, dg.reference(routed_scaling_factor=1.5), "bf16",
                 what=f"deep_gemm fp8={use_fp8} ue8m0={ue8m0} T={T}")


def test_deep_gemm_swiglu_limit_matches_reference():
    dg = DGProblem(9, 4, 256, 256, 2, seed=21)
    assert_close(dg.run(swiglu_limit=0.3), dg.reference(swiglu_limit=0.3), "bf16")


@pytest.mark.parametrize("use_fp8, ue8m0", DG_FLOWS)
def test_deep_gemm_deterministic_and_batch_invariant(use_fp8, ue8m0, num_threads):
    dg = DGProblem(40, 4, 256, 128, 2, use_fp8, ue8m0, seed=_seed("dgdet", use_fp8, ue8m0))
    num_threads(1)
    base = dg.run(isa="scalar")
    for threads in (2, 3):
        num_threads(threads)
        for isa in isa_levels():
            assert_isa_levels_agree(dg.run(isa=isa), isa, base, "scalar", "bf16",
                                    what=f"{threads} threads {isa}")
    for t in (0, 39):
        alone = dg.run(x=dg.p.x[t:t + 1], ids=dg.ids[t:t + 1], wts=dg.p.topk_weights[t:t + 1])
        assert_bitwise_equal(alone, base[t:t + 1], what=f"token {t} alone")


def test_R9_deep_gemm_empty_input():
    for use_fp8, ue8m0 in [(True, False), (False, False)]:
        dg = DGProblem(0, 4, 256, 128, 2, use_fp8, ue8m0)
        out = dg.run()
        assert out.shape == (0, 256) and out.dtype == BF16


@pytest.mark.parametrize("cfg, exc, text", [
    (dict(activation="gelu"), AssertionError, "DeepGEMM MoE requires activation='silu'"),
    (dict(activation="relu2", is_gated=False), AssertionError, "requires activation='silu'"),
    (dict(is_gated=False), AssertionError, "requires a gated activation"),
    (dict(activation="swish"), ValueError, "Unsupported activation: activation='swish'"),
    (dict(gemm1_alpha=1.702, gemm1_clamp_limit=7.0), ValueError, "gemm1_alpha"),
    (dict(apply_router_weight_on_input=True), ValueError, "apply_router_weight_on_input"),
    (dict(no_combine=True, inplace=False), ValueError, "no_combine"),
], ids=["gelu", "relu2", "non-gated", "unknown", "gpt-oss-alpha", "weight-on-input",
        "no-combine"])
def test_R15_deep_gemm_guards_at_construction(cfg, exc, text):
    with pytest.raises(exc, match=text):
        moecore.MoeRunner("deep_gemm", moecore.MoeRunnerConfig(**cfg))


def test_deep_gemm_registrations():
    pre = {(a, b) for a, b, _ in moecore.registered_pre_permutes()}
    post = {(a, b) for a, b, _ in moecore.registered_post_permutes()}
    cores = {b for b, _ in moecore.registered_runner_cores()}
    fused = {(a, b) for a, b, _ in moecore.registered_fused_funcs()}
    assert ("standard", "deep_gemm") in pre and ("deep_gemm", "standard") in post
    assert "deep_gemm" in cores
    assert not any(b == "deep_gemm" for _, b in fused)  # sglang registers no fused func
    for fmt in ("deepep_ll", "deepep_normal"):  # the DeepEP permutes (test_ep_paths.py)
        assert (fmt, "deep_gemm") in pre and ("deep_gemm", fmt) in post


# ---------------------------------------------------------------------------------------------
# The deep_gemm core on the contiguous (m_indices) layout: sglang's ep_scatter output [M, H],
# each expert's rows one 128-aligned run, −1 padding rows. Same per-row contract as the masked
# layout, so the two agree bit for bit; padding rows are never read and come out zero.


def _dg_core_problem(use_fp8, ue8m0, T, E, k, seed, skip=()):
    """A DGProblem whose ids avoid the experts in `skip` (0-row experts) plus its masked layout."""
    dg = DGProblem(T, E, 256, 128, k, use_fp8, ue8m0, seed=seed, minus_one=True)
    rng = np.random.default_rng(seed)
    allowed = [e for e in range(E) if e not in skip]
    for t in range(T):
        ids = rng.permutation(allowed)[:k].astype(np.int32)
        dg.ids[t, :len(ids)] = ids
        dg.ids[t, len(ids):] = -1
    if T:
        dg.ids[::3, -1] = -1
    pre = OPS.deep_gemm_preprocess(dg.ids, E, dg.p.x, use_fp8=use_fp8, scale_ue8m0=ue8m0)
    return dg, pre


def _to_contiguous(pre, use_fp8, seed, order=None, gaps=()):
    """The masked rows laid out as ep_scatter does: experts in `order` (default ascending), each
    run starting on a 128-row boundary and padded with −1 rows; `gaps` adds whole padding blocks
    before the listed experts. Padding rows hold random garbage (codes, scales) so a read of one
    would show. Returns (hidden_states, scale, m_indices, [(expert, first row, rows)])."""
    rng = np.random.default_rng(seed)
    masked = pre["masked_m"]
    E, _, H = pre["hidden_states"].shape
    order = range(E) if order is None else order
    starts, r = [], 0
    for e in order:
        r += 128 * (e in gaps)
        m = int(masked[e])
        if m:
            starts.append((e, r, m))
            r += -(-m // 128) * 128
    M = r
    ids = np.full(M, -1, np.int32)
    if use_fp8:
        hs = f8(rng.integers(0, 0x7F, (M, H), dtype=np.uint8))
        sc = rng.uniform(0.5, 2.0, (M, H // 128)).astype(F32)
    else:
        hs = rng.standard_normal((M, H)).astype(BF16)
        sc = None
    for e, r0, m in starts:
        ids[r0:r0 + m] = e
        hs[r0:r0 + m] = pre["hidden_states"][e, :m]
        if use_fp8:
            sc[r0:r0 + m] = pre["hidden_states_scale"][e, :m]
    return hs, sc, ids, starts


# (T, E, k, experts with no rows, gap blocks, expert order)
CONTIG_CASES = [
    pytest.param(1, 1, 1, (), (), None, id="E1-T1"),
    pytest.param(7, 4, 2, (1,), (), None, id="E4-one-empty"),
    pytest.param(300, 4, 2, (), (0, 2), None, id="E4-multiblock-gaps"),
    pytest.param(40, 8, 3, (0, 5, 7), (3,), [7, 6, 5, 4, 3, 2, 1, 0], id="E8-descending"),
    pytest.param(0, 4, 2, (), (), None, id="empty"),
]


@pytest.mark.parametrize("T, E, k, skip, gaps, order", CONTIG_CASES)
@pytest.mark.parametrize("use_fp8, ue8m0", DG_FLOWS)
def test_deep_gemm_contiguous_equals_masked_bitwise(use_fp8, ue8m0, T, E, k, skip, gaps, order):
    dg, pre = _dg_core_problem(use_fp8, ue8m0, T, E, k, _seed("contig", T, E, use_fp8, ue8m0),
                               skip)
    assert all(pre["masked_m"][e] == 0 for e in skip)
    hs, sc, ids, starts = _to_contiguous(pre, use_fp8, _seed("pad", T, E), order, gaps)
    info = dg.quant_info()
    masked = OPS.deep_gemm_masked_core(info, pre["hidden_states"], pre["hidden_states_scale"],
                                       pre["masked_m"])
    got = OPS.deep_gemm_contiguous_core(info, hs, sc, ids)
    assert got.dtype == BF16 and got.shape == hs.shape
    for e, r0, m in starts:
        assert_bitwise_equal(got[r0:r0 + m], masked[e, :m], what=f"expert {e} rows")
    assert not np.any(got[ids < 0].astype(F32)), "padding rows must come out zero"
    assert sum(m for _, _, m in starts) == int((dg.ids >= 0).sum())


@pytest.mark.parametrize("use_fp8, ue8m0", DG_FLOWS)
def test_deep_gemm_contiguous_matches_reference(use_fp8, ue8m0):
    dg, pre = _dg_core_problem(use_fp8, ue8m0, 150, 4, 2, _seed("contig-ref", use_fp8, ue8m0),
                               skip=(2,))
    hs, sc, ids, _ = _to_contiguous(pre, use_fp8, 3, gaps=(1,))
    got = OPS.deep_gemm_contiguous_core(dg.quant_info(), hs, sc, ids)
    ref = R.deep_gemm_contiguous_core_ref(hs, sc, ids, dg.w13, dg.w2, use_fp8=use_fp8,
                                          w13_scale=dg.s13, w2_scale=dg.s2, scale_ue8m0=ue8m0)
    assert_close(got, ref, "bf16", what=f"contiguous core fp8={use_fp8} ue8m0={ue8m0}")
    assert not np.any(ref[ids < 0])
    # The twin's layouts agree exactly with each other, as the C++ ones do.
    ref_masked = R.deep_gemm_masked_core_ref(pre["hidden_states"], pre["hidden_states_scale"],
                                             pre["masked_m"], dg.w13, dg.w2, use_fp8=use_fp8,
                                             w13_scale=dg.s13, w2_scale=dg.s2,
                                             scale_ue8m0=ue8m0)
    for e, r0, m in R.contiguous_segments_ref(ids, 4):
        assert_bitwise_equal(ref[r0:r0 + m], ref_masked[e, :m])


def test_deep_gemm_contiguous_swiglu_limit_threads_and_isa(num_threads):
    dg, pre = _dg_core_problem(True, False, 60, 4, 2, 8)
    hs, sc, ids, starts = _to_contiguous(pre, True, 9)
    cfg = dict(swiglu_limit=0.3)
    info = dg.quant_info()
    num_threads(1)
    base = OPS.deep_gemm_contiguous_core(info, hs, sc, ids,
                                         config=moecore.MoeRunnerConfig(isa_level="scalar", **cfg))
    ref = R.deep_gemm_contiguous_core_ref(hs, sc, ids, dg.w13, dg.w2, use_fp8=True,
                                          w13_scale=dg.s13, w2_scale=dg.s2, swiglu_limit=0.3)
    assert_close(base, ref, "bf16")
    # The masked layout gives the contiguous one's bits at the same ISA level.
    masked = OPS.deep_gemm_masked_core(info, pre["hidden_states"], pre["hidden_states_scale"],
                                       pre["masked_m"],
                                       config=moecore.MoeRunnerConfig(isa_level="scalar", **cfg))
    for e, r0, m in starts:
        assert_bitwise_equal(base[r0:r0 + m], masked[e, :m])
    for threads in (2, 3):
        num_threads(threads)
        for isa in isa_levels():
            got = OPS.deep_gemm_contiguous_core(
                info, hs, sc, ids, config=moecore.MoeRunnerConfig(isa_level=isa, **cfg))
            assert_isa_levels_agree(got, isa, base, "scalar", "bf16", what=f"{threads} threads {isa}")


def _contig_bad(mutate=None, use_fp8=True, **kw):
    """Runs the contiguous core on a 2-expert, 256-row layout after `mutate(ids, hs, sc)` (which
    may return replacements); the twin's validator sees the same m_indices."""
    def call():
        dg, pre = _dg_core_problem(use_fp8, False, 20, 2, 1, 1)
        hs, sc, ids, _ = _to_contiguous(pre, use_fp8, 2)
        assert ids.shape == (256,) and min(pre["masked_m"]) >= 3  # each case can fail
        args = dict(ids=ids, hs=hs, sc=sc)
        if mutate is not None:
            args.update(mutate(ids.copy(), hs, sc) or {})
        OPS.deep_gemm_contiguous_core(dg.quant_info(), args["hs"], args["sc"], args["ids"], **kw)
    return call


def _ids(fn):
    def mutate(ids, hs, sc):
        return {"ids": fn(ids)}
    return mutate


def _set(ids, where, value):
    ids[where] = value
    return ids


CONTIG_BAD = [
    ("ids-int64", _ids(lambda i: i.astype(np.int64)), TypeError, "expected m_indices int32", True),
    ("ids-short", _ids(lambda i: i[:255]), ValueError, "expected m_indices int32 [256]", False),
    ("ids-2d", _ids(lambda i: i.reshape(2, 128)), ValueError, "expected m_indices int32 [256]", False),
    ("ids-ge-E", _ids(lambda i: _set(i, 0, 2)), IndexError, "m_indices must be in [-1, 2)", True),
    ("ids-lt-minus-one", _ids(lambda i: _set(i, 200, -2)), IndexError, "m_indices must be in [-1, 2)", True),
    ("expert-split", _ids(lambda i: _set(i, 200, 0)), ValueError, "rows of expert 0 must be contiguous", True),
    ("expert-hole", _ids(lambda i: _set(i, 1, -1)), ValueError, "rows of expert 0 must be contiguous", True),
    ("misaligned-start", _ids(lambda i: np.roll(i, 3)), ValueError, "start on a 128-row boundary", True),
    ("two-experts-one-block", _ids(lambda i: _set(i, slice(100, 128), 1)), ValueError, "rows of expert 1", True),
    ("M-not-multiple-of-128", lambda i, hs, sc: {"ids": i[:200], "hs": hs[:200], "sc": sc[:200]}, ValueError, "expected M a multiple of 128", True),
    ("scale-missing", lambda i, hs, sc: {"sc": None}, ValueError, "expected contiguous f32 hidden_states_scale [256, 2]", False),
    ("scale-f16", lambda i, hs, sc: {"sc": sc.astype(np.float16)}, ValueError, "hidden_states_scale [256, 2]", False),
    ("codes-bf16", lambda i, hs, sc: {"hs": np.zeros(hs.shape, BF16)}, TypeError, "hidden_states must be fp8_e4m3 codes", False),
    ("hidden-3d", lambda i, hs, sc: {"hs": hs.reshape(2, 128, 256)}, ValueError, "hidden_states [M, H] for the contiguous layout", False),
    ("hidden-H-mismatch", lambda i, hs, sc: {"hs": hs[:, :128]}, ValueError, "expected contiguous hidden_states [M, H] = [256, 256]", False),
]


@pytest.mark.parametrize("mutate, exc, text, twin",
                         [pytest.param(m, e, t, tw, id=i) for i, m, e, t, tw in CONTIG_BAD])
def test_deep_gemm_contiguous_bad_input(mutate, exc, text, twin):
    with pytest.raises(exc) as info:
        _contig_bad(mutate)()
    assert text in str(info.value), str(info.value)
    if twin:  # the numpy twin rejects the same m_indices with the same exception type
        _, pre = _dg_core_problem(True, False, 20, 2, 1, 1)
        hs, sc, ids, _ = _to_contiguous(pre, True, 2)
        bad = mutate(ids.copy(), hs, sc)["ids"]
        with pytest.raises(exc):
            R.contiguous_segments_ref(bad, 2)


def test_deep_gemm_core_bad_input_other():
    with pytest.raises(ValueError, match="takes no hidden_states_scale"):
        dg, pre = _dg_core_problem(False, False, 20, 2, 1, 1)
        hs, _, ids, _ = _to_contiguous(pre, False, 2)
        OPS.deep_gemm_contiguous_core(dg.quant_info(), hs, np.ones((256, 2), F32), ids)
    with pytest.raises(AssertionError, match="requires activation='silu'"):
        _contig_bad(config=moecore.MoeRunnerConfig(activation="gelu"))()
    dg, pre = _dg_core_problem(True, False, 20, 2, 1, 1)
    bad_m = np.array([0, pre["hidden_states"].shape[1] + 1], np.int32)
    with pytest.raises(ValueError, match=r"masked_m\[1\] must be in \[0, 256\]"):
        OPS.deep_gemm_masked_core(dg.quant_info(), pre["hidden_states"],
                                  pre["hidden_states_scale"], bad_m)
    with pytest.raises(ValueError, match="hidden_states \\[E, m, H\\] for the masked layout"):
        OPS.deep_gemm_masked_core(dg.quant_info(), pre["hidden_states"][0],
                                  pre["hidden_states_scale"][0], pre["masked_m"])


# ---------------------------------------------------------------------------------------------
# Fp8MoEMethod through FusedMoE.


class Fp8Checkpoint:
    """Per-expert FP8 checkpoint tensors (w1, w3, w2 with their scales) for one scheme."""

    def __init__(self, scheme, E, H, I_full, seed, block=(64, 64), static=False, fp8=True):
        rng = np.random.default_rng(seed)
        self.scheme, self.block, self.static, self.fp8 = scheme, block, static, fp8
        self.E, self.H, self.I = E, H, I_full
        self.dense = {}
        self.q, self.s = {}, {}
        for e in range(E):
            for name, shape, scale in (("w1", (I_full, H), 1.0), ("w3", (I_full, H), 0.6),
                                       ("w2", (H, I_full), 0.8)):
                w = (rng.standard_normal(shape) * scale / np.sqrt(shape[1])).astype(F32)
                self.dense[name, e] = w
                if scheme == "per_tensor":
                    q, s = R.quantize_weight_per_expert_ref(w[None])
                    self.q[name, e], self.s[name, e] = f8(q[0]), np.array(s[0], F32)
                elif scheme == "per_channel":
                    q, s = R.quantize_weight_per_channel_ref(w[None])
                    self.q[name, e], self.s[name, e] = f8(q[0]), s[0]
                else:
                    q, s = quantize_fp8_block_ref(w, *block)
                    self.q[name, e], self.s[name, e] = f8(q), s
        self.in13 = rng.uniform(0.01, 0.02, E).astype(F32)
        self.in2 = rng.uniform(0.003, 0.005, E).astype(F32)

    def method(self, **kw):
        args = dict(weight_scheme=self.scheme, activation_scheme="static" if self.static else "dynamic",
                    is_checkpoint_fp8_serialized=self.fp8)
        if self.scheme == "block":
            args["weight_block_size"] = list(self.block)
        args.update(kw)
        return M.Fp8MoEMethod(**args)

    def layer(self, k=2, tp_size=1, tp_rank=0, backend=None, method=None, dtype="bf16", **cfg):
        cfg.setdefault("inplace", False)
        layer = moecore.FusedMoE(
            num_experts=self.E, hidden_size=self.H, intermediate_size=self.I,
            topk_config=moecore.TopKConfig(top_k=k), params_dtype=dtype, tp_size=tp_size,
            tp_rank=tp_rank, runner_config=moecore.MoeRunnerConfig(**cfg),
            quant_method=method or self.method(), runner_backend=backend)
        scale_name = {"per_tensor": "weight_scale", "per_channel": "weight_scale",
                      "block": "weight_scale_inv"}[self.scheme]
        for e in range(self.E):
            for shard in ("w1", "w3", "w2"):
                prefix = "w2" if shard == "w2" else "w13"
                if self.fp8:
                    layer.weight_loader(f"{prefix}_weight", self.q[shard, e], "w", shard, e)
                    layer.weight_loader(f"{prefix}_{scale_name}", self.s[shard, e], "s", shard, e)
                else:
                    layer.weight_loader(f"{prefix}_weight", _cast(self.dense[shard, e], dtype), "w",
                                        shard, e)
            if self.static:
                layer.weight_loader("w13_input_scale", np.array(self.in13[e], F32), "i", "w1", e)
                layer.weight_loader("w2_input_scale", np.array(self.in2[e], F32), "i", "w2", e)
        return layer


def _topk(rng, T, E, k):
    ids = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32).reshape(T, k)
    return rng.random((T, k)).astype(F32), ids


def _layer_reference(layer, x, wts, ids, method):
    """fused_moe_w8a8_ref on the layer's processed parameters (triton contract)."""
    q = method.quant_info(layer)
    a13 = None if q.a13_scale is None else F32(np.asarray(q.a13_scale).reshape(-1)[0])
    a2 = None if q.a2_scale is None else F32(np.asarray(q.a2_scale).reshape(-1)[0])
    return R.fused_moe_w8a8_ref(x, q.w13_weight, q.w2_weight, wts, ids, quant="fp8_w8a8",
                                w13_scale=q.w13_scale, w2_scale=q.w2_scale, a13_scale=a13,
                                a2_scale=a2, per_channel_quant=q.per_channel_quant,
                                block_shape=q.block_shape, b13=q.b13, b2=q.b2)


METHOD_CASES = [
    pytest.param("per_tensor", False, id="per_tensor-dynamic"),
    pytest.param("per_tensor", True, id="per_tensor-static"),
    pytest.param("per_channel", False, id="per_channel-dynamic"),
    pytest.param("per_channel", True, id="per_channel-static"),
    pytest.param("block", False, id="block64"),
]


@pytest.mark.parametrize("scheme, static", METHOD_CASES)
def test_fp8_method_parameters(scheme, static):
    ck = Fp8Checkpoint(scheme, 4, 128, 64, seed=1, static=static)
    layer = moecore.FusedMoE(num_experts=4, hidden_size=128, intermediate_size=64,
                             topk_config=moecore.TopKConfig(top_k=2), quant_method=ck.method())
    params = {n: (a.shape, a.dtype) for n, a in layer.named_parameters().items()}
    expected = {"w13_weight": ((4, 128, 128), FP8), "w2_weight": ((4, 128, 64), FP8)}
    if scheme == "per_tensor":
        expected.update(w13_weight_scale=((4, 2), F32), w2_weight_scale=((4,), F32))
    elif scheme == "per_channel":
        expected.update(w13_weight_scale=((4, 128, 1), F32), w2_weight_scale=((4, 128, 1), F32))
    else:
        expected.update(w13_weight_scale_inv=((4, 2, 2), F32), w2_weight_scale_inv=((4, 2, 1), F32))
    if static:
        expected.update(w13_input_scale=((4,), F32), w2_input_scale=((4,), F32))
    assert params == {n: (s, np.dtype(d)) for n, (s, d) in expected.items()}


@pytest.mark.parametrize("scheme, static", METHOD_CASES)
def test_fp8_method_end_to_end(scheme, static):
    ck = Fp8Checkpoint(scheme, 6, 128, 64, seed=_seed("e2e", scheme, static), static=static)
    method = ck.method()
    layer = ck.layer(method=method)
    before = {n: np.array(a) for n, a in layer.named_parameters().items()}
    layer.process_weights_after_loading()
    assert layer.runner.runner_backend == moecore.MoeRunnerBackend.TRITON
    if scheme == "per_tensor":
        rq, rmax = R.requantize_w13_to_max_scale_ref(before["w13_weight"], before["w13_weight_scale"], 64)
        assert_bitwise_equal(u8(layer.parameter("w13_weight")), rq, what="requantized w13")
        assert_bitwise_equal(layer.parameter("w13_weight_scale"), rmax)
    if static:
        assert_bitwise_equal(layer.parameter("w13_input_scale"), np.array([ck.in13.max()], F32))
        assert_bitwise_equal(layer.parameter("w2_input_scale"), np.array([ck.in2.max()], F32))
    rng = np.random.default_rng(3)
    x = rng.standard_normal((13, 128)).astype(BF16)
    wts, ids = _topk(rng, 13, 6, 2)
    out = layer.forward_topk(x, moecore.StandardTopKOutput(wts, ids))
    assert_close(out, _layer_reference(layer, x, wts, ids, method), "bf16")
    # The layer runs the method's QuantInfo through its runner, nothing else.
    direct = layer.runner.run(moecore.StandardDispatchOutput(
        x, topk_output=moecore.StandardTopKOutput(wts, ids)), method.quant_info(layer))
    assert_bitwise_equal(out, direct.hidden_states)
    with pytest.raises(ValueError, match="already processed"):
        method.process_weights_after_loading(layer)


@pytest.mark.parametrize("scheme", ["per_tensor", "per_channel"])
def test_fp8_method_bf16_checkpoint_quantized_at_load(scheme):
    ck = Fp8Checkpoint(scheme, 3, 64, 32, seed=4, fp8=False)
    layer = ck.layer()
    w13 = np.array(layer.parameter("w13_weight"))
    w2 = np.array(layer.parameter("w2_weight"))
    assert w13.dtype == BF16
    layer.process_weights_after_loading()
    ref = R.quantize_weight_per_expert_ref if scheme == "per_tensor" else R.quantize_weight_per_channel_ref
    for name, w in (("w13", w13), ("w2", w2)):
        rq, rs = ref(w)
        assert_bitwise_equal(u8(layer.parameter(f"{name}_weight")), rq)
        assert_bitwise_equal(layer.parameter(f"{name}_weight_scale"), rs)
    x = np.random.default_rng(0).standard_normal((5, 64)).astype(BF16)
    out = layer.forward(x, np.random.default_rng(1).standard_normal((5, 3)).astype(F32))
    assert out.shape == (5, 64) and np.all(np.isfinite(out.astype(F32)))


@pytest.mark.parametrize("scheme, static", [
    pytest.param("per_tensor", True, id="per_tensor-static"),
    pytest.param("per_channel", True, id="per_channel-static"),
    pytest.param("block", False, id="block64"),
])
def test_fp8_method_tp2_slices_sum_to_full_layer(scheme, static):
    """Static and block scales quantize each rank's GEMM2 input exactly as the full layer does
    (block groups do not straddle the rank boundary), so the ranks' outputs sum to the full
    layer up to fp32 summation order. (Dynamic per-tensor/per-token GEMM2 scales are computed per
    rank over its half of I, as in sglang, so those modes are not additive bit for bit.)"""
    # f32 activations: the ranks' partial outputs are not rounded to bf16 before they are summed.
    ck = Fp8Checkpoint(scheme, 4, 128, 128, seed=_seed("tp", scheme, static), static=static)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((9, 128)).astype(F32)
    wts, ids = _topk(rng, 9, 4, 2)
    topk = moecore.StandardTopKOutput(wts, ids)
    outs = []
    for tp_size, rank in ((1, 0), (2, 0), (2, 1)):
        layer = ck.layer(tp_size=tp_size, tp_rank=rank)
        layer.process_weights_after_loading()
        outs.append(layer.forward_topk(x, topk).astype(F32))
    assert_close(outs[1] + outs[2], outs[0], "f32", what=f"TP=2 sum vs TP=1 ({scheme})")


def test_fp8_method_block_divisibility_errors():
    with pytest.raises(ValueError) as info:
        moecore.FusedMoE(num_experts=2, hidden_size=128, intermediate_size=96,
                         topk_config=moecore.TopKConfig(top_k=1),
                         quant_method=M.Fp8MoEMethod(weight_scheme="block"))
    assert str(info.value) == ("The output_size of gate's and up's weight = 96 is not divisible "
                               "by weight quantization block_n = 128.")
    with pytest.raises(ValueError) as info:
        moecore.FusedMoE(num_experts=2, hidden_size=128, intermediate_size=384, tp_size=2,
                         topk_config=moecore.TopKConfig(top_k=1),
                         quant_method=M.Fp8MoEMethod(weight_scheme="block",
                                                     weight_block_size=[64, 128]))
    assert str(info.value) == ("The input_size of down's weight = 192 is not divisible by "
                               "weight quantization block_k = 128.")


@pytest.mark.parametrize("kwargs, text", [
    (dict(weight_scheme="block", is_checkpoint_fp8_serialized=False),
     "The block-wise quantization only supports fp8-serialized checkpoint for now."),
    (dict(weight_scheme="block", activation_scheme="static"),
     ("The block-wise quantization only supports dynamic activation scheme for now, but got "
      "static activation scheme.")),
    (dict(activation_scheme="static", is_checkpoint_fp8_serialized=False),
     "Found static activation scheme for checkpoint that was not serialized fp8."),
    (dict(weight_scheme="block", weight_block_size=[128]),
     "The quantization block size of weight must have 2 dimensions, but got 1 dimensions."),
    (dict(activation_scheme="sometimes"), "Unsupported activation scheme sometimes"),
    (dict(weight_scheme="per_row"), "weight_scheme must be"),
    (dict(scale_ue8m0=True), "scale_ue8m0"),
    (dict(weight_scheme="block", weight_block_size=[64, 64], scale_ue8m0=True), "scale_ue8m0"),
    (dict(weight_scheme="block", weight_block_size=[0, 128]), "weight_block_size"),
], ids=["block-bf16", "block-static", "static-bf16", "block-1d", "act-scheme", "weight-scheme",
        "ue8m0-per-tensor", "ue8m0-block64", "block-zero"])
def test_fp8_config_errors(kwargs, text):
    with pytest.raises(ValueError) as info:
        M.Fp8MoEMethod(**kwargs)
    assert text in str(info.value)


@pytest.mark.parametrize("requested, expected", [
    (None, "triton"), ("triton", "triton"), ("flashinfer_cutlass", "triton"),
    ("flashinfer_cutedsl", "triton"), ("deep_gemm", "deep_gemm")])
def test_fp8_method_backend_resolution(requested, expected):
    ck = Fp8Checkpoint("block", 2, 128, 128, seed=0, block=(128, 128))
    layer = ck.layer(backend=requested)
    layer.process_weights_after_loading()
    assert layer.runner.runner_backend.value == expected


def test_fp8_method_unsupported_backend():
    with pytest.raises(NotImplementedError, match="not supported for FP8 MoE"):
        Fp8Checkpoint("per_tensor", 2, 64, 32, seed=0).layer(backend="marlin").process_weights_after_loading()
    ck = Fp8Checkpoint("per_channel", 2, 128, 128, seed=0)
    with pytest.raises(NotImplementedError, match="per-channel FP8 runs triton"):
        ck.layer(backend="deep_gemm").process_weights_after_loading()


@pytest.mark.parametrize("scheme, ue8m0", [("block", False), ("block", True), ("per_tensor", False)])
def test_fp8_method_deep_gemm(scheme, ue8m0):
    ck = Fp8Checkpoint(scheme, 4, 256, 128, seed=_seed("dgm", scheme, ue8m0), block=(128, 128))
    method = ck.method(scale_ue8m0=ue8m0)
    layer = ck.layer(backend="deep_gemm", method=method)
    before = {n: np.array(a) for n, a in layer.named_parameters().items()}
    layer.process_weights_after_loading()
    q = method.quant_info(layer)
    assert isinstance(q, M.DeepGemmMoeQuantInfo) and q.use_fp8 and q.block_shape == [128, 128]
    assert q.scale_ue8m0 == ue8m0
    if ue8m0:
        for name in ("w13", "w2"):
            rq, rs = R.requantize_block_ue8m0_ref(before[f"{name}_weight"], before[f"{name}_weight_scale_inv"])
            assert_bitwise_equal(u8(layer.parameter(f"{name}_weight")), rq)
            assert_bitwise_equal(layer.parameter(f"{name}_weight_scale_inv"), rs)
    if scheme == "per_tensor":
        s = layer.parameter("w13_weight_scale")
        assert_bitwise_equal(q.w13_scale, R.expand_per_tensor_to_blocks_ref(s, 256, 256))
    rng = np.random.default_rng(2)
    x = rng.standard_normal((21, 256)).astype(BF16)
    wts, ids = _topk(rng, 21, 4, 2)
    out = layer.forward_topk(x, moecore.StandardTopKOutput(wts, ids))
    ref = R.deep_gemm_moe_ref(x, q.w13_weight, q.w2_weight, wts, ids, use_fp8=True,
                              w13_scale=q.w13_scale, w2_scale=q.w2_scale, scale_ue8m0=ue8m0)
    assert_close(out, ref, "bf16")


# ---------------------------------------------------------------------------------------------
# ModelOptFp8MoEMethod (triton, flashinfer_cutlass) and R10.


def _modelopt_layer(E, H, I, backend, seed, gated=True, k=2, **cfg):
    """A ModelOpt FP8 layer with a per-tensor checkpoint (distinct w1/w3 scales) loaded."""
    ck = Fp8Checkpoint("per_tensor", E, H, I, seed=seed, static=True)
    cfg.setdefault("inplace", False)
    method = M.ModelOptFp8MoEMethod()
    layer = moecore.FusedMoE(num_experts=E, hidden_size=H, intermediate_size=I,
                             topk_config=moecore.TopKConfig(top_k=k), quant_method=method,
                             runner_backend=backend,
                             runner_config=moecore.MoeRunnerConfig(is_gated=gated, **cfg))
    for e in range(E):
        for shard in (("w1", "w3", "w2") if gated else ("w1", "w2")):
            prefix = "w2" if shard == "w2" else "w13"
            layer.weight_loader(f"{prefix}_weight", ck.q[shard, e], "w", shard, e)
            layer.weight_loader(f"{prefix}_weight_scale", ck.s[shard, e], "s", shard, e)
        layer.weight_loader("w13_input_scale", np.array(ck.in13[e], F32), "i", "w1", e)
        layer.weight_loader("w2_input_scale", np.array(ck.in2[e], F32), "i", "w2", e)
    return layer, method, ck


def _cutlass_registered():
    return ("none", "flashinfer_cutlass") in {(a, b) for a, b, _ in moecore.registered_fused_funcs()}


def test_modelopt_fp8_parameters_and_initial_values():
    layer = moecore.FusedMoE(num_experts=3, hidden_size=32, intermediate_size=24,
                             topk_config=moecore.TopKConfig(top_k=1),
                             quant_method=M.ModelOptFp8MoEMethod())
    p = layer.named_parameters()
    assert p["w13_weight"].dtype == FP8 and p["w13_weight"].shape == (3, 48, 32)
    assert p["w2_weight"].dtype == FP8 and p["w2_weight"].shape == (3, 32, 24)
    assert np.all(p["w13_weight_scale"] == np.finfo(F32).min) and p["w13_weight_scale"].shape == (3, 2)
    assert np.all(p["w2_weight_scale"] == np.finfo(F32).min) and p["w2_weight_scale"].shape == (3,)
    assert np.all(p["w13_input_scale"] == 1) and np.all(p["w2_input_scale"] == 1)
    assert layer.quant_method.backend == moecore.MoeRunnerBackend.TRITON
    assert not layer.quant_method.load_up_proj_weight_first


def test_modelopt_fp8_triton_end_to_end():
    layer, method, ck = _modelopt_layer(4, 64, 40, None, seed=8)
    before = {n: np.array(a) for n, a in layer.named_parameters().items()}
    layer.process_weights_after_loading()
    rq, rmax = R.requantize_w13_to_max_scale_ref(before["w13_weight"], before["w13_weight_scale"], 40)
    assert_bitwise_equal(u8(layer.parameter("w13_weight")), rq)
    assert_bitwise_equal(layer.parameter("w13_weight_scale"), rmax)
    q = method.quant_info(layer)
    assert isinstance(q, M.TritonMoeQuantInfo) and q.use_fp8_w8a8 and not q.per_channel_quant
    assert q.a13_scale.shape == (1,) and q.a13_scale[0] == ck.in13.max()
    rng = np.random.default_rng(4)
    x = rng.standard_normal((10, 64)).astype(BF16)
    wts, ids = _topk(rng, 10, 4, 2)
    out = layer.forward_topk(x, moecore.StandardTopKOutput(wts, ids))
    assert_close(out, _layer_reference(layer, x, wts, ids, method), "bf16")


def test_modelopt_fp8_cutlass_loads_up_first_and_pairs_shard_scales():
    layer, method, ck = _modelopt_layer(3, 32, 32, "flashinfer_cutlass", seed=9)
    assert method.backend == moecore.MoeRunnerBackend.FLASHINFER_CUTLASS
    assert method.load_up_proj_weight_first
    w13 = np.array(u8(layer.parameter("w13_weight")))  # a copy: processing works in place
    for e in range(3):
        assert_bitwise_equal(w13[e, :32], u8(ck.q["w3", e]), what="rows [0, I) hold up (w3)")
        assert_bitwise_equal(w13[e, 32:], u8(ck.q["w1", e]), what="rows [I, 2I) hold gate (w1)")
    s13 = np.array(layer.parameter("w13_weight_scale"))
    assert s13[0, 0] == ck.s["w1", 0] and s13[0, 1] == ck.s["w3", 0]  # scales stay [w1, w3]
    if not _cutlass_registered():
        pytest.skip("flashinfer_cutlass is not registered in this build")
    layer.process_weights_after_loading()
    # Each half is dequantized with its own shard's scale (moecore's deliberate fix, see
    # modelopt_fp8.cpp): the up rows with the w3 scale.
    rq, rmax = R.requantize_w13_to_max_scale_ref(w13, s13, 32, shard_cols=(1, 0))
    assert_bitwise_equal(u8(layer.parameter("w13_weight")), rq)
    assert_bitwise_equal(layer.parameter("w13_weight_scale"), rmax)


@pytest.mark.parametrize("inter", [40, 48], ids=["I40-padded", "I48-aligned"])
def test_R10_flashinfer_cutlass_fp8_padding(inter):
    """ModelOpt FP8 on flashinfer_cutlass with I % 16 != 0: the gated halves are zero-padded
    separately to round_up(I, 16), w2 on its last dim, the fc1/fc2 scale algebra is sglang's,
    and the MoE output equals the unpadded reference."""
    if not _cutlass_registered():
        pytest.skip("flashinfer_cutlass is not registered in this build")
    from moecore.reference.moe_nvfp4 import flashinfer_cutlass_moe_ref

    E, H = 4, 64
    layer, method, ck = _modelopt_layer(E, H, inter, "flashinfer_cutlass", seed=10,
                                        routed_scaling_factor=1.25)
    before = {n: np.array(a) for n, a in layer.named_parameters().items()}
    layer.process_weights_after_loading()
    rq13, rmax = R.requantize_w13_to_max_scale_ref(before["w13_weight"], before["w13_weight_scale"],
                                                   inter, shard_cols=(1, 0))
    unpadded_w13, unpadded_w2 = f8(rq13), before["w2_weight"]
    p13, p2 = R.pad_intermediate_ref(unpadded_w13, unpadded_w2, 16, gated=True)
    ip = -(-inter // 16) * 16
    assert layer.parameter("w13_weight").shape == (E, 2 * ip, H)
    assert layer.parameter("w2_weight").shape == (E, H, ip)
    assert_bitwise_equal(u8(layer.parameter("w13_weight")), u8(p13), what="padded w13")
    assert_bitwise_equal(u8(layer.parameter("w2_weight")), u8(p2), what="padded w2")
    scales = R.modelopt_cutlass_scales_ref(rmax, before["w2_weight_scale"], ck.in13, ck.in2)
    q = method.quant_info(layer)
    assert isinstance(q, M.FlashInferCutlassMoeQuantInfo) and q.quant_type == "fp8"
    for got, want, name in zip(q.quant_scales, scales,
                               ["fc1_dequant", "fc2_quant", "fc2_dequant", "fc1_input_dequant"]):
        assert_bitwise_equal(np.asarray(got), want, what=name)
        assert_bitwise_equal(layer.parameter(name), want, what=name)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((17, H)).astype(BF16)
    wts, ids = _topk(rng, 17, E, 2)
    topk = moecore.StandardTopKOutput(wts, ids)
    out = layer.forward_topk(x, topk)
    ref = flashinfer_cutlass_moe_ref(x, ids, wts, quant_type="fp8", w13=unpadded_w13,
                                     w2=unpadded_w2, quant_scales=scales,
                                     routed_scaling_factor=1.25)
    assert_close(out, ref, "bf16", what="padded cutlass output vs unpadded reference")
    # The same backend on the unpadded weights gives the same bits: padding adds exact zeros.
    unpadded = M.FlashInferCutlassMoeQuantInfo(quant_type="fp8", w13_weight=unpadded_w13,
                                               w2_weight=unpadded_w2, quant_scales=scales)
    direct = moecore.MoeRunner("flashinfer_cutlass", moecore.MoeRunnerConfig(
        inplace=False, routed_scaling_factor=1.25)).run(
            moecore.StandardDispatchOutput(x, topk_output=topk), unpadded).hidden_states
    assert_bitwise_equal(out, direct, what="padded vs unpadded flashinfer_cutlass")


def test_modelopt_fp8_padding_keeps_triton_output():
    """The padded layout run through triton equals the unpadded one bit for bit (zero rows of
    gate/up give silu(0)·0 = 0, zero w2 columns add exact zeros)."""
    E, H, inter = 3, 32, 40
    layer, method, _ = _modelopt_layer(E, H, inter, None, seed=12)
    layer.process_weights_after_loading()
    q = method.quant_info(layer)
    p13, p2 = R.pad_intermediate_ref(q.w13_weight, q.w2_weight, 16, gated=True)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((9, H)).astype(BF16)
    wts, ids = _topk(rng, 9, E, 2)
    d = moecore.StandardDispatchOutput(x, topk_output=moecore.StandardTopKOutput(wts, ids))
    cfg = moecore.MoeRunnerConfig(inplace=False)
    args = dict(use_fp8_w8a8=True, w13_scale=q.w13_scale, w2_scale=q.w2_scale,
                a13_scale=q.a13_scale, a2_scale=q.a2_scale)
    a = moecore.MoeRunner("triton", cfg).run(d, M.TritonMoeQuantInfo(
        w13_weight=q.w13_weight, w2_weight=q.w2_weight, **args)).hidden_states
    b = moecore.MoeRunner("triton", cfg).run(d, M.TritonMoeQuantInfo(
        w13_weight=p13, w2_weight=p2, **args)).hidden_states
    assert_bitwise_equal(a, b)


def test_modelopt_fp8_errors():
    with pytest.raises(NotImplementedError, match="not supported for ModelOpt FP8"):
        moecore.FusedMoE(num_experts=2, hidden_size=32, intermediate_size=16,
                         topk_config=moecore.TopKConfig(top_k=1), runner_backend="deep_gemm",
                         quant_method=M.ModelOptFp8MoEMethod())
    with pytest.raises(NotImplementedError, match="no biases"):
        moecore.FusedMoE(num_experts=2, hidden_size=32, intermediate_size=16, with_bias=True,
                         topk_config=moecore.TopKConfig(top_k=1),
                         quant_method=M.ModelOptFp8MoEMethod())
    layer = moecore.FusedMoE(num_experts=2, hidden_size=32, intermediate_size=16,
                             topk_config=moecore.TopKConfig(top_k=1),
                             quant_method=M.ModelOptFp8MoEMethod())
    # Scales never loaded stay at float32 min: processing refuses them before changing anything.
    with pytest.raises(ValueError, match=r"w13_weight_scale must be finite and > 0, got -3\.40"):
        layer.process_weights_after_loading()


# ---------------------------------------------------------------------------------------------
# Bad input: each case names the exception type and a message fragment, and leaves the caller's
# arrays untouched.


def _tq(scheme="per_tensor-static", **overrides):
    H, I = _dims(scheme, 40, 24)
    qp = QProblem(scheme, 5, 4, H, I, 2, seed=1)
    return qp, overrides


def _triton_case(scheme="per_tensor-static", x=None, **overrides):
    def call():
        qp, ov = _tq(scheme, **overrides)
        d = moecore.StandardDispatchOutput(qp.p.x if x is None else x(qp),
                                           topk_output=moecore.StandardTopKOutput(
                                               qp.p.topk_weights, qp.p.topk_ids))
        q = qp.quant_info(**{k: (v(qp) if callable(v) else v) for k, v in ov.items()})
        moecore.MoeRunner("triton", moecore.MoeRunnerConfig(inplace=False)).run(d, q)
    return call


def _dg_case(cfg=None, x=None, **overrides):
    def call():
        dg = DGProblem(5, 4, 256, 128, 2, seed=2)
        d = moecore.StandardDispatchOutput(dg.p.x if x is None else x(dg),
                                           topk_output=moecore.StandardTopKOutput(
                                               dg.p.topk_weights, dg.ids))
        q = dg.quant_info(**{k: (v(dg) if callable(v) else v) for k, v in overrides.items()})
        moecore.MoeRunner("deep_gemm", moecore.MoeRunnerConfig(inplace=False, **(cfg or {}))).run(d, q)
    return call


def _scale_with(value, index=0):
    def make(qp):
        s = np.array(qp.s13, F32)
        s.reshape(-1)[index] = value
        return s
    return make


NEG, NAN, INF = -1.0, float("nan"), float("inf")
BAD = [
    # triton use_fp8_w8a8 payloads
    ("fp8-weights-bf16", _triton_case(w13_weight=lambda qp: qp.p.w13), TypeError, "expects fp8_e4m3fn weights"),
    ("fp8-w2-int8", _triton_case(w2_weight=lambda qp: np.zeros(qp.q2.shape, np.int8)), TypeError, "expects fp8_e4m3"),
    ("fp8-x-fp8", _triton_case(x=lambda qp: qp.q13[0, :5, :40]), TypeError, "hidden_states must be f32, f16 or bf16"),
    ("fp8-x-wrong-H", _triton_case(x=lambda qp: qp.p.x[:, :8].copy()), ValueError, "expected hidden_states"),
    ("fp8-scale-missing", _triton_case(w13_scale=None), ValueError, "w13_scale is required"),
    ("fp8-scale-shape", _triton_case(w13_scale=lambda qp: np.ones((4, 2), F32)), ValueError, "expected per-tensor w13_scale [4]"),
    ("fp8-scale-f64", _triton_case(w13_scale=lambda qp: np.ones(4, np.float64)), TypeError, "unsupported dtype float64"),
    ("fp8-scale-f16", _triton_case(w2_scale=lambda qp: np.ones(4, np.float16)), TypeError, "w2_scale must be float32"),
    ("fp8-scale-negative", _triton_case(w13_scale=_scale_with(NEG, 2)), ValueError, "w13_scale must be finite and >= 0, got -1 at [2]"),
    ("fp8-scale-nan", _triton_case(w13_scale=_scale_with(NAN)), ValueError, "w13_scale must be finite"),
    ("fp8-scale-inf", _triton_case(w13_scale=_scale_with(INF)), ValueError, "w13_scale must be finite"),
    ("fp8-a13-zero", _triton_case(a13_scale=np.zeros(1, F32)), ValueError, "a13_scale must be finite and > 0"),
    ("fp8-a2-negative", _triton_case(a2_scale=np.array([-0.5], F32)), ValueError, "a2_scale must be finite and > 0"),
    ("fp8-a2-nan", _triton_case(a2_scale=np.array([np.nan], F32)), ValueError, "a2_scale must be finite"),
    ("fp8-a13-per-expert", _triton_case(a13_scale=np.ones(4, F32)), ValueError, "expected a13_scale with one value"),
    ("fp8-a13-f64", _triton_case(a13_scale=np.ones(1, np.float64)), TypeError, "unsupported dtype float64"),
    ("fp8-channel-scale-shape", _triton_case("per_channel-static", w13_scale=lambda qp: np.ones((4, 48, 2), F32)), ValueError, "expected w13_scale [4, 48] or [4, 48, 1]"),
    ("fp8-channel-scale-neg", _triton_case("per_channel-static", w2_scale=lambda qp: -np.ones((4, 40, 1), F32)), ValueError, "w2_scale must be finite and >= 0"),
    ("fp8-block-H-misaligned", lambda: QProblem("block64x64", 5, 4, 96, 64, 2, seed=1).run(), ValueError, "expected H and I divisible by it, got H=96, I=64"),
    ("fp8-block-scale-shape", _triton_case("block64x64", w13_scale=lambda qp: np.ones((4, 2, 2), F32)), ValueError, "expected w13_scale [4, 2, 1]"),
    ("fp8-block-with-a13", _triton_case("block64x64", a13_scale=np.ones(1, F32)), ValueError, "a13_scale and a2_scale must be None"),
    ("fp8-block-and-per-channel", _triton_case("block64x64", per_channel_quant=True), ValueError, "exclusive"),
    ("fp8-block-nan-scale", _triton_case("block64x64", w2_scale=lambda qp: np.full(qp.s2.shape, np.nan, F32)), ValueError, "w2_scale must be finite"),
    ("fp8-two-flags", _triton_case(use_int8_w8a8=True), ValueError, "expected exactly one of"),
    ("fp8-int4", _triton_case(use_fp8_w8a8=False, use_int4_w4a16=True), NotImplementedError, "use_int4_w4a16 (GPTQ/AWQ) is not built"),
    ("fp8-zero-points", _triton_case(w13_zp=lambda qp: np.zeros((4, 48), np.uint8)), NotImplementedError, "zero points"),
    ("fp8-b13-shape", _triton_case(b13=lambda qp: np.zeros((4, 3), F32)), ValueError, "expected contiguous b13 [4, 48]"),
    ("fp8-ids-out-of-range", lambda: _run_with_ids(np.full((5, 2), 4, np.int32)), IndexError,
     "topk_ids must be in [-1, 4)"),
    # deep_gemm payloads and inputs
    ("dg-x-f32", _dg_case(x=lambda dg: dg.p.x.astype(F32)), TypeError, "hidden_states dtype must equal"),
    ("dg-H-misaligned", _dg_case(x=lambda dg: dg.p.x[:, :192].copy(), w13_weight=lambda dg: f8(np.zeros((4, 256, 192), np.uint8)), w13_scale=lambda dg: np.ones((4, 2, 2), F32), w2_weight=lambda dg: f8(np.zeros((4, 192, 128), np.uint8)), w2_scale=lambda dg: np.ones((4, 2, 1), F32)), ValueError, "expected H and I multiples of 128"),
    ("dg-block64", _dg_case(block_shape=[64, 64]), ValueError, "expected block_shape [128, 128]"),
    ("dg-scale-shape", _dg_case(w13_scale=lambda dg: np.ones((4, 2, 1), F32)), ValueError, "expected w13_scale [4, 2, 2]"),
    ("dg-scale-negative", _dg_case(w2_scale=lambda dg: -np.ones((4, 2, 1), F32)), ValueError, "w2_scale must be finite and >= 0"),
    ("dg-ue8m0-not-pow2", _dg_case(scale_ue8m0=True), ValueError, "needs w13_scale to hold powers of two"),
    ("dg-ue8m0-nan", _dg_case(scale_ue8m0=True, w13_scale=lambda dg: np.full((4, 2, 2), np.nan, F32)), ValueError, "must be finite and > 0"),
    ("dg-fp4-experts", _dg_case(is_fp4_experts=True), NotImplementedError, "is_fp4_experts"),
    ("dg-bf16-weights-use-fp8", _dg_case(w13_weight=lambda dg: dg.p.w13), TypeError, "w13_weight must be fp8_e4m3fn"),
    ("dg-bf16-with-scales", _dg_case(use_fp8=False, w13_weight=lambda dg: dg.p.w13, w2_weight=lambda dg: dg.p.w2), ValueError, "takes no w13_scale/w2_scale"),
    ("dg-wrong-payload", lambda: moecore.MoeRunner("deep_gemm", moecore.MoeRunnerConfig(inplace=False)).run(
        moecore.StandardDispatchOutput(np.zeros((1, 256), BF16), topk_output=moecore.StandardTopKOutput(np.ones((1, 1), F32), np.zeros((1, 1), np.int32))),
        M.TritonMoeQuantInfo(w13_weight=np.zeros((1, 2, 256), BF16), w2_weight=np.zeros((1, 256, 1), BF16))),
     TypeError, "expected DeepGemmMoeQuantInfo"),
    # quantizer and helper entry points
    ("act-rule", lambda: OPS.quantize_activation(np.zeros((1, 128), F32), "fp8_dynamic"), ValueError, "expected rule"),
    ("act-static-zero", lambda: OPS.quantize_activation(np.zeros((1, 128), F32), "fp8_static", scale=0.0), ValueError, "expected a finite scale > 0"),
    ("act-static-nan", lambda: OPS.quantize_activation(np.zeros((1, 128), F32), "fp8_static", scale=float("nan")), ValueError, "expected a finite scale > 0"),
    ("act-group-misaligned", lambda: OPS.quantize_activation(np.zeros((2, 100), F32), "fp8_per_token_group"), ValueError, "expected K divisible by group_size=128"),
    ("act-int-input", lambda: OPS.quantize_activation(np.zeros((2, 128), np.int32), "fp8_per_token"), TypeError, "expected x f32, f16 or bf16"),
    ("act-3d", lambda: OPS.quantize_activation(np.zeros((2, 2, 128), F32), "fp8_per_token"), ValueError, "expected x [rows, K]"),
    ("pre-x-f32", lambda: OPS.deep_gemm_preprocess(np.zeros((2, 1), np.int32), 2, np.zeros((2, 128), F32)), TypeError, "DeepGEMM takes bf16 hidden_states"),
    ("pre-H-misaligned", lambda: OPS.deep_gemm_preprocess(np.zeros((2, 1), np.int32), 2, np.zeros((2, 100), BF16)), ValueError, "multiple of 128"),
    ("pre-ids-range", lambda: OPS.deep_gemm_preprocess(np.full((2, 1), 2, np.int32), 2, np.zeros((2, 128), BF16)), IndexError, "topk_ids must be in [-1, 2)"),
    ("pre-ids-float", lambda: OPS.deep_gemm_preprocess(np.zeros((2, 1), F32), 2, np.zeros((2, 128), BF16)), TypeError, "topk_ids must be int32 or int64"),
    ("pre-experts-zero", lambda: OPS.deep_gemm_preprocess(np.zeros((2, 1), np.int32), 0, np.zeros((2, 128), BF16)), ValueError, "num_local_experts > 0"),
    ("post-src2dst-range", lambda: OPS.deep_gemm_post_reorder(np.zeros((1, 256, 8), BF16), np.array([999], np.int32), np.zeros((1, 1), np.int32), np.ones((1, 1), F32)), IndexError, "outside down_output"),
    ("post-down-f32", lambda: OPS.deep_gemm_post_reorder(np.zeros((1, 256, 8), F32), np.array([0], np.int32), np.zeros((1, 1), np.int32), np.ones((1, 1), F32)), ValueError, "expected contiguous bf16 down_output"),
    ("post-rsf-nan", lambda: OPS.deep_gemm_post_reorder(np.zeros((1, 256, 8), BF16), np.array([0], np.int32), np.zeros((1, 1), np.int32), np.ones((1, 1), F32), float("nan")), ValueError, "finite routed_scaling_factor"),
    ("requant-scales-zero", lambda: OPS.requantize_w13_to_max_scale(f8(np.zeros((1, 4, 4), np.uint8)), np.zeros((1, 2), F32), 2), ValueError, "scales must be finite and > 0"),
    ("requant-not-fp8", lambda: OPS.requantize_w13_to_max_scale(np.zeros((1, 4, 4), F32), np.ones((1, 2), F32), 2), TypeError, "expected fp8_e4m3"),
    ("ue8m0-scale-shape", lambda: OPS.requantize_block_ue8m0(f8(np.zeros((1, 4, 4), np.uint8)), np.ones((1, 2, 2), F32)), ValueError, "expected f32 scale [1, 1, 1]"),
    ("ue8m0-scale-negative", lambda: OPS.requantize_block_ue8m0(f8(np.zeros((1, 4, 4), np.uint8)), -np.ones((1, 1, 1), F32)), ValueError, "scale must be finite and > 0"),
    # quant methods
    ("method-static-input-scale-zero", lambda: _static_layer_with_input_scale(0.0).process_weights_after_loading(), ValueError, "w13_input_scale must be finite and > 0"),
    ("method-static-input-scale-nan", lambda: _static_layer_with_input_scale(float("nan")).process_weights_after_loading(), ValueError, "w13_input_scale must be finite"),
    ("method-weight-scale-negative", lambda: _per_tensor_layer_with_scale(-2.0).process_weights_after_loading(), ValueError, "w13_weight_scale must be finite and > 0"),
    ("method-quant-info-before-process", lambda: M.Fp8MoEMethod().quant_info(Fp8Checkpoint("per_tensor", 2, 32, 16, seed=0).layer()), ValueError, "run process_weights_after_loading"),
    ("method-params-dtype-int", lambda: moecore.FusedMoE(num_experts=2, hidden_size=32, intermediate_size=16, params_dtype="i32", topk_config=moecore.TopKConfig(top_k=1), quant_method=M.Fp8MoEMethod(is_checkpoint_fp8_serialized=False)), TypeError, "params_dtype must be f32, f16 or bf16"),
    ("loader-scale-dtype", lambda: Fp8Checkpoint("per_tensor", 2, 32, 16, seed=0).layer().weight_loader("w13_weight_scale", np.ones(1, np.float16), "s", "w1", 0), TypeError, "w13_weight_scale holds f32"),
    ("loader-scale-two-values", lambda: Fp8Checkpoint("per_tensor", 2, 32, 16, seed=0).layer().weight_loader("w13_weight_scale", np.ones(2, F32), "s", "w1", 0), ValueError, "holding one value"),
    ("loader-block-scale-shape", lambda: Fp8Checkpoint("block", 2, 128, 128, seed=0).layer().weight_loader("w13_weight_scale_inv", np.ones((3, 2), F32), "s", "w1", 0), ValueError, "w13_weight_scale_inv shard 'w1'"),
]


def _run_with_ids(ids):
    qp = QProblem("per_tensor-static", 5, 4, 40, 24, 2, seed=1)
    qp.run(ids=ids)


def _static_layer_with_input_scale(v):
    layer = Fp8Checkpoint("per_tensor", 2, 32, 16, seed=0, static=True).layer()
    layer.weight_loader("w13_input_scale", np.array(v, F32), "i", "w1", 1)
    return layer


def _per_tensor_layer_with_scale(v):
    layer = Fp8Checkpoint("per_tensor", 2, 32, 16, seed=0).layer()
    layer.weight_loader("w13_weight_scale", np.array(v, F32), "s", "w3", 1)
    return layer


@pytest.mark.parametrize("call, exc, text", [pytest.param(c, e, t, id=i) for i, c, e, t in BAD])
def test_fp8_bad_input(call, exc, text):
    with pytest.raises(exc) as info:
        call()
    assert text in str(info.value), str(info.value)


def test_fp8_bad_input_leaves_arrays_untouched():
    qp = QProblem("per_tensor-static", 5, 4, 40, 24, 2, seed=1)
    x = qp.p.x.copy()
    q = qp.quant_info(a2_scale=np.zeros(1, F32))
    with pytest.raises(ValueError):
        moecore.MoeRunner("triton", moecore.MoeRunnerConfig(inplace=True)).run(
            moecore.StandardDispatchOutput(qp.p.x, topk_output=moecore.StandardTopKOutput(
                qp.p.topk_weights, qp.p.topk_ids)), q)
    assert_bitwise_equal(qp.p.x, x)
    layer = _per_tensor_layer_with_scale(-2.0)
    w13 = np.array(layer.parameter("w13_weight"))
    with pytest.raises(ValueError):
        layer.process_weights_after_loading()
    assert_bitwise_equal(np.array(layer.parameter("w13_weight")), w13)
    assert layer.parameter("w13_weight_scale").shape == (2, 2)


def test_strided_hidden_states_give_the_same_bits():
    """Rows with padding (x[:, :H] of a wider array) are read in place, never copied wrongly."""
    qp = QProblem("block64x64", 9, 4, 64, 64, 2, seed=4)
    wide = np.zeros((9, 80), BF16)
    wide[:, :64] = qp.p.x
    assert_bitwise_equal(qp.run(x=wide[:, :64]), qp.run())
    dg = DGProblem(9, 4, 256, 128, 2, seed=4)
    wide = np.zeros((9, 300), BF16)
    wide[:, :256] = dg.p.x
    assert_bitwise_equal(dg.run(x=wide[:, :256]), dg.run())
