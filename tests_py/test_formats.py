"""moecore.formats codecs and quantizers, bit-exact: every fp8 e4m3fn/e5m2, e8m0 and e2m1 code
against ml_dtypes; encodes of random, tie and boundary values (fp8 saturation checked on its
own); C++ quantizers vs the numpy twins in moecore.reference.quant (codes and scales) over
shapes, dtypes and strides; NVFP4 midpoints; both MXFP4 rules by hand, against a torch
transcription of sglang's MXFP4QuantizeUtil and against torchao's pure-torch MX/NVFP4 reference;
GPT-OSS MXFP4 dequant against transformers; and a bad-input table.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

import moecore
import moecore.formats as mf
from moecore.dtypes import round_to
from moecore.reference import quant as ref
from moecore.testing import assert_bitwise_equal

F32 = np.float32
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E5M2 = np.dtype(ml_dtypes.float8_e5m2)
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
FP4 = np.dtype(ml_dtypes.float4_e2m1fn)


def raw(a) -> np.ndarray:
    """The bytes of an array (so NaN payloads, −0 and ml_dtypes types compare as bits)."""
    return np.ascontiguousarray(a).view(np.uint8)


def assert_bits(actual, expected, what="output"):
    assert np.asarray(actual).shape == np.asarray(expected).shape, what
    assert_bitwise_equal(raw(actual), raw(expected), what=what)


def random_f32_bits(rng, n, max_abs):
    """Finite float32 values with random bit patterns (every exponent) and |x| ≤ max_abs."""
    x = rng.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32).view(F32)
    return x[np.isfinite(x) & (np.abs(x) <= max_abs)]


def midpoints(magnitudes) -> np.ndarray:
    """Exact midpoints between consecutive values, both signs (float32)."""
    m = np.asarray(magnitudes, dtype=np.float64)
    mids = ((m[:-1] + m[1:]) / 2).astype(F32)
    assert np.all(mids.astype(np.float64) == (m[:-1] + m[1:]) / 2)
    return np.concatenate([mids, -mids])


def pack_nibbles(n):
    return (n[..., 0::2] | (n[..., 1::2] << 4)).astype(np.uint8)


# ---------------------------------------------------------------------------------------------
# Decode every code against ml_dtypes.


@pytest.mark.parametrize("dtype,name", [(E4M3, "e4m3"), (E5M2, "e5m2")], ids=["e4m3fn", "e5m2"])
def test_every_fp8_code_decodes_like_ml_dtypes(dtype, name):
    codes = np.arange(256, dtype=np.uint8)
    expected = codes.view(dtype).astype(F32)
    got = mf.decode_to_f32(codes.view(dtype))
    nan = np.isnan(expected)
    assert np.array_equal(np.isnan(got), nan)
    assert_bits(got[~nan], expected[~nan])
    assert_bits(ref.decode_fp8_ref(codes, name)[~nan], expected[~nan])


def test_every_e8m0_code_decodes_like_ml_dtypes():
    codes = np.arange(256, dtype=np.uint8)
    expected = codes.view(E8M0).astype(F32)
    got = mf.decode_to_f32(codes.view(E8M0))
    assert np.isnan(got[255]) and np.isnan(expected[255])
    assert_bits(got[:255], expected[:255])
    assert_bits(ref.e8m0_values()[:255], expected[:255])
    assert got[0] == np.ldexp(F32(1), -127) and got[127] == 1.0  # 0x00 = 2^-127 (subnormal)
    assert_bits(mf.e8m0_to_scales(codes[:255].view(E8M0)), expected[:255])


def test_every_e2m1_code_decodes_like_ml_dtypes():
    nibbles = np.arange(16, dtype=np.uint8)
    expected = nibbles.view(FP4).astype(F32)
    assert_bits(mf.decode_e2m1(pack_nibbles(nibbles)), expected)
    assert_bits(ref.decode_e2m1_ref(nibbles), expected)
    assert np.signbit(expected[8])  # 0x8 is −0


# ---------------------------------------------------------------------------------------------
# Encode random, tie and boundary values.


@pytest.mark.parametrize("dtype,name,limit", [(E4M3, "e4m3", 464.0), (E5M2, "e5m2", 57344.0)],
                         ids=["e4m3fn", "e5m2"])
def test_fp8_encode_matches_ml_dtypes_below_overflow(dtype, name, limit):
    """ml_dtypes and moecore agree wherever ml_dtypes does not overflow (≤ 464 for e4m3fn: it
    rounds 464 down to 448; above that it returns NaN where moecore saturates)."""
    rng = np.random.default_rng(1)
    table = ref.E4M3_MAGNITUDES if name == "e4m3" else ref.E5M2_MAGNITUDES
    x = np.concatenate([
        random_f32_bits(rng, 200_000, limit),
        rng.standard_normal(20_000).astype(F32) * np.float32(table[-1] / 4),
        midpoints(table),
        np.nextafter(midpoints(table), F32(np.inf)),
        np.nextafter(midpoints(table), F32(0)),
        table.astype(F32), -table.astype(F32),
        np.array([0.0, -0.0, np.nan, -np.nan, limit, -limit], F32),
    ])
    expected = raw(x.astype(dtype))
    assert_bits(mf.encode_fp8(x, dtype), expected, "moecore vs ml_dtypes")
    assert_bits(ref.encode_fp8_ref(x, name), expected, "reference vs ml_dtypes")


def test_fp8_e4m3_saturation_boundaries():
    """moecore saturates to ±448 like the GPU kernels; ml_dtypes turns overflow into NaN."""
    x = np.array([447, 448, 449, 464, 465, 1e6, np.inf, -465, -np.inf, np.nan, -np.nan], F32)
    expected = np.array([0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0xFE, 0x7F, 0xFF],
                        np.uint8)
    assert_bits(mf.encode_fp8(x, "fp8_e4m3fn"), expected)
    assert_bits(ref.encode_fp8_ref(x, "e4m3"), expected)
    ml = raw(x.astype(E4M3))
    assert list(ml[:4]) == [0x7E] * 4 and ml[4] == 0x7F and ml[6] == 0x7F  # the documented gap


def test_fp8_e5m2_saturation_boundaries():
    x = np.array([57344, 61439, 61440, 1e9, np.inf, -np.inf, np.nan], F32)
    expected = np.array([0x7B, 0x7B, 0x7B, 0x7B, 0x7B, 0xFB, 0x7E], np.uint8)
    assert_bits(mf.encode_fp8(x, "fp8_e5m2"), expected)
    assert_bits(ref.encode_fp8_ref(x, "e5m2"), expected)
    assert raw(x.astype(E5M2))[2] == 0x7C  # ml_dtypes: inf


def test_e2m1_rne_encode_matches_ml_dtypes():
    """ml_dtypes float4_e2m1fn rounds half to even and saturates, like NVFP4's rule."""
    rng = np.random.default_rng(2)
    x = np.concatenate([
        rng.uniform(-7, 7, 50_000).astype(F32),
        random_f32_bits(rng, 50_000, 1e30),
        midpoints(ref.E2M1_MAGNITUDES),
        np.nextafter(midpoints(ref.E2M1_MAGNITUDES), F32(np.inf)),
        np.array([0.0, -0.0, 6.0, -6.0, 100.0, -100.0, np.inf, -np.inf], F32),
    ])
    x = x[: len(x) // 2 * 2]
    expected_nibbles = raw(x.astype(FP4)) & 0xF
    assert_bits(mf.encode_e2m1(x), pack_nibbles(expected_nibbles))
    assert_bits(ref.encode_e2m1_ref(x, "rne"), expected_nibbles)


def test_e2m1_midpoints_both_rules():
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], F32)
    rne = [0, 2, 2, 4, 4, 6, 6]  # 0, 1, 1, 2, 2, 4, 4
    down = [0, 1, 2, 3, 4, 5, 6]  # 0, 0.5, 1, 1.5, 2, 3, 4
    x = np.concatenate([mids, -mids, [0.0, -0.0]]).astype(F32)
    got_rne = mf.unpack_e2m1(mf.encode_e2m1(x))
    got_down = mf.unpack_e2m1(mf.encode_e2m1(x, ties_down=True))
    assert list(got_rne) == rne + [8 | c for c in rne] + [0, 8]
    assert list(got_down) == down + [8 | c for c in down] + [8, 8]  # zero → 0x8 (sglang)
    assert_bits(ref.encode_e2m1_ref(x, "ties_down"), got_down)


