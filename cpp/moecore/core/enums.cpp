// The enum tables of enums.h, generated from backends.def.
#include "moecore/core/enums.h"

#include <iterator>

#include "moecore/core/error.h"

namespace moecore {
namespace {

template <typename E>
E parse_from_table(const std::string& text) {
  std::string valid;
  for (const auto& entry : EnumInfo<E>::entries()) {
    if (text == entry.value) return entry.member;
    valid += std::string(valid.empty() ? "" : ", ") + entry.value;
  }
  MOECORE_THROW(InvalidArgument, "'", text, "' is not a valid ", EnumInfo<E>::class_name(),
                " (valid: ", valid, ")");
}

}  // namespace

#define MOECORE_ENUM_TABLE(E, PY_NAME, ARRAY)                              \
  template <>                                                            \
  const char* EnumInfo<E>::class_name() {                                \
    return PY_NAME;                                                      \
  }                                                                      \
  template <>                                                            \
  const std::vector<EnumEntry<E>>& EnumInfo<E>::entries() {              \
    static const std::vector<EnumEntry<E>> table(std::begin(ARRAY), std::end(ARRAY)); \
    return table;                                                        \
  }                                                                      \
  template <>                                                            \
  E parse_enum<E>(const std::string& text) {                             \
    return parse_from_table<E>(text);                                    \
  }

#define MOECORE_RUNNER_BACKEND(NAME, value, fused_only) {MoeRunnerBackend::NAME, #NAME, value},
static const EnumEntry<MoeRunnerBackend> kRunnerBackends[] = {
#include "moecore/core/backends.def"
};
MOECORE_ENUM_TABLE(MoeRunnerBackend, "MoeRunnerBackend", kRunnerBackends)
#undef MOECORE_RUNNER_BACKEND

#define MOECORE_A2A_BACKEND(NAME, value) {MoeA2ABackend::NAME, #NAME, value},
static const EnumEntry<MoeA2ABackend> kA2ABackends[] = {
#include "moecore/core/backends.def"
};
MOECORE_ENUM_TABLE(MoeA2ABackend, "MoeA2ABackend", kA2ABackends)
#undef MOECORE_A2A_BACKEND

#define MOECORE_DEEPEP_MODE(NAME, value) {DeepEPMode::NAME, #NAME, value},
static const EnumEntry<DeepEPMode> kDeepEPModes[] = {
#include "moecore/core/backends.def"
};
MOECORE_ENUM_TABLE(DeepEPMode, "DeepEPMode", kDeepEPModes)
#undef MOECORE_DEEPEP_MODE

#define MOECORE_DISPATCH_FORMAT(NAME, value) {DispatchOutputFormat::NAME, #NAME, value},
static const EnumEntry<DispatchOutputFormat> kDispatchFormats[] = {
#include "moecore/core/backends.def"
};
MOECORE_ENUM_TABLE(DispatchOutputFormat, "DispatchOutputFormat", kDispatchFormats)
#undef MOECORE_DISPATCH_FORMAT

#define MOECORE_SCORING_FUNC(NAME, value) {ScoringFunc::NAME, #NAME, value},
static const EnumEntry<ScoringFunc> kScoringFuncs[] = {
#include "moecore/core/backends.def"
};
MOECORE_ENUM_TABLE(ScoringFunc, "ScoringFunc", kScoringFuncs)
#undef MOECORE_SCORING_FUNC

#define MOECORE_ACTIVATION(NAME, value) {Activation::NAME, #NAME, value},
static const EnumEntry<Activation> kActivations[] = {
#include "moecore/core/backends.def"
};
MOECORE_ENUM_TABLE(Activation, "Activation", kActivations)
#undef MOECORE_ACTIVATION

#undef MOECORE_ENUM_TABLE

const char* topk_output_format_name(TopKOutputFormat f) {
  switch (f) {
#define MOECORE_TOPK_OUTPUT_FORMAT(NAME, value) \
  case TopKOutputFormat::NAME:                  \
    return #NAME;
#include "moecore/core/backends.def"
#undef MOECORE_TOPK_OUTPUT_FORMAT
  }
  MOECORE_INTERNAL_CHECK(false, "bad TopKOutputFormat ", static_cast<int>(f));
}

bool is_fused_only(MoeRunnerBackend backend) {
  switch (backend) {
#define MOECORE_RUNNER_BACKEND(NAME, value, fused_only) \
  case MoeRunnerBackend::NAME:                          \
    return fused_only;
#include "moecore/core/backends.def"
#undef MOECORE_RUNNER_BACKEND
  }
  return false;
}

DeepEPMode resolve_deepep_mode(DeepEPMode mode, bool is_extend_in_batch) {
  if (mode != DeepEPMode::AUTO) return mode;
  return is_extend_in_batch ? DeepEPMode::NORMAL : DeepEPMode::LOW_LATENCY;
}
bool enable_normal(DeepEPMode mode) { return mode != DeepEPMode::LOW_LATENCY; }
bool enable_low_latency(DeepEPMode mode) { return mode != DeepEPMode::NORMAL; }

}  // namespace moecore
