// The scaled GEMM of every runner path, dense or quantized (DESIGN.md §4): one kernel table,
// a row per ISA level (scaled_gemm_kernel), with the scalar reference scaled_gemm_ref.
// A weight operand decodes one row to exact fp32 codes plus one scale per K block; the
// activation side arrives as fp32 codes plus per-(row, K block) scales from the backend's
// quantizer. Then, for each output,
//     out[r, c] = ((Σ_b ((dot_b(a_r, w_c) · sa[r, b]) · sw[c, b])) · alpha[e]
// where dot_b is the canonical dot of gemm.h over K block b (exact int32 accumulation when both
// sides hold int8 codes), and the block terms are added in order b = 0, 1, …
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "moecore/core/tensor.h"
#include "moecore/isa/isa.h"
#include "moecore/kernels/gemm.h"

namespace moecore {

/// How expert weights are stored (the backend contract layout, never a converted copy).
enum class WeightCoding {
  kDense,  // f32 / f16 / bf16 values, no scales
  kFp8,    // e4m3fn codes; f32 scales per tensor [E], per channel [E, N] or 128×128-style
           // blocks [E, ⌈N/bn⌉, ⌈K/bk⌉] (sglang's weight_scale_inv: the dequant multiplier)
  kInt8,   // int8 codes; f32 scales per channel [E, N] (or per tensor [E])
  kNvfp4,  // packed e2m1 [E, N, K/2]; e4m3 block scales [E, N, K/16] (linear layout) folded into
           // the codes (exact); the per-expert alpha is the post scale
  kMxfp4,  // packed e2m1 [E, N, K/2]; e8m0 block scales [E, N, K/32] folded into the codes
};

/// One GEMM's weight operand for all experts: W[e] is [N, K] (row c = output channel c).
struct WeightOperand {
  WeightCoding coding = WeightCoding::kDense;
  TensorView data;   // see WeightCoding
  TensorView scale;  // see WeightCoding; data == nullptr when the coding has none
  TensorView alpha;  // f32 [E] post scale, or data == nullptr
  // The same codes prepacked in weight tiles (weight_tiles.h), or data == nullptr. The
  // avx512_bf16 and amx rows stream them when given (the same values, so the same bits); every
  // other row reads `data`.
  TensorView tiles;
  int64_t num_experts = 0, n = 0, k = 0;
  int64_t block_n = 0, block_k = 0;  // kFp8 block scales; 0 when not blocked

