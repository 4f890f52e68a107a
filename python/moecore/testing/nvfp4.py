"""Seeded NVFP4 / FP8 MoE problems for the FlashInfer backend and ModelOpt NVFP4 tests: float
weights quantized the way ModelOpt checkpoints are (per-expert global scales, e4m3 16-block
scales), laid out for flashinfer_cutlass ([Up; Gate], 128×4-swizzled scales) or CuteDSL v2
([Up; Gate] 64-row interleaved, MMA-view scales), with the matching QuantInfo keywords.
Quantization runs in moecore.formats (bit-exact twin of moecore.reference.quant) for speed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

import moecore
import moecore.formats as mf

from .data import random_routing

__all__ = [
    "E4M3_MAX_X_E2M1",
    "Nvfp4Experts",
    "make_bf16_moe",
    "make_fp4_moe",
    "make_fp8_moe",
    "quantize_experts_nvfp4",
    "routing",
]

E4M3_MAX_X_E2M1 = 448.0 * 6.0
F32 = np.float32
BF16 = ml_dtypes.bfloat16


def routing(rng, t: int, e_global: int, k: int):
    """(topk_ids int32 [T, k] distinct per row, topk_weights float32 [T, k] renormalized)."""
    weights, ids = random_routing(rng, t, e_global, k)
    return np.asarray(ids, np.int32), np.asarray(weights, F32)


def quantize_experts_nvfp4(w: np.ndarray, global_scale) -> tuple:
    """w float32 [E, N, K] → (packed uint8 [E, N, K/2], linear e4m3 scales [E, N, K/16]) with a
    scalar or per-expert [E] global scale."""
    gs = np.asarray(global_scale, F32).reshape(-1)
    if gs.size == 1:
        q, s = mf.quantize_nvfp4(np.ascontiguousarray(w, F32), float(gs[0]))
    else:
        q, s = mf.quantize_nvfp4(np.ascontiguousarray(w, F32), gs)
    return q, s


@dataclass
class Nvfp4Experts:
    """One rank's NVFP4 experts in ModelOpt checkpoint form ([Gate; Up] halves, linear scales)."""

    w13_float: np.ndarray  # [E, N1, H] float32, [Gate; Up]
    w2_float: np.ndarray  # [E, H, I]
    w13: np.ndarray  # packed uint8 [E, N1, H/2]
    w13_sf: np.ndarray  # e4m3 [E, N1, H/16]
    w2: np.ndarray  # packed [E, H, I/2]
    w2_sf: np.ndarray  # e4m3 [E, H, I/16]
    w13_gs: np.ndarray  # float32 [E]: weight global scales (1 / weight_scale_2)
    w2_gs: np.ndarray  # float32 [E]
    extra: dict = field(default_factory=dict)


def make_experts(rng, e: int, h: int, inter: int, gated: bool = True, scale: float = 0.1):
    n1 = (2 if gated else 1) * inter
    w13f = (rng.standard_normal((e, n1, h)) * scale).astype(F32)
    w2f = (rng.standard_normal((e, h, inter)) * scale).astype(F32)
    gs13 = mf.nvfp4_global_scales(w13f)
    gs2 = mf.nvfp4_global_scales(w2f)
    q13, s13 = quantize_experts_nvfp4(w13f, gs13)
    q2, s2 = quantize_experts_nvfp4(w2f, gs2)
    return Nvfp4Experts(w13f, w2f, q13, s13, q2, s2, gs13, gs2)


def up_gate(t: np.ndarray, gated: bool = True) -> np.ndarray:
    """[Gate; Up] → [Up; Gate] along dim 1 (identity when not gated)."""
    if not gated:
        return t
    half = t.shape[1] // 2
    return np.ascontiguousarray(np.concatenate([t[:, half:], t[:, :half]], axis=1))


