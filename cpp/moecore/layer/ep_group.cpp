// ExpertParallelGroup: builds the layers, fans loading out, runs the ranks on the rank threads;
// CapturedGroupForward replays the ranks' captured forwards together.
#include "moecore/layer/ep_group.h"

#include "moecore/core/error.h"
#include "moecore/dispatch/deepep.h"

namespace moecore {

ExpertParallelGroup::ExpertParallelGroup(int ranks, FusedMoEOptions options,
                                         const MethodFactory& make_method)
    : group_(LoopbackGroup::create(ranks)) {
  const MoeA2ABackend a2a = options.a2a_backend.value_or(get_moe_a2a_backend());
  MOECORE_CHECK(a2a == MoeA2ABackend::DEEPEP || a2a == MoeA2ABackend::FLASHINFER,
                "ExpertParallelGroup: expected a2a_backend deepep or flashinfer, got '",
                to_string(a2a), "'");
  options.a2a_backend = a2a;
  for (int r = 0; r < ranks; ++r) {
    FusedMoEOptions o = options;
    o.ep_size = ranks;
    o.ep_rank = r;
    o.transport = group_->transport(r);
    layers_.push_back(std::make_shared<FusedMoE>(o, make_method ? make_method() : nullptr));
  }
}

FusedMoE& ExpertParallelGroup::layer(int rank) {
  MOECORE_CHECK_INDEX(rank >= 0 && rank < size(),
                      "ExpertParallelGroup.layer: rank must be in "
                      "[0, ",
                      size(), "), got ", rank);
  return *layers_[rank];
}

bool ExpertParallelGroup::weight_loader(const std::string& param_name, const Tensor& loaded,
                                        const std::string& shard_id, int64_t expert_id) {
  bool used = false;
  for (auto& layer : layers_)
    used = layer->weight_loader(param_name, loaded, shard_id, expert_id) || used;
  return used;
}

void ExpertParallelGroup::process_weights_after_loading() {
  for (auto& layer : layers_) layer->process_weights_after_loading();
}

void ExpertParallelGroup::check_per_rank(const char* api, size_t n) const {
  MOECORE_CHECK(static_cast<int>(n) == size(), "ExpertParallelGroup.", api,
                ": expected one entry per rank (", size(), "), got ", n);
}

std::vector<Tensor> ExpertParallelGroup::run(const std::function<Tensor(int rank)>& fn) {
  std::vector<Tensor> outputs(layers_.size());
  try {
    group_->run([&](int rank) { outputs[rank] = fn(rank); });
  } catch (...) {
    for (auto& layer : layers_) layer->dispatcher()->abort_round();  // ready for the next batch
    throw;
  }
  return outputs;
}

namespace {
void set_extend(FusedMoE& layer, bool is_extend_in_batch) {
  if (auto* deepep = dynamic_cast<DeepEPDispatcher*>(layer.dispatcher().get()))
    deepep->set_is_extend_in_batch(is_extend_in_batch);
}
}  // namespace

std::vector<Tensor> ExpertParallelGroup::forward(const std::vector<Tensor>& hidden_states,
                                                 const std::vector<Tensor>& router_logits,
                                                 bool is_extend_in_batch) {
  check_per_rank("forward", hidden_states.size());
  check_per_rank("forward", router_logits.size());
  return run([&](int rank) {
    set_extend(*layers_[rank], is_extend_in_batch);
    return layers_[rank]->forward(hidden_states[rank], router_logits[rank]);
  });
}

std::vector<Tensor> ExpertParallelGroup::forward_topk(const std::vector<Tensor>& hidden_states,
                                                      const std::vector<TopKOutput>& topk_outputs,
                                                      bool is_extend_in_batch) {
  check_per_rank("forward_topk", hidden_states.size());
  check_per_rank("forward_topk", topk_outputs.size());
  return run([&](int rank) {
    set_extend(*layers_[rank], is_extend_in_batch);
    return layers_[rank]->forward_topk(hidden_states[rank], topk_outputs[rank]);
  });
}

std::unique_ptr<CapturedGroupForward> ExpertParallelGroup::capture(int64_t capacity,
                                                                   CaptureInput input) {
  std::vector<std::shared_ptr<CapturedForward>> ranks;
  for (auto& layer : layers_)
    ranks.push_back(std::make_shared<CapturedForward>(layer, capacity, input, DType::kBF16));
  return std::make_unique<CapturedGroupForward>(group_, std::move(ranks));
}

CapturedGroupForward::CapturedGroupForward(std::shared_ptr<LoopbackGroup> group,
                                           std::vector<std::shared_ptr<CapturedForward>> ranks)
    : group_(std::move(group)), ranks_(std::move(ranks)) {
  MOECORE_INTERNAL_CHECK(group_ && static_cast<int>(ranks_.size()) == group_->size(),
                         "one captured forward per rank");
  replay_rank_ = [this](int rank) { ranks_[rank]->replay(num_tokens_[rank]); };
}

const std::shared_ptr<CapturedForward>& CapturedGroupForward::rank(int r) const {
  MOECORE_CHECK_INDEX(r >= 0 && r < size(), "CapturedGroupForward.rank: rank must be in [0, ",
                      size(), "), got ", r);
  return ranks_[r];
}

void CapturedGroupForward::replay(const std::vector<int64_t>& num_tokens) {
  const char* api = "CapturedGroupForward.replay";
  MOECORE_CHECK(static_cast<int>(num_tokens.size()) == size(), api,
                ": expected one token count per rank (", size(), "), got ", num_tokens.size());
  for (int r = 0; r < size(); ++r)  // checked here, so no rank starts a round another refuses
    MOECORE_CHECK_INDEX(num_tokens[r] >= 0 && num_tokens[r] <= capacity(), api,
                        ": expected num_tokens in [0, capacity = ", capacity(), "], got ",
                        num_tokens[r], " for rank ", r);
  std::lock_guard<std::mutex> lock(mutex_);
  num_tokens_ = num_tokens.data();
  group_->run(replay_rank_);
}

}  // namespace moecore
