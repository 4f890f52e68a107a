// FusedMoE: construction, checkpoint loading with TP/EP sharding, forward.
#include "moecore/layer/fused_moe.h"

#include <cstring>

#include "moecore/core/error.h"

namespace moecore {
namespace {

// Copies rows [row0, row0 + rows) × cols [col0, col0 + cols) of a 2-D `src` into `dst`
// (row-major, stride dst_stride) — same dtype, checked by the caller.
void copy_block(const TensorView& src, int64_t row0, int64_t rows, int64_t col0, int64_t cols,
                char* dst, int64_t dst_stride) {
  const int64_t elem = dtype_size(src.dtype);
  for (int64_t r = 0; r < rows; ++r) {
    if (src.strides[1] == 1) {
      std::memcpy(dst + r * dst_stride * elem, src.at({row0 + r, col0}),
                  static_cast<size_t>(cols * elem));
    } else {
      for (int64_t c = 0; c < cols; ++c)
        std::memcpy(dst + (r * dst_stride + c) * elem, src.at({row0 + r, col0 + c}),
                    static_cast<size_t>(elem));
    }
  }
}

}  // namespace

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
  MOECORE_CHECK(a2a_backend_ == MoeA2ABackend::NONE, api, ": a2a backend '",
                to_string(a2a_backend_), "' needs an expert-parallel dispatcher; FusedMoE runs "
                "the standard dispatcher (a2a 'none')");
  const int64_t shared = o.topk_config.num_fused_shared_experts;
  dispatcher_ = std::make_shared<StandardDispatcher>(o.num_experts, o.ep_size, o.ep_rank, shared,
                                                     runner_backend_);
  validate_topk_config(o.topk_config, o.num_experts - shared);
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

  quant_method_->create_weights(*this, num_local_experts_, o.hidden_size, inter_per_partition_,
                                o.params_dtype, o.with_bias);
}

int64_t FusedMoE::local_expert_id(int64_t global_expert_id) const {
  MOECORE_CHECK_INDEX(global_expert_id >= 0 && global_expert_id < options_.num_experts,
                      "FusedMoE.weight_loader: expert_id must be in [0, ", options_.num_experts,
                      "), got ", global_expert_id);
  const Tensor& map = dispatcher_->local_expert_mapping();
  if (!map.defined()) return global_expert_id;
  return map.ptr<int32_t>()[global_expert_id];
}

bool FusedMoE::weight_loader(const std::string& param_name, const Tensor& loaded,
                             const std::string& shard_id, int64_t expert_id) {
  const char* api = "FusedMoE.weight_loader";
  MOECORE_CHECK(shard_id == "w1" || shard_id == "w2" || shard_id == "w3", api,
                ": shard_id must be 'w1', 'w2' or 'w3', got '", shard_id, "'");
  const Tensor& param = parameter(param_name);
  MOECORE_CHECK_DTYPE(loaded.defined() && loaded.dtype() == param.dtype(), api, ": ", param_name,
                      " holds ", dtype_name(param.dtype()), ", got ", loaded.describe(),
                      " (convert explicitly, e.g. with moecore.dtypes)");
  const int64_t local = local_expert_id(expert_id);
  if (local < 0) return false;  // another EP rank's expert

  const int64_t H = options_.hidden_size, I = inter_per_partition_;
  const int64_t I_full = options_.intermediate_size, rank = options_.tp_rank;
  const bool gated = config_.is_gated;
  const int64_t elem = dtype_size(param.dtype());
  const bool is_bias = param_name == "w13_weight_bias" || param_name == "w2_weight_bias";
  const bool is_w13 = param_name == "w13_weight" || param_name == "w13_weight_bias";
  MOECORE_CHECK(is_w13 == (shard_id != "w2"), api, ": shard '", shard_id,
                "' does not belong to ", param_name);
  MOECORE_CHECK(gated || shard_id != "w3", api, ": shard 'w3' needs a gated layer");

  char* base = static_cast<char*>(param.view().at({local, 0}));
  if (is_bias) {
    const int64_t want = is_w13 ? I_full : H;
    MOECORE_CHECK(loaded.ndim() == 1 && loaded.size(0) == want, api, ": expected ", param_name,
                  " shard [", want, "], got ", loaded.describe());
    TensorView row = loaded.view();
    row.ndim = 2;
    row.shape[1] = row.shape[0];
    row.strides[1] = row.strides[0];
    row.shape[0] = 1;
    row.strides[0] = 0;
    if (is_w13) {
      const int64_t offset = (shard_id == "w1") != quant_method_->load_up_proj_weight_first() ? 0 : I;
      copy_block(row, 0, 1, rank * I, I, base + (gated ? offset : 0) * elem, I);
    } else if (rank == 0) {
      copy_block(row, 0, 1, 0, H, base, H);
    } else {
      std::memset(base, 0, static_cast<size_t>(H * elem));
    }
    return true;
  }
  MOECORE_CHECK(loaded.ndim() == 2, api, ": expected a 2-D weight, got ", loaded.describe());
  if (is_w13) {
    MOECORE_CHECK(loaded.size(0) == I_full && loaded.size(1) == H, api, ": expected ", shard_id,
                  " [", I_full, ", ", H, "], got ", loaded.describe());
    const bool first_half = (shard_id == "w1") != quant_method_->load_up_proj_weight_first();
    const int64_t row0 = gated && !first_half ? I : 0;
    copy_block(loaded.view(), rank * I, I, 0, H, base + row0 * H * elem, H);
  } else {
    MOECORE_CHECK(loaded.size(0) == H && loaded.size(1) == I_full, api, ": expected w2 [", H,
                  ", ", I_full, "], got ", loaded.describe());
    copy_block(loaded.view(), 0, H, rank * I, I, base, I);
  }
  return true;
}

void FusedMoE::process_weights_after_loading() {
  quant_method_->process_weights_after_loading(*this);
  quant_method_->create_moe_runner(*this, config_);
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

void FusedMoE::register_parameter(const std::string& name, Tensor tensor) {
  params_[name] = std::move(tensor);
}

const Tensor& FusedMoE::parameter(const std::string& name) const {
  auto it = params_.find(name);
  if (it == params_.end()) {
    std::string have;
    for (const auto& [n, t] : params_) have += std::string(have.empty() ? "" : ", ") + n;
    MOECORE_THROW(InvalidArgument, "FusedMoE: no parameter '", name, "' (have: ", have, ")");
  }
  return it->second;
}

Tensor FusedMoE::find_parameter(const std::string& name) const {
  auto it = params_.find(name);
  return it == params_.end() ? Tensor() : it->second;
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
