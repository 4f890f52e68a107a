// avx512_bf16 row of the scaled GEMM table (built with AVX512-BF16/VNNI flags; reach it only
// through scaled_gemm_kernel).
//
// Bf16-exact operands: the weights stream from their contract layout as in the avx512 row
// (weight_streams.h: no copy, no per-call repacking, so decode stays on the memory bound), each
// 32 elements (64 for fp8's byte tables, in paired order; a 64-byte piece of 128 for fp4 weight
// tiles: bf16_streams.h) decoded exactly and converted to bf16 in registers, and VDPBF16PS
// multiplies them with the activation rows, converted to bf16 (in the same order) once per chunk
// of kRowChunk rows. Chunks of more rows than a row tile decode each block of columns once into
// working memory instead (walk_decoded; on AMD cores fp4 chunks of up to 24 rows walk the weight
// tiles), which the dots read as the same bf16 vectors. Each output: per K block, 16 fp32 lane
// sums over 32-element steps in increasing order, summed within each 128-bit chunk, scaled by
// sa[r, b] · sw[c, b] and added chunk by chunk in block order; then the 4 chunk totals folded,
// · alpha (tile_lane_sums). So a row's result depends on its own activation and weight rows only,
// never on the other rows of the call, nor on threads.
//
// int8 × int8 codes: VPDPBUSD on the int8 weights as streamed, against activation bytes in the
// padded layout of bf16_operands.h (exact int32, so bitwise equal to every other row). Other
// operands run the avx512 row. Working memory comes from the call's GemmScratch and never depends
// on M.
#include "moecore/kernels/x86/bf16_operands.h"
#include "moecore/kernels/x86/bf16_streams.h"

namespace moecore {
namespace {

// Activation rows converted to bf16 at a time (the weights stream once per chunk).
constexpr int64_t kRowChunk = 64;

// Rows of row_stride bytes the working memory keeps (kept_row_bytes): whole chunks, at least one.
// When a call's rows fit, each chunk gets a place of its own, so an expert's rows are converted
// once for all its column blocks rather than once per block. With one chunk's place, calls of more
// rows converted them again for every block: 10 % of a Qwen3-30B-A3B bf16 layer's time at
// M = 4096 (256 rows an expert, 12 blocks), 5.5 % at M = 1024 (Zen 4, one thread, perf). With
// 4 MiB of room, Mixtral-8x7B's experts (256 and 1024 rows at M = 1024 and 4096, up to 28 KiB a
// row) still converted them for every block: its bf16 layer took 1.13–1.18 / 1.53–1.56× the time
// it takes with 64 MiB (Zen 4, 2 threads; bench/RESULTS.md).
int64_t kept_rows(int64_t row_stride) {
  return std::max<int64_t>(1, kept_row_bytes() / (kRowChunk * row_stride)) * kRowChunk;
}

// The first row of the place where a call of m rows converts its chunk from row r0: its own
// when all m rows fit in `capacity`, else the first chunk's (each chunk overwrites the last).
int64_t chunk_place(int64_t r0, int64_t m, int64_t capacity) { return m <= capacity ? r0 : 0; }

// Weight rows already decoded: the exact vectors load_bf16x32 gave for them, element k at byte 2k
// of a row (rows row_bytes apart in the call's scratch, from weight row first_row on). With
// fetch_next, the walk over them prefetches, into L2, the contract rows the next block of the call
// decodes (`next`), so that their reads from memory overlap these dots instead of stalling the
// decode that follows (walk_decoded).
struct DecodedStream {
  static constexpr int kHalfBytes = 4;
  const uint8_t* base;
  int64_t row_bytes, first_row;
  bool fetch_next;
  // Row r's contract row in the next block: source + (r + ahead) · source_stride, element k at
  // byte k · source_half_bytes / 2 (the decoded stream's kHalfBytes), clamped to the call's rows.
  const uint8_t* source;
  int64_t source_stride, ahead, last_row;
  int source_half_bytes;
  const uint8_t* row[kMaxChannels] = {};
  const uint8_t* next[kMaxChannels] = {};
  void bind(int c, const WeightOperand&, int64_t, int64_t r) {
    row[c] = base + (r - first_row) * row_bytes;
    next[c] = source + std::min(r + ahead, last_row) * source_stride;
  }
  const uint8_t* at(int c, int64_t byte) const { return row[c] + byte; }
  int64_t lead(const WeightOperand&, int channels) const { return channels * row_bytes; }
  /// Channel c's next-block line holding element k, once per line.
  void prefetch_next(int c, int64_t k) const {
    const int64_t byte = k * source_half_bytes >> 1;
    if (fetch_next && (byte & 63) == 0)
      _mm_prefetch(reinterpret_cast<const char*>(next[c] + byte), _MM_HINT_T1);
  }
};

// Unmasked: the stored vector holds what the decode gave for these lanes (zeros past the end).
template <>
inline __m512i load_bf16x32(const DecodedStream& stream, int c, int64_t k, __mmask32) {
  return _mm512_loadu_si512(stream.row[c] + 2 * k);
}

// The line holding element k of each of C channels, `prefetch.lead` bytes on (Stream::lead),
// every step, for tiles of R activation rows (kLight: WeightPrefetch). k ≥ 0, so its byte is a
// shift (a signed division by 2 took three instructions in fp4 steps). Decoded rows are in L2
// already: a walk over them fetches the next block's contract rows instead (DecodedStream).
template <int R, int C, bool kLight, class Stream>
inline void prefetch_ahead(const Stream& stream, int64_t k, const WeightPrefetch& prefetch) {
  for (int c = 0; c < C; ++c) {
    if constexpr (std::is_same_v<Stream, DecodedStream>)
      stream.prefetch_next(c, k);
    else
      prefetch.line<R, kLight>(stream.at(c, k * Stream::kHalfBytes >> 1));
  }
}

// VDPBF16PS dots of R activation rows (bf16, padded K layout) × C streamed weight rows: the 16
// lane sums of each over one K block (tile_lane_sums scales and folds them).
template <class Stream>
struct Bf16Dots {
  Stream stream;
  const uint8_t* a;        // activation rows, pk.row_stride() apart
  const float* a_scales;  // their scales by K block: sa[r, b] at b · kRowChunk + r
  PaddedK pk;
  WeightPrefetch prefetch = {};  // set by walk
  static constexpr bool kLaneSums = true;
  // Lines of bf16 codes read as they lie take one VDPBF16PS per row (WeightPrefetch).
  static constexpr bool kLightLines = std::is_same_v<Stream, DenseStream<DType::kBF16>>;