def make_fp4_moe(
    rng,
    t: int,
    e: int,
    h: int,
    inter: int,
    k: int,
    *,
    gated: bool = True,
    a1_gs: float | None = None,
    a2_gs: float | None = None,
    x_scale: float = 1.0,
    layout: str = "cutlass",
    ep_size: int = 1,
    ep_rank: int = 0,
    x_dtype=BF16,
) -> dict:
    """A problem for flashinfer_cutlass fp4 (layout "cutlass") or CuteDSL v2 ("cutedsl").
    Returns x, topk_ids (global), topk_weights, the experts and the QuantInfo keywords."""
    experts = make_experts(rng, e, h, inter, gated)
    x = (rng.standard_normal((t, h)) * x_scale).astype(F32).astype(x_dtype)
    ids, weights = routing(rng, t, e * ep_size, k)
    if a1_gs is None:
        amax = float(np.max(np.abs(np.asarray(x, F32)))) if x.size else 0.0
        a1_gs = E4M3_MAX_X_E2M1 / (amax or 1.0)
    if a2_gs is None:
        a2_gs = E4M3_MAX_X_E2M1 / 0.5
    g1 = (1.0 / (np.float64(a1_gs) * experts.w13_gs)).astype(F32)
    g2 = (1.0 / (np.float64(a2_gs) * experts.w2_gs)).astype(F32)
    w13 = up_gate(experts.w13, gated)
    s13 = up_gate(experts.w13_sf, gated)
    if layout == "cutlass":
        kwargs = {
            "quant_type": "fp4",
            "w13_weight": w13,
            "w2_weight": experts.w2,
            "quant_scales": [
                np.array([a1_gs], F32),
                mf.swizzle_nvfp4_scales(s13),
                g1,
                np.array([a2_gs], F32),
                mf.swizzle_nvfp4_scales(experts.w2_sf),
                g2,
            ],
            "moe_ep_size": ep_size,
            "moe_ep_rank": ep_rank,
        }
    elif layout == "cutedsl":
        w13i = mf.interleave_w13_halves(w13, 64, 1)
        s13i = mf.interleave_w13_halves(s13, 64, 1)
        sw13 = mf.swizzle_nvfp4_scales(s13i)
        sw2 = mf.swizzle_nvfp4_scales(experts.w2_sf)
        kwargs = {
            "w13_weight": w13i,
            "w2_weight": experts.w2,
            "w13_weight_sf": mf.nvfp4_scales_mma_view(sw13),
            "w2_weight_sf": mf.nvfp4_scales_mma_view(sw2),
            "w1_alpha": g1,
            "w2_alpha": g2,
            "a1_scale": np.array([a1_gs], F32),
            "a2_scale": np.array([a2_gs], F32),
            "local_expert_offset": ep_rank * e,
        }
        experts.extra["swizzled"] = (sw13, sw2)  # keep the MMA views' storage alive
    else:
        raise ValueError(layout)
    return {
        "x": x,
        "topk_ids": ids,
        "topk_weights": weights,
        "experts": experts,
        "kwargs": kwargs,
        "a1_gs": a1_gs,
        "a2_gs": a2_gs,
    }


def make_fp8_moe(
    rng, t: int, e: int, h: int, inter: int, k: int, *, gated: bool = True, x_dtype=BF16
) -> dict:
    """flashinfer_cutlass fp8: per-expert weight scales, static input scales (ModelOpt FP8)."""
    n1 = (2 if gated else 1) * inter
    w13f = (rng.standard_normal((e, n1, h)) * 0.1).astype(F32)
    w2f = (rng.standard_normal((e, h, inter)) * 0.1).astype(F32)
    ws13 = (np.abs(w13f).reshape(e, -1).max(1) / 448.0).astype(F32)
    ws2 = (np.abs(w2f).reshape(e, -1).max(1) / 448.0).astype(F32)
    q13 = np.stack([mf.quantize_fp8_static(w13f[i], float(ws13[i])) for i in range(e)])
    q2 = np.stack([mf.quantize_fp8_static(w2f[i], float(ws2[i])) for i in range(e)])
    x = rng.standard_normal((t, h)).astype(F32).astype(x_dtype)
    ids, weights = routing(rng, t, e, k)
    in13 = float(np.max(np.abs(np.asarray(x, F32))) / 448.0) if x.size else 0.01
    in2 = 0.05
    scales = [
        (ws13 * F32(in13)).astype(F32),
        np.array([1.0 / in2], F32),
        (ws2 * F32(in2)).astype(F32),
        np.array([in13], F32),
    ]
    kwargs = {
        "quant_type": "fp8",
        "w13_weight": up_gate(q13, gated),
        "w2_weight": q2,
        "quant_scales": scales,
    }
    return {"x": x, "topk_ids": ids, "topk_weights": weights, "kwargs": kwargs}


def make_bf16_moe(
    rng, t: int, e: int, h: int, inter: int, k: int, *, gated: bool = True, dtype=BF16
) -> dict:
    n1 = (2 if gated else 1) * inter
    w13 = (rng.standard_normal((e, n1, h)) / np.sqrt(h)).astype(F32).astype(dtype)
    w2 = (rng.standard_normal((e, h, inter)) / np.sqrt(inter)).astype(F32).astype(dtype)
    x = rng.standard_normal((t, h)).astype(F32).astype(dtype)
    ids, weights = routing(rng, t, e, k)
    kwargs = {"quant_type": "bf16", "w13_weight": up_gate(w13, gated), "w2_weight": w2}
    return {"x": x, "topk_ids": ids, "topk_weights": weights, "kwargs": kwargs}


def run_runner(
    backend: str,
    problem: dict,
    quant_info,
    *,
    a2a: str = "none",
    x=None,
    hidden_states_scale=None,
    **config,
):
    """MoeRunner(backend, config, a2a) on a StandardDispatchOutput of the problem."""
    config.setdefault("inplace", False)
    runner = moecore.MoeRunner(backend, moecore.MoeRunnerConfig(**config), a2a_backend=a2a)
    topk = moecore.StandardTopKOutput(problem["topk_weights"], problem["topk_ids"])
    dispatch = moecore.StandardDispatchOutput(
        problem["x"] if x is None else x, hidden_states_scale=hidden_states_scale, topk_output=topk
    )
    return runner.run(dispatch, quant_info).hidden_states