  /// Scales per row along K: ⌈K / block_k⌉ when blocked, else 1.
  int64_t num_k_blocks() const { return block_k > 0 ? (k + block_k - 1) / block_k : 1; }
  /// The K block the scales cover (K when not blocked).
  int64_t k_block() const { return block_k > 0 ? block_k : k; }
};

/// Decodes row `row` of expert `e`: codes[0..K) exact in fp32, scales[0..num_k_blocks()).
void decode_weight_row(const WeightOperand& w, int64_t e, int64_t row, float* codes,
                       float* scales);
/// The scales of that row alone (1 where the coding folds them into codes): block b's at
/// scales[b · stride], b < num_k_blocks(). Inline where they are 1: a decode walk asks for every
/// channel it binds. stored_weight_row_scales: the same for fp8 and int8, which store them.
void stored_weight_row_scales(const WeightOperand& w, int64_t e, int64_t row, float* scales,
                              int64_t stride);
inline void weight_row_scales(const WeightOperand& w, int64_t e, int64_t row, float* scales,
                              int64_t stride = 1) {
  if (w.coding == WeightCoding::kFp8 || w.coding == WeightCoding::kInt8)
    return stored_weight_row_scales(w, e, row, scales, stride);
  scales[0] = 1.0f;  // bf16 / f16 / f32, and fp4 (block scales folded into the codes)
}
/// Elements per fp4 block scale: 16 (kNvfp4, e4m3 scales) or 32 (kMxfp4, e8m0 scales).
inline int64_t fp4_group_size(WeightCoding coding) { return coding == WeightCoding::kNvfp4 ? 16 : 32; }
/// The fp32 value of one fp4 block-scale code of `coding`.
float fp4_block_scale(WeightCoding coding, uint8_t code);

/// Per block-scale code of an fp4 coding, the 16 weights an e2m1 code j takes there:
/// e2m1_to_f32(j) · fp4_block_scale(coding, code), exact in fp32 (≤ 3 significant bits times an
/// e4m3 value or a power of two), as the reference decodes them. The vector rows permute a row of
/// it instead of multiplying on every step (a multiply with a subnormal product, as GPT-OSS's zero
/// padding blocks give under e8m0 code 0, takes a microcode assist on Intel cores).
struct Fp4Tables {
  alignas(64) float values[256][16];
};
/// Whether the avx512_bf16 and amx rows decode fp8 weights to bf16 through byte tables (VPERMT2B)
/// instead of word arithmetic (x86/bf16_streams.h): the same weights, but the streamed row takes
/// the tables' weights in pairs of steps and the activation rows in the matching order, so the two
/// may differ in the last bits (each deterministic and batch invariant). On by default: faster on
/// the Zen 4 and the Xeon alike; set_fp8_byte_tables overrides it (tests and timings run both).
bool fp8_byte_tables();
void set_fp8_byte_tables(bool on);

/// The tables of kNvfp4 (kGroup 16) or kMxfp4 (kGroup 32), built once per process.
const Fp4Tables& fp4_tables(WeightCoding coding);
template <int kGroup>
const Fp4Tables& fp4_tables() {
  static_assert(kGroup == 16 || kGroup == 32, "fp4 scale groups are 16 or 32 elements");
  return fp4_tables(kGroup == 16 ? WeightCoding::kNvfp4 : WeightCoding::kMxfp4);
}

/// Activation codes for one GEMM: rows of fp32 codes (stride ld) and per-(row, K block) scales
/// [rows, nb] (nb = the weight's num_k_blocks(), or 1 for one scale per row); scales == nullptr
/// means all ones. Row r of a call reads stored row row_index[r] (nullptr: row r), so that k
/// slots of one token share its single quantized row instead of a permuted copy each.
/// integer: codes are int8 values (exact int32 dot with int8 weights).
struct GemmScratch;
struct ActivationCodes {
  const float* codes = nullptr;
  int64_t ld = 0;
  const int64_t* row_index = nullptr;
  const float* scales = nullptr;
  int64_t scales_per_row = 1;
  bool integer = false;
  // The codes are bf16 values by construction (bf16 activations; fp8, fp4 or int8 codes), so
  // the avx512_bf16 and amx rows may multiply them in bf16; otherwise those rows run avx512's.
  bool bf16_exact = false;
  // Every code is 0 or of magnitude in [2^-9, 448], a multiple of 2^-9: the quantizers' fp8, fp4
  // and int8 code values. Products with e4m3 weights, their sums and those sums times any power
  // of two from 2^-8 to 1 then stay normal fp32 numbers, so a row may scale its products by a
  // power of two and undo it after the dot with the same bits (avx2's fp8 row does).
  bool bounded_codes = false;
  // The kernel row's working memory for this call (see GemmScratch); nullptr: the row uses its
  // own thread-local memory.
  GemmScratch* scratch = nullptr;
  // Nonzero: every call with this tag and the same rows (row_index, or codes, and m) reads the
  // same codes and scales on the same weight operand. A schedule tags each GEMM phase afresh
  // (new_activation_tag), so the calls of one expert over its column blocks share a tag and a
  // row may keep its conversion of the rows in the scratch for the next of them (KeptRows).
  // 0: nothing is kept.
  uint64_t tag = 0;

  /// The stored row that row r of the call reads.
  int64_t stored_row(int64_t r) const { return row_index == nullptr ? r : row_index[r]; }
  /// Row r's codes [0, K).
  const float* row(int64_t r) const { return codes + stored_row(r) * ld; }
  /// sa[r, b]: row r's scale for K block b (1 without scales; × 1 is exact).
  float scale(int64_t r, int64_t b) const {
    return scales == nullptr
               ? 1.0f
               : scales[stored_row(r) * scales_per_row + (scales_per_row == 1 ? 0 : b)];
  }
};

/// Rows [r0, …) of `a` as codes of their own (same flags and scratch): a row that processes its
/// activation rows in chunks calls itself on each chunk this way.
inline ActivationCodes activation_rows_from(const ActivationCodes& a, int64_t r0) {
  ActivationCodes rows = a;
  if (rows.row_index != nullptr) {
    rows.row_index += r0;
    return rows;
  }
  rows.codes += r0 * a.ld;
  if (rows.scales != nullptr) rows.scales += r0 * a.scales_per_row;
  return rows;
}

/// An allocator whose containers leave new elements uninitialized (default-initialized) instead of
/// zeroing them, so that memory nobody writes is never touched and stays out of the resident set.
template <typename T>
struct UninitializedAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <typename U>
  UninitializedAllocator(const UninitializedAllocator<U>&) noexcept {}
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
};