  /// sa[r, b].
  float row_scale(int64_t r, int64_t b) const { return a_scales[b * kRowChunk + r]; }

  template <int R, int C>
  void lanes(int64_t r0, int64_t b, int64_t k0, int64_t len, __m512 (&out)[R][C]) const {
    // Local sums, copied out at the end: summing into `out` made GCC store every accumulator on
    // every step (it may alias the byte loads), a store-bound loop.
    __m512 acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    const int64_t row_stride = pk.row_stride();
    const uint8_t* rows = a + r0 * row_stride + pk.block_first_step(b) * kStepBytes;
    // The stream in place, not a local copy: with a copy, bf16 decode from the weight tiles got
    // faster in single calls and 1.3x slower in layers (Zen 4; bench/RESULTS.md), not explained.
    const WeightPrefetch pf = prefetch;  // the prefetch, unlike the stream, copied: its test hoists
    if constexpr (kWholePieces<Stream>) {
      for (int64_t i = 0; i < len; i += kPieceElements) {  // one line of codes: one prefetch
        prefetch_ahead<R, C, kLightLines>(stream, k0 + i, pf);
        if (len - i >= kPieceElements)
          piece_dots(rows, row_stride, k0, i, kPieceElements, acc);
        else  // the block's last piece, which ends early
          piece_dots(rows, row_stride, k0, i, len - i, acc);
      }
    } else {
      int64_t i = 0;
      if constexpr (kPairedSteps<Stream>) {
        // Whole groups without a mask, then a partial last one that is still a group.
        for (; i + 64 <= len; i += 64) pair<R, C>(rows, row_stride, k0, i, ~__mmask64{0}, pf, acc);
        if (paired_group(len, i / 64)) {
          pair<R, C>(rows, row_stride, k0, i, avx512::tail_mask64(len - i), pf, acc);
          i += 64;
        }
      }
      // Steps in element order (the last one of a paired block): whole ones without a mask, then
      // the block's partial last one. With a mask computed on every step, bf16 calls took longer
      // (Zen 4, one call, warm, best of 11: 64 × 1536 × 2048 1.09×, 2 to 16 rows 1.05-1.11×).
      for (; i + 32 <= len; i += 32) step<R, C>(rows, row_stride, k0, i, ~__mmask32{0}, pf, acc);
      if (i < len) step<R, C>(rows, row_stride, k0, i, avx512::tail_mask32(len - i), pf, acc);
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) out[r][c] = acc[r][c];
  }

