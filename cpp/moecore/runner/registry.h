// The registries of MoeRunner (sglang FusedOpPool and PermuteMethodPool, DESIGN.md §4): fused
// funcs by (a2a, runner), pre-permutes by (dispatch format, runner), post-permutes by (runner,
// dispatch format), runner-core factories by runner — and moecore's fifth, prepared runs (the
// capturable form of a path, prepared.h) by (dispatch format, runner). Duplicates are rejected with
// sglang's messages; a backend file registers its own entries with the macros below.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "moecore/runner/io.h"
#include "moecore/runner/prepared.h"

namespace moecore {

using FusedFunc = std::function<CombineInputPtr(const DispatchOutputPtr&, const QuantInfoPtr&,
                                                const MoeRunnerConfig&)>;
using PrePermuteFn = std::function<RunnerInputPtr(const DispatchOutputPtr&, const QuantInfoPtr&,
                                                  const MoeRunnerConfig&, RunningState&)>;
using PostPermuteFn = std::function<CombineInputPtr(const RunnerOutputPtr&, const QuantInfoPtr&,
                                                    const MoeRunnerConfig&, RunningState&)>;
using CoreFactory = std::function<std::unique_ptr<RunnerCore>(const MoeRunnerConfig&)>;

using FusedKey = std::pair<MoeA2ABackend, MoeRunnerBackend>;
using PreKey = std::pair<DispatchOutputFormat, MoeRunnerBackend>;
using PostKey = std::pair<MoeRunnerBackend, CombineInputFormat>;

/// One entry: the callable and where it came from ("cpp/.../triton.cpp" or "python:module.fn").
template <typename Fn>
struct Registered {
  Fn fn;
  std::string origin;
};

// Registration (thread-safe). Duplicates throw InvalidArgument with sglang's text.
void register_fused_func(MoeA2ABackend a2a, MoeRunnerBackend runner, FusedFunc fn,
                         std::string origin);
void register_pre_permute(DispatchOutputFormat format, MoeRunnerBackend runner, PrePermuteFn fn,
                          std::string origin);
void register_post_permute(MoeRunnerBackend runner, CombineInputFormat format, PostPermuteFn fn,
                           std::string origin);
void register_runner_core(MoeRunnerBackend runner, CoreFactory factory, std::string origin);
void register_prepared_run(DispatchOutputFormat format, MoeRunnerBackend runner, PrepareFn fn,
                           std::string origin);

// Lookup: nullopt when absent.
std::optional<FusedFunc> find_fused_func(MoeA2ABackend a2a, MoeRunnerBackend runner);
std::optional<PrePermuteFn> find_pre_permute(DispatchOutputFormat format, MoeRunnerBackend runner);
std::optional<PostPermuteFn> find_post_permute(MoeRunnerBackend runner, CombineInputFormat format);
std::optional<CoreFactory> find_runner_core(MoeRunnerBackend runner);
std::optional<PrepareFn> find_prepared_run(DispatchOutputFormat format, MoeRunnerBackend runner);

/// Removes an entry (test harnesses that registered Python callables clean up with these).
bool unregister_fused_func(MoeA2ABackend a2a, MoeRunnerBackend runner);
bool unregister_pre_permute(DispatchOutputFormat format, MoeRunnerBackend runner);
bool unregister_post_permute(MoeRunnerBackend runner, CombineInputFormat format);
bool unregister_runner_core(MoeRunnerBackend runner);
bool unregister_prepared_run(DispatchOutputFormat format, MoeRunnerBackend runner);

/// Introspection: every key with its origin, sorted by key.
std::vector<std::pair<FusedKey, std::string>> registered_fused_funcs();
std::vector<std::pair<PreKey, std::string>> registered_pre_permutes();
std::vector<std::pair<PostKey, std::string>> registered_post_permutes();
std::vector<std::pair<MoeRunnerBackend, std::string>> registered_runner_cores();
std::vector<std::pair<PreKey, std::string>> registered_prepared_runs();

/// Errors thrown by static registrars (which must not throw out of static initialisation);
/// empty in a correct build, and a test asserts so.
const std::vector<std::string>& registration_errors();

namespace detail {
struct StaticRegistrar {
  template <typename F>
  explicit StaticRegistrar(F&& register_now);
};
void record_registration_error(const std::string& what);
/// "/abs/path/cpp/moecore/runner/backends/triton.cpp" → "cpp/moecore/runner/backends/triton.cpp".
std::string source_origin(const char* file);
template <typename F>
StaticRegistrar::StaticRegistrar(F&& register_now) {
  try {
    register_now();
  } catch (const std::exception& e) {
    record_registration_error(e.what());
  }
}
}  // namespace detail

}  // namespace moecore

#define MOECORE_CONCAT_INNER(a, b) a##b
#define MOECORE_CONCAT(a, b) MOECORE_CONCAT_INNER(a, b)
#define MOECORE_REGISTRAR(body)                                                              \
  static const ::moecore::detail::StaticRegistrar MOECORE_CONCAT(moecore_registrar_, __LINE__)( \
      [] { body; })

/// At namespace scope in a backend file: registers fn for (a2a, runner) at load time.
#define MOECORE_REGISTER_FUSED_FUNC(A2A, RUNNER, fn)                                         \
  MOECORE_REGISTRAR(::moecore::register_fused_func(::moecore::MoeA2ABackend::A2A,            \
                                                   ::moecore::MoeRunnerBackend::RUNNER, fn, \
                                                   ::moecore::detail::source_origin(__FILE__)))
#define MOECORE_REGISTER_PRE_PERMUTE(FORMAT, RUNNER, fn)                                        \
  MOECORE_REGISTRAR(::moecore::register_pre_permute(::moecore::DispatchOutputFormat::FORMAT,   \
                                                    ::moecore::MoeRunnerBackend::RUNNER, fn, \
                                                    ::moecore::detail::source_origin(__FILE__)))
#define MOECORE_REGISTER_POST_PERMUTE(RUNNER, FORMAT, fn)                                      \
  MOECORE_REGISTRAR(::moecore::register_post_permute(::moecore::MoeRunnerBackend::RUNNER,     \
                                                     ::moecore::DispatchOutputFormat::FORMAT, \
                                                     fn, ::moecore::detail::source_origin(__FILE__)))
#define MOECORE_REGISTER_RUNNER_CORE(RUNNER, factory)                                         \
  MOECORE_REGISTRAR(::moecore::register_runner_core(::moecore::MoeRunnerBackend::RUNNER,     \
                                                    factory, ::moecore::detail::source_origin(__FILE__)))
/// At namespace scope in a backend file: registers the prepared (capturable) form of the path
/// that runs RUNNER on dispatch FORMAT.
#define MOECORE_REGISTER_PREPARED_RUN(FORMAT, RUNNER, fn)                                        \
  MOECORE_REGISTRAR(::moecore::register_prepared_run(::moecore::DispatchOutputFormat::FORMAT,   \
                                                     ::moecore::MoeRunnerBackend::RUNNER, fn, \
                                                     ::moecore::detail::source_origin(__FILE__)))
