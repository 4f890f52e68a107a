// avx512_bf16 row of the scaled GEMM table (built with AVX512-BF16/VNNI flags; reach it only
// through scaled_gemm_kernel).
//
// Bf16-exact operands: the weights stream from their contract layout as in the avx512 row
// (weight_streams.h: no copy, no per-call repacking, so decode stays on the memory bound), each
// 32 elements decoded exactly and converted to bf16 in registers, and VDPBF16PS multiplies them
// with the activation rows, converted to bf16 once per chunk of kRowChunk rows. Chunks of more
// rows than a row tile decode each block of columns once into working memory instead
// (walk_decoded), which the dots read as the same bf16 vectors. Each output: per K block, 16 fp32
// lane sums over 32-element steps in increasing order, scaled by sa[r, b] · sw[c, b] and added
// lane by lane in block order; then one canonical pairwise fold, · alpha (tile_lane_sums). So a
// row's result depends on its own activation and weight rows only, never on the other rows of
// the call, nor on threads.
//
// int8 × int8 codes of at least kPackedIntegerMinRows rows: VPDPWSSD on int16 codes in the padded
// layout of bf16_operands.h (exact int32, so bitwise equal to every other row). Other operands
// run the avx512 row. Working memory comes from the call's GemmScratch and never depends on M.
#include "moecore/kernels/x86/bf16_operands.h"
#include "moecore/kernels/x86/bf16_streams.h"

namespace moecore {
namespace {

// Activation rows converted to bf16 at a time (the weights stream once per chunk).
constexpr int64_t kRowChunk = 64;

// Weight rows already decoded: the exact vectors load_bf16x32 gave for them, element k at byte 2k
// of a row (rows row_bytes apart in the call's scratch, from weight row first_row on).
struct DecodedStream {
  static constexpr int kHalfBytes = 4;
  const uint8_t* base;
  int64_t row_bytes, first_row;
  const uint8_t* row[kMaxChannels] = {};
  void bind(int c, const WeightOperand&, int64_t, int64_t r) {
    row[c] = base + (r - first_row) * row_bytes;
  }
  const uint8_t* at(int c, int64_t byte) const { return row[c] + byte; }
  int64_t lead(const WeightOperand&, int channels) const { return channels * row_bytes; }
};

// Unmasked: the stored vector holds what the decode gave for these lanes (zeros past the end).
template <>
inline __m512i load_bf16x32(const DecodedStream& stream, int c, int64_t k, __mmask32) {
  return _mm512_loadu_si512(stream.row[c] + 2 * k);
}

// The line holding element k of each of C channels, `ahead` bytes on (Stream::lead), every step.
template <int C, class Stream>
inline void prefetch_ahead(const Stream& stream, int64_t k, int64_t ahead) {
  for (int c = 0; c < C; ++c)
    _mm_prefetch(reinterpret_cast<const char*>(stream.at(c, k * Stream::kHalfBytes / 2)) + ahead,
                 _MM_HINT_T0);
}

// VDPBF16PS dots of R activation rows (bf16, padded K layout) × C streamed weight rows: the 16
// lane sums of each over one K block (tile_lane_sums scales and folds them).
template <class Stream>
struct Bf16Dots {
  Stream stream;
  const uint8_t* a;        // activation rows, pk.row_stride() apart
  const float* a_scales;  // their scales by K block: sa[r, b] at b · kRowChunk + r
  PaddedK pk;
  int64_t ahead = 0;  // prefetch lead (set by walk)
  static constexpr bool kLaneSums = true;

