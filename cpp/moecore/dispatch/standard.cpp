// StandardDispatcher and the top-k output helpers.
#include <algorithm>

#include "moecore/core/error.h"
#include "moecore/dispatch/dispatcher.h"

namespace moecore {

TopKOutputFormat topk_output_format(const TopKOutput& topk) {
  return std::holds_alternative<StandardTopKOutput>(topk) ? TopKOutputFormat::STANDARD
                                                          : TopKOutputFormat::BYPASSED;
}

StandardTopKOutput to_standard(const TopKOutput& topk) {
  if (const auto* standard = std::get_if<StandardTopKOutput>(&topk)) return *standard;
  return std::get<BypassedTopKOutput>(topk).to_standard();
}

const Tensor& BaseDispatcher::local_expert_mapping() const {
  static const Tensor kNone;
  return kNone;
}

PreparedRoundPtr BaseDispatcher::prepare_round(const Tensor&, const StandardTopKOutput&) {
  MOECORE_UNSUPPORTED("this dispatcher has no prepared round, so it cannot be captured");
}

void check_expert_parallel_sizes(const char* api, const Transport* transport, int64_t num_experts,
                                 int64_t num_local_experts, int64_t hidden_size, int64_t top_k) {
  MOECORE_CHECK(transport != nullptr, api, ": a transport is required");
  const int64_t ranks = transport->size();
  MOECORE_CHECK(hidden_size > 0 && num_experts > 0, api,
                ": expected hidden_size and num_experts > 0, got ", hidden_size, " and ",
                num_experts);
  MOECORE_CHECK(num_experts % ranks == 0 && num_local_experts == num_experts / ranks, api,
                ": experts are placed evenly (num_experts / ranks on every rank), so num_experts (",
                num_experts, ") must divide evenly over ", ranks,
                " ranks and num_local_experts must be the quotient, got ", num_local_experts);
  MOECORE_CHECK(top_k >= 1 && top_k <= num_experts, api, ": expected top_k in [1, ", num_experts,
                "], got ", top_k);
}

bool uses_global_expert_ids(MoeRunnerBackend b) {
  switch (b) {
    case MoeRunnerBackend::FLASHINFER_CUTLASS:
    case MoeRunnerBackend::FLASHINFER_CUTEDSL:
    case MoeRunnerBackend::FLASHINFER_TRTLLM:
    case MoeRunnerBackend::FLASHINFER_TRTLLM_ROUTED:
    case MoeRunnerBackend::FLASHINFER_MXFP4:
    case MoeRunnerBackend::HPC_OPS:
    case MoeRunnerBackend::FLASHINFER_MEGAMOE:
    case MoeRunnerBackend::EXPERIMENTAL_SGL_TRTLLM:
      return true;
    default:
      return false;
  }
}

StandardDispatcher::StandardDispatcher(int64_t num_experts, int64_t ep_size, int64_t ep_rank,
                                       int64_t num_fused_shared_experts,
                                       MoeRunnerBackend runner_backend)
    : num_experts_(num_experts),
      ep_size_(ep_size),
      ep_rank_(ep_rank),
      num_shared_(num_fused_shared_experts) {
  const char* api = "StandardDispatcher";
  MOECORE_CHECK(ep_size >= 1, api, ": expected ep_size >= 1, got ", ep_size);
  MOECORE_CHECK_INDEX(ep_rank >= 0 && ep_rank < ep_size, api, ": expected ep_rank in [0, ",
                      ep_size, "), got ", ep_rank);
  MOECORE_CHECK(num_fused_shared_experts >= 0 && num_experts > num_fused_shared_experts, api,
                ": expected num_experts > num_fused_shared_experts >= 0, got ", num_experts,
                " and ", num_fused_shared_experts);
  const int64_t routed = num_experts - num_fused_shared_experts;
  MOECORE_CHECK(routed % ep_size == 0, api, ": routed experts (", routed,
                ") must divide evenly over ep_size ", ep_size);
  num_local_routed_experts_ = routed / ep_size;
  if (ep_size == 1 || uses_global_expert_ids(runner_backend)) return;
  local_expert_mapping_ = Tensor::empty({num_experts}, DType::kI32);
  for (int64_t e = 0; e < num_experts; ++e)
    local_expert_mapping_.ptr<int32_t>()[e] = static_cast<int32_t>(local_expert_id(e));
}

int64_t StandardDispatcher::local_expert_id(int64_t global_expert_id) const {
  const int64_t routed = num_experts_ - num_shared_;
  if (global_expert_id >= routed) return num_local_routed_experts_ + (global_expert_id - routed);
  const int64_t start = ep_rank_ * num_local_routed_experts_;
  const bool mine = global_expert_id >= start && global_expert_id < start + num_local_routed_experts_;
  return mine ? global_expert_id - start : -1;
}

DispatchOutputPtr StandardDispatcher::dispatch(const Tensor& hidden_states,
                                               const TopKOutput& topk) {
  auto out = std::make_shared<StandardDispatchOutput>();
  out->hidden_states = hidden_states;
  if (!local_expert_mapping_.defined()) {
    out->topk_output = topk;
    return out;
  }
  StandardTopKOutput standard = to_standard(topk);
  const Tensor& ids = standard.topk_ids;
  MOECORE_CHECK(ids.defined() && ids.ndim() == 2, "StandardDispatcher.dispatch: expected topk_ids "
                "[T, k], got ", ids.describe());
  MOECORE_CHECK_DTYPE(ids.dtype() == DType::kI32 || ids.dtype() == DType::kI64,
                      "StandardDispatcher.dispatch: topk_ids must be int32 or int64, got ",
                      ids.describe());
  Tensor local = Tensor::empty({ids.size(0), ids.size(1)}, DType::kI32);
  map_to_local_ids(ids.view(), local.ptr<int32_t>());
  standard.topk_ids = local;
  out->topk_output = standard;
  return out;
}

void StandardDispatcher::map_to_local_ids(const TensorView& ids, int32_t* local) const {
  const int64_t rows = ids.shape[0], cols = ids.shape[1];
  auto read = [&](int64_t t, int64_t j) -> int64_t {
    const int64_t off = t * ids.strides[0] + j * ids.strides[1];
    return ids.dtype == DType::kI32 ? ids.ptr<int32_t>()[off] : ids.ptr<int64_t>()[off];
  };
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t e = read(t, j);
      MOECORE_CHECK_INDEX(e >= -1 && e < num_experts_, "StandardDispatcher.dispatch: topk_ids "
                          "must be in [-1, ", num_experts_, "), got ", e, " at [", t, ", ", j, "]");
    }
  const int32_t* map = local_expert_mapping_.ptr<int32_t>();
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t e = read(t, j);
      local[t * cols + j] = e < 0 ? -1 : map[e];  // R14: −1 stays −1
    }
}

