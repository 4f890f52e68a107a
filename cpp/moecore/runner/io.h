// The runner-core interface and what flows between pre-permute, core and post-permute
// (sglang moe_runner/base.py: RunnerInput, RunnerOutput, MoeRunnerCore, running_state).
#pragma once

#include <any>
#include <memory>

#include "moecore/core/enums.h"
#include "moecore/dispatch/types.h"
#include "moecore/quant/quant_info.h"
#include "moecore/runner/config.h"

namespace moecore {

class RunnerInput {
 public:
  virtual ~RunnerInput() = default;
  virtual MoeRunnerBackend runner_backend() const = 0;
};
using RunnerInputPtr = std::shared_ptr<RunnerInput>;

class RunnerOutput {
 public:
  virtual ~RunnerOutput() = default;
  virtual MoeRunnerBackend runner_backend() const = 0;
};
using RunnerOutputPtr = std::shared_ptr<RunnerOutput>;

/// The only channel between a call's pre-permute, core and post-permute (sglang's dict).
struct RunningState {
  std::any down_gemm_overlap_args;  // as given to MoeRunner::set_overlap_args; empty: None
  std::any meta_overlap_args;
  std::any backend;  // whatever the active backend's pre-permute leaves for its core and post
  std::any binding;  // the Python dict that Python-registered permutes and cores see
};

/// sglang's MoeRunnerCore: runs the expert GEMMs on a backend's own token layout.
class RunnerCore {
 public:
  explicit RunnerCore(const MoeRunnerConfig& config) : config_(config) {}
  virtual ~RunnerCore() = default;
  virtual MoeRunnerBackend runner_backend() const = 0;
  virtual RunnerOutputPtr run(const RunnerInputPtr& input, const QuantInfoPtr& quant_info,
                              RunningState& state) = 0;
  const MoeRunnerConfig& config() const { return config_; }

 protected:
  MoeRunnerConfig config_;
};

}  // namespace moecore
