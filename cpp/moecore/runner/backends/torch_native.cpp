// Runner backend "torch_native" (sglang moe_runner/torch_native.py, moe_forward_native): the
// literal reference loop. Registers: runner core TORCH_NATIVE, fused func (none, torch_native),
// pre-permute (standard, torch_native), post-permute (torch_native, standard).
//
// Numeric contract: tokens are sorted by expert (stable); per expert GEMM1 = F.linear in fp32
// accumulation rounded to the activation dtype (+b13 before rounding); the gated activation
// rounds act(gate) and then act(gate)·up (SiluAndMul/GeluAndMul.forward_native; "gelu" is exact
// erf GELU here as in sglang's einsum path, "gelu_tanh" the tanh form); GEMM2 rounded (+b2);
// outputs are scattered back to (token, slot), cast to fp32, multiplied by the routed weight,
// summed over slots in order, multiplied by routed_scaling_factor and rounded once.
// apply_router_weight_on_input is rejected (as sglang's native path does); no_combine returns
// the weighted per-slot rows round(w · y) [T, k, H] without rsf; inplace is not used.
#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/kernels/convert.h"
#include "moecore/runner/expert_compute.h"
#include "moecore/runner/registry.h"

namespace moecore {
namespace {

/// TorchNativeRunnerInput(hidden_states, topk_weights, topk_ids, sorted_tokens,
/// tokens_per_expert, idxs).
constexpr const char* kApi = "MoeRunner(torch_native)";

struct TorchNativeRunnerInput : RunnerInput {
  Tensor hidden_states, topk_weights, topk_ids;
  Tensor sorted_tokens;      // [num_valid, H] act dtype: x rows in expert order
  Tensor tokens_per_expert;  // i64 [E]
  Tensor idxs;               // i64 [num_valid]: slot t·k + j of each sorted row
  MoeRunnerBackend runner_backend() const override { return MoeRunnerBackend::TORCH_NATIVE; }
};

/// TorchNativeRunnerOutput(hidden_states): expert outputs [num_valid, H] in sorted order.
struct TorchNativeRunnerOutput : RunnerOutput {
  Tensor hidden_states;
  MoeRunnerBackend runner_backend() const override { return MoeRunnerBackend::TORCH_NATIVE; }
};

ExpertWeights weights_of(const QuantInfoPtr& q, const MoeRunnerConfig& config) {
  auto* info = dynamic_cast<const TorchNativeMoeQuantInfo*>(q.get());
  MOECORE_CHECK_DTYPE(info != nullptr,
                      "MoeRunner(torch_native): expected TorchNativeMoeQuantInfo, got ", q->name());
  ExpertWeights w = check_expert_weights("MoeRunner(torch_native)", info->w13_weight,
                                         info->w2_weight, info->b13, info->b2, config.is_gated);
  w.tiles = info->weight_tiles.get();
  return w;
}

RunnerInputPtr pre_permute_standard_to_torch_native(const DispatchOutputPtr& dispatch,
                                                    const QuantInfoPtr& q,
                                                    const MoeRunnerConfig& config,
                                                    RunningState& state) {
  auto* d = dynamic_cast<const StandardDispatchOutput*>(dispatch.get());
  MOECORE_CHECK_DTYPE(d != nullptr, "MoeRunner(torch_native): expected a StandardDispatchOutput");
  const ExpertWeights w = weights_of(q, config);
  StandardTopKOutput topk = to_standard(d->topk_output);
  const RoutedTokens tokens =
      check_routed_tokens("MoeRunner(torch_native)", d->hidden_states, topk, w);
  SortedLayout layout = sort_by_expert(tokens, w.num_experts);
  auto input = std::make_shared<TorchNativeRunnerInput>();
  input->hidden_states = d->hidden_states;
  input->topk_weights = topk.topk_weights;
  input->topk_ids = topk.topk_ids;
  input->tokens_per_expert = layout.tokens_per_expert;
  input->idxs = layout.idxs;
  const int64_t valid = layout.idxs.size(0), elem = dtype_size(w.dtype);
  input->sorted_tokens = Tensor::empty({valid, w.hidden}, w.dtype);
  const int64_t* idxs = layout.idxs.ptr<int64_t>();
  for (int64_t i = 0; i < valid; ++i)
    std::memcpy(input->sorted_tokens.view().at({i, 0}), tokens.x.at({idxs[i] / tokens.top_k, 0}),
                static_cast<size_t>(w.hidden * elem));
  state.backend = input;
  return input;
}

/// The core: the shared expert schedule over the expert-sorted rows, with a workspace reused
/// across calls (its own, or the fused func's).
class TorchNativeRunnerCore : public RunnerCore {
 public:
  TorchNativeRunnerCore(const MoeRunnerConfig& config, std::shared_ptr<ExpertWorkspace> workspace)
      : RunnerCore(config),
        spec_(activation_spec(config, "MoeRunner(torch_native)")),
        gemm_(config.gemm_kernel()),
        workspace_(std::move(workspace)) {
    if (config.apply_router_weight_on_input)
      MOECORE_UNSUPPORTED("MoeRunner(torch_native): apply_router_weight_on_input is not "
                          "supported by the torch-native path");
    spec_.round_before_mul = true;
  }

