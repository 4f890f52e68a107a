// MoeRunner (sglang moe_runner/runner.py): picks, once at construction, either the fused func
// registered for (a2a backend, runner backend) or the runner core with its pre/post permutes for
// every dispatch format. run() does no registry lookups.
#pragma once

#include <any>
#include <array>
#include <memory>
#include <optional>
#include <string>

#include "moecore/runner/registry.h"

namespace moecore {

class MoeRunner {
 public:
  /// a2a_backend: nullopt reads the process-wide get_moe_a2a_backend() now, as sglang does.
  /// Throws Unsupported for 'auto', for backends moecore cannot execute, for a fused-only
  /// backend with no fused func for the a2a backend (rule R1's message), and for LoRA.
  MoeRunner(MoeRunnerBackend runner_backend, MoeRunnerConfig config,
            std::optional<MoeA2ABackend> a2a_backend = std::nullopt, bool lora_enabled = false);

  /// Runs the MoE experts on a dispatch output. Throws ContractViolation (sglang's assertion
  /// text) if no permute is registered for the dispatch output's format.
  CombineInputPtr run(const DispatchOutputPtr& dispatch_output, const QuantInfoPtr& quant_info);

  /// Captures this runner's path for the dispatch output's shapes (prepared.h): run() on the
  /// result gives what run(dispatch_output, quant_info) gives for the tensors' contents at that
  /// time, bit for bit. Throws Unsupported, naming the reason, for a path that cannot be
  /// captured: none prepared for the dispatch format, or Python-registered callables in use.
  PreparedRunPtr prepare(const DispatchOutputPtr& dispatch_output,
                         const QuantInfoPtr& quant_info) const;

  void set_overlap_args(std::any down_gemm_overlap_args, std::any meta_overlap_args);
  void clear_overlap_args();
  const std::any& down_gemm_overlap_args() const { return down_gemm_overlap_args_; }
  const std::any& meta_overlap_args() const { return meta_overlap_args_; }

  MoeRunnerBackend runner_backend() const { return runner_backend_; }
  MoeA2ABackend a2a_backend() const { return a2a_backend_; }
  const MoeRunnerConfig& config() const { return config_; }
  bool uses_fused_func() const { return static_cast<bool>(fused_func_); }
  RunnerCore* runner_core() const { return core_.get(); }

 private:
  MoeRunnerBackend runner_backend_;
  MoeA2ABackend a2a_backend_;
  MoeRunnerConfig config_;
  FusedFunc fused_func_;
  std::unique_ptr<RunnerCore> core_;
  std::array<PrePermuteFn, kNumDispatchFormats> pre_permutes_;
  std::array<PostPermuteFn, kNumDispatchFormats> post_permutes_;
  std::array<PrepareFn, kNumDispatchFormats> prepares_;
  std::string python_callable_;  // the first Python-registered callable run() uses; "" if none
  std::any down_gemm_overlap_args_;
  std::any meta_overlap_args_;
};

}  // namespace moecore
