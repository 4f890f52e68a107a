"""Checks moecore.select_experts (the C++ core through the bindings) against the numpy twin
moecore.reference.routing over a seeded grid of model-family configs, token counts, logits
dtypes, strided layouts and thread counts; also the TopKOutput types, custom routing functions,
padded rows and a bad-input table (exception type and message). Ids exact, weights 1e-6.
"""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest

import moecore
from moecore.reference.routing import select_experts_ref

WEIGHT_ATOL = 1e-6  # TESTING.md routing row: ids exact, weights 1e-6

# (id, E, TopKConfig kwargs; "bias": True adds a random correction_bias). The families:
# Mixtral/Qwen3 softmax, sigmoid routers, DeepSeek-V2 grouped, DeepSeek-V3 biased grouped with a
# fused shared expert and routed scaling, Kimi-K2 (one group), DeepSeek-V4 sqrtsoftplus.
CONFIGS = [
    ("softmax", 8, dict(top_k=2)),
    ("softmax-raw-bias", 16, dict(top_k=3, renormalize=False, bias=True)),
    ("softmax-k-eq-e", 4, dict(top_k=4)),
    ("softmax-shared", 16, dict(top_k=3, num_fused_shared_experts=1, routed_scaling_factor=2.0)),
    ("sigmoid", 32, dict(top_k=4, scoring_func="sigmoid")),
    ("sigmoid-bias-raw", 32, dict(top_k=4, scoring_func="sigmoid", bias=True, renormalize=False)),
    (
        "sqrtsoftplus-dsv4",
        64,
        dict(
            top_k=7,
            scoring_func="sqrtsoftplus",
            bias=True,
            num_fused_shared_experts=1,
            routed_scaling_factor=1.5,
            apply_routed_scaling_factor_on_output=True,
        ),
    ),
    ("grouped-dsv2", 16, dict(top_k=3, use_grouped_topk=True, num_expert_group=4, topk_group=2)),
    (
        "biased-grouped-dsv3",
        64,
        dict(
            top_k=9,
            use_grouped_topk=True,
            num_expert_group=8,
            topk_group=4,
            bias=True,
            num_fused_shared_experts=1,
            routed_scaling_factor=2.5,
            apply_routed_scaling_factor_on_output=True,
        ),
    ),
    (
        "biased-grouped-shared2-fssf",
        32,
        dict(
            top_k=6,
            use_grouped_topk=True,
            num_expert_group=4,
            topk_group=2,
            bias=True,
            num_fused_shared_experts=2,
            routed_scaling_factor=2.0,
            fused_shared_experts_scaling_factor=0.25,
        ),
    ),
    (
        "biased-one-group-kimi",
        48,
        dict(top_k=8, use_grouped_topk=True, num_expert_group=1, topk_group=1, bias=True),
    ),
]
CONFIG_IDS = [c[0] for c in CONFIGS]
CONFIG_BY_ID = {c[0]: c for c in CONFIGS}
NUM_TOKENS = [0, 1, 2, 3, 7, 64, 513]
DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


@pytest.fixture(params=[1, 2], ids=["threads1", "threads2"])
def num_threads(request):
    saved = moecore.get_num_threads()
    moecore.set_num_threads(request.param)
    yield request.param
    moecore.set_num_threads(saved)


def make_case(name, num_experts, config, num_tokens, dtype=np.float32, strided=False):
    """(logits [T, E], kwargs for TopKConfig and select_experts_ref), seeded by the case."""
    rng = np.random.default_rng(zlib.crc32(f"{name}-{num_tokens}-{dtype}-{strided}".encode()))
    kwargs = dict(config)
    width = num_experts + 5 if strided else num_experts
    logits = (rng.standard_normal((num_tokens, width)) * 2.0).astype(dtype)[:, :num_experts]
    if kwargs.pop("bias", False):
        kwargs["correction_bias"] = (rng.standard_normal(num_experts) * 0.1).astype(np.float32)
    return logits, kwargs


def hidden_for(logits):
    return np.zeros((logits.shape[0], 8), np.float32)


