// select_experts: sglang's routing (python/sglang/srt/layers/moe/topk.py) for one batch of router
// logits: scoring, flat / grouped / biased-grouped top-k, renormalization, routed scaling, fused
// shared-expert columns, padded rows and custom routing functions. Every check runs before any
// row is routed; rows are independent, so results never depend on threads or batch neighbours,
// and nothing here is random (sglang's torch.randint for the shared id is replaced by a rule).
#include "moecore/routing/topk.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/core/thread_pool.h"
#include "moecore/kernels/convert.h"

namespace moecore {
namespace {

enum class Selection { kFlat, kGrouped, kBiasedGrouped };

/// The config resolved for one call: which path, and the numbers every row needs.
struct Plan {
  int64_t num_experts = 0;  // E, routed experts
  int top_k = 0;            // output columns, shared ones included
  int routed_k = 0;         // top_k - num_shared
  int num_shared = 0;
  Selection selection = Selection::kFlat;
  ScoringFunc scoring = ScoringFunc::SOFTMAX;
  const float* bias = nullptr;  // correction_bias, read with bias_stride; null when absent
  int64_t bias_stride = 1;
  int num_groups = 1;
  int topk_group = 1;
  bool renormalize = true;
  float routed_scaling = 1.0f;  // 1 when routed_scaling_factor is absent
  bool scale_on_output = false;
  std::optional<float> shared_scale;
};

std::string optional_string(const std::optional<int>& v) {
  return v ? std::to_string(*v) : std::string("None");
}

bool is_finite_value(const void* row, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32:
      return std::isfinite(static_cast<const float*>(row)[i]);
    case DType::kBF16:  // exponent field all ones: inf or NaN
      return (static_cast<const uint16_t*>(row)[i] & 0x7f80u) != 0x7f80u;
    default:  // kF16
      return (static_cast<const uint16_t*>(row)[i] & 0x7c00u) != 0x7c00u;
  }
}

const char* row_ptr(const TensorView& v, int64_t t) {
  return static_cast<const char*>(v.data) + t * v.strides[0] * dtype_size(v.dtype);
}

/// Scores are evaluated in double and rounded once to fp32. The fp32 score is then (barring a
/// double result within an ulp of an fp32 rounding boundary) the correctly rounded value, the
/// same one numpy or torch in float64 produce, so ids chosen on near-ties agree across
/// implementations; sglang's fp32 kernels differ from it by at most an ulp or two.
/// softmax: m = max x; e_i = exp(x_i - m); sum = e_0 + e_1 + ... in index order; p_i = e_i / sum.
/// sigmoid: 1 / (1 + exp(-x)). sqrtsoftplus: sqrt(max(x, 0) + log1p(exp(-|x|))), the overflow-free
/// form of sqrt(log(1 + exp(x))).
void compute_scores(ScoringFunc scoring, const float* x, int64_t n, double* scratch, float* out) {
  switch (scoring) {
    case ScoringFunc::SOFTMAX: {
      float m = x[0];
      for (int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
      double sum = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        scratch[i] = std::exp(static_cast<double>(x[i]) - static_cast<double>(m));
        sum += scratch[i];
      }
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(scratch[i] / sum);
      return;
    }
    case ScoringFunc::SIGMOID:
      for (int64_t i = 0; i < n; ++i)
        out[i] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(x[i]))));
      return;
    case ScoringFunc::SQRTSOFTPLUS:
      for (int64_t i = 0; i < n; ++i) {
        const double v = x[i];
        const double softplus = std::max(v, 0.0) + std::log1p(std::exp(-std::fabs(v)));
        out[i] = static_cast<float>(std::sqrt(softplus));
      }
      return;
  }
}

/// Per-chunk buffers, sized once for E.
struct RowScratch {
  explicit RowScratch(const Plan& p)
      : logits(p.num_experts), scores(p.num_experts), keys(p.num_experts),
        exps(p.num_experts), candidates(p.num_experts), group_scores(p.num_groups),
        groups(p.num_groups) {}
  std::vector<float> logits, scores, keys;
  std::vector<double> exps;
  std::vector<int32_t> candidates;
  std::vector<float> group_scores;
  std::vector<int32_t> groups;
};

