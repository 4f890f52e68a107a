"""moecore.formats layout transforms, bit-exact: the NVFP4 128×4 swizzle against the spec §7.2
offset formula (computed here) and sglang's reshape/permute twin, the MMA view as FlashInfer's
6-d view of the same memory, interleave_w13_halves and its R12 errors, gate/up swaps, GPT-OSS
row interleave, zero padding, FlashInfer's SM90 weight/scale layouts and the whole SM90 MXFP4
weight pipeline; every transform round-trips to identity; a bad-input table.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import moecore
import moecore.formats as mf
from moecore.reference import layout as ref
from moecore.testing import assert_bitwise_equal

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
Err = moecore.InvalidArgumentError


def raw(a) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


def assert_same(actual, expected, what="output"):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, (
        f"{what}: {actual.dtype}{actual.shape} vs {expected.dtype}{expected.shape}")
    assert_bitwise_equal(raw(actual), raw(expected), what=what)


def random_array(rng, shape, dtype):
    if dtype in ("u8", "e4m3", "i8"):
        a = rng.integers(0, 256, shape, dtype=np.uint8)
        return a.view(E4M3) if dtype == "e4m3" else (a.view(np.int8) if dtype == "i8" else a)
    a = rng.standard_normal(shape).astype(np.float32)
    return a.astype(ml_dtypes.bfloat16) if dtype == "bf16" else a


def spec_offset(m, kb, kbp):
    """Spec §7.2, written out from the text."""
    mt, i, j, kt, c = m // 128, (m % 128) // 32, m % 32, kb // 4, kb % 4
    return (((mt * (kbp // 4) + kt) * 32 + j) * 4 + i) * 4 + c


# ---------------------------------------------------------------------------------------------
# NVFP4 swizzle and MMA view.

SWIZZLE_SHAPES = [(1, 1), (127, 3), (128, 4), (129, 5), (3, 300, 8), (2, 256, 7), (1, 64, 16)]


@pytest.mark.parametrize("shape", SWIZZLE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", ["e4m3", "u8"])
def test_swizzle_matches_spec_formula_and_reference(shape, dtype):
    s = random_array(np.random.default_rng(1), shape, dtype)
    sw = mf.swizzle_nvfp4_scales(s)
    assert_same(sw, ref.swizzle_nvfp4_scales_ref(s))
    s3 = s if s.ndim == 3 else s[None]
    sw3 = raw(sw if sw.ndim == 3 else sw[None])
    b, m, kb = s3.shape
    mp, kbp = -(-m // 128) * 128, -(-kb // 4) * 4
    assert sw3.shape == (b, mp, kbp)
    flat = sw3.reshape(b, -1)
    expected = np.zeros_like(flat)
    mm, kk = np.meshgrid(np.arange(m), np.arange(kb), indexing="ij")
    offsets = spec_offset(mm, kk, kbp)
    for g in range(b):
        expected[g, offsets] = raw(s3[g])
    assert_bitwise_equal(flat, expected, what="swizzle vs §7.2 formula (padding zero)")
    assert mf.nvfp4_swizzled_offset(int(mm[-1, -1]), int(kk[-1, -1]), kbp) == offsets[-1, -1]
    assert_same(mf.unswizzle_nvfp4_scales(sw, m, kb), s)
    assert_same(ref.unswizzle_nvfp4_scales_ref(sw, m, kb), s)


def test_mma_view_is_flashinfer_view_of_the_same_memory():
    s = random_array(np.random.default_rng(2), (3, 200, 9), "e4m3")
    sw = mf.swizzle_nvfp4_scales(s)
    mma = mf.nvfp4_scales_mma_view(sw)
    expected = ref.nvfp4_scales_mma_view_ref(sw)
    assert mma.shape == (32, 4, 2, 4, 3, 3) and mma.strides == expected.strides
    assert np.shares_memory(mma, sw) and mma.__array_interface__["data"][0] == sw.ctypes.data
    assert_same(np.ascontiguousarray(mma), np.ascontiguousarray(expected))
    m, kb, g = 141, 6, 2  # logical (outer_m, inner_m, m_tile, inner_k, k_tile, group)
    assert raw(mma[m % 32, (m % 128) // 32, m // 128, kb % 4, kb // 4, g]) == raw(s[g, m, kb])
    back = mf.nvfp4_scales_from_mma_view(mma)
    assert back.shape == sw.shape and np.shares_memory(back, sw)
    assert_same(back, sw)
    with pytest.raises(Err, match="strides"):
        mf.nvfp4_scales_from_mma_view(np.ascontiguousarray(mma))


# ---------------------------------------------------------------------------------------------
# Gate/up arrangements.


@pytest.mark.parametrize("shape,group,dim", [((2, 256, 8), 64, 1), ((4, 128), 16, -1),
                                             ((512, 3), 64, 0), ((2, 64, 5), 32, 1)],
                         ids=["w13-3d", "last-dim", "dim0", "group32"])
@pytest.mark.parametrize("dtype", ["u8", "e4m3", "bf16", "f32", "i8"])
def test_interleave_w13_halves_matches_sglang_and_inverts(shape, group, dim, dtype):
    t = random_array(np.random.default_rng(3), shape, dtype)
    out = mf.interleave_w13_halves(t, group, dim)
    assert_same(out, ref.interleave_w13_halves_ref(t, group, dim))
    assert_same(mf.deinterleave_w13_halves(out, group, dim), t)
    assert_same(ref.deinterleave_w13_halves_ref(out, group, dim), t)


def test_interleave_w13_halves_layout_and_strided_input():
    rows = np.arange(256, dtype=np.float32)[None, :, None] * np.ones((2, 1, 3), np.float32)
    out = mf.interleave_w13_halves(rows)
    # Chunks of 64: A0 = 0..63, B0 = 128..191, A1 = 64..127, B1 = 192..255.
    assert list(out[0, ::64, 0]) == [0, 128, 64, 192]
    wide = np.random.default_rng(4).standard_normal((2, 256, 10)).astype(np.float32)
    strided = wide[:, :, ::3]
    assert_same(mf.interleave_w13_halves(strided), ref.interleave_w13_halves_ref(strided))


def test_R12_interleave_w13_halves_validation():
    """sglang's ValueError texts, verbatim, from moecore and from the numpy twin."""
    odd = np.zeros((2, 129, 4), np.uint8)
    not_divisible = np.zeros((2, 192, 4), np.uint8)
    msg_odd = "Expected even size on interleave dimension for W13 half split."
    msg_split = "Expected split dim divisible by group_size=64, got 96."
    for fn in (mf.interleave_w13_halves, ref.interleave_w13_halves_ref):
        with pytest.raises(ValueError) as e:
            fn(odd)
        assert str(e.value) == msg_odd
        with pytest.raises(ValueError) as e:
            fn(not_divisible, 64, 1)
        assert str(e.value) == msg_split
    with pytest.raises(Err) as e:
        mf.interleave_w13_halves(np.zeros((1, 200), np.uint8), group_size=64, dim=-1)
    assert str(e.value) == "Expected split dim divisible by group_size=64, got 100."
    assert isinstance(e.value, moecore.MoecoreError)
    mf.interleave_w13_halves(np.zeros((1, 192, 4), np.uint8), 32)  # 96 % 32 == 0: accepted