def assert_matches_reference(out, want):
    w, ids = out.topk_weights, out.topk_ids
    assert w.dtype == np.float32 and ids.dtype == np.int32
    assert w.shape == want[0].shape and ids.shape == want[1].shape
    np.testing.assert_array_equal(ids, want[1])
    np.testing.assert_allclose(w, want[0], atol=WEIGHT_ATOL, rtol=0)


# ----------------------------------------------------------------------------- grid


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("num_tokens", NUM_TOKENS, ids=[f"T{t}" for t in NUM_TOKENS])
@pytest.mark.parametrize("name,num_experts,config", CONFIGS, ids=CONFIG_IDS)
def test_select_experts_matches_reference(
    name, num_experts, config, num_tokens, dtype, layout, num_threads
):
    logits, kwargs = make_case(
        name, num_experts, config, num_tokens, DTYPES[dtype], layout == "strided"
    )
    if layout == "strided" and num_tokens > 1:
        assert not logits.flags.c_contiguous
    out = moecore.select_experts(hidden_for(logits), logits, moecore.TopKConfig(**kwargs))
    assert_matches_reference(out, select_experts_ref(logits, **kwargs))


@pytest.mark.parametrize("non_padded", [0, 4, 7])
@pytest.mark.parametrize("name,num_experts,config", CONFIGS, ids=CONFIG_IDS)
def test_padded_rows(name, num_experts, config, non_padded):
    logits, kwargs = make_case(name, num_experts, config, 7)
    logits[non_padded:] = np.nan  # padded rows are never read
    out = moecore.select_experts(
        hidden_for(logits), logits, moecore.TopKConfig(**kwargs), num_token_non_padded=non_padded
    )
    want = select_experts_ref(logits, num_token_non_padded=non_padded, **kwargs)
    assert_matches_reference(out, want)
    assert (out.topk_ids[non_padded:] == -1).all() and (out.topk_weights[non_padded:] == 0).all()


@pytest.mark.parametrize("name,num_experts,config", CONFIGS, ids=CONFIG_IDS)
def test_ties_on_coarse_bf16_logits(name, num_experts, config):
    rng = np.random.default_rng(11)
    logits = (rng.integers(-2, 3, size=(64, num_experts)) * 0.5).astype(ml_dtypes.bfloat16)
    kwargs = dict(config)
    if kwargs.pop("bias", False):
        kwargs["correction_bias"] = (rng.integers(0, 2, size=num_experts) * 0.25).astype(
            np.float32
        )
    out = moecore.select_experts(hidden_for(logits), logits, moecore.TopKConfig(**kwargs))
    assert_matches_reference(out, select_experts_ref(logits, **kwargs))


def test_all_equal_logits_pick_lowest_ids():
    logits = np.zeros((3, 6), np.float32)
    out = moecore.select_experts(None, logits, moecore.TopKConfig(top_k=3))
    np.testing.assert_array_equal(out.topk_ids, [[0, 1, 2]] * 3)


def test_bitwise_across_thread_counts_and_batches():
    logits, kwargs = make_case(*CONFIG_BY_ID["biased-grouped-dsv3"], 64)
    config = moecore.TopKConfig(**kwargs)
    saved = moecore.get_num_threads()
    try:
        results = []
        for n in (1, 2, 3):
            moecore.set_num_threads(n)
            results.append(moecore.select_experts(hidden_for(logits), logits, config))
    finally:
        moecore.set_num_threads(saved)
    for out in results[1:]:
        np.testing.assert_array_equal(out.topk_ids, results[0].topk_ids)
        assert out.topk_weights.tobytes() == results[0].topk_weights.tobytes()
    alone = moecore.select_experts(hidden_for(logits[5:6]), logits[5:6].copy(), config)
    np.testing.assert_array_equal(alone.topk_ids, results[0].topk_ids[5:6])
    assert alone.topk_weights.tobytes() == results[0].topk_weights[5:6].tobytes()


# ----------------------------------------------------------------------------- output types


def test_standard_output_is_a_triple():
    logits, kwargs = make_case("triple", 8, dict(top_k=2), 5)
    out = moecore.select_experts(hidden_for(logits), logits, moecore.TopKConfig(**kwargs))
    w, ids, router_logits = out
    assert len(out) == 3
    np.testing.assert_array_equal(w, out.topk_weights)
    np.testing.assert_array_equal(ids, out.topk_ids)
    assert np.shares_memory(router_logits, logits)
    assert out.format == moecore.TopKOutputFormat.STANDARD


