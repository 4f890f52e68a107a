// FusedMoE: construction, checkpoint loading with TP/EP sharding, forward.
#include "moecore/layer/fused_moe.h"

#include <cstring>

#include "moecore/core/error.h"
#include "moecore/dispatch/deepep.h"
#include "moecore/dispatch/flashinfer.h"
#include "moecore/runner/runner.h"

namespace moecore {
FusedMoE::FusedMoE(FusedMoEOptions options, std::shared_ptr<FusedMoEMethod> quant_method)
    : options_(std::move(options)),
      runner_backend_(options_.runner_backend.value_or(get_moe_runner_backend())),
      a2a_backend_(options_.a2a_backend.value_or(get_moe_a2a_backend())),
      quant_method_(quant_method ? std::move(quant_method)
                                 : std::make_shared<UnquantizedFusedMoEMethod>()) {
  const FusedMoEOptions& o = options_;
  const char* api = "FusedMoE";
  MOECORE_CHECK(o.hidden_size > 0 && o.intermediate_size > 0, api,
                ": expected hidden_size and intermediate_size > 0, got ", o.hidden_size, " and ",
                o.intermediate_size);
  MOECORE_CHECK(o.tp_size >= 1 && o.ep_size >= 1, api, ": expected tp_size, ep_size >= 1");
  MOECORE_CHECK_INDEX(o.tp_rank >= 0 && o.tp_rank < o.tp_size && o.ep_rank >= 0 &&
                          o.ep_rank < o.ep_size,
                      api, ": rank out of range (tp ", o.tp_rank, "/", o.tp_size, ", ep ",
                      o.ep_rank, "/", o.ep_size, ")");
  MOECORE_CHECK(o.intermediate_size % o.tp_size == 0, api, ": intermediate_size ",
                o.intermediate_size, " must divide evenly over tp_size ", o.tp_size);
  const int64_t shared = o.topk_config.num_fused_shared_experts;
  validate_topk_config(o.topk_config, o.num_experts - shared);
  dispatcher_ = make_dispatcher();
  num_local_experts_ = dispatcher_->num_local_experts();
  inter_per_partition_ = o.intermediate_size / o.tp_size;

  config_ = o.runner_config;
  config_.num_experts = o.num_experts;
  config_.num_local_experts = num_local_experts_;
  config_.hidden_size = o.hidden_size;
  config_.intermediate_size_per_partition = inter_per_partition_;
  config_.layer_id = o.layer_id;
  config_.top_k = o.topk_config.top_k;
  config_.num_fused_shared_experts = shared;
  config_.params_dtype = o.params_dtype;
  activation_spec(config_, api);  // reject bad activation settings at construction

  if (a2a_backend_ == MoeA2ABackend::DEEPEP) {
    // sglang builds the runner in __init__: a fused-only backend with no fused func for deepep
    // fails here with rule R1's message (moecore's runner is otherwise built after loading).
    if (runner_backend_ != MoeRunnerBackend::AUTO)
      MoeRunner(runner_backend_, config_, a2a_backend_);
    deprecate_flag_ = deepep_deprecate_flag();
  }
  quant_method_->create_weights(*this, num_local_experts_, o.hidden_size, inter_per_partition_,
                                o.params_dtype, o.with_bias);
}

std::shared_ptr<BaseDispatcher> FusedMoE::make_dispatcher() const {
  const FusedMoEOptions& o = options_;
  const char* api = "FusedMoE";
  const int64_t shared = o.topk_config.num_fused_shared_experts;
  if (a2a_backend_ == MoeA2ABackend::NONE)
    return std::make_shared<StandardDispatcher>(o.num_experts, o.ep_size, o.ep_rank, shared,
                                                runner_backend_);
  if (a2a_backend_ != MoeA2ABackend::DEEPEP && a2a_backend_ != MoeA2ABackend::FLASHINFER)
    MOECORE_UNSUPPORTED(api, ": a2a backend '", to_string(a2a_backend_), "' is not supported "
                        "(supported: none, deepep, flashinfer)");
  MOECORE_CHECK(o.transport != nullptr, api, ": a2a backend '", to_string(a2a_backend_),
                "' needs a transport (e.g. LoopbackGroup.transport(rank) or "
                "moecore.ExpertParallelGroup)");
  MOECORE_CHECK(o.ep_size == o.transport->size() && o.ep_rank == o.transport->rank(), api,
                ": ep_size/ep_rank (", o.ep_size, "/", o.ep_rank, ") must match the transport (",
                o.transport->size(), "/", o.transport->rank(), ")");
  MOECORE_CHECK(o.tp_size == 1, api, ": expert parallelism over a transport needs tp_size 1, got ",
                o.tp_size);
  if (shared > 0)
    MOECORE_UNSUPPORTED(api, ": fused shared experts are not supported with a2a '",
                        to_string(a2a_backend_), "'");
  const int64_t local = o.num_experts % o.ep_size == 0 ? o.num_experts / o.ep_size : 0;
  if (a2a_backend_ == MoeA2ABackend::FLASHINFER)
    return std::make_shared<FlashinferDispatcher>(
        o.transport, FlashinferDispatchConfig{o.num_experts, local, o.hidden_size,
                                              o.topk_config.top_k, runner_backend_});
  DeepEPConfig c;
  c.num_experts = o.num_experts;
  c.num_local_experts = local;
  c.hidden_size = o.hidden_size;
  c.top_k = o.topk_config.top_k;
  c.mode = o.deepep_mode;
  c.num_max_dispatch_tokens_per_rank = o.num_max_dispatch_tokens_per_rank;
  c.runner_backend = runner_backend_;
  c.expert_alignment = runner_backend_ == MoeRunnerBackend::DEEP_GEMM ? 128 : 1;  // DeepGEMM JIT
  c.routed_scaling_factor = o.runner_config.routed_scaling_factor;
  // DeepGEMM's UE8M0 mode: DeepEP rounds the FP8 payload scales to powers of two and packs them.
  c.round_scale = c.use_ue8m0 =
      runner_backend_ == MoeRunnerBackend::DEEP_GEMM && quant_method_->deep_gemm_scale_ue8m0();
  return std::make_shared<DeepEPDispatcher>(o.transport, c);
}

bool FusedMoE::deepep_deprecate_flag() const {
  // sglang ep_moe/layer.py, first match wins; moecore has no aiter/NPU and DeepGEMM "JIT" is the
  // deep_gemm runner backend.
  const std::string quant = quant_method_->name();
  if (quant == "Fp8MoEMethod") return true;
  if (runner_backend_ == MoeRunnerBackend::FLASHINFER_CUTEDSL &&
      quant == "ModelOptNvFp4FusedMoEMethod")
    return true;
  if (quant == "UnquantizedFusedMoEMethod" && options_.params_dtype == DType::kBF16 &&
      enable_low_latency(options_.deepep_mode)) {
    MOECORE_ASSERT(runner_backend_ == MoeRunnerBackend::DEEP_GEMM ||
                       runner_backend_ == MoeRunnerBackend::AUTO,
                   "Unquantized DeepEP low-latency MoE requires DeepGEMM BF16 (moecore: "
                   "runner_backend 'deep_gemm', got '", to_string(runner_backend_), "')");
    return true;
  }
  MOECORE_UNSUPPORTED("FusedMoE: a2a 'deepep' with ", quant, ", runner backend '",
                      to_string(runner_backend_), "' and mode '", to_string(options_.deepep_mode),
                      "' would take a legacy DeepEPMoE path (deprecate_flag False), which moecore "
                      "does not build; supported: fp8, flashinfer_cutedsl + modelopt_fp4, and "
                      "unquantized bf16 with deep_gemm in a mode that enables low_latency");
}

int64_t FusedMoE::local_expert_id(int64_t global_expert_id) const {
  MOECORE_CHECK_INDEX(global_expert_id >= 0 && global_expert_id < options_.num_experts,
                      "FusedMoE.weight_loader: expert_id must be in [0, ", options_.num_experts,
                      "), got ", global_expert_id);
  return dispatcher_->local_expert_id(global_expert_id);
}

bool FusedMoE::weight_loader(const std::string& param_name, const Tensor& loaded,
                             const std::string& shard_id, int64_t expert_id) {
  const char* api = "FusedMoE.weight_loader";
  MOECORE_CHECK(shard_id == "w1" || shard_id == "w2" || shard_id == "w3", api,
                ": shard_id must be 'w1', 'w2' or 'w3', got '", shard_id, "'");
  auto it = params_.find(param_name);
  if (it == params_.end()) parameter(param_name);  // throws, listing the parameters
  const Tensor& param = it->second.tensor;
  const ParamSpec& spec = it->second.spec;
  MOECORE_CHECK_DTYPE(loaded.defined() && loaded.dtype() == param.dtype(), api, ": ", param_name,
                      " holds ", dtype_name(param.dtype()), ", got ", loaded.describe(),
                      " (convert explicitly, e.g. with moecore.dtypes)");
  int64_t local;
  if (spec.global_experts) {
    MOECORE_CHECK_INDEX(expert_id >= 0 && expert_id < param.size(0), api, ": expert_id must be in "
                        "[0, ", param.size(0), "), got ", expert_id);
    local = expert_id;
  } else {
    local = local_expert_id(expert_id);
    if (local < 0) return false;  // another EP rank's expert
  }
  // w13_* parameters take shards "w1"/"w3", w2_* parameters take "w2" (sglang's naming).
  const bool w2_param = param_name.rfind("w2", 0) == 0;
  MOECORE_CHECK(w2_param == (shard_id == "w2"), api, ": shard '", shard_id,
                "' does not belong to ", param_name);
  const bool gated = config_.is_gated;
  MOECORE_CHECK(gated || shard_id != "w3", api, ": shard 'w3' needs a gated layer");
  const int64_t tp = options_.tp_size, rank = options_.tp_rank;
  const TensorView dest = param.view().select(0, local);
  TensorView src = loaded.view();
  auto same_dims = [&](const TensorView& a, const TensorView& b, int skip) {
    if (a.ndim != b.ndim) return false;
    for (int d = 0; d < a.ndim; ++d)
      if (d != skip && a.shape[d] != b.shape[d]) return false;
    return true;
  };
  auto expect = [&](bool ok, const std::string& want) {
    MOECORE_CHECK(ok, api, ": expected ", param_name, " shard '", shard_id, "' ", want, ", got ",
                  loaded.describe());
  };
  switch (spec.layout) {
    case ShardLayout::kW13: {
      const int64_t part = gated ? dest.shape[0] / 2 : dest.shape[0];
      std::vector<int64_t> want = dest.shape_vector();
      want[0] = part * tp;
      expect(same_dims(src, dest, 0) && src.shape[0] == part * tp, shape_string(want));
      const bool first = (shard_id == "w1") != quant_method_->load_up_proj_weight_first();
      copy_view(src.narrow(0, rank * part, part), dest.narrow(0, gated && !first ? part : 0, part));
      return true;
    }
    case ShardLayout::kW2: {
      const int last = dest.ndim - 1;
      const int64_t part = dest.shape[last];
      std::vector<int64_t> want = dest.shape_vector();
      want[last] = part * tp;
      expect(same_dims(src, dest, last) && src.shape[last] == part * tp, shape_string(want));
      copy_view(src.narrow(last, rank * part, part), dest);
      return true;
    }
    case ShardLayout::kPerShard: {
      expect(src.numel() == 1, "holding one value");
      TensorView one = make_view(src.data, src.dtype, {1});
      copy_view(one, dest.narrow(0, shard_id == "w1" ? 0 : 1, 1));
      return true;
    }
    case ShardLayout::kPerExpert: {
      const bool scalar = dest.numel() == 1 && src.numel() == 1;
      expect(scalar || src.shape_vector() == dest.shape_vector(), shape_string(dest.shape_vector()));
      if (spec.tp_rank0_only && rank != 0) {
        zero_view(dest);
      } else if (scalar) {
        copy_view(make_view(src.data, src.dtype, {1}), make_view(dest.data, dest.dtype, {1}));
      } else {
        copy_view(src, dest);
      }
      return true;
    }
  }
  MOECORE_INTERNAL_CHECK(false, "unknown shard layout");
}

void FusedMoE::process_weights_after_loading() {
  quant_method_->process_weights_after_loading(*this);
  quant_method_->create_moe_runner(*this, config_);
  quant_method_->pack_weight_tiles(*this);
}

Tensor FusedMoE::forward(const Tensor& hidden_states, const Tensor& router_logits,
                         std::optional<int64_t> num_token_non_padded) {
  StandardTopKOutput topk =
      select_experts(hidden_states, router_logits, options_.topk_config, num_token_non_padded);
  return forward_topk(hidden_states, topk);
}

Tensor FusedMoE::forward_topk(const Tensor& hidden_states, const TopKOutput& topk_output) {
  MOECORE_CHECK(runner() != nullptr, "FusedMoE.forward: call process_weights_after_loading() "
                "first (it builds the runner)");
  DispatchOutputPtr dispatched = dispatcher_->dispatch(hidden_states, topk_output);
  CombineInputPtr combined = quant_method_->apply(*this, dispatched);
  return dispatcher_->combine(combined);
}

void FusedMoE::register_parameter(const std::string& name, Tensor tensor, ParamSpec spec) {
  MOECORE_INTERNAL_CHECK(tensor.defined() && tensor.ndim() >= 1, "parameter ", name,
                         " needs a leading expert dim");
  params_[name] = {std::move(tensor), spec};
}

const Tensor& FusedMoE::parameter(const std::string& name) const {
  auto it = params_.find(name);
  if (it == params_.end()) {
    std::string have;
    for (const auto& [n, t] : params_) have += std::string(have.empty() ? "" : ", ") + n;
    MOECORE_THROW(InvalidArgument, "FusedMoE: no parameter '", name, "' (have: ", have, ")");
  }
  return it->second.tensor;
}

Tensor FusedMoE::find_parameter(const std::string& name) const {
  auto it = params_.find(name);
  return it == params_.end() ? Tensor() : it->second.tensor;
}

std::vector<std::string> FusedMoE::parameter_names() const {
  std::vector<std::string> names;
  for (const auto& [n, t] : params_) names.push_back(n);
  return names;
}

void FusedMoE::set_overlap_args(std::any down, std::any meta) {
  if (runner()) runner()->set_overlap_args(std::move(down), std::move(meta));
}

void FusedMoE::clear_overlap_args() {
  if (runner()) runner()->clear_overlap_args();
}

}  // namespace moecore
