// avx512_bf16 row of the scaled-GEMM table (built with AVX512-BF16/VNNI flags; reach it only
// through scaled_gemm_kernel). Bf16-exact operands multiply with VDPBF16PS; int8 × int8 codes
// with VPDPWSSD on int16 codes (exact int32). Each dot over a K block: 16 fp32 (int32) lane sums
// over the padded layout's 64-byte steps in increasing order, then a pairwise lane fold, so a
// row's result never depends on the other rows of the call, nor on threads. Other operands run
// the avx512 row. Working memory comes from the call's GemmScratch (Buffers); activation rows
// are packed kRowChunk at a time, so it never depends on M.
#include "moecore/kernels/x86/bf16_operands.h"

namespace moecore {
namespace {

constexpr int64_t kColumnBlock = 64;  // weight rows decoded at a time (L2), reused by every row
constexpr int kRows = 4, kCols = 4;    // register block: kRows × kCols accumulators
// Activation rows packed at a time (a multiple of kRows). Weights are decoded once per chunk: the
// decode of a column block costs about what 64 rows of dot products on it do.
constexpr int64_t kRowChunk = 64;

// The row's working memory, one layout for every call on the weight operand (kBf16 and kInt16
// codes are both 2 bytes: one padded layout).
struct Buffers {
  uint8_t* a_codes;  // [kRowChunk, row_bytes]: packed activation rows
  uint8_t* w_codes;  // [kColumnBlock, row_bytes]: packed weight rows
  float* decoded;    // [K]: one weight row decoded to fp32
  float* w_scales;   // [kColumnBlock, nb]
  Buffers(ScratchCarver& s, const PaddedK& pk)
      : a_codes(s.take<uint8_t>(kRowChunk * pk.row_bytes())),
        w_codes(s.take<uint8_t>(kColumnBlock * pk.row_bytes())),
        decoded(s.take<float>(pk.k)),
        w_scales(s.take<float>(kColumnBlock * pk.num_blocks)) {}
};

size_t own_scratch_bytes(const PaddedK& pk) {
  ScratchCarver sizing;
  [[maybe_unused]] const Buffers layout(sizing, pk);
  return sizing.bytes();
}

// Rows [0, m) of the activation codes into the padded layout; rows [m, m_padded) are zeros.
void pack_activations(const ActivationCodes& a, int64_t m, int64_t m_padded, const PaddedK& pk,
                      CodeType type, uint8_t* dst) {
  const int64_t row_bytes = pk.row_bytes();
  for (int64_t r = 0; r < m; ++r) pack_codes_row(a.codes + r * a.ld, pk, type, dst + r * row_bytes);
  std::memset(dst + m * row_bytes, 0, static_cast<size_t>((m_padded - m) * row_bytes));
}

// Adds block b's partial dot of (row r, a weight row with scale w_scale) into *acc with the
// operation order of scaled_gemm_ref: ((dot · sa[r, b]) · sw[c, b]), summed over b in order.
void fold_block(float dot, const ActivationCodes& a, int64_t r, int64_t b, float w_scale,
                float* acc) {
  float part = dot;
  if (a.scales != nullptr)
    part *= a.scales[r * a.scales_per_row + (a.scales_per_row == 1 ? 0 : b)];
  part *= w_scale;
  *acc = b == 0 ? part : *acc + part;
}

float fold(__m512 v) {
  __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// Dots of kRows activation rows with kCols weight rows over steps [s0, s1) of the padded layout.
template <bool kInteger>
void dot_block(const uint8_t* a, const uint8_t* w, int64_t row_bytes, int64_t s0, int64_t s1,
               float dots[kRows][kCols]) {
  __m512i acc[kRows][kCols];
  for (auto& row : acc)
    for (auto& v : row) v = _mm512_setzero_si512();
  for (int64_t s = s0; s < s1; ++s) {
    __m512i av[kRows], wv[kCols];
    for (int i = 0; i < kRows; ++i) av[i] = _mm512_loadu_si512(a + i * row_bytes + s * kStepBytes);
    for (int j = 0; j < kCols; ++j) wv[j] = _mm512_loadu_si512(w + j * row_bytes + s * kStepBytes);
    for (int i = 0; i < kRows; ++i)
      for (int j = 0; j < kCols; ++j) {
        if constexpr (kInteger) {
          acc[i][j] = _mm512_dpwssd_epi32(acc[i][j], av[i], wv[j]);
        } else {
          const __m512 sum = _mm512_dpbf16_ps(_mm512_castsi512_ps(acc[i][j]), (__m512bh)av[i],
                                              (__m512bh)wv[j]);
          acc[i][j] = _mm512_castps_si512(sum);
        }
      }
  }
  for (int i = 0; i < kRows; ++i)
    for (int j = 0; j < kCols; ++j)
      dots[i][j] = kInteger ? static_cast<float>(_mm512_reduce_add_epi32(acc[i][j]))
                            : fold(_mm512_castsi512_ps(acc[i][j]));
}

// Activation rows [0, m ≤ kRowChunk) of the call against weight rows [n0, n0 + n).
void gemm_chunk(const ActivationCodes& a, int64_t m, const WeightOperand& w, int64_t e, int64_t n0,
                int64_t n, float* out, int64_t ldo, bool integer, const PaddedK& pk,
                const Buffers& buffers) {
  const CodeType type = integer ? CodeType::kInt16 : CodeType::kBf16;
  const int64_t row_bytes = pk.row_bytes(), nb = pk.num_blocks;
  const int64_t m_padded = (m + kRows - 1) / kRows * kRows;
  const float alpha = expert_alpha(w, e);
  pack_activations(a, m, m_padded, pk, type, buffers.a_codes);

  for (int64_t c0 = 0; c0 < n; c0 += kColumnBlock) {
    const int64_t cols = std::min(kColumnBlock, n - c0);
    const int64_t cols_padded = (cols + kCols - 1) / kCols * kCols;
    for (int64_t c = 0; c < cols; ++c)
      pack_weight_row(w, e, n0 + c0 + c, pk, type, buffers.decoded, buffers.w_codes + c * row_bytes,
                      buffers.w_scales + c * nb);
    std::memset(buffers.w_codes + cols * row_bytes, 0,
                static_cast<size_t>((cols_padded - cols) * row_bytes));
    for (int64_t r0 = 0; r0 < m; r0 += kRows)
      for (int64_t j0 = 0; j0 < cols; j0 += kCols)
        for (int64_t b = 0; b < nb; ++b) {
          float dots[kRows][kCols];
          const int64_t s0 = pk.block_first_step(b);
          const uint8_t* a_rows = buffers.a_codes + r0 * row_bytes;
          const uint8_t* w_rows = buffers.w_codes + j0 * row_bytes;
          if (integer)
            dot_block<true>(a_rows, w_rows, row_bytes, s0, s0 + pk.block_steps(b), dots);
          else
            dot_block<false>(a_rows, w_rows, row_bytes, s0, s0 + pk.block_steps(b), dots);
          for (int i = 0; i < kRows && r0 + i < m; ++i)
            for (int j = 0; j < kCols && j0 + j < cols; ++j) {
              float* o = out + (r0 + i) * ldo + c0 + j0 + j;
              fold_block(dots[i][j], a, r0 + i, b, buffers.w_scales[(j0 + j) * nb + b], o);
              if (b == nb - 1) *o *= alpha;
            }
        }
  }
}

}  // namespace

size_t scaled_gemm_avx512_bf16_scratch_bytes(const WeightOperand& w) {
  // Both code types are 2 bytes (one padded layout); calls the avx512 row takes use its memory.
  return std::max(own_scratch_bytes(PaddedK(w, CodeType::kBf16)),
                  scaled_gemm_avx512_scratch_bytes(w));
}

void scaled_gemm_avx512_bf16(const ActivationCodes& a, int64_t m, const WeightOperand& w,
                             int64_t e, int64_t n0, int64_t n, float* out, int64_t ldo) {
  const bool integer = integer_operands(a, w);
  if (integer ? m < kPackedIntegerMinRows : !bf16_operands(a, w)) {
    scaled_gemm_avx512(a, m, w, e, n0, n, out, ldo);
    return;
  }
  check_activation_scales(a, w);
  const PaddedK pk(w, integer ? CodeType::kInt16 : CodeType::kBf16);
  ScratchCarver carver(gemm_scratch_memory(a, scaled_gemm_avx512_bf16_scratch_bytes(w)));
  const Buffers buffers(carver, pk);
  // Each output depends only on its own activation row: chunks of rows are calls of their own.
  for (int64_t r0 = 0; r0 < m; r0 += kRowChunk)
    gemm_chunk(activation_rows_from(a, r0), std::min(kRowChunk, m - r0), w, e, n0, n,
               out + r0 * ldo, ldo, integer, pk, buffers);
}

}  // namespace moecore