/// Orders indices by descending key, ties to the lower index (a strict weak order: keys are
/// never NaN, since non-finite logits and biases are rejected).
struct ByKeyThenIndex {
  const float* key;
  bool operator()(int32_t a, int32_t b) const {
    return key[a] > key[b] || (key[a] == key[b] && a < b);
  }
};

/// Fills the weights of one row whose routed columns hold the unbiased scores: appends the shared
/// columns, renormalizes and scales, in sglang's order (biased_grouped_topk_impl).
void finish_row(const Plan& p, float* w, int32_t* ids) {
  float routed_sum = 0.0f;
  for (int j = 0; j < p.routed_k; ++j) routed_sum += w[j];
  for (int j = 0; j < p.num_shared; ++j) {
    ids[p.routed_k + j] = static_cast<int32_t>(p.num_experts + j);
    w[p.routed_k + j] = routed_sum / p.routed_scaling;
  }
  if (p.renormalize) {
    // A zero sum needs every chosen score to have underflowed; the weights then stay 0 rather
    // than becoming 0/0 (sglang's newer 1e-20 epsilon gives the same zeros).
    if (routed_sum > 0.0f)
      for (int j = 0; j < p.top_k; ++j) w[j] = w[j] / routed_sum;
    if (p.scale_on_output)
      for (int j = 0; j < p.top_k; ++j) w[j] = w[j] * p.routed_scaling;
  }
  if (p.shared_scale)
    for (int j = p.routed_k; j < p.top_k; ++j) w[j] = w[j] * *p.shared_scale;
}

void route_row(const Plan& p, const TensorView& logits, int64_t t, RowScratch& s, float* w,
               int32_t* ids) {
  const int64_t E = p.num_experts;
  load_f32(row_ptr(logits, t), logits.dtype, E, s.logits.data());
  compute_scores(p.scoring, s.logits.data(), E, s.exps.data(), s.scores.data());
  for (int64_t e = 0; e < E; ++e)
    s.keys[e] = p.bias ? s.scores[e] + p.bias[e * p.bias_stride] : s.scores[e];

  int64_t num_candidates = E;
  if (p.selection == Selection::kFlat) {
    for (int64_t e = 0; e < E; ++e) s.candidates[e] = static_cast<int32_t>(e);
  } else {
    const int64_t per_group = E / p.num_groups;
    for (int g = 0; g < p.num_groups; ++g) {
      const float* k = s.keys.data() + g * per_group;
      float score;
      if (p.selection == Selection::kGrouped) {
        score = *std::max_element(k, k + per_group);
      } else {  // sum of the two largest keys of the group, as topk(2).sum() does
        float first = -std::numeric_limits<float>::infinity(), second = first;
        for (int64_t i = 0; i < per_group; ++i) {
          if (k[i] > first) {
            second = first;
            first = k[i];
          } else if (k[i] > second) {
            second = k[i];
          }
        }
        score = first + second;
      }
      s.group_scores[g] = score;
      s.groups[g] = g;
    }
    std::partial_sort(s.groups.begin(), s.groups.begin() + p.topk_group, s.groups.end(),
                      ByKeyThenIndex{s.group_scores.data()});
    // Experts of the dropped groups are left out, not given score 0 (grouped_topk) or -inf
    // (biased): they can then never be chosen, even where kept scores underflow to 0. The
    // candidates' order is irrelevant: ByKeyThenIndex is a total order.
    num_candidates = 0;
    for (int i = 0; i < p.topk_group; ++i)
      for (int64_t e = s.groups[i] * per_group; e < (s.groups[i] + 1) * per_group; ++e)
        s.candidates[num_candidates++] = static_cast<int32_t>(e);
  }
  std::partial_sort(s.candidates.begin(), s.candidates.begin() + p.routed_k,
                    s.candidates.begin() + num_candidates, ByKeyThenIndex{s.keys.data()});
  for (int j = 0; j < p.routed_k; ++j) {
    ids[j] = s.candidates[j];
    w[j] = s.scores[s.candidates[j]];
  }
  finish_row(p, w, ids);
}