  // One paired group of 64 elements from k0 + i (kPairedSteps), `mask` its lanes in the K block:
  // one line of codes, one prefetch.
  template <int R, int C>
  [[gnu::always_inline]] inline void pair(const uint8_t* rows, int64_t row_stride, int64_t k0,
                                          int64_t i, __mmask64 mask, const WeightPrefetch& pf,
                                          __m512 (&acc)[R][C]) const {
    prefetch_ahead<R, C, kLightLines>(stream, k0 + i, pf);
    __m512i w0[C], w1[C];
    for (int c = 0; c < C; ++c) load_bf16x64(stream, c, k0 + i, mask, w0[c], w1[c]);
    for (int r = 0; r < R; ++r) {
      const uint8_t* row = rows + r * row_stride + 2 * i;
      const __m512i a0 = _mm512_loadu_si512(row), a1 = _mm512_loadu_si512(row + kStepBytes);
      for (int c = 0; c < C; ++c) {
        acc[r][c] = _mm512_dpbf16_ps(acc[r][c], reinterpret_cast<__m512bh>(a0),
                                     reinterpret_cast<__m512bh>(w0[c]));
        acc[r][c] = _mm512_dpbf16_ps(acc[r][c], reinterpret_cast<__m512bh>(a1),
                                     reinterpret_cast<__m512bh>(w1[c]));
      }
    }
  }

  // One step of 32 elements from k0 + i, `mask` its lanes in the K block.
  template <int R, int C>
  [[gnu::always_inline]] inline void step(const uint8_t* rows, int64_t row_stride, int64_t k0,
                                          int64_t i, __mmask32 mask, const WeightPrefetch& pf,
                                          __m512 (&acc)[R][C]) const {
    prefetch_ahead<R, C, kLightLines>(stream, k0 + i, pf);
    __m512i wv[C];
    for (int c = 0; c < C; ++c) wv[c] = load_bf16x32(stream, c, k0 + i, mask);
    for (int r = 0; r < R; ++r) {
      const __m512i av = _mm512_loadu_si512(rows + r * row_stride + 2 * i);
      for (int c = 0; c < C; ++c)
        acc[r][c] = _mm512_dpbf16_ps(acc[r][c], reinterpret_cast<__m512bh>(av),
                                     reinterpret_cast<__m512bh>(wv[c]));
    }
  }

  // The steps of one piece (kWholePieces): elements [k0 + i, k0 + i + min(left, 128)), each
  // step's dots in order, as single steps would take them (so bitwise the contract rows' results).
  template <int R, int C>
  void piece_dots(const uint8_t* rows, int64_t row_stride, int64_t k0, int64_t i, int64_t left,
                  __m512 (&acc)[R][C]) const {
    __m512i pieces[C];
    const uint8_t* scale_codes[C];
    for (int c = 0; c < C; ++c) {
      pieces[c] = load_piece(stream, c, k0 + i);
      scale_codes[c] = piece_scale_codes(stream, c, k0 + i);
    }
    for (int s = 0; s < kPieceSteps && 32 * s < left; ++s) {
      __m512i wv[C];
      for (int c = 0; c < C; ++c)
        wv[c] = next_step_bf16(stream, pieces[c], scale_codes[c], left - 32 * s);
      for (int r = 0; r < R; ++r) {
        const __m512i av = _mm512_loadu_si512(rows + r * row_stride + 2 * (i + 32 * s));
        for (int c = 0; c < C; ++c)
          acc[r][c] = _mm512_dpbf16_ps(acc[r][c], reinterpret_cast<__m512bh>(av),
                                       reinterpret_cast<__m512bh>(wv[c]));
      }
    }
  }
};

// ---- Decoding once per column block ------------------------------------------------------------
// Chunks of more rows than one 2-channel tile of the walk (kWalkRows) decode fp8, fp4 and int8
// weights once per block of columns into bf16 rows in scratch, instead of once per row tile, then
// walk the block's decoded rows. The dots read the same bf16 vectors either way, so not a bit
// changes: results still depend on neither M nor the chunking. Blocks are sized to stay in L2
// beside the chunk's activation rows.
constexpr int64_t kDecodeOnceRows = kWalkRows<2, true> + 1, kDecodedBlockBytes = 256 << 10;
// A block is decoded once for all of a call's chunks only while their activation rows take at most
// this much: every block walks all of them, and more rows streamed from L3 for every block of
// columns cost more than decoding each block once per chunk: walked so, Mixtral-8x7B's prefill
// experts (7 and 28 MiB of rows at M = 1024 and 4096, 8 columns a block at K = 14336) took 1.07 /
// 1.11× the time they took when a 4 MiB room sent them chunk by chunk (mxfp4 / nvfp4 at M = 4096;
// Zen 4, 2 threads, bench/RESULTS.md).
constexpr int64_t kDecodeForAllChunksBytes = 4 << 20;

// Weights that are decoded (not bf16 as stored) and whose K blocks start on whole 32-element
// steps, so a decoded row can hold element k at byte 2k.
bool decodes_once(const WeightOperand& w) {
  return w.coding != WeightCoding::kDense && (w.num_k_blocks() == 1 || w.k_block() % 32 == 0);
}
int64_t decoded_row_bytes(const WeightOperand& w) {
  return odd_lines((w.k + 31) / 32 * kStepBytes);
}
// Whole 4-channel tiles: a block of 9 columns (K = 14336) walked a last tile of one real channel
// and three repeated ones (Zen 4, one call, best of 11: 64 × 512 × 14336 fp8 took 1.2× the time,
// 64 × 512 × 7168 mxfp4 1.1×, 64 × 512 × 2880 nvfp4 1.08×).
int64_t decoded_columns(const WeightOperand& w) {
  const int64_t fit = kDecodedBlockBytes / decoded_row_bytes(w) / kMaxChannels * kMaxChannels;
  return std::clamp<int64_t>(fit, kMaxChannels, 64);
}

// The float path's working memory, one layout for every call on the weight operand.
struct StreamBuffers {
  int64_t capacity;    // kept_rows: activation rows the buffers hold, whole chunks
  uint8_t* a_codes;    // [capacity, row_stride]: activation rows as bf16
  float* a_scales;     // [capacity / kRowChunk, nb, kRowChunk]: their scales by chunk, K block
  float* w_scales;     // [nb, kMaxChannels]: K-block scales of the channel tile
  uint8_t* w_decoded;  // [decoded_columns, decoded_row_bytes] when decodes_once(w)
  StreamBuffers(ScratchCarver& s, const WeightOperand& w, const PaddedK& pk)
      : capacity(kept_rows(pk.row_stride())),
        a_codes(s.take<uint8_t>(capacity * pk.row_stride())),
        a_scales(s.take<float>(pk.num_blocks * capacity)),
        w_scales(s.take<float>(kMaxChannels * pk.num_blocks)),
        w_decoded(
            s.take<uint8_t>(decodes_once(w) ? decoded_columns(w) * decoded_row_bytes(w) : 0)) {}

