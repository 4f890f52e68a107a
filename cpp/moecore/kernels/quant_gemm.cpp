// Scalar reference of the scaled GEMM: weight rows are decoded once per output channel and
// dotted with every activation row in the canonical order. Also the row table and the scratch
// sizes of its rows (gemm_scratch_bytes); a row's working memory never depends on m.
#include "moecore/kernels/quant_gemm.h"

#include <algorithm>
#include <atomic>

#include "moecore/core/env.h"
#include "moecore/core/error.h"
#include "moecore/formats/e8m0.h"
#include "moecore/formats/fp4.h"
#include "moecore/formats/fp8.h"
#include "moecore/kernels/convert.h"

namespace moecore {
namespace {

// Exact int32 dot of int8-valued codes (order-free, so every ISA level agrees).
float dot_int8(const float* a, const float* w, int64_t k) {
  int32_t acc = 0;
  for (int64_t i = 0; i < k; ++i) acc += static_cast<int32_t>(a[i]) * static_cast<int32_t>(w[i]);
  return static_cast<float>(acc);
}

float dot_f32(const float* a, const float* w, int64_t k) {
  float out;
  gemm_rows_times_wt_ref(a, 1, k, w, DType::kF32, k, 1, k, &out, 1);
  return out;
}

float per_tensor_or_channel_scale(const TensorView& scale, int64_t e, int64_t row) {
  if (scale.ndim == 1) return scale.ptr<float>()[e * scale.strides[0]];
  return *static_cast<const float*>(scale.at({e, row}));
}

}  // namespace

void stored_weight_row_scales(const WeightOperand& w, int64_t e, int64_t row, float* scales,
                              int64_t stride) {
  MOECORE_INTERNAL_CHECK(w.coding == WeightCoding::kFp8 || w.coding == WeightCoding::kInt8,
                         "stored_weight_row_scales: the coding stores no scales");
  if (w.coding == WeightCoding::kInt8) {
    scales[0] = per_tensor_or_channel_scale(w.scale, e, row);
  } else if (w.block_k > 0) {  // fp8 blocks
    const float* blocks = static_cast<const float*>(w.scale.at({e, row / w.block_n, 0}));
    for (int64_t b = 0; b < w.num_k_blocks(); ++b)
      scales[b * stride] = blocks[b * w.scale.strides[2]];
  } else {  // fp8 per tensor or channel
    scales[0] = per_tensor_or_channel_scale(w.scale, e, row);
  }
}

float fp4_block_scale(WeightCoding coding, uint8_t code) {
  return coding == WeightCoding::kNvfp4 ? fp8_e4m3_to_f32(code) : e8m0_to_f32(code);
}

namespace {
std::atomic<bool> fp8_byte_tables_on{true};
std::atomic<int64_t> kept_row_room{int64_t{64} << 20};
}  // namespace

bool fp8_byte_tables() { return fp8_byte_tables_on.load(std::memory_order_relaxed); }

void set_fp8_byte_tables(bool on) { fp8_byte_tables_on.store(on); }

int64_t kept_row_bytes() { return kept_row_room.load(std::memory_order_relaxed); }

void set_kept_row_bytes(int64_t bytes) {
  MOECORE_INTERNAL_CHECK(bytes > 0, "set_kept_row_bytes: expected a positive size, got ", bytes);
  kept_row_room.store(bytes);
}

const Fp4Tables& fp4_tables(WeightCoding coding) {
  MOECORE_INTERNAL_CHECK(coding == WeightCoding::kNvfp4 || coding == WeightCoding::kMxfp4,
                         "fp4_tables: not an fp4 coding");
  // Static storage, not the heap: the first kernel call that reads them may be one that must
  // allocate nothing (a prepared run's replay).
  struct Built : Fp4Tables {
    explicit Built(WeightCoding c) {
      for (int code = 0; code < 256; ++code) {
        const float scale = fp4_block_scale(c, static_cast<uint8_t>(code));
        for (int j = 0; j < 16; ++j) values[code][j] = e2m1_to_f32(static_cast<uint8_t>(j)) * scale;
      }
    }
  };
  static const Built nvfp4(WeightCoding::kNvfp4), mxfp4(WeightCoding::kMxfp4);
  return coding == WeightCoding::kNvfp4 ? nvfp4 : mxfp4;
}

void decode_weight_row(const WeightOperand& w, int64_t e, int64_t row, float* codes,
                       float* scales) {
  const int64_t k = w.k;
  weight_row_scales(w, e, row, scales);
  switch (w.coding) {
    case WeightCoding::kDense:
      load_f32(w.data.at({e, row, 0}), w.data.dtype, k, codes);
      return;
    case WeightCoding::kFp8: {
      const uint8_t* q = static_cast<const uint8_t*>(w.data.at({e, row, 0}));
      const float* table = fp8_e4m3_table();
      for (int64_t i = 0; i < k; ++i) codes[i] = table[q[i]];
      return;
    }
    case WeightCoding::kInt8: {
      const int8_t* q = static_cast<const int8_t*>(w.data.at({e, row, 0}));
      for (int64_t i = 0; i < k; ++i) codes[i] = static_cast<float>(q[i]);
      return;
    }
    case WeightCoding::kNvfp4:
    case WeightCoding::kMxfp4: {
      // Block scales fold into the codes: e2m1 (≤ 3 significant bits) × e4m3 or 2^e is exact.
      const int64_t group = fp4_group_size(w.coding);
      const uint8_t* packed = static_cast<const uint8_t*>(w.data.at({e, row, 0}));
      const uint8_t* block_scales = static_cast<const uint8_t*>(w.scale.at({e, row, 0}));
      for (int64_t b = 0; b < k / group; ++b) {
        const float s = fp4_block_scale(w.coding, block_scales[b]);
        for (int64_t i = b * group; i < (b + 1) * group; i += 2) {
          codes[i] = e2m1_to_f32(e2m1x2_lo(packed[i / 2])) * s;
          codes[i + 1] = e2m1_to_f32(e2m1x2_hi(packed[i / 2])) * s;
        }
      }
      return;
    }
  }
  MOECORE_INTERNAL_CHECK(false, "unknown weight coding");
}

namespace {

// The reference row's working memory: one decoded weight row and its K-block scales.
struct RefBuffers {
  float* codes;     // [K]
  float* w_scales;  // [num_k_blocks]
  RefBuffers(ScratchCarver& s, const WeightOperand& w)
      : codes(s.take<float>(w.k)), w_scales(s.take<float>(w.num_k_blocks())) {}
};

}  // namespace

size_t scaled_gemm_ref_scratch_bytes(const WeightOperand& w) {
  ScratchCarver sizing;
  [[maybe_unused]] const RefBuffers layout(sizing, w);
  return sizing.bytes();
}

void scaled_gemm_ref(const ActivationCodes& a, int64_t m, const WeightOperand& w, int64_t e,
                     int64_t n0, int64_t n, float* out, int64_t ldo) {
  ScratchCarver carver(gemm_scratch_memory(a, scaled_gemm_ref_scratch_bytes(w)));
  const RefBuffers buffers(carver, w);
  const bool has_alpha = w.alpha.data != nullptr;
  if (w.coding == WeightCoding::kDense && a.scales == nullptr && !has_alpha) {
    // The plain GEMM, one weight row at a time widened into our own buffer.
    for (int64_t c = 0; c < n; ++c) {
      load_f32(w.data.at({e, n0 + c, 0}), w.data.dtype, w.k, buffers.codes);
      for (int64_t r = 0; r < m; ++r)
        gemm_rows_times_wt_ref(a.row(r), 1, w.k, buffers.codes, DType::kF32, w.k, 1, w.k,
                               out + r * ldo + c, ldo);
    }
    return;
  }
  const int64_t nb = w.num_k_blocks(), kb = w.k_block();
  check_activation_scales(a, w);
  const bool integer = a.integer && w.coding == WeightCoding::kInt8;
  const float alpha = has_alpha ? w.alpha.ptr<float>()[e * w.alpha.strides[0]] : 1.0f;
  const float* codes = buffers.codes;
  for (int64_t c = 0; c < n; ++c) {
    decode_weight_row(w, e, n0 + c, buffers.codes, buffers.w_scales);
    for (int64_t r = 0; r < m; ++r) {
      const float* ar = a.row(r);
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t k0 = b * kb, len = std::min(kb, w.k - k0);
        float part =
            integer ? dot_int8(ar + k0, codes + k0, len) : dot_f32(ar + k0, codes + k0, len);
        part *= a.scale(r, b);
        part *= buffers.w_scales[b];
        acc = b == 0 ? part : acc + part;
      }
      out[r * ldo + c] = has_alpha ? acc * alpha : acc;
    }
  }
}

