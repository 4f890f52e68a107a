// MoeRunner construction (all resolution) and run (no lookups).
#include "moecore/runner/runner.h"

#include <algorithm>

#include "moecore/core/env.h"
#include "moecore/core/error.h"

namespace moecore {
namespace {

std::string executable_backends() {
  std::string out;
  for (const auto& [backend, origin] : registered_runner_cores())
    out += std::string(out.empty() ? "" : ", ") + to_string(backend);
  for (const auto& [key, origin] : registered_fused_funcs())
    if (!find_runner_core(key.second) && out.find(to_string(key.second)) == std::string::npos)
      out += std::string(out.empty() ? "" : ", ") + to_string(key.second);
  return out;
}

bool from_python(const std::string& origin) { return origin.rfind("python:", 0) == 0; }

/// The first Python-registered callable among those a runner resolved, described; "" if none.
std::string python_callable(MoeA2ABackend a2a, MoeRunnerBackend runner, bool fused, bool core) {
  if (fused)
    for (const auto& [key, origin] : registered_fused_funcs())
      if (key == FusedKey{a2a, runner} && from_python(origin))
        return "the fused func " + origin;
  if (!core) return "";
  for (const auto& [key, origin] : registered_runner_cores())
    if (key == runner && from_python(origin)) return "the runner core " + origin;
  for (const auto& [key, origin] : registered_pre_permutes())
    if (key.second == runner && from_python(origin)) return "the pre-permute " + origin;
  for (const auto& [key, origin] : registered_post_permutes())
    if (key.first == runner && from_python(origin)) return "the post-permute " + origin;
  return "";
}

}  // namespace

MoeRunner::MoeRunner(MoeRunnerBackend runner_backend, MoeRunnerConfig config,
                     std::optional<MoeA2ABackend> a2a_backend, bool lora_enabled)
    : runner_backend_(runner_backend),
      a2a_backend_(a2a_backend.value_or(get_moe_a2a_backend())),
      config_(std::move(config)) {
  if (runner_backend_ == MoeRunnerBackend::AUTO)
    MOECORE_UNSUPPORTED("MoeRunner: runner backend 'auto' must be resolved before a runner is "
                        "built (the quant method's create_moe_runner does this)");
  if (lora_enabled) MOECORE_UNSUPPORTED("MoeRunner: LoRA MoE is not implemented in moecore");
  if (config_.isa_level) {
    const auto levels = available_isa_levels();
    if (std::find(levels.begin(), levels.end(), *config_.isa_level) == levels.end())
      MOECORE_UNSUPPORTED("MoeRunner: isa_level '", isa_level_name(*config_.isa_level),
                          "' is not available on this machine and build");
  } else {
    config_.isa_level = current_isa_level();
  }
  if (!config_.amx_float_tiles)
    config_.amx_float_tiles = env_flag("MOECORE_AMX_FLOAT_TILES", false);

  std::optional<CoreFactory> factory = find_runner_core(runner_backend_);
  std::optional<FusedFunc> fused = find_fused_func(a2a_backend_, runner_backend_);
  if (!factory && !is_fused_only(runner_backend_))
    MOECORE_UNSUPPORTED("Unsupported runner backend: ", qualified_name(runner_backend_),
                        " (moecore executes: ", executable_backends(), ")");
  if (!factory && !fused)
    MOECORE_UNSUPPORTED("Runner backend ", qualified_name(runner_backend_),
                        " requires a fused func for a2a backend ", to_string(a2a_backend_),
                        ", but none is registered.");
  const bool unfused =
      config_.force_unfused || env_flag("SGLANG_CI_DISABLE_MOE_FUSED_FUNC", false);
  if (unfused && !factory)
    MOECORE_UNSUPPORTED("MoeRunner: ", qualified_name(runner_backend_),
                        " is fused-only, so it cannot run with the fused func disabled "
                        "(force_unfused or SGLANG_CI_DISABLE_MOE_FUSED_FUNC=1)");
  if (fused && !unfused) fused_func_ = std::move(*fused);
  if (factory) {
    core_ = (*factory)(config_);
    MOECORE_INTERNAL_CHECK(core_ != nullptr, "core factory for ", to_string(runner_backend_),
                           " returned null");
    for (DispatchOutputFormat format : enum_members<DispatchOutputFormat>()) {
      const size_t i = static_cast<size_t>(format);
      if (auto pre = find_pre_permute(format, runner_backend_)) pre_permutes_[i] = *pre;
      if (auto post = find_post_permute(runner_backend_, format)) post_permutes_[i] = *post;
    }
  }
  for (DispatchOutputFormat format : enum_members<DispatchOutputFormat>())
    if (auto prepare = find_prepared_run(format, runner_backend_))
      prepares_[static_cast<size_t>(format)] = *prepare;
  python_callable_ = python_callable(a2a_backend_, runner_backend_, static_cast<bool>(fused_func_),
                                     !fused_func_);
}

PreparedRunPtr MoeRunner::prepare(const DispatchOutputPtr& dispatch_output,
                                  const QuantInfoPtr& quant_info) const {
  MOECORE_CHECK(dispatch_output != nullptr,
                "MoeRunner.prepare: expected a dispatch output, got None");
  MOECORE_CHECK(quant_info != nullptr, "MoeRunner.prepare: expected a quant info, got None");
  const DispatchOutputFormat format = dispatch_output->format();
  if (!python_callable_.empty())
    MOECORE_UNSUPPORTED("MoeRunner.prepare: the ", to_string(a2a_backend_), " → ",
                        to_string(runner_backend_), " path runs ", python_callable_,
                        ", which moecore cannot capture; unregister it to capture this path");
  const PrepareFn& prepare = prepares_[static_cast<size_t>(format)];
  if (!prepare)
    MOECORE_UNSUPPORTED("MoeRunner.prepare: no prepared run is registered for dispatch format ",
                        to_string(format), " on runner ", to_string(runner_backend_),
                        ", so this path cannot be captured");
  PreparedRunPtr prepared = prepare(dispatch_output, quant_info, config_, a2a_backend_);
  MOECORE_INTERNAL_CHECK(prepared != nullptr && prepared->combine_input() != nullptr,
                         "the prepared run for ", to_string(format), " to ",
                         to_string(runner_backend_), " returned no combine input");
  return prepared;
}

CombineInputPtr MoeRunner::run(const DispatchOutputPtr& dispatch_output,
                               const QuantInfoPtr& quant_info) {
  MOECORE_CHECK(dispatch_output != nullptr, "MoeRunner.run: expected a dispatch output, got None");
  MOECORE_CHECK(quant_info != nullptr, "MoeRunner.run: expected a quant info, got None");
  if (fused_func_) return fused_func_(dispatch_output, quant_info, config_);

  const DispatchOutputFormat format = dispatch_output->format();
  const PrePermuteFn& pre = pre_permutes_[static_cast<size_t>(format)];
  MOECORE_ASSERT(static_cast<bool>(pre), "Pre-permute function for ", to_string(format), " to ",
                 to_string(runner_backend_), " is not registered");
  const PostPermuteFn& post = post_permutes_[static_cast<size_t>(format)];
  MOECORE_ASSERT(static_cast<bool>(post), "Post-permute function for ",
                 to_string(runner_backend_), " to ", to_string(format), " is not registered");

  RunningState state;
  state.down_gemm_overlap_args = down_gemm_overlap_args_;
  state.meta_overlap_args = meta_overlap_args_;
  RunnerInputPtr runner_input = pre(dispatch_output, quant_info, config_, state);
  RunnerOutputPtr runner_output = core_->run(runner_input, quant_info, state);
  return post(runner_output, quant_info, config_, state);
}

void MoeRunner::set_overlap_args(std::any down, std::any meta) {
  down_gemm_overlap_args_ = std::move(down);
  meta_overlap_args_ = std::move(meta);
}

void MoeRunner::clear_overlap_args() {
  down_gemm_overlap_args_.reset();
  meta_overlap_args_.reset();
}

}  // namespace moecore