/// Working memory of a kernel row. A caller that runs a schedule owns one per thread of it, so
/// that a prepared run sized with gemm_scratch_bytes replays without allocating; a row given
/// too little grows it. Each on cache lines of its own: calls write `kept`, and the schedule's
/// threads use neighbouring ones. Rows write every byte before they read it, so the bytes are
/// left uninitialized: the kept activation rows' room (kept_row_bytes a thread on avx512_bf16) is
/// resident only as far as calls convert rows into it, in proportion to their rows.
struct alignas(64) GemmScratch {
  std::vector<uint8_t, UninitializedAllocator<uint8_t>> bytes;
  // The activation rows a row converted into `bytes` on the last call, when it may reuse them
  // (KeptRows), and where `bytes` were then; tag 0: none.
  struct Rows {
    uint64_t tag = 0;
    const void* rows = nullptr;
    int64_t m = 0, k = 0, k_blocks = 0;
    int layout = 0;  // the row's own name for how it laid the codes out
    const uint8_t* memory = nullptr;
    bool operator==(const Rows& o) const {
      return tag == o.tag && rows == o.rows && m == o.m && k == o.k && k_blocks == o.k_blocks &&
             layout == o.layout && memory == o.memory;
    }
  } kept;

  /// At least n bytes. Growing drops the old bytes (and the rows kept in them) instead of copying
  /// them: a copy would touch the new memory as far as the old reached.
  void grow(size_t n) {
    if (bytes.size() >= n) return;
    bytes = {};
    bytes.resize(n);
    kept = {};
  }
};

/// The room a row's working memory has for activation rows it converted, kept for the next call
/// on the same rows (KeptRows; the avx512_bf16 row, and the amx row's float operands): 64 MiB, so
/// that an expert's rows are converted once for all its column blocks up to 2304 rows of
/// K = 14336 in bf16 (Mixtral-8x7B's GEMM2 experts have 2048 at M = 8192). Calls with more rows
/// convert them again for every column block. Only rows converted are resident, so the room costs
/// address space, not memory.
/// set_kept_row_bytes changes it for the rows' scratch sizes and calls from then on (tests).
int64_t kept_row_bytes();
void set_kept_row_bytes(int64_t bytes);

/// A new nonzero ActivationCodes::tag, never handed out before in this process.
uint64_t new_activation_tag();

/// For a row that converts a call's activation rows into the start of its scratch (after
/// gemm_scratch_memory), a chunk at a time, with room for `kept_rows` of them: whether the last
/// call on the same scratch left these very rows there (same nonzero tag, rows, m, weight K layout
/// and `layout`, a row's name for the order it writes codes in; the same memory), and, with keep()
/// once the call is done, that it leaves them for the next one when all m fitted, each chunk in a
/// place of its own (more were overwritten chunk by chunk). A row that writes the scratch otherwise
/// does not keep, so nothing stale is ever reused.
class KeptRows {
 public:
  KeptRows(const ActivationCodes& a, int64_t m, const WeightOperand& w, int64_t kept_rows,
           int layout = 0);
  bool reusable() const { return reusable_; }
  /// This call converted (or reused) its rows; they stay in place if all of them fitted.
  void keep() const;

 private:
  GemmScratch* scratch_;
  GemmScratch::Rows rows_;
  bool all_fit_, reusable_;
};

/// How a kernel row lays out its working memory: buffers taken in a fixed order, each on its
/// own cache line. A row describes its layout once, as a function of the weight operand alone,
/// and runs it twice: on a sizing carver (no memory) for gemm_scratch_bytes, and on the call's
/// memory (gemm_scratch_memory) to carve it, so that the two can never disagree.
class ScratchCarver {
 public:
  static constexpr size_t kAlign = 64;

  /// Sizing only: take() returns nullptr and counts.
  ScratchCarver() = default;
  /// Carving `memory`, which holds at least bytes() of the same layout's sizing pass.
  explicit ScratchCarver(uint8_t* memory)
      : base_(memory + (kAlign - reinterpret_cast<uintptr_t>(memory) % kAlign) % kAlign) {}

  /// The next buffer of `count` T (T trivial).
  template <typename T>
  T* take(int64_t count) {
    used_ = (used_ + kAlign - 1) / kAlign * kAlign;
    T* out = base_ != nullptr ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += static_cast<size_t>(count) * sizeof(T);
    return out;
  }
  /// The bytes of memory the buffers taken so far need, the base's alignment slack included.
  size_t bytes() const { return used_ + kAlign - 1; }

 private:
  uint8_t* base_ = nullptr;
  size_t used_ = 0;
};

/// The working memory of one kernel-row call, at least `bytes` long: a.scratch's bytes (grown
/// when shorter, for eager callers), or this thread's own buffer when a.scratch is nullptr.
uint8_t* gemm_scratch_memory(const ActivationCodes& a, size_t bytes);

/// One row of the scaled-GEMM table: out[r * ldo + c] for rows r < m and weight rows
/// [n0, n0 + n) of expert e, per the formula above.
using ScaledGemmFn = void (*)(const ActivationCodes& a, int64_t m, const WeightOperand& w,
                              int64_t e, int64_t n0, int64_t n, float* out, int64_t ldo);