def test_nibble_order_low_first():
    packed = mf.encode_e2m1(np.array([0.5, -1.0, 6.0, 0.0], F32))
    assert list(packed) == [0xA1, 0x07]
    assert list(mf.unpack_e2m1(packed)) == [0x1, 0xA, 0x7, 0x0]
    assert list(mf.pack_e2m1(np.array([0x1, 0xA, 0x7, 0x0], np.uint8))) == [0xA1, 0x07]
    assert list(ref.pack_e2m1_ref(np.array([0x1, 0xA], np.uint8))) == [0xA1]


def test_e8m0_encode_powers_of_two_matches_ml_dtypes():
    s = np.ldexp(F32(1), np.arange(-127, 128)).astype(F32)
    expected = raw(s.astype(E8M0))
    assert_bits(mf.scales_to_e8m0(s), expected)
    assert_bits(ref.scales_to_e8m0_ref(s), expected)
    assert raw(mf.scales_to_e8m0(s))[0] == 0x00 and raw(mf.scales_to_e8m0(s))[-1] == 0xFE


def test_e8m0_0x00_and_0xff():
    codes = np.array([0x00, 0xFF], np.uint8).view(E8M0)
    d = mf.decode_to_f32(codes)
    assert d[0] == np.ldexp(1.0, -127) and np.isnan(d[1])
    with pytest.raises(moecore.InvalidArgumentError, match="0xFF"):
        mf.e8m0_to_scales(codes)
    with pytest.raises(moecore.InvalidArgumentError, match="0xFF"):
        mf.dequantize_mxfp4(np.zeros((1, 16), np.uint8), codes[1:].reshape(1, 1))


