"""GPT-OSS MXFP4 against `transformers` (TESTING.md oracles).

* Dequantization, bit for bit: the checkpoint's packed blocks and E8M0 scales decoded by
  transformers' GPT-OSS MXFP4 integration (transformers.integrations.mxfp4
  .convert_moe_packed_tensors, bf16) equal (1) moecore.formats.dequantize_mxfp4, (2) the numpy
  reference, and (3) the flashinfer_mxfp4 backend's own decode of the *processed* layer weights
  (halved [up; gate], padded, SM90-interleaved) mapped back to HF's layout — every E8M0 code but
  0xFF (NaN, rejected), so subnormal and overflowing products are covered too.
* The MoE block: GptOssMLP (router + GptOssExperts, eager, fp32) built from a tiny random config
  whose expert weights are the dequantized MXFP4 checkpoint, against moecore.FusedMoE with
  Mxfp4MoEMethod loaded from the same checkpoint through the fused GPT-OSS loader. Routing ids are
  compared exactly, weights with the routing row, the output with "bf16_vs_exact" (moecore's
  bf16 pipeline vs fp32 math). Hidden 160 and intermediate 96 exercise the 128-padding (input pad,
  output trim) and the 64-padding of create_weights.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import moecore
from moecore import _moecore as C
from moecore.reference.quant import dequantize_mxfp4_ref
from moecore.testing import assert_bitwise_equal, assert_close, cast
from moecore.testing import mxfp4 as M
from transformers.integrations.mxfp4 import convert_moe_packed_tensors
from transformers.models.gpt_oss.configuration_gpt_oss import GptOssConfig
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP


def _hf_dequant(blocks: np.ndarray, scales: np.ndarray, dtype=torch.bfloat16) -> torch.Tensor:
    """transformers' decode: blocks [E, rows, G, 16], scales [E, rows, G] → [E, G·32, rows]."""
    return convert_moe_packed_tensors(torch.from_numpy(blocks.copy()),
                                      torch.from_numpy(scales.copy()), dtype=dtype)


def _bf16_bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def _as_bf16_bits(values_f32: np.ndarray) -> np.ndarray:
    return M.bits(cast(values_f32, "bf16"))


def _full_range_checkpoint(rng, e, h, i):
    ckpt = M.random_gpt_oss_checkpoint(rng, e, h, i, mode="bytes")
    ckpt.gate_up_proj_scales[...] = rng.integers(0, 255, ckpt.gate_up_proj_scales.shape)
    ckpt.down_proj_scales[...] = rng.integers(0, 255, ckpt.down_proj_scales.shape)
    # Make sure the extremes appear: the smallest code (2^-127, subnormal products) and 254.
    ckpt.gate_up_proj_scales[0, 0, 0] = 0
    ckpt.gate_up_proj_scales[0, 1, 0] = 254
    ckpt.down_proj_scales[-1, -1, -1] = 0
    return ckpt


@pytest.mark.parametrize("num_experts, hidden, inter", [(3, 160, 96), (2, 256, 128)],
                         ids=lambda v: str(v))
