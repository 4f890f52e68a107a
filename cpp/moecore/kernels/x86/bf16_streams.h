// Weight streams of the avx512_bf16 and amx rows: each 32 elements of a weight row decoded exactly
// to bf16 codes in registers (load_bf16x32), for every coding these rows take (bf16 as stored,
// e4m3fn, int8 as float values, nvfp4/mxfp4 through per-scale tables); e4m3fn byte tables also a
// pair of steps at a time (load_bf16x64), and fp4 weight tiles a 64-byte piece of four steps at a
// time (load_piece, next_step_bf16). Include only from files compiled with AVX512-BF16 and VBMI
// flags or more; internal linkage, so each row keeps its own copy.
#pragma once

#include "moecore/kernels/x86/weight_streams.h"

namespace moecore {
namespace {

// Elements [k, k + 32) of channel c's weight row as 32 bf16 codes (lanes outside `mask` are +0),
// k a multiple of 32, read through stream.at (contract rows or weight tiles: a step's bytes never
// straddle a 64-byte piece). One specialization per stream below.
template <class Stream>
__m512i load_bf16x32(const Stream& stream, int c, int64_t k, __mmask32 mask);

// bf16 weights are loaded as they are.
template <>
inline __m512i load_bf16x32(const DenseStream<DType::kBF16>& stream, int c, int64_t k,
                            __mmask32 mask) {
  return _mm512_maskz_loadu_epi16(mask, stream.at(c, 2 * k));
}

// int8 values as floats: exact in fp32, then in bf16 (the masked-off bytes are not read).
template <>
inline __m512i load_bf16x32(const Int8AsFloatStream& stream, int c, int64_t k, __mmask32 mask) {
  const __m256i bytes = _mm256_maskz_loadu_epi8(mask, stream.at(c, k));
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(bytes)));
  const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(bytes, 1)));
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
}

// e4m3fn codes straight to bf16 bits, exactly (fewer steps than two fp32 decodes): a normal code
// S.EEEE.MMM is S | (EEEE.MMM << 4) + (120 << 7), its exponent rebiased from 7 to 127. The other
// magnitudes, zero and the subnormals 0.MMM · 2^-6 (m < 8) and NaN (S.1111.111), take the nine
// entries of one table: with t = code + 1, they are the codes whose t & 0x7f is below 9, and t's
// low 5 bits index them (m + 1, and 0 for NaN: bf16's quiet NaN, as in the fp32 decoder). The code
// sign-extended to a word holds S in bit 15, whence the sign (an earlier form took a second
// compare and blend for NaN and a shift for the sign: 10 operations per 32 weights, now 8).
template <>
inline __m512i load_bf16x32(const Fp8Stream& stream, int c, int64_t k, __mmask32 mask) {
  const __m512i x = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(mask, stream.at(c, k)));
  const __m512i t = _mm512_add_epi16(x, _mm512_set1_epi16(1));
  const __m512i t_mag = _mm512_and_si512(t, _mm512_set1_epi16(0x7f));  // m + 1 (mod 128)
  // (m << 4) + (120 << 7) = ((m + 1) << 4) + (120 << 7) - 16, for every code but NaN's.
  __m512i v = _mm512_add_epi16(_mm512_slli_epi16(t_mag, 4), _mm512_set1_epi16((120 << 7) - 16));
  const __m512i specials = _mm512_setr_epi32(0x00007fc0, 0x3b803b00, 0x3c003bc0, 0x3c403c20,
                                             0x00003c60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  v = _mm512_mask_permutexvar_epi16(v, _mm512_cmplt_epu16_mask(t_mag, _mm512_set1_epi16(9)), t,
                                    specials);
  // (v & 0x7fff) | (x & 0x8000): the sign.
  return _mm512_ternarylogic_epi32(v, x, _mm512_set1_epi16(static_cast<int16_t>(0x8000)), 0xd8);
}

// The same bits through two 128-entry byte tables, the high and the low byte of each magnitude's
// bf16 code (zero, the subnormals and NaN are entries like the others). VPERMT2B indexes 128 bytes
// by a code's low 7 bits, so two permutes give both bytes of 32 codes, one bit operation the sign,
// and a third permute interleaves the bytes into words: 5 operations per 32 weights, but 3 of them
// 512-bit shuffles (Zen 4 decoded an fp8 row from memory in 0.84x the time of the arithmetic
// above, the Xeon in 1.04-1.12x: one 512-bit shuffle port). The streamed row takes them a pair of
// steps at a time (load_bf16x64 below), which is faster on both; fp8_byte_tables() chooses.
struct Fp8ByteTableStream : Fp8Stream {};

