"""Model-level MoE blocks: moecore.FusedMoE vs the `transformers` eager blocks of Mixtral
(MixtralSparseMoeBlock), Qwen3-MoE (Qwen3MoeSparseMoeBlock, norm_topk_prob both ways) and
DeepSeek-V3 (DeepseekV3MoE: grouped sigmoid routing, random non-zero e_score_correction_bias,
routed_scaling_factor 2.5, one shared expert), built from tiny random fp32 configs.

Oracle: transformers (eager). The block's fused 3-D expert parameters (gate_up_proj [E, 2I, H],
down_proj [E, H, I]) are loaded per expert through FusedMoE.weight_loader (w1/w3/w2 shards);
the block's router logits go through moecore's routing; ids are compared exactly with the HF
router's choice, weights to the routing tolerance, outputs with the "f32" row. DeepSeek-V3's
shared expert runs either in numpy (float64) next to moecore's routed experts, or inside
moecore as a fused shared expert (num_fused_shared_experts=1). The numpy layer reference
(moe_layer_ref, contract "exact") is checked against the same blocks.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import moecore  # noqa: E402
from moecore.reference import moe_layer_ref  # noqa: E402
from moecore.testing import assert_close  # noqa: E402
from moecore.testing.params import runner_backends  # noqa: E402

from transformers.models.deepseek_v3.configuration_deepseek_v3 import (  # noqa: E402
    DeepseekV3Config,
)
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE  # noqa: E402
from transformers.models.mixtral.configuration_mixtral import MixtralConfig  # noqa: E402
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock  # noqa: E402
from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig  # noqa: E402
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock  # noqa: E402

BACKENDS = runner_backends()
BATCH, SEQ = 3, 7  # 21 tokens


def _eager(config):
    config._experts_implementation = "eager"  # the per-expert loop, no grouped_mm kernels
    return config


def _init_random(module: torch.nn.Module, seed: int, gate_std: float = 1.0):
    """N(0, 1/fan_in) weights (fan_in = last dim) so activations stay O(1); the router gets
    gate_std/√H so logits spread (distinct top-k, no ties)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            std = (gate_std if name.startswith("gate.") else 1.0) / np.sqrt(p.shape[-1])
            p.normal_(0.0, std)


def _np(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.detach().to(torch.float32).numpy())


def _hf_forward(block, x: torch.Tensor):
    """(output [T, H], router_logits [T, E], topk weights [T, k], topk ids [T, k])."""
    with torch.no_grad():
        out = block(x.view(BATCH, SEQ, -1)).reshape(x.shape)
        logits, weights, ids = block.gate(x)
    return _np(out), _np(logits), _np(weights), ids.numpy().astype(np.int64)


def _expert_weights(experts):
    """HF fused expert parameters → (w13 [E, 2I, H], w2 [E, H, I]) numpy f32, gate rows first."""
    return _np(experts.gate_up_proj), _np(experts.down_proj)


def _load_experts(layer, w13, w2, first_id: int = 0):
    """Loads experts through the checkpoint loader: w1 = gate rows, w3 = up rows, w2 = down."""
    inter = w13.shape[1] // 2
    for e in range(w13.shape[0]):
        g = first_id + e
        layer.weight_loader("w13_weight", np.ascontiguousarray(w13[e, :inter]),
                            f"experts.{g}.w1.weight", "w1", g)
        layer.weight_loader("w13_weight", np.ascontiguousarray(w13[e, inter:]),
                            f"experts.{g}.w3.weight", "w3", g)
        layer.weight_loader("w2_weight", np.ascontiguousarray(w2[e]),
                            f"experts.{g}.w2.weight", "w2", g)


def _make_layer(backend, num_experts, hidden, inter, topk_config, runner_config=None):
    return moecore.FusedMoE(num_experts=num_experts, hidden_size=hidden, intermediate_size=inter,
                            topk_config=topk_config, params_dtype="f32", with_bias=False,
                            runner_config=runner_config or moecore.MoeRunnerConfig(inplace=False),
                            runner_backend=backend)


