// DeepEPDispatcher (sglang token_dispatcher/deepep.py; a2a "deepep"): the two-phase dispatcher of
// DeepEP's normal and low-latency modes over a Transport. Owns the send/receive layouts and the
// combine arithmetic; never computes experts. One round (dispatch_a → dispatch_b → combine_a →
// combine_b) at a time, as sglang's stage state machine enforces.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "moecore/dispatch/dispatcher.h"
#include "moecore/dispatch/payload.h"
#include "moecore/dispatch/transport.h"

namespace moecore {

struct DeepEPConfig {
  int64_t num_experts = 0;        // global; rank r owns [r·L, (r+1)·L), L = num_local_experts
  int64_t num_local_experts = 0;  // num_experts / ranks (DeepEP needs an even split)
  int64_t hidden_size = 0;
  int64_t top_k = 0;
  DeepEPMode mode = DeepEPMode::AUTO;
  int64_t num_max_dispatch_tokens_per_rank = 128;  // ≤ 1024 (DeepEP's low-latency limit)
  MoeRunnerBackend runner_backend = MoeRunnerBackend::DEEP_GEMM;
  bool round_scale = false, use_ue8m0 = false;  // FP8 payload only (rule R5)
  int64_t expert_alignment = 1;  // normal mode: num_recv_tokens_per_expert rounded up to it
  /// Applied by combine where the runner's single-rank post-permute applies it (deep_gemm).
  std::optional<float> routed_scaling_factor;
};

/// Low-latency capacity overflow: raised before anything is sent. Python: ValueError.
class DispatchCapacityError : public InvalidArgument {
  using InvalidArgument::InvalidArgument;
};

class DeepEPDispatcher : public BaseDispatcher {
 public:
  enum class Stage { kInitial, kAfterDispatchA, kAfterDispatchB, kAfterCombineA };

  DeepEPDispatcher(TransportPtr transport, DeepEPConfig config);

  /// dispatch_a then dispatch_b, resolving AUTO with is_extend_in_batch().
  DispatchOutputPtr dispatch(const Tensor& hidden_states, const TopKOutput& topk) override;
  /// combine_a then combine_b.
  Tensor combine(const CombineInputPtr& combine_input) override;
  /// A low-latency round over fixed buffers (capacity ≤ num_max_dispatch_tokens_per_rank), with
  /// the eager round's layouts, so it gives the same bits. Normal mode cannot be captured (its
  /// receive layout follows each batch; sglang runs it eagerly): AUTO resolves to low-latency
  /// here, as for the decode batches an engine captures, and NORMAL raises Unsupported.
  PreparedRoundPtr prepare_round(const Tensor& hidden_states,
                                 const StandardTopKOutput& topk) override;

  /// hidden_states bf16 [T_local, H]; topk ids [T_local, k] global in [−1, E), f32 weights.
  /// Validates, resolves the mode and payload, quantizes and posts the sends.
  void dispatch_a(const Tensor& hidden_states, const TopKOutput& topk);
  /// Receives: a DeepEPNormalDispatchOutput or DeepEPLLDispatchOutput (see types.h).
  DispatchOutputPtr dispatch_b();
  /// Takes the runner's combine input of the same mode (unweighted expert outputs, bf16) and
  /// sends each row back to its token's home rank.
  void combine_a(const CombineInputPtr& combine_input);
  /// out bf16 [T_local, H]: for each token, the valid slots j in increasing order reduced with
  /// the runner's single-rank arithmetic, so an EP run equals a single-rank run bit for bit:
  ///   deep_gemm: post_reorder's (bf16(w_j)·o_j rounded, bf16 accumulation, then × rsf);
  ///   others:    DeepEP's combine, round(Σ_j w_j·o_j) in fp32 (rsf is never applied).
  /// Ids −1 contribute nothing; a token with no valid slot gets zeros.
  Tensor combine_b();

  /// sglang's get_is_extend_in_batch(): AUTO resolves to NORMAL when true, else LOW_LATENCY.
  void set_is_extend_in_batch(bool is_extend) { is_extend_in_batch_ = is_extend; }
  bool is_extend_in_batch() const { return is_extend_in_batch_; }
  /// The payload the next dispatch sends (spec §2.4 minus server args/env): quant_config
  /// input_global_scale → NVFP4; quant_config dispatcher_output_dtype → that; runner
  /// flashinfer_cutedsl or cutlass → BF16; otherwise FP8.
  DispatchPayload resolve_payload() const;

  void abort_round() override;
  Stage stage() const { return stage_; }
  const DeepEPConfig& config() const { return config_; }
  const TransportPtr& transport() const { return transport_; }
  int64_t num_local_experts() const override { return config_.num_local_experts; }
  int64_t local_expert_id(int64_t global_expert_id) const override {
    return evenly_placed_local_id(global_expert_id, config_.num_local_experts, transport_->rank());
  }
  /// num_max_dispatch_tokens_per_rank · ranks: the rows per expert of the low-latency layout.
  int64_t max_rows_per_expert() const;

 private:
  void expect_stage(Stage want, const char* call) const;
  void post_low_latency(const PayloadRows& rows, const Tensor& ids);
  void post_normal(const PayloadRows& rows, const StandardTopKOutput& topk);
  DispatchOutputPtr receive_low_latency();
  DispatchOutputPtr receive_normal();

  TransportPtr transport_;
  DeepEPConfig config_;
  Stage stage_ = Stage::kInitial;
  bool is_extend_in_batch_ = false;

  // The round in flight (sglang's handle).
  DeepEPMode round_mode_ = DeepEPMode::NORMAL;
  StandardTopKOutput round_topk_;               // this rank's routing, contiguous i32 / f32
  PayloadRows round_payload_;                   // layout of the rows sent
  std::vector<std::vector<uint8_t>> pending_;   // bytes posted by the last *_a call, per peer
  std::vector<std::vector<int64_t>> sent_;      // [dest]: slots t·k + j, in send order (LL), or
                                                // tokens t (normal)
  std::vector<std::vector<int64_t>> received_;  // [src]: receive rows, in arrival order
  Tensor recv_topk_ids_;                        // normal: local ids of the received rows
};

const char* deepep_stage_name(DeepEPDispatcher::Stage stage);

}  // namespace moecore
