// The enums of moecore, generated from backends.def: C++ enum classes, their sglang wire strings
// and member names, parsing (with sglang's error text) and member lists. Nothing else may spell a
// backend or format name by hand.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace moecore {

enum class MoeRunnerBackend {
#define MOECORE_RUNNER_BACKEND(NAME, value, fused_only) NAME,
#include "moecore/core/backends.def"
#undef MOECORE_RUNNER_BACKEND
};

enum class MoeA2ABackend {
#define MOECORE_A2A_BACKEND(NAME, value) NAME,
#include "moecore/core/backends.def"
#undef MOECORE_A2A_BACKEND
};

enum class DeepEPMode {
#define MOECORE_DEEPEP_MODE(NAME, value) NAME,
#include "moecore/core/backends.def"
#undef MOECORE_DEEPEP_MODE
};

/// Dispatch output and combine input formats share one list (sglang keeps them value-equal).
enum class DispatchOutputFormat {
#define MOECORE_DISPATCH_FORMAT(NAME, value) NAME,
#include "moecore/core/backends.def"
#undef MOECORE_DISPATCH_FORMAT
};
using CombineInputFormat = DispatchOutputFormat;
constexpr size_t kNumDispatchFormats = 0
#define MOECORE_DISPATCH_FORMAT(NAME, value) +1
#include "moecore/core/backends.def"
#undef MOECORE_DISPATCH_FORMAT
    ;

enum class TopKOutputFormat {
#define MOECORE_TOPK_OUTPUT_FORMAT(NAME, value) NAME = value,
#include "moecore/core/backends.def"
#undef MOECORE_TOPK_OUTPUT_FORMAT
};

enum class ScoringFunc {
#define MOECORE_SCORING_FUNC(NAME, value) NAME,
#include "moecore/core/backends.def"
#undef MOECORE_SCORING_FUNC
};

enum class Activation {
#define MOECORE_ACTIVATION(NAME, value) NAME,
#include "moecore/core/backends.def"
#undef MOECORE_ACTIVATION
};

/// One member of a generated enum: its C++ value, sglang's member name and its wire value.
template <typename E>
struct EnumEntry {
  E member;
  const char* name;   // "TRITON"
  const char* value;  // "triton"
};

/// Per-enum table, defined in enums.cpp from backends.def.
template <typename E>
struct EnumInfo {
  static const char* class_name();  // the Python class: "MoeRunnerBackend"
  static const std::vector<EnumEntry<E>>& entries();
};

template <typename E>
const EnumEntry<E>& enum_entry(E e) {
  for (const auto& entry : EnumInfo<E>::entries())
    if (entry.member == e) return entry;
  throw std::logic_error("moecore: enum value missing from its table");
}
/// The wire value ("triton").
template <typename E>
std::string to_string(E e) {
  return enum_entry(e).value;
}
/// sglang's rendering of a member: "MoeRunnerBackend.TRITON".
template <typename E>
std::string qualified_name(E e) {
  return std::string(EnumInfo<E>::class_name()) + "." + enum_entry(e).name;
}
template <typename E>
std::vector<E> enum_members() {
  std::vector<E> out;
  for (const auto& entry : EnumInfo<E>::entries()) out.push_back(entry.member);
  return out;
}
/// Parses a wire value; throws InvalidArgument naming the valid values.
template <typename E>
E parse_enum(const std::string& text);

/// TopKOutputFormat is an IntEnum; its names are its only strings.
const char* topk_output_format_name(TopKOutputFormat f);

/// True for backends for which sglang builds no runner core (they need a fused func).
bool is_fused_only(MoeRunnerBackend backend);

/// DeepEPMode.resolve: AUTO becomes NORMAL when the batch has any extend (prefill) request.
DeepEPMode resolve_deepep_mode(DeepEPMode mode, bool is_extend_in_batch);
bool enable_normal(DeepEPMode mode);
bool enable_low_latency(DeepEPMode mode);

}  // namespace moecore