  /// The bf16 rows and scales of the chunk of a call of m rows from row r0 (chunk_place).
  struct Chunk {
    uint8_t* codes;
    float* scales;
  };
  Chunk chunk(const PaddedK& pk, int64_t r0, int64_t m) const {
    const int64_t place = chunk_place(r0, m, capacity);
    return {a_codes + place * pk.row_stride(), a_scales + place * pk.num_blocks};
  }
};

// The call's weight rows, a block of decoded_columns at a time: decoded (each row read in order,
// the next one prefetched a row ahead), then walked by each chunk of the call's rows, converted
// already in their places (StreamBuffers::chunk). So a block is decoded once for all the chunks
// that fit the buffers: decoding it again for every chunk, calls of 256 × 1536 × 2048 took
// 1.05-1.07× the time (mxfp4, nvfp4, fp8; Zen 4, one call, best of 7). On AMD cores the walks
// fetch the next block's rows into L2 (DecodedStream::fetch_next), so only a call's first block
// waits on memory: Qwen3-30B-A3B fp8 at M = 128 (about 8 rows an expert) spent 23 % of its time
// in decodes waiting so (Zen 4, 1 thread, perf), and took 0.93-0.94× the time with the fetch at 1
// and 2 threads. The 16-core Xeon took 1.1-1.3× the time with it at 16 threads (1.0× at one), so
// Intel cores fetch nothing ahead here (bench/RESULTS.md).
// The call's converted rows lie where StreamBuffers::chunk puts rows [row0, row0 + call.m) of a
// call of `rows` rows: the call itself (row0 0), or one chunk of a longer one.
template <class Stream>
void walk_decoded(const Call& call, Stream stream, const PaddedK& pk, const StreamBuffers& buffers,
                  int64_t row0, int64_t rows) {
  const WeightOperand& w = call.w;
  const int64_t row_bytes = decoded_row_bytes(w), block = decoded_columns(w);
  const WeightPrefetch prefetch = WeightPrefetch::ahead_by(stream.lead(w, 1));
  MOECORE_INTERNAL_CHECK(!stream.tiled, "a decode-once walk reads the contract rows");
  const auto* source = static_cast<const uint8_t*>(w.data.at({call.e, 0, 0}));
  const int64_t source_stride = w.data.strides[1] * dtype_size(w.data.dtype);
  for (int64_t c0 = 0; c0 < call.n; c0 += block) {
    const int64_t cols = std::min(block, call.n - c0);
    for (int64_t j = 0; j < cols; ++j) {
      stream.bind(0, w, call.e, call.n0 + c0 + j);
      uint8_t* row = buffers.w_decoded + j * row_bytes;
      for (int64_t b = 0; b < call.nb; ++b) {  // the dots' steps: k0 + i, masked at the block end
        const int64_t k0 = b * call.kb, len = std::min(call.kb, w.k - k0);
        int64_t i = 0;
        if constexpr (kPairedSteps<Stream>) {
          for (; paired_group(len, i / 64); i += 64) {
            prefetch_ahead<1, 1, false>(stream, k0 + i, prefetch);
            __m512i first, second;
            load_bf16x64(stream, 0, k0 + i, avx512::tail_mask64(len - i), first, second);
            _mm512_store_si512(row + 2 * (k0 + i), first);
            _mm512_store_si512(row + 2 * (k0 + i) + kStepBytes, second);
          }
        }
        for (; i < len; i += 32) {
          // Into L1, as for one row: each line takes only its decode (into L2, Qwen3-30B-A3B
          // fp8 and nvfp4 at M = 128 took 1.03-1.05x the time; Zen 4, 1 thread).
          prefetch_ahead<1, 1, false>(stream, k0 + i, prefetch);
          const __mmask32 mask = avx512::tail_mask32(len - i);
          _mm512_store_si512(row + 2 * (k0 + i), load_bf16x32(stream, 0, k0 + i, mask));
        }
      }
    }
    const Call block_call = call.columns_from(c0, cols);
    const bool fetch_next = cpu_features().vendor_amd && c0 + cols < call.n;
    const DecodedStream decoded{buffers.w_decoded, row_bytes, call.n0 + c0, fetch_next, source,
                                source_stride, /*ahead=*/block,
                                /*last_row=*/call.n0 + call.n - 1, Stream::kHalfBytes};
    for (int64_t r0 = 0; r0 < call.m; r0 += kRowChunk) {
      const StreamBuffers::Chunk chunk = buffers.chunk(pk, row0 + r0, rows);
      Bf16Dots<DecodedStream> dots{decoded, chunk.codes, chunk.scales, pk};
      walk_tiles(block_call.rows_from(r0, std::min(kRowChunk, call.m - r0)), dots);
    }
  }
}

// Converts the chunk of a call's rows `part` into `chunk`: bf16 rows (in paired order for a paired
// stream) and their scales laid out by K block.
template <class Stream>
void convert_chunk(const Call& part, const PaddedK& pk, const StreamBuffers::Chunk& chunk) {
  for (int64_t r = 0; r < part.m; ++r) {
    pack_codes_row(part.a.row(r), pk, CodeType::kBf16, chunk.codes + r * pk.row_stride(),
                   kPairedSteps<Stream>);
    for (int64_t b = 0; b < pk.num_blocks; ++b)
      chunk.scales[b * kRowChunk + r] = part.a.scale(r, b);
  }
}

// Rows [0, m) in chunks of kRowChunk, each converted to bf16 (its scales laid out by K block) and
// walked as a call of its own. A call whose rows all fit the buffers keeps its bf16 rows and
// scales for the next call on the same rows (the expert's next column block): converting 32 rows
// of K = 4096 took a fifth of a Mixtral-8x7B layer's time at M = 128 when every block converted
// them again.
template <class Stream>
void run_streamed(const Call& call, const Stream& stream, const PaddedK& pk,
                  const StreamBuffers& buffers, const KeptRows& kept) {
  // Streams of whole pieces read the weight tiles, in tiles of 4 channels (reads_weight_tiles).
  if constexpr (!kWholePieces<Stream>) {
    const bool all_chunks_near = call.m * pk.row_stride() <= kDecodeForAllChunksBytes;
    if (call.m >= kDecodeOnceRows && call.m <= buffers.capacity && all_chunks_near &&
        decodes_once(call.w)) {
      // Every chunk in its place, then each block of columns decoded once for all of them.
      for (int64_t r0 = 0; r0 < call.m && !kept.reusable(); r0 += kRowChunk)
        convert_chunk<Stream>(call.rows_from(r0, std::min(kRowChunk, call.m - r0)), pk,
                              buffers.chunk(pk, r0, call.m));
      walk_decoded(call, stream, pk, buffers, 0, call.m);
      kept.keep();
      return;
    }
  }
  for (int64_t r0 = 0; r0 < call.m; r0 += kRowChunk) {
    const int64_t rows = std::min(kRowChunk, call.m - r0);
    const Call part = call.rows_from(r0, rows);
    const StreamBuffers::Chunk chunk = buffers.chunk(pk, r0, call.m);
    if (!kept.reusable()) convert_chunk<Stream>(part, pk, chunk);
    if constexpr (!kWholePieces<Stream>) {
      if (rows >= kDecodeOnceRows && decodes_once(call.w)) {
        walk_decoded(part, stream, pk, buffers, r0, call.m);  // this chunk, in its place
        continue;
      }
    }
    Bf16Dots<Stream> dots{stream, chunk.codes, chunk.scales, pk};
    if constexpr (kWholePieces<Stream>)
      walk<4>(part, dots);
    else
      walk_tiles(part, dots);
  }
  kept.keep();
}

// On AMD cores, fp4 calls of kDecodeOnceRows to this many rows walk the weight tiles in 4 × 6
// tiles, decoding each piece once per row tile, instead of decoding their columns once into
// working memory: there the piece decode (Fp4TileStream) costs less than a decode and a store and
// load of its bf16 codes, up to 4 row tiles (Zen 4, one call, `--tiles`, alternating runs: 9 / 12
// / 16 / 24 × 1024 × 2048 in 0.81 / 0.80 / 0.90 / 0.93× the time, 32 rows 0.98×, 64 rows 1.07×).
// On the 16-core Xeon, whose 512-bit shuffles issue on one port, the same calls took 0.95–1.07×
// and GPT-OSS-20B mxfp4 at M = 128 1.2× the time, so Intel cores decode once.
constexpr int64_t kFp4TiledMaxRows = 24;

// The weight tiles when w has them and the call walks 4-channel tiles (the same codes, one stream
// per tile), else the contract rows. Walks of 2 channels (5–8 rows), and the decode-once pass (a
// row at a time), would read the tile groups' rows one by one, 64 bytes in every 256: from
// memory, 8 × 16384 × 2048 bf16 took 10.2 ms reading the tiles and 7.5 ms reading the rows (Zen 4,
// 2026-11-27, moecore_gemm_timing --tiles, alternating runs of the two builds), and fp4 calls of
// 5 and 6 rows walking 2 channels of the tiles 1.02–1.38× the time of the contract rows.
bool reads_weight_tiles(const WeightOperand& w, int64_t m) {
  if (w.tiles.data == nullptr) return false;
  if (m <= kFourChannelMaxRows) return true;
  const bool fp4 = tile_layout(w.coding) == TileLayout::kFp4Nibbles;  // pieces decoded whole
  // AMD cores, fp4: 5 or 6 rows are one 4-channel row tile from the tiles, not a 2-channel walk of
  // the contract rows (one call, 5 / 6 × 1024 × 2048: mxfp4 0.85 / 0.91×, nvfp4 0.81 / 0.70× the
  // time; 7 and 8 rows, two row tiles, took mxfp4 1.03-1.13×); 9 to kFp4TiledMaxRows rows walk
  // them instead of decoding once.
  const bool one_row_tile = m <= kWalkRows<kMaxChannels, true>;
  return fp4 && cpu_features().vendor_amd &&
         (one_row_tile || (m >= kDecodeOnceRows && m <= kFp4TiledMaxRows));
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
  const Call call{a, m, w, e, n0, n, out, ldo, pk.num_blocks, pk.block_k, buffers.w_scales};
  const bool tiled = reads_weight_tiles(w, m);
  const auto run = [&](auto stream) {
    stream.tiled = tiled;
    // Rows kept in paired order serve only a paired stream (fp8_byte_tables may change between).
    const KeptRows kept(a, m, w, buffers.capacity, kPairedSteps<decltype(stream)> ? 1 : 0);
    run_streamed(call, stream, pk, buffers, kept);
  };
  switch (w.coding) {
    case WeightCoding::kDense:  // bf16 (bf16_operands)
      return run(DenseStream<DType::kBF16>{});
    case WeightCoding::kFp8:
      return fp8_byte_tables() ? run(Fp8ByteTableStream{}) : run(Fp8Stream{});
    case WeightCoding::kInt8:
      return run(Int8AsFloatStream{});
    case WeightCoding::kNvfp4:
    case WeightCoding::kMxfp4:
      MOECORE_INTERNAL_CHECK(w.k % fp4_group_size(w.coding) == 0, "fp4 K (", w.k,
                             ") must be a multiple of its scale group");
      // fp4 tiles hold their pieces' nibbles transposed, for whole pieces a row of one K block.
      MOECORE_INTERNAL_CHECK(!tiled || w.num_k_blocks() == 1, "fp4 tiles of K blocks");
      if (w.coding == WeightCoding::kNvfp4)
        return tiled ? run(Fp4TileStream<16>{}) : run(Fp4Bf16Stream<16>{});
      return tiled ? run(Fp4TileStream<32>{}) : run(Fp4Bf16Stream<32>{});
  }
  MOECORE_INTERNAL_CHECK(false, "unknown weight coding");
}

// ---- int8 × int8 codes: VPDPBUSD on the streamed weights -------------------------------------
// The int8 weights stream as stored, like the float path's (the weight tiles when the call walks
// 4-channel tiles, else the contract rows), 64 codes per step against the activation codes as
// bytes in the padded K layout (bf16_operands.h), converted once per chunk of kRowChunk rows.
// VPDPBUSD multiplies unsigned by signed bytes, so the weights go in as w + 128 (w ^ 0x80) and a
// block's dot is Σ a·(w + 128) − 128·Σ a: exact in int32 for K ≤ kByteMaxK (|Σ a·(w + 128)| ≤
// 128 · 255 · K < 2^31), so bitwise every other row's. An earlier form widened both sides to
// int16 and repacked every weight row for VPDPWSSD: 16 × 1536 × 2048 took 0.63 ms there and
// 0.39 ms here, and decode calls took the avx512 row (vpmaddwd, contract rows only), where
// Qwen3-30B-A3B's int8 decode read its weights at half fp8's rate (Zen 4, 2026-11-27).
constexpr int64_t kByteMaxK = ((int64_t{1} << 31) - 1) / (128 * 255);  // 65793

// The byte path's working memory, one layout for every call on the weight operand.
struct ByteBuffers {
  int64_t capacity;  // kept_rows: activation rows the buffers hold, whole chunks
  uint8_t* a_codes;  // [capacity, row_stride]: activation codes as bytes, padded K layout
  int32_t* a_sums;   // [capacity, nb]: their sums over each K block
  float* w_scales;   // [nb, kMaxChannels]: K-block scales of the channel tile
  ByteBuffers(ScratchCarver& s, const PaddedK& pk)
      : capacity(kept_rows(pk.row_stride())),
        a_codes(s.take<uint8_t>(capacity * pk.row_stride())),
        a_sums(s.take<int32_t>(capacity * pk.num_blocks)),
        w_scales(s.take<float>(kMaxChannels * pk.num_blocks)) {}
};

size_t byte_scratch_bytes(const WeightOperand& w) {
  ScratchCarver sizing;
  [[maybe_unused]] const ByteBuffers layout(sizing, PaddedK(w, CodeType::kInt8));
  return sizing.bytes();
}

// Exact int32 dots of R activation rows (bytes) × C streamed int8 weight rows over one K block.
struct ByteDots {
  Int8AsFloatStream stream;  // the int8 weights' row pointers (tiles or contract rows)
  const uint8_t* a;          // activation rows, pk.row_stride() apart
  const int32_t* a_sums;     // Σ a of row r over block b at r · nb + b
  PaddedK pk;
  WeightPrefetch prefetch = {};  // set by walk
  static constexpr bool kLaneSums = false;  // each block's dot is exact: the canonical tile