def test_ue8m0_rounding_and_packing():
    rng = np.random.default_rng(3)
    s = np.abs(rng.standard_normal((5, 7)).astype(F32)) * F32(1e-3) + F32(1e-30)
    s[0, 0], s[0, 1] = 0.25, np.nextafter(F32(0.25), F32(1))
    rounded = mf.round_scales_ue8m0(s)
    assert_bits(rounded, ref.round_scales_ue8m0_ref(s))
    assert_bits(rounded, (2.0 ** np.ceil(np.log2(s.astype(np.float64)))).astype(F32))
    assert rounded[0, 0] == 0.25 and rounded[0, 1] == 0.5
    packed = mf.pack_ue8m0(rounded)
    assert packed.dtype == np.int32 and packed.shape == (5, 2)
    assert_bits(packed, ref.pack_ue8m0_ref(rounded))
    assert raw(packed)[1, 3] == raw(mf.scales_to_e8m0(rounded))[1, 3]  # byte j of word 0: scale j
    assert_bits(mf.unpack_ue8m0(packed, 7), rounded)


# ---------------------------------------------------------------------------------------------
# Quantizers: C++ vs numpy twin, bit for bit.


def make_input(rng, shape, dtype, strided, scale=1.0):
    """Seeded input of `dtype` (f32, f16, bf16), optionally a non-contiguous view."""
    full = list(shape)
    if strided:
        full[-1] *= 2
    x = (rng.standard_normal(full) * scale).astype(F32)
    x[..., 0] *= 9  # an outlier per row so blocks have different scales
    if dtype == "bf16":
        x = x.astype(ml_dtypes.bfloat16)
    elif dtype == "f16":
        x = x.astype(np.float16)
    return x[..., ::2] if strided else x


CASES = [  # (id, shape, dtype, strided)
    ("f32-2d", (7, 256), "f32", False),
    ("bf16-3d", (3, 5, 384), "bf16", False),
    ("f16-strided", (4, 128), "f16", True),
    ("f32-1row", (1, 128), "f32", False),
    ("f32-0rows", (0, 128), "f32", False),
]