@pytest.mark.parametrize("dtype", ["u8", "bf16", "f32"])
def test_gate_up_swaps_and_gpt_oss_rows(dtype):
    rng = np.random.default_rng(5)
    t = random_array(rng, (3, 12, 7), dtype)
    swapped = mf.swap_w13_halves(t)
    assert_same(swapped, ref.swap_w13_halves_ref(t))
    assert_same(swapped[:, :6], t[:, 6:])
    assert_same(mf.swap_w13_halves(swapped), t)
    halves = mf.deinterleave_gate_up_rows(t)
    assert_same(halves, ref.deinterleave_gate_up_rows_ref(t))
    assert_same(halves[:, :6], np.ascontiguousarray(t[:, 0::2]))  # gate = even rows
    assert_same(halves[:, 6:], np.ascontiguousarray(t[:, 1::2]))  # up = odd rows
    assert_same(mf.interleave_gate_up_rows(halves), t)
    assert_same(ref.interleave_gate_up_rows_ref(halves), t)
    bias = random_array(rng, (3, 12), dtype)  # [E, 2I] biases along dim 1 too
    assert_same(mf.interleave_gate_up_rows(mf.deinterleave_gate_up_rows(bias)), bias)


@pytest.mark.parametrize("gated", [True, False], ids=["gated", "non-gated"])
def test_intermediate_padding_round_trips(gated):
    """R10: gated halves are zero-padded separately; unpadding restores the original."""
    rng = np.random.default_rng(6)
    i, ip, h = 10, 16, 6
    w13 = random_array(rng, (2, 2 * i if gated else i, h), "bf16")
    padded = mf.pad_w13_intermediate(w13, ip, gated)
    assert_same(padded, ref.pad_w13_intermediate_ref(w13, ip, gated))
    assert padded.shape == (2, 2 * ip if gated else ip, h)
    assert not raw(padded[:, i:ip]).any()
    if gated:
        assert_same(padded[:, ip:ip + i], w13[:, i:])
        assert not raw(padded[:, ip + i:]).any()
    assert_same(mf.unpad_w13_intermediate(padded, i, gated), w13)
    assert_same(ref.unpad_w13_intermediate_ref(padded, i, gated), w13)
    w2 = random_array(rng, (2, h, i), "u8")  # columns of w2 (bytes for packed fp4)
    w2p = mf.pad_dim(w2, -1, ip)
    assert_same(w2p, ref.pad_dim_ref(w2, -1, ip))
    assert_same(mf.unpad_dim(w2p, 2, i), w2)
    assert_same(mf.pad_dim(w2, 1, h), w2)  # no-op pad