def _check_loaded(layer, w13, w2, first_id=0):
    """The loader placed gate rows first and up rows second, exactly."""
    n = w13.shape[0]
    np.testing.assert_array_equal(layer.parameter("w13_weight")[first_id:first_id + n], w13)
    np.testing.assert_array_equal(layer.parameter("w2_weight")[first_id:first_id + n], w2)


def _sorted_by_id(weights, ids):
    order = np.argsort(ids, axis=1, kind="stable")
    return np.take_along_axis(weights, order, 1), np.take_along_axis(ids, order, 1)


def _x(seed, hidden):
    torch.manual_seed(seed)
    return torch.randn(BATCH * SEQ, hidden, dtype=torch.float32)


# --------------------------------------------------------------------------------------------
# Mixtral
# --------------------------------------------------------------------------------------------


def _mixtral():
    config = _eager(MixtralConfig(hidden_size=48, intermediate_size=40, num_local_experts=8,
                                  num_experts_per_tok=2, hidden_act="silu"))
    block = MixtralSparseMoeBlock(config).eval()
    _init_random(block, seed=1, gate_std=2.0)
    return config, block


@pytest.mark.parametrize("backend", BACKENDS)
def test_mixtral(backend):
    config, block = _mixtral()
    x = _x(11, 48)
    hf_out, logits, hf_w, hf_ids = _hf_forward(block, x)
    w13, w2 = _expert_weights(block.experts)
    topk = moecore.TopKConfig(top_k=2, renormalize=True, scoring_func="softmax")
    layer = _make_layer(backend, 8, 48, 40, topk)
    _load_experts(layer, w13, w2)
    _check_loaded(layer, w13, w2)
    layer.process_weights_after_loading()

    routed = moecore.select_experts(_np(x), logits, topk)
    np.testing.assert_array_equal(np.asarray(routed.topk_ids), hf_ids)
    assert_close(routed.topk_weights, hf_w, "routing_weights", what="routing weights")
    out = layer.forward(_np(x), logits)
    assert out.dtype == np.float32 and out.shape == hf_out.shape
    assert_close(out, hf_out, "f32", what=f"Mixtral block ({backend})")


# --------------------------------------------------------------------------------------------
# Qwen3-MoE
# --------------------------------------------------------------------------------------------


def _qwen3(norm_topk_prob):
    config = _eager(Qwen3MoeConfig(hidden_size=40, moe_intermediate_size=24, num_experts=12,
                                   num_experts_per_tok=4, norm_topk_prob=norm_topk_prob,
                                   hidden_act="silu"))
    block = Qwen3MoeSparseMoeBlock(config).eval()
    _init_random(block, seed=2, gate_std=2.0)
    return config, block


