// amx row of the scaled-GEMM table (built with AMX flags; reach it only through
// scaled_gemm_kernel, which the ISA level offers only where the OS granted AMX). int8 × int8 codes
// of at least kPackedIntegerMinRows rows multiply with TDPBSSD (exact int32, so bitwise equal to
// every other row): weight rows packed (int8 codes as stored) per block of kColumns rows into the
// call's GemmScratch are the A operand; the activation rows, kRowChunk at a time and padded with
// zero rows to whole tiles (results discarded), are the B operand, put in VNNI order once per
// chunk. Each K block of the weight's scale grid accumulates in its own tiles, which fold with the
// scales as scaled_gemm_ref does. Other operands run the avx512_bf16 row: its streamed weights keep
// decode on the memory bound, where two designs of tiles over decoded weight blocks measured
// 1.2–2.5× slower at one token, and batch invariance forbids choosing tiles by M (README,
// Kernels). Working memory (Buffers) depends on the weight operand only.
#include "moecore/kernels/x86/bf16_operands.h"

namespace moecore {
namespace {

// Every tile is 16 rows × 64 bytes: A = 16 weight rows × one K step; B = one K step of 16
// activation rows in VNNI order (dword r of B row p holds activation row r's codes of K quad p);
// C = 16 weight rows × 16 activation rows of int32 results.
// Tiles 0-3: C of the 2 × 2 block (weight tile i, activation tile j → tile 2i + j); 4-5: A;
// 6-7: B.
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

constexpr int64_t kTileRows = 16, kTileBytes = kTileRows * kStepBytes;
constexpr int64_t kColumns = 64;  // weight rows per block (4 A tiles per K step), L2-resident
// Activation rows put in B tiles at a time (whole pairs of tiles). Weights are decoded once per
// chunk; the tiles multiply ~16× faster than the vector rows, so a decoded column block is
// reused by twice its own row count before it is decoded again.
constexpr int64_t kRowChunk = 128;

// The row's working memory, one layout for every call on the weight operand.
struct Buffers {
  uint8_t* b_tiles;   // [kRowChunk / 16, steps] B tiles (1 KiB each)
  uint8_t* w_rows;    // [kColumns, row_bytes]: packed weight rows; 16 activation rows while
                      // the B tiles are packed
  float* row_scales;  // [nb]
  float* w_scales;    // [nb, kColumns]
  Buffers(ScratchCarver& s, const PaddedK& pk)
      : b_tiles(s.take<uint8_t>(kRowChunk * pk.row_bytes())),
        w_rows(s.take<uint8_t>(kColumns * pk.row_bytes())),
        row_scales(s.take<float>(pk.num_blocks)),
        w_scales(s.take<float>(kColumns * pk.num_blocks)) {}
};

size_t own_scratch_bytes(const PaddedK& pk) {
  ScratchCarver sizing;
  [[maybe_unused]] const Buffers layout(sizing, pk);
  return sizing.bytes();
}

// dst[i * 16 + j] = src[j][i] for 16 × 16 dwords (src rows `stride` bytes apart): one K step of
// 16 activation rows into a VNNI-ordered B tile, or a C tile into activation-row order.
void transpose_16x16(const uint8_t* src, int64_t stride, uint8_t* dst) {
  __m512i r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + i * stride);
  for (int i = 0; i < 16; i += 2) {  // dword pairs of rows i, i+1 per 128-bit lane
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // lane L of r[i + j]: rows i..i+3 of column 4L + j
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int j = 0; j < 4; ++j) {  // gather lane L of r[j], r[4 + j], r[8 + j], r[12 + j]
    const __m512i even_lo = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x88);
    const __m512i odd_lo = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xdd);
    const __m512i even_hi = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x88);
    const __m512i odd_hi = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xdd);
    _mm512_storeu_si512(dst + (0 + j) * 64, _mm512_shuffle_i32x4(even_lo, even_hi, 0x88));
    _mm512_storeu_si512(dst + (4 + j) * 64, _mm512_shuffle_i32x4(odd_lo, odd_hi, 0x88));
    _mm512_storeu_si512(dst + (8 + j) * 64, _mm512_shuffle_i32x4(even_lo, even_hi, 0xdd));
    _mm512_storeu_si512(dst + (12 + j) * 64, _mm512_shuffle_i32x4(odd_lo, odd_hi, 0xdd));
  }
}