  template <int R, int C>
  void run(int64_t r0, int64_t k0, int64_t len, float (&part)[R][C]) const {
    __m512i acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_si512();
    const int64_t row_stride = pk.row_stride(), b = k0 / pk.block_k;
    const uint8_t* rows = a + r0 * row_stride + pk.block_first_step(b) * kStepBytes;
    const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
    // A local copy of the stream keeps its layout flag in a register: Mixtral-8x7B int8 decode
    // took 0.82-0.86x the time (Zen 4, 1 thread, alternating builds; Xeon single calls 0.94x).
    // Bf16Dots reads its stream in place: a copy made its layers 1.3x slower, not explained.
    const Int8AsFloatStream s = stream;
    const WeightPrefetch pf = prefetch;
    const auto step = [&](int64_t i, __mmask64 mask) [[gnu::always_inline]] {
      prefetch_ahead<R, C, true>(s, k0 + i, pf);  // light: one XOR and VPDPBUSD a line
      __m512i wv[C];
      for (int c = 0; c < C; ++c)
        wv[c] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask, s.at(c, k0 + i)), bias);
      for (int r = 0; r < R; ++r) {
        const __m512i av = _mm512_loadu_si512(rows + r * row_stride + i);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], wv[c], av);
      }
    };
    // Whole steps without a mask, then the block's partial last one. Past the block's end the
    // activation bytes are the layout's zero padding, so whatever the masked-off weight lanes hold
    // adds nothing (the mask keeps the loads inside the rows).
    int64_t i = 0;
    for (; i + kStepBytes <= len; i += kStepBytes) step(i, ~__mmask64{0});
    if (i < len) step(i, avx512::tail_mask64(len - i));
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) {
        const int64_t dot = int64_t{_mm512_reduce_add_epi32(acc[r][c])} -
                            128 * int64_t{a_sums[(r0 + r) * pk.num_blocks + b]};
        part[r][c] = static_cast<float>(dot);
      }
  }
};

