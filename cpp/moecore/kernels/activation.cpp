// Scalar activation epilogues (fp32 math, std:: functions; one rounding point per contract).
#include "moecore/kernels/activation.h"

#include <algorithm>
#include <cmath>

#include "moecore/core/error.h"
#include "moecore/kernels/convert.h"

namespace moecore {

float silu(float x) { return x / (1.0f + std::exp(-x)); }
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

// Columns of gate[i] and up[i] in a GEMM1 output row of 2·inter values.
int64_t gate_column(const ActivationSpec& spec, int64_t i, int64_t inter) {
  switch (spec.layout) {
    case GateUpLayout::kGateUp:
      return i;
    case GateUpLayout::kUpGate:
      return inter + i;
    case GateUpLayout::kUpGateInterleaved:
      return (2 * (i / spec.interleave_group) + 1) * spec.interleave_group + i % spec.interleave_group;
  }
  return i;
}
int64_t up_column(const ActivationSpec& spec, int64_t i, int64_t inter) {
  switch (spec.layout) {
    case GateUpLayout::kGateUp:
      return inter + i;
    case GateUpLayout::kUpGate:
      return i;
    case GateUpLayout::kUpGateInterleaved:
      return 2 * (i / spec.interleave_group) * spec.interleave_group + i % spec.interleave_group;
  }
  return inter + i;
}

}  // namespace

void apply_activation(const ActivationSpec& spec, const float* in, int64_t ldin, float* out,
                      int64_t ldout, int64_t rows, int64_t inter) {
  apply_activation_block(spec, in, ldin, out, ldout, rows, inter, 0, inter);
}

int64_t activation_column_align(const ActivationSpec& spec) {
  const bool interleaved =
      spec.gated && !spec.alpha && spec.layout == GateUpLayout::kUpGateInterleaved;
  return interleaved ? spec.interleave_group : 1;
}

std::array<ColumnSpan, 2> activation_gemm1_spans(const ActivationSpec& spec, int64_t inter,
                                                 int64_t col0, int64_t cols) {
  if (!spec.gated) return {ColumnSpan{col0, cols}, ColumnSpan{}};
  if (spec.alpha || spec.layout == GateUpLayout::kUpGateInterleaved)
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
    if (spec.alpha) {
      const float alpha = *spec.alpha, limit = spec.clamp_limit;
      for (int64_t i = col0; i < end; ++i) {
        const float gate = std::min(x[2 * i], limit);
        const float up = std::clamp(x[2 * i + 1], -limit, limit);
        const float glu = gate / (1.0f + std::exp(-alpha * gate));
        y[i] = round_to(rd, glu * (up + spec.beta));
      }
    } else if (!spec.gated) {
      for (int64_t i = col0; i < end; ++i) y[i] = round_to(rd, unary(spec.kind, x[i]));
    } else {
      for (int64_t i = col0; i < end; ++i) {
        float gate = x[gate_column(spec, i, inter)], up = x[up_column(spec, i, inter)];
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

}  // namespace moecore