# ---------------------------------------------------------------------------------------------
# ModelOpt NVFP4 checkpoints and FusedMoE loading.


def make_modelopt_checkpoint(
    rng,
    num_experts: int,
    h: int,
    inter_full: int,
    *,
    gated: bool = True,
    scale: float = 0.1,
    input_amax=None,
) -> dict:
    """Per-expert ModelOpt NVFP4 tensors: {e: {"w1"|"w3"|"w2": dict(weight u8, weight_scale
    e4m3, weight_scale_2 f32 (), input_scale f32 ())}} plus the float weights under "float".
    w1 and w3 share one weight_scale_2 (fused quantization, as ModelOpt exports); input scales
    differ per expert (amax / (448·6))."""
    ckpt = {}
    for e in range(num_experts):
        shards = {}
        w1 = (rng.standard_normal((inter_full, h)) * scale).astype(F32)
        w3 = (rng.standard_normal((inter_full, h)) * scale).astype(F32) if gated else None
        w2 = (rng.standard_normal((h, inter_full)) * scale).astype(F32)
        amax13 = max(np.abs(w1).max(), np.abs(w3).max() if gated else 0.0)
        gs13 = F32(E4M3_MAX_X_E2M1 / amax13)
        gs2 = F32(E4M3_MAX_X_E2M1 / np.abs(w2).max())
        in13 = F32(
            (input_amax[e] if input_amax is not None else rng.uniform(1.0, 4.0)) / E4M3_MAX_X_E2M1
        )
        in2 = F32(rng.uniform(0.2, 1.0) / E4M3_MAX_X_E2M1)
        for name, w, gs, ins in (
            ("w1", w1, gs13, in13),
            ("w3", w3, gs13, in13),
            ("w2", w2, gs2, in2),
        ):
            if w is None:
                continue
            q, s = mf.quantize_nvfp4(w, float(gs))
            shards[name] = {
                "weight": q,
                "weight_scale": s,
                "weight_scale_2": np.array(F32(1) / gs, F32),
                "input_scale": np.array(ins, F32),
                "float": w,
            }
        ckpt[e] = shards
    return ckpt


PARAM_OF = {
    "weight": "{p}_weight",
    "weight_scale": "{p}_weight_scale",
    "weight_scale_2": "{p}_weight_scale_2",
    "input_scale": "{p}_input_scale",
}


def load_checkpoint(layer, ckpt: dict) -> int:
    """weight_loader for every tensor of every expert (as sglang's load_weights loop does);
    returns how many calls the layer used."""
    used = 0
    for e, shards in ckpt.items():
        for shard_id, tensors in shards.items():
            prefix = "w2" if shard_id == "w2" else "w13"
            for key, pattern in PARAM_OF.items():
                used += bool(
                    layer.weight_loader(pattern.format(p=prefix), tensors[key], "", shard_id, e)
                )
    return used


def checkpoint_params(
    ckpt: dict,
    *,
    gated: bool = True,
    ep_size: int = 1,
    ep_rank: int = 0,
    tp_size: int = 1,
    tp_rank: int = 0,
) -> dict:
    """The loaded parameters (create_weights names) one rank should hold, built directly from the
    checkpoint: [Up; Gate] w13 (load_up_proj_weight_first), TP slices, this rank's experts,
    input scales for every global expert."""
    eg = len(ckpt)
    per = eg // ep_size
    local = range(ep_rank * per, (ep_rank + 1) * per)

    def rows(a, n):  # TP slice of the intermediate dim (rows of w1/w3, columns of w2)
        part = a.shape[0] // tp_size
        return a[tp_rank * part : (tp_rank + 1) * part]

    def cols(a):
        part = a.shape[1] // tp_size
        return a[:, tp_rank * part : (tp_rank + 1) * part]

    def w13_of(e, key):
        if gated:
            return np.concatenate([rows(ckpt[e]["w3"][key], 0), rows(ckpt[e]["w1"][key], 0)])
        return rows(ckpt[e]["w1"][key], 0)

    out = {
        "w13_weight": np.stack([w13_of(e, "weight") for e in local]),
        "w13_weight_scale": np.stack([w13_of(e, "weight_scale") for e in local]),
        "w2_weight": np.stack([cols(ckpt[e]["w2"]["weight"]) for e in local]),
        "w2_weight_scale": np.stack([cols(ckpt[e]["w2"]["weight_scale"]) for e in local]),
        "w2_weight_scale_2": np.array([ckpt[e]["w2"]["weight_scale_2"] for e in local], F32),
        "w2_input_scale": np.array([ckpt[e]["w2"]["input_scale"] for e in range(eg)], F32),
    }
    shards = ("w1", "w3") if gated else ("w1",)
    ws2 = np.array([[ckpt[e][s]["weight_scale_2"] for s in shards] for e in local], F32)
    out["w13_weight_scale_2"] = ws2 if gated else ws2[:, 0]
    out["w13_input_scale"] = np.array(
        [[ckpt[e][s]["input_scale"] for s in shards] for e in range(eg)], F32
    )
    return out