  /// sa[r0 + r, b] in lane r < R (the other lanes +0).
  template <int R>
  __m512 row_scales(int64_t r0, int64_t b) const {
    return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << R) - 1),
                                 a_scales + b * kRowChunk + r0);
  }

  template <int R, int C>
  void lanes(int64_t r0, int64_t k0, int64_t len, __m512 (&out)[R][C]) const {
    // Local sums, copied out at the end: summing into `out` made GCC store every accumulator on
    // every step (it may alias the byte loads), a store-bound loop.
    __m512 acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    const int64_t row_stride = pk.row_stride();
    const uint8_t* rows = a + r0 * row_stride + pk.block_first_step(k0 / pk.block_k) * kStepBytes;
    for (int64_t i = 0; i < len; i += 32) {
      prefetch_ahead<C>(stream, k0 + i, ahead);
      const __mmask32 mask = avx512::tail_mask32(len - i);
      __m512i wv[C];
      for (int c = 0; c < C; ++c) wv[c] = load_bf16x32(stream, c, k0 + i, mask);
      for (int r = 0; r < R; ++r) {
        const __m512i av = _mm512_loadu_si512(rows + r * row_stride + 2 * i);
        for (int c = 0; c < C; ++c)
          acc[r][c] = _mm512_dpbf16_ps(acc[r][c], reinterpret_cast<__m512bh>(av),
                                       reinterpret_cast<__m512bh>(wv[c]));
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) out[r][c] = acc[r][c];
  }
};

// ---- Decoding once per column block ------------------------------------------------------------
// Chunks of more rows than one row tile of the walk (kWalkRows) decode fp8, fp4 and int8 weights
// once per block of columns into bf16 rows in scratch, instead of once per row tile, then walk the
// block's decoded rows. The dots read the same bf16 vectors either way, so not a bit changes:
// results still depend on neither M nor the chunking. Blocks are sized to stay in L2 beside the
// chunk's activation rows.
constexpr int64_t kDecodeOnceRows = kWalkRows<2> + 1, kDecodedBlockBytes = 256 << 10;

// Weights that are decoded (not bf16 as stored) and whose K blocks start on whole 32-element
// steps, so a decoded row can hold element k at byte 2k.
bool decodes_once(const WeightOperand& w) {
  return w.coding != WeightCoding::kDense && (w.num_k_blocks() == 1 || w.k_block() % 32 == 0);
}
int64_t decoded_row_bytes(const WeightOperand& w) {
  return odd_lines((w.k + 31) / 32 * kStepBytes);
}
int64_t decoded_columns(const WeightOperand& w) {
  return std::clamp<int64_t>(kDecodedBlockBytes / decoded_row_bytes(w), kMaxChannels, 64);
}

// The float path's working memory, one layout for every call on the weight operand.
struct StreamBuffers {
  uint8_t* a_codes;   // [kRowChunk, row_stride]: activation rows as bf16
  float* a_scales;    // [nb, kRowChunk]: their scales by K block
  float* w_scales;    // [kMaxChannels, nb]: K-block scales of the channel tile
  uint8_t* w_decoded;  // [decoded_columns, decoded_row_bytes] when decodes_once(w)
  StreamBuffers(ScratchCarver& s, const WeightOperand& w, const PaddedK& pk)
      : a_codes(s.take<uint8_t>(kRowChunk * pk.row_stride())),
        a_scales(s.take<float>(pk.num_blocks * kRowChunk)),
        w_scales(s.take<float>(kMaxChannels * pk.num_blocks)),
        w_decoded(
            s.take<uint8_t>(decodes_once(w) ? decoded_columns(w) * decoded_row_bytes(w) : 0)) {}
};

// The call's weight rows, a block of decoded_columns at a time: decoded (each row read in order,
// the next one prefetched a row ahead), then walked.
template <class Stream>
void walk_decoded(const Call& call, Stream stream, const PaddedK& pk,
                  const StreamBuffers& buffers) {
  const WeightOperand& w = call.w;
  const int64_t row_bytes = decoded_row_bytes(w), block = decoded_columns(w);
  const int64_t ahead = stream.lead(w, 1);
  for (int64_t c0 = 0; c0 < call.n; c0 += block) {
    const int64_t cols = std::min(block, call.n - c0);
    for (int64_t j = 0; j < cols; ++j) {
      stream.bind(0, w, call.e, call.n0 + c0 + j);
      uint8_t* row = buffers.w_decoded + j * row_bytes;
      for (int64_t b = 0; b < call.nb; ++b) {  // the dots' steps: k0 + i, masked at the block end
        const int64_t k0 = b * call.kb, len = std::min(call.kb, w.k - k0);
        for (int64_t i = 0; i < len; i += 32) {
          prefetch_ahead<1>(stream, k0 + i, ahead);
          const __mmask32 mask = avx512::tail_mask32(len - i);
          _mm512_store_si512(row + 2 * (k0 + i), load_bf16x32(stream, 0, k0 + i, mask));
        }
      }
    }
    const Call part = call.columns_from(c0, cols);
    Bf16Dots<DecodedStream> dots{DecodedStream{buffers.w_decoded, row_bytes, call.n0 + c0},
                                 buffers.a_codes, buffers.a_scales, pk};
    walk_tiles(part, dots);
  }
}