void fill_padded_rows(int64_t first_row, int64_t num_rows, int top_k, float* w, int32_t* ids) {
  for (int64_t t = first_row; t < num_rows; ++t)
    for (int j = 0; j < top_k; ++j) {
      w[t * top_k + j] = 0.0f;
      ids[t * top_k + j] = -1;
    }
}

Plan make_plan(const TopKConfig& c, int64_t num_experts) {
  Plan p;
  p.num_experts = num_experts;
  p.top_k = c.top_k;
  p.num_shared = c.num_fused_shared_experts;
  p.routed_k = c.top_k - c.num_fused_shared_experts;
  if (c.correction_bias.defined()) {
    p.bias = c.correction_bias.ptr<const float>();
    p.bias_stride = c.correction_bias.view().strides[0];
  }
  if (c.use_grouped_topk) {
    // sglang's grouped paths hard-code their scoring: grouped_topk softmax, biased sigmoid.
    p.selection = p.bias ? Selection::kBiasedGrouped : Selection::kGrouped;
    p.scoring = p.bias ? ScoringFunc::SIGMOID : ScoringFunc::SOFTMAX;
    p.num_groups = *c.num_expert_group;
    p.topk_group = *c.topk_group;
  } else {
    p.selection = Selection::kFlat;
    p.scoring = c.scoring_func;
  }
  p.renormalize = c.renormalize;
  p.routed_scaling = c.routed_scaling_factor.value_or(1.0f);
  p.scale_on_output = c.apply_routed_scaling_factor_on_output;
  p.shared_scale = c.fused_shared_experts_scaling_factor;
  return p;
}

void check_router_logits(const Tensor& logits) {
  MOECORE_CHECK(logits.defined(), "select_experts: expected router_logits [T, E], got None");
  MOECORE_CHECK(logits.ndim() == 2,
                "select_experts: expected router_logits of rank 2 [T, E], got ", logits.describe());
  MOECORE_CHECK_DTYPE(is_activation_dtype(logits.dtype()),
                      "select_experts: expected router_logits of dtype f32, f16 or bf16, got ",
                      logits.describe());
  // Strides mean nothing without elements (numpy reports [0, 0] for some empty arrays).
  MOECORE_CHECK(logits.numel() == 0 || logits.size(1) <= 1 || logits.view().strides[1] == 1,
                "select_experts: expected router_logits with a contiguous last dim (stride 1), "
                "got strides [",
                logits.view().strides[0], ", ", logits.view().strides[1], "]");
}

/// The first non-finite logit among rows [0, num_rows), in row-major order, or -1. The scan is
/// parallel, the answer is the smallest bad row, so the message does not depend on threads.
int64_t first_non_finite_row(const TensorView& logits, int64_t num_rows) {
  std::atomic<int64_t> bad_row{std::numeric_limits<int64_t>::max()};
  const int64_t E = logits.shape[1];
  parallel_for(num_rows, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end && t < bad_row.load(std::memory_order_relaxed); ++t) {
      const char* row = row_ptr(logits, t);
      for (int64_t e = 0; e < E; ++e) {
        if (!is_finite_value(row, logits.dtype, e)) {
          int64_t seen = bad_row.load();
          while (t < seen && !bad_row.compare_exchange_weak(seen, t)) {
          }
          break;
        }
      }
    }
  });
  const int64_t row = bad_row.load();
  return row == std::numeric_limits<int64_t>::max() ? -1 : row;
}