// The sums of a row's codes over each K block (integers, exact in fp32 and in int32).
void block_sums(const float* codes, const PaddedK& pk, int32_t* sums) {
  for (int64_t b = 0; b < pk.num_blocks; ++b) {
    __m512i sum = _mm512_setzero_si512();
    const float* block = codes + b * pk.block_k;
    for (int64_t i = 0; i < pk.block_len(b); i += 16) {
      const __mmask16 mask = avx512::tail_mask(pk.block_len(b) - i);
      sum = _mm512_add_epi32(sum, _mm512_cvtps_epi32(_mm512_maskz_loadu_ps(mask, block + i)));
    }
    sums[b] = _mm512_reduce_add_epi32(sum);
  }
}

// Rows [0, m) in chunks of kRowChunk, each converted to bytes and walked as a call of its own
// (integer dots are exact, so chunking changes no bit). A call whose rows all fit the buffers
// keeps its bytes and sums for the next call on the same rows.
void scaled_gemm_bytes(const ActivationCodes& a, int64_t m, const WeightOperand& w, int64_t e,
                       int64_t n0, int64_t n, float* out, int64_t ldo) {
  const PaddedK pk(w, CodeType::kInt8);
  ScratchCarver carver(gemm_scratch_memory(a, scaled_gemm_avx512_bf16_scratch_bytes(w)));
  const ByteBuffers buffers(carver, pk);
  const KeptRows kept(a, m, w, buffers.capacity);
  const Call call{a, m, w, e, n0, n, out, ldo, pk.num_blocks, pk.block_k, buffers.w_scales};
  // The tiles as in scaled_gemm_streamed. int8 weights have one scale per row (one K block), so
  // every 64-byte step starts on one of their pieces.
  const bool tiled = w.tiles.data != nullptr && m <= kFourChannelMaxRows;
  for (int64_t r0 = 0; r0 < m; r0 += kRowChunk) {
    const int64_t rows = std::min(kRowChunk, m - r0);
    const Call part = call.rows_from(r0, rows);
    const int64_t place = chunk_place(r0, m, buffers.capacity);
    uint8_t* codes = buffers.a_codes + place * pk.row_stride();
    int32_t* sums = buffers.a_sums + place * pk.num_blocks;
    if (!kept.reusable())
      for (int64_t r = 0; r < rows; ++r) {
        pack_codes_row(part.a.row(r), pk, CodeType::kInt8, codes + r * pk.row_stride());
        block_sums(part.a.row(r), pk, sums + r * pk.num_blocks);
      }
    ByteDots dots{Int8AsFloatStream{}, codes, sums, pk};
    dots.stream.tiled = tiled;
    walk_tiles(part, dots);
  }
  kept.keep();
}

}  // namespace

