"""The QuantInfo payloads check their fields' dtypes at construction (DTypeError naming the
field), accept the storage dtypes sglang uses (packed FP4 and E8M0 as uint8), and show them in
their repr."""

import ml_dtypes
import numpy as np
import pytest

import moecore

F32, BF16, U8 = np.float32, ml_dtypes.bfloat16, np.uint8
FP8 = ml_dtypes.float8_e4m3fn


def _deep_gemm(**over):
    kw = dict(w13_weight=np.zeros((2, 256, 128), FP8), w2_weight=np.zeros((2, 128, 128), FP8),
              use_fp8=True, w13_scale=np.ones((2, 2, 1), F32), w2_scale=np.ones((2, 1, 1), F32))
    kw.update(over)
    return moecore.DeepGemmMoeQuantInfo(**kw)


def _cutedsl(**over):
    kw = dict(w13_weight=np.zeros((2, 128, 32), U8), w2_weight=np.zeros((2, 64, 32), U8),
              w13_weight_sf=np.zeros((2, 128, 4), U8), w2_weight_sf=np.zeros((2, 128, 4), U8),
              w1_alpha=np.ones(2, F32), w2_alpha=np.ones(2, F32), a1_scale=np.ones(1, F32),
              a2_scale=np.ones(1, F32))
    kw.update(over)
    return moecore.CuteDslFp4MoeQuantInfo(**kw)


def _mxfp4(**over):
    kw = dict(w13_weight=np.zeros((2, 256, 64), U8), w2_weight=np.zeros((2, 128, 64), U8),
              w13_weight_scale=np.zeros((2, 256, 4), U8), w2_weight_scale=np.zeros((2, 128, 4), U8),
              w13_bias=np.zeros((2, 256), BF16), w2_bias=np.zeros((2, 128), BF16))
    kw.update(over)
    return moecore.FlashInferMxfp4CutlassMoeQuantInfo(**kw)


GOOD = [
    pytest.param(_deep_gemm, id="deep_gemm-fp8"),
    pytest.param(lambda: _deep_gemm(w13_weight=np.zeros((2, 256, 128), BF16),
                                    w2_weight=np.zeros((2, 128, 128), BF16), use_fp8=False,
                                    w13_scale=None, w2_scale=None), id="deep_gemm-bf16"),
    pytest.param(_cutedsl, id="cutedsl"),
    pytest.param(_mxfp4, id="mxfp4"),
]


@pytest.mark.parametrize("make", GOOD)
def test_valid_payloads_build_and_describe_themselves(make):
    info = make()
    text = repr(info)
    assert text.startswith(type(info).__name__ + "(") and "w13_weight=[2, " in text


BAD = [
    pytest.param(lambda: _deep_gemm(w13_weight=np.zeros((2, 256, 128), BF16)), "w13_weight must be fp8_e4m3fn", id="deep_gemm-bf16-weights-with-fp8"),
    pytest.param(lambda: _deep_gemm(w2_scale=np.ones((2, 1, 1), np.float16)), "w2_scale must be f32", id="deep_gemm-f16-scale"),
    pytest.param(lambda: _deep_gemm(use_fp8=False, w13_scale=None, w2_scale=None), "w13_weight must be bf16", id="deep_gemm-fp8-weights-without-fp8"),
    pytest.param(lambda: _cutedsl(w13_weight=np.zeros((2, 128, 32), np.int32)), "w13_weight must be u8 or fp4_e2m1x2", id="cutedsl-int32-weights"),
    pytest.param(lambda: _cutedsl(w1_alpha=np.ones(2, np.float16)), "w1_alpha must be f32", id="cutedsl-f16-alpha"),
    pytest.param(lambda: _cutedsl(a2_scale=np.ones(1, BF16)), "a2_scale must be f32", id="cutedsl-bf16-a2-scale"),
    pytest.param(lambda: _mxfp4(w13_weight_scale=np.zeros((2, 256, 4), F32)), "w13_weight_scale must be u8 or e8m0", id="mxfp4-f32-scales"),
    pytest.param(lambda: _mxfp4(w2_bias=np.zeros((2, 128), F32)), "w2_bias must be bf16", id="mxfp4-f32-bias"),
    pytest.param(lambda: _mxfp4(swiglu_alpha=np.ones(2, BF16), swiglu_beta=np.ones(2, F32), swiglu_limit=np.ones(2, F32)), "swiglu_alpha must be f32", id="mxfp4-bf16-alpha"),
]


@pytest.mark.parametrize("make, message", BAD)
def test_field_dtypes_are_checked_at_construction(make, message):
    with pytest.raises(moecore.DTypeError, match=message):
        make()