void check_finite_logits(const TensorView& logits, int64_t num_rows) {
  const int64_t t = first_non_finite_row(logits, num_rows);
  if (t < 0) return;
  const char* row = row_ptr(logits, t);
  int64_t e = 0;
  while (is_finite_value(row, logits.dtype, e)) ++e;
  float value;
  load_f32(row + e * dtype_size(logits.dtype), logits.dtype, 1, &value);
  MOECORE_THROW(InvalidArgument, "select_experts: expected finite router_logits, got ", value,
                " at [", t, ", ", e, "]");
}

/// Calls the user's routing function and copies its checked outputs into the new tensors.
void run_custom(const TopKConfig& c, const Tensor& hidden_states, const Tensor& logits,
                int64_t num_real_rows, Tensor& weights, Tensor& ids) {
  const int64_t T = logits.size(0);
  const int64_t num_ids = logits.size(1) + c.num_fused_shared_experts;
  std::pair<Tensor, Tensor> out =
      c.custom_routing_function(hidden_states, logits, c.top_k, c.renormalize);
  const std::vector<int64_t> expected = {T, c.top_k};
  const Tensor& w = out.first;
  const Tensor& i = out.second;
  MOECORE_CHECK(w.defined() && i.defined(),
                "select_experts: expected custom_routing_function to return (topk_weights, "
                "topk_ids), got ",
                w.describe(), " and ", i.describe());
  MOECORE_CHECK_DTYPE(w.dtype() == DType::kF32, "select_experts: expected custom_routing_function ",
                      "topk_weights of dtype f32, got ", w.describe());
  MOECORE_CHECK_DTYPE(i.dtype() == DType::kI32, "select_experts: expected custom_routing_function ",
                      "topk_ids of dtype i32, got ", i.describe());
  MOECORE_CHECK(w.view().shape_vector() == expected,
                "select_experts: expected custom_routing_function topk_weights of shape ",
                shape_string(expected), ", got ", w.describe());
  MOECORE_CHECK(i.view().shape_vector() == expected,
                "select_experts: expected custom_routing_function topk_ids of shape ",
                shape_string(expected), ", got ", i.describe());
  const TensorView& wv = w.view();
  const TensorView& iv = i.view();
  for (int64_t t = 0; t < num_real_rows; ++t)
    for (int j = 0; j < c.top_k; ++j) {
      const int32_t id = *static_cast<const int32_t*>(iv.at({t, j}));
      MOECORE_CHECK_INDEX(id >= 0 && id < num_ids,
                          "select_experts: expected custom_routing_function topk_ids in [0, ",
                          num_ids, "), got ", id, " at [", t, ", ", j, "]");
    }
  float* wd = weights.ptr<float>();
  int32_t* id_out = ids.ptr<int32_t>();
  for (int64_t t = 0; t < num_real_rows; ++t)
    for (int j = 0; j < c.top_k; ++j) {
      wd[t * c.top_k + j] = *static_cast<const float*>(wv.at({t, j}));
      id_out[t * c.top_k + j] = *static_cast<const int32_t*>(iv.at({t, j}));
    }
  fill_padded_rows(num_real_rows, T, c.top_k, wd, id_out);
}

}  // namespace

