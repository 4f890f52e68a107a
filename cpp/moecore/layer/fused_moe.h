// FusedMoE (sglang fused_moe_triton/layer.py): owns the expert weights of one rank, loads
// per-expert checkpoint shards into them, and wires routing → dispatcher → quant method →
// MoeRunner → combine. Tensor-parallel narrowing and expert-parallel id mapping happen here;
// summing the ranks' outputs (reduce_results) is the caller's.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moecore/dispatch/dispatcher.h"
#include "moecore/dispatch/transport.h"
#include "moecore/quant/method.h"

namespace moecore {

struct FusedMoEOptions {
  int64_t num_experts = 0;        // global, including fused shared experts
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // full (before TP sharding)
  TopKConfig topk_config;         // routing used by forward(hidden_states, router_logits)
  std::optional<int64_t> layer_id;
  DType params_dtype = DType::kBF16;
  bool with_bias = false;
  int64_t tp_size = 1, tp_rank = 0, ep_size = 1, ep_rank = 0;
  MoeRunnerConfig runner_config;  // activation, gating, scaling, ... (sizes are filled in)
  /// nullopt: the process-wide backends at construction (sglang reads them the same way).
  std::optional<MoeRunnerBackend> runner_backend;
  std::optional<MoeA2ABackend> a2a_backend;
  /// a2a "deepep" / "flashinfer": this rank's transport (ep_size and ep_rank must match it).
  TransportPtr transport;
  DeepEPMode deepep_mode = DeepEPMode::AUTO;
  int64_t num_max_dispatch_tokens_per_rank = 128;  // sglang's SGLANG_DEEPEP_NUM_MAX_DISPATCH_...
};

/// How weight_loader places a checkpoint tensor for one expert into a parameter (sglang attaches
/// this knowledge to each parameter's weight_loader).
enum class ShardLayout {
  kW13,       // [E, N1, ...]: shard "w1" fills the first half of dim 1 and "w3" the second (swapped
              // when the method loads up-proj first; non-gated: "w1" fills it all). The shard's
              // dim 0 is the full intermediate size (in the parameter's units): TP narrows it.
  kW2,        // [E, ..., n]: shard "w2"; its last dim is the full intermediate size: TP narrows it.
  kPerShard,  // [E, 2]: one value per shard, "w1" → [e, 0], "w3" → [e, 1] (w13 per-tensor scales).
  kPerExpert, // [E, ...]: the shard is copied whole, whatever its id (biases of w2, input scales).
};

struct ParamSpec {
  ShardLayout layout = ShardLayout::kPerExpert;
  bool tp_rank0_only = false;   // other TP ranks keep zeros (so the ranks' sum counts it once)
  bool global_experts = false;  // indexed by global expert id, not sliced by EP
};

class FusedMoE {
 public:
  /// Builds the layer: validates sizes, creates the quant method's parameters (zeros) and the
  /// dispatcher (a2a none: StandardDispatcher; deepep: DeepEPDispatcher; flashinfer:
  /// FlashinferDispatcher, both on options.transport). The runner is built by
  /// process_weights_after_loading(). Under deepep it applies sglang's DeepEPMoE deprecate_flag
  /// rules (§6.7): the generic path runs for fp8, for flashinfer_cutedsl + modelopt_fp4, and for
  /// unquantized bf16 weights when the mode enables low-latency — which needs the deep_gemm
  /// runner (moecore's stand-in for DeepGEMM JIT; rule R6). Every other combination would take
  /// a legacy DeepEPMoE path moecore does not build, and is rejected.
  FusedMoE(FusedMoEOptions options, std::shared_ptr<FusedMoEMethod> quant_method = nullptr);

  /// sglang's weight_loader: copies one checkpoint tensor for global `expert_id` into the
  /// parameter, as the parameter's ParamSpec says: e.g. shard "w1"/"w3" of [I_full, H] into
  /// w13 (rows narrowed to this TP rank), "w2" of [H, I_full] into w2 (columns narrowed).
  /// Experts of other EP ranks are ignored. Returns whether the tensor was used. Validates
  /// everything before writing.
  bool weight_loader(const std::string& param_name, const Tensor& loaded_weight,
                     const std::string& shard_id, int64_t expert_id);
  /// Runs the quant method's layout changes and builds the runner. Call once after loading.
  void process_weights_after_loading();

  /// hidden_states [T, H], router_logits [T, E_routed] → [T, H].
  Tensor forward(const Tensor& hidden_states, const Tensor& router_logits,
                 std::optional<int64_t> num_token_non_padded = std::nullopt);
  /// sglang's forward(hidden_states, topk_output).
  Tensor forward_topk(const Tensor& hidden_states, const TopKOutput& topk_output);

  void register_parameter(const std::string& name, Tensor tensor, ParamSpec spec = {});
  const Tensor& parameter(const std::string& name) const;  // throws if absent
  Tensor find_parameter(const std::string& name) const;    // undefined if absent
  std::vector<std::string> parameter_names() const;

  const MoeRunnerConfig& config() const { return config_; }
  const FusedMoEOptions& options() const { return options_; }
  MoeRunnerBackend runner_backend() const { return runner_backend_; }
  MoeA2ABackend a2a_backend() const { return a2a_backend_; }
  int64_t num_local_experts() const { return num_local_experts_; }
  int64_t intermediate_size_per_partition() const { return inter_per_partition_; }
  const std::shared_ptr<FusedMoEMethod>& quant_method() const { return quant_method_; }
  const std::shared_ptr<BaseDispatcher>& dispatcher() const { return dispatcher_; }
  /// Null until process_weights_after_loading().
  const std::shared_ptr<MoeRunner>& runner() const { return quant_method_->runner(); }
  /// Local id of a global expert on this EP rank, or −1.
  int64_t local_expert_id(int64_t global_expert_id) const;
  void set_overlap_args(std::any down, std::any meta);
  /// sglang DeepEPMoE's deprecate_flag: true when the generic FusedMoE path runs (always true
  /// for a2a other than deepep, since moecore builds no legacy path).
  bool deprecate_flag() const { return deprecate_flag_; }
  void clear_overlap_args();

 private:
  std::shared_ptr<BaseDispatcher> make_dispatcher() const;
  bool deepep_deprecate_flag() const;

  FusedMoEOptions options_;
  MoeRunnerConfig config_;
  MoeRunnerBackend runner_backend_;
  MoeA2ABackend a2a_backend_;
  int64_t num_local_experts_ = 0, inter_per_partition_ = 0;
  bool deprecate_flag_ = true;
  std::shared_ptr<FusedMoEMethod> quant_method_;
  std::shared_ptr<BaseDispatcher> dispatcher_;
  struct Param {
    Tensor tensor;
    ParamSpec spec;
  };
  std::map<std::string, Param> params_;
};

}  // namespace moecore
