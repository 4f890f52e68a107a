// Token dispatchers (sglang token_dispatcher/base.py, standard.py). A dispatcher owns the token
// layout and communication; dispatch() makes a DispatchOutput, combine() turns the runner's
// CombineInput into the layer output [T, H].
#pragma once

#include <any>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>

#include "moecore/dispatch/transport.h"
#include "moecore/dispatch/types.h"

namespace moecore {

/// One value of a dispatcher's quant_config dict ({"dispatcher_output_dtype": "bf16", ...}).
using QuantConfigValue = std::variant<std::monostate, bool, int64_t, double, std::string, Tensor>;
using QuantConfig = std::map<std::string, QuantConfigValue>;

/// A dispatcher round prepared once for a token capacity: the capturable form of dispatch and
/// combine, as DeepEP low-latency's and FlashInfer MoeAlltoAll's fixed buffers are under a CUDA
/// graph. Everything is allocated when the round is prepared; dispatch() and combine() allocate
/// nothing and do no lookups. On an expert-parallel dispatcher both are collectives: every rank
/// of the group runs them together, in the same order.
class PreparedRound {
 public:
  virtual ~PreparedRound() = default;
  /// The static dispatch output the runner is prepared against; dispatch() rewrites its tensors.
  const DispatchOutputPtr& dispatch_output() const { return dispatch_output_; }
  /// Checks the prepared runner's combine input once and returns the static layer output
  /// [capacity, H] that combine() writes.
  virtual Tensor bind_combine(const CombineInputPtr& combine_input) = 0;
  /// Dispatches the first num_tokens rows of the round's hidden states and top-k; the rows past
  /// them are padding (ids −1), which no rank computes.
  virtual void dispatch(int64_t num_tokens) = 0;
  /// Writes the output's first num_tokens rows from the runner's combine input (rows past them
  /// are zero, or whatever the runner left there on a dispatcher with no communication).
  virtual void combine(int64_t num_tokens) = 0;

 protected:
  DispatchOutputPtr dispatch_output_;
};
using PreparedRoundPtr = std::unique_ptr<PreparedRound>;

class BaseDispatcher {
 public:
  virtual ~BaseDispatcher() = default;
  virtual DispatchOutputPtr dispatch(const Tensor& hidden_states, const TopKOutput& topk) = 0;
  virtual Tensor combine(const CombineInputPtr& combine_input) = 0;

  /// Experts this rank computes (its weights' leading dim).
  virtual int64_t num_local_experts() const = 0;
  /// This rank's local id of a global expert, or −1 when another rank owns it.
  virtual int64_t local_expert_id(int64_t global_expert_id) const = 0;
  /// The global → local id map dispatch applies to a standard top-k output (i32 [E]); undefined
  /// when dispatched ids stay global or the dispatcher builds its own layout (DeepEP, FlashInfer).
  virtual const Tensor& local_expert_mapping() const;
  /// Prepares a round over static buffers the caller keeps alive: hidden_states [capacity, H]
  /// and the top-k (contiguous i32 ids with global ids, f32 weights [capacity, k]); the round
  /// refers to this dispatcher, which must outlive it. Throws Unsupported, naming the reason,
  /// for what cannot be captured.
  virtual PreparedRoundPtr prepare_round(const Tensor& hidden_states,
                                         const StandardTopKOutput& topk);
  /// Forgets a dispatch/combine round that failed midway, so the next dispatch starts clean.
  /// Call only when no peer is inside a collective (e.g. after LoopbackGroup::run returned).
  virtual void abort_round() {}

  /// Merges keys into the quant config (sglang's set_quant_config replaces the dict; moecore
  /// replaces too, so both read the same).
  void set_quant_config(QuantConfig config) { quant_config_ = std::move(config); }
  const QuantConfig& quant_config() const { return quant_config_; }
  void set_overlap_args(std::any combine_overlap_args, std::any meta_overlap_args) {
    combine_overlap_args_ = std::move(combine_overlap_args);
    meta_overlap_args_ = std::move(meta_overlap_args);
  }
  void clear_overlap_args() {
    combine_overlap_args_.reset();
    meta_overlap_args_.reset();
  }

 protected:
  QuantConfig quant_config_;
  std::any combine_overlap_args_;
  std::any meta_overlap_args_;
};

/// StandardDispatcher (a2a "none"). With ep_size > 1 it maps global expert ids to this rank's
/// local ids: routed experts [r·L, (r+1)·L) → [0, L), the S fused shared experts (the last S
/// global ids) → [L, L+S), everything else → −1, and −1 stays −1 (rule R14). Runner backends
/// that take global ids (flashinfer_*) skip the mapping, as in sglang.
class StandardDispatcher : public BaseDispatcher {
 public:
  /// num_experts: global count including the S fused shared experts.
  StandardDispatcher(int64_t num_experts, int64_t ep_size = 1, int64_t ep_rank = 0,
                     int64_t num_fused_shared_experts = 0,
                     MoeRunnerBackend runner_backend = MoeRunnerBackend::TRITON);

  DispatchOutputPtr dispatch(const Tensor& hidden_states, const TopKOutput& topk) override;
  Tensor combine(const CombineInputPtr& combine_input) override;
  /// The dispatch output views the static buffers; dispatch() applies the id map, if any, and
  /// the output is the runner's combine input itself.
  PreparedRoundPtr prepare_round(const Tensor& hidden_states,
                                 const StandardTopKOutput& topk) override;

  /// Global → local id map, i32 [num_experts], applied by dispatch (undefined when dispatch does
  /// not map: ep_size 1, or a runner backend that takes global ids).
  const Tensor& local_expert_mapping() const override { return local_expert_mapping_; }
  /// What dispatch does to topk ids [T, k] (i32/i64) when it has a map: validates them to
  /// [-1, num_experts) and writes local ids (i32, row-major) — −1 stays −1. No allocation.
  void map_to_local_ids(const TensorView& ids, int32_t* local) const;
  /// The ownership rule holds whether or not dispatch maps ids (weights are sliced the same way
  /// either way).
  int64_t local_expert_id(int64_t global_expert_id) const override;
  int64_t num_local_experts() const override { return num_local_routed_experts_ + num_shared_; }
  int64_t ep_size() const { return ep_size_; }
  int64_t ep_rank() const { return ep_rank_; }

 private:
  int64_t num_experts_, ep_size_, ep_rank_, num_shared_, num_local_routed_experts_;
  Tensor local_expert_mapping_;
};

/// The even expert placement of the expert-parallel dispatchers: rank r owns global experts
/// [r·L, (r+1)·L) as local ids [0, L).
inline int64_t evenly_placed_local_id(int64_t global_expert_id, int64_t num_local, int64_t rank) {
  return global_expert_id / num_local == rank ? global_expert_id % num_local : -1;
}

/// The sizes every expert-parallel dispatcher checks at construction: a transport, hidden_size
/// and num_experts > 0, experts placed evenly (num_local_experts = num_experts / ranks), top_k in
/// [1, num_experts].
void check_expert_parallel_sizes(const char* api, const Transport* transport, int64_t num_experts,
                                 int64_t num_local_experts, int64_t hidden_size, int64_t top_k);

/// True for runner backends whose kernels take global expert ids (no local mapping).
bool uses_global_expert_ids(MoeRunnerBackend backend);

}  // namespace moecore