void validate_topk_config(const TopKConfig& c, int64_t num_experts) {
  MOECORE_CHECK(c.top_k >= 1, "select_experts: expected top_k >= 1, got ", c.top_k);
  MOECORE_CHECK(c.num_fused_shared_experts >= 0,
                "select_experts: expected num_fused_shared_experts >= 0, got ",
                c.num_fused_shared_experts);
  const int64_t routed_k = static_cast<int64_t>(c.top_k) - c.num_fused_shared_experts;
  MOECORE_CHECK(routed_k >= 1 && routed_k <= num_experts,
                "select_experts: expected routed top-k (top_k - num_fused_shared_experts = ",
                c.top_k, " - ", c.num_fused_shared_experts, ") in [1, ", num_experts,
                "] (E, the routed experts), got ", routed_k);
  if (c.use_grouped_topk) {
    MOECORE_CHECK(c.num_expert_group && c.topk_group,
                  "select_experts: expected num_expert_group and topk_group with "
                  "use_grouped_topk, got num_expert_group=",
                  optional_string(c.num_expert_group), ", topk_group=",
                  optional_string(c.topk_group));
    const int groups = *c.num_expert_group;
    MOECORE_CHECK(groups >= 1 && num_experts % groups == 0,
                  "select_experts: expected num_expert_group to divide E = ", num_experts,
                  ", got num_expert_group=", groups);
    MOECORE_CHECK(*c.topk_group >= 1 && *c.topk_group <= groups,
                  "select_experts: expected topk_group in [1, num_expert_group = ", groups,
                  "], got ", *c.topk_group);
    const int64_t per_group = num_experts / groups;
    MOECORE_CHECK(routed_k <= *c.topk_group * per_group,
                  "select_experts: expected routed top-k <= topk_group * experts per group = ",
                  *c.topk_group, " * ", per_group, ", got ", routed_k);
    MOECORE_CHECK(!c.correction_bias.defined() || per_group >= 2,
                  "select_experts: expected at least 2 experts per group for biased grouped "
                  "top-k (its group score sums the top 2), got E / num_expert_group = ",
                  per_group);
  }
  if (c.correction_bias.defined()) {
    const Tensor& b = c.correction_bias;
    MOECORE_CHECK_DTYPE(b.dtype() == DType::kF32,
                        "select_experts: expected correction_bias of dtype f32, got ",
                        b.describe());
    MOECORE_CHECK(b.ndim() == 1 && b.size(0) == num_experts,
                  "select_experts: expected correction_bias of shape [", num_experts, "], got ",
                  b.describe());
    for (int64_t e = 0; e < num_experts; ++e) {
      const float v = b.ptr<const float>()[e * b.view().strides[0]];
      MOECORE_CHECK(std::isfinite(v), "select_experts: expected finite correction_bias, got ", v,
                    " at [", e, "]");
    }
  }
  if (c.routed_scaling_factor) {
    const float r = *c.routed_scaling_factor;
    MOECORE_CHECK(std::isfinite(r) && r > 0.0f,
                  "select_experts: expected routed_scaling_factor finite and > 0, got ", r);
  }
  MOECORE_CHECK(!c.apply_routed_scaling_factor_on_output || c.routed_scaling_factor,
                "select_experts: expected routed_scaling_factor with "
                "apply_routed_scaling_factor_on_output=True, got None");
  if (c.fused_shared_experts_scaling_factor) {
    const float f = *c.fused_shared_experts_scaling_factor;
    MOECORE_CHECK(std::isfinite(f),
                  "select_experts: expected fused_shared_experts_scaling_factor finite, got ", f);
  }
  if (c.custom_routing_function && c.apply_routed_scaling_factor_on_output)
    MOECORE_UNSUPPORTED(
        "select_experts: expected apply_routed_scaling_factor_on_output=False with a "
        "custom_routing_function (sglang: \"Not implemented\"; the built-in paths support it), "
        "got True");
}

StandardTopKOutput select_experts(const Tensor& hidden_states, const Tensor& router_logits,
                                  const TopKConfig& config,
                                  std::optional<int64_t> num_token_non_padded) {
  check_router_logits(router_logits);
  const int64_t T = router_logits.size(0);
  const int64_t E = router_logits.size(1);
  validate_topk_config(config, E);
  MOECORE_CHECK(!hidden_states.defined() ||
                    (hidden_states.ndim() >= 1 && hidden_states.size(0) == T),
                "select_experts: expected hidden_states with T = ", T,
                " rows (one per router_logits row), got ", hidden_states.describe());
  const int64_t num_real_rows = num_token_non_padded.value_or(T);
  MOECORE_CHECK(num_real_rows >= 0 && num_real_rows <= T,
                "select_experts: expected num_token_non_padded in [0, T = ", T, "], got ",
                num_real_rows);

  Tensor weights = Tensor::empty({T, config.top_k}, DType::kF32);
  Tensor ids = Tensor::empty({T, config.top_k}, DType::kI32);
  if (config.custom_routing_function) {
    run_custom(config, hidden_states, router_logits, num_real_rows, weights, ids);
    return {weights, ids, router_logits};
  }
  check_finite_logits(router_logits.view(), num_real_rows);

  const Plan plan = make_plan(config, E);
  const TensorView& logits = router_logits.view();
  float* w = weights.ptr<float>();
  int32_t* id = ids.ptr<int32_t>();
  const int k = config.top_k;
  parallel_for(num_real_rows, [&](int64_t begin, int64_t end) {
    RowScratch scratch(plan);
    for (int64_t t = begin; t < end; ++t)
      route_row(plan, logits, t, scratch, w + t * k, id + t * k);
  });
  fill_padded_rows(num_real_rows, T, k, w, id);
  return {weights, ids, router_logits};
}