/// The best row at or below `level` that this build has (pick once at construction, never per
/// call or per M: batch invariance). At the amx level, bf16-exact float operands multiply in
/// AMX tiles (scaled_gemm_amx_tiles) when `amx_float_tiles`, else as at avx512_bf16.
ScaledGemmFn scaled_gemm_kernel(IsaLevel level, bool amx_float_tiles);
/// The same with amx_float_tiles from MOECORE_AMX_FLOAT_TILES (default off: the tiles make
/// prefill faster but decode slower; README, Kernels), read at each call. Runners build
/// with MoeRunnerConfig::gemm_kernel(), which a MoeRunner fixes when it is built.
ScaledGemmFn scaled_gemm_kernel(IsaLevel level);

/// Whether row `kernel` streams an operand's weight tiles when it has them (WeightOperand::tiles).
bool scaled_gemm_reads_weight_tiles(ScaledGemmFn kernel);

/// The fewest weight rows (output columns) a call of row `kernel` should cover, where a schedule
/// can give it that many; 0 when any width suits it. The AMX float tiles pack a call's activation
/// rows once per 512 weight rows, so narrower calls spend more on packing than on the tiles.
int64_t scaled_gemm_min_call_columns(ScaledGemmFn kernel);

/// The most activation rows a call of row `kernel` serves from one read of each weight row (its
/// row tiles walk the weights once for up to this many rows). A schedule need not cut the
/// columns of experts with no more rows into cache-sized blocks: their weights stream once
/// whatever the call's width, and narrower calls only pay more per-call costs.
int64_t scaled_gemm_one_pass_rows(ScaledGemmFn kernel);

/// The ISA level row `kernel` (a row of this build) needs: the level its epilogues run at.
IsaLevel scaled_gemm_kernel_level(ScaledGemmFn kernel);

/// The name of row `kernel` (a row of this build): its ISA level's name ("scalar" … "amx"), or
/// "amx_float_tiles".
const char* scaled_gemm_kernel_name(ScaledGemmFn kernel);

/// The GemmScratch bytes that row `kernel` (a row of this build, e.g. from scaled_gemm_kernel)
/// needs for any call on weights `w`, whatever m and the activation flags: rows process
/// activation rows in chunks of a fixed count, so this depends on the weight operand only.
size_t gemm_scratch_bytes(ScaledGemmFn kernel, const WeightOperand& w);

/// Every row checks this on entry: activation scales per row are 1 or the weight's K blocks.
void check_activation_scales(const ActivationCodes& a, const WeightOperand& w);

/// Scalar reference row; the avx2 and avx512 rows are bit-identical to it.
void scaled_gemm_ref(const ActivationCodes& a, int64_t m, const WeightOperand& w, int64_t e,
                     int64_t n0, int64_t n, float* out, int64_t ldo);
size_t scaled_gemm_ref_scratch_bytes(const WeightOperand& w);
#ifdef MOECORE_COMPILED_AVX2
void scaled_gemm_avx2(const ActivationCodes& a, int64_t m, const WeightOperand& w, int64_t e,
                      int64_t n0, int64_t n, float* out, int64_t ldo);
size_t scaled_gemm_avx2_scratch_bytes(const WeightOperand& w);
#endif
#ifdef MOECORE_COMPILED_AVX512
void scaled_gemm_avx512(const ActivationCodes& a, int64_t m, const WeightOperand& w, int64_t e,
                        int64_t n0, int64_t n, float* out, int64_t ldo);
size_t scaled_gemm_avx512_scratch_bytes(const WeightOperand& w);
#endif
#ifdef MOECORE_COMPILED_AVX512BF16
void scaled_gemm_avx512_bf16(const ActivationCodes& a, int64_t m, const WeightOperand& w,
                             int64_t e, int64_t n0, int64_t n, float* out, int64_t ldo);
size_t scaled_gemm_avx512_bf16_scratch_bytes(const WeightOperand& w);
#endif
#ifdef MOECORE_COMPILED_AMX
void scaled_gemm_amx(const ActivationCodes& a, int64_t m, const WeightOperand& w, int64_t e,
                     int64_t n0, int64_t n, float* out, int64_t ldo);
size_t scaled_gemm_amx_scratch_bytes(const WeightOperand& w);
/// The amx row with bf16-exact float operands in TDPBF16PS tiles at every M (its own summation
/// order: the hardware's, step by step along K).
void scaled_gemm_amx_tiles(const ActivationCodes& a, int64_t m, const WeightOperand& w, int64_t e,
                           int64_t n0, int64_t n, float* out, int64_t ldo);
size_t scaled_gemm_amx_tiles_scratch_bytes(const WeightOperand& w);
/// Weight rows per super block of scaled_gemm_amx_tiles, which packs a call's activation rows
/// once per super block: its scaled_gemm_min_call_columns.
constexpr int64_t kAmxTilesSuperColumns = 512;
#endif

}  // namespace moecore
