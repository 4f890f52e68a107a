"""Test helpers for the MXFP4 paths (GPT-OSS Mxfp4MoEMethod, DSv4
Mxfp4FlashinferCutlassMoEMethod, the flashinfer_mxfp4 backend): seeded checkpoints in the layouts
the loaders take, layer builders, and the direct kernel call with a layer's processed weights.
Test-only; never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import moecore
from moecore import _moecore

from ..reference.moe_mxfp4 import gpt_oss_sm90_layout_ref, round_up
from ..reference.quant import quantize_mxfp4_ref
from .data import cast

__all__ = [
    "DsV4Weights",
    "GptOssCheckpoint",
    "bits",
    "call_kernel",
    "dsv4_layer",
    "gpt_oss_layer",
    "gpt_oss_logical",
    "processed_args",
    "random_dsv4_weights",
    "random_gpt_oss_checkpoint",
    "round_up",
]


def bits(a) -> np.ndarray:
    """Raw storage of an array (bf16 → uint16, 1-byte dtypes → uint8, f32 → uint32)."""
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


@dataclass
class GptOssCheckpoint:
    """One GPT-OSS MoE layer as its HF MXFP4 checkpoint stores it (all global experts; rows of
    gate_up_* are interleaved [g0, u0, g1, u1, …])."""

    gate_up_proj_blocks: np.ndarray  # u8 [E, 2I, H/32, 16]
    gate_up_proj_scales: np.ndarray  # u8 [E, 2I, H/32]
    gate_up_proj_bias: np.ndarray  # bf16 [E, 2I]
    down_proj_blocks: np.ndarray  # u8 [E, H, I/32, 16]
    down_proj_scales: np.ndarray  # u8 [E, H, I/32]
    down_proj_bias: np.ndarray  # bf16 [E, H]

    @property
    def shape(self):
        e, two_i, g, _ = self.gate_up_proj_blocks.shape
        return e, g * 32, two_i // 2  # E, H, I

    def items(self):
        return [(name, getattr(self, name)) for name in self.__dataclass_fields__]


def _quantize_gaussian(rng, shape, fan_in):
    """N(0, 1/fan_in) weights [.., rows, K] quantized with sglang's MXFP4 rule → (blocks
    [.., rows, K/32, 16], scales [.., rows, K/32])."""
    w = rng.standard_normal(shape).astype(np.float32) / np.float32(np.sqrt(fan_in))
    q, s = quantize_mxfp4_ref(w)
    return q.reshape(shape[:-1] + (shape[-1] // 32, 16)), s


def random_gpt_oss_checkpoint(rng: np.random.Generator, num_experts: int, hidden: int,
                              inter: int, *, mode: str = "gaussian", scale_range=(125, 130),
                              bias_scale: float = 0.01) -> GptOssCheckpoint:
    """mode "bytes": uniform random bytes and E8M0 scales in scale_range (sglang's
    test_mxfp4_sm90_cutlass data: layouts and bit-exact checks); mode "gaussian": N(0, 1/fan_in)
    weights quantized to MXFP4 (O(1) outputs for numeric comparisons). Biases: N(0, 1)·bias_scale
    in bf16."""
    e, h, i = num_experts, hidden, inter
    if mode == "bytes":
        lo, hi = scale_range
        gu_b = rng.integers(0, 256, (e, 2 * i, h // 32, 16), dtype=np.uint8)
        gu_s = rng.integers(lo, hi, (e, 2 * i, h // 32), dtype=np.uint8)
        dn_b = rng.integers(0, 256, (e, h, i // 32, 16), dtype=np.uint8)
        dn_s = rng.integers(lo, hi, (e, h, i // 32), dtype=np.uint8)
    elif mode == "gaussian":
        gu_b, gu_s = _quantize_gaussian(rng, (e, 2 * i, h), h)
        dn_b, dn_s = _quantize_gaussian(rng, (e, h, i), i)
    else:
        raise ValueError(f"mode must be 'bytes' or 'gaussian', got {mode!r}")
    gu_bias = cast(rng.standard_normal((e, 2 * i)) * bias_scale, "bf16")
    dn_bias = cast(rng.standard_normal((e, h)) * bias_scale, "bf16")
    return GptOssCheckpoint(gu_b, gu_s, gu_bias, dn_b, dn_s, dn_bias)


def gpt_oss_layer(ckpt: GptOssCheckpoint, *, top_k: int = 2, tp_size: int = 1, tp_rank: int = 0,
                  ep_size: int = 1, ep_rank: int = 0, process: bool = True,
                  runner_backend: str = "flashinfer_mxfp4", **config):
    """A FusedMoE with Mxfp4MoEMethod, loaded through the fused GPT-OSS loader (and processed).
    Returns (layer, method)."""
    e, h, i = ckpt.shape
    method = _moecore.Mxfp4MoEMethod()
    config.setdefault("inplace", False)
    layer = moecore.FusedMoE(
        num_experts=e, hidden_size=h, intermediate_size=i,
        topk_config=moecore.TopKConfig(top_k=top_k, renormalize=True),
        tp_size=tp_size, tp_rank=tp_rank, ep_size=ep_size, ep_rank=ep_rank,
        runner_config=moecore.MoeRunnerConfig(**config), quant_method=method,
        runner_backend=runner_backend)
    for name, tensor in ckpt.items():
        method.load_fused_expert_weight(layer, f"model.layers.0.mlp.experts.{name}", tensor)
    if process:
        layer.process_weights_after_loading()
    return layer, method


def gpt_oss_logical(ckpt: GptOssCheckpoint, *, interleave: bool = False) -> dict:
    """The numpy-processed (sglang's manual construction) tensors of a single-rank layer: halved
    [up; gate], padded to 128; SM90-interleaved when interleave=True."""
    e, h, i = ckpt.shape
    return gpt_oss_sm90_layout_ref(
        ckpt.gate_up_proj_blocks.reshape(e, 2 * i, h // 2), ckpt.gate_up_proj_scales,
        ckpt.gate_up_proj_bias, ckpt.down_proj_blocks.reshape(e, h, i // 2),
        ckpt.down_proj_scales, ckpt.down_proj_bias, hidden=h, inter=i, interleave=interleave)


@dataclass
class DsV4Weights:
    """DSv4 FP4 experts as the per-expert checkpoint shards: packed int8 w1/w3 [E, I, H/2],
    w2 [E, H, I/2]; f32 power-of-two scales [E, I, H/32] / [E, H, I/32]."""

    w1: np.ndarray
    w3: np.ndarray
    w2: np.ndarray
    w1_scale: np.ndarray
    w3_scale: np.ndarray
    w2_scale: np.ndarray

    @property
    def shape(self):
        e, i, hb = self.w1.shape
        return e, hb * 2, i

    def w13(self):
        return np.concatenate([self.w1, self.w3], axis=1)

    def w13_scale(self):
        return np.concatenate([self.w1_scale, self.w3_scale], axis=1)


def random_dsv4_weights(rng: np.random.Generator, num_experts: int, hidden: int, inter: int, *,
                        mode: str = "gaussian") -> DsV4Weights:
    e, h, i = num_experts, hidden, inter

    def packed(shape, fan_in):
        if mode == "bytes":
            q = rng.integers(0, 256, shape[:-1] + (shape[-1] // 2,), dtype=np.uint8)
            s = rng.integers(125, 130, shape[:-1] + (shape[-1] // 32,), dtype=np.uint8)
        else:
            q, s = _quantize_gaussian(rng, shape, fan_in)
            q = q.reshape(shape[:-1] + (shape[-1] // 2,))
        return q.view(np.int8), np.ldexp(np.float32(1), s.astype(np.int32) - 127).astype(np.float32)

    w1, s1 = packed((e, i, h), h)
    w3, s3 = packed((e, i, h), h)
    w2, s2 = packed((e, h, i), i)
    return DsV4Weights(w1, w3, w2, s1, s3, s2)


def dsv4_layer(w: DsV4Weights, *, top_k: int = 2, swiglu_limit=None, tp_size: int = 1,
               tp_rank: int = 0, ep_size: int = 1, ep_rank: int = 0, process: bool = True,
               **config):
    """A FusedMoE with Mxfp4FlashinferCutlassMoEMethod, loaded per expert through
    FusedMoE.weight_loader (shards w1, w3, w2). Returns (layer, method)."""
    e, h, i_full = w.shape
    method = _moecore.Mxfp4FlashinferCutlassMoEMethod()
    config.setdefault("inplace", False)
    layer = moecore.FusedMoE(
        num_experts=e, hidden_size=h, intermediate_size=i_full,
        topk_config=moecore.TopKConfig(top_k=top_k, renormalize=True), tp_size=tp_size,
        tp_rank=tp_rank, ep_size=ep_size, ep_rank=ep_rank,
        runner_config=moecore.MoeRunnerConfig(swiglu_limit=swiglu_limit, **config),
        quant_method=method, runner_backend="flashinfer_mxfp4")
    for ex in range(e):
        for shard, q, s in (("w1", w.w1, w.w1_scale), ("w3", w.w3, w.w3_scale),
                            ("w2", w.w2, w.w2_scale)):
            param = "w2" if shard == "w2" else "w13"
            layer.weight_loader(f"{param}_weight", q[ex], f"{param}_weight", shard, ex)
            layer.weight_loader(f"{param}_weight_scale_inv", s[ex], f"{param}_weight_scale_inv",
                                shard, ex)
    if process:
        layer.process_weights_after_loading()
    return layer, method


def processed_args(quant_info) -> dict:
    """cutlass_fused_moe_mxfp4 keyword arguments from a FlashInferMxfp4CutlassMoeQuantInfo."""
    q = quant_info
    return {
        "fc1_expert_weights": q.w13_weight, "fc2_expert_weights": q.w2_weight,
        "quant_scales": [q.w13_weight_scale, q.w2_weight_scale],
        "fc1_expert_biases": q.w13_bias, "fc2_expert_biases": q.w2_bias,
        "swiglu_alpha": q.swiglu_alpha, "swiglu_beta": q.swiglu_beta,
        "swiglu_limit": q.swiglu_limit, "tp_size": q.moe_tp_size, "tp_rank": q.moe_tp_rank,
        "ep_size": q.moe_ep_size, "ep_rank": q.moe_ep_rank,
    }


def call_kernel(x, topk_weights, topk_ids, quant_info, **overrides):
    """The direct kernel call of sglang's test: pad x to padded_hidden (when set), call
    cutlass_fused_moe_mxfp4 with the same processed tensors, trim the output back."""
    x = np.asarray(x)
    hidden = x.shape[1]
    padded = quant_info.padded_hidden
    if padded is not None and padded != hidden:
        xp = np.zeros((x.shape[0], padded), dtype=x.dtype)
        xp[:, :hidden] = x
        x = xp
    args = processed_args(quant_info)
    args.update(overrides)
    out = _moecore.cutlass_fused_moe_mxfp4(input=x, token_selected_experts=topk_ids,
                                           token_final_scales=topk_weights, **args)
    return np.ascontiguousarray(out[:, :hidden])

