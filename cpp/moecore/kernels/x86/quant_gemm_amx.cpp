// amx row of the scaled-GEMM table (built with AMX flags; reach it only through
// scaled_gemm_kernel, which the ISA level offers only where the OS granted AMX). Bf16-exact
// operands multiply with TDPBF16PS, int8 × int8 codes with TDPBSSD (exact int32). Weight rows
// are the A operand as they are stored (bf16 rows whose K is a whole number of 64-byte steps) or
// as decoded per block of kColumns rows into a per-thread buffer; the activation rows, padded
// with zero rows to whole pairs of tiles (results discarded), are the B operand, put in VNNI
// order once per call. Each K block of the weight's scale grid accumulates in its own tiles,
// which fold with the scales as scaled_gemm_ref does. A result depends only on its own weight
// and activation rows, so a row's result never depends on the other rows nor on threads.
// Other operands run the avx512 row.
#include <vector>

#include "moecore/kernels/x86/bf16_operands.h"

namespace moecore {
namespace {

// Every tile is 16 rows × 64 bytes: A = 16 weight rows × one K step; B = one K step of 16
// activation rows in VNNI order (dword r of B row p holds activation row r's codes of K pair
// (bf16) or quad (int8) p); C = 16 weight rows × 16 activation rows of fp32 (int32) results.
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
        pack_codes_row(a.codes + (r0 + i) * a.ld, pk, type, rows + i * row_bytes);
      else
        std::memset(rows + i * row_bytes, 0, static_cast<size_t>(row_bytes));
    }
    for (int64_t s = 0; s < steps; ++s)
      transpose_16x16(rows + s * kStepBytes, row_bytes,
                      b_tiles + (r0 / kTileRows * steps + s) * kTileBytes);
  }
}

// The 2 × 2 tile block over steps [s0, s1): weight tiles at a0, a1 (rows `stride` bytes apart)
// and activation B tiles at b0, b1 (one tile per step). Results to c[4][16 × 16].
template <bool kInteger>
void tile_block(const uint8_t* a0, const uint8_t* a1, int64_t stride, const uint8_t* b0,
                const uint8_t* b1, int64_t s0, int64_t s1, int32_t* c) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t s = s0; s < s1; ++s) {
    _tile_loadd(4, a0 + s * kStepBytes, stride);
    _tile_loadd(5, a1 + s * kStepBytes, stride);
    _tile_loadd(6, b0 + s * kTileBytes, kStepBytes);
    _tile_loadd(7, b1 + s * kTileBytes, kStepBytes);
    if constexpr (kInteger) {
      _tile_dpbssd(0, 4, 6);
      _tile_dpbssd(1, 4, 7);
      _tile_dpbssd(2, 5, 6);
      _tile_dpbssd(3, 5, 7);
    } else {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, kStepBytes);
  _tile_stored(1, c + 256, kStepBytes);
  _tile_stored(2, c + 512, kStepBytes);
  _tile_stored(3, c + 768, kStepBytes);
}

// Folds K block b's results c (16 rows from activation row r, of which `rows` are real, × 16
// weight rows with block-b scales sw, `columns` mask the real ones) into out per the formula
// with scaled_gemm_ref's operation order, one row of 16 outputs at a time.
template <bool kInteger>
void fold_tile(const int32_t* c, const ActivationCodes& a, int64_t r, int64_t rows,
               const float* sw, __mmask16 columns, int64_t b, int64_t nb, float alpha, float* out,
               int64_t ldo) {
  const __m512 w_scale = _mm512_loadu_ps(sw);
  for (int64_t i = 0; i < rows; ++i) {
    const __m512i dots = _mm512_load_si512(c + i * kTileRows);
    __m512 part = kInteger ? _mm512_cvtepi32_ps(dots) : _mm512_castsi512_ps(dots);
    if (a.scales != nullptr)
      part = _mm512_mul_ps(part, _mm512_set1_ps(a.scales[(r + i) * a.scales_per_row +
                                                          (a.scales_per_row == 1 ? 0 : b)]));
    part = _mm512_mul_ps(part, w_scale);
    float* o = out + i * ldo;
    if (b > 0) part = _mm512_add_ps(_mm512_maskz_loadu_ps(columns, o), part);
    if (b == nb - 1) part = _mm512_mul_ps(part, _mm512_set1_ps(alpha));
    _mm512_mask_storeu_ps(o, columns, part);
  }
}

