"""Checks moecore.reference.routing (numpy) against an independent torch routing written here.

The torch version follows sglang's topk.py structure (group masks, gather, scatter) in its own
code; both compute scores in float64 rounded to float32, so ids must match exactly and weights
to 1e-6. Runs without the compiled extension: the reference module is loaded by file path.
"""

from __future__ import annotations

import importlib.util
import math
import pathlib
import zlib

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F

WEIGHT_ATOL = 1e-6  # TESTING.md routing row: ids exact, weights 1e-6

_REF_PATH = pathlib.Path(__file__).resolve().parents[1] / "python/moecore/reference/routing.py"
_spec = importlib.util.spec_from_file_location("moecore_reference_routing", _REF_PATH)
routing_ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(routing_ref)
select_experts_ref = routing_ref.select_experts_ref


# ----------------------------------------------------------------------------- torch twin


def _torch_scores(x: torch.Tensor, scoring_func: str) -> torch.Tensor:
    x64 = x.double()
    if scoring_func == "softmax":
        s = torch.softmax(x64, dim=-1)
    elif scoring_func == "sigmoid":
        s = torch.sigmoid(x64)
    else:
        s = F.softplus(x64).sqrt()
    return s.float()


def _torch_desc(keys: torch.Tensor, k: int) -> torch.Tensor:
    # A stable descending sort keeps equal keys in index order: ties go to the lower index.
    return torch.sort(keys, dim=-1, descending=True, stable=True).indices[:, :k]


def torch_select_experts(
    logits,
    *,
    top_k,
    use_grouped_topk=False,
    topk_group=None,
    num_expert_group=None,
    renormalize=True,
    num_fused_shared_experts=0,
    correction_bias=None,
    routed_scaling_factor=None,
    apply_routed_scaling_factor_on_output=False,
    fused_shared_experts_scaling_factor=None,
    scoring_func="softmax",
    num_token_non_padded=None,
):
    x = torch.from_numpy(np.asarray(logits).astype(np.float32))
    num_tokens, num_experts = x.shape
    routed_k = top_k - num_fused_shared_experts
    bias = None if correction_bias is None else torch.from_numpy(correction_bias)
    if use_grouped_topk:
        per_group = num_experts // num_expert_group
        if bias is None:  # sglang grouped_topk: softmax, group score = max
            scores = _torch_scores(x, "softmax")
            choice = scores
            group_scores = choice.view(num_tokens, num_expert_group, per_group).max(dim=-1).values
        else:  # sglang biased_grouped_topk: sigmoid, group score = top-2 sum
            scores = _torch_scores(x, "sigmoid")
            choice = scores + bias.unsqueeze(0)
            grouped = choice.view(num_tokens, num_expert_group, per_group)
            group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
        group_idx = _torch_desc(group_scores, topk_group)
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1.0)
        expert_mask = (
            group_mask.unsqueeze(-1)
            .expand(num_tokens, num_expert_group, per_group)
            .reshape(num_tokens, num_experts)
            .bool()
        )
        choice = choice.masked_fill(~expert_mask, float("-inf"))
    else:
        scores = _torch_scores(x, scoring_func)
        choice = scores if bias is None else scores + bias.unsqueeze(0)
    ids = _torch_desc(choice, routed_k)
    w = scores.gather(1, ids)
    routed_sum = w.sum(dim=-1, keepdim=True)
    rsf = 1.0 if routed_scaling_factor is None else routed_scaling_factor
    shared_ids = num_experts + torch.arange(num_fused_shared_experts)
    ids = torch.cat([ids, shared_ids.expand(num_tokens, -1)], dim=-1)
    w = torch.cat([w, (routed_sum / rsf).expand(-1, num_fused_shared_experts)], dim=-1)
    if renormalize:
        w = w / torch.where(routed_sum > 0, routed_sum, torch.ones_like(routed_sum))
        if apply_routed_scaling_factor_on_output:
            w = w * rsf
    if fused_shared_experts_scaling_factor is not None:
        w[:, routed_k:] *= fused_shared_experts_scaling_factor
    if num_token_non_padded is not None:
        ids[num_token_non_padded:] = -1
        w[num_token_non_padded:] = 0.0
    return w.float().numpy(), ids.int().numpy()


# ----------------------------------------------------------------------------- cases