void check_activation_scales(const ActivationCodes& a, const WeightOperand& w) {
  MOECORE_INTERNAL_CHECK(
      a.scales == nullptr || a.scales_per_row == 1 || a.scales_per_row == w.num_k_blocks(),
      "activation scales per row (", a.scales_per_row, ") must be 1 or the weight's K blocks (",
      w.num_k_blocks(), ")");
}

uint8_t* gemm_scratch_memory(const ActivationCodes& a, size_t bytes) {
  thread_local GemmScratch own;  // only for calls that bring no scratch
  GemmScratch& scratch = a.scratch != nullptr ? *a.scratch : own;
  scratch.grow(bytes);
  // Kept rows (KeptRows) last only across calls of their tag: any other call may overwrite them.
  if (a.tag != scratch.kept.tag) scratch.kept = {};
  return scratch.bytes.data();
}

uint64_t new_activation_tag() {
  static std::atomic<uint64_t> last{0};
  return ++last;
}

KeptRows::KeptRows(const ActivationCodes& a, int64_t m, const WeightOperand& w,
                   int64_t kept_rows, int layout)
    : scratch_(a.scratch),
      rows_{a.tag,
            a.row_index != nullptr ? static_cast<const void*>(a.row_index) : a.codes,
            m,
            w.k,
            w.num_k_blocks(),
            layout,
            scratch_ != nullptr ? scratch_->bytes.data() : nullptr},
      all_fit_(m <= kept_rows),
      reusable_(scratch_ != nullptr && a.tag != 0 && scratch_->kept == rows_) {
  if (scratch_ != nullptr) scratch_->kept = {};  // until keep(): the row may overwrite them
}