# ---------------------------------------------------------------------------------------------
# FlashInfer SM90 layouts.


@pytest.mark.parametrize("shape", [(2, 32, 64), (1, 16, 32), (3, 48, 96)],
                         ids=lambda s: "x".join(map(str, s)))
def test_sm90_weight_interleave_matches_reference_and_inverts(shape):
    w = random_array(np.random.default_rng(7), shape, "u8")
    out = mf.interleave_moe_weights_for_sm90_mixed_gemm(w)
    assert_same(out, ref.interleave_moe_weights_for_sm90_mixed_gemm_ref(w))
    assert_same(mf.deinterleave_moe_weights_for_sm90_mixed_gemm(out), w)
    tagged = mf.interleave_moe_weights_for_sm90_mixed_gemm(moecore.tagged(w, "fp4_e2m1x2"))
    assert_same(tagged, out)
    # A bijection on nibbles' bits: the multiset of set bits per 16×32-byte tile is kept.
    assert np.unpackbits(out).sum() == np.unpackbits(w).sum()


@pytest.mark.parametrize("dtype,group", [("u8", 32), ("e4m3", 16), ("bf16", 128), ("f32", 32)])
def test_sm90_scale_fold_matches_reference_and_inverts(dtype, group):
    rng = np.random.default_rng(8)
    s = random_array(rng, (2, 128, 8 * (128 // group)), dtype)
    folded = mf.interleave_moe_scales_for_sm90_mixed_gemm(s, group)
    assert_same(folded, ref.interleave_moe_scales_for_sm90_mixed_gemm_ref(s, group))
    assert folded.shape[:3] == (2, 2, 8) and folded.shape[4] * folded.dtype.itemsize == 16
    assert_same(mf.deinterleave_moe_scales_for_sm90_mixed_gemm(folded, group), s)


def test_sm90_mxfp4_weight_processing_pipeline():
    """sglang's _process_weights_for_sm90_cutlass on GPT-OSS-layout MXFP4 w13 (row-interleaved
    [E, 2I, H/2] bytes, [E, 2I, H/32] E8M0 scales): de-interleave, [up; gate], pad each half
    I → Np and K → Kp, then FlashInfer's weight and scale interleave — moecore's composition
    against the numpy twins, byte for byte (spec §6.5, R7's manual pipeline)."""
    rng = np.random.default_rng(9)
    e, i, h = 2, 72, 160
    n_p, k_p = 128, 256
    w13 = rng.integers(0, 256, (e, 2 * i, h // 2), dtype=np.uint8)
    s13 = rng.integers(125, 130, (e, 2 * i, h // 32), dtype=np.uint8)

    def process(w, s, lib):
        out = []
        for t, k_units in ((w, k_p // 2), (s, k_p // 32)):
            halves = lib["rows"](t)
            up_gate = lib["swap"](halves)
            padded = lib["pad13"](up_gate, n_p)
            out.append(lib["pad"](padded, 2, k_units))
        return lib["w"](out[0]), lib["s"](out[1])

    ours = process(w13, s13, {
        "rows": mf.deinterleave_gate_up_rows, "swap": mf.swap_w13_halves,
        "pad13": mf.pad_w13_intermediate, "pad": mf.pad_dim,
        "w": mf.interleave_moe_weights_for_sm90_mixed_gemm,
        "s": mf.interleave_moe_scales_for_sm90_mixed_gemm})
    twin = process(w13, s13, {
        "rows": ref.deinterleave_gate_up_rows_ref, "swap": ref.swap_w13_halves_ref,
        "pad13": ref.pad_w13_intermediate_ref, "pad": ref.pad_dim_ref,
        "w": ref.interleave_moe_weights_for_sm90_mixed_gemm_ref,
        "s": ref.interleave_moe_scales_for_sm90_mixed_gemm_ref})
    assert ours[0].shape == (e, 2 * n_p, k_p // 2)
    assert ours[1].shape == (e, 2 * n_p // 64, k_p // 128, 16, 16)
    assert_same(ours[0], twin[0])
    assert_same(ours[1], twin[1])
    # And back: every step inverts.
    w_back = mf.deinterleave_moe_weights_for_sm90_mixed_gemm(ours[0])
    w_back = mf.unpad_w13_intermediate(mf.unpad_dim(w_back, 2, h // 2), i)
    assert_same(mf.interleave_gate_up_rows(mf.swap_w13_halves(w_back)), w13)


# ---------------------------------------------------------------------------------------------
# Bad input.

U = np.zeros((2, 8, 4), np.uint8)
BAD_LAYOUT_INPUTS = [
    ("swizzle-1d", lambda: mf.swizzle_nvfp4_scales(np.zeros(8, np.uint8)), Err, r"\[M, Kb\]"),
    ("swizzle-4d", lambda: mf.swizzle_nvfp4_scales(np.zeros((1, 1, 1, 1), np.uint8)), Err, "Kb"),
    ("unswizzle-wrong-m", lambda: mf.unswizzle_nvfp4_scales(np.zeros((128, 4), np.uint8), 129, 4),
     Err, "trailing dims"),
    ("unswizzle-wrong-kb", lambda: mf.unswizzle_nvfp4_scales(np.zeros((128, 4), np.uint8), 10, 5),
     Err, "trailing dims"),
    ("unswizzle-negative", lambda: mf.unswizzle_nvfp4_scales(np.zeros((128, 4), np.uint8), -1, 4),
     Err, "m, kb >= 0"),
    ("mma-not-contiguous", lambda: mf.nvfp4_scales_mma_view(np.zeros((128, 8), np.uint8)[:, ::2]),
     Err, "contiguous"),
    ("mma-not-padded", lambda: mf.nvfp4_scales_mma_view(np.zeros((100, 4), np.uint8)), Err,
     "multiples"),
    ("mma-back-wrong-shape", lambda: mf.nvfp4_scales_from_mma_view(np.zeros((4, 4), np.uint8)), Err,
     "MMA view"),
    ("interleave-odd", lambda: mf.interleave_w13_halves(np.zeros((1, 3), np.uint8), 1, 1), Err,
     "Expected even size"),
    ("interleave-group-zero", lambda: mf.interleave_w13_halves(U, 0), Err, "group_size > 0"),
    ("interleave-dim-out-of-range", lambda: mf.interleave_w13_halves(U, 4, 3), Err, "dim in"),
    ("deinterleave-split", lambda: mf.deinterleave_w13_halves(U, 3), Err, "group_size=3, got 4"),
    ("swap-odd", lambda: mf.swap_w13_halves(np.zeros((2, 5), np.uint8)), Err, "even size"),
    ("gate-up-odd", lambda: mf.deinterleave_gate_up_rows(np.zeros((2, 5), np.uint8)), Err, "even"),
    ("interleave-rows-odd", lambda: mf.interleave_gate_up_rows(np.zeros((2, 5), np.uint8)), Err,
     "even"),
    ("pad-smaller", lambda: mf.pad_dim(U, 1, 4), Err, "padded_size >= 8"),
    ("unpad-larger", lambda: mf.unpad_dim(U, 1, 9), Err, r"size in \[0, 8\]"),
    ("pad13-smaller", lambda: mf.pad_w13_intermediate(U, 3), Err, "padded_size >= 4"),
    ("pad13-odd", lambda: mf.pad_w13_intermediate(np.zeros((1, 5, 2), np.uint8), 8), Err, "even"),
    ("unpad13-larger", lambda: mf.unpad_w13_intermediate(U, 5), Err, r"size in \[0, 4\]"),
    ("layout-f64", lambda: mf.swap_w13_halves(np.zeros((2, 4))), moecore.DTypeError, "float64"),
    ("layout-list", lambda: mf.pad_dim([[1, 2]], 1, 3), moecore.DTypeError, "numpy array"),
    ("sm90-w-n-not-16", lambda: mf.interleave_moe_weights_for_sm90_mixed_gemm(
        np.zeros((1, 8, 32), np.uint8)), Err, "N divisible by 16"),
    ("sm90-w-k-not-64", lambda: mf.interleave_moe_weights_for_sm90_mixed_gemm(
        np.zeros((1, 16, 16), np.uint8)), Err, "divisible by 64"),
    ("sm90-w-2d", lambda: mf.interleave_moe_weights_for_sm90_mixed_gemm(
        np.zeros((16, 32), np.uint8)), Err, r"\[E, N, K/2\]"),
    ("sm90-w-f32", lambda: mf.interleave_moe_weights_for_sm90_mixed_gemm(
        np.zeros((1, 16, 32), np.float32)), moecore.DTypeError, "fp4_e2m1x2"),
    ("sm90-w-int4", lambda: mf.interleave_moe_weights_for_sm90_mixed_gemm(
        np.zeros((1, 16, 32), np.uint8), "int4"), moecore.UnsupportedError, "supported: 'fp4'"),
    ("sm90-w-bogus-type", lambda: mf.interleave_moe_weights_for_sm90_mixed_gemm(
        np.zeros((1, 16, 32), np.uint8), "nvfp4"), Err, "quant_type"),
    ("sm90-s-rows", lambda: mf.interleave_moe_scales_for_sm90_mixed_gemm(
        np.zeros((1, 96, 8), np.uint8)), Err, "rows divisible by 64"),
    ("sm90-s-kgroups", lambda: mf.interleave_moe_scales_for_sm90_mixed_gemm(
        np.zeros((1, 64, 6), np.uint8)), Err, "divisible by 4"),
    ("sm90-s-group-48", lambda: mf.interleave_moe_scales_for_sm90_mixed_gemm(
        np.zeros((1, 64, 8), np.uint8), 48), Err, "dividing 128"),
    ("sm90-s-group-4", lambda: mf.interleave_moe_scales_for_sm90_mixed_gemm(
        np.zeros((1, 64, 64), np.uint8), 4), Err, "scale groups per 128"),
    ("sm90-s-2d", lambda: mf.interleave_moe_scales_for_sm90_mixed_gemm(
        np.zeros((64, 8), np.uint8)), Err, r"\[E, rows"),
    ("sm90-s-back-shape", lambda: mf.deinterleave_moe_scales_for_sm90_mixed_gemm(
        np.zeros((1, 1, 1, 16, 8), np.uint8)), Err, "folded scales"),
]


@pytest.mark.parametrize("call,exc,pattern", [c[1:] for c in BAD_LAYOUT_INPUTS],
                         ids=[c[0] for c in BAD_LAYOUT_INPUTS])
def test_bad_layout_input(call, exc, pattern):
    before = U.copy()
    with pytest.raises(exc, match=pattern):
        call()
    assert_bitwise_equal(U, before)
