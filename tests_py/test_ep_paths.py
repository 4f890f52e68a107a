"""The runner paths on top of DeepEP and FlashInfer dispatch, driven with hand-built dispatch
outputs (no dispatcher): the CuteDSL v1 fused func ("deepep", "flashinfer_cutedsl") with ports
of sglang's test_v1_masked_kernel_* checks (test_cutedsl_moe.py, spec §10), test_v2_ep_sharded_
allreduce, the ("flashinfer", cutedsl / cutlass) fused funcs on a FlashinferDispatchOutput, and
DeepGEMM's deepep_ll / deepep_normal permutes against the standard-permute path (bitwise, after
the combine arithmetic), plus the unquantized DeepGEMM BF16 method and bad inputs.
"""

from __future__ import annotations

import ml_dtypes
import moecore
import moecore.formats as mf
import numpy as np
import pytest
from moecore import _moecore as M
from moecore.dtypes import to_f32
from moecore.reference import moe_fp8 as RF
from moecore.reference import moe_nvfp4 as R
from moecore.reference.quant import quantize_fp8_block_ref
from moecore.testing import assert_bitwise_equal, assert_close, is_close, make_moe_problem
from moecore.testing import nvfp4 as N

BF16 = ml_dtypes.bfloat16
FP8 = ml_dtypes.float8_e4m3fn
F32 = np.float32
CUTEDSL, CUTLASS = "flashinfer_cutedsl", "flashinfer_cutlass"


def _cfg(**kw):
    kw.setdefault("inplace", False)
    return moecore.MoeRunnerConfig(**kw)


