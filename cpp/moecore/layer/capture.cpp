// CapturedForward: static buffers, routing, the dispatcher's prepared round and the runner's
// prepared run of one FusedMoE forward.
#include "moecore/layer/capture.h"

#include <algorithm>

#include "moecore/core/error.h"

namespace moecore {

CapturedForward::CapturedForward(std::shared_ptr<FusedMoE> layer, int64_t capacity,
                                 CaptureInput input, DType dtype)
    : layer_(std::move(layer)), capacity_(capacity), input_(input) {
  const char* api = "CapturedForward";
  MOECORE_CHECK(layer_ != nullptr, api, ": expected a layer, got None");
  MOECORE_CHECK(capacity >= 1, api, ": expected a capacity >= 1 tokens, got ", capacity);
  MOECORE_CHECK(layer_->runner() != nullptr, api,
                ": call process_weights_after_loading() first (it builds the runner)");
  MOECORE_CHECK_DTYPE(is_activation_dtype(dtype), api,
                      ": expected an f32, f16 or bf16 activation dtype, got ", dtype_name(dtype));
  MOECORE_CHECK_DTYPE(layer_->a2a_backend() == MoeA2ABackend::NONE || dtype == DType::kBF16, api,
                      ": the a2a backend '", to_string(layer_->a2a_backend()),
                      "' dispatches bf16 hidden states, got dtype ", dtype_name(dtype));
  const FusedMoEOptions& o = layer_->options();
  const int64_t k = o.topk_config.top_k;
  hidden_states_ = Tensor::zeros({capacity, o.hidden_size}, dtype);
  topk_ids_ = Tensor::empty({capacity, k}, DType::kI32);
  topk_weights_ = Tensor::zeros({capacity, k}, DType::kF32);
  std::fill(topk_ids_.ptr<int32_t>(), topk_ids_.ptr<int32_t>() + capacity * k, -1);
  if (input == CaptureInput::kRouterLogits) {
    const int64_t routed = o.num_experts - o.topk_config.num_fused_shared_experts;
    router_logits_ = Tensor::zeros({capacity, routed}, DType::kF32);
    routing_ = std::make_unique<PreparedRouting>(o.topk_config, router_logits_, topk_weights_,
                                                 topk_ids_);
  }
  round_ = layer_->dispatcher()->prepare_round(
      hidden_states_, StandardTopKOutput{topk_weights_, topk_ids_, router_logits_});
  prepared_ = layer_->quant_method()->prepare_apply(*layer_, round_->dispatch_output());
  output_ = round_->bind_combine(prepared_->combine_input());
}

void CapturedForward::replay(int64_t num_tokens) {
  MOECORE_CHECK_INDEX(num_tokens >= 0 && num_tokens <= capacity_,
                      "CapturedForward.replay: expected num_tokens in [0, capacity = ", capacity_,
                      "], got ", num_tokens);
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t k = topk_ids_.size(1);
  // Zero padding rows, so that nothing computed over the whole batch (fp8's dynamic
  // per-tensor scale) can see stale contents.
  zero_view(hidden_states_.view().narrow(0, num_tokens, capacity_ - num_tokens));
  if (routing_) {
    routing_->run(num_tokens);
  } else {
    std::fill(topk_ids_.ptr<int32_t>() + num_tokens * k, topk_ids_.ptr<int32_t>() + capacity_ * k,
              -1);
    std::fill(topk_weights_.ptr<float>() + num_tokens * k,
              topk_weights_.ptr<float>() + capacity_ * k, 0.0f);
  }
  round_->dispatch(num_tokens);
  prepared_->run();
  round_->combine(num_tokens);
}

}  // namespace moecore