struct E4m3Bf16Bytes {
  alignas(64) uint8_t high[128] = {}, low[128] = {};
  alignas(64) uint8_t interleave[64] = {};  // word j: low byte j, then high byte j (64 + j)
  constexpr E4m3Bf16Bytes() {
    for (int j = 0; j < 32; ++j) {
      interleave[2 * j] = static_cast<uint8_t>(j);
      interleave[2 * j + 1] = static_cast<uint8_t>(64 + j);
    }
    for (int code = 0; code < 128; ++code) {
      const int exponent = code >> 3, mantissa = code & 7;
      int bits = 0;  // the magnitude's bf16 code
      if (code == 0x7f) {
        bits = 0x7fc0;
      } else if (exponent > 0) {
        bits = (exponent + 120) << 7 | mantissa << 4;  // rebias 7 → 127
      } else if (mantissa > 0) {  // mantissa · 2^-9: its leading bit p becomes the implicit one
        const int p = mantissa >= 4 ? 2 : mantissa >= 2 ? 1 : 0;
        bits = (118 + p) << 7 | (mantissa - (1 << p)) << (7 - p);
      }
      high[code] = static_cast<uint8_t>(bits >> 8);
      low[code] = static_cast<uint8_t>(bits & 0xff);
    }
  }
};
constexpr E4m3Bf16Bytes kE4m3Bf16Bytes;

// Byte j of `low` and `high`: the low and the high byte of code j's bf16 code, for up to 64 codes.
struct Bf16Bytes {
  __m512i low, high;
};
inline Bf16Bytes e4m3_bf16_bytes(__m512i codes) {
  const uint8_t* high = kE4m3Bf16Bytes.high;
  const uint8_t* low = kE4m3Bf16Bytes.low;
  const __m512i magnitude_high =
      _mm512_permutex2var_epi8(_mm512_load_si512(high), codes, _mm512_load_si512(high + 64));
  // high | (codes & 0x80): the sign.
  return {_mm512_permutex2var_epi8(_mm512_load_si512(low), codes, _mm512_load_si512(low + 64)),
          _mm512_ternarylogic_epi32(magnitude_high, codes,
                                    _mm512_set1_epi8(static_cast<char>(0x80)), 0xf8)};
}

template <>
inline __m512i load_bf16x32(const Fp8ByteTableStream& stream, int c, int64_t k,
                            __mmask32 mask) {
  const Bf16Bytes bytes =
      e4m3_bf16_bytes(_mm512_zextsi256_si512(_mm256_maskz_loadu_epi8(mask, stream.at(c, k))));
  return _mm512_permutex2var_epi8(bytes.low, _mm512_load_si512(kE4m3Bf16Bytes.interleave),
                                  bytes.high);
}

// Streams that decode a pair of steps (64 elements) at a time into two vectors whose elements are
// in paired order (bf16_operands.h, pair_codes): the activation rows are laid out the same way
// (pack_codes_row), so each product meets its own weight. Every other stream takes one step at a
// time in element order.
template <class Stream>
constexpr bool kPairedSteps = false;

// The byte tables, a pair of steps at a time: both permutes and the sign take all 64 codes at once,
// and two in-lane unpacks (VPUNPCKLBW/HBW) interleave the bytes into words, instead of a third
// cross-lane permute per step: 4 shuffles per 64 weights, not 6. Unpacking works within 128-bit
// lanes, hence the paired order.
template <>
constexpr bool kPairedSteps<Fp8ByteTableStream> = true;

/// Elements [k, k + 64) of channel c's row (lanes outside `mask` +0) as two vectors of 32 bf16
/// codes in paired order: vector v's word 8i + j is element k + 16i + 8v + j (i < 4, j < 8).
inline void load_bf16x64(const Fp8ByteTableStream& stream, int c, int64_t k, __mmask64 mask,
                         __m512i& first, __m512i& second) {
  const Bf16Bytes bytes = e4m3_bf16_bytes(_mm512_maskz_loadu_epi8(mask, stream.at(c, k)));
  first = _mm512_unpacklo_epi8(bytes.low, bytes.high);
  second = _mm512_unpackhi_epi8(bytes.low, bytes.high);
}