size_t scaled_gemm_avx512_bf16_scratch_bytes(const WeightOperand& w) {
  // Calls the avx512 row takes use its memory.
  size_t bytes = std::max(stream_scratch_bytes(w), scaled_gemm_avx512_scratch_bytes(w));
  if (w.coding == WeightCoding::kInt8) bytes = std::max(bytes, byte_scratch_bytes(w));
  return bytes;
}

void scaled_gemm_avx512_bf16(const ActivationCodes& a, int64_t m, const WeightOperand& w,
                             int64_t e, int64_t n0, int64_t n, float* out, int64_t ldo) {
  if (integer_operands(a, w)) {
    // Longer rows could overflow the biased int32 sums (up to 128 · 255 · K): the avx512 row's
    // vpmaddwd sums are unbiased.
    if (w.k > kByteMaxK) return scaled_gemm_avx512(a, m, w, e, n0, n, out, ldo);
    check_activation_scales(a, w);
    return scaled_gemm_bytes(a, m, w, e, n0, n, out, ldo);
  }
  if (!bf16_operands(a, w)) return scaled_gemm_avx512(a, m, w, e, n0, n, out, ldo);
  check_activation_scales(a, w);
  scaled_gemm_streamed(a, m, w, e, n0, n, out, ldo);
}

}  // namespace moecore