# (id, E, config). Configs mirror the model families: Mixtral/Qwen3 (softmax), Llama4-style
# sigmoid, DeepSeek-V2 (grouped), DeepSeek-V3 (biased grouped + shared + scaling), Kimi-K2
# (one group), DeepSeek-V4 (sqrtsoftplus with bias).
CASES = [
    ("softmax-renorm", 8, dict(top_k=2)),
    ("softmax-raw", 16, dict(top_k=4, renormalize=False)),
    ("softmax-bias", 16, dict(top_k=3, bias=True)),
    ("softmax-k-eq-e", 4, dict(top_k=4)),
    ("softmax-shared", 16, dict(top_k=3, num_fused_shared_experts=1, routed_scaling_factor=2.0)),
    ("sigmoid-renorm", 8, dict(top_k=2, scoring_func="sigmoid")),
    ("sigmoid-bias-raw", 32, dict(top_k=4, scoring_func="sigmoid", bias=True, renormalize=False)),
    ("sqrtsoftplus-bias", 32, dict(top_k=6, scoring_func="sqrtsoftplus", bias=True)),
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
        "grouped-shared",
        16,
        dict(
            top_k=4,
            use_grouped_topk=True,
            num_expert_group=8,
            topk_group=3,
            num_fused_shared_experts=1,
            routed_scaling_factor=2.5,
        ),
    ),
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
        "biased-grouped-raw-scale",
        32,
        dict(
            top_k=4,
            use_grouped_topk=True,
            num_expert_group=4,
            topk_group=2,
            bias=True,
            renormalize=False,
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

DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


def make_inputs(rng, num_tokens, num_experts, config, dtype=np.float32, scale=2.0):
    config = dict(config)
    logits = (rng.standard_normal((num_tokens, num_experts)) * scale).astype(dtype)
    if config.pop("bias", False):
        config["correction_bias"] = (rng.standard_normal(num_experts) * 0.1).astype(np.float32)
    return logits, config


def assert_routing_equal(got, want):
    w_got, ids_got = got
    w_want, ids_want = want
    assert w_got.dtype == np.float32 and ids_got.dtype == np.int32
    np.testing.assert_array_equal(ids_got, ids_want)
    np.testing.assert_allclose(w_got, w_want, atol=WEIGHT_ATOL, rtol=0)


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("num_tokens", [0, 1, 3, 64])
@pytest.mark.parametrize("name,num_experts,config", CASES, ids=[c[0] for c in CASES])
def test_reference_matches_torch(name, num_experts, config, num_tokens, dtype):
    rng = np.random.default_rng(zlib.crc32(f"{name}-{num_tokens}-{dtype}".encode()))
    logits, kwargs = make_inputs(rng, num_tokens, num_experts, config, DTYPES[dtype])
    want = torch_select_experts(logits, **kwargs)
    assert_routing_equal(select_experts_ref(logits, **kwargs), want)


@pytest.mark.parametrize("name,num_experts,config", CASES, ids=[c[0] for c in CASES])
def test_reference_padded_rows(name, num_experts, config):
    rng = np.random.default_rng(7)
    logits, kwargs = make_inputs(rng, 9, num_experts, config)
    logits[6:] = np.nan  # padded rows are never read
    got = select_experts_ref(logits, num_token_non_padded=6, **kwargs)
    want = torch_select_experts(np.nan_to_num(logits), num_token_non_padded=6, **kwargs)
    assert_routing_equal(got, want)
    assert (got[1][6:] == -1).all() and (got[0][6:] == 0).all()


@pytest.mark.parametrize("name,num_experts,config", CASES, ids=[c[0] for c in CASES])
def test_reference_ties_on_coarse_logits(name, num_experts, config):
    # bf16 logits drawn from 5 values: most rows have ties at the top-k boundary and inside it.
    rng = np.random.default_rng(11)
    logits = (rng.integers(-2, 3, size=(64, num_experts)) * 0.5).astype(ml_dtypes.bfloat16)
    kwargs = dict(config)
    if kwargs.pop("bias", False):
        kwargs["correction_bias"] = (rng.integers(0, 2, size=num_experts) * 0.25).astype(
            np.float32
        )
    assert_routing_equal(
        select_experts_ref(logits, **kwargs), torch_select_experts(logits, **kwargs)
    )


@pytest.mark.parametrize("scoring_func", ["softmax", "sigmoid", "sqrtsoftplus"])
def test_all_equal_logits_pick_lowest_ids(scoring_func):
    w, ids = select_experts_ref(np.zeros((2, 6), np.float32), top_k=3, scoring_func=scoring_func)
    np.testing.assert_array_equal(ids, [[0, 1, 2], [0, 1, 2]])
    np.testing.assert_allclose(w, np.full((2, 3), 1 / 3), atol=WEIGHT_ATOL)


def test_all_equal_groups_pick_lowest_groups():
    _, ids = select_experts_ref(
        np.zeros((1, 8), np.float32),
        top_k=3,
        use_grouped_topk=True,
        num_expert_group=4,
        topk_group=2,
        correction_bias=np.zeros(8, np.float32),
    )
    np.testing.assert_array_equal(ids, [[0, 1, 2]])


def test_softmax_hand_values():
    logits = np.log(np.array([[1.0, 2.0, 3.0, 4.0]], np.float32))  # softmax = [.1, .2, .3, .4]
    w, ids = select_experts_ref(logits, top_k=2, renormalize=False)
    np.testing.assert_array_equal(ids, [[3, 2]])
    np.testing.assert_allclose(w, [[0.4, 0.3]], atol=WEIGHT_ATOL)
    w, _ = select_experts_ref(logits, top_k=2)
    np.testing.assert_allclose(w, [[4 / 7, 3 / 7]], atol=WEIGHT_ATOL)


def test_bias_chooses_but_does_not_weigh():
    logits = np.array([[2.0, 1.0, 0.0, -1.0]], np.float32)
    bias = np.array([0.0, 0.0, 0.0, 10.0], np.float32)
    w, ids = select_experts_ref(
        logits, top_k=2, scoring_func="sigmoid", correction_bias=bias, renormalize=False
    )
    np.testing.assert_array_equal(ids, [[3, 0]])
    sig = 1 / (1 + np.exp(-np.array([-1.0, 2.0])))
    np.testing.assert_allclose(w, [sig], atol=WEIGHT_ATOL)


def test_sqrtsoftplus_values_and_no_overflow():
    logits = np.array([[0.0, 100.0, -100.0, 3.0e4]], np.float32)
    scores = routing_ref.compute_scores_ref(logits, "sqrtsoftplus")
    want = [math.sqrt(math.log(2.0)), 10.0, math.sqrt(math.exp(-100.0)), math.sqrt(3.0e4)]
    np.testing.assert_allclose(scores[0], want, rtol=1e-7)


def test_grouped_keeps_best_groups_not_best_experts():
    # Group scores (max): g0 = p(9), g1 = p(8), g2 = p(0.5); the second best expert overall
    # (8.5, in g0) is chosen; g2's experts are not although 0.5 beats g1's remaining 0.
    logits = np.array([[9.0, 8.5, 8.0, 0.0, 0.5, 0.4]], np.float32)
    _, ids = select_experts_ref(
        logits, top_k=3, use_grouped_topk=True, num_expert_group=3, topk_group=2
    )
    np.testing.assert_array_equal(ids, [[0, 1, 2]])
    _, ids = select_experts_ref(
        logits, top_k=4, use_grouped_topk=True, num_expert_group=3, topk_group=2
    )
    np.testing.assert_array_equal(ids, [[0, 1, 2, 3]])


def test_biased_group_score_is_top2_sum():
    # Group 0 has the single best expert but group 1 the best pair.
    logits = np.array([[4.0, -4.0, 2.0, 2.0]], np.float32)
    _, ids = select_experts_ref(
        logits,
        top_k=1,
        use_grouped_topk=True,
        num_expert_group=2,
        topk_group=1,
        correction_bias=np.zeros(4, np.float32),
    )
    np.testing.assert_array_equal(ids, [[2]])


def test_grouped_never_picks_dropped_group_on_underflow():
    # Softmax underflows to 0 for every expert but one; the second pick must still come from a
    # kept group (sglang's masked_fill(0) would tie it with dropped experts).
    logits = np.array([[-1000.0, -1000.0, 1000.0, -1000.0]], np.float32)
    _, ids = select_experts_ref(
        logits, top_k=2, use_grouped_topk=True, num_expert_group=2, topk_group=1
    )
    np.testing.assert_array_equal(ids, [[2, 3]])


@pytest.mark.parametrize("apply_on_output", [False, True], ids=["renorm", "renorm-scaled"])
def test_shared_expert_weight(apply_on_output):
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((5, 16)).astype(np.float32)
    w, ids = select_experts_ref(
        logits,
        top_k=4,
        num_fused_shared_experts=2,
        routed_scaling_factor=2.5,
        apply_routed_scaling_factor_on_output=apply_on_output,
        scoring_func="sigmoid",
    )
    np.testing.assert_array_equal(ids[:, 2:], [[16, 17]] * 5)
    want_shared = 1.0 if apply_on_output else 1 / 2.5
    np.testing.assert_allclose(w[:, 2:], want_shared, atol=WEIGHT_ATOL)
    np.testing.assert_allclose(w[:, :2].sum(-1), 2.5 if apply_on_output else 1.0, atol=1e-5)


def test_shared_expert_weight_without_renormalize():
    logits = np.array([[0.0, 1.0, 2.0]], np.float32)
    w, ids = select_experts_ref(
        logits, top_k=3, num_fused_shared_experts=1, routed_scaling_factor=2.0, renormalize=False
    )
    p = np.exp([2.0, 1.0]) / np.exp([0.0, 1.0, 2.0]).sum()
    np.testing.assert_array_equal(ids, [[2, 1, 3]])
    np.testing.assert_allclose(w, [[p[0], p[1], p.sum() / 2.0]], atol=WEIGHT_ATOL)


def test_zero_routed_sum_gives_zero_weights():
    w, _ = select_experts_ref(np.full((1, 4), -200.0, np.float32), top_k=2, scoring_func="sigmoid")
    np.testing.assert_array_equal(w, [[0.0, 0.0]])


@pytest.mark.parametrize(
    "scoring_func,bias",
    [("softmax", False), ("sigmoid", False), ("sigmoid", True), ("sqrtsoftplus", True)],
    ids=["softmax", "sigmoid", "sigmoid-bias", "sqrtsoftplus-bias"],
)
def test_close_to_sglang_fp32_math(scoring_func, bias):
    # sglang computes scores in fp32 (torch.softmax / sigmoid / softplus on float32); moecore's
    # float64-then-round scores must stay within the routing tolerance of those.
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((256, 32)).astype(np.float32)
    b = (rng.standard_normal(32) * 0.1).astype(np.float32) if bias else None
    x = torch.from_numpy(logits)
    if scoring_func == "softmax":
        scores = torch.softmax(x, dim=-1)
    elif scoring_func == "sigmoid":
        scores = torch.sigmoid(x)
    else:
        scores = F.softplus(x).sqrt()
    choice = scores if b is None else scores + torch.from_numpy(b)
    ids = torch.topk(choice, 4, dim=-1, sorted=True).indices
    w = scores.gather(1, ids)
    w = w / w.sum(dim=-1, keepdim=True)
    got_w, got_ids = select_experts_ref(
        logits, top_k=4, scoring_func=scoring_func, correction_bias=b
    )
    np.testing.assert_array_equal(got_ids, ids.numpy())
    np.testing.assert_allclose(got_w, w.numpy(), atol=WEIGHT_ATOL, rtol=0)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_logits_rejected(bad):
    logits = np.zeros((3, 4), np.float32)
    logits[1, 2] = bad
    with pytest.raises(ValueError, match="finite router_logits"):
        select_experts_ref(logits, top_k=2)
    w, ids = select_experts_ref(logits, top_k=2, num_token_non_padded=1)
    assert (ids[1:] == -1).all() and np.isfinite(w).all()


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        (dict(top_k=0), "top_k >= 1"),
        (dict(top_k=5), r"routed top-k in \[1, 4\]"),
        (dict(top_k=2, num_fused_shared_experts=2), r"routed top-k in \[1, 4\]"),
        (dict(top_k=2, num_token_non_padded=4), r"num_token_non_padded in \[0, 3\]"),
        (dict(top_k=2, scoring_func="relu"), "scoring_func"),
        (dict(top_k=2, correction_bias=np.zeros(3, np.float32)), "correction_bias of shape"),
        (dict(top_k=2, correction_bias=np.zeros(4, np.float64)), "correction_bias of dtype"),
        (dict(top_k=2, routed_scaling_factor=0.0), "routed_scaling_factor finite and > 0"),
        (dict(top_k=2, apply_routed_scaling_factor_on_output=True), "routed_scaling_factor with"),
        (
            dict(top_k=2, use_grouped_topk=True, num_expert_group=3, topk_group=1),
            "num_expert_group to divide E",
        ),
        (
            dict(top_k=3, use_grouped_topk=True, num_expert_group=4, topk_group=1),
            "routed top-k <= topk_group",
        ),
    ],
    ids=[
        "k0",
        "k-gt-e",
        "all-shared",
        "non-padded-gt-t",
        "bad-scoring",
        "bias-shape",
        "bias-dtype",
        "rsf-zero",
        "scale-without-rsf",
        "groups-not-dividing",
        "k-gt-kept-experts",
    ],
)
def test_reference_rejects_bad_config(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        select_experts_ref(np.zeros((3, 4), np.float32), **kwargs)
