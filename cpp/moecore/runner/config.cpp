// Activation validation for MoeRunnerConfig (rule R15).
#include "moecore/runner/config.h"

#include <cmath>

#include "moecore/core/error.h"

namespace moecore {

ActivationSpec activation_spec(const MoeRunnerConfig& c, const char* api) {
  ActivationSpec spec;
  bool known = false;
  for (const auto& entry : EnumInfo<Activation>::entries()) {
    if (c.activation == entry.value) {
      spec.kind = entry.member;
      known = true;
    }
  }
  if (!known) MOECORE_THROW(InvalidArgument, "Unsupported activation: activation='", c.activation, "'");
  spec.gated = c.is_gated;
  const bool is_gelu = spec.kind == Activation::GELU || spec.kind == Activation::GELU_TANH;
  MOECORE_CHECK(!(is_gelu && c.gemm1_alpha), api, ": gemm1_alpha is not supported for gelu");
  MOECORE_CHECK(!(is_gelu && c.gemm1_clamp_limit), api,
                ": gemm1_clamp_limit is not supported for gelu");
  MOECORE_CHECK(!(c.gemm1_alpha && !c.gemm1_clamp_limit), api,
                ": gemm1_clamp_limit is required when gemm1_alpha is set");
  MOECORE_CHECK(!(c.gemm1_clamp_limit && !c.gemm1_alpha), api,
                ": gemm1_clamp_limit without gemm1_alpha has no effect; set gemm1_alpha for the "
                "GPT-OSS clamped SwiGLU or swiglu_limit for the DSv4 clamp");
  MOECORE_CHECK(!(spec.kind == Activation::RELU2 && c.is_gated), api,
                ": relu2 is a non-gated activation; set is_gated=False");
  MOECORE_CHECK(!(c.no_combine && c.inplace), api, ": no_combine requires inplace=False");
  if (c.gemm1_alpha) {
    MOECORE_CHECK(spec.kind == Activation::SILU && c.is_gated, api,
                  ": gemm1_alpha (clamped SwiGLU) requires a gated silu activation");
    MOECORE_CHECK(std::isfinite(*c.gemm1_alpha) && std::isfinite(*c.gemm1_clamp_limit) &&
                      *c.gemm1_clamp_limit > 0,
                  api, ": expected finite gemm1_alpha and a positive gemm1_clamp_limit, got ",
                  *c.gemm1_alpha, " and ", *c.gemm1_clamp_limit);
    spec.alpha = c.gemm1_alpha;
    spec.layout = GateUpLayout::kGateUpPairs;  // GPT-OSS's interleaved w13 rows
    spec.clamp_limit = *c.gemm1_clamp_limit;
    spec.beta = c.gemm1_beta.value_or(1.0f);
  }
  if (c.swiglu_limit) {
    MOECORE_CHECK(spec.kind == Activation::SILU && c.is_gated && !c.gemm1_alpha, api,
                  ": swiglu_limit (DSv4 clamp) requires gated silu without gemm1_alpha");
    MOECORE_CHECK(*c.swiglu_limit > 0, api, ": expected swiglu_limit > 0, got ", *c.swiglu_limit);
    spec.swiglu_limit = c.swiglu_limit;
  }
  if (c.routed_scaling_factor) {
    MOECORE_CHECK(std::isfinite(*c.routed_scaling_factor), api,
                  ": expected a finite routed_scaling_factor, got ", *c.routed_scaling_factor);
  }
  return spec;
}

}  // namespace moecore
