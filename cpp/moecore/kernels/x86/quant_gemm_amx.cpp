// amx row of the scaled-GEMM table (built with AMX flags; reach it only through
// scaled_gemm_kernel, which the ISA level offers only where the OS granted AMX). Each K block of
// the weight's scale grid accumulates in its own C tiles, which fold with the scales in
// scaled_gemm_ref's order: ((dot_b · sa[r, b]) · sw[c, b]) summed over b in order, then · alpha.
//
// bf16-exact operands, opt-in (scaled_gemm_amx_tiles, MOECORE_AMX_FLOAT_TILES), at every M:
// TDPBF16PS with activation rows as the A operand and weights, decoded once per chunk of rows
// into VNNI tiles, as the B operand (section below). Each output's sum is the hardware's over its
// own weight row and activation row, step by step in K order, whatever M, the chunking, the
// column split or the thread: batch invariant, but not the VDPBF16PS lane order of the
// avx512_bf16 row (equal within the fp32 tolerance). Prefill runs faster than on the avx512_bf16
// row, decode slower (README, Kernels), so scaled_gemm_amx itself runs the avx512_bf16 row on
// these operands.
//
// int8 × int8 codes of at least kPackedIntegerMinRows rows: TDPBSSD (exact int32, so bitwise equal
// to every other row) on weight rows packed (int8 codes as stored) per block of kColumns rows, in
// both rows. Other operands run the avx512_bf16 row. Working memory depends on the weight operand
// only.
#include <type_traits>

#include "moecore/kernels/x86/bf16_operands.h"
#include "moecore/kernels/x86/bf16_streams.h"