// Rows [0, m) in chunks of kRowChunk, each converted to bf16 (its scales laid out by K block) and
// walked as a call of its own. A call of one chunk keeps its bf16 rows and scales for the next call
// on the same rows (the expert's next column block): converting 32 rows of K = 4096 took a fifth
// of a Mixtral-8x7B layer's time at M = 128 when every block converted them again.
template <class Stream>
void run_streamed(const Call& call, const Stream& stream, const PaddedK& pk,
                  const StreamBuffers& buffers, const KeptRows& kept) {
  for (int64_t r0 = 0; r0 < call.m; r0 += kRowChunk) {
    const int64_t rows = std::min(kRowChunk, call.m - r0);
    const Call part = call.rows_from(r0, rows);
    if (!kept.reusable())
      for (int64_t r = 0; r < rows; ++r) {
        pack_codes_row(part.a.row(r), pk, CodeType::kBf16, buffers.a_codes + r * pk.row_stride());
        for (int64_t b = 0; b < pk.num_blocks; ++b)
          buffers.a_scales[b * kRowChunk + r] = part.a.scale(r, b);
      }
    if (rows >= kDecodeOnceRows && decodes_once(call.w)) {
      walk_decoded(part, stream, pk, buffers);
    } else {
      Bf16Dots<Stream> dots{stream, buffers.a_codes, buffers.a_scales, pk};
      walk_tiles(part, dots);
    }
  }
  kept.keep();
}

size_t stream_scratch_bytes(const WeightOperand& w) {
  ScratchCarver sizing;
  [[maybe_unused]] const StreamBuffers layout(sizing, w, PaddedK(w, CodeType::kBf16));
  return sizing.bytes();
}

void scaled_gemm_streamed(const ActivationCodes& a, int64_t m, const WeightOperand& w, int64_t e,
                          int64_t n0, int64_t n, float* out, int64_t ldo) {
  const PaddedK pk(w, CodeType::kBf16);
  ScratchCarver carver(gemm_scratch_memory(a, scaled_gemm_avx512_bf16_scratch_bytes(w)));
  const StreamBuffers buffers(carver, w, pk);
  const KeptRows kept(a, m, w, kRowChunk);
  const Call call{a, m, w, e, n0, n, out, ldo, pk.num_blocks, pk.block_k, buffers.w_scales};
  // The weight tiles when w has them and the call walks 4-channel tiles (the same codes, one
  // stream per tile), else the contract rows. Walks of 2 channels, and the decode-once pass (a row
  // at a time), would read each tile group several times over, a part of every 64-byte piece each
  // time: from memory, 8 × 16384 × 2048 bf16 took 10.2 ms reading the tiles and 7.5 ms reading the
  // rows (Zen 4, 2026-11-27, moecore_gemm_timing --tiles, alternating runs of the two builds).
  const auto run = [&](auto stream) {
    stream.tiled = w.tiles.data != nullptr && m <= kFourChannelMaxRows;
    run_streamed(call, stream, pk, buffers, kept);
  };
  switch (w.coding) {
    case WeightCoding::kDense:  // bf16 (bf16_operands)
      return run(DenseStream<DType::kBF16>{});
    case WeightCoding::kFp8:
      return run(Fp8Stream{});
    case WeightCoding::kInt8:
      return run(Int8AsFloatStream{});
    case WeightCoding::kNvfp4:
    case WeightCoding::kMxfp4:
      MOECORE_INTERNAL_CHECK(w.k % fp4_group_size(w.coding) == 0, "fp4 K (", w.k,
                             ") must be a multiple of its scale group");
      if (w.coding == WeightCoding::kNvfp4) return run(Fp4Bf16Stream<16>{});
      return run(Fp4Bf16Stream<32>{});
  }
  MOECORE_INTERNAL_CHECK(false, "unknown weight coding");
}

