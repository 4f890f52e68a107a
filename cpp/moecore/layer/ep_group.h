// ExpertParallelGroup: R rank-local FusedMoE layers over one LoopbackGroup, for running and
// testing expert parallelism in one process. Each rank owns its slice of the experts and its own
// dispatcher; every multi-rank call runs the ranks on the group's rank threads and waits for them.
// capture() gives the group's CapturedGroupForward.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "moecore/layer/capture.h"
#include "moecore/layer/fused_moe.h"

namespace moecore {

/// A group's forward captured for up to `capacity` tokens per rank: one CapturedForward per rank
/// (static bf16 buffers, the dispatcher's prepared round, the runner's prepared run), replayed
/// together on the group's persistent rank threads with no heap allocation.
class CapturedGroupForward {
 public:
  CapturedGroupForward(std::shared_ptr<LoopbackGroup> group,
                       std::vector<std::shared_ptr<CapturedForward>> ranks);
  int size() const { return static_cast<int>(ranks_.size()); }
  int64_t capacity() const { return ranks_.front()->capacity(); }
  /// Rank r's captured forward: its static buffers (replay it only through this class).
  const std::shared_ptr<CapturedForward>& rank(int r) const;
  /// One forward of every rank: rank r runs its first num_tokens[r] rows (each in [0, capacity];
  /// the rest are padding). Equals ExpertParallelGroup::forward on the real rows bit for bit.
  /// If a rank fails, the lowest-ranked original error is rethrown and the next replay starts
  /// clean. Calls from several threads take turns.
  void replay(const std::vector<int64_t>& num_tokens);

 private:
  std::shared_ptr<LoopbackGroup> group_;
  std::vector<std::shared_ptr<CapturedForward>> ranks_;
  std::function<void(int rank)> replay_rank_;  // built once: a replay allocates nothing
  const int64_t* num_tokens_ = nullptr;        // the replay in progress
  std::mutex mutex_;
};

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

  /// Captures forward (kRouterLogits) or forward_topk (kTopK) for up to `capacity` tokens per
  /// rank, as an engine captures its decode batches: DeepEP runs low-latency (AUTO resolves to
  /// it; NORMAL raises Unsupported), FlashInfer its fixed-size all-to-all.
  std::unique_ptr<CapturedGroupForward> capture(int64_t capacity, CaptureInput input);

 private:
  void check_per_rank(const char* api, size_t n) const;
  std::vector<Tensor> run(const std::function<Tensor(int rank)>& fn);

  std::shared_ptr<LoopbackGroup> group_;
  std::vector<std::shared_ptr<FusedMoE>> layers_;
};

}  // namespace moecore
