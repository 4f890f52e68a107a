"""The benchmark's MoE layers: shapes, weight formats and the runner that runs each format.

Weights are generated once per (shape, format), one expert at a time (peak memory stays near
the stored weights), quantized with moecore.formats and handed to the format's backend through
its QuantInfo payload, exactly as a model would hand them over. Peers get the same weights
dequantized (gate rows first, fp32), built only when they fit in memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import ml_dtypes
import numpy as np

import moecore
import moecore.formats as mf
from moecore.testing import random_routing

F32 = np.float32
BF16 = ml_dtypes.bfloat16
FP8 = ml_dtypes.float8_e4m3fn


@dataclass(frozen=True)
class Shape:
    """One MoE layer: `experts` local experts (of `global_experts` when expert-parallel)."""

    name: str
    experts: int
    top_k: int
    hidden: int
    inter: int
    global_experts: Optional[int] = None


SHAPES = {s.name: s for s in [
    Shape("mixtral-8x7b", 8, 2, 4096, 14336),
    Shape("qwen3-30b-a3b", 128, 8, 2048, 768),
    Shape("gpt-oss-20b", 32, 4, 2880, 2880),
    # One rank of DeepSeek-V3's EP-8 layout: 32 local experts of 256, tokens routed over all 256.
    Shape("deepseek-v3-ep", 32, 8, 7168, 2048, global_experts=256),
    Shape("tiny", 8, 2, 256, 256),  # the smoke test's shape
]}
MODEL_SHAPES = [name for name in SHAPES if name != "tiny"]
TOKENS = [1, 16, 128, 1024, 4096]

# format → (runner backend, what moecore computes; tolerance row of the peer check). Activation
# quantization (fp8, int8, nvfp4) is part of those formats' contracts, peers compute in bf16 /
# fp32, so those rows are the "quantized activations" ones of moecore.testing.tolerances.
FORMATS = {
    "bf16": ("triton", "bf16 weights and activations", "bf16_vs_exact"),
    "fp8": ("triton", "fp8 e4m3 128×128 blocks, fp8 per-token-group activations", "peer_w8a8_act"),
    "mxfp4": ("flashinfer_mxfp4", "mxfp4 weights (e8m0 32-blocks), bf16 activations", "bf16_vs_exact"),
    "nvfp4": ("flashinfer_cutlass", "nvfp4 weights and activations (e4m3 16-blocks)", "peer_nvfp4_act"),
    "int8": ("triton", "int8 per-channel weights, int8 per-token activations", "peer_w8a8_act"),
}

# Static activation scales of the nvfp4 contract (ModelOpt calibrates them per layer): inputs are
# uniform in ±√3 (unit variance), GEMM1 outputs of unit-variance weights stay within ±16.
X_AMAX = float(np.sqrt(3.0))
NVFP4_A2_AMAX = 16.0


@dataclass
class Layer:
    """A built (shape, format): the runner backend, its QuantInfo and the peers' weights."""

    shape: Shape
    fmt: str
    backend: str
    quant_info: object
    stored_bytes: int  # every expert's weights and scales as the backend holds them (padding too)
    peer_w13: object = None  # torch fp32 [E, 2I, H], gate rows first (None: skipped)
    peer_w2: object = None  # torch fp32 [E, H, I]
    peer_note: str = ""
    stored: list = field(default_factory=list)  # the arrays the QuantInfo views

    @property
    def bytes_per_expert(self) -> float:
        return self.stored_bytes / self.shape.experts

    @property
    def tolerance(self) -> str:
        return FORMATS[self.fmt][2]


def _random_rows(rng, rows: int, cols: int) -> np.ndarray:
    """fp32 [rows, cols] uniform with variance 1/cols (fast: no normal sampling)."""
    a = np.float32(np.sqrt(3.0 / cols))
    w = rng.random((rows, cols), dtype=F32)
    w *= 2 * a
    w -= a
    return w


