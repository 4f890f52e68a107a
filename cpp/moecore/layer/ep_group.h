// ExpertParallelGroup: R rank-local FusedMoE layers over one LoopbackGroup, for running and
// testing expert parallelism in one process. Each rank owns its slice of the experts and its own
// dispatcher; every multi-rank call runs the ranks on their own threads and joins them.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "moecore/layer/fused_moe.h"

namespace moecore {

class ExpertParallelGroup {
 public:
  using MethodFactory = std::function<std::shared_ptr<FusedMoEMethod>()>;
  /// options: the layer's options with a2a_backend deepep or flashinfer; ep_size, ep_rank and
  /// transport are set per rank. make_method: one fresh quant method per rank (null: unquantized).
  ExpertParallelGroup(int ranks, FusedMoEOptions options, const MethodFactory& make_method);

  int size() const { return static_cast<int>(layers_.size()); }
  FusedMoE& layer(int rank);
  const std::shared_ptr<FusedMoE>& layer_ptr(int rank) const { return layers_.at(rank); }

  /// Hands one checkpoint tensor of global expert `expert_id` to every rank's weight_loader;
  /// the owner keeps it. Returns whether some rank used it.
  bool weight_loader(const std::string& param_name, const Tensor& loaded_weight,
                     const std::string& shard_id, int64_t expert_id);
  void process_weights_after_loading();

  /// One batch: hidden_states[r] [T_r, H] and router_logits[r] [T_r, E] for every rank r
  /// (T_r may be 0) → outputs[r] [T_r, H]. is_extend_in_batch resolves DeepEP's AUTO mode.
  std::vector<Tensor> forward(const std::vector<Tensor>& hidden_states,
                              const std::vector<Tensor>& router_logits, bool is_extend_in_batch);
  /// The same with each rank's top-k output.
  std::vector<Tensor> forward_topk(const std::vector<Tensor>& hidden_states,
                                   const std::vector<TopKOutput>& topk_outputs,
                                   bool is_extend_in_batch);

 private:
  void check_per_rank(const char* api, size_t n) const;
  std::vector<Tensor> run(const std::function<Tensor(int rank)>& fn);

  std::shared_ptr<LoopbackGroup> group_;
  std::vector<std::shared_ptr<FusedMoE>> layers_;
};

}  // namespace moecore