// ---- int8 × int8 codes: packed int16 rows -----------------------------------------------------

constexpr int64_t kColumnBlock = 64;  // weight rows packed at a time (L2), reused by every row
constexpr int kRows = 4, kCols = 4;   // register block: kRows × kCols accumulators

// The integer path's working memory, one layout for every call on the weight operand.
struct PackedBuffers {
  uint8_t* a_codes;  // [kRowChunk, row_stride]: packed activation rows
  uint8_t* w_codes;  // [kColumnBlock, row_stride]: packed weight rows
  float* w_scales;   // [kColumnBlock, nb]
  PackedBuffers(ScratchCarver& s, const PaddedK& pk)
      : a_codes(s.take<uint8_t>(kRowChunk * pk.row_stride())),
        w_codes(s.take<uint8_t>(kColumnBlock * pk.row_stride())),
        w_scales(s.take<float>(kColumnBlock * pk.num_blocks)) {}
};

size_t packed_scratch_bytes(const WeightOperand& w) {
  ScratchCarver sizing;
  [[maybe_unused]] const PackedBuffers layout(sizing, PaddedK(w, CodeType::kInt16));
  return sizing.bytes();
}

// Adds block b's partial dot of (row r, a weight row with scale w_scale) into *acc with the
// operation order of scaled_gemm_ref: ((dot · sa[r, b]) · sw[c, b]), summed over b in order.
void fold_block(float dot, const ActivationCodes& a, int64_t r, int64_t b, float w_scale,
                float* acc) {
  const float part = dot * a.scale(r, b) * w_scale;
  *acc = b == 0 ? part : *acc + part;
}

// Exact int32 dots of kRows activation rows with kCols weight rows over steps [s0, s1).
void int_dot_block(const uint8_t* a, const uint8_t* w, int64_t row_stride, int64_t s0, int64_t s1,
                   float dots[kRows][kCols]) {
  __m512i acc[kRows][kCols];
  for (auto& row : acc)
    for (auto& v : row) v = _mm512_setzero_si512();
  for (int64_t s = s0; s < s1; ++s) {
    __m512i av[kRows], wv[kCols];
    for (int i = 0; i < kRows; ++i) av[i] = _mm512_loadu_si512(a + i * row_stride + s * kStepBytes);
    for (int j = 0; j < kCols; ++j) wv[j] = _mm512_loadu_si512(w + j * row_stride + s * kStepBytes);
    for (int i = 0; i < kRows; ++i)
      for (int j = 0; j < kCols; ++j) acc[i][j] = _mm512_dpwssd_epi32(acc[i][j], av[i], wv[j]);
  }
  for (int i = 0; i < kRows; ++i)
    for (int j = 0; j < kCols; ++j)
      dots[i][j] = static_cast<float>(_mm512_reduce_add_epi32(acc[i][j]));
}

