// Scalar activation epilogues, the reference row of the table (fp32 math, exp_f32 for σ and std::
// functions for gelu; one rounding point per contract), and the table itself.
#include "moecore/kernels/activation.h"

#include <algorithm>
#include <cmath>

#include "moecore/core/error.h"
#include "moecore/kernels/convert.h"
#include "moecore/kernels/exp_f32.h"

namespace moecore {

float silu(float x) { return x / (1.0f + exp_f32(-x)); }
float gelu_erf(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }
float gelu_tanh(float x) {
  const float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(inner));
}

namespace {

float unary(Activation kind, float x) {
  switch (kind) {
    case Activation::SILU:
      return silu(x);
    case Activation::GELU:
      return gelu_erf(x);
    case Activation::GELU_TANH:
      return gelu_tanh(x);
    case Activation::RELU2: {
      const float r = x > 0.0f ? x : 0.0f;
      return r * r;
    }
  }
  MOECORE_INTERNAL_CHECK(false, "unknown activation");
}

}  // namespace

int64_t activation_gate_column(const ActivationSpec& spec, int64_t i, int64_t inter) {
  switch (spec.layout) {
    case GateUpLayout::kGateUp:
      return i;
    case GateUpLayout::kUpGate:
      return inter + i;
    case GateUpLayout::kUpGateInterleaved:
      return (2 * (i / spec.interleave_group) + 1) * spec.interleave_group + i % spec.interleave_group;
    case GateUpLayout::kGateUpPairs:
      return 2 * i;
  }
  return i;
}

int64_t activation_up_column(const ActivationSpec& spec, int64_t i, int64_t inter) {
  switch (spec.layout) {
    case GateUpLayout::kGateUp:
      return inter + i;
    case GateUpLayout::kUpGate:
      return i;
    case GateUpLayout::kUpGateInterleaved:
      return 2 * (i / spec.interleave_group) * spec.interleave_group + i % spec.interleave_group;
    case GateUpLayout::kGateUpPairs:
      return 2 * i + 1;
  }
  return inter + i;
}

void apply_activation(const ActivationSpec& spec, const float* in, int64_t ldin, float* out,
                      int64_t ldout, int64_t rows, int64_t inter) {
  apply_activation_block(spec, in, ldin, out, ldout, rows, inter, 0, inter);
}

int64_t activation_column_align(const ActivationSpec& spec) {
  const bool interleaved = spec.gated && spec.layout == GateUpLayout::kUpGateInterleaved;
  return interleaved ? spec.interleave_group : 1;
}

std::array<ColumnSpan, 2> activation_gemm1_spans(const ActivationSpec& spec, int64_t inter,
                                                 int64_t col0, int64_t cols) {
  if (!spec.gated) return {ColumnSpan{col0, cols}, ColumnSpan{}};
  if (spec.layout == GateUpLayout::kGateUpPairs || spec.layout == GateUpLayout::kUpGateInterleaved)
    return {ColumnSpan{2 * col0, 2 * cols}, ColumnSpan{}};
  return {ColumnSpan{col0, cols}, ColumnSpan{inter + col0, cols}};  // either order of halves
}

void apply_activation_block(const ActivationSpec& spec, const float* in, int64_t ldin, float* out,
                            int64_t ldout, int64_t rows, int64_t inter, int64_t col0,
                            int64_t cols) {
  const DType rd = spec.round_dtype;
  const int64_t end = col0 + cols;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = in + r * ldin;
    float* y = out + r * ldout - col0;  // y[i] for i in [col0, end)
    if (!spec.gated) {
      for (int64_t i = col0; i < end; ++i) y[i] = round_to(rd, unary(spec.kind, x[i]));
    } else if (spec.alpha) {
      const float alpha = *spec.alpha, limit = spec.clamp_limit;
      for (int64_t i = col0; i < end; ++i) {
        const float gate = std::min(x[activation_gate_column(spec, i, inter)], limit);
        const float up = std::clamp(x[activation_up_column(spec, i, inter)], -limit, limit);
        const float glu = gate / (1.0f + exp_f32(-alpha * gate));
        y[i] = round_to(rd, glu * (up + spec.beta));
      }
    } else {
      for (int64_t i = col0; i < end; ++i) {
        float gate = x[activation_gate_column(spec, i, inter)];
        float up = x[activation_up_column(spec, i, inter)];
        if (spec.swiglu_limit) {
          gate = std::min(gate, *spec.swiglu_limit);
          up = std::clamp(up, -*spec.swiglu_limit, *spec.swiglu_limit);
        }
        float act = unary(spec.kind, gate);
        if (spec.round_before_mul) act = round_to(rd, act);
        y[i] = round_to(rd, act * up);
      }
    }
  }
}

// Rows are named explicitly (a missing ISA file is a link error, not a silent gap).
ActivationFn activation_kernel(IsaLevel level) {
#ifdef MOECORE_COMPILED_AVX512
  if (level >= IsaLevel::kAvx512) return apply_activation_block_avx512;
#endif
#ifdef MOECORE_COMPILED_AVX2
  if (level >= IsaLevel::kAvx2) return apply_activation_block_avx2;
#endif
  return apply_activation_block;
}

}  // namespace moecore
