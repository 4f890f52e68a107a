// Shared unquantized expert computation (see expert_compute.h). Validation happens before any
// output is touched; all loops have a static schedule and a fixed per-row reduction order.
#include "moecore/runner/expert_compute.h"

#include <algorithm>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/core/thread_pool.h"
#include "moecore/kernels/convert.h"

namespace moecore {
namespace {

void check_optional_bias(const char* api, const char* name, const Tensor& b,
                         std::initializer_list<int64_t> shape) {
  if (!b.defined()) return;
  MOECORE_CHECK_DTYPE(is_activation_dtype(b.dtype()), api, ": ", name,
                      " must be f32, f16 or bf16, got ", b.describe());
  MOECORE_CHECK(b.view().shape_vector() == std::vector<int64_t>(shape) && b.view().is_contiguous(),
                api, ": expected contiguous ", name, " ", shape_string(shape), ", got ",
                b.describe());
}

}  // namespace

ExpertWeights check_expert_weights(const char* api, const Tensor& w13, const Tensor& w2,
                                   const Tensor& b13, const Tensor& b2, bool gated) {
  MOECORE_CHECK(w13.defined() && w2.defined(), api, ": w13_weight and w2_weight are required");
  MOECORE_CHECK_DTYPE(is_activation_dtype(w13.dtype()), api,
                      ": unquantized w13_weight must be f32, f16 or bf16, got ", w13.describe());
  MOECORE_CHECK_DTYPE(w2.dtype() == w13.dtype(), api, ": w2_weight dtype must equal w13_weight's (",
                      dtype_name(w13.dtype()), "), got ", w2.describe());
  MOECORE_CHECK(w13.ndim() == 3 && w2.ndim() == 3, api,
                ": expected w13_weight [E, 2I, H] and w2_weight [E, H, I], got ", w13.describe(),
                " and ", w2.describe());
  MOECORE_CHECK(w13.view().is_contiguous() && w2.view().is_contiguous(), api,
                ": expert weights must be contiguous");
  ExpertWeights w;
  w.num_experts = w13.size(0);
  w.n1 = w13.size(1);
  w.hidden = w13.size(2);
  w.inter = w2.size(2);
  w.dtype = w13.dtype();
  MOECORE_CHECK(w2.size(0) == w.num_experts && w2.size(1) == w.hidden, api,
                ": w2_weight must be [E, H, I] = [", w.num_experts, ", ", w.hidden,
                ", I], got ", w2.describe());
  MOECORE_CHECK(w.n1 == (gated ? 2 : 1) * w.inter, api, ": w13_weight rows must be ",
                gated ? "2·I" : "I", " (is_gated=", gated ? "True" : "False", ", I=", w.inter,
                "), got ", w13.describe());
  MOECORE_CHECK(w.num_experts > 0 && w.hidden > 0 && w.inter > 0, api,
                ": expected E, H, I > 0, got w13 ", w13.describe(), ", w2 ", w2.describe());
  check_optional_bias(api, "b13", b13, {w.num_experts, w.n1});
  check_optional_bias(api, "b2", b2, {w.num_experts, w.hidden});
  w.w13 = w13.view();
  w.w2 = w2.view();
  if (b13.defined()) w.b13 = b13.view();
  if (b2.defined()) w.b2 = b2.view();
  return w;
}

namespace {
int64_t raw_id(const TensorView& ids, int64_t t, int64_t j) {
  const int64_t off = t * ids.strides[0] + j * ids.strides[1];
  return ids.dtype == DType::kI32 ? ids.ptr<int32_t>()[off] : ids.ptr<int64_t>()[off];
}
}  // namespace

int32_t RoutedTokens::id(int64_t t, int64_t j) const {
  return static_cast<int32_t>(raw_id(topk_ids, t, j));  // validated to [-1, E) on entry
}

float RoutedTokens::weight(int64_t t, int64_t j) const {
  return topk_weights.ptr<float>()[t * topk_weights.strides[0] + j * topk_weights.strides[1]];
}

RoutedTokens check_routed_tokens(const char* api, const Tensor& x, const StandardTopKOutput& topk,
                                 const ExpertWeights& w) {
  MOECORE_CHECK(x.defined(), api, ": hidden_states is required");
  MOECORE_CHECK_DTYPE(x.dtype() == w.dtype, api, ": hidden_states dtype must equal the weights' (",
                      dtype_name(w.dtype), "), got ", x.describe());
  MOECORE_CHECK(x.ndim() == 2 && x.size(1) == w.hidden, api,
                ": expected hidden_states [T, ", w.hidden, "], got ", x.describe());
  MOECORE_CHECK(x.view().rows_contiguous(), api,
                ": hidden_states rows must be contiguous (inner stride 1)");
  const Tensor& ids = topk.topk_ids;
  const Tensor& wts = topk.topk_weights;
  MOECORE_CHECK(ids.defined() && wts.defined(), api, ": topk_ids and topk_weights are required");
  MOECORE_CHECK_DTYPE(ids.dtype() == DType::kI32 || ids.dtype() == DType::kI64, api,
                      ": topk_ids must be int32 or int64, got ", ids.describe());
  MOECORE_CHECK_DTYPE(wts.dtype() == DType::kF32, api, ": topk_weights must be float32, got ",
                      wts.describe());
  MOECORE_CHECK(ids.ndim() == 2 && ids.size(0) == x.size(0), api, ": expected topk_ids [",
                x.size(0), ", k], got ", ids.describe());
  MOECORE_CHECK(wts.view().shape_vector() == ids.view().shape_vector(), api,
                ": topk_weights shape must equal topk_ids', got ", wts.describe(), " and ",
                ids.describe());
  MOECORE_CHECK(ids.size(1) >= 1, api, ": expected top_k >= 1, got ", ids.size(1));
  RoutedTokens r;
  r.x = x.view();
  r.topk_ids = ids.view();
  r.topk_weights = wts.view();
  r.num_tokens = x.size(0);
  r.top_k = ids.size(1);
  for (int64_t t = 0; t < r.num_tokens; ++t)
    for (int64_t j = 0; j < r.top_k; ++j) {
      const int64_t e = raw_id(r.topk_ids, t, j);
      MOECORE_CHECK_INDEX(e >= -1 && e < w.num_experts, api, ": topk_ids must be in [-1, ",
                          w.num_experts, "), got ", e, " at [", t, ", ", j, "]");
    }
  return r;
}

BlockLayout align_block_size(const RoutedTokens& tokens, int64_t num_experts, int64_t block_m) {
  std::vector<int64_t> counts(num_experts, 0);
  for (int64_t t = 0; t < tokens.num_tokens; ++t)
    for (int64_t j = 0; j < tokens.top_k; ++j) {
      const int32_t e = tokens.id(t, j);
      if (e >= 0) ++counts[e];
    }
  std::vector<int64_t> start(num_experts + 1, 0);
  for (int64_t e = 0; e < num_experts; ++e)
    start[e + 1] = start[e] + (counts[e] + block_m - 1) / block_m * block_m;
  BlockLayout layout;
  layout.block_m = block_m;
  layout.num_tokens_post_padded = start[num_experts];
  layout.sorted_token_ids = Tensor::empty({layout.num_tokens_post_padded}, DType::kI32);
  layout.expert_ids = Tensor::empty({layout.num_tokens_post_padded / block_m}, DType::kI32);
  int32_t* sorted = layout.sorted_token_ids.ptr<int32_t>();
  int32_t* experts = layout.expert_ids.ptr<int32_t>();
  std::fill(sorted, sorted + layout.num_tokens_post_padded,
            static_cast<int32_t>(tokens.num_tokens * tokens.top_k));
  std::vector<int64_t> cursor(start.begin(), start.end() - 1);
  for (int64_t t = 0; t < tokens.num_tokens; ++t)
    for (int64_t j = 0; j < tokens.top_k; ++j) {
      const int32_t e = tokens.id(t, j);
      if (e >= 0) sorted[cursor[e]++] = static_cast<int32_t>(t * tokens.top_k + j);
    }
  for (int64_t e = 0; e < num_experts; ++e)
    for (int64_t b = start[e] / block_m; b < start[e + 1] / block_m; ++b)
      experts[b] = static_cast<int32_t>(e);
  return layout;
}

int64_t block_slots(const int32_t* sorted_token_ids, int64_t block, int64_t block_m,
                    int64_t sentinel, int64_t* slots) {
  int64_t m = 0;
  for (int64_t r = 0; r < block_m; ++r) {
    const int64_t s = sorted_token_ids[block * block_m + r];
    if (s < sentinel) slots[m++] = s;
  }
  return m;
}

SortedLayout sort_by_expert(const RoutedTokens& tokens, int64_t num_experts) {
  SortedLayout layout;
  layout.tokens_per_expert = Tensor::zeros({num_experts}, DType::kI64);
  int64_t* counts = layout.tokens_per_expert.ptr<int64_t>();
  int64_t valid = 0;
  for (int64_t t = 0; t < tokens.num_tokens; ++t)
    for (int64_t j = 0; j < tokens.top_k; ++j) {
      const int32_t e = tokens.id(t, j);
      if (e >= 0) ++counts[e], ++valid;
    }
  std::vector<int64_t> cursor(num_experts, 0);
  for (int64_t e = 1; e < num_experts; ++e) cursor[e] = cursor[e - 1] + counts[e - 1];
  layout.idxs = Tensor::empty({valid}, DType::kI64);
  int64_t* idxs = layout.idxs.ptr<int64_t>();
  for (int64_t t = 0; t < tokens.num_tokens; ++t)
    for (int64_t j = 0; j < tokens.top_k; ++j) {
      const int32_t e = tokens.id(t, j);
      if (e >= 0) idxs[cursor[e]++] = t * tokens.top_k + j;
    }
  return layout;
}

ExpertMlp dense_expert_mlp(const ExpertWeights& w, const ActivationSpec& spec, GemmRowsFn gemm) {
  auto operand = [&](const TensorView& data, int64_t n, int64_t k) {
    WeightOperand op;
    op.coding = WeightCoding::kDense;
    op.data = data;
    op.num_experts = w.num_experts;
    op.n = n;
    op.k = k;
    return op;
  };
  ExpertMlp mlp;
  mlp.gemm1.weight = operand(w.w13, w.n1, w.hidden);
  mlp.gemm1.bias = w.b13;
  mlp.gemm2.weight = operand(w.w2, w.hidden, w.inter);
  mlp.gemm2.bias = w.b2;
  mlp.activation = spec;
  mlp.act_dtype = w.dtype;
  mlp.gemm = gemm;
  mlp.hidden = w.hidden;
  mlp.inter = w.inter;
  return mlp;
}

void run_expert_gemm(const ExpertGemm& g, GemmRowsFn gemm, int64_t expert, const float* in,
                     int64_t m, float* out) {
  thread_local std::vector<float> scratch, scales;
  const int64_t k = g.weight.k;
  ActivationCodes codes;
  codes.codes = in;
  codes.ld = k;
  if (g.quantize) {
    scratch.assign(in, in + m * k);
    scales.resize(static_cast<size_t>(m * g.scales_per_row));
    g.quantize(scratch.data(), m, k, k, scales.data());
    codes.codes = scratch.data();
    codes.scales = scales.data();
    codes.scales_per_row = g.scales_per_row;
    codes.integer = g.integer_codes;
  }
  scaled_gemm(codes, m, g.weight, expert, 0, g.weight.n, gemm, out, g.weight.n);
}

void expert_epilogue(float* rows, int64_t m, int64_t width, const TensorView& bias,
                     int64_t expert, const float* row_scale, bool scale, DType act_dtype) {
  thread_local std::vector<float> bias_row;
  const bool has_bias = bias.data != nullptr;
  if (has_bias) {
    bias_row.resize(static_cast<size_t>(width));
    load_f32(bias.at({expert, 0}), bias.dtype, width, bias_row.data());
  }
  for (int64_t r = 0; r < m; ++r) {
    float* row = rows + r * width;
    for (int64_t c = 0; c < width; ++c) {
      float v = has_bias ? row[c] + bias_row[c] : row[c];
      if (scale) v *= row_scale[r];
      row[c] = round_to(act_dtype, v);
    }
  }
}

void expert_mlp(const ExpertMlp& mlp, int64_t expert, const float* a, int64_t m,
                const float* row_scale, RowScaleAt scale_at, float* y) {
  thread_local std::vector<float> h1, h2;
  const int64_t n1 = mlp.gemm1.weight.n;
  h1.resize(static_cast<size_t>(m * n1));
  h2.resize(static_cast<size_t>(m * mlp.inter));

  run_expert_gemm(mlp.gemm1, mlp.gemm, expert, a, m, h1.data());
  expert_epilogue(h1.data(), m, n1, mlp.gemm1.bias, expert, row_scale,
                  scale_at == RowScaleAt::kGemm1, mlp.act_dtype);

  ActivationSpec rounded = mlp.activation;
  rounded.round_dtype = mlp.act_dtype;
  apply_activation(rounded, h1.data(), n1, h2.data(), mlp.inter, m, mlp.inter);

  run_expert_gemm(mlp.gemm2, mlp.gemm, expert, h2.data(), m, y);
  expert_epilogue(y, m, mlp.hidden, mlp.gemm2.bias, expert, row_scale,
                  scale_at == RowScaleAt::kGemm2, mlp.act_dtype);
}

void combine_topk(const RoutedTokens& tokens, const TensorView& slot_out, bool weighted, float rsf,
                  const TensorView& out) {
  const int64_t hidden = out.shape[1];
  parallel_for(tokens.num_tokens, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(hidden), row(hidden);
    for (int64_t t = begin; t < end; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < tokens.top_k; ++j) {
        if (tokens.id(t, j) < 0) continue;
        load_f32(slot_out.at({t, j, 0}), slot_out.dtype, hidden, row.data());
        const float w = weighted ? tokens.weight(t, j) : 1.0f;
        for (int64_t h = 0; h < hidden; ++h) acc[h] += weighted ? row[h] * w : row[h];
      }
      for (int64_t h = 0; h < hidden; ++h) acc[h] *= rsf;
      store_f32(acc.data(), hidden, out.dtype, out.at({t, 0}));
    }
  });
}

void weight_slots(const RoutedTokens& tokens, const TensorView& slot_out) {
  const int64_t hidden = slot_out.shape[2];
  parallel_for(tokens.num_tokens, [&](int64_t begin, int64_t end) {
    std::vector<float> row(hidden);
    for (int64_t t = begin; t < end; ++t)
      for (int64_t j = 0; j < tokens.top_k; ++j) {
        if (tokens.id(t, j) < 0) continue;
        void* slot = slot_out.at({t, j, 0});
        load_f32(slot, slot_out.dtype, hidden, row.data());
        const float w = tokens.weight(t, j);
        for (float& v : row) v *= w;
        store_f32(row.data(), hidden, slot_out.dtype, slot);
      }
  });
}

}  // namespace moecore