void KeptRows::keep() const {
  if (scratch_ != nullptr && rows_.tag != 0 && all_fit_) scratch_->kept = rows_;
}

namespace {

// The rows of this build, best first, each with the level it needs, its name and its working
// memory. Rows are named explicitly (a missing ISA file is a link error, not a silent gap); a new
// row is one line here.
struct KernelRow {
  ScaledGemmFn run;
  IsaLevel level;
  const char* name;
  size_t (*scratch_bytes)(const WeightOperand& w);
  bool amx_float_tiles = false;     // taken only when asked for
  bool reads_weight_tiles = false;  // streams WeightOperand::tiles when given
  int64_t min_call_columns = 0;     // see scaled_gemm_min_call_columns
  int64_t one_pass_rows = 1;        // see scaled_gemm_one_pass_rows
};

// One pass over the weights: up to 8 rows in the avx512 and avx512_bf16 walks (2 channels × 8
// rows, x86/weight_streams.h; the amx row walks the same way below its AMX tiles' sizes), up to
// 4 in the avx2 walk (1 channel × 4 rows). The scalar row and the AMX float tiles: 1, so that a
// schedule keeps its L2 blocks for them whenever an expert has two rows or more.
constexpr int64_t kWalkOnePassRows = 8, kAvx2OnePassRows = 4;

constexpr KernelRow kKernelRows[] = {
#ifdef MOECORE_COMPILED_AMX
    {scaled_gemm_amx_tiles, IsaLevel::kAmx, "amx_float_tiles", scaled_gemm_amx_tiles_scratch_bytes,
     true, false, kAmxTilesSuperColumns},
    {scaled_gemm_amx, IsaLevel::kAmx, "amx", scaled_gemm_amx_scratch_bytes, false, true, 0,
     kWalkOnePassRows},
#endif
#ifdef MOECORE_COMPILED_AVX512BF16
    {scaled_gemm_avx512_bf16, IsaLevel::kAvx512Bf16, "avx512_bf16",
     scaled_gemm_avx512_bf16_scratch_bytes, false, true, 0, kWalkOnePassRows},
#endif
#ifdef MOECORE_COMPILED_AVX512
    {scaled_gemm_avx512, IsaLevel::kAvx512, "avx512", scaled_gemm_avx512_scratch_bytes, false,
     false, 0, kWalkOnePassRows},
#endif
#ifdef MOECORE_COMPILED_AVX2
    {scaled_gemm_avx2, IsaLevel::kAvx2, "avx2", scaled_gemm_avx2_scratch_bytes, false, false, 0,
     kAvx2OnePassRows},
#endif
    {scaled_gemm_ref, IsaLevel::kScalar, "scalar", scaled_gemm_ref_scratch_bytes},
};

const KernelRow& kernel_row(ScaledGemmFn kernel, const char* api) {
  for (const KernelRow& row : kKernelRows)
    if (row.run == kernel) return row;
  MOECORE_THROW(InternalError, api, ": not a kernel row of this build");
}

}  // namespace

ScaledGemmFn scaled_gemm_kernel(IsaLevel level, bool amx_float_tiles) {
  for (const KernelRow& row : kKernelRows)
    if (row.level <= level && (amx_float_tiles || !row.amx_float_tiles)) return row.run;
  return scaled_gemm_ref;  // (the last row: never reached)
}

ScaledGemmFn scaled_gemm_kernel(IsaLevel level) {
  return scaled_gemm_kernel(level, env_flag("MOECORE_AMX_FLOAT_TILES", false));
}

bool scaled_gemm_reads_weight_tiles(ScaledGemmFn kernel) {
  return kernel_row(kernel, "scaled_gemm_reads_weight_tiles").reads_weight_tiles;
}

int64_t scaled_gemm_min_call_columns(ScaledGemmFn kernel) {
  return kernel_row(kernel, "scaled_gemm_min_call_columns").min_call_columns;
}

int64_t scaled_gemm_one_pass_rows(ScaledGemmFn kernel) {
  return kernel_row(kernel, "scaled_gemm_one_pass_rows").one_pass_rows;
}

IsaLevel scaled_gemm_kernel_level(ScaledGemmFn kernel) {
  return kernel_row(kernel, "scaled_gemm_kernel_level").level;
}

const char* scaled_gemm_kernel_name(ScaledGemmFn kernel) {
  return kernel_row(kernel, "scaled_gemm_kernel_name").name;
}

size_t gemm_scratch_bytes(ScaledGemmFn kernel, const WeightOperand& w) {
  return kernel_row(kernel, "gemm_scratch_bytes").scratch_bytes(w);
}

}  // namespace moecore
