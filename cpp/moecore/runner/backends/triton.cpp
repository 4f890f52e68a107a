// Runner backend "triton" (sglang moe_runner/triton.py + fused_moe_triton), unquantized.
// Registers: runner core TRITON, fused func (none, triton), pre-permute (standard, triton),
// post-permute (triton, standard). The fused func runs the same three steps without lookups.
//
// Numeric contract (spec §7.1): GEMM1 accumulates in fp32, adds b13, multiplies the routed
// weight when apply_router_weight_on_input, rounds to the activation dtype; the activation runs
// in fp32 and rounds once; GEMM2 accumulates in fp32, adds b2, multiplies the routed weight
// (unless applied on input) and rounds each (token, slot) row; the top-k sum is fp32 in slot
// order, times routed_scaling_factor, rounded once. With top_k == 1 the same path applies, so
// out = round(rsf · round(w · expert_out)) — sglang's uninitialised-buffer hazard (R16) cannot
// occur. no_combine returns the per-slot rows [T, k, H] (weighted, rsf not applied, as sglang).
// Slots with id −1 contribute nothing. inplace writes the output into hidden_states.
#include <vector>

#include "moecore/core/error.h"
#include "moecore/core/thread_pool.h"
#include "moecore/kernels/convert.h"
#include "moecore/runner/expert_compute.h"
#include "moecore/runner/registry.h"

namespace moecore {
namespace {

constexpr int64_t kBlockM = 16;  // rows per block of the sorted layout (BLOCK_SIZE_M)

/// TritonRunnerInput (hidden_states, topk_weights, topk_ids, sorted_token_ids, expert_ids,
/// num_tokens_post_padded).
struct TritonRunnerInput : RunnerInput {
  Tensor hidden_states, topk_weights, topk_ids, sorted_token_ids, expert_ids;
  int64_t num_tokens_post_padded = 0;
  MoeRunnerBackend runner_backend() const override { return MoeRunnerBackend::TRITON; }
};

/// TritonRunnerOutput(hidden_states): the per-slot expert outputs [T, k, H].
struct TritonRunnerOutput : RunnerOutput {
  Tensor hidden_states;
  MoeRunnerBackend runner_backend() const override { return MoeRunnerBackend::TRITON; }
};

const TritonMoeQuantInfo& as_triton_info(const QuantInfoPtr& q) {
  auto* info = dynamic_cast<const TritonMoeQuantInfo*>(q.get());
  MOECORE_CHECK_DTYPE(info != nullptr, "MoeRunner(triton): expected TritonMoeQuantInfo, got ",
                      q->name());
  if (info->is_quantized())
    MOECORE_UNSUPPORTED("MoeRunner(triton): quantized Triton paths (fp8/int8/int4 flags) are not "
                        "built yet; only the unquantized path runs");
  return *info;
}

ExpertWeights weights_of(const TritonMoeQuantInfo& q, const MoeRunnerConfig& config) {
  return check_expert_weights("MoeRunner(triton)", q.w13_weight, q.w2_weight, q.b13, q.b2,
                              config.is_gated);
}

const StandardDispatchOutput& as_standard(const DispatchOutputPtr& d) {
  auto* out = dynamic_cast<const StandardDispatchOutput*>(d.get());
  MOECORE_CHECK_DTYPE(out != nullptr, "MoeRunner(triton): expected a StandardDispatchOutput");
  return *out;
}

RunnerInputPtr pre_permute_standard_to_triton(const DispatchOutputPtr& dispatch,
                                              const QuantInfoPtr& quant_info,
                                              const MoeRunnerConfig& config,
                                              RunningState& state) {
  const StandardDispatchOutput& d = as_standard(dispatch);
  const ExpertWeights w = weights_of(as_triton_info(quant_info), config);
  StandardTopKOutput topk = to_standard(d.topk_output);
  const RoutedTokens tokens = check_routed_tokens("MoeRunner(triton)", d.hidden_states, topk, w);
  MOECORE_CHECK(!config.apply_router_weight_on_input || tokens.top_k == 1,
                "Only support topk=1 when `apply_router_weight_on_input` is True");
  if (config.inplace && !config.no_combine)
    MOECORE_CHECK(d.hidden_states.view().writable, "MoeRunner(triton): inplace=True writes the "
                  "output into hidden_states, which is read-only");
  BlockLayout layout = align_block_size(tokens, w.num_experts, kBlockM);
  auto input = std::make_shared<TritonRunnerInput>();
  input->hidden_states = d.hidden_states;
  input->topk_weights = topk.topk_weights;
  input->topk_ids = topk.topk_ids;
  input->sorted_token_ids = layout.sorted_token_ids;
  input->expert_ids = layout.expert_ids;
  input->num_tokens_post_padded = layout.num_tokens_post_padded;
  state.backend = input;  // the post-permute needs the routing and the output buffer
  return input;
}

class TritonRunnerCore : public RunnerCore {
 public:
  explicit TritonRunnerCore(const MoeRunnerConfig& config)
      : RunnerCore(config),
        spec_(activation_spec(config, "MoeRunner(triton)")),
        gemm_(gemm_kernels(config.isa_level.value_or(IsaLevel::kScalar)).rows_times_wt) {}

  MoeRunnerBackend runner_backend() const override { return MoeRunnerBackend::TRITON; }

