// Layout transforms of quantized MoE weights and scales, each with an exact inverse, bit for bit:
// the NVFP4 128×4 block-scale swizzle and its MMA view (spec §7.2), sglang's CuteDSL
// interleave_w13_halves (§6.4, R12), the [Gate, Up] ↔ [Up, Gate] swap, GPT-OSS's row-interleaved
// gate/up (§6.5), zero padding of the intermediate and hidden dims (R10), and FlashInfer's SM90
// mixed-GEMM weight/scale interleaves. All are byte movers: any dtype, sizes count storage units
// (bytes for packed fp4), inputs may be strided, outputs are new row-major Tensors.
#pragma once

#include <cstdint>
#include <string>

#include "moecore/core/tensor.h"

namespace moecore {

// ---------------------------------------------------------------------------------------------
// NVFP4 block-scale swizzle (sglang swizzle_blockscale / FlashInfer's 128×4 SF layout).

constexpr int64_t kSwizzleRowTile = 128;  ///< rows of M per swizzle tile
constexpr int64_t kSwizzleColTile = 4;    ///< scale columns (K/16 blocks) per swizzle tile

/// Offset of scale (m, kb) inside one swizzled [Mp, Kbp] matrix, spec §7.2:
/// ((((m/128 · Kbp/4 + kb/4) · 32 + m%32) · 4 + (m%128)/32) · 4 + kb%4.
inline int64_t nvfp4_swizzled_offset(int64_t m, int64_t kb, int64_t kb_padded) {
  const int64_t mt = m / 128, i = (m % 128) / 32, j = m % 32, kt = kb / 4, c = kb % 4;
  return (((mt * (kb_padded / 4) + kt) * 32 + j) * 4 + i) * 4 + c;
}

/// Block scales [M, Kb] or [B, M, Kb] (any 1-byte dtype, normally kF8E4M3; Kb = K/16) →
/// swizzled [Mp, Kbp] / [B, Mp, Kbp] with Mp = ⌈M/128⌉·128, Kbp = ⌈Kb/4⌉·4, padding zero-filled.
Tensor swizzle_nvfp4_scales(const TensorView& scale);
/// Exact inverse: swizzled [Mp, Kbp] or [B, Mp, Kbp] → linear [.., m, kb]; Mp and Kbp must be
/// exactly ⌈m/128⌉·128 and ⌈kb/4⌉·4.
Tensor unswizzle_nvfp4_scales(const TensorView& swizzled, int64_t m, int64_t kb);

/// The MMA view (FlashInfer's convert_sf_to_mma_layout): the SAME bytes as a contiguous swizzled
/// [B, Mp, Kbp] (or [Mp, Kbp], B = 1) tensor, seen as storage (B, Mp/128, Kbp/4, 32, 4, 4)
/// permuted to the logical 6-d order (32, 4, m_tiles, 4, k_tiles, B). Element
/// [j, i, mt, c, kt, b] is scale (m = mt·128 + i·32 + j, kb = kt·4 + c) of group b. Returns a
/// strided view sharing `swizzled`'s storage (the caller keeps that alive); no data moves.
TensorView nvfp4_scales_mma_view(const TensorView& swizzled);
/// Inverse of the view: a view produced by nvfp4_scales_mma_view → the contiguous [B, Mp, Kbp]
/// view of the same bytes. InvalidArgument when the strides are not that layout's.
TensorView nvfp4_scales_from_mma_view(const TensorView& mma);
/// Storage offset of logical MMA index (j, i, mt, c, kt, b), for kernels that index directly.
inline int64_t nvfp4_mma_offset(int64_t j, int64_t i, int64_t mt, int64_t c, int64_t kt, int64_t b,
                                int64_t m_tiles, int64_t k_tiles) {
  return ((((b * m_tiles + mt) * k_tiles + kt) * 32 + j) * 4 + i) * 4 + c;
}

// ---------------------------------------------------------------------------------------------
// Gate/up arrangements of w13 (rows [2I, ...] along `dim`, normally 1 of [E, 2I, H]).

/// sglang's CuteDSL interleave_w13_halves: along `dim` (size 2S, S % group_size == 0) the first
/// half A and second half B become [A0, B0, A1, B1, …] in group_size chunks. Errors are sglang's
/// ValueError texts (R12): "Expected even size on interleave dimension for W13 half split." and
/// "Expected split dim divisible by group_size={group_size}, got {split}.".
Tensor interleave_w13_halves(const TensorView& t, int64_t group_size = 64, int dim = 1);
/// Exact inverse of interleave_w13_halves (same validation).
Tensor deinterleave_w13_halves(const TensorView& t, int64_t group_size = 64, int dim = 1);
/// [Gate, Up] ↔ [Up, Gate] along `dim` (even size); its own inverse.
Tensor swap_w13_halves(const TensorView& t, int dim = 1);
/// GPT-OSS row interleave → halves: [g0, u0, g1, u1, …] → [g0, g1, …, u0, u1, …] along `dim`
/// (even size). Rows (dim = 1) of sglang's [E, 2I, H/2] and bias [E, 2I] (dim = 1) alike.
Tensor deinterleave_gate_up_rows(const TensorView& t, int dim = 1);
/// Inverse: [G; U] halves → [g0, u0, g1, u1, …].
Tensor interleave_gate_up_rows(const TensorView& t, int dim = 1);

// ---------------------------------------------------------------------------------------------
// Zero padding (R10, SM90 MXFP4 processing): sizes in storage units along `dim`.

/// Zero-pads `dim` at its end to `padded_size` (≥ current size). For w2 columns (I), the hidden
/// dim of w13/w2, biases, and scale columns.
Tensor pad_dim(const TensorView& t, int dim, int64_t padded_size);
/// Inverse of pad_dim: keeps the first `size` entries of `dim` (a copy).
Tensor unpad_dim(const TensorView& t, int dim, int64_t size);
/// Pads the intermediate dim of w13 (`dim`, size 2I when gated, I otherwise) to `padded_size` per
/// half: gated → each half is zero-padded separately to padded_size and re-concatenated (size
/// 2·padded_size), as sglang's ModelOpt FP8 cutlass path does; non-gated → pad_dim.
Tensor pad_w13_intermediate(const TensorView& w13, int64_t padded_size, bool gated = true,
                            int dim = 1);
/// Inverse: keeps the first `size` rows of each half (gated) or of the dim.
Tensor unpad_w13_intermediate(const TensorView& w13, int64_t size, bool gated = true, int dim = 1);

// ---------------------------------------------------------------------------------------------
// FlashInfer SM90 mixed-input MoE GEMM layouts (flashinfer.fused_moe
// interleave_moe_{weights,scales}_for_sm90_mixed_gemm; weights from TRT-LLM's
// interleave_fp4_weights_for_sm90_mixed_gemm kernel, transcribed, not run on a GPU here).

/// Packed FP4 weights [E, N, K/2] (kFp4E2M1x2 or kU8; N % 16 == 0, K % 64 == 0) → the same shape
/// in the SM90 LUT-conversion order: per 16-row tile and 32-byte column block, 4-byte words gather
/// bytes (r, c), (r+8, c), (r, c+4), (r+8, c+4) and permute their 32 bits. Only quant_type "fp4"
/// (W4A16 MXFP4) is implemented; "fp4_fp8" and "int4" → Unsupported.
Tensor interleave_moe_weights_for_sm90_mixed_gemm(const TensorView& weight,
                                                  const std::string& quant_type = "fp4");
/// Exact inverse of interleave_moe_weights_for_sm90_mixed_gemm.
Tensor deinterleave_moe_weights_for_sm90_mixed_gemm(const TensorView& weight,
                                                    const std::string& quant_type = "fp4");
/// Scales [E, rows, K/group_size] (rows % 64 == 0; 1, 2 or 4-byte dtype; 128 % group_size == 0)
/// → [E, rows/64, K/128, folded_m, physical_cols] with physical_cols = 16 bytes / element size
/// and folded_m = 64 · (128/group_size) / physical_cols: element
/// [e, a, kb, f, s·gpk + g] = scales[e, a·64 + s·folded_m + f, kb·gpk + g], gpk = 128/group_size.
Tensor interleave_moe_scales_for_sm90_mixed_gemm(const TensorView& scales, int64_t group_size = 32);
/// Exact inverse: the 5-d folded tensor → [E, rows, K/group_size].
Tensor deinterleave_moe_scales_for_sm90_mixed_gemm(const TensorView& folded,
                                                   int64_t group_size = 32);

}  // namespace moecore
