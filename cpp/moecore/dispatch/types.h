// Dispatch outputs and combine inputs (sglang token_dispatcher/base.py, standard.py). A
// dispatcher produces a DispatchOutput; the runner turns it into a CombineInput; the dispatcher's
// combine turns that into the layer output. Objects are shared so Python can hold them.
#pragma once

#include <memory>
#include <optional>
#include <variant>
#include <vector>

#include "moecore/core/enums.h"
#include "moecore/core/tensor.h"
#include "moecore/routing/topk.h"

namespace moecore {

/// sglang's BypassedTopKOutput: routing deferred to the consumer; to_standard() runs it.
struct BypassedTopKOutput {
  Tensor hidden_states;
  Tensor router_logits;
  TopKConfig topk_config;
  std::optional<int64_t> num_token_non_padded;
  StandardTopKOutput to_standard() const {
    return select_experts(hidden_states, router_logits, topk_config, num_token_non_padded);
  }
};

using TopKOutput = std::variant<StandardTopKOutput, BypassedTopKOutput>;
TopKOutputFormat topk_output_format(const TopKOutput& topk);
/// The standard form: itself, or a bypassed output materialised with to_standard() (rule R8).
StandardTopKOutput to_standard(const TopKOutput& topk);

class DispatchOutput {
 public:
  virtual ~DispatchOutput() = default;
  virtual DispatchOutputFormat format() const = 0;
};
using DispatchOutputPtr = std::shared_ptr<DispatchOutput>;

class CombineInput {
 public:
  virtual ~CombineInput() = default;
  virtual CombineInputFormat format() const = 0;
};
using CombineInputPtr = std::shared_ptr<CombineInput>;

/// StandardDispatchOutput(hidden_states [T, H], hidden_states_scale (None unless the dispatcher
/// quantized), topk_output, hidden_states_pre_quant).
struct StandardDispatchOutput : DispatchOutput {
  Tensor hidden_states;
  Tensor hidden_states_scale;
  TopKOutput topk_output;
  Tensor hidden_states_pre_quant;
  DispatchOutputFormat format() const override { return DispatchOutputFormat::STANDARD; }
};

/// DeepEPNormalDispatchOutput: the tokens this rank received, each once, ordered by source rank
/// then source token index. hidden_states [N_recv, H] (bf16, or e4m3 with hidden_states_scale
/// f32 [N_recv, H/128], or packed e2m1 u8 [N_recv, H/2] with e4m3 [N_recv, H/16]); topk_ids i32 [N_recv, k] as this rank's local expert ids (−1 for
/// experts other ranks own); topk_weights f32 [N_recv, k]; num_recv_tokens_per_expert[e] =
/// (token, slot) pairs for local expert e, rounded up to the dispatcher's expert alignment.
struct DeepEPNormalDispatchOutput : DispatchOutput {
  Tensor hidden_states;
  Tensor hidden_states_scale;
  Tensor topk_ids;
  Tensor topk_weights;
  std::vector<int64_t> num_recv_tokens_per_expert;
  DispatchOutputFormat format() const override { return DispatchOutputFormat::DEEPEP_NORMAL; }
};

/// DeepEPLLDispatchOutput: the masked per-expert layout. hidden_states [E_local, M_cap, H]
/// (bf16; e4m3 with hidden_states_scale f32 [E_local, M_cap, H/128]; or packed e2m1 u8
/// [E_local, M_cap, H/2] with e4m3 scales [E_local, M_cap, H/16]); only the first masked_m[e]
/// rows of expert e are valid. topk_ids / topk_weights are this rank's own [T_local, k] routing
/// (global ids), which combine needs; masked_m i32 [E_local]; expected_m as DeepEP computes it.
struct DeepEPLLDispatchOutput : DispatchOutput {
  Tensor hidden_states;
  Tensor hidden_states_scale;
  Tensor topk_ids;
  Tensor topk_weights;
  Tensor masked_m;
  int64_t expected_m = 0;
  DispatchOutputFormat format() const override { return DispatchOutputFormat::DEEPEP_LL; }
};

/// FlashinferDispatchOutput(hidden_states, hidden_states_scale, topk_output, moe_output,
/// output_dtype): hidden bf16, or packed NVFP4 [T, H/2] with linear e4m3 scales [T, H/16] when
/// the dispatcher quantized; moe_output, when defined, is where a fused func writes its [T, H]
/// result. From FlashinferDispatcher, T = R·M rows (M = the largest per-rank token count):
/// rank s's tokens that route here fill rows [s·M, s·M + n_s) with their GLOBAL ids and
/// weights; other rows are invalid tokens (zero hidden, weights 0, ids = −1 for deep_gemm /
/// trtllm runners, else num_experts). The runner sums only this rank's experts per row.
struct FlashinferDispatchOutput : DispatchOutput {
  Tensor hidden_states;
  Tensor hidden_states_scale;
  TopKOutput topk_output;
  Tensor moe_output;
  std::optional<DType> output_dtype;
  DispatchOutputFormat format() const override { return DispatchOutputFormat::FLASHINFER; }
};

/// StandardCombineInput(hidden_states [T, H], or [T, k, H] with no_combine).
struct StandardCombineInput : CombineInput {
  Tensor hidden_states;
  explicit StandardCombineInput(Tensor h = {}) : hidden_states(std::move(h)) {}
  CombineInputFormat format() const override { return CombineInputFormat::STANDARD; }
};

/// DeepEPNormalCombineInput: the post-permute's per-slot expert outputs for the received tokens,
/// [N_recv, k, H] (unweighted, rows of non-local slots unused), with the received ids and
/// weights. moecore weights and sums slots at the token's home rank in slot order, so the
/// result does not depend on how experts are spread over ranks (DeepEP pre-sums per rank).
struct DeepEPNormalCombineInput : CombineInput {
  Tensor hidden_states, topk_ids, topk_weights;
  CombineInputFormat format() const override { return CombineInputFormat::DEEPEP_NORMAL; }
};

/// DeepEPLLCombineInput: the expert outputs in the masked layout [E_local, M_cap, H]
/// (unweighted) with the rank's own routing; combine weights and sums them per token.
struct DeepEPLLCombineInput : CombineInput {
  Tensor hidden_states, topk_ids, topk_weights;
  CombineInputFormat format() const override { return CombineInputFormat::DEEPEP_LL; }
};

/// FlashinferCombineInput(hidden_states [T, H]): per dispatched row, the weighted sum over the
/// experts this rank owns (FlashinferDispatcher adds the ranks' partial sums per token).
struct FlashinferCombineInput : CombineInput {
  Tensor hidden_states;
  explicit FlashinferCombineInput(Tensor h = {}) : hidden_states(std::move(h)) {}
  CombineInputFormat format() const override { return CombineInputFormat::FLASHINFER; }
};

}  // namespace moecore