// Packed e2m1 straight to bf16: each 32 weights are a permute (VPERMW) of their block scale's bf16
// table, the fp32 tables of weight_streams.h rounded to bf16, exactly (≤ 6 significant bits;
// subnormals, which VDPBF16PS would read as zero anyway, become zero). VPERMW reads only bits 0–4
// of an index word, so each table holds its 16 entries twice (one 64-byte line): bit 4 may be
// anything, as it is where a word holds more than one nibble (Fp4TileStream). A whole nvfp4 step
// rewrites its index anyway, to set bit 4 where words read the second block's entries
// (fp4_bf16_step), so it loads each table's first 16 words alone (load_table_pair): half the
// bytes, and 0.80× the time of a one-row call (Zen 4, 1 × 1536 × 2048 from L3; bench/RESULTS.md).
// Tables of 16 words, 32 bytes apart, took 1.14× the time of that, as did this layout with the
// partial step's permute on the rewritten index too.
struct Fp4Bf16Tables {
  alignas(64) uint16_t values[256][32];
  explicit Fp4Bf16Tables(const Fp4Tables& fp32) {
    for (int c = 0; c < 256; ++c) {
      const __m256i bf16 = (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(fp32.values[c]));
      _mm512_store_si512(values[c], _mm512_inserti64x4(_mm512_castsi256_si512(bf16), bf16, 1));
    }
  }
};

// The fp4 stream of weight_streams.h with the bf16 tables beside its fp32 ones.
template <int kGroup>
struct Fp4Bf16Stream : Fp4Stream<kGroup> {
  const Fp4Bf16Tables& bf16_tables = tables_of_coding();
  /// The bf16 table of channel c's element k.
  const uint16_t* table(int c, int64_t k) const {
    return bf16_tables.values[this->scale_code(c, k)];
  }
  static const Fp4Bf16Tables& tables_of_coding() {
    static const Fp4Bf16Tables tables(fp4_tables<kGroup>());
    return tables;
  }
};

// A table's 64 bytes; or the first 16 words of two tables side by side, `second`'s in words
// 16–31, where index bit 4 reaches them.
inline __m512i load_table(const uint16_t* table) { return _mm512_load_si512(table); }
inline __m512i load_table_pair(const uint16_t* first, const uint16_t* second) {
  const __m256i low = _mm256_load_si256(reinterpret_cast<const __m256i*>(first));
  const __m256i high = _mm256_load_si256(reinterpret_cast<const __m256i*>(second));
  return _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
}

// 32 elements as bf16 codes from index words whose bits 0–3 hold element j in word j (bit 4 is
// free), `first` the bf16 table of their block: one permute, or with 16-element groups (nvfp4)
// one permute of the two blocks' first 16 words side by side, words 16–31 reading the next
// block's (`second`) through index bit 4 (set there, cleared in words 0–15: one bit operation),
// unless only the first 16 elements are left (`whole` false: those words are +0, and `second`,
// past the row's end, is not read). A two-table permute (VPERMT2W) of the two half tables, bit 5
// picking the table, took 1.00–1.07× the time of this on Zen 4 and 0.97–1.02× on the Xeon (the
// same loads, VPERMT2W in place of a 256-bit insert and VPERMW; one-thread calls of 1 to 16 rows);
// two masked one-table permutes took up to 1.1× its time (Zen 4, nvfp4 calls of 2 to 24 rows;
// bench/RESULTS.md).
template <int kGroup>
inline __m512i fp4_bf16_step(const uint16_t* first, const uint16_t* second, __m512i nibbles,
                             bool whole) {
  if constexpr (kGroup == 32) return _mm512_permutexvar_epi16(nibbles, load_table(first));
  if (!whole) return _mm512_maskz_permutexvar_epi16(0x0000ffff, nibbles, load_table(first));
  const __m512i upper_words = _mm512_maskz_mov_epi16(0xffff0000, _mm512_set1_epi16(0x10));
  // (nibbles & 0xf) | upper_words
  const __m512i index =
      _mm512_ternarylogic_epi32(nibbles, _mm512_set1_epi16(0xf), upper_words, 0xea);
  return _mm512_permutexvar_epi16(index, load_table_pair(first, second));
}