def test_bypassed_to_standard_equals_select_experts():
    logits, kwargs = make_case(*CONFIG_BY_ID["biased-grouped-dsv3"], 9)
    config = moecore.TopKConfig(**kwargs)
    bypassed = moecore.BypassedTopKOutput(hidden_for(logits), logits, config)
    assert bypassed.format == moecore.TopKOutputFormat.BYPASSED
    got = bypassed.to_standard()
    want = moecore.select_experts(hidden_for(logits), logits, config)
    np.testing.assert_array_equal(got.topk_ids, want.topk_ids)
    np.testing.assert_array_equal(got.topk_weights, want.topk_weights)


def test_custom_routing_function_outputs_are_copied():
    calls = []

    def router(hidden_states, gating_output, topk, renormalize):
        calls.append((hidden_states.shape, gating_output.shape, topk, renormalize))
        w = np.array([[0.7, 0.3], [0.6, 0.4], [1.0, 0.0]], np.float32)
        ids = np.array([[1, 0], [3, 2], [0, 1]], np.int32)
        return w, ids

    config = moecore.TopKConfig(top_k=2, renormalize=False, custom_routing_function=router)
    logits = np.zeros((3, 4), np.float32)
    out = moecore.select_experts(hidden_for(logits), logits, config, num_token_non_padded=2)
    assert calls == [((3, 8), (3, 4), 2, False)]
    np.testing.assert_array_equal(out.topk_ids, [[1, 0], [3, 2], [-1, -1]])
    want_w = np.array([[0.7, 0.3], [0.6, 0.4], [0.0, 0.0]], np.float32)
    np.testing.assert_array_equal(out.topk_weights, want_w)


# ----------------------------------------------------------------------------- bad input


def _route(logits, num_token_non_padded=None, hidden=None, **config):
    hidden = hidden_for(logits) if hidden is None else hidden
    moecore.select_experts(
        hidden, logits, moecore.TopKConfig(**config), num_token_non_padded=num_token_non_padded
    )


def _custom(w, ids, **extra):
    return dict(top_k=2, custom_routing_function=lambda *args: (w, ids), **extra)


def _logits(value=None, at=(1, 2), dtype=np.float32, shape=(4, 8)):
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    if value is not None:
        x[at] = value
    return x