def make_tokens(rng, shape: Shape, m: int):
    """(x bf16 [m, H], topk_weights f32 [m, k], topk_ids int32 [m, k]). Expert-parallel shapes
    route over all global experts and keep this rank's (the first `experts`), others −1; like
    DeepEP, the rank receives only tokens with at least one local expert, so a token left with
    none gets a random local expert in its first slot."""
    x = (rng.random((m, shape.hidden), dtype=F32) * F32(2 * X_AMAX) - F32(X_AMAX)).astype(BF16)
    weights, ids = random_routing(rng, m, shape.global_experts or shape.experts, shape.top_k)
    ids = np.asarray(ids, np.int32)
    ids[ids >= shape.experts] = -1
    none_local = np.all(ids < 0, axis=1)
    ids[none_local, 0] = rng.integers(0, shape.experts, int(none_local.sum()))
    return x, np.asarray(weights, F32), ids


def _available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


PEER_MEMORY_MARGIN = 2 << 30  # left free for activations, outputs and the OS


def unsupported(shape: Shape, fmt: str) -> str:
    """Why moecore's backend for `fmt` cannot run `shape` ("" when it can)."""
    block = mf.FP8_GROUP_SIZE
    if fmt == "fp8" and (shape.hidden % block or shape.inter % block):
        return (f"fp8 {block}×{block} blocks need H and I divisible by {block} "
                f"(H={shape.hidden}, I={shape.inter})")
    return ""


def build_layer(shape: Shape, fmt: str, rng, *, peers: bool, weight_tiles: bool = True) -> Layer:
    """Generates, quantizes and lays out one layer (its weights prepacked in weight tiles too,
    unless weight_tiles is False); peers' fp32 weights if they fit."""
    import torch

    E, H, I = shape.experts, shape.hidden, shape.inter
    builder = {"bf16": _Bf16, "fp8": _Fp8, "int8": _Int8, "nvfp4": _Nvfp4, "mxfp4": _Mxfp4}[fmt]
    b = builder(E, H, I)
    # Peers need fp32 weights plus a bf16 copy: 6 bytes per weight.
    peer_bytes = 6 * E * 3 * H * I
    want_peers = peers and peer_bytes + b.stored_estimate() + PEER_MEMORY_MARGIN < _available_bytes()
    w13 = torch.empty((E, 2 * I, H), dtype=torch.float32) if want_peers else None
    w2 = torch.empty((E, H, I), dtype=torch.float32) if want_peers else None
    for e in range(E):
        gate_up = _random_rows(rng, 2 * I, H)
        down = _random_rows(rng, H, I)
        d13, d2 = b.add(e, gate_up, down)  # dequantized, gate rows first
        if want_peers:
            w13[e] = torch.from_numpy(d13)
            w2[e] = torch.from_numpy(d2)
    quant_info, stored = b.finish()
    if weight_tiles:  # as a processed layer runs (MoeRunnerConfig.prepack_weight_tiles)
        quant_info.pack_weight_tiles()
    note = "" if want_peers else ("skipped (--peers none)" if not peers else "skipped (memory)")
    return Layer(shape, fmt, FORMATS[fmt][0], quant_info, sum(a.nbytes for a in stored), w13, w2,
                 note, stored)


class _Bf16:
    def __init__(self, E, H, I):
        self.w13 = np.empty((E, 2 * I, H), BF16)
        self.w2 = np.empty((E, H, I), BF16)

    def stored_estimate(self):
        return self.w13.nbytes + self.w2.nbytes

    def add(self, e, gate_up, down):
        self.w13[e] = gate_up.astype(BF16)
        self.w2[e] = down.astype(BF16)
        return self.w13[e].astype(F32), self.w2[e].astype(F32)


    def finish(self):
        return moecore.TritonMoeQuantInfo(w13_weight=self.w13, w2_weight=self.w2), [self.w13, self.w2]


