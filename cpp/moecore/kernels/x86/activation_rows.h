// The vector rows of the activation table (kernels/activation.h), written once over a lane type
// that the avx2 and avx512 files supply. Each lane does the reference row's fp32 operations in
// its order: std::min and std::clamp through the operand order of the min and max instructions
// (a NaN passes as it does there), σ's exp_f32 in the same double operations, the roundings of
// kernels/convert.h. Tails are masked loads and stores, so nothing outside the block is touched.
// gelu and gelu_tanh run the reference row.
//
// A lane type L has: F (L::kWidth fp32 lanes); load(p, n) and store(p, v, n) of n ≤ kWidth lanes;
// load_pairs(p, n, even, odd) of 2n interleaved values; set1, add, mul, div; min(a, b) = a < b ?
// a : b and max(a, b) = a > b ? a : b (the instructions' own rule); neg (the sign flipped);
// exp (exp_f32 per lane); round(dtype, v) (round_to per lane).
#pragma once

#include <algorithm>
#include <cstdint>

#include "moecore/kernels/activation.h"

namespace moecore::activation_rows {

// num / (1 + e^z), as the reference writes σ's quotients.
template <class L>
inline typename L::F over_one_plus_exp(typename L::F num, typename L::F z) {
  return L::div(num, L::add(L::set1(1.0f), L::exp(z)));
}

// silu or relu2 (the kinds the vector rows take).
template <class L>
inline typename L::F unary(Activation kind, typename L::F x) {
  if (kind == Activation::RELU2) {
    const typename L::F r = L::max(x, L::set1(0.0f));  // x > 0 ? x : 0 (NaN → 0)
    return L::mul(r, r);
  }
  return over_one_plus_exp<L>(x, L::neg(x));
}

// A gated activation of gate and up vectors: the clamped SwiGLU (alpha), or silu / relu2 with the
// DSv4 clamp and the torch-native rounding where the spec has them; rounded to round_dtype.
template <class L>
inline typename L::F gated(const ActivationSpec& spec, typename L::F gate, typename L::F up) {
  using F = typename L::F;
  if (spec.alpha) {
    const F limit = L::set1(spec.clamp_limit);
    gate = L::min(limit, gate);                                // std::min(gate, limit)
    up = L::max(L::set1(-spec.clamp_limit), L::min(limit, up));  // std::clamp(up, −limit, limit)
    const F glu = over_one_plus_exp<L>(gate, L::mul(L::set1(-*spec.alpha), gate));
    return L::round(spec.round_dtype, L::mul(glu, L::add(up, L::set1(spec.beta))));
  }
  if (spec.swiglu_limit) {
    const F limit = L::set1(*spec.swiglu_limit);
    gate = L::min(limit, gate);
    up = L::max(L::set1(-*spec.swiglu_limit), L::min(limit, up));
  }
  F act = unary<L>(spec.kind, gate);
  if (spec.round_before_mul) act = L::round(spec.round_dtype, act);
  return L::round(spec.round_dtype, L::mul(act, up));
}

template <class L>
void apply_block(const ActivationSpec& spec, const float* in, int64_t ldin, float* out,
                 int64_t ldout, int64_t rows, int64_t inter, int64_t col0, int64_t cols) {
  if (!spec.alpha && (spec.kind == Activation::GELU || spec.kind == Activation::GELU_TANH))
    return apply_activation_block(spec, in, ldin, out, ldout, rows, inter, col0, cols);
  const int64_t end = col0 + cols;
  const bool interleaved = spec.layout == GateUpLayout::kUpGateInterleaved;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = in + r * ldin;
    float* y = out + r * ldout - col0;  // y[i] for i in [col0, end)
    if (!spec.gated) {
      for (int64_t i = col0; i < end; i += L::kWidth) {
        const int64_t n = std::min<int64_t>(L::kWidth, end - i);
        L::store(y + i, L::round(spec.round_dtype, unary<L>(spec.kind, L::load(x + i, n))), n);
      }
    } else if (spec.layout == GateUpLayout::kGateUpPairs) {
      for (int64_t i = col0; i < end; i += L::kWidth) {
        const int64_t n = std::min<int64_t>(L::kWidth, end - i);
        typename L::F gate, up;
        L::load_pairs(x + 2 * i, n, gate, up);
        L::store(y + i, gated<L>(spec, gate, up), n);
      }
    } else {
      for (int64_t i = col0; i < end;) {  // runs of contiguous gate and up columns
        const int64_t group = spec.interleave_group;
        const int64_t run = interleaved ? std::min(end - i, group - i % group) : end - i;
        const float* g = x + activation_gate_column(spec, i, inter);
        const float* u = x + activation_up_column(spec, i, inter);
        for (int64_t j = 0; j < run; j += L::kWidth) {
          const int64_t n = std::min<int64_t>(L::kWidth, run - j);
          L::store(y + i + j, gated<L>(spec, L::load(g + j, n), L::load(u + j, n)), n);
        }
        i += run;
      }
    }
  }
}

}  // namespace moecore::activation_rows