_L = _logits()
BAD_INPUTS = [
    ("k0", lambda: _route(_L, top_k=0), ValueError, r"top_k >= 1, got 0"),
    ("k-gt-e", lambda: _route(_L, top_k=9), ValueError, r"routed top-k .* in \[1, 8\].*got 9"),
    (
        "shared-leaves-no-routed",
        lambda: _route(_L, top_k=1, num_fused_shared_experts=1),
        ValueError,
        r"in \[1, 8\].*got 0",
    ),
    (
        "groups-not-dividing",
        lambda: _route(_L, top_k=2, use_grouped_topk=True, num_expert_group=3, topk_group=1),
        ValueError,
        r"num_expert_group to divide E = 8, got num_expert_group=3",
    ),
    (
        "groups-missing",
        lambda: _route(_L, top_k=2, use_grouped_topk=True),
        ValueError,
        r"got num_expert_group=None, topk_group=None",
    ),
    (
        "topk-group-gt-groups",
        lambda: _route(_L, top_k=2, use_grouped_topk=True, num_expert_group=4, topk_group=5),
        ValueError,
        r"topk_group in \[1, num_expert_group = 4\], got 5",
    ),
    (
        "k-gt-kept-experts",
        lambda: _route(_L, top_k=5, use_grouped_topk=True, num_expert_group=4, topk_group=2),
        ValueError,
        r"routed top-k <= topk_group \* experts per group = 2 \* 2, got 5",
    ),
    (
        "bias-wrong-shape",
        lambda: _route(_L, top_k=2, correction_bias=np.zeros(7, np.float32)),
        ValueError,
        r"correction_bias of shape \[8\], got \[7\] f32",
    ),
    (
        "bias-wrong-dtype",
        lambda: _route(_L, top_k=2, correction_bias=np.zeros(8, ml_dtypes.bfloat16)),
        TypeError,
        r"correction_bias of dtype f32, got \[8\] bf16",
    ),
    (
        "bias-nan",
        lambda: _route(_L, top_k=2, correction_bias=np.full(8, np.nan, np.float32)),
        ValueError,
        r"finite correction_bias, got nan at \[0\]",
    ),
    (
        "rsf-zero",
        lambda: _route(_L, top_k=2, routed_scaling_factor=0.0),
        ValueError,
        r"routed_scaling_factor finite and > 0, got 0",
    ),
    (
        "scale-without-rsf",
        lambda: _route(_L, top_k=2, apply_routed_scaling_factor_on_output=True),
        ValueError,
        r"routed_scaling_factor with apply_routed_scaling_factor_on_output=True, got None",
    ),
    (
        "logits-nan",
        lambda: _route(_logits(np.nan), top_k=2),
        ValueError,
        r"finite router_logits, got nan at \[1, 2\]",
    ),
    (
        "logits-inf-bf16",
        lambda: _route(_logits(np.inf, at=(3, 0), dtype=ml_dtypes.bfloat16), top_k=2),
        ValueError,
        r"finite router_logits, got inf at \[3, 0\]",
    ),
    (
        "logits-i32",
        lambda: _route(np.zeros((4, 8), np.int32), top_k=2),
        TypeError,
        r"router_logits of dtype f32, f16 or bf16, got \[4, 8\] i32",
    ),
    (
        "logits-1d",
        lambda: _route(np.zeros(8, np.float32), top_k=2, hidden=np.zeros((1, 8), np.float32)),
        ValueError,
        r"router_logits of rank 2 \[T, E\], got \[8\] f32",
    ),
    (
        "hidden-rows-mismatch",
        lambda: _route(_L, top_k=2, hidden=np.zeros((3, 8), np.float32)),
        ValueError,
        r"hidden_states with T = 4 rows",
    ),
    (
        "non-padded-gt-t",
        lambda: _route(_L, num_token_non_padded=5, top_k=2),
        ValueError,
        r"num_token_non_padded in \[0, T = 4\], got 5",
    ),
    (
        "non-padded-negative",
        lambda: _route(_L, num_token_non_padded=-1, top_k=2),
        ValueError,
        r"num_token_non_padded in \[0, T = 4\], got -1",
    ),
    (
        "custom-id-out-of-range",
        lambda: _route(
            _L, **_custom(np.zeros((4, 2), np.float32), np.full((4, 2), 8, np.int32))
        ),
        IndexError,
        r"custom_routing_function topk_ids in \[0, 8\), got 8 at \[0, 0\]",
    ),
    (
        "custom-weights-dtype",
        lambda: _route(_L, **_custom(np.zeros((4, 2), np.float16), np.zeros((4, 2), np.int32))),
        TypeError,
        r"custom_routing_function topk_weights of dtype f32, got \[4, 2\] f16",
    ),
    (
        "custom-shape",
        lambda: _route(_L, **_custom(np.zeros((4, 3), np.float32), np.zeros((4, 2), np.int32))),
        ValueError,
        r"topk_weights of shape \[4, 2\], got \[4, 3\] f32",
    ),
    (
        "custom-with-output-scaling",
        lambda: _route(
            _L,
            **_custom(
                np.zeros((4, 2), np.float32),
                np.zeros((4, 2), np.int32),
                routed_scaling_factor=2.0,
                apply_routed_scaling_factor_on_output=True,
            ),
        ),
        NotImplementedError,
        r"apply_routed_scaling_factor_on_output=False with a custom_routing_function",
    ),
]


@pytest.mark.parametrize(
    "call,exc_type,pattern", [b[1:] for b in BAD_INPUTS], ids=[b[0] for b in BAD_INPUTS]
)
def test_bad_input(call, exc_type, pattern):
    with pytest.raises(exc_type, match=r"^select_experts: expected .*" + pattern) as info:
        call()
    assert isinstance(info.value, moecore.MoecoreError)