class _Fp8:
    BLOCK = mf.FP8_GROUP_SIZE

    def __init__(self, E, H, I):
        nb = lambda n: -(-n // self.BLOCK)  # noqa: E731
        self.w13 = np.empty((E, 2 * I, H), FP8)
        self.w2 = np.empty((E, H, I), FP8)
        self.s13 = np.empty((E, nb(2 * I), nb(H)), F32)
        self.s2 = np.empty((E, nb(H), nb(I)), F32)

    def stored_estimate(self):
        return self.w13.nbytes + self.w2.nbytes

    def add(self, e, gate_up, down):
        self.w13[e], self.s13[e] = mf.quantize_fp8_block(gate_up)
        self.w2[e], self.s2[e] = mf.quantize_fp8_block(down)
        return (mf.dequantize_fp8_block(self.w13[e], self.s13[e]),
                mf.dequantize_fp8_block(self.w2[e], self.s2[e]))


    def finish(self):
        q = moecore.TritonMoeQuantInfo(w13_weight=self.w13, w2_weight=self.w2, use_fp8_w8a8=True,
                                       w13_scale=self.s13, w2_scale=self.s2,
                                       block_shape=[self.BLOCK, self.BLOCK])
        return q, [self.w13, self.w2, self.s13, self.s2]


class _Int8:
    def __init__(self, E, H, I):
        self.w13 = np.empty((E, 2 * I, H), np.int8)
        self.w2 = np.empty((E, H, I), np.int8)
        self.s13 = np.empty((E, 2 * I, 1), F32)
        self.s2 = np.empty((E, H, 1), F32)

    def stored_estimate(self):
        return self.w13.nbytes + self.w2.nbytes

    def add(self, e, gate_up, down):
        self.w13[e], self.s13[e] = mf.quantize_int8_per_channel(gate_up)
        self.w2[e], self.s2[e] = mf.quantize_int8_per_channel(down)
        return (mf.dequantize_int8_per_row(self.w13[e], self.s13[e]),
                mf.dequantize_int8_per_row(self.w2[e], self.s2[e]))


    def finish(self):
        q = moecore.TritonMoeQuantInfo(w13_weight=self.w13, w2_weight=self.w2, use_int8_w8a8=True,
                                       per_channel_quant=True, w13_scale=self.s13, w2_scale=self.s2)
        return q, [self.w13, self.w2, self.s13, self.s2]


class _Nvfp4:
    """flashinfer_cutlass fp4: [Up; Gate] rows, 128×4-swizzled e4m3 block scales, per-expert
    global scales folded into the GEMM alphas (as sglang's ModelOpt NVFP4 method passes them)."""

    def __init__(self, E, H, I):
        self.I = I
        self.w13 = np.empty((E, 2 * I, H // 2), np.uint8)
        self.w2 = np.empty((E, H, I // 2), np.uint8)
        self.s13 = np.empty((E, 2 * I, H // mf.NVFP4_BLOCK_SIZE), FP8)
        self.s2 = np.empty((E, H, I // mf.NVFP4_BLOCK_SIZE), FP8)
        self.gs13 = np.empty(E, F32)
        self.gs2 = np.empty(E, F32)

    def stored_estimate(self):
        return self.w13.nbytes + self.w2.nbytes

    def _quantize(self, w):
        gs = float(mf.nvfp4_global_scales(w[None])[0])
        q, s = mf.quantize_nvfp4(w, gs)
        return q, s, gs, mf.dequantize_nvfp4(q, s, gs)

    def add(self, e, gate_up, down):
        I = self.I
        q, s, self.gs13[e], d13 = self._quantize(gate_up)
        self.w13[e, :I], self.w13[e, I:] = q[I:], q[:I]  # the backend's [Up; Gate]
        self.s13[e, :I], self.s13[e, I:] = s[I:], s[:I]
        self.w2[e], self.s2[e], self.gs2[e], d2 = self._quantize(down)
        return d13, d2


    def finish(self):
        a1_gs = F32(mf.E4M3_MAX * mf.E2M1_MAX / X_AMAX)
        a2_gs = F32(mf.E4M3_MAX * mf.E2M1_MAX / NVFP4_A2_AMAX)
        scales = [np.array([a1_gs], F32), mf.swizzle_nvfp4_scales(self.s13),
                  (1.0 / (np.float64(a1_gs) * self.gs13)).astype(F32), np.array([a2_gs], F32),
                  mf.swizzle_nvfp4_scales(self.s2), (1.0 / (np.float64(a2_gs) * self.gs2)).astype(F32)]
        # linear_scales: the block scales as the kernels read them, as a quant method keeps them.
        q = moecore.FlashInferCutlassMoeQuantInfo(quant_type="fp4", w13_weight=self.w13,
                                                  w2_weight=self.w2, quant_scales=scales,
                                                  linear_scales=(self.s13, self.s2))
        return q, [self.w13, self.w2, *scales]


class _Mxfp4:
    """flashinfer_mxfp4: loaded as a GPT-OSS checkpoint through Mxfp4MoEMethod (its padding and
    SM90 interleave), then run without the GPT-OSS SwiGLU constants and biases, so the
    activation is plain silu(gate)·up like every other format here."""

    def __init__(self, E, H, I):
        self.E, self.H, self.I = E, H, I
        g = mf.MXFP4_BLOCK_SIZE
        self.gu_blocks = np.empty((E, 2 * I, H // g, 16), np.uint8)
        self.gu_scales = np.empty((E, 2 * I, H // g), np.uint8)
        self.dn_blocks = np.empty((E, H, I // g, 16), np.uint8)
        self.dn_scales = np.empty((E, H, I // g), np.uint8)

    def stored_estimate(self):
        return 2 * (self.gu_blocks.nbytes + self.dn_blocks.nbytes)  # checkpoint + processed

    def add(self, e, gate_up, down):
        I = self.I
        q, s = mf.quantize_mxfp4(gate_up)
        d13 = mf.dequantize_mxfp4(q, s)
        shape = self.gu_blocks.shape[2:]
        # The checkpoint interleaves rows: gate 0, up 0, gate 1, up 1, …
        self.gu_blocks[e, 0::2] = q[:I].reshape(I, *shape)
        self.gu_blocks[e, 1::2] = q[I:].reshape(I, *shape)
        s = s.view(np.uint8)
        self.gu_scales[e, 0::2], self.gu_scales[e, 1::2] = s[:I], s[I:]
        q, s = mf.quantize_mxfp4(down)
        self.dn_blocks[e] = q.reshape(self.dn_blocks.shape[1:])
        self.dn_scales[e] = s.view(np.uint8)
        return d13, mf.dequantize_mxfp4(q, s)

    def finish(self):
        E, H, I = self.E, self.H, self.I
        method = moecore.Mxfp4MoEMethod()
        layer = moecore.FusedMoE(
            num_experts=E, hidden_size=H, intermediate_size=I,
            topk_config=moecore.TopKConfig(top_k=1), quant_method=method,
            runner_config=moecore.MoeRunnerConfig(inplace=False), runner_backend="flashinfer_mxfp4")
        checkpoint = {"gate_up_proj_blocks": self.gu_blocks, "gate_up_proj_scales": self.gu_scales,
                      "gate_up_proj_bias": np.zeros((E, 2 * I), BF16),
                      "down_proj_blocks": self.dn_blocks, "down_proj_scales": self.dn_scales,
                      "down_proj_bias": np.zeros((E, H), BF16)}
        for name, tensor in checkpoint.items():
            method.load_fused_expert_weight(layer, f"model.layers.0.mlp.experts.{name}", tensor)
        self.gu_blocks = self.gu_scales = self.dn_blocks = self.dn_scales = None
        layer.process_weights_after_loading()
        p = method.quant_info(layer)
        # kernel_layout: the weights as the kernels read them, as the quant method keeps them.
        q = moecore.FlashInferMxfp4CutlassMoeQuantInfo(
            w13_weight=p.w13_weight, w2_weight=p.w2_weight, w13_weight_scale=p.w13_weight_scale,
            w2_weight_scale=p.w2_weight_scale, padded_hidden=p.padded_hidden,
            kernel_layout=p.kernel_layout)
        return q, [p.w13_weight, p.w2_weight, p.w13_weight_scale, p.w2_weight_scale]