namespace moecore {
namespace {

// Every tile is 16 rows × 64 bytes. The int8 × int8 path: A = 16 weight rows × one K step; B = one
// K step of 16 activation rows in VNNI order (dword r of B row p holds activation row r's codes of
// K quad p); C = 16 weight rows × 16 activation rows of int32 results. Tiles 0-3: C of the 2 × 2
// block (weight tile i, activation tile j → tile 2i + j); 4-5: A; 6-7: B.
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
// 16 rows (activation rows in the int8 path, weight rows in the float path) into a VNNI-ordered B
// tile, or an int8-path C tile into activation-row order.
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

// Folds K block b's results c (16 rows from activation row r, ldc sums apart, of which `rows` are
// real, × 16 weight rows with block-b scales sw, `columns` mask the real ones; int32 or fp32 sums)
// into out per the formula with scaled_gemm_ref's operation order, one row of 16 outputs at a time.
template <typename Sum>
void fold_tile(const Sum* c, int64_t ldc, const ActivationCodes& a, int64_t r, int64_t rows,
               const float* sw, __mmask16 columns, int64_t b, int64_t nb, float alpha, float* out,
               int64_t ldo) {
  const __m512 w_scale = _mm512_loadu_ps(sw);
  for (int64_t i = 0; i < rows; ++i) {
    __m512 part;
    if constexpr (std::is_same_v<Sum, int32_t>)
      part = _mm512_cvtepi32_ps(_mm512_load_si512(c + i * ldc));
    else
      part = _mm512_load_ps(c + i * ldc);
    part = _mm512_mul_ps(part, _mm512_set1_ps(a.scale(r + i, b)));
    part = _mm512_mul_ps(part, w_scale);
    float* o = out + i * ldo;
    if (b > 0) part = _mm512_add_ps(_mm512_maskz_loadu_ps(columns, o), part);
    if (b == nb - 1) part = _mm512_mul_ps(part, _mm512_set1_ps(alpha));
    _mm512_mask_storeu_ps(o, columns, part);
  }
}

// Activation rows [0, m ≤ kRowChunk) of the call against weight rows [n0, n0 + n); the tile
// configuration is loaded. packed_rows: the B tiles hold the rows already (KeptRows).
void gemm_chunk(const ActivationCodes& a, int64_t m, const WeightOperand& w, int64_t e, int64_t n0,
                int64_t n, float* out, int64_t ldo, const PaddedK& pk, const Buffers& buffers,
                bool packed_rows) {
  const CodeType type = CodeType::kInt8;
  const int64_t row_bytes = pk.row_bytes(), steps = pk.steps(), nb = pk.num_blocks;
  const int64_t m_padded = (m + 2 * kTileRows - 1) / (2 * kTileRows) * (2 * kTileRows);
  const float alpha = expert_alpha(w, e);
  float* const w_scales = buffers.w_scales;
  if (!packed_rows)
    pack_activation_tiles(a, m, m_padded, pk, type, buffers.w_rows, buffers.b_tiles);

  alignas(64) int32_t c[4 * kTileRows * kTileRows];
  alignas(64) int32_t by_row[kTileRows * kTileRows];  // one C tile in activation-row order
  for (int64_t c0 = 0; c0 < n; c0 += kColumns) {
    const int64_t cols = std::min(kColumns, n - c0);
    const int64_t col_tiles = (cols + 2 * kTileRows - 1) / (2 * kTileRows) * 2;  // whole pairs
    const uint8_t* rows = buffers.w_rows;
    const int64_t stride = row_bytes;
    for (int64_t j = 0; j < cols; ++j) {
      pack_int8_weight_row(w, e, n0 + c0 + j, pk, buffers.w_rows + j * row_bytes,
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
              fold_tile(by_row, kTileRows, a, r, std::min(kTileRows, m - r),
                        w_scales + b * kColumns + col,
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
  const KeptRows kept(a, m, w, kRowChunk);  // a call of one chunk keeps its B tiles
  static const TileConfig config;
  _tile_loadconfig(&config);
  for (int64_t r0 = 0; r0 < m; r0 += kRowChunk)
    gemm_chunk(activation_rows_from(a, r0), std::min(kRowChunk, m - r0), w, e, n0, n,
               out + r0 * ldo, ldo, pk, buffers, kept.reusable());
  _tile_release();
  kept.keep();
}

// ---- bf16-exact operands: TDPBF16PS --------------------------------------------------------
//
// Activation rows are the A operand (16 rows × one 64-byte K step per tile, loaded as they lie in
// a slice of padded bf16 rows) and weights the B operand, in VNNI order (dword n of B row p: weight
// row n's K pair p): each weight tile's K steps are decoded (load_bf16x32) and transposed once per
// chunk of activation rows into L1, where every row tile of the chunk reuses them. C tiles are
// 16 activation rows × 16 weight rows, in the output's own order. K runs in slices of kSliceSteps
// steps; a scale block longer than a slice carries its C tiles across slices through working
// memory (fp32 stores and loads, exact), so each output's sum is the hardware's over its own rows,
// step by step in K order, whatever M, the chunking, the column split or the thread.

// Activation rows per chunk: the weights are decoded once per chunk.
constexpr int64_t kFloatRowChunk = 256;
// K steps per slice: a slice of the chunk's activation rows (272 KiB) stays in L2, a weight tile
// pair's (2 × 16 KiB) in L1.
constexpr int64_t kSliceSteps = 16;
// Activation rows of a slice lie this far apart: a line more than their bytes, so that a tile's
// 16 rows do not share a few cache sets.
constexpr int64_t kSliceBytes = (kSliceSteps + 1) * kStepBytes;
// Weight rows per super block: the activation slice is packed once per super block, and the C
// tiles of its unfinished scale blocks stay in working memory (512 KiB at 256 rows).
constexpr int64_t kSuperColumns = kAmxTilesSuperColumns;
constexpr int64_t kPairRows = 2 * kTileRows;  // weight rows per tile pair

// The tile configuration for row tiles of h0 and h1 real rows (A: tiles 4, 5; h1 = 0 for one row
// tile) against `weight_tiles` weight tiles (B: tiles 6, 7): C tile 2j + i = row tile j × weight
// tile i, h_j rows high, so no padding row is read or multiplied. Unused tiles stay unconfigured
// (0 × 0), as the palette requires.
TileConfig float_tile_config(int64_t h0, int64_t h1, int weight_tiles) {
  TileConfig config;
  for (int t = 0; t < 16; ++t) {
    config.rows[t] = 0;
    config.colsb[t] = 0;
  }
  const int64_t heights[2] = {h0, h1};
  for (int j = 0; j < 2; ++j) {
    if (heights[j] == 0) continue;
    const auto rows = static_cast<uint8_t>(heights[j]);
    config.rows[4 + j] = rows;
    config.colsb[4 + j] = kStepBytes;
    for (int i = 0; i < weight_tiles; ++i) {
      config.rows[2 * j + i] = rows;
      config.colsb[2 * j + i] = kStepBytes;
    }
  }
  for (int i = 0; i < weight_tiles; ++i) {
    config.rows[6 + i] = kTileRows;
    config.colsb[6 + i] = kStepBytes;
  }
  return config;
}

// Real rows of row tile t of a chunk of m rows.
int64_t tile_rows(int64_t m, int64_t t) { return std::min(kTileRows, m - t * kTileRows); }

// The float path's working memory, one layout for every call on the weight operand.
struct FloatBuffers {
  uint8_t* act;       // [kFloatRowChunk, kSliceBytes]: a slice of the chunk's rows, padded bf16
  uint8_t* b_tiles;   // [2 weight tiles, kSliceSteps] VNNI B tiles of the pair's slice
  uint8_t* stage;     // [16, kStepBytes]: one step of a weight tile's rows, decoded
  float* carried;     // [kFloatRowChunk, kSuperColumns]: C tiles of scale blocks not finished
  float* sums;        // [4][16 × 16]: C tiles of a finished block, as stored
  float* w_scales;    // [nb, kSuperColumns]
  FloatBuffers(ScratchCarver& s, const PaddedK& pk)
      : act(s.take<uint8_t>(kFloatRowChunk * kSliceBytes)),
        b_tiles(s.take<uint8_t>(2 * kSliceSteps * kTileBytes)),
        stage(s.take<uint8_t>(kTileBytes)),
        carried(s.take<float>(kFloatRowChunk * kSuperColumns)),
        sums(s.take<float>(4 * kTileRows * kTileRows)),
        w_scales(s.take<float>(pk.num_blocks * kSuperColumns)) {}
};

size_t float_scratch_bytes(const PaddedK& pk) {
  ScratchCarver sizing;
  [[maybe_unused]] const FloatBuffers layout(sizing, pk);
  return sizing.bytes();
}

// Steps [s0, s1) of activation rows [0, m) as bf16 codes, row r at act + r · kSliceBytes (each K
// block padded with zeros to whole steps, as PaddedK lays out a row).
void pack_activation_slice(const ActivationCodes& a, int64_t m, const PaddedK& pk, int64_t s0,
                           int64_t s1, uint8_t* act) {
  const int64_t block_steps = pk.block_steps(0);
  for (int64_t r = 0; r < m; ++r) {
    const float* src = a.row(r);
    uint8_t* dst = act + r * kSliceBytes;
    for (int64_t s = s0; s < s1; ++s) {
      const int64_t b = s / block_steps, i = s - b * block_steps;
      const int64_t k = b * pk.block_k + 32 * i, len = pk.block_len(b) - 32 * i;
      const __m512 lo = _mm512_maskz_loadu_ps(avx512::tail_mask(len), src + k);
      const __m512 hi =
          _mm512_maskz_loadu_ps(avx512::tail_mask(std::max<int64_t>(len - 16, 0)), src + k + 16);
      _mm512_store_si512(dst + (s - s0) * kStepBytes, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
  }
}

// A pair of weight tiles (up to kPairRows rows from weight row `first`) of one call, each K step
// decoded with Stream or, for bf16 rows that are whole tiles with no K padding, read as stored.
template <class Stream>
struct WeightPair {
  const WeightOperand& w;
  const PaddedK& pk;
  Stream streams[2][kTileRows / kMaxChannels];  // channel c of stream q: tile row 4q + c
  int tiles = 0;                                // weight tiles in the pair (1 or 2)
  bool direct = false;                          // steps straight from the contract rows
  WeightPrefetch prefetch;                      // the next pair's rows

  WeightPair(const WeightOperand& weights, const PaddedK& padded, int64_t e, int64_t first,
             int64_t cols)
      : w(weights), pk(padded) {
    tiles = cols > kTileRows ? 2 : 1;
    for (int h = 0; h < tiles; ++h)
      for (int64_t r = 0; r < kTileRows; ++r) {  // rows past the call's end repeat its last row
        const int64_t row = first + std::min<int64_t>(h * kTileRows + r, cols - 1);
        streams[h][r / kMaxChannels].bind(static_cast<int>(r % kMaxChannels), w, e, row);
      }
    prefetch.lead = kPairRows * stream_row_stride(streams[0][0], w);
    direct = std::is_same_v<Stream, DenseStream<DType::kBF16>> && w.k % 32 == 0 &&
             w.data.strides[2] == 1 && first + tiles * kTileRows <= w.n;
  }

  // Step s of weight tile h as a VNNI B tile at dst; the rows' lines of the next pair are
  // prefetched as each line starts.
  void pack_step(int h, int64_t s, uint8_t* stage, uint8_t* dst) const {
    const int64_t b = s / pk.block_steps(0), i = s - b * pk.block_steps(0);
    const int64_t k = b * pk.block_k + 32 * i;
    if ((k * Stream::kHalfBytes / 2 & 63) == 0)
      for (int q = 0; q < kTileRows / kMaxChannels; ++q)  // into L1, as Intel cores keep it
        prefetch_next_tile_step<1, kMaxChannels, Stream::kHalfBytes>(streams[h][q].row, k,
                                                                      prefetch);
    if (direct) {
      const auto* row = static_cast<const uint8_t*>(static_cast<const void*>(streams[h][0].row[0]));
      return transpose_16x16(row + s * kStepBytes, stream_row_stride(streams[0][0], w), dst);
    }
    const __mmask32 mask = avx512::tail_mask32(pk.block_len(b) - 32 * i);
    for (int q = 0; q < kTileRows / kMaxChannels; ++q)
      for (int c = 0; c < kMaxChannels; ++c)
        _mm512_store_si512(stage + (q * kMaxChannels + c) * kStepBytes,
                           load_bf16x32(streams[h][q], c, k, mask));
    transpose_16x16(stage, kStepBytes, dst);
  }
};

// The tile intrinsics take tile numbers as immediates, hence one branch per tile.
template <int kRowTiles, int kWeightTiles>
inline void float_tile_step(const uint8_t* const (&act)[2], const uint8_t* b_tiles) {
  _tile_loadd(4, act[0], kSliceBytes);
  if constexpr (kRowTiles == 2) _tile_loadd(5, act[1], kSliceBytes);
  _tile_loadd(6, b_tiles, kStepBytes);
  if constexpr (kWeightTiles == 2) _tile_loadd(7, b_tiles + kSliceSteps * kTileBytes, kStepBytes);
  _tile_dpbf16ps(0, 4, 6);
  if constexpr (kWeightTiles == 2) _tile_dpbf16ps(1, 4, 7);
  if constexpr (kRowTiles == 2) {
    _tile_dpbf16ps(2, 5, 6);
    if constexpr (kWeightTiles == 2) _tile_dpbf16ps(3, 5, 7);
  }
}

// (Only configured tiles may be touched: an unconfigured one raises #UD.)
template <int kRowTiles, int kWeightTiles>
inline void zero_float_tiles() {
  _tile_zero(0);
  if constexpr (kWeightTiles == 2) _tile_zero(1);
  if constexpr (kRowTiles == 2) {
    _tile_zero(2);
    if constexpr (kWeightTiles == 2) _tile_zero(3);
  }
}

// C tile (j, i) at c + j · 16 · stride_floats + i · 16.
template <int kRowTiles, int kWeightTiles>
inline void load_float_tiles(const float* c, int64_t stride_floats) {
  const int64_t stride = stride_floats * 4, down = kTileRows * stride_floats;
  _tile_loadd(0, c, stride);
  if constexpr (kWeightTiles == 2) _tile_loadd(1, c + kTileRows, stride);
  if constexpr (kRowTiles == 2) {
    _tile_loadd(2, c + down, stride);
    if constexpr (kWeightTiles == 2) _tile_loadd(3, c + down + kTileRows, stride);
  }
}

template <int kRowTiles, int kWeightTiles>
inline void store_float_tiles(float* c, int64_t stride_floats) {
  const int64_t stride = stride_floats * 4, down = kTileRows * stride_floats;
  _tile_stored(0, c, stride);
  if constexpr (kWeightTiles == 2) _tile_stored(1, c + kTileRows, stride);
  if constexpr (kRowTiles == 2) {
    _tile_stored(2, c + down, stride);
    if constexpr (kWeightTiles == 2) _tile_stored(3, c + down + kTileRows, stride);
  }
}

// Row tiles t0 (and t0 + 1) of a chunk of m rows against the pair at column p0 of the super
// block (`cols` real columns), over the slice [s0, s1) whose B tiles are packed: each scale block
// starts from zero or from its carried tiles, and is folded into out (the super block's first
// column of the chunk's row 0) once it ends, else carried on.
template <int kRowTiles, int kWeightTiles>
void float_pair_slice(const ActivationCodes& a, int64_t m, int64_t t0, int64_t p0, int64_t cols,
                      const PaddedK& pk, int64_t s0, int64_t s1, float alpha,
                      const FloatBuffers& buffers, float* out, int64_t ldo) {
  const int64_t block_steps = pk.block_steps(0), nb = pk.num_blocks;
  const uint8_t* const rows[2] = {buffers.act + t0 * kTileRows * kSliceBytes,
                                  buffers.act + (t0 + kRowTiles - 1) * kTileRows * kSliceBytes};
  float* const carried = buffers.carried + t0 * kTileRows * kSuperColumns + p0;
  for (int64_t s = s0; s < s1;) {
    const int64_t b = s / block_steps, block_end = b * block_steps + pk.block_steps(b);
    const int64_t end = std::min(s1, block_end);
    if (s == b * block_steps)
      zero_float_tiles<kRowTiles, kWeightTiles>();
    else
      load_float_tiles<kRowTiles, kWeightTiles>(carried, kSuperColumns);
    for (; s < end; ++s) {
      const uint8_t* const act[2] = {rows[0] + (s - s0) * kStepBytes,
                                     rows[1] + (s - s0) * kStepBytes};
      float_tile_step<kRowTiles, kWeightTiles>(act, buffers.b_tiles + (s - s0) * kTileBytes);
    }
    if (end < block_end) {
      store_float_tiles<kRowTiles, kWeightTiles>(carried, kSuperColumns);
      continue;
    }
    store_float_tiles<kRowTiles, kWeightTiles>(buffers.sums, 2 * kTileRows);
    for (int j = 0; j < kRowTiles; ++j)
      for (int i = 0; i < kWeightTiles; ++i) {
        const int64_t col = p0 + i * kTileRows, r = (t0 + j) * kTileRows;
        if (i * kTileRows >= cols) continue;
        const int64_t real_cols = std::min(kTileRows, cols - i * kTileRows);
        fold_tile(buffers.sums + j * kTileRows * 2 * kTileRows + i * kTileRows, 2 * kTileRows, a, r,
                  tile_rows(m, t0 + j), buffers.w_scales + b * kSuperColumns + col,
                  static_cast<__mmask16>((1u << real_cols) - 1), b, nb, alpha, out + r * ldo + col,
                  ldo);
      }
  }
}

// The tile configuration a row-tile pair needs, loaded only when it changes (loading costs).
struct LoadedConfig {
  int64_t h0 = -1, h1 = -1;
  int weight_tiles = -1;
  void ensure(int64_t new_h0, int64_t new_h1, int new_weight_tiles) {
    if (new_h0 == h0 && new_h1 == h1 && new_weight_tiles == weight_tiles) return;
    const TileConfig config = float_tile_config(new_h0, new_h1, new_weight_tiles);
    _tile_loadconfig(&config);
    h0 = new_h0;
    h1 = new_h1;
    weight_tiles = new_weight_tiles;
  }
};

// Activation rows [0, m ≤ kFloatRowChunk) of the call against weight rows [n0, n0 + n): per
// super block of columns, per K slice, the activation slice is packed once and each weight pair's
// slice once, for every row tile of the chunk.
template <class Stream>
void float_gemm_chunk(const ActivationCodes& a, int64_t m, const WeightOperand& w, int64_t e,
                      int64_t n0, int64_t n, float* out, int64_t ldo, const PaddedK& pk,
                      const FloatBuffers& buffers, LoadedConfig& loaded) {
  const int64_t steps = pk.steps();
  const int64_t row_tiles = (m + kTileRows - 1) / kTileRows;
  const float alpha = expert_alpha(w, e);
  for (int64_t c0 = 0; c0 < n; c0 += kSuperColumns) {
    const int64_t super_cols = std::min(kSuperColumns, n - c0);
    for (int64_t j = 0; j < super_cols; ++j)
      weight_row_scales(w, e, n0 + c0 + j, buffers.w_scales + j, kSuperColumns);
    for (int64_t s0 = 0; s0 < steps; s0 += kSliceSteps) {
      const int64_t s1 = std::min(steps, s0 + kSliceSteps);
      pack_activation_slice(a, m, pk, s0, s1, buffers.act);
      for (int64_t p0 = 0; p0 < super_cols; p0 += kPairRows) {
        const int64_t cols = std::min(kPairRows, super_cols - p0);
        const WeightPair<Stream> pair(w, pk, e, n0 + c0 + p0, cols);
        for (int h = 0; h < pair.tiles; ++h)
          for (int64_t s = s0; s < s1; ++s)
            pair.pack_step(h, s, buffers.stage,
                           buffers.b_tiles + (h * kSliceSteps + s - s0) * kTileBytes);
        for (int64_t t0 = 0; t0 < row_tiles; t0 += 2) {
          const int64_t h1 = t0 + 1 < row_tiles ? tile_rows(m, t0 + 1) : 0;
          loaded.ensure(tile_rows(m, t0), h1, pair.tiles);
          // The tile block's shape as template arguments: row tiles × weight tiles.
          auto run = [&](auto row_tiles_c, auto weight_tiles_c) {
            float_pair_slice<decltype(row_tiles_c)::value, decltype(weight_tiles_c)::value>(
                a, m, t0, p0, cols, pk, s0, s1, alpha, buffers, out + c0, ldo);
          };
          using One = std::integral_constant<int, 1>;
          using Two = std::integral_constant<int, 2>;
          if (h1 > 0)
            pair.tiles == 2 ? run(Two{}, Two{}) : run(Two{}, One{});
          else
            pair.tiles == 2 ? run(One{}, Two{}) : run(One{}, One{});
        }
      }
    }
  }
}

// Each output depends only on its own activation row: chunks of rows are calls of their own.
template <class Stream>
void run_float_tiles(const ActivationCodes& a, int64_t m, const WeightOperand& w, int64_t e,
                     int64_t n0, int64_t n, float* out, int64_t ldo, const PaddedK& pk,
                     const FloatBuffers& buffers) {
  LoadedConfig loaded;
  for (int64_t r0 = 0; r0 < m; r0 += kFloatRowChunk)
    float_gemm_chunk<Stream>(activation_rows_from(a, r0), std::min(kFloatRowChunk, m - r0), w, e,
                             n0, n, out + r0 * ldo, ldo, pk, buffers, loaded);
  _tile_release();
}

void scaled_gemm_float_tiles(const ActivationCodes& a, int64_t m, const WeightOperand& w, int64_t e,
                             int64_t n0, int64_t n, float* out, int64_t ldo) {
  const PaddedK pk(w, CodeType::kBf16);
  ScratchCarver carver(gemm_scratch_memory(a, scaled_gemm_amx_tiles_scratch_bytes(w)));
  const FloatBuffers buffers(carver, pk);
  switch (w.coding) {
    case WeightCoding::kDense:  // bf16 (bf16_operands)
      return run_float_tiles<DenseStream<DType::kBF16>>(a, m, w, e, n0, n, out, ldo, pk, buffers);
    case WeightCoding::kFp8:
      if (fp8_byte_tables())
        return run_float_tiles<Fp8ByteTableStream>(a, m, w, e, n0, n, out, ldo, pk, buffers);
      return run_float_tiles<Fp8Stream>(a, m, w, e, n0, n, out, ldo, pk, buffers);
    case WeightCoding::kInt8:
      return run_float_tiles<Int8AsFloatStream>(a, m, w, e, n0, n, out, ldo, pk, buffers);
    case WeightCoding::kNvfp4:
    case WeightCoding::kMxfp4:
      MOECORE_INTERNAL_CHECK(w.k % fp4_group_size(w.coding) == 0, "fp4 K (", w.k,
                             ") must be a multiple of its scale group");
      if (w.coding == WeightCoding::kNvfp4)
        return run_float_tiles<Fp4Bf16Stream<16>>(a, m, w, e, n0, n, out, ldo, pk, buffers);
      return run_float_tiles<Fp4Bf16Stream<32>>(a, m, w, e, n0, n, out, ldo, pk, buffers);
  }
  MOECORE_INTERNAL_CHECK(false, "unknown weight coding");
}

}  // namespace

size_t scaled_gemm_amx_scratch_bytes(const WeightOperand& w) {
  // int8 codes for int8 weights (integer_operands); calls the avx512_bf16 row takes use its memory.
  size_t bytes = scaled_gemm_avx512_bf16_scratch_bytes(w);
  if (w.coding == WeightCoding::kInt8)
    bytes = std::max(bytes, own_scratch_bytes(PaddedK(w, CodeType::kInt8)));
  return bytes;
}

size_t scaled_gemm_amx_tiles_scratch_bytes(const WeightOperand& w) {
  return std::max(scaled_gemm_amx_scratch_bytes(w),
                  float_scratch_bytes(PaddedK(w, CodeType::kBf16)));
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

void scaled_gemm_amx_tiles(const ActivationCodes& a, int64_t m, const WeightOperand& w, int64_t e,
                           int64_t n0, int64_t n, float* out, int64_t ldo) {
  if (integer_operands(a, w) || !bf16_operands(a, w))
    return scaled_gemm_amx(a, m, w, e, n0, n, out, ldo);
  check_activation_scales(a, w);
  scaled_gemm_float_tiles(a, m, w, e, n0, n, out, ldo);
}

}  // namespace moecore
