// Process-wide backend selection (sglang layers/moe/utils.py keeps these as module globals).
#include <atomic>

#include "moecore/runner/config.h"

namespace moecore {
namespace {
std::atomic<MoeA2ABackend> g_a2a{MoeA2ABackend::NONE};
std::atomic<MoeRunnerBackend> g_runner{MoeRunnerBackend::AUTO};
std::atomic<DeepEPMode> g_deepep_mode{DeepEPMode::AUTO};
}  // namespace

MoeA2ABackend get_moe_a2a_backend() { return g_a2a.load(); }
MoeRunnerBackend get_moe_runner_backend() { return g_runner.load(); }
DeepEPMode get_deepep_mode() { return g_deepep_mode.load(); }
void set_moe_a2a_backend(MoeA2ABackend b) { g_a2a.store(b); }
void set_moe_runner_backend(MoeRunnerBackend b) { g_runner.store(b); }
void set_deepep_mode(DeepEPMode m) { g_deepep_mode.store(m); }

}  // namespace moecore
