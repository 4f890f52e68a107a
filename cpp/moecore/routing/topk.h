// Routing: select_experts and the top-k output types (sglang python/sglang/srt/layers/moe/topk.py).
// Scores are computed in fp32; ties are broken by the lower expert index; weights are fp32 and
// ids int32. Padded rows (at or past num_token_non_padded) get ids -1 and weight 0.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "moecore/core/enums.h"
#include "moecore/core/tensor.h"

namespace moecore {

/// StandardTopKOutput(topk_weights f32 [T, k], topk_ids i32 [T, k], router_logits [T, E]).
struct StandardTopKOutput {
  Tensor topk_weights;
  Tensor topk_ids;
  Tensor router_logits;  // may be undefined
};

/// A user routing function: (hidden_states, router_logits, top_k, renormalize) →
/// (topk_weights f32 [T, k], topk_ids i32 [T, k]). The Python binding wraps a callable in one.
using CustomRoutingFunction = std::function<std::pair<Tensor, Tensor>(
    const Tensor& hidden_states, const Tensor& router_logits, int top_k, bool renormalize)>;

/// sglang's TopKConfig. top_k counts the fused shared-expert slots too (sglang adds them).
struct TopKConfig {
  int top_k = 0;
  bool use_grouped_topk = false;
  std::optional<int> topk_group;
  std::optional<int> num_expert_group;
  bool renormalize = true;
  int num_fused_shared_experts = 0;
  CustomRoutingFunction custom_routing_function;  // empty: none
  Tensor correction_bias;                         // f32 [E]; undefined: none
  bool torch_native = false;
  std::optional<float> routed_scaling_factor;
  bool apply_routed_scaling_factor_on_output = false;
  std::optional<float> fused_shared_experts_scaling_factor;
  ScoringFunc scoring_func = ScoringFunc::SOFTMAX;
  /// Requested TopKOutput format; nullopt lets the consumer choose (moecore emits STANDARD).
  std::optional<TopKOutputFormat> output_format;
};

/// Runs routing for router_logits [T, E] (f32, f16 or bf16; last dim contiguous, rows may be
/// strided). Returns new contiguous topk_weights f32 [T, top_k] and topk_ids i32 [T, top_k];
/// router_logits is the input itself. Rows are routed in parallel on the moecore pool; the
/// result does not depend on the thread count or on the other rows of the batch.
///
/// Path (as sglang's select_experts chooses it):
///  * custom_routing_function set: its (weights, ids) are validated and copied.
///  * use_grouped_topk without correction_bias: grouped_topk (softmax; group score = max).
///  * use_grouped_topk with correction_bias: biased_grouped_topk (sigmoid; group score = sum of
///    the top-2 biased scores). Like sglang, the grouped paths do not consult scoring_func.
///  * otherwise scoring_func (softmax | sigmoid | sqrtsoftplus) over all E experts.
/// A correction_bias, where given, only chooses experts; weights are the unbiased scores.
/// Output columns are in descending order of the selection score, ties to the lower expert id.
/// The last num_fused_shared_experts (S) columns hold shared experts: column j has id E + j and
/// weight (sum of routed weights) / routed_scaling_factor before renormalization (sglang picks
/// one of E..E+S-1 at random; moecore's rule is fixed and equal to sglang's for S = 1).
/// renormalize divides every column by the sum of the routed ones (skipped when that sum is 0);
/// apply_routed_scaling_factor_on_output then multiplies by routed_scaling_factor (only when
/// renormalize, as in sglang); fused_shared_experts_scaling_factor finally multiplies the
/// shared columns.
///
/// hidden_states is only checked (rows == T) and passed on to a custom routing function; it may
/// be undefined. num_token_non_padded: rows at or past it get ids -1 and weight 0 and are not
/// read. Throws before routing any row: InvalidArgument for shapes, config values and
/// non-finite logits in the non-padded rows; DTypeError for dtypes; OutOfRange for custom ids
/// outside [0, E + S); Unsupported for apply_routed_scaling_factor_on_output with a custom
/// routing function.
StandardTopKOutput select_experts(const Tensor& hidden_states, const Tensor& router_logits,
                                  const TopKConfig& config,
                                  std::optional<int64_t> num_token_non_padded = std::nullopt);

/// select_experts prepared once for router_logits' shape (capture): run(n) routes the current
/// contents of router_logits into the given contiguous topk_weights f32 / topk_ids i32 [T, k]
/// exactly as select_experts(…, num_token_non_padded = n) would, without allocating. The
/// tensors must stay alive. Unsupported for a custom routing function.
class PreparedRouting {
 public:
  PreparedRouting(const TopKConfig& config, const Tensor& router_logits,
                  const Tensor& topk_weights, const Tensor& topk_ids);
  ~PreparedRouting();
  void run(int64_t num_token_non_padded);

 private:
  struct State;
  Tensor logits_, topk_weights_, topk_ids_;  // kept alive
  std::unique_ptr<State> state_;
};

/// Validates a config against E routed experts: top_k >= 1, num_fused_shared_experts >= 0,
/// routed top-k (top_k - S) in [1, E]; with use_grouped_topk: num_expert_group and topk_group
/// set, num_expert_group divides E, 1 <= topk_group <= num_expert_group, routed top-k <=
/// topk_group * E / num_expert_group (and >= 2 experts per group when biased); correction_bias
/// f32 [E] and finite; routed_scaling_factor finite and > 0, required by
/// apply_routed_scaling_factor_on_output; fused_shared_experts_scaling_factor finite.
void validate_topk_config(const TopKConfig& config, int64_t num_experts);

}  // namespace moecore