// Activation rows [0, m) as B tiles: row tile t, step s at b_tiles + (t · steps + s) · 1 KiB;
// rows [m, m_padded) are zeros. `rows`: 16 padded rows of scratch.
void pack_activation_tiles(const ActivationCodes& a, int64_t m, int64_t m_padded,
                           const PaddedK& pk, CodeType type, uint8_t* rows, uint8_t* b_tiles) {
  const int64_t steps = pk.steps(), row_bytes = pk.row_bytes();
  for (int64_t r0 = 0; r0 < m_padded; r0 += kTileRows) {
    for (int64_t i = 0; i < kTileRows; ++i) {
      if (r0 + i < m)
        pack_codes_row(a.row(r0 + i), pk, type, rows + i * row_bytes);
      else
        std::memset(rows + i * row_bytes, 0, static_cast<size_t>(row_bytes));
    }
    for (int64_t s = 0; s < steps; ++s)
      transpose_16x16(rows + s * kStepBytes, row_bytes,
                      b_tiles + (r0 / kTileRows * steps + s) * kTileBytes);
  }
}

// The 2 × kBTiles tile block over steps [s0, s1): weight tiles at a0, a1 (rows `stride` bytes
// apart) and activation B tiles at b0, b1 (one tile per step). Results to c[2 · kBTiles][16 × 16]
// (weight tile i, activation tile j → c tile kBTiles · i + j). One B tile serves calls of up to 16
// rows; each C tile's arithmetic is the same either way.
template <int kBTiles>
void tile_block(const uint8_t* a0, const uint8_t* a1, int64_t stride, const uint8_t* b0,
                const uint8_t* b1, int64_t s0, int64_t s1, int32_t* c) {
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (kBTiles == 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t s = s0; s < s1; ++s) {
    _tile_loadd(4, a0 + s * kStepBytes, stride);
    _tile_loadd(5, a1 + s * kStepBytes, stride);
    _tile_loadd(6, b0 + s * kTileBytes, kStepBytes);
    if constexpr (kBTiles == 2) _tile_loadd(7, b1 + s * kTileBytes, kStepBytes);
    // (The tile numbers are the intrinsics' immediates.)
    if constexpr (kBTiles == 2) {
      _tile_dpbssd(0, 4, 6);
      _tile_dpbssd(1, 4, 7);
      _tile_dpbssd(2, 5, 6);
      _tile_dpbssd(3, 5, 7);
    } else {
      _tile_dpbssd(0, 4, 6);
      _tile_dpbssd(1, 5, 6);
    }
  }
  _tile_stored(0, c, kStepBytes);
  _tile_stored(1, c + 256, kStepBytes);
  if constexpr (kBTiles == 2) {
    _tile_stored(2, c + 512, kStepBytes);
    _tile_stored(3, c + 768, kStepBytes);
  }
}

// Folds K block b's results c (16 rows from activation row r, of which `rows` are real, × 16
// weight rows with block-b scales sw, `columns` mask the real ones) into out per the formula
// with scaled_gemm_ref's operation order, one row of 16 outputs at a time.
void fold_tile(const int32_t* c, const ActivationCodes& a, int64_t r, int64_t rows,
               const float* sw, __mmask16 columns, int64_t b, int64_t nb, float alpha, float* out,
               int64_t ldo) {
  const __m512 w_scale = _mm512_loadu_ps(sw);
  for (int64_t i = 0; i < rows; ++i) {
    const __m512i dots = _mm512_load_si512(c + i * kTileRows);
    __m512 part = _mm512_cvtepi32_ps(dots);
    part = _mm512_mul_ps(part, _mm512_set1_ps(a.scale(r + i, b)));
    part = _mm512_mul_ps(part, w_scale);
    float* o = out + i * ldo;
    if (b > 0) part = _mm512_add_ps(_mm512_maskz_loadu_ps(columns, o), part);
    if (b == nb - 1) part = _mm512_mul_ps(part, _mm512_set1_ps(alpha));
    _mm512_mask_storeu_ps(o, columns, part);
  }
}

