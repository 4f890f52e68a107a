"""Pure-numpy twins of moecore's layout transforms (cpp/moecore/formats/layout.h).

Written the way the upstream Python does it (sglang's swizzle_blockscale and
interleave_w13_halves, FlashInfer's convert_sf_to_mma_layout and scale fold: pad, reshape,
permute, concatenate), not as the C++ index maps, so the two check each other. The SM90 FP4
weight interleave follows TRT-LLM's kernel with its mask/shift list. Byte movers: any dtype.
Must never import the compiled extension or torch.
"""

from __future__ import annotations

import numpy as np


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


# ---------------------------------------------------------------------------------------------
# NVFP4 block-scale swizzle (spec §7.2).


def swizzle_nvfp4_scales_ref(scale: np.ndarray) -> np.ndarray:
    """[M, Kb] or [B, M, Kb] → [.., ceil(M/128)·128, ceil(Kb/4)·4], as sglang swizzle_blockscale."""
    s = np.asarray(scale)
    squeeze = s.ndim == 2
    if squeeze:
        s = s[None]
    b, m, kb = s.shape
    mp, kbp = _round_up(m, 128), _round_up(kb, 4)
    padded = np.zeros((b, mp, kbp), dtype=s.dtype)
    padded[:, :m, :kb] = s
    out = padded.reshape(b, mp // 128, 4, 32, kbp // 4, 4).transpose(0, 1, 4, 3, 2, 5)
    out = np.ascontiguousarray(out).reshape(b, mp, kbp)
    return out[0] if squeeze else out


def unswizzle_nvfp4_scales_ref(swizzled: np.ndarray, m: int, kb: int) -> np.ndarray:
    s = np.asarray(swizzled)
    squeeze = s.ndim == 2
    if squeeze:
        s = s[None]
    b, mp, kbp = s.shape
    # The permutation (0, 1, 4, 3, 2, 5) swaps two axes, so it is its own inverse.
    out = s.reshape(b, mp // 128, kbp // 4, 32, 4, 4).transpose(0, 1, 4, 3, 2, 5)
    out = np.ascontiguousarray(out).reshape(b, mp, kbp)[:, :m, :kb]
    return out[0] if squeeze else out


def nvfp4_scales_mma_view_ref(swizzled: np.ndarray) -> np.ndarray:
    """FlashInfer's convert_sf_to_mma_layout: a view (32, 4, m_tiles, 4, k_tiles, B)."""
    s = np.asarray(swizzled)
    if s.ndim == 2:
        s = s[None]
    b, mp, kbp = s.shape
    return s.reshape(b, mp // 128, kbp // 4, 32, 4, 4).transpose(3, 4, 1, 5, 2, 0)


# ---------------------------------------------------------------------------------------------
# Gate/up arrangements.


def interleave_w13_halves_ref(t: np.ndarray, group_size: int = 64, dim: int = 1) -> np.ndarray:
    """sglang's CuteDSL interleave_w13_halves, including its ValueError texts (R12)."""
    t = np.asarray(t)
    if t.shape[dim] % 2 != 0:
        raise ValueError("Expected even size on interleave dimension for W13 half split.")
    split = t.shape[dim] // 2
    if split % group_size != 0:
        raise ValueError(f"Expected split dim divisible by group_size={group_size}, got {split}.")
    first, second = np.split(t, 2, axis=dim)
    sections = split // group_size
    pieces = zip(np.split(first, sections, axis=dim), np.split(second, sections, axis=dim))
    return np.concatenate([p for pair in pieces for p in pair], axis=dim)


def deinterleave_w13_halves_ref(t: np.ndarray, group_size: int = 64, dim: int = 1) -> np.ndarray:
    t = np.moveaxis(np.asarray(t), dim, 0)
    n = t.shape[0]
    if n % 2 != 0:
        raise ValueError("Expected even size on interleave dimension for W13 half split.")
    if (n // 2) % group_size != 0:
        raise ValueError(f"Expected split dim divisible by group_size={group_size}, got {n // 2}.")
    g = t.reshape((n // (2 * group_size), 2, group_size) + t.shape[1:]).swapaxes(0, 1)
    return np.moveaxis(g.reshape(t.shape), 0, dim)


def swap_w13_halves_ref(t: np.ndarray, dim: int = 1) -> np.ndarray:
    first, second = np.split(np.asarray(t), 2, axis=dim)
    return np.concatenate([second, first], axis=dim)


def deinterleave_gate_up_rows_ref(t: np.ndarray, dim: int = 1) -> np.ndarray:
    """GPT-OSS [g0, u0, g1, u1, ...] → [G; U] (sglang: even rows gate, odd rows up)."""
    t = np.moveaxis(np.asarray(t), dim, 0)
    return np.moveaxis(np.concatenate([t[0::2], t[1::2]]), 0, dim)


def interleave_gate_up_rows_ref(t: np.ndarray, dim: int = 1) -> np.ndarray:
    t = np.moveaxis(np.asarray(t), dim, 0)
    gate, up = np.split(t, 2)
    return np.moveaxis(np.stack([gate, up], axis=1).reshape(t.shape), 0, dim)


def pad_dim_ref(t: np.ndarray, dim: int, padded_size: int) -> np.ndarray:
    t = np.asarray(t)
    widths = [(0, 0)] * t.ndim
    widths[dim] = (0, padded_size - t.shape[dim])
    return np.pad(t, widths)


def unpad_dim_ref(t: np.ndarray, dim: int, size: int) -> np.ndarray:
    return np.take(np.asarray(t), np.arange(size), axis=dim)


def pad_w13_intermediate_ref(w13, padded_size: int, gated: bool = True, dim: int = 1):
    """sglang's ModelOpt FP8 cutlass padding (R10): halves padded separately when gated."""
    if not gated:
        return pad_dim_ref(w13, dim, padded_size)
    first, second = np.split(np.asarray(w13), 2, axis=dim)
    return np.concatenate([pad_dim_ref(first, dim, padded_size),
                           pad_dim_ref(second, dim, padded_size)], axis=dim)


def unpad_w13_intermediate_ref(w13, size: int, gated: bool = True, dim: int = 1):
    if not gated:
        return unpad_dim_ref(w13, dim, size)
    first, second = np.split(np.asarray(w13), 2, axis=dim)
    return np.concatenate([unpad_dim_ref(first, dim, size), unpad_dim_ref(second, dim, size)],
                          axis=dim)


# ---------------------------------------------------------------------------------------------
# FlashInfer SM90 mixed-GEMM layouts.

# (mask, shift) pairs of TRT-LLM's interleave_fp4_weights_for_sm90_mixed_gemm_kernel: the output
# word ORs (word & mask) shifted left (positive) or right (negative).
_SM90_FP4_MASK_SHIFTS = [
    (0x00000080, 24), (0x00000070, 18), (0x00000008, 12), (0x00000007, 6),
    (0x00008000, 13), (0x00007000, 7), (0x00000800, 1), (0x00000700, -5),
    (0x00800000, 2), (0x00700000, -4), (0x00080000, -10), (0x00070000, -16),
    (0x80000000, -1), (0x10000000, 1), (0x60000000, -3), (0x08000000, -13),
    (0x01000000, -11), (0x06000000, -15),
]


def _sm90_word_permute(w: np.ndarray) -> np.ndarray:
    w = w.astype(np.uint64)
    out = np.zeros_like(w)
    for mask, shift in _SM90_FP4_MASK_SHIFTS:
        part = w & np.uint64(mask)
        out |= (part << np.uint64(shift)) if shift >= 0 else (part >> np.uint64(-shift))
    return (out & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def interleave_moe_weights_for_sm90_mixed_gemm_ref(weight: np.ndarray) -> np.ndarray:
    """Packed FP4 [E, N, K/2] (N % 16 == 0, K % 64 == 0) → the SM90 interleaved bytes."""
    w = np.asarray(weight).view(np.uint8)
    e, n, kb = w.shape
    if n % 16 or kb % 32:
        raise ValueError("N must be divisible by 16 and K by 64")
    lane = np.arange(16)
    mma = lane // 4
    # Index grids over (tile, half-row h, partition p, lane).
    tile, h, p, ln = np.meshgrid(np.arange(n // 16), np.arange(8), np.arange(kb // 32), lane,
                                 indexing="ij")
    r = tile * 16 + h
    c = p * 32 + mma[ln] * 8 + ln % 4
    dr = r + (mma[ln] % 2) * 8
    dc = p * 32 + (ln // 8) * 16 + (ln % 4) * 4
    out = np.empty_like(w)
    for ei in range(e):
        src = w[ei].astype(np.uint32)
        word = src[r, c] | (src[r + 8, c] << 8) | (src[r, c + 4] << 16) | (src[r + 8, c + 4] << 24)
        word = _sm90_word_permute(word)
        for j in range(4):
            out[ei][dr, dc + j] = (word >> (8 * j)) & 0xFF
    return out


def interleave_moe_scales_for_sm90_mixed_gemm_ref(scales: np.ndarray, group_size: int = 32):
    """FlashInfer's scale fold [E, rows, K/g] → [E, rows/64, K/128, folded_m, physical_cols]."""
    s = np.asarray(scales)
    gpk = 128 // group_size
    physical_cols = 16 // s.dtype.itemsize
    m_slices = physical_cols // gpk
    folded_m = 64 // m_slices
    e, rows, kgs = s.shape
    out = s.reshape(e, rows // 64, m_slices, folded_m, kgs // gpk, gpk).transpose(0, 1, 4, 3, 2, 5)
    return np.ascontiguousarray(out).reshape(e, rows // 64, kgs // gpk, folded_m, physical_cols)


__all__ = [
    "swizzle_nvfp4_scales_ref", "unswizzle_nvfp4_scales_ref", "nvfp4_scales_mma_view_ref",
    "interleave_w13_halves_ref", "deinterleave_w13_halves_ref", "swap_w13_halves_ref",
    "deinterleave_gate_up_rows_ref", "interleave_gate_up_rows_ref", "pad_dim_ref",
    "unpad_dim_ref", "pad_w13_intermediate_ref", "unpad_w13_intermediate_ref",
    "interleave_moe_weights_for_sm90_mixed_gemm_ref",
    "interleave_moe_scales_for_sm90_mixed_gemm_ref",
]