namespace {

/// a2a none: no communication. The dispatch output views the static buffers (with local ids
/// in a buffer of their own when the dispatcher maps ids), and the layer output is the runner's
/// combine input.
class StandardRound : public PreparedRound {
 public:
  StandardRound(const StandardDispatcher& dispatcher, const Tensor& hidden_states,
                const StandardTopKOutput& topk)
      : dispatcher_(dispatcher), global_ids_(topk.topk_ids) {
    auto out = std::make_shared<StandardDispatchOutput>();
    out->hidden_states = hidden_states;
    StandardTopKOutput dispatched = topk;
    if (dispatcher.local_expert_mapping().defined()) {
      local_ids_ = Tensor::empty({global_ids_.size(0), global_ids_.size(1)}, DType::kI32);
      std::fill(local_ids_.ptr<int32_t>(), local_ids_.ptr<int32_t>() + local_ids_.numel(), -1);
      dispatched.topk_ids = local_ids_;
    }
    out->topk_output = dispatched;
    dispatch_output_ = out;
  }
  Tensor bind_combine(const CombineInputPtr& combine_input) override {
    auto* in = dynamic_cast<const StandardCombineInput*>(combine_input.get());
    MOECORE_CHECK_DTYPE(in != nullptr,
                        "StandardDispatcher.combine: expected a StandardCombineInput");
    return in->hidden_states;
  }
  void dispatch(int64_t) override {
    if (local_ids_.defined())
      dispatcher_.map_to_local_ids(global_ids_.view(), local_ids_.ptr<int32_t>());
  }
  void combine(int64_t) override {}

 private:
  const StandardDispatcher& dispatcher_;
  Tensor global_ids_, local_ids_;
};

}  // namespace

PreparedRoundPtr StandardDispatcher::prepare_round(const Tensor& hidden_states,
                                                   const StandardTopKOutput& topk) {
  return std::make_unique<StandardRound>(*this, hidden_states, topk);
}

Tensor StandardDispatcher::combine(const CombineInputPtr& combine_input) {
  auto* in = dynamic_cast<const StandardCombineInput*>(combine_input.get());
  MOECORE_CHECK_DTYPE(in != nullptr, "StandardDispatcher.combine: expected a StandardCombineInput");
  return in->hidden_states;
}

}  // namespace moecore