@pytest.mark.parametrize("norm_topk_prob", [True, False], ids=["norm_topk", "no_norm_topk"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_qwen3_moe(backend, norm_topk_prob):
    config, block = _qwen3(norm_topk_prob)
    x = _x(12, 40)
    hf_out, logits, hf_w, hf_ids = _hf_forward(block, x)
    w13, w2 = _expert_weights(block.experts)
    topk = moecore.TopKConfig(top_k=4, renormalize=norm_topk_prob, scoring_func="softmax")
    layer = _make_layer(backend, 12, 40, 24, topk)
    _load_experts(layer, w13, w2)
    layer.process_weights_after_loading()

    routed = moecore.select_experts(_np(x), logits, topk)
    np.testing.assert_array_equal(np.asarray(routed.topk_ids), hf_ids)
    assert_close(routed.topk_weights, hf_w, "routing_weights", what="routing weights")
    if not norm_topk_prob:  # the weights are raw softmax probabilities: they do not sum to 1
        assert np.all(np.asarray(routed.topk_weights).sum(axis=1) < 1 - 1e-3)
    out = layer.forward(_np(x), logits)
    assert_close(out, hf_out, "f32", what=f"Qwen3-MoE block ({backend}, {norm_topk_prob=})")


# --------------------------------------------------------------------------------------------
# DeepSeek-V3
# --------------------------------------------------------------------------------------------

DSV3 = dict(H=64, I=32, E=16, k=4, n_group=4, topk_group=2, rsf=2.5)


def _deepseek_v3():
    config = _eager(DeepseekV3Config(
        hidden_size=DSV3["H"], moe_intermediate_size=DSV3["I"], n_routed_experts=DSV3["E"],
        num_experts_per_tok=DSV3["k"], n_group=DSV3["n_group"], topk_group=DSV3["topk_group"],
        routed_scaling_factor=DSV3["rsf"], n_shared_experts=1, norm_topk_prob=True,
        hidden_act="silu"))
    block = DeepseekV3MoE(config).eval()
    _init_random(block, seed=3, gate_std=4.0)
    torch.manual_seed(4)
    with torch.no_grad():  # non-zero, large enough to change choices vs the unbiased scores
        block.gate.e_score_correction_bias.copy_(torch.randn(DSV3["E"]) * 0.2)
    return config, block


def _shared_mlp_np(block, x: np.ndarray) -> np.ndarray:
    """DeepseekV3MLP in float64 numpy: down(silu(gate·x) · up·x)."""
    s = block.shared_experts
    g = x.astype(np.float64) @ _np(s.gate_proj.weight).astype(np.float64).T
    u = x.astype(np.float64) @ _np(s.up_proj.weight).astype(np.float64).T
    return (g / (1.0 + np.exp(-g)) * u) @ _np(s.down_proj.weight).astype(np.float64).T


def _shared_as_expert(block):
    """The shared MLP as one more expert: w13 [1, 2I, H] (gate rows first), w2 [1, H, I]."""
    s = block.shared_experts
    w13 = np.concatenate([_np(s.gate_proj.weight), _np(s.up_proj.weight)], axis=0)[None]
    return np.ascontiguousarray(w13), _np(s.down_proj.weight)[None]


# (rsf site, shared expert site)
DSV3_VARIANTS = [
    pytest.param("runner", "numpy", id="rsf_in_runner-shared_numpy"),
    pytest.param("topk", "numpy", id="rsf_in_topk-shared_numpy"),
    pytest.param("runner", "fused", id="rsf_in_runner-shared_fused"),
    pytest.param("topk", "fused", id="rsf_in_topk-shared_fused"),
]


def _dsv3_topk_config(bias, rsf_site, shared):
    return moecore.TopKConfig(
        top_k=DSV3["k"] + shared, use_grouped_topk=True, topk_group=DSV3["topk_group"],
        num_expert_group=DSV3["n_group"], renormalize=True, correction_bias=bias,
        scoring_func="sigmoid", routed_scaling_factor=DSV3["rsf"],
        apply_routed_scaling_factor_on_output=rsf_site == "topk",
        num_fused_shared_experts=shared)


@pytest.mark.parametrize("rsf_site,shared_site", DSV3_VARIANTS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_deepseek_v3(backend, rsf_site, shared_site):
    config, block = _deepseek_v3()
    x = _x(13, DSV3["H"])
    hf_out, logits, hf_w, hf_ids = _hf_forward(block, x)
    bias = _np(block.gate.e_score_correction_bias)
    assert np.all(bias != 0)
    w13, w2 = _expert_weights(block.experts)
    shared = 1 if shared_site == "fused" else 0
    topk = _dsv3_topk_config(bias, rsf_site, shared)
    runner_config = moecore.MoeRunnerConfig(
        inplace=False, routed_scaling_factor=DSV3["rsf"] if rsf_site == "runner" else None)
    layer = _make_layer(backend, DSV3["E"] + shared, DSV3["H"], DSV3["I"], topk, runner_config)
    _load_experts(layer, w13, w2)
    if shared:
        s13, s2 = _shared_as_expert(block)
        _load_experts(layer, s13, s2, first_id=DSV3["E"])
        _check_loaded(layer, s13, s2, first_id=DSV3["E"])
    layer.process_weights_after_loading()

    # Routing: HF picks experts with topk(sorted=False), so compare per row sorted by id. HF's
    # weights include routed_scaling_factor; moecore's do only when it is applied in top-k.
    routed = moecore.select_experts(_np(x), logits, topk)
    ids = np.asarray(routed.topk_ids)[:, :DSV3["k"]]
    weights = np.asarray(routed.topk_weights)[:, :DSV3["k"]]
    if shared:
        np.testing.assert_array_equal(np.asarray(routed.topk_ids)[:, -1], DSV3["E"])
        shared_w = np.asarray(routed.topk_weights)[:, -1]
        want = 1.0 if rsf_site == "topk" else 1.0 / DSV3["rsf"]  # × runner rsf → 1 either way
        assert_close(shared_w, np.full_like(shared_w, want), "routing_weights",
                     what="fused shared expert weight")
    w_sorted, ids_sorted = _sorted_by_id(weights, ids)
    hf_w_sorted, hf_ids_sorted = _sorted_by_id(hf_w, hf_ids)
    np.testing.assert_array_equal(ids_sorted, hf_ids_sorted)
    scale = 1.0 if rsf_site == "topk" else np.float32(DSV3["rsf"])
    assert_close(w_sorted * scale, hf_w_sorted, "routing_weights", what="routing weights")

    out = layer.forward(_np(x), logits)
    if not shared:
        out = out.astype(np.float64) + _shared_mlp_np(block, _np(x))
    assert_close(out, hf_out, "f32", what=f"DeepSeek-V3 block ({backend}, {rsf_site}, "
                 f"{shared_site})")


def test_deepseek_v3_bias_changes_choice():
    """The correction bias is live in this config: without it HF picks other experts, so the
    id comparison above can fail if moecore ignored the bias."""
    config, block = _deepseek_v3()
    x = _x(13, DSV3["H"])
    _, _, _, with_bias = _hf_forward(block, x)
    with torch.no_grad():
        block.gate.e_score_correction_bias.zero_()
    _, _, _, without = _hf_forward(block, x)
    assert not np.array_equal(np.sort(with_bias, 1), np.sort(without, 1))


# --------------------------------------------------------------------------------------------
# The numpy layer reference against the same blocks
# --------------------------------------------------------------------------------------------


def test_reference_layer_mixtral():
    _, block = _mixtral()
    x = _x(11, 48)
    hf_out, logits, _, hf_ids = _hf_forward(block, x)
    w13, w2 = _expert_weights(block.experts)
    out, _, ids = moe_layer_ref(_np(x), logits, w13, w2, top_k=2, contract="exact")
    np.testing.assert_array_equal(ids, hf_ids)
    assert_close(out, hf_out, "f32", what="moe_layer_ref vs Mixtral block")


@pytest.mark.parametrize("norm_topk_prob", [True, False], ids=["norm_topk", "no_norm_topk"])
def test_reference_layer_qwen3_moe(norm_topk_prob):
    _, block = _qwen3(norm_topk_prob)
    x = _x(12, 40)
    hf_out, logits, _, hf_ids = _hf_forward(block, x)
    w13, w2 = _expert_weights(block.experts)
    out, _, ids = moe_layer_ref(_np(x), logits, w13, w2, top_k=4, renormalize=norm_topk_prob,
                                contract="exact")
    np.testing.assert_array_equal(ids, hf_ids)
    assert_close(out, hf_out, "f32", what="moe_layer_ref vs Qwen3-MoE block")


def test_reference_layer_deepseek_v3():
    _, block = _deepseek_v3()
    x = _x(13, DSV3["H"])
    hf_out, logits, _, hf_ids = _hf_forward(block, x)
    w13, w2 = _expert_weights(block.experts)
    s13, s2 = _shared_as_expert(block)
    out, _, ids = moe_layer_ref(
        _np(x), logits, np.concatenate([w13, s13]), np.concatenate([w2, s2]),
        top_k=DSV3["k"] + 1, use_grouped_topk=True, topk_group=DSV3["topk_group"],
        num_expert_group=DSV3["n_group"], correction_bias=_np(block.gate.e_score_correction_bias),
        scoring_func="sigmoid", topk_routed_scaling_factor=DSV3["rsf"],
        num_fused_shared_experts=1, routed_scaling_factor=DSV3["rsf"], contract="exact")
    np.testing.assert_array_equal(np.sort(ids[:, :DSV3["k"]], 1), np.sort(hf_ids, 1))
    assert_close(out, hf_out, "f32", what="moe_layer_ref vs DeepSeek-V3 block")