def test_dequant_bitexact_vs_transformers(num_experts, hidden, inter):
    rng = np.random.default_rng(hidden + inter)
    ckpt = _full_range_checkpoint(rng, num_experts, hidden, inter)
    hf_gate_up = _bf16_bits(_hf_dequant(ckpt.gate_up_proj_blocks, ckpt.gate_up_proj_scales))
    hf_down = _bf16_bits(_hf_dequant(ckpt.down_proj_blocks, ckpt.down_proj_scales))
    assert hf_gate_up.shape == (num_experts, hidden, 2 * inter)
    assert hf_down.shape == (num_experts, inter, hidden)
    # Both extremes are really exercised: some products are subnormal and some overflow.
    assert np.any((hf_gate_up & 0x7F80) == 0) and np.any((hf_gate_up & 0x7FFF) == 0x7F80)

    e = num_experts
    gu_q = ckpt.gate_up_proj_blocks.reshape(e, 2 * inter, hidden // 2)
    dn_q = ckpt.down_proj_blocks.reshape(e, hidden, inter // 2)
    with np.errstate(over="ignore"):  # 6·2^127 overflows to inf on every side alike
        sides = {
            "moecore.formats.dequantize_mxfp4": (
                C.formats.dequantize_mxfp4(gu_q, ckpt.gate_up_proj_scales, "f32"),
                C.formats.dequantize_mxfp4(dn_q, ckpt.down_proj_scales, "f32")),
            "dequantize_mxfp4_ref": (dequantize_mxfp4_ref(gu_q, ckpt.gate_up_proj_scales),
                                     dequantize_mxfp4_ref(dn_q, ckpt.down_proj_scales)),
        }
    for name, (gu, dn) in sides.items():
        with np.errstate(over="ignore"):
            assert_bitwise_equal(_as_bf16_bits(np.asarray(gu).transpose(0, 2, 1)), hf_gate_up,
                                 what=f"{name}: gate_up_proj")
            assert_bitwise_equal(_as_bf16_bits(np.asarray(dn).transpose(0, 2, 1)), hf_down,
                                 what=f"{name}: down_proj")

    # The backend's decode of the processed (padded, [up; gate], SM90-interleaved) weights.
    layer, method = M.gpt_oss_layer(ckpt)
    np_ = method.padded_intermediate
    w13 = C.dequantize_sm90_mxfp4(layer.parameter("w13_weight"),
                                  layer.parameter("w13_weight_scale"))
    w2 = C.dequantize_sm90_mxfp4(layer.parameter("w2_weight"), layer.parameter("w2_weight_scale"))
    up, gate = w13[:, :inter, :hidden], w13[:, np_:np_ + inter, :hidden]
    rows = np.empty((e, 2 * inter, hidden), np.float32)
    rows[:, 0::2], rows[:, 1::2] = gate, up
    assert not w13[:, inter:np_].any() and not w13[:, np_ + inter:].any()  # padding rows
    assert not w13[:, :, hidden:].any() and not w2[:, hidden:].any() and not w2[:, :, inter:].any()
    with np.errstate(over="ignore"):
        assert_bitwise_equal(_as_bf16_bits(rows.transpose(0, 2, 1)), hf_gate_up,
                             what="backend decode: gate_up_proj")
        assert_bitwise_equal(_as_bf16_bits(w2[:, :hidden, :inter].transpose(0, 2, 1)), hf_down,
                             what="backend decode: down_proj")


def _gpt_oss_block(ckpt, seed):
    e, h, i = ckpt.shape
    config = GptOssConfig(hidden_size=h, intermediate_size=i, num_local_experts=e,
                          num_experts_per_tok=2)
    config._experts_implementation = "eager"  # the per-expert loop, no grouped_mm kernels
    block = GptOssMLP(config).eval()
    torch.manual_seed(seed)
    with torch.no_grad():
        ex = block.experts
        ex.gate_up_proj.copy_(_hf_dequant(ckpt.gate_up_proj_blocks, ckpt.gate_up_proj_scales,
                                          torch.float32))
        ex.down_proj.copy_(_hf_dequant(ckpt.down_proj_blocks, ckpt.down_proj_scales,
                                       torch.float32))
        ex.gate_up_proj_bias.copy_(torch.from_numpy(ckpt.gate_up_proj_bias.astype(np.float32)))
        ex.down_proj_bias.copy_(torch.from_numpy(ckpt.down_proj_bias.astype(np.float32)))
        block.router.weight.normal_(0.0, 1.0 / np.sqrt(h))
        block.router.bias.normal_(0.0, 0.1)
    return block


@pytest.mark.parametrize("num_experts, hidden, inter", [(8, 160, 96), (4, 256, 192)],
                         ids=lambda v: str(v))
def test_gpt_oss_mlp_block_vs_transformers(num_experts, hidden, inter):
    rng = np.random.default_rng(num_experts * 100 + hidden)
    ckpt = M.random_gpt_oss_checkpoint(rng, num_experts, hidden, inter, bias_scale=0.1)
    block = _gpt_oss_block(ckpt, seed=hidden)
    x_bf16 = cast(rng.standard_normal((21, hidden)), "bf16")
    x = torch.from_numpy(x_bf16.astype(np.float32))
    with torch.no_grad():
        logits, hf_scores, hf_ids = block.router(x)
        hf_out, _ = block(x.reshape(3, 7, hidden))
    logits_np = logits.numpy().astype(np.float32)

    topk = moecore.select_experts(x_bf16, logits_np, moecore.TopKConfig(top_k=2))
    got_ids = np.sort(topk.topk_ids, axis=1)
    order = np.argsort(hf_ids.numpy(), axis=1)
    np.testing.assert_array_equal(got_ids, np.sort(hf_ids.numpy(), axis=1))
    ours = np.take_along_axis(topk.topk_weights, np.argsort(topk.topk_ids, axis=1), axis=1)
    assert_close(ours, np.take_along_axis(hf_scores.numpy(), order, axis=1), "routing_weights")

    layer, _ = M.gpt_oss_layer(ckpt, top_k=2)
    out = layer.forward(x_bf16, logits_np)
    assert out.shape == (21, hidden)
    assert_close(out, hf_out.reshape(21, hidden).numpy(), "bf16_vs_exact",
                 what="moecore MXFP4 layer vs transformers GptOssMLP")
