// FlashinferDispatcher (sglang token_dispatcher/flashinfer.py; a2a "flashinfer"): FlashInfer's
// MoeAlltoAll over a Transport. Each token goes once to every rank owning one of its experts,
// with its global ids; the runner (global-id backends, flashinfer_*) computes the rank's partial
// sum per received token and combine adds the partials at the token's home rank. moecore always
// takes the all-to-all path (sglang's extend-batch all-gather fallback is not modelled).
#pragma once

#include <cstdint>
#include <vector>

#include "moecore/dispatch/dispatcher.h"
#include "moecore/dispatch/payload.h"
#include "moecore/dispatch/transport.h"

namespace moecore {

struct FlashinferDispatchConfig {
  int64_t num_experts = 0;  // global; rank r owns [r·L, (r+1)·L)
  int64_t num_local_experts = 0;
  int64_t hidden_size = 0;
  int64_t top_k = 0;
  MoeRunnerBackend runner_backend = MoeRunnerBackend::FLASHINFER_CUTLASS;
};

class FlashinferDispatcher : public BaseDispatcher {
 public:
  FlashinferDispatcher(TransportPtr transport, FlashinferDispatchConfig config);

  /// hidden_states bf16 [T_local, H], ids [T_local, k] global in [−1, E). Returns a
  /// FlashinferDispatchOutput of R·M rows, M = the largest T_local of any rank (MoeAlltoAll's
  /// runtime_max_tokens_per_rank): rows [s·M, s·M + n_s) are the n_s tokens from rank s, in
  /// token order, with their global ids and weights; the other rows are invalid tokens (zero
  /// hidden, weights 0, every id = invalid_expert_id()). Payload bf16, or NVFP4 (packed e2m1
  /// [.., H/2] + linear e4m3 scales [.., H/16]) when quant_config input_global_scale is set.
  DispatchOutputPtr dispatch(const Tensor& hidden_states, const TopKOutput& topk) override;
  /// FlashinferCombineInput bf16 [R·M, H]: per received row, this rank's partial output
  /// (weighted sum over its own experts). Returns bf16 [T_local, H] =
  /// round(Σ_r partial_r) in fp32 over the ranks that received the token, in rank order.
  Tensor combine(const CombineInputPtr& combine_input) override;
  /// A round over fixed buffers of R·capacity rows (MoeAlltoAll's max_num_tokens per rank in
  /// place of the batch's largest T_local, which changes no row's result).
  PreparedRoundPtr prepare_round(const Tensor& hidden_states,
                                 const StandardTopKOutput& topk) override;

  /// sglang's invalid-token expert id: −1 for deep_gemm / trtllm runners, else num_experts.
  int32_t invalid_expert_id() const;
  DispatchPayload resolve_payload() const;
  void abort_round() override { dispatched_ = false; }
  const TransportPtr& transport() const { return transport_; }
  int64_t num_local_experts() const override { return config_.num_local_experts; }
  int64_t local_expert_id(int64_t global_expert_id) const override {
    return evenly_placed_local_id(global_expert_id, config_.num_local_experts, transport_->rank());
  }

 private:
  TransportPtr transport_;
  FlashinferDispatchConfig config_;
  bool dispatched_ = false;
  int64_t num_tokens_ = 0, rows_per_rank_ = 0;
  std::vector<std::vector<int64_t>> sent_;  // [dest]: tokens, in send order
  std::vector<int64_t> received_;           // [src]: tokens received from src
};

}  // namespace moecore