@pytest.mark.parametrize("shape,dtype,strided", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_fp8_row_and_group_quantizers_match_reference(shape, dtype, strided):
    x = make_input(np.random.default_rng(4), shape, dtype, strided, 30.0)
    for fn in (mf.quantize_fp8_per_channel, mf.quantize_fp8_per_token):
        q, s = fn(x)
        rq, rs = ref.quantize_fp8_per_row_ref(x)
        assert q.dtype == E4M3 and s.shape == shape[:-1] + (1,)
        assert_bits(q, rq)
        assert_bits(s, rs)
        assert_bits(mf.dequantize_fp8_per_row(q, s),
                    ref.dequantize_fp8_block_ref(q, s, 1, shape[-1]))
    for group, ue8m0 in [(128, False), (64, True), (32, False)]:
        q, s = mf.quantize_fp8_per_token_group(x, group, scale_ue8m0=ue8m0)
        rq, rs = ref.quantize_fp8_per_token_group_ref(x, group, scale_ue8m0=ue8m0)
        assert s.shape == shape[:-1] + (shape[-1] // group,)
        assert_bits(q, rq)
        assert_bits(s, rs)
        for od in ("f32", "bf16"):
            got = mf.dequantize_fp8_per_token_group(q, s, group, od).astype(F32)
            assert_bits(got, ref.dequantize_fp8_block_ref(q, s, 1, group, od))
    q, s = mf.quantize_fp8_per_tensor(x)
    rq, rs = ref.quantize_fp8_per_tensor_ref(x)
    assert_bits(q, rq)
    assert_bits(s, rs)
    assert_bits(mf.quantize_fp8_static(x, 0.37), ref.quantize_fp8_static_ref(x, 0.37))
    assert_bits(mf.dequantize_fp8_per_tensor(q, float(s[0])),
                ref.decode_fp8_ref(raw(q)).reshape(q.shape) * s[0])


def test_fp8_per_token_group_single_row():
    x = make_input(np.random.default_rng(15), (256,), "f32", False, 7.0)
    q, s = mf.quantize_fp8_per_token_group(x, 64)
    rq, rs = ref.quantize_fp8_per_token_group_ref(x, 64)
    assert q.shape == (256,) and s.shape == (4,)
    assert_bits(q, rq)
    assert_bits(s, rs)
    assert_bits(mf.dequantize_fp8_per_token_group(q, s, 64),
                ref.dequantize_fp8_block_ref(q[None], s[None], 1, 64)[0])


@pytest.mark.parametrize("shape,block", [((2, 300, 200), (128, 128)), ((256, 256), (128, 128)),
                                         ((3, 17, 40), (16, 32)), ((1, 1), (128, 128))],
                         ids=["edges-3d", "exact-2d", "small-blocks", "one-element"])
@pytest.mark.parametrize("ue8m0", [False, True], ids=["f32-scale", "ue8m0"])
def test_fp8_block_quantizer_matches_reference(shape, block, ue8m0):
    w = make_input(np.random.default_rng(5), shape, "bf16", False)
    q, s = mf.quantize_fp8_block(w, *block, scale_ue8m0=ue8m0)
    rq, rs = ref.quantize_fp8_block_ref(w, *block, scale_ue8m0=ue8m0)
    assert s.shape == shape[:-2] + (-(-shape[-2] // block[0]), -(-shape[-1] // block[1]))
    assert_bits(q, rq)
    assert_bits(s, rs)
    assert_bits(mf.dequantize_fp8_block(q, s, *block), ref.dequantize_fp8_block_ref(q, s, *block))


@pytest.mark.parametrize("shape,dtype,strided", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_nvfp4_matches_reference(shape, dtype, strided):
    x = make_input(np.random.default_rng(6), shape, dtype, strided)
    for gs in (1.0, 448.0 * 6 / 5.3, 0.731):
        q, s = mf.quantize_nvfp4(x, gs)
        rq, rs = ref.quantize_nvfp4_ref(x, gs)
        assert q.dtype == np.uint8 and s.dtype == E4M3
        assert q.shape == shape[:-1] + (shape[-1] // 2,)
        assert s.shape == shape[:-1] + (shape[-1] // 16,)
        assert_bits(q, rq)
        assert_bits(s, rs)
        for od in ("f32", "bf16"):
            assert_bits(mf.dequantize_nvfp4(q, s, gs, od).astype(F32),
                        ref.dequantize_nvfp4_ref(q, s, gs, od))


def test_nvfp4_per_expert_global_scales():
    w = make_input(np.random.default_rng(7), (4, 64, 48), "f32", False)  # K = 48: 3 blocks
    w[2] = 0.0  # an all-zero expert gets gs = 1
    gs = mf.nvfp4_global_scales(w)
    assert_bits(gs, ref.nvfp4_global_scales_ref(w))
    assert gs[2] == 1.0 and gs[0] == F32(2688) / np.abs(w[0]).max()
    assert_bits(mf.nvfp4_global_scales(w, per_leading=False), ref.nvfp4_global_scales_ref(w, False))
    q, s = mf.quantize_nvfp4(w, gs)
    rq, rs = ref.quantize_nvfp4_ref(w, gs)
    assert_bits(q, rq)
    assert_bits(s, rs)
    assert not raw(q[2]).any() and not raw(s[2]).any()
    assert_bits(mf.dequantize_nvfp4(q, s, gs), ref.dequantize_nvfp4_ref(q, s, gs))
    # Expert e alone with its scalar gs gives the same bytes (per-expert scales are independent).
    q1, s1 = mf.quantize_nvfp4(w[1], float(gs[1]))
    assert_bits(q1, q[1])
    assert_bits(s1, s[1])


def test_nvfp4_rounding_midpoints():
    """gs = 1 and block max 6 make the block scale exactly 1 (inv = 1), so the codes are the E2M1
    codes of x itself: every midpoint rounds half to even (ml_dtypes is the oracle)."""
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], F32)
    x = np.concatenate([[6.0], mids, [-6.0], -mids]).astype(F32)[None]
    q, s = mf.quantize_nvfp4(x, 1.0)
    assert raw(s)[0] == 0x38  # 1.0
    assert_bits(mf.unpack_e2m1(q), raw(x.astype(FP4)) & 0xF)
    assert list(mf.unpack_e2m1(q)[0, 1:8]) == [0, 2, 2, 4, 4, 6, 6]


@pytest.mark.parametrize("rounding", mf.MXFP4_ROUNDINGS)
@pytest.mark.parametrize("shape,dtype,strided", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_mxfp4_matches_reference(shape, dtype, strided, rounding):
    x = make_input(np.random.default_rng(8), shape, dtype, strided, 3.0)
    if x.size:
        x[..., 5] = 0.0  # exact zeros exercise sglang's 0x8 zero code
    q, s = mf.quantize_mxfp4(x, rounding)
    rq, rs = ref.quantize_mxfp4_ref(x, rounding)
    assert s.dtype == E8M0 and s.shape == shape[:-1] + (shape[-1] // 32,)
    assert_bits(q, rq)
    assert_bits(s, rs)
    for od in ("f32", "bf16", "f16"):
        assert_bits(mf.dequantize_mxfp4(q, s, od).astype(F32), ref.dequantize_mxfp4_ref(q, s, od))


def test_mxfp4_both_rules_hand_computed():
    x = np.zeros((1, 96), F32)
    x[0, :9] = [6, 5, 3.5, 2.5, 1.75, 1.25, 0.75, 0.25, -0.3]
    x[0, 32:34] = [7.0, -1.0]  # amax 7
    x[0, 64:66] = [8.0, 0.75]  # amax 8
    q, s = mf.quantize_mxfp4(x, "sglang_ceil")
    # ceil(log2(amax/6)): 6 → 0, 7 → 1, 8 → 1.
    assert list(raw(s)[0]) == [127, 128, 128]
    n = mf.unpack_e2m1(q)[0]
    assert list(n[:9]) == [7, 6, 5, 4, 3, 2, 1, 0, 9]  # ties down
    assert list(n[32:34]) == [5, 9]  # 3.5 → 3, −0.5 → −0.5
    assert list(n[64:66]) == [6, 1]  # 4 → 4, 0.375 → 0.5
    assert n[9] == 8  # an exact zero encodes as 0x8
    q, s = mf.quantize_mxfp4(x, "ocp_floor")
    # floor(log2 amax) − 2: 6 → 0, 7 → 0 (7 clips to 6), 8 → 1.
    assert list(raw(s)[0]) == [127, 127, 128]
    n = mf.unpack_e2m1(q)[0]
    assert list(n[:9]) == [7, 6, 6, 4, 4, 2, 2, 0, 9]  # ties to even
    assert list(n[32:34]) == [7, 10]
    assert list(n[64:66]) == [6, 1]
    assert n[9] == 0


@pytest.mark.parametrize("shape,dtype,strided", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_int8_matches_reference(shape, dtype, strided):
    x = make_input(np.random.default_rng(9), shape, dtype, strided)
    for fn in (mf.quantize_int8_per_channel, mf.quantize_int8_per_token):
        q, s = fn(x)
        rq, rs = ref.quantize_int8_per_row_ref(x)
        assert q.dtype == np.int8
        assert_bits(q, rq)
        assert_bits(s, rs)
        assert_bits(mf.dequantize_int8_per_row(q, s), ref.dequantize_int8_per_row_ref(q, s))


# The rules follow sglang's kernel arithmetic (changed from the first formats version, which
# rounded INT8 ties to even, divided by the FP8 scale and floored UE8M0 at 2^-127 only).


def test_int8_rounds_ties_away_from_zero_like_per_token_quant_int8():
    q, s = mf.quantize_int8_per_token(np.array([[127.0, 2.5, -2.5, 0.5, -0.5, 3.5]], F32))
    assert s[0, 0] == 1.0
    assert list(q[0]) == [127, 3, -3, 1, -1, 4]  # libdevice.round; half-even gives 2, -2, 0, 0


def test_fp8_static_multiplies_by_the_reciprocal():
    """sgl-kernel per_tensor_quant_fp8: x · fp32(1/s). Here x / s lands on code 7, x · (1/s) on 8."""
    s = F32(1.4501545)
    x = np.array([[0.021242497]], F32)
    assert ref.encode_fp8_ref(x / s)[0, 0] == 7
    assert raw(mf.quantize_fp8_static(x, float(s)))[0, 0] == 8
    assert raw(mf.quantize_fp8_per_tensor(np.array([[0.021242497, 448 * s]], F32))[0])[0, 0] == 8


def test_fp8_group_ue8m0_floor_is_the_cuda_kernels():
    x = np.full((1, 128), 1e-9, F32)  # s = 1e-9/448 ≈ 2^-38.7
    _, s = mf.quantize_fp8_per_token_group(x, 128, scale_ue8m0=True)
    assert s[0, 0] == np.ldexp(F32(1), -33)  # 2^ceil(log2 max(s, 1e-10))
    _, s_post = ref.quantize_fp8_per_token_group_ref(x, 128, scale_ue8m0=True,
                                                    rule="deep_gemm_silu_post")
    assert s_post[0, 0] == np.ldexp(F32(1), -38)  # DeepGEMM's Triton post-quant: no floor


def test_formats_and_backend_quantizers_are_one_rule():
    """fp8_int8_ops.quantize_activation (the triton / deep_gemm quantizers) runs the formats
    kernels: equal codes and scales wherever the inputs are non-zero (sglang's per-tensor and
    per-token kernels have no eps)."""
    ops = moecore._moecore.fp8_int8_ops
    x = make_input(np.random.default_rng(11), (5, 256), "bf16", False)
    pairs = [
        (mf.quantize_fp8_static(x, 0.02), ops.quantize_activation(x, "fp8_static", 0.02)[0]),
        (mf.quantize_fp8_per_tensor(x), ops.quantize_activation(x, "fp8_per_tensor")),
        (mf.quantize_fp8_per_token(x), ops.quantize_activation(x, "fp8_per_token")),
        (mf.quantize_fp8_per_token_group(x, 128, scale_ue8m0=True),
         ops.quantize_activation(x, "fp8_per_token_group", group_size=128, scale_ue8m0=True)),
        (mf.quantize_int8_per_token(x), ops.quantize_activation(x, "int8_per_token")),
    ]
    for got, want in pairs:
        for a, b in zip(got if isinstance(got, tuple) else (got,),
                        want if isinstance(want, tuple) else (want,)):
            assert_bits(np.asarray(a), np.asarray(b))


def test_thread_count_does_not_change_results():
    x = make_input(np.random.default_rng(10), (67, 512), "bf16", False)
    saved = moecore.get_num_threads()

    def run():
        return [raw(a) for a in (*mf.quantize_nvfp4(x, 3.0), *mf.quantize_mxfp4(x),
                                 *mf.quantize_fp8_block(x, 32, 96),
                                 *mf.quantize_fp8_per_token_group(x))]

    try:
        moecore.set_num_threads(1)
        one = run()
        moecore.set_num_threads(4)
        four = run()
    finally:
        moecore.set_num_threads(saved)
    for a, b in zip(one, four):
        assert_bitwise_equal(a, b)


# ---------------------------------------------------------------------------------------------
# Independent oracles: torch transcription of sglang's quantizer, torchao, transformers.


def _import_quietly(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pytest.importorskip(name)


def test_mxfp4_sglang_rule_matches_torch_transcription_of_mxfp4quantizeutil():
    """sglang's MXFP4QuantizeUtil.quantize (quantization/mxfp4_tensor.py), transcribed in torch:
    amax/6, ceil(max(log2, −127)), x / 2^E, code = #bounds below |x|, sign bit (2 − sign)//2."""
    torch = _import_quietly("torch")
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((64, 256)) * np.exp(rng.uniform(-8, 8, (64, 1)))).astype(F32)
    x[3, 7] = 0.0
    t = torch.from_numpy(x).view(-1, 32)
    amax = t.abs().max(dim=-1, keepdim=True).values
    e = torch.ceil(torch.maximum(torch.log2(amax / 6.0), torch.tensor(-127.0)))
    y = (t / torch.exp2(e)).view(x.shape)
    bounds = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5])
    ord_ = torch.sum((y.abs().unsqueeze(-1) - bounds) > 0, dim=-1)
    sign_bit = (2 - torch.sign(y)) // 2
    codes = (sign_bit * 8 + ord_).to(torch.uint8).numpy()
    scales = (e + 127).to(torch.uint8).view(64, 8).numpy()
    q, s = mf.quantize_mxfp4(x, "sglang_ceil")
    assert_bits(s, scales)
    assert_bits(mf.unpack_e2m1(q), codes)


@pytest.fixture(scope="module")
def torchao_mx():
    _import_quietly("torch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
        nv = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")
        cfg = pytest.importorskip("torchao.prototype.mx_formats.config")
    return mx, nv, cfg


def test_mxfp4_against_torchao(torchao_mx):
    """torchao's to_mx: FLOOR is the OCP rule (exact match); RCEIL has sglang's scale rule
    ceil(log2(amax/6)) with RNE elements, so its scales match sglang_ceil and its codes match
    ours wherever no element sits on a midpoint (none do in this data)."""
    import torch

    mx, _, cfg = torchao_mx
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((32, 512)) * np.exp(rng.uniform(-4, 4, (32, 1)))).astype(F32)
    t = torch.from_numpy(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s_floor, d_floor = mx.to_mx(t, torch.float4_e2m1fn_x2, 32, cfg.ScaleCalculationMode.FLOOR)
        s_rceil, _ = mx.to_mx(t, torch.float4_e2m1fn_x2, 32, cfg.ScaleCalculationMode.RCEIL)
    q, s = mf.quantize_mxfp4(x, "ocp_floor")
    assert_bits(s, s_floor.view(torch.uint8).numpy())
    assert_bits(q, d_floor.view(torch.uint8).numpy())
    q2, s2 = mf.quantize_mxfp4(x, "sglang_ceil")
    assert_bits(s2, s_rceil.view(torch.uint8).numpy())
    scale = mf.e8m0_to_scales(s2).repeat(32, axis=-1)
    y = x / scale
    rne = mf.unpack_e2m1(mf.encode_e2m1(y))
    on_midpoint = np.isin(np.abs(y), [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert not on_midpoint.any()
    assert_bits(mf.unpack_e2m1(q2), rne)


def test_nvfp4_against_torchao_single_level(torchao_mx):
    """torchao's nvfp4_quantize without a per-tensor scale is NVFP4 with gs = 1: block scale
    e4m3(amax/6), data x · (1/s8), RNE. (Its two-level path divides by 1/gs instead of
    multiplying by gs, a different fp32 rounding order, so it is not compared; torchao also
    clamps block scales below e4m3's smallest normal 2^-6, which this data stays above.)"""
    import torch

    _, nv, _ = torchao_mx
    rng = np.random.default_rng(13)
    x = (rng.standard_normal((64, 256)) * np.exp(rng.uniform(0, 3, (64, 1)))).astype(F32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s_ao, d_ao = nv.nvfp4_quantize(torch.from_numpy(x), block_size=16)
    q, s = mf.quantize_nvfp4(x, 1.0)
    assert_bits(s, s_ao.view(torch.uint8).numpy().reshape(s.shape))
    assert_bits(q, d_ao.view(torch.uint8).numpy())


@pytest.mark.parametrize("out_dtype", ["bf16", "f32"])
def test_gpt_oss_mxfp4_dequant_matches_transformers(out_dtype):
    """transformers' convert_moe_packed_tensors (GPT-OSS checkpoints: blocks [E, N, G, 16] uint8,
    scales [E, N, G] with values 120..134) against moecore's MXFP4 dequant, bit for bit. It
    returns [E, G·32, N] (transposed for x @ W)."""
    torch = _import_quietly("torch")
    tm = _import_quietly("transformers.integrations.mxfp4")
    rng = np.random.default_rng(14)
    e, n, g = 3, 24, 5
    blocks = rng.integers(0, 256, (e, n, g, 16), dtype=np.uint8)
    scales = rng.integers(120, 135, (e, n, g), dtype=np.uint8)
    tdtype = torch.bfloat16 if out_dtype == "bf16" else torch.float32
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = tm.convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales),
                                           dtype=tdtype)
    hf = hf.transpose(1, 2).contiguous().float().numpy()
    ours = mf.dequantize_mxfp4(blocks.reshape(e, n, g * 16), scales, out_dtype).astype(F32)
    assert_bits(ours, hf)
    assert_bits(ours, ref.dequantize_mxfp4_ref(blocks.reshape(e, n, g * 16), scales, out_dtype))


# ---------------------------------------------------------------------------------------------
# Bad input: exception type and message; inputs never modified.

X32 = np.ones((2, 32), F32)
X20 = np.ones((2, 20), F32)
Q16 = np.zeros((2, 16), np.uint8)
E8_OK = np.full((2, 1), 127, np.uint8).view(E8M0)
E8_NAN = np.full((2, 1), 255, np.uint8).view(E8M0)
E4_SCALE = np.full((2, 2), 0x38, np.uint8).view(E4M3)
FP8_Q = mf.encode_fp8(X32, "fp8_e4m3fn")
Err, DErr = moecore.InvalidArgumentError, moecore.DTypeError

BAD_INPUTS = [
    ("nvfp4-k-not-16", lambda: mf.quantize_nvfp4(X20, 1.0), Err, "multiple of 16"),
    ("nvfp4-gs-zero", lambda: mf.quantize_nvfp4(X32, 0.0), Err, "global_scale finite and > 0"),
    ("nvfp4-gs-negative", lambda: mf.quantize_nvfp4(X32, -2.0), Err, "global_scale"),
    ("nvfp4-gs-nan", lambda: mf.quantize_nvfp4(X32, float("nan")), Err, "global_scale"),
    ("nvfp4-gs-inf", lambda: mf.quantize_nvfp4(X32, float("inf")), Err, "global_scale"),
    ("nvfp4-gs-wrong-len", lambda: mf.quantize_nvfp4(X32, np.ones(3, F32)), Err, "one per leading"),
    ("nvfp4-gs-f64", lambda: mf.quantize_nvfp4(X32, np.ones(2)), DErr, "unsupported dtype"),
    ("nvfp4-x-nan", lambda: mf.quantize_nvfp4(np.full((1, 16), np.nan, F32), 1.0), Err, "finite x"),
    ("nvfp4-x-u8", lambda: mf.quantize_nvfp4(Q16, 1.0), DErr, "f32, f16 or bf16"),
    ("nvfp4-x-list", lambda: mf.quantize_nvfp4([[1.0] * 16], 1.0), DErr, "numpy array"),
    ("nvfp4-deq-scale-u8", lambda: mf.dequantize_nvfp4(Q16, np.zeros((2, 2), np.uint8), 1.0), DErr,
     "fp8_e4m3fn"),
    ("nvfp4-deq-scale-shape", lambda: mf.dequantize_nvfp4(Q16, E4_SCALE[:, :1], 1.0), Err, "K/16"),
    ("nvfp4-deq-scale-nan", lambda: mf.dequantize_nvfp4(
        Q16, np.full((2, 2), 0x7F, np.uint8).view(E4M3), 1.0), Err, "block_scale finite"),
    ("nvfp4-deq-scale-negative", lambda: mf.dequantize_nvfp4(
        Q16, np.full((2, 2), 0xB8, np.uint8).view(E4M3), 1.0), Err, ">= 0"),
    ("nvfp4-deq-gs-zero", lambda: mf.dequantize_nvfp4(Q16, E4_SCALE, 0.0), Err, "global_scale"),
    ("nvfp4-gscale-1d", lambda: mf.nvfp4_global_scales(np.ones(16, F32)), Err, "at least 2"),
    ("mxfp4-k-not-32", lambda: mf.quantize_mxfp4(X20), Err, "multiple of 32"),
    ("mxfp4-bad-rounding", lambda: mf.quantize_mxfp4(X32, "nearest"), Err, "sglang_ceil"),
    ("mxfp4-x-inf", lambda: mf.quantize_mxfp4(np.full((1, 32), np.inf, F32)), Err, "finite"),
    ("mxfp4-deq-0xff", lambda: mf.dequantize_mxfp4(Q16, E8_NAN), Err, "0xFF"),
    ("mxfp4-deq-scale-f32", lambda: mf.dequantize_mxfp4(Q16, np.ones((2, 1), F32)), DErr, "e8m0"),
    ("mxfp4-deq-q-f32", lambda: mf.dequantize_mxfp4(X32, E8_OK), DErr, "fp4_e2m1x2"),
    ("mxfp4-deq-scale-shape", lambda: mf.dequantize_mxfp4(Q16, np.full((2, 2), 127, np.uint8)), Err,
     "K/32"),
    ("mxfp4-deq-leading", lambda: mf.dequantize_mxfp4(Q16, np.full((3, 1), 127, np.uint8)), Err,
     "leading dims"),
    ("mxfp4-deq-out-dtype", lambda: mf.dequantize_mxfp4(Q16, E8_OK, "u8"), DErr, "out_dtype"),
    ("fp8-group-not-multiple", lambda: mf.quantize_fp8_per_token_group(X20, 128), Err,
     "multiple of group_size=128"),
    ("fp8-group-zero", lambda: mf.quantize_fp8_per_token_group(X32, 0), Err, "group_size > 0"),
    ("fp8-eps-zero", lambda: mf.quantize_fp8_per_token(X32, 0.0), Err, "eps"),
    ("fp8-eps-nan", lambda: mf.quantize_fp8_per_tensor(X32, float("nan")), Err, "eps"),
    ("fp8-static-scale-zero", lambda: mf.quantize_fp8_static(X32, 0.0), Err, "scale finite"),
    ("fp8-static-scale-negative", lambda: mf.quantize_fp8_static(X32, -1.0), Err, "scale"),
    ("fp8-static-scale-nan", lambda: mf.quantize_fp8_static(X32, float("nan")), Err, "scale"),
    ("fp8-static-scale-inf", lambda: mf.quantize_fp8_static(X32, float("inf")), Err, "scale"),
    ("fp8-block-1d", lambda: mf.quantize_fp8_block(np.ones(8, F32)), Err, "at least 2"),
    ("fp8-block-zero-block", lambda: mf.quantize_fp8_block(X32, 0, 128), Err, "block_n"),
    ("fp8-deq-block-shape", lambda: mf.dequantize_fp8_block(FP8_Q, np.ones((1, 1), F32), 1, 32),
     Err, r"scale shape \[2, 1\]"),
    ("fp8-deq-block-scale-zero", lambda: mf.dequantize_fp8_block(FP8_Q, np.zeros((1, 1), F32), 128,
                                                                 128), Err, "finite and > 0"),
    ("fp8-deq-row-scale-negative", lambda: mf.dequantize_fp8_per_row(FP8_Q, -np.ones((2, 1), F32)),
     Err, "finite and > 0"),
    ("fp8-deq-row-scale-nan",
     lambda: mf.dequantize_fp8_per_row(FP8_Q, np.full((2, 1), np.nan, F32)), Err, "finite and > 0"),
    ("fp8-deq-q-f32", lambda: mf.dequantize_fp8_per_row(X32, np.ones((2, 1), F32)), DErr, "fp8"),
    ("fp8-deq-tensor-scale-inf", lambda: mf.dequantize_fp8_per_tensor(FP8_Q, float("inf")), Err,
     "scale"),
    ("fp8-encode-bad-dtype", lambda: mf.encode_fp8(X32, "bf16"), DErr, "fp8_e4m3fn or fp8_e5m2"),
    ("int8-deq-q-f32", lambda: mf.dequantize_int8_per_row(X32, np.ones((2, 1), F32)), DErr, "i8"),
    ("int8-deq-scale-zero", lambda: mf.dequantize_int8_per_row(
        np.zeros((2, 4), np.int8), np.zeros((2, 1), F32)), Err, "finite and > 0"),
    ("e2m1-odd", lambda: mf.encode_e2m1(np.ones(3, F32)), Err, "even"),
    ("e2m1-pack-nibble-16", lambda: mf.pack_e2m1(np.array([16, 0], np.uint8)), Err, "0..15"),
    ("ue8m0-not-pow2", lambda: mf.scales_to_e8m0(np.array([3.0], F32)), Err, "powers of two"),
    ("ue8m0-zero", lambda: mf.round_scales_ue8m0(np.array([0.0], F32)), Err, "finite and > 0"),
    ("ue8m0-too-big", lambda: mf.round_scales_ue8m0(np.array([3e38], F32)), Err, "2\\^127"),
    ("ue8m0-unpack-groups", lambda: mf.unpack_ue8m0(np.zeros((1, 2), np.int32), 9), Err, "groups"),
    ("e8m0-to-scales-f32", lambda: mf.e8m0_to_scales(X32), DErr, "e8m0"),
]


@pytest.mark.parametrize("call,exc,pattern", [c[1:] for c in BAD_INPUTS],
                         ids=[c[0] for c in BAD_INPUTS])
def test_bad_input(call, exc, pattern):
    snapshot = [a.copy() for a in (X32, X20, Q16, FP8_Q)]
    with pytest.raises(exc, match=pattern):
        call()
    for before, after in zip(snapshot, (X32, X20, Q16, FP8_Q)):
        assert_bits(after, before, "inputs are never modified")


def test_round_to_helper_agrees_with_bf16_outputs():
    """The reference rounds with moecore.dtypes.round_to; bf16 outputs must decode to it."""
    q, s = mf.quantize_mxfp4(np.linspace(-5, 5, 64, dtype=F32)[None])
    assert_bits(mf.dequantize_mxfp4(q, s, "bf16").astype(F32),
                round_to(mf.dequantize_mxfp4(q, s), "bf16"))