struct PreparedRouting::State {
  Plan plan;
  TensorView logits;
  float* weights = nullptr;
  int32_t* ids = nullptr;
  int64_t num_rows = 0;
  std::vector<RowScratch> scratch;  // one per part of the rows
};

PreparedRouting::PreparedRouting(const TopKConfig& config, const Tensor& router_logits,
                                 const Tensor& topk_weights, const Tensor& topk_ids)
    : logits_(router_logits), topk_weights_(topk_weights), topk_ids_(topk_ids) {
  if (config.custom_routing_function)
    MOECORE_UNSUPPORTED("select_experts: a custom routing function (a Python callable) cannot "
                        "be captured; capture with a top-k input instead");
  check_router_logits(router_logits);
  const int64_t T = router_logits.size(0), E = router_logits.size(1);
  validate_topk_config(config, E);
  const std::vector<int64_t> shape = {T, config.top_k};
  MOECORE_CHECK(topk_weights.defined() && topk_weights.dtype() == DType::kF32 &&
                    topk_weights.view().shape_vector() == shape &&
                    topk_weights.view().is_contiguous(),
                "select_experts: expected contiguous f32 topk_weights ", shape_string(shape),
                ", got ", topk_weights.describe());
  MOECORE_CHECK(topk_ids.defined() && topk_ids.dtype() == DType::kI32 &&
                    topk_ids.view().shape_vector() == shape && topk_ids.view().is_contiguous(),
                "select_experts: expected contiguous i32 topk_ids ", shape_string(shape), ", got ",
                topk_ids.describe());
  state_ = std::make_unique<State>();
  state_->plan = make_plan(config, E);
  state_->logits = router_logits.view();
  state_->weights = topk_weights.ptr<float>();
  state_->ids = topk_ids.ptr<int32_t>();
  state_->num_rows = T;
  state_->scratch.assign(static_cast<size_t>(ThreadPool::instance().num_threads()),
                         RowScratch(state_->plan));
}

PreparedRouting::~PreparedRouting() = default;

void PreparedRouting::run(int64_t num_token_non_padded) {
  State& s = *state_;
  MOECORE_CHECK(num_token_non_padded >= 0 && num_token_non_padded <= s.num_rows,
                "select_experts: expected num_token_non_padded in [0, T = ", s.num_rows,
                "], got ", num_token_non_padded);
  check_finite_logits(s.logits, num_token_non_padded);
  const int k = s.plan.top_k;
  const int64_t parts = static_cast<int64_t>(s.scratch.size());
  parallel_for(parts, [&](int64_t first_part, int64_t end_part) {
    for (int64_t part = first_part; part < end_part; ++part) {
      const int64_t begin = num_token_non_padded * part / parts;
      const int64_t end = num_token_non_padded * (part + 1) / parts;
      for (int64_t t = begin; t < end; ++t)
        route_row(s.plan, s.logits, t, s.scratch[part], s.weights + t * k, s.ids + t * k);
    }
  });
  fill_padded_rows(num_token_non_padded, s.num_rows, k, s.weights, s.ids);
}

}  // namespace moecore