def _masked_layout(local_ids, rows, num_local, m_cap=None, garbage=None):
    """DeepEP low-latency layout of `rows` [T, ...]: expert e's slots (t, j) in (t, j) order
    fill rows [0, masked_m[e]) of slab e. Returns (packed [E, M_cap, ...], masked_m, src2dst
    i32 [T·k] = e·M_cap + row (−1 for ids −1)). Rows past masked_m are `garbage` (else 0)."""
    t, k = local_ids.shape
    masked = np.zeros(num_local, np.int32)
    for e in local_ids.reshape(-1):
        if e >= 0:
            masked[e] += 1
    m_cap = m_cap or max(int(masked.max(initial=0)), 1)
    packed = np.zeros((num_local, m_cap) + rows.shape[1:], rows.dtype)
    if garbage is not None:
        packed[...] = garbage
    src2dst = np.full(t * k, -1, np.int32)
    fill = np.zeros(num_local, np.int64)
    for s, e in enumerate(local_ids.reshape(-1)):
        if e >= 0:
            packed[e, fill[e]] = rows[s // k]
            src2dst[s] = e * m_cap + fill[e]
            fill[e] += 1
    return packed, masked, src2dst


def _ll_dispatch(x, scale, ids, wts, masked):
    return moecore.DeepEPLLDispatchOutput(x, scale, ids, wts, masked, int(masked.max(initial=0)))


# ---------------------------------------------------------------------------------------------
# CuteDSL v1 ("deepep", "flashinfer_cutedsl"): ports of sglang's test_v1_masked_kernel_*.

V1_CASES = [(2, 128, 256, k) for k in (1, 2, 4)] + [(16, 128, 512, k) for k in (1, 2, 4)]
V1_E = 8


def _v1_problem(seed, bs, h, inter, k, w13_layout="v1"):
    """8 experts, per-expert weight global scales 448·6/amax_e, input and a2 global scales 1
    (sglang's test). w13 in v1's [Gate; Up] layout or v2's ([Up; Gate], 64-row interleave)."""
    rng = np.random.default_rng(seed)
    ex = N.make_experts(rng, V1_E, h, inter)
    x = rng.standard_normal((bs, h)).astype(F32).astype(BF16)
    ids, wts = N.routing(rng, bs, V1_E, k)
    w13, s13 = ex.w13, ex.w13_sf
    if w13_layout == "v2":
        w13 = mf.interleave_w13_halves(N.up_gate(w13), 64, 1)
        s13 = mf.interleave_w13_halves(N.up_gate(s13), 64, 1)
    info = dict(
        w13_weight=w13,
        w2_weight=ex.w2,
        w13_weight_sf=mf.swizzle_nvfp4_scales(s13),
        w2_weight_sf=mf.swizzle_nvfp4_scales(ex.w2_sf),
        w1_alpha=(1.0 / ex.w13_gs).astype(F32),
        w2_alpha=(1.0 / ex.w2_gs).astype(F32),
        a1_scale=np.ones(V1_E, F32),
        a2_scale=np.ones(V1_E, F32),
    )
    return x, ids, wts, ex, info


def _v1_float_reference(x, ids, wts, ex):
    """sglang's reference: dequantized FP4 weights and activations (global scale 1), [Gate, Up]
    SwiGLU on the bf16 GEMM1 output (torch bf16 tensors), FP4 quant-dequant of the bf16
    intermediate (global scale 1), weighted sum in float."""
    w13 = R.nvfp4_values_ref(ex.w13, ex.w13_sf) / ex.w13_gs[:, None, None]
    w2 = R.nvfp4_values_ref(ex.w2, ex.w2_sf) / ex.w2_gs[:, None, None]
    a = R.nvfp4_quant_dequant_codes_ref(x.astype(F32), 1.0)
    inter = w2.shape[2]
    out = np.zeros((x.shape[0], w2.shape[1]), F32)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = ids[t, j]
            h1 = to_f32((w13[e] @ a[t]).astype(BF16))
            g, u = h1[:inter], h1[inter:]
            act = to_f32((g / (1 + np.exp(-g)) * u).astype(F32).astype(BF16))
            act = R.nvfp4_quant_dequant_codes_ref(act[None], 1.0)
            out[t] += wts[t, j] * (w2[e] @ act[0])
    return out


def _weighted_sum(out, src2dst, wts):
    """Σ_j w_j · out[row of (t, j)] in float32 (the kernel test's combine)."""
    flat = to_f32(out).reshape(-1, out.shape[-1])
    t, k = wts.shape
    acc = np.zeros((t, flat.shape[1]), F32)
    for s in range(t * k):
        if src2dst[s] >= 0:
            acc[s // k] += wts[s // k, s % k] * flat[src2dst[s]]
    return acc


def _run_v1(x_packed, scale, ids, wts, masked, info, **cfg):
    runner = moecore.MoeRunner(CUTEDSL, _cfg(**cfg), a2a_backend="deepep")
    return runner.run(_ll_dispatch(x_packed, scale, ids, wts, masked), info)


@pytest.mark.parametrize("bs, h, inter, k", V1_CASES)
def test_v1_masked_kernel_bf16_input(bs, h, inter, k):
    x, ids, wts, ex, kw = _v1_problem(bs * 10 + k, bs, h, inter, k)
    xp, masked, src2dst = _masked_layout(ids, x, V1_E, garbage=np.nan)  # garbage rows: NaN
    combine = _run_v1(xp, None, ids, wts, masked, M.CuteDslFp4MoeQuantInfo(**kw))
    assert isinstance(combine, moecore.DeepEPLLCombineInput)
    out = combine.hidden_states
    assert out.dtype == BF16 and out.shape == (V1_E, xp.shape[1], h)
    assert_bitwise_equal(combine.topk_ids, ids)
    # The contract twin (moecore's reading of the kernel), then sglang's 5e-2 check.
    kw_ref = dict(kw, w13=kw["w13_weight"], w2=kw["w2_weight"])
    del kw_ref["w13_weight"], kw_ref["w2_weight"]
    assert_close(to_f32(out), R.cutedsl_v1_masked_ref(xp, masked, **kw_ref), "bf16")
    assert_close(_weighted_sum(out, src2dst, wts), _v1_float_reference(x, ids, wts, ex),
                 "sglang_cutedsl_v1")


@pytest.mark.parametrize("bs, h, inter, k", V1_CASES[::2])
def test_v1_masked_kernel_fp4_input(bs, h, inter, k):
    """Pre-quantized (fp4, sf) payload (NVFP4 dispatch, input_global_scale None): the same
    result as the BF16 payload quantized by the kernel with global scale 1."""
    x, ids, wts, ex, kw = _v1_problem(bs * 10 + k, bs, h, inter, k)
    xp, masked, src2dst = _masked_layout(ids, x, V1_E)
    q, sf = mf.quantize_nvfp4(to_f32(xp), 1.0)
    sf_bytes = sf.view(np.uint8).copy()
    for e in range(V1_E):  # garbage past masked_m (NaN scale codes) must not matter
        q[e, masked[e] :] = 0xFF
        sf_bytes[e, masked[e] :] = 0xFF
    fp4 = _run_v1(q, sf_bytes.view(FP8), ids, wts, masked,
                  M.CuteDslFp4MoeQuantInfo(**kw, use_nvfp4_dispatch=True)).hidden_states
    bf16 = _run_v1(xp, None, ids, wts, masked, M.CuteDslFp4MoeQuantInfo(**kw)).hidden_states
    assert_bitwise_equal(fp4, bf16)
    assert_close(_weighted_sum(fp4, src2dst, wts), _v1_float_reference(x, ids, wts, ex),
                 "sglang_cutedsl_v1")
    # DeepEP's int32 words viewed as scale bytes give the same result.
    words = np.ascontiguousarray(sf_bytes).view(np.int32)
    fp4_words = _run_v1(q, words, ids, wts, masked,
                        M.CuteDslFp4MoeQuantInfo(**kw, use_nvfp4_dispatch=True)).hidden_states
    assert_bitwise_equal(fp4_words, fp4)


def test_v1_masked_kernel_rejects_v2_w13_layout():
    """R4: v1 layout passes at 5e-2; the v2 layout ([Up; Gate] + interleave) must fail."""
    bs, h, inter, k = 16, 128, 256, 2
    x, ids, wts, ex, kw1 = _v1_problem(4, bs, h, inter, k)
    *_, kw2 = _v1_problem(4, bs, h, inter, k, w13_layout="v2")
    xp, masked, src2dst = _masked_layout(ids, x, V1_E)
    ref = _v1_float_reference(x, ids, wts, ex)
    good = _run_v1(xp, None, ids, wts, masked, M.CuteDslFp4MoeQuantInfo(**kw1)).hidden_states
    bad = _run_v1(xp, None, ids, wts, masked, M.CuteDslFp4MoeQuantInfo(**kw2)).hidden_states
    assert is_close(_weighted_sum(good, src2dst, wts), ref, "sglang_cutedsl_v1")
    assert not is_close(_weighted_sum(bad, src2dst, wts), ref, "sglang_cutedsl_v1")


def test_v1_guards_and_bad_inputs():
    x, ids, wts, ex, kw = _v1_problem(1, 4, 128, 256, 2)
    xp, masked, _ = _masked_layout(ids, x, V1_E)
    info = M.CuteDslFp4MoeQuantInfo(**kw)
    with pytest.raises(AssertionError, match="Only silu is supported for CuteDSL MoE."):
        _run_v1(xp, None, ids, wts, masked, info, activation="gelu")
    with pytest.raises(AssertionError, match="apply_router_weight_on_input is not supported"):
        _run_v1(xp, None, ids, wts, masked, info, apply_router_weight_on_input=True)
    q, sf = mf.quantize_nvfp4(to_f32(xp), 1.0)
    words = np.ascontiguousarray(sf.view(np.uint8)).view(np.int32)
    strided = np.asfortranarray(words)  # stride(-1) != 1
    with pytest.raises(AssertionError, match=r"NVFP4 dispatch scale has stride\(-1\)=.*Try "
                       "SGLANG_MOE_NVFP4_DISPATCH=0 or check DeepEP version."):
        _run_v1(q, strided, ids, wts, masked, M.CuteDslFp4MoeQuantInfo(**kw, use_nvfp4_dispatch=True))
    with pytest.raises(ValueError, match="use_nvfp4_dispatch=False but the DeepEP payload is NVFP4"):
        _run_v1(q, sf, ids, wts, masked, info)
    bad_m = masked.copy()
    bad_m[0] = xp.shape[1] + 1
    with pytest.raises(ValueError, match=r"masked_m\[0\] must be in"):
        _run_v1(xp, None, ids, wts, bad_m, info)
    with pytest.raises(TypeError, match="takes a DeepEPLLDispatchOutput"):
        moecore.MoeRunner(CUTEDSL, _cfg(), a2a_backend="deepep").run(
            moecore.StandardDispatchOutput(x, topk_output=moecore.StandardTopKOutput(wts, ids)),
            info)
    with pytest.raises(ValueError, match="a1_scale"):
        _run_v1(xp, None, ids, wts, masked,
                M.CuteDslFp4MoeQuantInfo(**{**kw, "a1_scale": np.zeros(V1_E, F32)}))


# ---------------------------------------------------------------------------------------------
# CuteDSL v2 and FlashInfer cutlass under a2a "flashinfer".


@pytest.mark.parametrize("ep", [2, 4, 8])
def test_v2_ep_sharded_allreduce(ep):
    """Each rank holds its slice of experts (local_expert_offset = rank·L) and sees every token
    with global ids; Σ of the ranks' partial outputs equals the full-expert output."""
    rng = np.random.default_rng(ep)
    t, e_global, h, inter, k = 16, 16, 128, 128, 4
    full = N.make_fp4_moe(rng, t, e_global, h, inter, k, layout="cutedsl", a1_gs=448 * 6 / 4.0)
    ex = full["experts"]
    want = to_f32(N.run_runner(CUTEDSL, full, M.CuteDslFp4MoeQuantInfo(**full["kwargs"])))
    total = np.zeros_like(want)
    local = e_global // ep
    for r in range(ep):
        sl = slice(r * local, (r + 1) * local)
        w13 = mf.interleave_w13_halves(N.up_gate(ex.w13[sl]), 64, 1)
        s13 = mf.swizzle_nvfp4_scales(mf.interleave_w13_halves(N.up_gate(ex.w13_sf[sl]), 64, 1))
        s2 = mf.swizzle_nvfp4_scales(ex.w2_sf[sl])
        kw = dict(full["kwargs"], w13_weight=w13, w2_weight=ex.w2[sl],
                  w13_weight_sf=mf.nvfp4_scales_mma_view(s13),
                  w2_weight_sf=mf.nvfp4_scales_mma_view(s2),
                  w1_alpha=full["kwargs"]["w1_alpha"][sl], w2_alpha=full["kwargs"]["w2_alpha"][sl],
                  local_expert_offset=r * local)
        total += to_f32(N.run_runner(CUTEDSL, full, M.CuteDslFp4MoeQuantInfo(**kw), a2a="flashinfer",
                                     num_experts=e_global))
    assert_close(total, want, "sglang_cutedsl_ep_sum")


def _fi_dispatch(p, ids=None, x=None, scale=None, moe_output=None):
    topk = moecore.StandardTopKOutput(p["topk_weights"], p["topk_ids"] if ids is None else ids)
    return moecore.FlashinferDispatchOutput(p["x"] if x is None else x, scale, topk,
                                            moe_output=moe_output)


@pytest.mark.parametrize("backend", [CUTEDSL, CUTLASS])
def test_flashinfer_dispatch_output_paths(backend):
    """On a FlashinferDispatchOutput: same bits as the standard dispatch output, written into
    moe_output and returned as a FlashinferCombineInput; the invalid-token id (num_experts)
    contributes nothing; the dispatcher's pre-quantized NVFP4 (linear scales) equals the
    kernel's own quantization with the same global scale."""
    rng = np.random.default_rng(11)
    t, e, h, inter, k = 9, 4, 128, 128, 2
    layout = "cutedsl" if backend == CUTEDSL else "cutlass"
    p = N.make_fp4_moe(rng, t, e, h, inter, k, layout=layout)
    Info = M.CuteDslFp4MoeQuantInfo if backend == CUTEDSL else M.FlashInferCutlassMoeQuantInfo
    info = Info(**p["kwargs"])
    runner = moecore.MoeRunner(backend, _cfg(num_experts=e), a2a_backend="flashinfer")
    base = N.run_runner(backend, p, info)
    buf = np.full((t, h), np.nan, BF16)
    combine = runner.run(_fi_dispatch(p, moe_output=buf), info)
    assert isinstance(combine, moecore.FlashinferCombineInput)
    assert np.shares_memory(combine.hidden_states, buf)
    assert_bitwise_equal(buf, base)
    ids = p["topk_ids"].copy()
    ids[::2, -1] = e  # FlashInfer's invalid-token id for these runners
    ids_minus = p["topk_ids"].copy()
    ids_minus[::2, -1] = -1
    assert_bitwise_equal(runner.run(_fi_dispatch(p, ids=ids), info).hidden_states,
                         N.run_runner(backend, dict(p, topk_ids=ids_minus), info))
    xq, xs = mf.quantize_nvfp4(to_f32(p["x"]), float(p["a1_gs"]))
    assert_bitwise_equal(runner.run(_fi_dispatch(p, x=xq, scale=xs), info).hidden_states, base)
    with pytest.raises(ValueError, match="moe_output"):
        runner.run(_fi_dispatch(p, moe_output=np.zeros((t, h + 1), BF16)), info)


# ---------------------------------------------------------------------------------------------
# DeepGEMM under DeepEP: deepep_ll (masked pass-through) and deepep_normal (ep_scatter).

DG_E, DG_H, DG_I = 4, 128, 128


def _dg_problem(seed, t, k, use_fp8):
    rng = np.random.default_rng(seed)
    p = make_moe_problem(rng, t, DG_E, DG_H, DG_I, k, dtype="bf16")
    ids = p.topk_ids.astype(np.int32).copy()
    if t:
        ids[::3, -1] = -1
    if use_fp8:
        q13, s13 = quantize_fp8_block_ref(p.w13.astype(F32))
        q2, s2 = quantize_fp8_block_ref(p.w2.astype(F32))
        info = M.DeepGemmMoeQuantInfo(w13_weight=np.asarray(q13, np.uint8).view(FP8),
                                      w2_weight=np.asarray(q2, np.uint8).view(FP8), use_fp8=True,
                                      w13_scale=s13, w2_scale=s2, block_shape=[128, 128])
    else:
        info = M.DeepGemmMoeQuantInfo(w13_weight=p.w13, w2_weight=p.w2, use_fp8=False)
    return p.x, ids, p.topk_weights, info


def _payload(x, use_fp8):
    """The dispatcher's payload per token: bf16, or FP8 per-token-group-128 codes + f32 scales
    (the standard pre-permute's quantizer)."""
    if not use_fp8:
        return x, None
    q, s = M.fp8_int8_ops.quantize_activation(x, "fp8_per_token_group", group_size=128)
    return q, s


def _standard(x, ids, wts, info):
    runner = moecore.MoeRunner("deep_gemm", _cfg())
    d = moecore.StandardDispatchOutput(x, topk_output=moecore.StandardTopKOutput(wts, ids))
    return runner.run(d, info).hidden_states


def _pack_ue8m0(scales):
    """f32 power-of-two scales [..., G] → DeepEP's int32 words [..., ⌈G/4⌉] (byte g % 4 of
    word g / 4 holds group g's exponent byte)."""
    codes = (np.asarray(scales, F32).view(np.uint32) >> 23).astype(np.uint8)
    g = codes.shape[-1]
    padded = np.zeros(codes.shape[:-1] + ((g + 3) // 4 * 4,), np.uint8)
    padded[..., :g] = codes
    return np.ascontiguousarray(padded).view(np.int32)


@pytest.mark.parametrize("use_fp8", [True, False], ids=["fp8", "bf16"])
@pytest.mark.parametrize("t, k", [(0, 2), (7, 2), (33, 3)])
def test_deep_gemm_deepep_ll_equals_standard(use_fp8, t, k):
    x, ids, wts, info = _dg_problem(t + k, t, k, use_fp8)
    q, s = _payload(x, use_fp8)
    garbage = np.nan if not use_fp8 else 0x7F
    qp, masked, src2dst = _masked_layout(ids, q.view(np.uint8) if use_fp8 else q, DG_E,
                                         m_cap=64, garbage=garbage)
    if use_fp8:
        qp = qp.view(FP8)
        sp, _, _ = _masked_layout(ids, s, DG_E, m_cap=64, garbage=np.nan)
        sp = np.asfortranarray(sp.transpose(0, 2, 1)).transpose(0, 2, 1)  # DeepEP: column-major
    else:
        sp = None
    runner = moecore.MoeRunner("deep_gemm", _cfg(), a2a_backend="deepep")
    combine = runner.run(_ll_dispatch(qp, sp, ids, wts, masked), info)
    assert isinstance(combine, moecore.DeepEPLLCombineInput)
    got = M.fp8_int8_ops.deep_gemm_post_reorder(combine.hidden_states, src2dst, ids, wts)
    assert_bitwise_equal(got, _standard(x, ids, wts, info))


@pytest.mark.parametrize("use_fp8, packed", [(True, False), (True, True), (False, False)],
                         ids=["fp8", "fp8-ue8m0-packed", "bf16"])
@pytest.mark.parametrize("t, k", [(0, 2), (9, 2), (40, 4)])
def test_deep_gemm_deepep_normal_equals_standard(use_fp8, packed, t, k):
    x, ids, wts, info = _dg_problem(100 + t + k, t, k, use_fp8)
    if packed:  # UE8M0 mode: power-of-two scales, as DeepEP sends them packed in int32 words
        info = M.DeepGemmMoeQuantInfo(w13_weight=info.w13_weight, w2_weight=info.w2_weight,
                                      use_fp8=True, w13_scale=np.exp2(np.round(np.log2(info.w13_scale))).astype(F32),
                                      w2_scale=np.exp2(np.round(np.log2(info.w2_scale))).astype(F32),
                                      block_shape=[128, 128], scale_ue8m0=True)
        q, s = M.fp8_int8_ops.quantize_activation(x, "fp8_per_token_group", group_size=128,
                                                  scale_ue8m0=True)
    else:
        q, s = _payload(x, use_fp8)
    counts = [int((ids == e).sum()) for e in range(DG_E)]
    aligned = [(c + 127) // 128 * 128 for c in counts]
    d = moecore.DeepEPNormalDispatchOutput(q, _pack_ue8m0(s) if packed else s, ids, wts, aligned)
    runner = moecore.MoeRunner("deep_gemm", _cfg(), a2a_backend="deepep")
    combine = runner.run(d, info)
    assert isinstance(combine, moecore.DeepEPNormalCombineInput)
    slots = combine.hidden_states
    assert slots.shape == (t, k, DG_H) and slots.dtype == BF16
    assert not to_f32(slots)[ids < 0].any()  # non-local slots stay zero
    flat = slots.reshape(1, t * k, DG_H) if t else np.zeros((1, 1, DG_H), BF16)
    src2dst = np.where(ids.reshape(-1) >= 0, np.arange(t * k), -1).astype(np.int32)
    valid = np.where(ids >= 0, 0, -1).astype(np.int32)  # one "expert": the flat slot rows
    got = M.fp8_int8_ops.deep_gemm_post_reorder(flat, src2dst, valid, wts)
    standard = (
        _standard(x, ids, wts, info) if not packed
        else moecore.MoeRunner("deep_gemm", _cfg()).run(
            moecore.StandardDispatchOutput(x, topk_output=moecore.StandardTopKOutput(wts, ids)),
            info).hidden_states
    )
    assert_bitwise_equal(got, standard)


def test_deep_gemm_deepep_bad_inputs():
    x, ids, wts, info = _dg_problem(5, 6, 2, True)
    q, s = _payload(x, True)
    runner = moecore.MoeRunner("deep_gemm", _cfg(), a2a_backend="deepep")
    counts = [int((ids == e).sum()) for e in range(DG_E)]
    with pytest.raises(ValueError, match="num_recv_tokens_per_expert"):
        runner.run(moecore.DeepEPNormalDispatchOutput(q, s, ids, wts, counts[:-1]), info)
    short = list(counts)
    short[0] = max(counts[0] - 1, 0) if counts[0] else 0
    if counts[0]:
        with pytest.raises(ValueError, match=r"num_recv_tokens_per_expert\[0\]"):
            runner.run(moecore.DeepEPNormalDispatchOutput(q, s, ids, wts, short), info)
    with pytest.raises(ValueError, match="needs hidden_states_scale"):
        runner.run(moecore.DeepEPNormalDispatchOutput(q, None, ids, wts, counts), info)
    with pytest.raises(TypeError, match="int32 .packed UE8M0."):
        runner.run(moecore.DeepEPNormalDispatchOutput(q, s.astype(np.float16), ids, wts, counts),
                   info)
    bad = _pack_ue8m0(np.ones_like(s))
    bad.view(np.uint8)[0, 0] = 0xFF
    with pytest.raises(ValueError, match="0xFF"):
        runner.run(moecore.DeepEPNormalDispatchOutput(q, bad, ids, wts, counts), info)
    ids_bad = ids.copy()
    ids_bad[0, 0] = DG_E
    with pytest.raises(IndexError, match="topk_ids must be in"):
        runner.run(moecore.DeepEPNormalDispatchOutput(q, s, ids_bad, wts, counts), info)
    with pytest.raises(ValueError, match="BF16 payload without hidden_states_scale"):
        _, _, _, bf16_info = _dg_problem(5, 6, 2, False)
        xp, m2, _ = _masked_layout(ids, x, DG_E)
        runner.run(_ll_dispatch(xp, np.ones((DG_E, xp.shape[1], 1), F32), ids, wts, m2),
                   bf16_info)


# ---------------------------------------------------------------------------------------------
# Unquantized MoE through DeepGEMM BF16 (R6's quant-method half; the layer half is in
# test_expert_parallel.py).


def test_unquantized_deep_gemm_bf16_layer_equals_runner():
    rng = np.random.default_rng(6)
    t, e, h, inter, k = 5, 4, 64, 32, 2
    p = make_moe_problem(rng, t, e, h, inter, k, dtype="bf16")
    layer = moecore.FusedMoE(num_experts=e, hidden_size=h, intermediate_size=inter,
                             topk_config=moecore.TopKConfig(top_k=k), params_dtype="bf16",
                             runner_config=_cfg(), runner_backend="deep_gemm")
    for ei in range(e):
        layer.weight_loader("w13_weight", p.w13[ei, :inter], "", "w1", ei)
        layer.weight_loader("w13_weight", p.w13[ei, inter:], "", "w3", ei)
        layer.weight_loader("w2_weight", p.w2[ei], "", "w2", ei)
    layer.process_weights_after_loading()
    info = layer.quant_method.quant_info(layer)
    assert isinstance(info, moecore.DeepGemmMoeQuantInfo) and not info.use_fp8
    topk = moecore.StandardTopKOutput(p.topk_weights, p.topk_ids)
    assert_bitwise_equal(layer.forward_topk(p.x, topk), _standard(p.x, p.topk_ids, p.topk_weights,
                                                                   info))
    assert "dispatcher_output_dtype" not in layer.dispatcher.quant_config  # a2a none
    with pytest.raises(TypeError, match="DeepGEMM BF16, which needs bf16 weights"):
        bad = moecore.FusedMoE(num_experts=e, hidden_size=h, intermediate_size=inter,
                               topk_config=moecore.TopKConfig(top_k=k), params_dtype="f32",
                               runner_config=_cfg(), runner_backend="deep_gemm")
        bad.process_weights_after_loading()