// Activation rows [0, m ≤ kRowChunk) of the call against weight rows [n0, n0 + n); the tile
// configuration is loaded.
void gemm_chunk(const ActivationCodes& a, int64_t m, const WeightOperand& w, int64_t e, int64_t n0,
                int64_t n, float* out, int64_t ldo, const PaddedK& pk, const Buffers& buffers) {
  const CodeType type = CodeType::kInt8;
  const int64_t row_bytes = pk.row_bytes(), steps = pk.steps(), nb = pk.num_blocks;
  const int64_t m_padded = (m + 2 * kTileRows - 1) / (2 * kTileRows) * (2 * kTileRows);
  const float alpha = expert_alpha(w, e);
  float* const w_scales = buffers.w_scales;
  pack_activation_tiles(a, m, m_padded, pk, type, buffers.w_rows, buffers.b_tiles);

  alignas(64) int32_t c[4 * kTileRows * kTileRows];
  alignas(64) int32_t by_row[kTileRows * kTileRows];  // one C tile in activation-row order
  for (int64_t c0 = 0; c0 < n; c0 += kColumns) {
    const int64_t cols = std::min(kColumns, n - c0);
    const int64_t col_tiles = (cols + 2 * kTileRows - 1) / (2 * kTileRows) * 2;  // whole pairs
    const uint8_t* rows = buffers.w_rows;
    const int64_t stride = row_bytes;
    for (int64_t j = 0; j < cols; ++j) {
      pack_int8_weight_row(w, e, n0 + c0 + j, pk, type, buffers.w_rows + j * row_bytes,
                           buffers.row_scales);
      for (int64_t b = 0; b < nb; ++b) w_scales[b * kColumns + j] = buffers.row_scales[b];
    }
    std::memset(buffers.w_rows + cols * row_bytes, 0,
                static_cast<size_t>((col_tiles * kTileRows - cols) * row_bytes));

    for (int64_t r0 = 0; r0 < m; r0 += 2 * kTileRows)
      for (int64_t t = 0; t < col_tiles; t += 2)
        for (int64_t b = 0; b < nb; ++b) {
          const int64_t s0 = pk.block_first_step(b);
          const uint8_t* a0 = rows + t * kTileRows * stride;
          const uint8_t* b0 = buffers.b_tiles + r0 / kTileRows * steps * kTileBytes;
          // Up to 16 rows left: one B tile (the second would be all padding).
          const int b_tiles = m - r0 > kTileRows ? 2 : 1;
          if (b_tiles == 2)
            tile_block<2>(a0, a0 + kTileRows * stride, stride, b0, b0 + steps * kTileBytes, s0,
                          s0 + pk.block_steps(b), c);
          else
            tile_block<1>(a0, a0 + kTileRows * stride, stride, b0, nullptr, s0,
                          s0 + pk.block_steps(b), c);
          for (int64_t ti = 0; ti < 2; ++ti)
            for (int64_t tj = 0; tj < b_tiles; ++tj) {
              const int64_t col = (t + ti) * kTileRows, r = r0 + tj * kTileRows;
              if (r >= m || col >= cols) continue;
              const int64_t real_cols = std::min(kTileRows, cols - col);
              const int32_t* tile = c + (b_tiles * ti + tj) * kTileRows * kTileRows;
              transpose_16x16(reinterpret_cast<const uint8_t*>(tile), kStepBytes,
                              reinterpret_cast<uint8_t*>(by_row));
              fold_tile(by_row, a, r, std::min(kTileRows, m - r), w_scales + b * kColumns + col,
                        static_cast<__mmask16>((1u << real_cols) - 1), b, nb, alpha,
                        out + r * ldo + c0 + col, ldo);
            }
        }
  }
}

// Each output depends only on its own activation row: chunks of rows are calls of their own.
void scaled_gemm_tiles(const ActivationCodes& a, int64_t m, const WeightOperand& w, int64_t e,
                       int64_t n0, int64_t n, float* out, int64_t ldo) {
  const PaddedK pk(w, CodeType::kInt8);
  ScratchCarver carver(gemm_scratch_memory(a, scaled_gemm_amx_scratch_bytes(w)));
  const Buffers buffers(carver, pk);
  static const TileConfig config;
  _tile_loadconfig(&config);
  for (int64_t r0 = 0; r0 < m; r0 += kRowChunk)
    gemm_chunk(activation_rows_from(a, r0), std::min(kRowChunk, m - r0), w, e, n0, n,
               out + r0 * ldo, ldo, pk, buffers);
  _tile_release();
}

}  // namespace

size_t scaled_gemm_amx_scratch_bytes(const WeightOperand& w) {
  // int8 codes for int8 weights (integer_operands); calls the avx512_bf16 row takes use its memory.
  size_t bytes = scaled_gemm_avx512_bf16_scratch_bytes(w);
  if (w.coding == WeightCoding::kInt8)
    bytes = std::max(bytes, own_scratch_bytes(PaddedK(w, CodeType::kInt8)));
  return bytes;
}

void scaled_gemm_amx(const ActivationCodes& a, int64_t m, const WeightOperand& w, int64_t e,
                     int64_t n0, int64_t n, float* out, int64_t ldo) {
  if (integer_operands(a, w) && m >= kPackedIntegerMinRows) {
    check_activation_scales(a, w);
    scaled_gemm_tiles(a, m, w, e, n0, n, out, ldo);
  } else {
    scaled_gemm_avx512_bf16(a, m, w, e, n0, n, out, ldo);
  }
}

}  // namespace moecore