  MoeRunnerBackend runner_backend() const override { return MoeRunnerBackend::TORCH_NATIVE; }

  RunnerOutputPtr run(const RunnerInputPtr& runner_input, const QuantInfoPtr& q,
                      RunningState&) override {
    auto* in = dynamic_cast<const TorchNativeRunnerInput*>(runner_input.get());
    MOECORE_CHECK_DTYPE(in != nullptr, "TorchNativeRunnerCore.run: expected a TorchNativeRunnerInput");
    const ExpertWeights w = weights_of(q, config_);
    const int64_t valid = in->sorted_tokens.size(0);
    auto out = std::make_shared<TorchNativeRunnerOutput>();
    out->hidden_states = Tensor::empty({valid, w.hidden}, w.dtype);
    if (valid == 0) return out;  // R9

    ExpertWorkspace& ws = *workspace_;
    std::lock_guard<std::mutex> lock(ws.mutex);
    ws.rows.sorted_rows(in->tokens_per_expert.ptr<int64_t>(), w.num_experts);
    MOECORE_CHECK(ws.rows.rows() == valid, "TorchNativeRunnerCore.run: tokens_per_expert sums to ",
                  ws.rows.rows(), ", expected the ", valid, " sorted rows");
    const TensorView src = in->sorted_tokens.view();
    auto load = [&src](int64_t row, float* dst) {
      load_f32(src.at({row, 0}), src.dtype, src.shape[1], dst);
    };
    run_expert_mlp(dense_expert_mlp(w, spec_, gemm_), ws, load, RowScaleAt::kNone,
                   out->hidden_states.view());
    return out;
  }

 private:
  ActivationSpec spec_;
  ScaledGemmFn gemm_;
  std::shared_ptr<ExpertWorkspace> workspace_;
};

CombineInputPtr post_permute_torch_native_to_standard(const RunnerOutputPtr& runner_output,
                                                      const QuantInfoPtr&,
                                                      const MoeRunnerConfig& config,
                                                      RunningState& state) {
  auto* out = dynamic_cast<const TorchNativeRunnerOutput*>(runner_output.get());
  MOECORE_CHECK_DTYPE(out != nullptr,
                      "post-permute(torch_native→standard): expected a TorchNativeRunnerOutput");
  auto* stashed = std::any_cast<std::shared_ptr<TorchNativeRunnerInput>>(&state.backend);
  MOECORE_ASSERT(stashed != nullptr, "post-permute(torch_native→standard): the running state "
                 "holds no torch_native pre-permute result");
  const TorchNativeRunnerInput& in = **stashed;
  const int64_t num_tokens = in.hidden_states.size(0), top_k = in.topk_ids.size(1);
  const int64_t hidden = in.hidden_states.size(1), elem = dtype_size(in.hidden_states.dtype());
  // new_x[idxs] = outs: scatter sorted rows back to their (token, slot); invalid slots stay 0.
  Tensor slots = Tensor::zeros({num_tokens, top_k, hidden}, in.hidden_states.dtype());
  const int64_t* idxs = in.idxs.ptr<int64_t>();
  for (int64_t i = 0; i < in.idxs.size(0); ++i)
    std::memcpy(slots.view().at({idxs[i] / top_k, idxs[i] % top_k, 0}),
                out->hidden_states.view().at({i, 0}), static_cast<size_t>(hidden * elem));
  RoutedTokens tokens;
  tokens.topk_ids = in.topk_ids.view();
  tokens.topk_weights = in.topk_weights.view();
  tokens.num_tokens = num_tokens;
  tokens.top_k = top_k;
  if (config.no_combine) {
    weight_slots(tokens, slots.view());
    return std::make_shared<StandardCombineInput>(slots);
  }
  Tensor result = Tensor::empty({num_tokens, hidden}, in.hidden_states.dtype());
  combine_topk(tokens, slots.view(), /*weighted=*/true, config.routed_scaling_factor.value_or(1.0f),
               result.view());
  return std::make_shared<StandardCombineInput>(result);
}

/// The (standard, torch_native) path prepared for one dispatch output's shapes. It computes the
/// core's rows straight into their (token, slot) places: the same rows in the same expert order
/// as the sorted copy, so the same bits, without the copy.
class TorchNativePreparedRun : public PreparedRun {
 public:
  TorchNativePreparedRun(const DispatchOutputPtr& dispatch, const QuantInfoPtr& q,
                         const MoeRunnerConfig& config)
      : PreparedRun(nullptr), dispatch_(dispatch), quant_info_(q), config_(config) {
    auto* d = dynamic_cast<const StandardDispatchOutput*>(dispatch.get());
    MOECORE_CHECK_DTYPE(d != nullptr,
                        "MoeRunner(torch_native): expected a StandardDispatchOutput");
    if (config.apply_router_weight_on_input)
      MOECORE_UNSUPPORTED("MoeRunner(torch_native): apply_router_weight_on_input is not "
                          "supported by the torch-native path");
    weights_ = weights_of(q, config);
    x_ = d->hidden_states;
    topk_ = prepared_topk(d->topk_output);
    const RoutedTokens tokens = check_routed_tokens(kApi, x_, topk_, weights_);
    ActivationSpec spec = activation_spec(config, kApi);
    spec.round_before_mul = true;
    mlp_ = dense_expert_mlp(weights_, spec, config.gemm_kernel());
    // no_combine returns the per-slot rows; otherwise the top-k sum reads GEMM2's rows and no
    // per-slot rows exist.
    result_ = config.no_combine
                  ? Tensor::zeros({tokens.num_tokens, tokens.top_k, weights_.hidden}, weights_.dtype)
                  : Tensor::empty({tokens.num_tokens, weights_.hidden}, weights_.dtype);
    combine_input_ = std::make_shared<StandardCombineInput>(result_);
    workspace_.reserve(mlp_, tokens.num_tokens * tokens.top_k);
  }