// From the contract rows: word 2j of the index vector takes byte j's low nibble, word 2j + 1 its
// high nibble. K is a multiple of the group, so an mxfp4 step is always whole and an nvfp4 step is
// whole or its first 16 elements.
template <int kGroup>
inline __m512i load_bf16x32(const Fp4Bf16Stream<kGroup>& stream, int c, int64_t k, __mmask32 mask) {
  const uint8_t* bytes = stream.at(c, k >> 1);  // k ≥ 0: a shift, not a signed division
  const bool whole = kGroup == 32 || (mask >> 16) != 0;  // never read past the row's end
  const __m128i packed = whole ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes))
                               : _mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes));
  const __m512i x = _mm512_cvtepu8_epi32(packed);
  // (x | x << 12) & 0x000f000f
  const __m512i nibbles =
      _mm512_ternarylogic_epi32(x, _mm512_slli_epi32(x, 12), _mm512_set1_epi32(0x000f000f), 0xa8);
  return fp4_bf16_step<kGroup>(stream.table(c, k), whole ? stream.table(c, k + 16) : nullptr,
                               nibbles, whole);
}

// fp4 rows read from the weight tiles, whose pieces hold their 128 codes with the nibbles
// transposed (weight_tiles.h, TileLayout::kFp4Nibbles): word j of a piece holds elements j, 32 + j,
// 64 + j and 96 + j from its low nibble up. So the piece shifted right by 4s indexes step s
// (elements 32s to 32s + 31, in order) in its words' low nibbles: a whole piece is one load, four
// permutes (of two half tables for nvfp4) and a shift by 4 per step, where the stored order takes
// a widening, a shift and a bit operation before each permute (Zen 4, 1 × 16384 × 2048 from
// memory: mxfp4 in 0.76×, nvfp4 in 0.84× the time; bench/RESULTS.md).
template <int kGroup>
struct Fp4TileStream : Fp4Bf16Stream<kGroup> {
  Fp4TileStream() { this->tiled = true; }
};

// Streams that load a whole 64-byte piece at a time (load_piece) and decode its kPieceSteps steps
// of 32 elements, in element order, from the register (next_step_bf16).
template <class Stream>
constexpr bool kWholePieces = false;
template <int kGroup>
constexpr bool kWholePieces<Fp4TileStream<kGroup>> = true;
constexpr int kPieceSteps = 4;
constexpr int64_t kPieceElements = 32 * kPieceSteps;

/// The piece holding elements [k, k + 128) of channel c's row (k a multiple of 128).
template <int kGroup>
inline __m512i load_piece(const Fp4TileStream<kGroup>& stream, int c, int64_t k) {
  return _mm512_loadu_si512(stream.at(c, k >> 1));
}

/// Its blocks' scale codes (block b's at [b]), found once for the piece's kPieceSteps steps,
/// which then read them at constant offsets, in place of an address computed per block and step
/// (one thread, warm, alternating runs: 4 × 1536 × 2048 nvfp4 / mxfp4 in 0.93 / 0.90× the time on
/// the 16-core Xeon, 0.92 / 0.92× on Zen 4; one row 0.94–1.00×; bench/RESULTS.md).
template <int kGroup>
inline const uint8_t* piece_scale_codes(const Fp4TileStream<kGroup>& stream, int c, int64_t k) {
  return stream.scale_codes[c] + static_cast<uint64_t>(k) / kGroup;  // k ≥ 0: a shift
}

/// A piece's next step as 32 bf16 codes (elements in order) from its nibbles and scale codes,
/// `left` > 0 elements from the step's first to the row's end; both then move on to the step
/// after it (the nibbles shifted down, the codes a step on, so every step takes the same constant
/// shift and offsets).
template <int kGroup>
inline __m512i next_step_bf16(const Fp4TileStream<kGroup>& stream, __m512i& nibbles,
                              const uint8_t*& scale_codes, int64_t left) {
  const auto& tables = stream.bf16_tables.values;
  __m512i bf16;
  if constexpr (kGroup == 32) {
    bf16 = fp4_bf16_step<kGroup>(tables[scale_codes[0]], nullptr, nibbles, true);
  } else {
    const bool whole = left > 16;
    bf16 = fp4_bf16_step<kGroup>(tables[scale_codes[0]], whole ? tables[scale_codes[1]] : nullptr,
                                 nibbles, whole);
  }
  scale_codes += 32 / kGroup;
  nibbles = _mm512_srli_epi16(nibbles, 4);
  return bf16;
}

}  // namespace
}  // namespace moecore