  RunnerOutputPtr run(const RunnerInputPtr& runner_input, const QuantInfoPtr& quant_info,
                      RunningState&) override {
    auto* in = dynamic_cast<const TritonRunnerInput*>(runner_input.get());
    MOECORE_CHECK_DTYPE(in != nullptr, "TritonRunnerCore.run: expected a TritonRunnerInput");
    const ExpertWeights w = weights_of(as_triton_info(quant_info), config_);
    const RoutedTokens tokens = check_routed_tokens(
        "TritonRunnerCore.run", in->hidden_states,
        StandardTopKOutput{in->topk_weights, in->topk_ids, {}}, w);
    auto out = std::make_shared<TritonRunnerOutput>();
    out->hidden_states = Tensor::zeros({tokens.num_tokens, tokens.top_k, w.hidden}, w.dtype);
    if (tokens.num_tokens == 0) return out;  // R9: no kernel for empty input

    const ExpertMlp mlp = dense_expert_mlp(w, spec_, gemm_);
    const RowScaleAt scale_at =
        config_.apply_router_weight_on_input ? RowScaleAt::kGemm1 : RowScaleAt::kGemm2;
    const int32_t* sorted = in->sorted_token_ids.ptr<int32_t>();
    const int32_t* experts = in->expert_ids.ptr<int32_t>();
    const int64_t num_blocks = in->num_tokens_post_padded / kBlockM;
    const int64_t sentinel = tokens.num_tokens * tokens.top_k;
    const TensorView slots = out->hidden_states.view();
    parallel_for(num_blocks, [&](int64_t begin, int64_t end) {
      std::vector<float> a(kBlockM * w.hidden), y(kBlockM * w.hidden), scale(kBlockM);
      std::vector<int64_t> slot(kBlockM);
      for (int64_t b = begin; b < end; ++b) {
        int64_t m = 0;
        for (int64_t r = 0; r < kBlockM; ++r) {
          const int64_t s = sorted[b * kBlockM + r];
          if (s >= sentinel) continue;
          slot[m] = s;
          scale[m] = tokens.weight(s / tokens.top_k, s % tokens.top_k);
          load_f32(tokens.x.at({s / tokens.top_k, 0}), tokens.x.dtype, w.hidden,
                   a.data() + m * w.hidden);
          ++m;
        }
        if (m == 0) continue;
        expert_mlp(mlp, experts[b], a.data(), m, scale.data(), scale_at, y.data());
        for (int64_t r = 0; r < m; ++r)
          store_f32(y.data() + r * w.hidden, w.hidden, w.dtype,
                    slots.at({slot[r] / tokens.top_k, slot[r] % tokens.top_k, 0}));
      }
    });
    return out;
  }

 private:
  ActivationSpec spec_;
  GemmRowsFn gemm_;
};

CombineInputPtr post_permute_triton_to_standard(const RunnerOutputPtr& runner_output,
                                                const QuantInfoPtr& quant_info,
                                                const MoeRunnerConfig& config,
                                                RunningState& state) {
  auto* out = dynamic_cast<const TritonRunnerOutput*>(runner_output.get());
  MOECORE_CHECK_DTYPE(out != nullptr, "post-permute(triton→standard): expected a TritonRunnerOutput");
  auto* stashed = std::any_cast<std::shared_ptr<TritonRunnerInput>>(&state.backend);
  MOECORE_ASSERT(stashed != nullptr,
                 "post-permute(triton→standard): the running state holds no triton pre-permute "
                 "result (run the (standard, triton) pre-permute first)");
  const auto& input = *stashed;
  const Tensor& slots = out->hidden_states;
  if (config.no_combine) return std::make_shared<StandardCombineInput>(slots);
  const int64_t num_tokens = slots.size(0), hidden = slots.size(2);
  Tensor result = config.inplace ? input->hidden_states
                                 : Tensor::empty({num_tokens, hidden}, slots.dtype());
  if (num_tokens == 0) return std::make_shared<StandardCombineInput>(result);
  RoutedTokens tokens;
  tokens.topk_ids = input->topk_ids.view();
  tokens.topk_weights = input->topk_weights.view();
  tokens.num_tokens = num_tokens;
  tokens.top_k = slots.size(1);
  combine_topk(tokens, slots.view(), /*weighted=*/false,
               config.routed_scaling_factor.value_or(1.0f), result.view());
  return std::make_shared<StandardCombineInput>(result);
}

CombineInputPtr fused_none_to_triton(const DispatchOutputPtr& dispatch, const QuantInfoPtr& q,
                                     const MoeRunnerConfig& config) {
  RunningState state;
  RunnerInputPtr input = pre_permute_standard_to_triton(dispatch, q, config, state);
  TritonRunnerCore core(config);
  return post_permute_triton_to_standard(core.run(input, q, state), q, config, state);
}

std::unique_ptr<RunnerCore> make_triton_core(const MoeRunnerConfig& config) {
  return std::make_unique<TritonRunnerCore>(config);
}

}  // namespace

MOECORE_REGISTER_RUNNER_CORE(TRITON, make_triton_core);
MOECORE_REGISTER_FUSED_FUNC(NONE, TRITON, fused_none_to_triton);
MOECORE_REGISTER_PRE_PERMUTE(STANDARD, TRITON, pre_permute_standard_to_triton);
MOECORE_REGISTER_POST_PERMUTE(TRITON, STANDARD, post_permute_triton_to_standard);

}  // namespace moecore
