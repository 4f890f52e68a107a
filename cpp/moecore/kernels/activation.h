// Activation epilogues between GEMM1 and GEMM2, computed in fp32 from GEMM1's stored values.
// Formulas follow spec §7.6: SwiGLU / GeGLU on [gate | up] halves, plain non-gated activations,
// GPT-OSS clamped SwiGLU on interleaved pairs (or halves), the DSv4 clamp on halves.
//
// A kernel table with one row per ISA level (activation_kernel): the scalar row,
// apply_activation_block, is the reference, and every other row gives its bits for every input
// (±inf, ±0, subnormals, ties of the rounding; a NaN gives a NaN, whose payload may differ).
// σ is 1 / (1 + exp_f32(−x)) in every row, so the rows agree; gelu and gelu_tanh (std::erf,
// std::tanh) run the reference in every row.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include "moecore/core/dtype.h"
#include "moecore/core/enums.h"
#include "moecore/isa/isa.h"

namespace moecore {

/// Where the gate and up values sit in GEMM1's output row (the w13 row order).
enum class GateUpLayout {
  kGateUp,             // [gate | up] halves (sglang's canonical order)
  kUpGate,             // [up | gate] halves (load_up_proj_weight_first)
  kUpGateInterleaved,  // [up | gate] split into interleave_group chunks: U0, G0, U1, G1, … (CuteDSL)
  kGateUpPairs,        // [g0, u0, g1, u1, …] (GPT-OSS checkpoints, with gemm1_alpha)
};

struct ActivationSpec {
  Activation kind = Activation::SILU;
  bool gated = true;
  GateUpLayout layout = GateUpLayout::kGateUp;
  int64_t interleave_group = 64;
  /// GPT-OSS clamped SwiGLU (gemm1_alpha set; gated silu, on the columns `layout` names:
  /// kGateUpPairs from a config, kUpGate on FlashInfer's MXFP4 path),
  /// out = min(g, L)·σ(α·min(g, L))·(clamp(u, −L, L) + β).
  std::optional<float> alpha;
  float clamp_limit = 0.0f;
  float beta = 1.0f;
  /// DSv4 clamp on halves: g = min(g, L), u = clamp(u, −L, L), then silu(g)·u.
  std::optional<float> swiglu_limit;
  /// torch-native semantics (SiluAndMul.forward_native): round act(gate) to `round_dtype`
  /// before multiplying by up, then round the product. Otherwise one rounding at the end.
  bool round_before_mul = false;
  DType round_dtype = DType::kF32;
};

/// in: `rows` rows of fp32 GEMM1 values (width 2·inter if gated, else inter; stride ldin);
/// out: rows of `inter` fp32 values rounded to spec.round_dtype (stride ldout). The reference row.
void apply_activation(const ActivationSpec& spec, const float* in, int64_t ldin, float* out,
                      int64_t ldout, int64_t rows, int64_t inter);
/// The same for output columns [col0, col0 + cols) only (out points at column col0; in at
/// column 0, and only the GEMM1 columns of activation_gemm1_spans are read): GEMM1's epilogue
/// runs it on each column block it has just computed. The scalar row of the table.
void apply_activation_block(const ActivationSpec& spec, const float* in, int64_t ldin, float* out,
                            int64_t ldout, int64_t rows, int64_t inter, int64_t col0, int64_t cols);

/// One row of the activation table: apply_activation_block's contract, its bits.
using ActivationFn = void (*)(const ActivationSpec& spec, const float* in, int64_t ldin, float* out,
                              int64_t ldout, int64_t rows, int64_t inter, int64_t col0,
                              int64_t cols);
/// The best row at or below `level` that this build has (avx512_bf16 and amx use the avx512
/// row: nothing here needs their instructions). Epilogues run at their GEMM row's level.
ActivationFn activation_kernel(IsaLevel level);
#ifdef MOECORE_COMPILED_AVX2
void apply_activation_block_avx2(const ActivationSpec& spec, const float* in, int64_t ldin,
                                 float* out, int64_t ldout, int64_t rows, int64_t inter,
                                 int64_t col0, int64_t cols);
#endif
#ifdef MOECORE_COMPILED_AVX512
void apply_activation_block_avx512(const ActivationSpec& spec, const float* in, int64_t ldin,
                                   float* out, int64_t ldout, int64_t rows, int64_t inter,
                                   int64_t col0, int64_t cols);
#endif

/// The GEMM1 columns that gate[i] and up[i] of a gated activation read, in a row of 2·inter
/// values.
int64_t activation_gate_column(const ActivationSpec& spec, int64_t i, int64_t inter);
int64_t activation_up_column(const ActivationSpec& spec, int64_t i, int64_t inter);

/// A contiguous run [begin, begin + size) of GEMM1 output columns.
struct ColumnSpan {
  int64_t begin = 0, size = 0;
};
/// The GEMM1 columns that output columns [col0, col0 + cols) of the activation read: one span
/// (interleaved layouts, non-gated) or two (the gate and up halves); the second has size 0 when
/// there is one. Interleaved layouts need col0 and cols on activation_column_align boundaries.
std::array<ColumnSpan, 2> activation_gemm1_spans(const ActivationSpec& spec, int64_t inter,
                                                 int64_t col0, int64_t cols);
/// The column alignment activation blocks need (the interleave group of kUpGateInterleaved, else
/// 1).
int64_t activation_column_align(const ActivationSpec& spec);

/// Scalar activation functions, shared by kernels and tests. silu(x) = x / (1 + exp_f32(−x)).
float silu(float x);
float gelu_erf(float x);
float gelu_tanh(float x);

}  // namespace moecore