  void run() override {
    const RoutedTokens tokens = check_routed_tokens(kApi, x_, topk_, weights_);
    std::lock_guard<std::mutex> lock(workspace_.mutex);
    workspace_.rows.group_slots(tokens, weights_.num_experts, /*with_scale=*/false);
    if (!config_.no_combine) {
      expert_gemm1_phase(mlp_, workspace_, token_rows(tokens), RowScaleAt::kNone);
      expert_gemm2_summed_phase(
          mlp_, workspace_, RowScaleAt::kNone,
          TopkSum{&tokens, /*weighted=*/true, config_.routed_scaling_factor.value_or(1.0f),
                  result_.view(), /*bias=*/{}});
      return;
    }
    const TensorView slots = result_.view();
    zero_view(slots);  // invalid slots stay 0
    if (workspace_.rows.rows() > 0)
      run_expert_mlp(mlp_, workspace_, token_rows(tokens), RowScaleAt::kNone, slot_rows(slots));
    weight_slots(tokens, slots);
  }

 private:
  DispatchOutputPtr dispatch_;  // keeps the static inputs alive
  QuantInfoPtr quant_info_;     // keeps the weights alive
  MoeRunnerConfig config_;
  ExpertWeights weights_;
  Tensor x_;
  StandardTopKOutput topk_;
  ExpertMlp mlp_;
  Tensor result_;
  ExpertWorkspace workspace_;
};

PreparedRunPtr prepare_standard_torch_native(const DispatchOutputPtr& dispatch,
                                             const QuantInfoPtr& q, const MoeRunnerConfig& config,
                                             MoeA2ABackend) {
  return std::make_unique<TorchNativePreparedRun>(dispatch, q, config);
}

CombineInputPtr fused_none_to_torch_native(const DispatchOutputPtr& dispatch,
                                           const QuantInfoPtr& q, const MoeRunnerConfig& config) {
  // The fused func's state: one workspace for every runner that uses it (calls take turns).
  static const auto workspace = std::make_shared<ExpertWorkspace>();
  RunningState state;
  TorchNativeRunnerCore core(config, workspace);
  RunnerInputPtr input = pre_permute_standard_to_torch_native(dispatch, q, config, state);
  return post_permute_torch_native_to_standard(core.run(input, q, state), q, config, state);
}

std::unique_ptr<RunnerCore> make_torch_native_core(const MoeRunnerConfig& config) {
  return std::make_unique<TorchNativeRunnerCore>(config, std::make_shared<ExpertWorkspace>());
}

}  // namespace

MOECORE_REGISTER_RUNNER_CORE(TORCH_NATIVE, make_torch_native_core);
MOECORE_REGISTER_FUSED_FUNC(NONE, TORCH_NATIVE, fused_none_to_torch_native);
MOECORE_REGISTER_PRE_PERMUTE(STANDARD, TORCH_NATIVE, pre_permute_standard_to_torch_native);
MOECORE_REGISTER_POST_PERMUTE(TORCH_NATIVE, STANDARD, post_permute_torch_native_to_standard);
MOECORE_REGISTER_PREPARED_RUN(STANDARD, TORCH_NATIVE, prepare_standard_torch_native);

}  // namespace moecore