template <bool kInteger>
void scaled_gemm_tiles(const ActivationCodes& a, int64_t m, const WeightOperand& w, int64_t e,
                       int64_t n0, int64_t n, float* out, int64_t ldo) {
  const CodeType type = kInteger ? CodeType::kInt8 : CodeType::kBf16;
  const PaddedK pk(w, type);
  const int64_t row_bytes = pk.row_bytes(), steps = pk.steps(), nb = pk.num_blocks;
  const int64_t m_padded = (m + 2 * kTileRows - 1) / (2 * kTileRows) * (2 * kTileRows);
  const float alpha = expert_alpha(w, e);
  thread_local std::vector<uint8_t> b_tiles, w_rows;
  thread_local std::vector<float> scratch, row_scales, w_scales;  // w_scales: [nb, kColumns]
  b_tiles.resize(static_cast<size_t>(m_padded * row_bytes));
  w_rows.resize(static_cast<size_t>(kColumns * row_bytes));
  scratch.resize(static_cast<size_t>(w.k));
  row_scales.resize(static_cast<size_t>(nb));
  w_scales.resize(static_cast<size_t>(kColumns * nb));
  pack_activation_tiles(a, m, m_padded, pk, type, w_rows.data(), b_tiles.data());

  static const TileConfig config;
  _tile_loadconfig(&config);
  alignas(64) int32_t c[4 * kTileRows * kTileRows];
  alignas(64) int32_t by_row[kTileRows * kTileRows];  // one C tile in activation-row order
  for (int64_t c0 = 0; c0 < n; c0 += kColumns) {
    const int64_t cols = std::min(kColumns, n - c0);
    const int64_t col_tiles = (cols + 2 * kTileRows - 1) / (2 * kTileRows) * 2;  // whole pairs
    // bf16 weight rows that already are the padded layout (K a whole number of steps) are the A
    // tiles as stored; other rows decode into w_rows first.
    const uint8_t* rows = w_rows.data();
    int64_t stride = row_bytes;
    if (type == CodeType::kBf16 && w.coding == WeightCoding::kDense &&
        w.k % pk.step_codes == 0 && cols == col_tiles * kTileRows) {
      rows = static_cast<const uint8_t*>(w.data.at({e, n0 + c0, 0}));
      stride = w.data.strides[1] * dtype_size(w.data.dtype);
      std::fill(w_scales.begin(), w_scales.begin() + cols, 1.0f);
    } else {
      for (int64_t j = 0; j < cols; ++j) {
        pack_weight_row(w, e, n0 + c0 + j, pk, type, scratch.data(),
                        w_rows.data() + j * row_bytes, row_scales.data());
        for (int64_t b = 0; b < nb; ++b) w_scales[b * kColumns + j] = row_scales[b];
      }
      std::memset(w_rows.data() + cols * row_bytes, 0,
                  static_cast<size_t>((col_tiles * kTileRows - cols) * row_bytes));
    }

    for (int64_t r0 = 0; r0 < m; r0 += 2 * kTileRows)
      for (int64_t t = 0; t < col_tiles; t += 2)
        for (int64_t b = 0; b < nb; ++b) {
          const int64_t s0 = pk.block_first_step(b);
          const uint8_t* a0 = rows + t * kTileRows * stride;
          const uint8_t* b0 = b_tiles.data() + r0 / kTileRows * steps * kTileBytes;
          tile_block<kInteger>(a0, a0 + kTileRows * stride, stride, b0, b0 + steps * kTileBytes,
                               s0, s0 + pk.block_steps(b), c);
          for (int64_t ti = 0; ti < 2; ++ti)
            for (int64_t tj = 0; tj < 2; ++tj) {
              const int64_t col = (t + ti) * kTileRows, r = r0 + tj * kTileRows;
              if (r >= m || col >= cols) continue;
              const int64_t real_cols = std::min(kTileRows, cols - col);
              const int32_t* tile = c + (2 * ti + tj) * kTileRows * kTileRows;
              transpose_16x16(reinterpret_cast<const uint8_t*>(tile), kStepBytes,
                              reinterpret_cast<uint8_t*>(by_row));
              fold_tile<kInteger>(by_row, a, r, std::min(kTileRows, m - r),
                                  w_scales.data() + b * kColumns + col,
                                  static_cast<__mmask16>((1u << real_cols) - 1), b, nb, alpha,
                                  out + r * ldo + c0 + col, ldo);
            }
        }
  }
  _tile_release();
}

}  // namespace

void scaled_gemm_amx(const ActivationCodes& a, int64_t m, const WeightOperand& w, int64_t e,
                     int64_t n0, int64_t n, float* out, int64_t ldo) {
  if (integer_operands(a, w)) {
    check_activation_scales(a, w);
    scaled_gemm_tiles<true>(a, m, w, e, n0, n, out, ldo);
  } else if (bf16_operands(a, w)) {
    check_activation_scales(a, w);
    scaled_gemm_tiles<false>(a, m, w, e, n0, n, out, ldo);
  } else {
    scaled_gemm_avx512(a, m, w, e, n0, n, out, ldo);
  }
}

}  // namespace moecore
