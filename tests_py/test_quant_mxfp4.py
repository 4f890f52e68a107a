"""MXFP4 MoE: GPT-OSS Mxfp4MoEMethod, the DSv4 Mxfp4FlashinferCutlassMoEMethod and the
flashinfer_mxfp4 runner backend (spec §6.5, §6.8 "FlashInfer MXFP4", §7.3, §7.6; rules R7, R8, R9).

Ports of sglang's test/registered/unit/layers/quantization/test_mxfp4_sm90_cutlass.py:
* test_process_weights_matches_direct_interleave — the processed weights, scales, biases and
  SwiGLU constants equal a manual de-interleave + pad(128) + [up; gate] + SM90 interleave built in
  numpy (moecore.reference.moe_mxfp4 + reference.layout), bit for bit, on sglang's shapes
  (including GPT-OSS-20B's 2880) plus two of moecore's (I padded to 64 first, tiny H).
* test_R7_apply_equals_direct_backend_call — the MoeRunner path (layer → quant method → runner →
  fused func) is bit-identical to calling the kernel directly with the same processed weights,
  input pre-padded and output trimmed by the test (sglang's torch.equal check), on sglang's shapes.
* test_dsv4_apply_equals_direct_backend_call — the DSv4 sibling, loader fed [w1; w3].
Numerics: the backend against the numpy reference (bf16 row) over T ∈ {0, 1, 3, 7, 64}, sizes
that are not multiples of 128, GPT-OSS / custom per-expert / absent SwiGLU constants, −1 ids,
EP and TP ranks; determinism across thread counts and batch invariance (bitwise). A bad-input
table closes the file. transformers oracles live in test_gpt_oss.py.
"""

from __future__ import annotations

import moecore
import numpy as np
import pytest
from moecore import _moecore as C
from moecore import formats as mf
from moecore.reference import moe_mxfp4 as R
from moecore.testing import (
    assert_bitwise_equal,
    assert_close,
    assert_isa_levels_agree,
    cast,
    random_routing,
)
from moecore.testing import mxfp4 as M

BACKEND = "flashinfer_mxfp4"


def _topk(rng, tokens, experts, k, *, drop=False):
    w, ids = random_routing(rng, tokens, experts, k)
    if drop and tokens >= 3:  # a few empty slots (−1 contributes nothing, R14)
        ids[1, 0] = -1
        ids[tokens - 1, k - 1] = -1
    return w, ids


def _x(rng, tokens, hidden, scale=1.0):
    return cast(rng.standard_normal((tokens, hidden)) * scale, "bf16")


# ---------------------------------------------------------------------------------------------
# sglang port: processing

SGLANG_PROCESS_SHAPES = [(4, 256, 256), (8, 768, 384), (8, 1024, 1024), (4, 192, 192),
                         (4, 2880, 2880)]
MOECORE_PROCESS_SHAPES = [(3, 96, 160), (2, 160, 96)]  # Ip = 192 ≠ I; H < 128


@pytest.mark.parametrize("num_experts, hidden, inter",
                         SGLANG_PROCESS_SHAPES + MOECORE_PROCESS_SHAPES,
                         ids=lambda v: str(v))