// Activation rows [0, m ≤ kRowChunk) of the call against weight rows [n0, n0 + n).
// (packed_rows: the chunk's rows are packed already, by an earlier call: KeptRows.)
void int_gemm_chunk(const ActivationCodes& a, int64_t m, const WeightOperand& w, int64_t e,
                    int64_t n0, int64_t n, float* out, int64_t ldo, const PaddedK& pk,
                    const PackedBuffers& buffers, bool packed_rows) {
  const int64_t row_stride = pk.row_stride(), nb = pk.num_blocks;
  const int64_t m_padded = (m + kRows - 1) / kRows * kRows;
  const float alpha = expert_alpha(w, e);
  if (!packed_rows) {
    for (int64_t r = 0; r < m; ++r)
      pack_codes_row(a.row(r), pk, CodeType::kInt16, buffers.a_codes + r * row_stride);
    std::memset(buffers.a_codes + m * row_stride, 0,
                static_cast<size_t>((m_padded - m) * row_stride));
  }

  for (int64_t c0 = 0; c0 < n; c0 += kColumnBlock) {
    const int64_t cols = std::min(kColumnBlock, n - c0);
    const int64_t cols_padded = (cols + kCols - 1) / kCols * kCols;
    for (int64_t c = 0; c < cols; ++c)
      pack_int8_weight_row(w, e, n0 + c0 + c, pk, CodeType::kInt16,
                           buffers.w_codes + c * row_stride, buffers.w_scales + c * nb);
    std::memset(buffers.w_codes + cols * row_stride, 0,
                static_cast<size_t>((cols_padded - cols) * row_stride));
    for (int64_t r0 = 0; r0 < m; r0 += kRows)
      for (int64_t j0 = 0; j0 < cols; j0 += kCols)
        for (int64_t b = 0; b < nb; ++b) {
          float dots[kRows][kCols];
          const int64_t s0 = pk.block_first_step(b);
          int_dot_block(buffers.a_codes + r0 * row_stride, buffers.w_codes + j0 * row_stride,
                        row_stride, s0, s0 + pk.block_steps(b), dots);
          for (int i = 0; i < kRows && r0 + i < m; ++i)
            for (int j = 0; j < kCols && j0 + j < cols; ++j) {
              float* o = out + (r0 + i) * ldo + c0 + j0 + j;
              fold_block(dots[i][j], a, r0 + i, b, buffers.w_scales[(j0 + j) * nb + b], o);
              if (b == nb - 1) *o *= alpha;
            }
        }
  }
}

void scaled_gemm_packed_int8(const ActivationCodes& a, int64_t m, const WeightOperand& w, int64_t e,
                             int64_t n0, int64_t n, float* out, int64_t ldo) {
  const PaddedK pk(w, CodeType::kInt16);
  ScratchCarver carver(gemm_scratch_memory(a, scaled_gemm_avx512_bf16_scratch_bytes(w)));
  const PackedBuffers buffers(carver, pk);
  const KeptRows kept(a, m, w, kRowChunk);  // a call of one chunk keeps its packed rows
  // Each output depends only on its own activation row: chunks of rows are calls of their own.
  for (int64_t r0 = 0; r0 < m; r0 += kRowChunk)
    int_gemm_chunk(activation_rows_from(a, r0), std::min(kRowChunk, m - r0), w, e, n0, n,
                   out + r0 * ldo, ldo, pk, buffers, kept.reusable());
  kept.keep();
}

}  // namespace

size_t scaled_gemm_avx512_bf16_scratch_bytes(const WeightOperand& w) {
  // Calls the avx512 row takes use its memory.
  size_t bytes = std::max(stream_scratch_bytes(w), scaled_gemm_avx512_scratch_bytes(w));
  if (w.coding == WeightCoding::kInt8) bytes = std::max(bytes, packed_scratch_bytes(w));
  return bytes;
}

void scaled_gemm_avx512_bf16(const ActivationCodes& a, int64_t m, const WeightOperand& w,
                             int64_t e, int64_t n0, int64_t n, float* out, int64_t ldo) {
  if (integer_operands(a, w)) {
    if (m < kPackedIntegerMinRows) return scaled_gemm_avx512(a, m, w, e, n0, n, out, ldo);
    check_activation_scales(a, w);
    return scaled_gemm_packed_int8(a, m, w, e, n0, n, out, ldo);
  }
  if (!bf16_operands(a, w)) return scaled_gemm_avx512(a, m, w, e, n0, n, out, ldo);
  check_activation_scales(a, w);
  scaled_gemm_streamed(a, m, w, e, n0, n, out, ldo);
}

}  // namespace moecore
