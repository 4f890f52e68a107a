// amx row of the scaled-GEMM table (built with AMX flags; reach it only through
// scaled_gemm_kernel, which the ISA level offers only where the OS granted AMX). Weights are the A
// operand (16 weight rows × one 64-byte K step per tile) and activation rows the B operand, put in
// VNNI order once per chunk of rows (dword j of B row p holds activation row j's codes of K pair
// or quad p); a C tile holds 16 weight rows × up to 16 activation rows. Each K block of the
// weight's scale grid accumulates in its own C tiles, which fold with the scales in
// scaled_gemm_ref's order: ((dot_b · sa[r, b]) · sw[c, b]) summed over b in order, then · alpha.
//
// bf16-exact operands, opt-in (scaled_gemm_amx_tiles, MOECORE_AMX_FLOAT_TILES), at every M:
// TDPBF16PS. bf16 weights are loaded into A tiles straight from
// the contract layout; other codings are decoded per K step (load_bf16x32, exactly the vectors the
// avx512_bf16 row multiplies) into a two-step ring of A tiles in L1, the next step decoded while
// the tiles multiply the current one (each weight row read once per chunk of rows). A chunk of more
// than two row tiles decodes each pair of weight tiles once for the whole of K into working memory
// and reuses it for every pair of row tiles. Each output's sum is the hardware's over its own
// weight row and activation row, step by step in K order, whatever M, the chunking, the column
// split or the thread: batch invariant, but not the VDPBF16PS lane order of the avx512_bf16 row
// (equal within the fp32 tolerance). Prefill runs 2.4–3.4× faster than the avx512_bf16 row, decode
// up to 1.5× slower (README, Kernels), so scaled_gemm_amx itself runs the avx512_bf16 row on these
// operands.
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
// weight rows with block-b scales sw, `columns` mask the real ones; int32 or fp32 sums) into out
// per the formula with scaled_gemm_ref's operation order, one row of 16 outputs at a time.
template <typename Sum>
void fold_tile(const Sum* c, const ActivationCodes& a, int64_t r, int64_t rows, const float* sw,
               __mmask16 columns, int64_t b, int64_t nb, float alpha, float* out, int64_t ldo) {
  const __m512 w_scale = _mm512_loadu_ps(sw);
  for (int64_t i = 0; i < rows; ++i) {
    __m512 part;
    if constexpr (std::is_same_v<Sum, int32_t>)
      part = _mm512_cvtepi32_ps(_mm512_load_si512(c + i * kTileRows));
    else
      part = _mm512_load_ps(c + i * kTileRows);
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

// ---- bf16-exact operands: TDPBF16PS --------------------------------------------------------

// Activation rows put in B tiles at a time: their tiles (2·K bytes per row) stay in L2 while every
// weight tile pair of the call passes over them.
constexpr int64_t kFloatRowChunk = 64;
// Chunks of up to this many rows (two row tiles) multiply each weight step as it is decoded;
// longer chunks decode a weight tile pair once for all of K and reuse it for each row-tile pair.
constexpr int64_t kStreamedMaxRows = 2 * kTileRows;
constexpr int64_t kPairRows = 2 * kTileRows;  // weight rows per tile pair

// The tile configuration for weight tiles 0-1 (A: tiles 4, 5) against row tiles of m0 and m1
// real rows (B: tiles 6, 7; m1 = 0 for one row tile): C tile 2i + j = weight tile i × row tile j,
// configured m_j columns wide, so no padding column is read or multiplied. Unused tiles stay
// unconfigured (0 × 0), as the palette requires.
TileConfig float_tile_config(int64_t m0, int64_t m1) {
  TileConfig config;
  for (int t = 0; t < 16; ++t) {
    config.rows[t] = 0;
    config.colsb[t] = 0;
  }
  const int64_t widths[2] = {m0, m1};
  for (int j = 0; j < 2; ++j) {
    if (widths[j] == 0) continue;
    const auto bytes = static_cast<uint16_t>(4 * widths[j]);
    for (int t : {j, 2 + j, 6 + j}) {
      config.rows[t] = kTileRows;
      config.colsb[t] = bytes;
    }
  }
  for (int t : {4, 5}) {
    config.rows[t] = kTileRows;
    config.colsb[t] = kStepBytes;
  }
  return config;
}

// Real rows of row tile t of a chunk of m rows.
int64_t tile_rows(int64_t m, int64_t t) { return std::min(kTileRows, m - t * kTileRows); }

// The float path's working memory, one layout for every call on the weight operand.
struct FloatBuffers {
  uint8_t* b_tiles;   // [kFloatRowChunk / 16, steps] B tiles; tile t's rows 4·rows(t) bytes apart
  uint8_t* rows;      // [16, row_bytes]: a row tile's activation rows as padded bf16 codes
  uint8_t* ring;      // [2 steps][2 tiles] decoded A tiles (streamed chunks)
  uint8_t* block;     // [2 tiles][steps] decoded A tiles (longer chunks)
  float* sums;        // [4][16 × 16] C tiles as stored
  float* by_row;      // [16 × 16] one C tile in activation-row order
  float* w_scales;    // [nb, kPairRows]
  float* row_scales;  // [nb]
  FloatBuffers(ScratchCarver& s, const PaddedK& pk)
      : b_tiles(s.take<uint8_t>(kFloatRowChunk * pk.row_bytes())),
        rows(s.take<uint8_t>(kTileRows * pk.row_bytes())),
        ring(s.take<uint8_t>(4 * kTileBytes)),
        block(s.take<uint8_t>(2 * pk.steps() * kTileBytes)),
        sums(s.take<float>(4 * kTileRows * kTileRows)),
        by_row(s.take<float>(kTileRows * kTileRows)),
        w_scales(s.take<float>(pk.num_blocks * kPairRows)),
        row_scales(s.take<float>(pk.num_blocks)) {}
};

size_t float_scratch_bytes(const PaddedK& pk) {
  ScratchCarver sizing;
  [[maybe_unused]] const FloatBuffers layout(sizing, pk);
  return sizing.bytes();
}

// Activation rows [0, m ≤ kFloatRowChunk) as B tiles: row tile t, step s at
// b_tiles + (t · steps + s) · 1 KiB, B row p (K pair p of the step) 4 · tile_rows(t) bytes long.
void pack_float_activation_tiles(const ActivationCodes& a, int64_t m, const PaddedK& pk,
                                 const FloatBuffers& buffers) {
  const int64_t steps = pk.steps(), row_bytes = pk.row_bytes();
  for (int64_t t = 0; t * kTileRows < m; ++t) {
    const int64_t rows = tile_rows(m, t);
    for (int64_t j = 0; j < rows; ++j)
      pack_codes_row(a.row(t * kTileRows + j), pk, CodeType::kBf16, buffers.rows + j * row_bytes);
    for (int64_t s = 0; s < steps; ++s) {
      uint8_t* tile = buffers.b_tiles + (t * steps + s) * kTileBytes;
      if (rows == kTileRows) {
        transpose_16x16(buffers.rows + s * kStepBytes, row_bytes, tile);
        continue;
      }
      auto* pairs = reinterpret_cast<uint32_t*>(tile);
      for (int64_t j = 0; j < rows; ++j) {
        const auto* src = reinterpret_cast<const uint32_t*>(buffers.rows + j * row_bytes) + s * 16;
        for (int64_t p = 0; p < 16; ++p) pairs[p * rows + j] = src[p];
      }
    }
  }
}

// One K step of the 2 × 2 tile block (kWeightTiles weight tiles × kRowTiles row tiles): A tiles
// at a[i] (rows a_stride bytes apart), B tiles at b[j] (rows b_stride[j] apart).
template <int kWeightTiles, int kRowTiles>
inline void float_tile_step(const uint8_t* const (&a)[2], int64_t a_stride,
                            const uint8_t* const (&b)[2], const int64_t (&b_stride)[2]) {
  _tile_loadd(4, a[0], a_stride);
  if constexpr (kWeightTiles == 2) _tile_loadd(5, a[1], a_stride);
  _tile_loadd(6, b[0], b_stride[0]);
  if constexpr (kRowTiles == 2) _tile_loadd(7, b[1], b_stride[1]);
  // (The tile numbers are the intrinsics' immediates.)
  _tile_dpbf16ps(0, 4, 6);
  if constexpr (kRowTiles == 2) _tile_dpbf16ps(1, 4, 7);
  if constexpr (kWeightTiles == 2) {
    _tile_dpbf16ps(2, 5, 6);
    if constexpr (kRowTiles == 2) _tile_dpbf16ps(3, 5, 7);
  }
}

template <int kWeightTiles, int kRowTiles>
inline void store_float_tiles(float* sums) {
  constexpr int64_t kTileFloats = kTileRows * kTileRows;
  _tile_stored(0, sums, kStepBytes);
  if constexpr (kRowTiles == 2) _tile_stored(1, sums + kTileFloats, kStepBytes);
  if constexpr (kWeightTiles == 2) {
    _tile_stored(2, sums + 2 * kTileFloats, kStepBytes);
    if constexpr (kRowTiles == 2) _tile_stored(3, sums + 3 * kTileFloats, kStepBytes);
  }
}

// (Only configured tiles may be touched: an unconfigured one raises #UD.)
template <int kWeightTiles, int kRowTiles>
inline void zero_float_tiles() {
  _tile_zero(0);
  if constexpr (kRowTiles == 2) _tile_zero(1);
  if constexpr (kWeightTiles == 2) {
    _tile_zero(2);
    if constexpr (kRowTiles == 2) _tile_zero(3);
  }
}

// A pair of weight tiles (up to kPairRows rows from weight row `first`) of one call: where each
// K step's A tiles come from, decoded with Stream or, for bf16 rows that are whole tiles with no K
// padding, read as they are stored.
template <class Stream>
struct WeightPair {
  const WeightOperand& w;
  const PaddedK& pk;
  Stream streams[2][kTileRows / kMaxChannels];  // channel c of stream q: tile row 4q + c
  int tiles = 0;                                // weight tiles in the pair (1 or 2)
  bool direct = false;                          // A tiles straight from the contract rows
  int64_t ahead = 0;                            // prefetch lead: the next pair's rows

  WeightPair(const WeightOperand& weights, const PaddedK& padded, int64_t e, int64_t first,
             int64_t cols)
      : w(weights), pk(padded) {
    tiles = cols > kTileRows ? 2 : 1;
    for (int h = 0; h < tiles; ++h)
      for (int64_t r = 0; r < kTileRows; ++r) {  // rows past the call's end repeat its last row
        const int64_t row = first + std::min<int64_t>(h * kTileRows + r, cols - 1);
        streams[h][r / kMaxChannels].bind(static_cast<int>(r % kMaxChannels), w, e, row);
      }
    const int64_t row_stride = stream_row_stride(streams[0][0], w);
    ahead = kPairRows * row_stride;
    direct = std::is_same_v<Stream, DenseStream<DType::kBF16>> && w.k % 32 == 0 &&
             w.data.strides[2] == 1 && first + tiles * kTileRows <= w.n;
  }
  int64_t direct_stride() const { return stream_row_stride(streams[0][0], w); }
  const uint8_t* direct_tile(int h, int64_t s) const {
    return static_cast<const uint8_t*>(static_cast<const void*>(streams[h][0].row[0])) +
           s * kStepBytes;
  }

  // Step i of K block b of weight tile h, decoded into the 1 KiB tile at dst; the rows' lines of
  // the next pair are prefetched as each line starts.
  void decode(int h, int64_t b, int64_t i, uint8_t* dst) const {
    const int64_t k = b * pk.block_k + 32 * i;
    const __mmask32 mask = avx512::tail_mask32(pk.block_len(b) - 32 * i);
    const bool line_start = (k * Stream::kHalfBytes / 2 & 63) == 0;
    for (int q = 0; q < kTileRows / kMaxChannels; ++q) {
      if (line_start)
        prefetch_next_tile_step<kMaxChannels, Stream::kHalfBytes>(streams[h][q].row, k, ahead);
      for (int c = 0; c < kMaxChannels; ++c)
        _mm512_store_si512(dst + (q * kMaxChannels + c) * kStepBytes,
                           load_bf16x32(streams[h][q], c, k, mask));
    }
  }
};

// The C tiles of K block b (weight tiles × row tiles t0, t0 + 1 of a chunk of m rows) folded into
// out (the chunk's rows, the pair's first column at out).
template <int kWeightTiles, int kRowTiles>
void fold_float_tiles(const ActivationCodes& a, int64_t m, int64_t t0, int64_t cols, int64_t b,
                      int64_t nb, float alpha, const FloatBuffers& buffers, float* out,
                      int64_t ldo) {
  store_float_tiles<kWeightTiles, kRowTiles>(buffers.sums);
  for (int i = 0; i < kWeightTiles; ++i)
    for (int j = 0; j < kRowTiles; ++j) {
      const int64_t col = i * kTileRows, r = (t0 + j) * kTileRows;
      if (col >= cols) continue;
      const int64_t real_cols = std::min(kTileRows, cols - col);
      transpose_16x16(
          reinterpret_cast<const uint8_t*>(buffers.sums + (2 * i + j) * kTileRows * kTileRows),
          kStepBytes, reinterpret_cast<uint8_t*>(buffers.by_row));
      fold_tile(buffers.by_row, a, r, tile_rows(m, t0 + j), buffers.w_scales + b * kPairRows + col,
                static_cast<__mmask16>((1u << real_cols) - 1), b, nb, alpha, out + r * ldo + col,
                ldo);
    }
}

// Row tiles t0 (and t0 + 1) of the chunk against the pair, every K block: A tiles from
// a_tile(b, i, h) — decoded ahead into the ring when `ring`, else given.
template <int kWeightTiles, int kRowTiles, class Stream, class ATile>
void float_pair_rows(const ActivationCodes& a, int64_t m, int64_t t0,
                     const WeightPair<Stream>& pair, int64_t cols, float alpha,
                     const FloatBuffers& buffers, float* out, int64_t ldo, bool ring,
                     ATile a_tile) {
  const PaddedK& pk = pair.pk;
  const int64_t steps = pk.steps(), nb = pk.num_blocks;
  int64_t b_stride[2] = {4 * tile_rows(m, t0), 0};
  if constexpr (kRowTiles == 2) b_stride[1] = 4 * tile_rows(m, t0 + 1);
  const int64_t a_stride = pair.direct ? pair.direct_stride() : kStepBytes;
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t s0 = pk.block_first_step(b), block_steps = pk.block_steps(b);
    zero_float_tiles<kWeightTiles, kRowTiles>();
    if (ring)
      for (int h = 0; h < kWeightTiles; ++h) pair.decode(h, b, 0, buffers.ring + h * kTileBytes);
    for (int64_t i = 0; i < block_steps; ++i) {
      const int64_t s = s0 + i;
      const uint8_t* const tiles_a[2] = {a_tile(b, i, 0), a_tile(b, i, kWeightTiles - 1)};
      const uint8_t* const tiles_b[2] = {
          buffers.b_tiles + (t0 * steps + s) * kTileBytes,
          buffers.b_tiles + ((t0 + kRowTiles - 1) * steps + s) * kTileBytes};
      float_tile_step<kWeightTiles, kRowTiles>(tiles_a, a_stride, tiles_b, b_stride);
      if (ring && i + 1 < block_steps)  // the next step, while the tiles multiply this one
        for (int h = 0; h < kWeightTiles; ++h)
          pair.decode(h, b, i + 1, buffers.ring + (((i + 1) & 1) * 2 + h) * kTileBytes);
    }
    fold_float_tiles<kWeightTiles, kRowTiles>(a, m, t0, cols, b, nb, alpha, buffers, out, ldo);
  }
}

template <int kWeightTiles, int kRowTiles, class Stream, class ATile>
void float_pair_rows_any(const ActivationCodes& a, int64_t m, int64_t t0,
                         const WeightPair<Stream>& pair, int64_t cols, float alpha,
                         const FloatBuffers& buffers, float* out, int64_t ldo, bool ring,
                         ATile a_tile, int64_t (&loaded)[2]) {
  const int64_t widths[2] = {tile_rows(m, t0), kRowTiles == 2 ? tile_rows(m, t0 + 1) : 0};
  if (widths[0] != loaded[0] || widths[1] != loaded[1]) {  // (loading a configuration costs)
    const TileConfig config = float_tile_config(widths[0], widths[1]);
    _tile_loadconfig(&config);
    loaded[0] = widths[0];
    loaded[1] = widths[1];
  }
  float_pair_rows<kWeightTiles, kRowTiles>(a, m, t0, pair, cols, alpha, buffers, out, ldo, ring,
                                           a_tile);
}

// Activation rows [0, m ≤ kFloatRowChunk) of the call against weight rows [n0, n0 + n).
template <class Stream>
void float_gemm_chunk(const ActivationCodes& a, int64_t m, const WeightOperand& w, int64_t e,
                      int64_t n0, int64_t n, float* out, int64_t ldo, const PaddedK& pk,
                      const FloatBuffers& buffers, int64_t (&loaded)[2]) {
  const int64_t steps = pk.steps(), nb = pk.num_blocks;
  const int64_t row_tiles = (m + kTileRows - 1) / kTileRows;
  const float alpha = expert_alpha(w, e);
  pack_float_activation_tiles(a, m, pk, buffers);
  for (int64_t c0 = 0; c0 < n; c0 += kPairRows) {
    const int64_t cols = std::min(kPairRows, n - c0);
    const WeightPair<Stream> pair(w, pk, e, n0 + c0, cols);
    for (int64_t j = 0; j < cols; ++j) {
      weight_row_scales(w, e, n0 + c0 + j, buffers.row_scales);
      for (int64_t b = 0; b < nb; ++b) buffers.w_scales[b * kPairRows + j] = buffers.row_scales[b];
    }
    // Where step i of K block b of weight tile h is read from.
    auto ring_tile = [&](int64_t, int64_t i, int h) {
      return buffers.ring + ((i & 1) * 2 + h) * kTileBytes;
    };
    auto stored_tile = [&](int64_t b, int64_t i, int h) {
      const int64_t s = pk.block_first_step(b) + i;
      return pair.direct ? pair.direct_tile(h, s) : buffers.block + (h * steps + s) * kTileBytes;
    };
    if (m > kStreamedMaxRows && !pair.direct)  // decode the pair once for every row tile
      for (int h = 0; h < pair.tiles; ++h)
        for (int64_t b = 0; b < nb; ++b)
          for (int64_t i = 0; i < pk.block_steps(b); ++i)
            pair.decode(h, b, i,
                        buffers.block + (h * steps + pk.block_first_step(b) + i) * kTileBytes);
    const bool ring = m <= kStreamedMaxRows && !pair.direct;
    float* const pair_out = out + c0;
    for (int64_t t0 = 0; t0 < row_tiles; t0 += 2) {
      const bool two_rows = t0 + 1 < row_tiles;
      // The tile block's shape as template arguments: weight tiles × row tiles.
      auto run = [&](auto a_tile) {
        auto with_weight_tiles = [&](auto weight_tiles) {
          constexpr int kWeightTiles = decltype(weight_tiles)::value;
          if (two_rows)
            float_pair_rows_any<kWeightTiles, 2>(a, m, t0, pair, cols, alpha, buffers, pair_out,
                                                 ldo, ring, a_tile, loaded);
          else
            float_pair_rows_any<kWeightTiles, 1>(a, m, t0, pair, cols, alpha, buffers, pair_out,
                                                 ldo, ring, a_tile, loaded);
        };
        if (pair.tiles == 2)
          with_weight_tiles(std::integral_constant<int, 2>{});
        else
          with_weight_tiles(std::integral_constant<int, 1>{});
      };
      if (ring)
        run(ring_tile);
      else
        run(stored_tile);
    }
  }
}

// Each output depends only on its own activation row: chunks of rows are calls of their own.
template <class Stream>
void run_float_tiles(const ActivationCodes& a, int64_t m, const WeightOperand& w, int64_t e,
                     int64_t n0, int64_t n, float* out, int64_t ldo, const PaddedK& pk,
                     const FloatBuffers& buffers) {
  int64_t loaded[2] = {-1, -1};  // the row-tile widths of the configuration loaded
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