def test_process_weights_matches_direct_interleave(num_experts, hidden, inter):
    rng = np.random.default_rng(hidden * 7 + inter)
    ckpt = M.random_gpt_oss_checkpoint(rng, num_experts, hidden, inter, mode="bytes")
    layer, method = M.gpt_oss_layer(ckpt)
    expected = M.gpt_oss_logical(ckpt, interleave=True)
    np_, kp = R.round_up(inter, 128), R.round_up(hidden, 128)
    assert (method.padded_intermediate, method.padded_hidden) == (np_, kp)
    got = layer.named_parameters()
    assert set(got) == set(expected)
    shapes = {
        "w13_weight": (num_experts, 2 * np_, kp // 2),
        "w13_weight_scale": (num_experts, 2 * np_ // 64, kp // 128, 16, 16),
        "w13_weight_bias": (num_experts, 2 * np_),
        "w2_weight": (num_experts, kp, np_ // 2),
        "w2_weight_scale": (num_experts, kp // 64, np_ // 128, 16, 16),
        "w2_weight_bias": (num_experts, kp),
        "swiglu_alpha": (num_experts,), "swiglu_beta": (num_experts,),
        "swiglu_limit": (num_experts,),
    }
    for name, want in expected.items():
        assert got[name].shape == shapes[name], name
        assert_bitwise_equal(got[name], want, what=name)
    assert got["swiglu_alpha"].dtype == np.float32
    assert np.all(got["swiglu_alpha"] == np.float32(1.702))
    assert np.all(got["swiglu_beta"] == np.float32(1.0))
    assert np.all(got["swiglu_limit"] == np.float32(7.0))


def test_process_matches_formats_pipeline_on_loaded_buffers():
    """The processed bytes are exactly moecore.formats' transforms applied to what the loader
    wrote (de-interleave rows, swap halves, pad halves, pad K, SM90 interleave)."""
    rng = np.random.default_rng(5)
    ckpt = M.random_gpt_oss_checkpoint(rng, 2, 160, 96, mode="bytes")
    layer, _ = M.gpt_oss_layer(ckpt, process=False)
    loaded = layer.parameter("w13_weight").copy()  # [E, 2·Ip, H/2], Ip = 128
    assert loaded.shape == (2, 256, 80)
    assert not loaded[:, 192:].any()  # rows past 2I stay zero
    F = C.formats
    t = F.deinterleave_gate_up_rows(loaded, 1)
    t = F.swap_w13_halves(t, 1)
    t = F.pad_w13_intermediate(t, 128, True, 1)
    t = F.pad_dim(t, 2, 128)
    expected = F.interleave_moe_weights_for_sm90_mixed_gemm(t, "fp4")
    layer.process_weights_after_loading()
    assert_bitwise_equal(layer.parameter("w13_weight"), np.asarray(expected).view(np.uint8))


def test_per_expert_weight_loader_equals_fused_loader():
    """FusedMoE.weight_loader takes one expert's whole (sliced, padded) tensor per call for the
    GPT-OSS parameters; w2_weight_bias counts on TP rank 0 only."""
    rng = np.random.default_rng(15)
    ckpt = M.random_gpt_oss_checkpoint(rng, 3, 96, 160, mode="bytes")
    fused, _ = M.gpt_oss_layer(ckpt, process=False)
    names = fused.named_parameters()
    for tp_rank in (0, 1):
        layer, _ = M.gpt_oss_layer(M.random_gpt_oss_checkpoint(rng, 3, 96, 160), process=False,
                                   tp_size=1)
        if tp_rank:
            layer = moecore.FusedMoE(
                num_experts=3, hidden_size=96, intermediate_size=320, tp_size=2, tp_rank=1,
                topk_config=moecore.TopKConfig(top_k=2), quant_method=C.Mxfp4MoEMethod(),
                runner_backend=BACKEND)
        for name, full in names.items():
            shard = "w2" if name.startswith("w2") else "w1"
            for e in range(3):
                assert layer.weight_loader(name, full[e], name, shard, e)
        for name, full in names.items():
            want = np.zeros_like(full) if (tp_rank and name == "w2_weight_bias") else full
            assert_bitwise_equal(layer.parameter(name), want, what=f"tp_rank {tp_rank} {name}")


# ---------------------------------------------------------------------------------------------
# sglang port: R7

SGLANG_APPLY_SHAPES = [(4, 4, 256, 256, 2), (16, 8, 768, 384, 2), (32, 8, 1024, 1024, 4),
                       (8, 4, 192, 192, 2)]


@pytest.mark.parametrize("tokens, num_experts, hidden, inter, top_k", SGLANG_APPLY_SHAPES,
                         ids=lambda v: str(v))
def test_R7_apply_equals_direct_backend_call(tokens, num_experts, hidden, inter, top_k):
    rng = np.random.default_rng(tokens + hidden)
    ckpt = M.random_gpt_oss_checkpoint(rng, num_experts, hidden, inter, mode="bytes")
    layer, method = M.gpt_oss_layer(ckpt, top_k=top_k)
    assert layer.runner.uses_fused_func and not layer.runner.has_runner_core
    x = _x(rng, tokens, hidden, 0.1)
    x_before = x.copy()
    w, ids = _topk(rng, tokens, num_experts, top_k)
    out = layer.forward_topk(x, moecore.StandardTopKOutput(w, ids))
    assert out.shape == (tokens, hidden) and out.dtype == x.dtype
    q = method.quant_info(layer)
    assert q.padded_hidden == R.round_up(hidden, 128)
    direct = M.call_kernel(x, w, ids, q)
    assert_bitwise_equal(out, direct, what="MoeRunner path vs direct kernel call")
    assert_bitwise_equal(x, x_before, what="hidden_states (never written)")

    # The registered fused func called by hand on pre-padded input (padded_hidden=None).
    kp = q.padded_hidden
    xp = np.zeros((tokens, kp), dtype=x.dtype)
    xp[:, :hidden] = x
    q_nopad = C.FlashInferMxfp4CutlassMoeQuantInfo(**{
        **_quant_kwargs(q), "padded_hidden": None})
    fused = moecore.get_fused_func("none", BACKEND)
    combined = fused(moecore.StandardDispatchOutput(xp, moecore.StandardTopKOutput(w, ids)),
                     q_nopad, moecore.MoeRunnerConfig(inplace=False))
    assert_bitwise_equal(out, np.ascontiguousarray(combined.hidden_states[:, :hidden]))


def _quant_kwargs(q):
    names = ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale", "w13_bias",
             "w2_bias", "swiglu_alpha", "swiglu_beta", "swiglu_limit", "moe_tp_size",
             "moe_tp_rank", "moe_ep_size", "moe_ep_rank", "padded_hidden")
    return {n: getattr(q, n) for n in names}


def test_R7_one_fused_registration():
    keys = {(a, r) for a, r, _ in moecore.registered_fused_funcs() if r == BACKEND}
    assert keys == {("none", BACKEND)}
    assert BACKEND not in {r for r, _ in moecore.registered_runner_cores()}
    assert not any(r == BACKEND for _, r, _ in moecore.registered_pre_permutes())
    assert not any(r == BACKEND for r, _, _ in moecore.registered_post_permutes())
    origins = {r: o for _, r, o in moecore.registered_fused_funcs()}
    assert origins[BACKEND] == "cpp/moecore/runner/backends/flashinfer_mxfp4.cpp"
    runner = moecore.MoeRunner(BACKEND, moecore.MoeRunnerConfig(inplace=False))
    assert runner.uses_fused_func and not runner.has_runner_core
    with pytest.raises(NotImplementedError, match=(
            r"^Runner backend MoeRunnerBackend.FLASHINFER_MXFP4 requires a fused func for a2a "
            r"backend deepep, but none is registered.$")):
        moecore.MoeRunner(BACKEND, moecore.MoeRunnerConfig(), a2a_backend="deepep")


# ---------------------------------------------------------------------------------------------
# The kernel layout a quant method keeps (moecore: quant_info.kernel_layout)

def _contract_kernel_layout(q):
    """The SM90 contract tensors of q with the interleave and fold undone (moecore.formats)."""
    return (mf.deinterleave_moe_weights_for_sm90_mixed_gemm(q.w13_weight),
            mf.deinterleave_moe_scales_for_sm90_mixed_gemm(q.w13_weight_scale),
            mf.deinterleave_moe_weights_for_sm90_mixed_gemm(q.w2_weight),
            mf.deinterleave_moe_scales_for_sm90_mixed_gemm(q.w2_weight_scale))


@pytest.mark.parametrize("method_kind", ["gpt-oss", "dsv4"])
def test_kernel_layout_is_the_deinterleaved_contract_layout(method_kind):
    rng = np.random.default_rng(61)
    if method_kind == "gpt-oss":
        E, H, I = 3, 96, 160
        layer, method = M.gpt_oss_layer(M.random_gpt_oss_checkpoint(rng, E, H, I, mode="bytes"))
        n, k = R.round_up(I, 128), R.round_up(H, 128)
    else:
        E, H, I = 2, 256, 128
        layer, method = M.dsv4_layer(M.random_dsv4_weights(rng, E, H, I), swiglu_limit=10.0)
        n, k = I, H
    q = method.quant_info(layer)
    layout = q.kernel_layout
    assert isinstance(layout, tuple) and len(layout) == 4
    shapes = [(E, 2 * n, k // 2), (E, 2 * n, k // 32), (E, k, n // 2), (E, k, n // 32)]
    for got, want, shape in zip(layout, _contract_kernel_layout(q), shapes):
        assert got.dtype == np.uint8 and got.shape == shape and got.flags.c_contiguous
        assert_bitwise_equal(got, np.asarray(want).view(np.uint8))

    # A quant info built by hand, with and without the kernel layout: the runner gives the same
    # bits (without it, it derives the layout from the contract tensors), eagerly and prepared.
    with_layout = C.FlashInferMxfp4CutlassMoeQuantInfo(**_quant_kwargs(q), kernel_layout=layout)
    bare = C.FlashInferMxfp4CutlassMoeQuantInfo(**_quant_kwargs(q))
    assert bare.kernel_layout is None
    for got, want in zip(with_layout.kernel_layout, layout):
        assert_bitwise_equal(got, want)
    x = _x(rng, 7, H)
    w, ids = _topk(rng, 7, E, 2, drop=True)
    dispatch = moecore.StandardDispatchOutput(x, moecore.StandardTopKOutput(w, ids))
    outs = [layer.runner.run(dispatch, info).hidden_states for info in (q, with_layout, bare)]
    for other in outs[1:]:
        assert_bitwise_equal(other, outs[0], what="with vs without kernel_layout")
    assert_bitwise_equal(outs[0], layer.forward_topk(x, moecore.StandardTopKOutput(w, ids)))


def test_kernel_layout_keyword_checks():
    _, layer, method = _small_gpt_oss()
    q = method.quant_info(layer)
    kw = _quant_kwargs(q)
    w13, s13, w2, s2 = q.kernel_layout
    tagged = C.FlashInferMxfp4CutlassMoeQuantInfo(**kw, kernel_layout=[w13, s13, w2, s2])
    assert len(tagged.kernel_layout) == 4
    with pytest.raises(ValueError, match=r"kernel_layout must be None or a 4-tuple"):
        C.FlashInferMxfp4CutlassMoeQuantInfo(**kw, kernel_layout=(w13, s13, w2))
    with pytest.raises(TypeError, match=r"kernel_layout\[1\] \(w13_weight_scale\) must be"):
        C.FlashInferMxfp4CutlassMoeQuantInfo(**kw, kernel_layout=(w13, s13.astype(np.float32),
                                                                  w2, s2))
    # Shapes are checked against the contract tensors when the runner uses it.
    x = cast(np.ones((2, 128)), "bf16")
    tk = moecore.StandardTopKOutput(np.full((2, 2), 0.5, np.float32),
                                    np.array([[0, 1], [1, 0]], np.int32))
    bad = C.FlashInferMxfp4CutlassMoeQuantInfo(**kw, kernel_layout=(w13, s13, w2, s13))
    with pytest.raises(ValueError, match=r"expected kernel_layout\.w2_weight_scale contiguous"):
        layer.runner.run(moecore.StandardDispatchOutput(x, tk), bad)
    with pytest.raises(ValueError, match=r"kernel_layout\.w13_weight contiguous"):
        narrow = C.FlashInferMxfp4CutlassMoeQuantInfo(
            **kw, kernel_layout=(w13[:, :, :32], s13, w2, s2))
        layer.runner.prepare(moecore.StandardDispatchOutput(x, tk), narrow)


# ---------------------------------------------------------------------------------------------
# DSv4 sibling

@pytest.mark.parametrize("swiglu_limit", [None, 10.0], ids=["no-clamp", "limit10"])
@pytest.mark.parametrize("tokens, num_experts, hidden, inter, top_k",
                         [(8, 4, 256, 128, 2), (5, 3, 128, 256, 3)], ids=lambda v: str(v))
def test_dsv4_apply_equals_direct_backend_call(tokens, num_experts, hidden, inter, top_k,
                                               swiglu_limit):
    rng = np.random.default_rng(tokens * 31 + inter)
    wts = M.random_dsv4_weights(rng, num_experts, hidden, inter, mode="bytes")
    layer, method = M.dsv4_layer(wts, top_k=top_k, swiglu_limit=swiglu_limit)
    expected = R.dsv4_sm90_layout_ref(wts.w13(), wts.w13_scale(), wts.w2, wts.w2_scale)
    for name, want in expected.items():
        assert_bitwise_equal(layer.parameter(name), want, what=name)
    q = method.quant_info(layer)
    assert q.padded_hidden is None and q.w13_bias is None and q.w2_bias is None
    if swiglu_limit is None:
        assert q.swiglu_alpha is None and q.swiglu_beta is None and q.swiglu_limit is None
    else:
        assert np.all(q.swiglu_alpha == 1.0) and np.all(q.swiglu_beta == 0.0)
        assert np.all(q.swiglu_limit == np.float32(swiglu_limit))
        assert q.swiglu_limit.shape == (num_experts,)
    x = _x(rng, tokens, hidden, 0.1)
    w, ids = _topk(rng, tokens, num_experts, top_k)
    out = layer.forward_topk(x, moecore.StandardTopKOutput(w, ids))
    # Direct call with numpy-processed tensors ("loader simulated as [w3; w1]" in sglang).
    e = num_experts
    swiglu = {} if swiglu_limit is None else {
        "swiglu_alpha": np.ones(e, np.float32), "swiglu_beta": np.zeros(e, np.float32),
        "swiglu_limit": np.full(e, swiglu_limit, np.float32)}
    direct = C.cutlass_fused_moe_mxfp4(
        input=x, token_selected_experts=ids, token_final_scales=w,
        fc1_expert_weights=expected["w13_weight"], fc2_expert_weights=expected["w2_weight"],
        quant_scales=[expected["w13_weight_scale_inv"], expected["w2_weight_scale_inv"]],
        **swiglu)
    assert_bitwise_equal(out, direct)


def test_dsv4_matches_reference_and_clamp_is_dsv4s():
    """alpha = 1, beta = 0, limit L is the DSv4 clamp: min(gate, L), clamp(up, ±L), silu·up."""
    rng = np.random.default_rng(11)
    wts = M.random_dsv4_weights(rng, 4, 128, 128)
    layer, _ = M.dsv4_layer(wts, top_k=2, swiglu_limit=0.5)
    x = _x(rng, 9, 128, 2.0)
    w, ids = _topk(rng, 9, 4, 2, drop=True)
    out = layer.forward_topk(x, moecore.StandardTopKOutput(w, ids))
    logical = R.dsv4_sm90_layout_ref(wts.w13(), wts.w13_scale(), wts.w2, wts.w2_scale,
                                     interleave=False)
    ref = R.flashinfer_mxfp4_moe_ref(
        x, ids, w, logical["w13_weight"], logical["w13_weight_scale_inv"], logical["w2_weight"],
        logical["w2_weight_scale_inv"], swiglu_alpha=np.ones(4, np.float32),
        swiglu_beta=np.zeros(4, np.float32), swiglu_limit=np.full(4, 0.5, np.float32))
    assert_close(out, ref, "bf16")
    unclamped, _ = M.dsv4_layer(wts, top_k=2, swiglu_limit=None)
    other = unclamped.forward_topk(x, moecore.StandardTopKOutput(w, ids))
    assert not np.array_equal(M.bits(out), M.bits(other))  # the clamp is active at 0.5


def test_dsv4_tp_and_ep_ranks_sum_to_one_rank():
    """DSv4 loads per expert through FusedMoE.weight_loader: TP narrows w1/w3 rows and w2
    columns (bytes and 32-blocks alike); EP keeps this rank's global experts (global ids)."""
    rng = np.random.default_rng(14)
    wts = M.random_dsv4_weights(rng, 4, 128, 256)
    x = _x(rng, 6, 128)
    w, ids = _topk(rng, 6, 4, 2, drop=True)
    topk = moecore.StandardTopKOutput(w, ids)
    full = M.dsv4_layer(wts, swiglu_limit=7.0)[0].forward_topk(x, topk)
    tp = [M.dsv4_layer(wts, swiglu_limit=7.0, tp_size=2, tp_rank=r)[0] for r in range(2)]
    assert tp[1].intermediate_size_per_partition == 128
    total = sum(layer.forward_topk(x, topk).astype(np.float32) for layer in tp)
    assert_close(total, full, "bf16_vs_exact", what="Σ TP ranks vs one rank")
    ep = [M.dsv4_layer(wts, swiglu_limit=7.0, ep_size=2, ep_rank=r)[0] for r in range(2)]
    assert ep[1].num_local_experts == 2
    total = sum(layer.forward_topk(x, topk).astype(np.float32) for layer in ep)
    assert_close(total, full, "bf16_vs_exact", what="Σ EP ranks vs one rank")


# ---------------------------------------------------------------------------------------------
# Backend vs numpy reference

GRID_SHAPES = [(4, 256, 128), (3, 160, 96), (2, 96, 160)]


def _custom_swiglu(rng, experts):
    return (rng.uniform(0.5, 2.0, experts).astype(np.float32),
            rng.uniform(-0.5, 1.5, experts).astype(np.float32),
            rng.choice(np.array([0.25, 1.0, 3.0, 1e30], np.float32), experts))


@pytest.mark.parametrize("swiglu", ["gpt_oss", "custom", "none"])
@pytest.mark.parametrize("tokens", [0, 1, 3, 7, 64])
@pytest.mark.parametrize("num_experts, hidden, inter", GRID_SHAPES, ids=lambda v: str(v))
def test_backend_matches_reference(num_experts, hidden, inter, tokens, swiglu):
    rng = np.random.default_rng(num_experts * 1000 + hidden + tokens)
    ckpt = M.random_gpt_oss_checkpoint(rng, num_experts, hidden, inter, bias_scale=0.1)
    layer, method = M.gpt_oss_layer(ckpt, top_k=2)
    logical = M.gpt_oss_logical(ckpt)
    alpha, beta, limit = (logical[n] for n in ("swiglu_alpha", "swiglu_beta", "swiglu_limit"))
    if swiglu == "custom":
        alpha, beta, limit = _custom_swiglu(rng, num_experts)
        layer.parameter("swiglu_alpha")[:] = alpha
        layer.parameter("swiglu_beta")[:] = beta
        layer.parameter("swiglu_limit")[:] = limit
    x = _x(rng, tokens, hidden)
    w, ids = _topk(rng, tokens, num_experts, 2, drop=True)
    if swiglu == "none":
        out = M.call_kernel(x, w, ids, method.quant_info(layer), swiglu_alpha=None,
                            swiglu_beta=None, swiglu_limit=None)
        alpha = beta = limit = None
    else:
        out = layer.forward_topk(x, moecore.StandardTopKOutput(w, ids))
    ref = R.flashinfer_mxfp4_moe_ref(
        x, ids, w, logical["w13_weight"], logical["w13_weight_scale"], logical["w2_weight"],
        logical["w2_weight_scale"], w13_bias=logical["w13_weight_bias"],
        w2_bias=logical["w2_weight_bias"], swiglu_alpha=alpha, swiglu_beta=beta,
        swiglu_limit=limit, padded_hidden=method.padded_hidden)
    assert out.shape == (tokens, hidden)
    assert_close(out, ref, "bf16")


def test_R8_bypassed_topk_is_materialised():
    rng = np.random.default_rng(8)
    ckpt = M.random_gpt_oss_checkpoint(rng, 4, 128, 128)
    layer, _ = M.gpt_oss_layer(ckpt, top_k=2)
    x = _x(rng, 6, 128)
    logits = rng.standard_normal((6, 4)).astype(np.float32)
    config = moecore.TopKConfig(top_k=2, renormalize=True)
    bypassed = moecore.BypassedTopKOutput(x, logits, config)
    standard = moecore.select_experts(x, logits, config)
    assert_bitwise_equal(layer.forward_topk(x, bypassed), layer.forward_topk(x, standard))
    assert_bitwise_equal(layer.forward(x, logits), layer.forward_topk(x, standard))


def test_R9_empty_input_never_touches_the_kernel():
    rng = np.random.default_rng(9)
    ckpt = M.random_gpt_oss_checkpoint(rng, 2, 96, 64)
    layer, method = M.gpt_oss_layer(ckpt)
    layer.parameter("w13_weight_scale")[...] = 0xFF  # any decode would raise
    x0 = _x(rng, 0, 96)
    w0, ids0 = np.zeros((0, 2), np.float32), np.zeros((0, 2), np.int32)
    out = layer.forward_topk(x0, moecore.StandardTopKOutput(w0, ids0))
    assert out.shape == (0, 96) and out.dtype == x0.dtype
    direct = M.call_kernel(x0, w0, ids0, method.quant_info(layer))
    assert direct.shape == (0, 96)
    x1 = _x(rng, 1, 96)
    with pytest.raises(ValueError, match="0xFF"):
        layer.forward_topk(x1, moecore.StandardTopKOutput(np.ones((1, 2), np.float32),
                                                          np.array([[0, 1]], np.int32)))


def test_ep_ranks_use_global_ids_and_sum_to_one_rank():
    rng = np.random.default_rng(12)
    ckpt = M.random_gpt_oss_checkpoint(rng, 4, 128, 96, bias_scale=0.1)
    x = _x(rng, 7, 128)
    w, ids = _topk(rng, 7, 4, 2, drop=True)
    topk = moecore.StandardTopKOutput(w, ids)
    full, _ = M.gpt_oss_layer(ckpt)
    total = full.forward_topk(x, topk)
    logical = M.gpt_oss_logical(ckpt)
    parts = []
    for rank in range(2):
        layer, method = M.gpt_oss_layer(ckpt, ep_size=2, ep_rank=rank)
        assert layer.num_local_experts == 2
        part = layer.forward_topk(x, topk)
        sl = slice(2 * rank, 2 * rank + 2)
        ref = R.flashinfer_mxfp4_moe_ref(
            x, ids, w, logical["w13_weight"][sl], logical["w13_weight_scale"][sl],
            logical["w2_weight"][sl], logical["w2_weight_scale"][sl],
            w13_bias=logical["w13_weight_bias"][sl], w2_bias=logical["w2_weight_bias"][sl],
            swiglu_alpha=logical["swiglu_alpha"][sl], swiglu_beta=logical["swiglu_beta"][sl],
            swiglu_limit=logical["swiglu_limit"][sl], padded_hidden=method.padded_hidden,
            ep_size=2, ep_rank=rank)
        assert_close(part, ref, "bf16", what=f"EP rank {rank}")
        parts.append(part.astype(np.float32))
    assert_close(parts[0] + parts[1], total, "bf16", what="Σ EP ranks vs one rank")


@pytest.mark.parametrize("inter", [192, 160], ids=["even-split", "sglang-uneven-split"])
def test_tp_ranks_sum_to_one_rank(inter):
    """sglang's MXFP4 TP slice: whole 32-blocks per rank (I=160, tp=2 → 96 + 64 rows); the
    down-projection bias counts once (rank 0)."""
    rng = np.random.default_rng(inter)
    ckpt = M.random_gpt_oss_checkpoint(rng, 3, 128, inter, bias_scale=0.1)
    x = _x(rng, 5, 128)
    w, ids = _topk(rng, 5, 3, 2)
    topk = moecore.StandardTopKOutput(w, ids)
    full, _ = M.gpt_oss_layer(ckpt)
    parts = [M.gpt_oss_layer(ckpt, tp_size=2, tp_rank=r)[0] for r in range(2)]
    per_rank = -(-inter // 32 // 2) * 32
    for r, layer in enumerate(parts):
        rows = min(per_rank, inter - r * per_rank)
        assert layer.intermediate_size_per_partition == inter // 2
        q = layer.quant_method.quant_info(layer)
        assert q.moe_tp_size == 2 and q.moe_tp_rank == r
        bias = layer.parameter("w2_weight_bias").astype(np.float32)
        assert (np.any(bias != 0)) == (r == 0)
        assert rows > 0
    # Each rank rounds its GEMM2 partial and its output to bf16 where one rank rounds the full
    # sums once: two bf16 pipelines with different rounding points, hence the pipeline row.
    total = sum(layer.forward_topk(x, topk).astype(np.float32) for layer in parts)
    assert_close(total, full.forward_topk(x, topk), "bf16_vs_exact", what="Σ TP ranks vs one rank")


def test_determinism_threads_and_batch_invariance():
    rng = np.random.default_rng(13)
    ckpt = M.random_gpt_oss_checkpoint(rng, 4, 160, 96)
    layer, _ = M.gpt_oss_layer(ckpt)
    x = _x(rng, 13, 160)
    w, ids = _topk(rng, 13, 4, 2)
    before = moecore.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):
            moecore.set_num_threads(threads)
            outs.append(layer.forward_topk(x, moecore.StandardTopKOutput(w, ids)))
            outs.append(layer.forward_topk(x, moecore.StandardTopKOutput(w, ids)))
    finally:
        moecore.set_num_threads(before)
    for other in outs[1:]:
        assert_bitwise_equal(other, outs[0])
    for t in (0, 6, 12):  # a token alone equals its row in the batch
        alone = layer.forward_topk(x[t:t + 1], moecore.StandardTopKOutput(w[t:t + 1],
                                                                          ids[t:t + 1]))
        assert_bitwise_equal(alone[0], outs[0][t])
    for level in moecore.available_isa_levels():  # canonical-order levels give the same bytes
        q = layer.quant_method.quant_info(layer)
        assert_isa_levels_agree(M.call_kernel(x, w, ids, q, isa_level=level), level, outs[0],
                                moecore.get_isa_level(), "bf16")


# ---------------------------------------------------------------------------------------------
# Bad input

def _small_gpt_oss(**kw):
    rng = np.random.default_rng(21)
    ckpt = M.random_gpt_oss_checkpoint(rng, 2, 128, 128)
    return (ckpt,) + M.gpt_oss_layer(ckpt, **kw)


def _kernel_case(mutate):
    """Calls the kernel with one argument changed by mutate(kwargs)."""
    def run():
        _, layer, method = _small_gpt_oss()
        q = method.quant_info(layer)
        kwargs = dict(M.processed_args(q), input=cast(np.ones((2, 128)), "bf16"),
                      token_selected_experts=np.array([[0, 1], [1, 0]], np.int32),
                      token_final_scales=np.full((2, 2), 0.5, np.float32))
        mutate(kwargs)
        C.cutlass_fused_moe_mxfp4(**kwargs)
    return run


def _set(**changes):
    return lambda kw: kw.update(changes)


def _scale_nan(key_index):
    def mutate(kw):
        s = [np.array(a) for a in kw["quant_scales"]]
        s[key_index].reshape(-1)[37] = 0xFF
        kw["quant_scales"] = s
    return mutate


def _layer_case(config=None, topk=None, x=None, quant_info=None):
    def run():
        _, layer, method = _small_gpt_oss(**(config or {}))
        xs = cast(np.ones((2, 128)), "bf16") if x is None else x
        tk = topk or moecore.StandardTopKOutput(np.full((2, 2), 0.5, np.float32),
                                                np.array([[0, 1], [1, 0]], np.int32))
        if quant_info is None:
            layer.forward_topk(xs, tk)
        else:
            layer.runner.run(moecore.StandardDispatchOutput(xs, tk), quant_info(layer, method))
    return run


def _process_case(mutate):
    def run():
        rng = np.random.default_rng(3)
        ckpt = M.random_gpt_oss_checkpoint(rng, 2, 128, 128)
        layer, _ = M.gpt_oss_layer(ckpt, process=False)
        mutate(layer)
        before = {n: a.copy() for n, a in layer.named_parameters().items()}
        try:
            layer.process_weights_after_loading()
        finally:  # nothing replaced or written on failure
            after = layer.named_parameters()
            assert set(after) == set(before)
            for n, was in before.items():
                assert_bitwise_equal(after[n], was, what=n)
    return run


def _loader_case(name, tensor_fn, inter=128, **layer_kw):
    def run():
        rng = np.random.default_rng(4)
        ckpt = M.random_gpt_oss_checkpoint(rng, 2, 128, 128)
        if inter != 128:
            layer = moecore.FusedMoE(
                num_experts=2, hidden_size=128, intermediate_size=inter,
                topk_config=moecore.TopKConfig(top_k=2), quant_method=C.Mxfp4MoEMethod(),
                runner_backend=BACKEND)
            method = layer.quant_method
        else:
            layer, method = M.gpt_oss_layer(ckpt, process=False, **layer_kw)
        method.load_fused_expert_weight(layer, name, tensor_fn(ckpt))
    return run


def _dsv4_case(hidden=128, inter=128, mutate=None, twice=False):
    def run():
        rng = np.random.default_rng(6)
        if hidden % 128 or inter % 128:
            moecore.FusedMoE(num_experts=2, hidden_size=hidden, intermediate_size=inter,
                             topk_config=moecore.TopKConfig(top_k=2),
                             quant_method=C.Mxfp4FlashinferCutlassMoEMethod(),
                             runner_backend=BACKEND)
            return
        wts = M.random_dsv4_weights(rng, 2, hidden, inter)
        if mutate:
            mutate(wts)
        layer, _ = M.dsv4_layer(wts)
        if twice:
            layer.process_weights_after_loading()
    return run


def _w1_scale(value):
    def mutate(wts):
        wts.w1_scale[1, 3, 2] = value
    return mutate


def _bad_dtype_w13(kw):
    kw["fc1_expert_weights"] = np.asarray(kw["fc1_expert_weights"]).astype(np.float32)


def _linear_scales(kw):
    kw["quant_scales"] = [np.zeros((2, 256, 4), np.uint8), kw["quant_scales"][1]]


def _non_contiguous(kw):
    w = np.asarray(kw["fc1_expert_weights"])
    kw["fc1_expert_weights"] = np.repeat(w, 2, axis=2)[:, :, ::2]


def _load_after_processing():
    ckpt, layer, method = _small_gpt_oss()
    method.load_fused_expert_weight(layer, "down_proj_bias", ckpt.down_proj_bias)


def _rebuilt_info(**changes):
    def build(layer, method):
        q = method.quant_info(layer)
        return C.FlashInferMxfp4CutlassMoeQuantInfo(**{**_quant_kwargs(q), **changes})
    return build


BAD_INPUT = [
    # (id, callable, exception, message pattern)
    ("payload-not-mxfp4", _layer_case(quant_info=lambda layer, m: moecore.TritonMoeQuantInfo(
        w13_weight=np.zeros((2, 4, 8), np.float32), w2_weight=np.zeros((2, 8, 2), np.float32))),
     TypeError, r"^Unexpected quant_info type for flashinfer_mxfp4: TritonMoeQuantInfo"),
    ("w13-scale-e8m0-0xFF", _kernel_case(_scale_nan(0)), ValueError, r"w13_weight_scale.*0xFF"),
    ("w2-scale-e8m0-0xFF", _kernel_case(_scale_nan(1)), ValueError, r"w2_weight_scale.*0xFF"),
    ("scales-linear-not-folded", _kernel_case(_linear_scales), ValueError, r"SM90-folded"),
    ("w13-dtype-f32", _kernel_case(_bad_dtype_w13), TypeError, r"w13_weight packed e2m1"),
    ("scale-dtype-f32", _kernel_case(lambda kw: kw.update(quant_scales=[
        np.asarray(kw["quant_scales"][0]).astype(np.float32), kw["quant_scales"][1]])),
     TypeError, r"w13_weight_scale E8M0"),
    ("w13-non-contiguous", _kernel_case(_non_contiguous), ValueError, r"contiguous"),
    ("input-f32", _kernel_case(lambda kw: kw.update(input=np.ones((2, 128), np.float32))),
     TypeError, r"expected input bf16"),
    ("input-width", _kernel_case(lambda kw: kw.update(input=cast(np.ones((2, 96)), "bf16"))),
     ValueError, r"expected input \[T, 128\]"),
    ("bias-f32", _kernel_case(lambda kw: kw.update(
        fc1_expert_biases=np.asarray(kw["fc1_expert_biases"]).astype(np.float32))),
     TypeError, r"w13_bias bf16"),
    ("bias-shape", _kernel_case(lambda kw: kw.update(
        fc2_expert_biases=cast(np.zeros((2, 64)), "bf16"))), ValueError, r"w2_bias"),
    ("swiglu-f64", _kernel_case(lambda kw: kw.update(swiglu_alpha=np.ones(2, np.float64))),
     TypeError, r"."),
    ("swiglu-half-given", _kernel_case(_set(swiglu_beta=None)), ValueError,
     r"go together \(all or none\), got 2 of 3"),
    ("swiglu-length", _kernel_case(_set(swiglu_limit=np.ones(3, np.float32))), ValueError,
     r"swiglu_limit"),
    ("ids-out-of-range", _kernel_case(_set(token_selected_experts=np.array([[0, 2], [1, 0]],
                                                                           np.int32))),
     IndexError, r"expected topk_ids in \[-1, 2\) \(global expert ids\), got 2 at \[0, 1\]"),
    ("ids-below-minus-one", _kernel_case(_set(token_selected_experts=np.array(
        [[0, -2], [1, 0]], np.int32))), IndexError, r"topk_ids"),
    ("weights-f16", _kernel_case(_set(token_final_scales=np.full((2, 2), 0.5, np.float16))),
     TypeError, r"topk_weights must be float32"),
    ("weights-f64", _kernel_case(_set(token_final_scales=np.full((2, 2), 0.5))), TypeError,
     r"unsupported dtype float64"),
    ("ids-f32", _kernel_case(_set(token_selected_experts=np.zeros((2, 2), np.float32))),
     TypeError, r"topk_ids must be int32 or int64"),
    ("weights-shape", _kernel_case(_set(token_final_scales=np.full((2, 3), 0.5, np.float32))),
     ValueError, r"topk_weights shape"),
    ("N-not-multiple-of-128", _kernel_case(lambda kw: kw.update(
        fc1_expert_weights=np.zeros((2, 128, 64), np.uint8))), ValueError, r"multiples of 128"),
    ("w2-shape", _kernel_case(_set(fc2_expert_weights=np.zeros((2, 128, 32), np.uint8))),
     ValueError, r"w2_weight"),
    ("quant-scales-count", _kernel_case(lambda kw: kw.update(
        quant_scales=kw["quant_scales"][:1])), ValueError, r"quant_scales must be"),
    ("ep-rank", _kernel_case(_set(ep_size=2, ep_rank=2)), IndexError, r"rank out of range"),
    ("padded-hidden-below-width", _layer_case(quant_info=_rebuilt_info(padded_hidden=64)),
     ValueError, r"padded_hidden \(64\) must be at least"),
    ("info-half-swiglu", lambda: _rebuilt_info(swiglu_alpha=None)(*_small_gpt_oss()[1:]),
     ValueError, r"all or none"),
    ("info-bad-topology", lambda: _rebuilt_info(moe_tp_rank=3)(*_small_gpt_oss()[1:]),
     ValueError, r"bad TP/EP topology"),
    ("apply-router-weight-on-input",
     _layer_case(config={"apply_router_weight_on_input": True}), AssertionError,
     r"^apply_router_weight_on_input is not supported for Flashinfer$"),
    ("activation-gelu", _layer_case(config={"activation": "gelu"}), ValueError,
     r"SwiGLU only"),
    ("activation-unknown", _layer_case(config={"activation": "swish"}), ValueError,
     r"Unsupported activation"),
    ("no-combine", _layer_case(config={"no_combine": True}), ValueError, r"no_combine"),
    ("dequant-0xFF", lambda: C.dequantize_sm90_mxfp4(
        np.zeros((1, 64, 64), np.uint8), np.full((1, 1, 1, 16, 16), 0xFF, np.uint8)),
     ValueError, r"0xFF"),
    ("dequant-rows", lambda: C.dequantize_sm90_mxfp4(
        np.zeros((1, 32, 64), np.uint8), np.zeros((1, 1, 1, 16, 16), np.uint8)),
     ValueError, r"multiple of 64"),
    # GPT-OSS method: processing, loading, construction
    ("process-loaded-scale-0xFF", _process_case(
        lambda layer: layer.parameter("w2_weight_scale").__setitem__((1, 5, 2), 0xFF)),
     ValueError, r"w2_weight_scale holds the E8M0 NaN code 0xFF"),
    ("process-twice", lambda: _small_gpt_oss()[1].process_weights_after_loading(), ValueError,
     r"already processed"),
    ("process-unsupported-backend", lambda: M.gpt_oss_layer(
        M.random_gpt_oss_checkpoint(np.random.default_rng(1), 2, 128, 128),
        runner_backend="triton"), NotImplementedError, r"supported: auto, flashinfer_mxfp4"),
    ("loader-unknown-name", _loader_case("mlp.experts.gate_proj", lambda c: c.down_proj_bias),
     ValueError, r"expected a name ending in"),
    ("loader-wrong-shape", _loader_case("gate_up_proj_scales",
                                        lambda c: c.gate_up_proj_scales[:, :10]),
     ValueError, r"expected gate_up_proj_scales \[2, 256, 4\]"),
    ("loader-blocks-dtype", _loader_case("down_proj_blocks",
                                         lambda c: c.down_proj_blocks.astype(np.int32)),
     TypeError, r"packed e2m1 blocks"),
    ("loader-bias-f32", _loader_case("down_proj_bias",
                                     lambda c: c.down_proj_bias.astype(np.float32)),
     TypeError, r"bf16 bias"),
    ("loader-I-not-multiple-of-32", _loader_case("down_proj_bias", lambda c: c.down_proj_bias,
                                                 inter=144),
     ValueError, (r"^Mxfp4MoEMethod.load_fused_expert_weight: intermediate_size=144 must be "
                  r"divisible by mxfp4_block=32$")),
    ("loader-after-processing", lambda: _load_after_processing(), ValueError,
     r"already processed"),
    ("create-hidden-not-multiple-of-32", lambda: moecore.FusedMoE(
        num_experts=2, hidden_size=100, intermediate_size=64,
        topk_config=moecore.TopKConfig(top_k=1), quant_method=C.Mxfp4MoEMethod()),
     ValueError, r"multiple of 32"),
    ("create-params-dtype-f32", lambda: moecore.FusedMoE(
        num_experts=2, hidden_size=128, intermediate_size=64, params_dtype="f32",
        topk_config=moecore.TopKConfig(top_k=1), quant_method=C.Mxfp4MoEMethod()),
     TypeError, r"params_dtype bf16"),
    # DSv4 sibling
    ("dsv4-hidden-not-multiple-of-128", _dsv4_case(hidden=192), ValueError,
     (r"^Mxfp4FlashinferCutlassMoEMethod requires hidden_size and intermediate_size_per_partition"
      r" to be multiples of 128 \(got hidden=192, intermediate=128\)\.$")),
    ("dsv4-inter-not-multiple-of-128", _dsv4_case(inter=64), ValueError,
     r"\(got hidden=128, intermediate=64\)\.$"),
    ("dsv4-scale-not-pow2", _dsv4_case(mutate=_w1_scale(3.0)), ValueError,
     r"w13_weight_scale_inv must hold f32 powers of two"),
    ("dsv4-scale-zero", _dsv4_case(mutate=_w1_scale(0.0)), ValueError, r"powers of two"),
    ("dsv4-scale-negative", _dsv4_case(mutate=_w1_scale(-0.5)), ValueError, r"powers of two"),
    ("dsv4-scale-nan", _dsv4_case(mutate=_w1_scale(np.nan)), ValueError, r"powers of two"),
    ("dsv4-scale-inf", _dsv4_case(mutate=_w1_scale(np.inf)), ValueError, r"powers of two"),
    ("dsv4-process-twice", _dsv4_case(twice=True), ValueError, r"already processed"),
]


@pytest.mark.parametrize("case, exc, pattern", [c[1:] for c in BAD_INPUT],
                         ids=[c[0] for c in BAD_INPUT])
def test_bad_input_table(case, exc, pattern):
    with pytest.raises(exc, match=pattern):
        case()


def test_dsv4_rejects_non_standard_topk():
    rng = np.random.default_rng(2)
    layer, _ = M.dsv4_layer(M.random_dsv4_weights(rng, 2, 128, 128))
    x = _x(rng, 3, 128)
    bypassed = moecore.BypassedTopKOutput(x, rng.standard_normal((3, 2)).astype(np.float32),
                                          moecore.TopKConfig(top_k=2))
    with pytest.raises(ValueError, match=r"^Unsupported topk output format: "
                                         r"TopKOutputFormat.BYPASSED$"):
        layer.forward_topk(x, bypassed)
