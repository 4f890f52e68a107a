// Capture and replay of a FusedMoE forward: the CPU analogue of an engine capturing its MoE layer
// in a CUDA graph per batch-size bucket. Capture allocates static input and output buffers, the
// routing state, the dispatcher's prepared round (dispatcher.h) and the runner's prepared run
// (prepared.h) for a token capacity; replay reads the static inputs and writes the static output
// with no heap allocation and no lookups.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>

#include "moecore/layer/fused_moe.h"

namespace moecore {

/// What a captured forward reads besides hidden_states: router logits (routing is part of the
/// replay, as when an engine captures the whole MoE block) or a ready top-k output.
enum class CaptureInput { kRouterLogits, kTopK };

class CapturedForward {
 public:
  /// Captures layer.forward (kRouterLogits) or layer.forward_topk (kTopK) for up to `capacity`
  /// tokens of activation dtype `dtype` (bf16 on an expert-parallel layer, whose dispatcher
  /// sends bf16 rows). The layer must have run process_weights_after_loading. Throws
  /// Unsupported, naming the reason, for what cannot be captured (a custom routing function in
  /// kRouterLogits mode, DeepEP normal mode, a path without a prepared run, Python-registered
  /// callables). On an expert-parallel layer (a2a deepep or flashinfer) replay is a collective:
  /// every rank's captured forward replays together (ExpertParallelGroup::capture does that).
  CapturedForward(std::shared_ptr<FusedMoE> layer, int64_t capacity, CaptureInput input,
                  DType dtype);

  int64_t capacity() const { return capacity_; }
  CaptureInput input() const { return input_; }
  /// The static buffers: fill the first num_tokens rows, then replay(num_tokens).
  const Tensor& hidden_states() const { return hidden_states_; }  // [capacity, H]
  const Tensor& router_logits() const { return router_logits_; }  // [capacity, E] f32; kRouterLogits
  const Tensor& topk_ids() const { return topk_ids_; }          // i32 [capacity, k]
  const Tensor& topk_weights() const { return topk_weights_; }  // f32 [capacity, k]
  /// [capacity, H] (or [capacity, k, H] with no_combine); rows past num_tokens are padding.
  const Tensor& output() const { return output_; }

  /// Runs the captured forward on the first num_tokens rows. Rows at or past num_tokens are
  /// padding: their hidden states are zeroed, and routing gives them ids −1
  /// (num_token_non_padded), or in kTopK mode their ids are set to −1 and weights to 0 here;
  /// they never change the real rows' outputs. The result
  /// equals layer.forward on the real rows bit for bit. Calls from several threads take turns.
  void replay(int64_t num_tokens);

 private:
  std::shared_ptr<FusedMoE> layer_;
  int64_t capacity_;
  CaptureInput input_;
  Tensor hidden_states_, router_logits_, topk_ids_, topk_weights_, output_;
  std::unique_ptr<PreparedRouting> routing_;
  PreparedRoundPtr round_;
  PreparedRunPtr prepared_;
  std::mutex mutex_;
};

}  // namespace moecore
