// Shared unquantized expert computation (see expert_compute.h). Validation happens before any
// output is touched; all loops have a static schedule and a fixed per-row reduction order.
#include "moecore/runner/expert_compute.h"

#include <algorithm>
#include <numeric>
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
  const bool same_shape = b.ndim() == static_cast<int>(shape.size()) &&
                          std::equal(shape.begin(), shape.end(), b.view().shape);
  MOECORE_CHECK(same_shape && b.view().is_contiguous(),
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
  MOECORE_CHECK(wts.ndim() == 2 && wts.size(0) == ids.size(0) && wts.size(1) == ids.size(1), api,
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

StandardTopKOutput prepared_topk(const TopKOutput& topk) {
  const TopKOutputFormat format = topk_output_format(topk);
  if (format != TopKOutputFormat::STANDARD)
    MOECORE_UNSUPPORTED("prepare: a ", topk_output_format_name(format),
                        " top-k output routes when it is read, so it cannot be captured; "
                        "capture a standard top-k output (or router logits)");
  return to_standard(topk);
}

int64_t max_padded_slots(int64_t slots, int64_t num_experts, int64_t block_m) {
  // Each expert pads fewer than block_m entries, and at most `slots` experts hold any.
  return slots + std::min(slots, num_experts) * (block_m - 1);
}

namespace {
// start[e] = first entry of expert e in the padded layout (start[E] = the total).
int64_t block_starts(const RoutedTokens& tokens, int64_t num_experts, int64_t block_m,
                     int64_t* start) {
  std::fill(start, start + num_experts + 1, 0);
  for (int64_t t = 0; t < tokens.num_tokens; ++t)
    for (int64_t j = 0; j < tokens.top_k; ++j) {
      const int32_t e = tokens.id(t, j);
      if (e >= 0) ++start[e + 1];
    }
  for (int64_t e = 0; e < num_experts; ++e)
    start[e + 1] = start[e] + (start[e + 1] + block_m - 1) / block_m * block_m;
  return start[num_experts];
}

// Fills the layout whose starts block_starts computed (start[] is used as the cursor).
void fill_block_layout(const RoutedTokens& tokens, int64_t num_experts, int64_t block_m,
                       int64_t* start, int32_t* sorted, int32_t* experts) {
  const int64_t total = start[num_experts];
  std::fill(sorted, sorted + total, static_cast<int32_t>(tokens.num_tokens * tokens.top_k));
  for (int64_t e = 0; e < num_experts; ++e)
    for (int64_t b = start[e] / block_m; b < start[e + 1] / block_m; ++b)
      experts[b] = static_cast<int32_t>(e);
  for (int64_t t = 0; t < tokens.num_tokens; ++t)
    for (int64_t j = 0; j < tokens.top_k; ++j) {
      const int32_t e = tokens.id(t, j);
      if (e >= 0) sorted[start[e]++] = static_cast<int32_t>(t * tokens.top_k + j);
    }
}
}  // namespace

BlockLayout align_block_size(const RoutedTokens& tokens, int64_t num_experts, int64_t block_m) {
  std::vector<int64_t> start(static_cast<size_t>(num_experts + 1));
  BlockLayout layout;
  layout.block_m = block_m;
  layout.num_tokens_post_padded = block_starts(tokens, num_experts, block_m, start.data());
  layout.sorted_token_ids = Tensor::empty({layout.num_tokens_post_padded}, DType::kI32);
  layout.expert_ids = Tensor::empty({layout.num_tokens_post_padded / block_m}, DType::kI32);
  fill_block_layout(tokens, num_experts, block_m, start.data(),
                    layout.sorted_token_ids.ptr<int32_t>(), layout.expert_ids.ptr<int32_t>());
  return layout;
}

int64_t align_block_size_into(const RoutedTokens& tokens, int64_t num_experts, int64_t block_m,
                              int32_t* sorted_token_ids, int32_t* expert_ids, int64_t* start) {
  const int64_t total = block_starts(tokens, num_experts, block_m, start);
  fill_block_layout(tokens, num_experts, block_m, start, sorted_token_ids, expert_ids);
  return total;
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

ExpertMlp dense_expert_mlp(const ExpertWeights& w, const ActivationSpec& spec, ScaledGemmFn gemm) {
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
  attach_weight_tiles(w.tiles, mlp);
  mlp.activation = spec;
  mlp.act_dtype = w.dtype;
  mlp.gemm = gemm;
  mlp.hidden = w.hidden;
  mlp.inter = w.inter;
  return mlp;
}

namespace {

// offsets[e + 1] holds expert e's count: prefix sums turn them into row offsets.
void counts_to_offsets(std::vector<int64_t>& offsets) {
  for (size_t e = 1; e < offsets.size(); ++e) offsets[e] += offsets[e - 1];
}

}  // namespace

void ExpertRowMap::slots_to_sources(const RoutedTokens& tokens, bool with_scale) {
  source.resize(dest.size());
  scale.resize(with_scale ? dest.size() : 0);
  for (size_t r = 0; r < dest.size(); ++r) {
    source[r] = dest[r] / tokens.top_k;
    if (with_scale) scale[r] = tokens.weight(source[r], dest[r] % tokens.top_k);
  }
}

void ExpertRowMap::group_slots(const RoutedTokens& tokens, int64_t num_experts, bool with_scale) {
  offsets.assign(static_cast<size_t>(num_experts + 1), 0);
  for (int64_t t = 0; t < tokens.num_tokens; ++t)
    for (int64_t j = 0; j < tokens.top_k; ++j) {
      const int32_t e = tokens.id(t, j);
      if (e >= 0) ++offsets[e + 1];
    }
  counts_to_offsets(offsets);
  dest.resize(static_cast<size_t>(rows()));
  // Counting sort with offsets[e] as expert e's cursor; afterwards offsets[e] is e's end, so
  // shifting by one restores the starts.
  for (int64_t t = 0; t < tokens.num_tokens; ++t)
    for (int64_t j = 0; j < tokens.top_k; ++j) {
      const int32_t e = tokens.id(t, j);
      if (e >= 0) dest[offsets[e]++] = t * tokens.top_k + j;
    }
  for (int64_t e = num_experts - 1; e >= 1; --e) offsets[e] = offsets[e - 1];
  offsets[0] = 0;
  slots_to_sources(tokens, with_scale);
}

void ExpertRowMap::from_block_layout(const int32_t* sorted_token_ids, const int32_t* expert_ids,
                                     int64_t num_blocks, int64_t block_m,
                                     const RoutedTokens& tokens, int64_t num_experts,
                                     bool with_scale) {
  offsets.assign(static_cast<size_t>(num_experts + 1), 0);
  dest.resize(static_cast<size_t>(num_blocks * block_m));
  const int64_t sentinel = tokens.num_tokens * tokens.top_k;
  int64_t count = 0;
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t e = expert_ids[b];
    MOECORE_CHECK_INDEX(e >= 0 && e < num_experts && (b == 0 || e >= expert_ids[b - 1]),
                        "expert_ids must be in [0, ", num_experts,
                        ") and non-decreasing (moe_align_block_size order), got ", e,
                        " at block ", b);
    const int64_t m = block_slots(sorted_token_ids, b, block_m, sentinel, dest.data() + count);
    offsets[e + 1] += m;
    count += m;
  }
  counts_to_offsets(offsets);
  dest.resize(static_cast<size_t>(count));
  slots_to_sources(tokens, with_scale);
}

void ExpertRowMap::sorted_rows(const int64_t* counts, int64_t num_experts) {
  offsets.assign(static_cast<size_t>(num_experts + 1), 0);
  std::copy(counts, counts + num_experts, offsets.begin() + 1);
  counts_to_offsets(offsets);
  source.resize(static_cast<size_t>(rows()));
  for (size_t r = 0; r < source.size(); ++r) source[r] = static_cast<int64_t>(r);
  dest = source;
  scale.clear();
}

void ExpertRowMap::reserve(int64_t max_rows, int64_t num_experts) {
  offsets.reserve(static_cast<size_t>(num_experts + 1));
  for (auto* v : {&source, &dest}) v->reserve(static_cast<size_t>(max_rows));
  scale.reserve(static_cast<size_t>(max_rows));
}

namespace {

// Weight bytes of one column block: small enough to stay in L2 while every row of its expert
// streams past it.
constexpr int64_t kBlockWeightBytes = 512 * 1024;
constexpr int64_t kColumnAlign = 16;  // block widths are whole 16-lane vectors

// Grows a buffer to at least n elements (never shrinks, so a steady state allocates nothing).
template <typename T>
T* grown(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// How many blocks plan_items cuts each hit expert's `columns` into, at most (their width rounds
// up to `align`): enough to fit L2 and, with `hit` experts hit, for `parts` threads all to work.
// The most when one expert is hit.
int64_t max_column_blocks(int64_t columns, int64_t column_bytes, int64_t align,
                          int64_t min_columns, int parts, int64_t hit) {
  const int64_t by_cache = ceil_div(columns * column_bytes, kBlockWeightBytes);
  const int64_t by_threads = hit > 0 ? ceil_div(2 * parts, hit) : 1;
  return std::min(std::max(by_cache, by_threads),
                  ceil_div(columns, std::max(align, min_columns)));
}

// Within each part, consecutive items of one expert whose columns follow on merge into one item.
void merge_part_runs(std::vector<ExpertWorkspace::Item>& items, std::vector<int64_t>& part_begin) {
  const size_t parts = part_begin.size() - 1;
  int64_t kept = 0;
  for (size_t p = 0; p < parts; ++p) {
    const int64_t first = part_begin[p], last = part_begin[p + 1];
    part_begin[p] = kept;
    for (int64_t i = first; i < last; ++i) {
      const ExpertWorkspace::Item item = items[static_cast<size_t>(i)];
      ExpertWorkspace::Item* previous = kept > part_begin[p] ? &items[kept - 1] : nullptr;
      if (previous != nullptr && previous->expert == item.expert &&
          previous->col + previous->cols == item.col)
        previous->cols += item.cols;
      else
        items[static_cast<size_t>(kept++)] = item;
    }
  }
  part_begin[parts] = kept;
  items.resize(static_cast<size_t>(kept));
}

// The work items of one GEMM of kernel row `gemm` over `columns` output columns (column_bytes
// weight bytes each): each hit expert's columns in equal blocks (multiples of `align`, and of at
// least min_columns where the columns allow), small enough for L2 and numerous enough that
// `parts` threads all work when few experts are hit; then part_begin cuts the items into `parts`
// contiguous runs of near-equal cost. When no expert has more rows than one pass of the row
// serves, each weight streams once per call whatever the call's width, so a part's consecutive
// blocks of one expert merge into one item: fewer, wider calls (a GPT-OSS-20B bf16 layer at
// M = 1 took 0.91× the time, one thread; bench/RESULTS.md). Returns the blocks' width (every
// block's but an expert's last, which may be narrower; a merged item spans whole blocks). Blocks
// and items only decide who computes an output, never how: no result changes.
int64_t plan_items(const ExpertRowMap& rows, ScaledGemmFn gemm, int64_t columns,
                   int64_t column_bytes, int64_t align, int parts,
                   std::vector<ExpertWorkspace::Item>& items, std::vector<int64_t>& part_begin) {
  int64_t hit = 0, most_rows = 0;
  for (int64_t e = 0; e < rows.num_experts(); ++e) {
    const int64_t m = rows.offsets[e + 1] - rows.offsets[e];
    hit += m > 0;
    most_rows = std::max(most_rows, m);
  }
  const int64_t blocks = max_column_blocks(columns, column_bytes, align,
                                           scaled_gemm_min_call_columns(gemm), parts, hit);
  const int64_t cols = ceil_div(ceil_div(columns, blocks), align) * align;
  items.clear();
  for (int64_t e = 0; e < rows.num_experts(); ++e) {
    if (rows.offsets[e + 1] == rows.offsets[e]) continue;
    for (int64_t c = 0; c < columns; c += cols)
      items.push_back({e, c, std::min(cols, columns - c)});
  }
  part_begin.resize(static_cast<size_t>(parts + 1));
  split_by_cost(
      static_cast<int64_t>(items.size()), parts,
      [&](int64_t i) {
        const ExpertWorkspace::Item& it = items[static_cast<size_t>(i)];
        return it.cols * (rows.offsets[it.expert + 1] - rows.offsets[it.expert] + kWeightRowCost);
      },
      part_begin.data());
  if (most_rows <= scaled_gemm_one_pass_rows(gemm)) merge_part_runs(items, part_begin);
  return cols;
}

// Weight bytes of one output column of `w` (one weight row).
int64_t weight_row_bytes(const WeightOperand& w) {
  return w.data.shape[2] * dtype_size(w.data.dtype);
}

// GEMM1 items cover activation columns; this is the column alignment their blocks need: whole
// 16-lane vectors, the interleave group of an interleaved layout (the whole row when I is not a
// multiple of it) and, when GEMM2's input is quantized in GEMM1's epilogue, its segments.
int64_t gemm1_column_align(const ExpertMlp& mlp, bool quantize_in_epilogue) {
  int64_t align = std::lcm(kColumnAlign, activation_column_align(mlp.activation));
  if (quantize_in_epilogue) align = std::lcm(align, mlp.gemm2.quantize_segment);
  return mlp.inter % align == 0 ? align : mlp.inter;
}

// A GEMM's epilogue on a block of m rows × cols columns (stride ld) of expert e's rows from r0,
// output columns [c0, c0 + cols): + bias, × the row's scale when `scale`, rounded to act_dtype.
// `bias` is cols floats of scratch.
void finish_block(const ExpertMlp& mlp, const ExpertGemm& g, const ExpertRowMap& rows, int64_t e,
                  int64_t r0, int64_t m, int64_t c0, int64_t cols, bool scale, float* block,
                  int64_t ld, float* bias) {
  const bool has_bias = g.bias.data != nullptr;
  if (has_bias) load_f32(g.bias.at({e, c0}), g.bias.dtype, cols, bias);
  for (int64_t r = 0; r < m; ++r) {
    float* row = block + r * ld;
    if (has_bias || scale) {
      const float row_scale = scale ? rows.scale[r0 + r] : 1.0f;
      for (int64_t c = 0; c < cols; ++c) {
        const float v = has_bias ? row[c] + bias[c] : row[c];
        row[c] = scale ? v * row_scale : v;
      }
    }
    round_in_place(row, cols, mlp.act_dtype);
  }
}

// A for_each_item tail that does nothing.
struct NoPartTail {
  void operator()(int64_t, int64_t) const {}
};

// Runs the planned items on the pool: body(part, item, codes) with `in` narrowed to the item's
// expert rows and pointed at the part's scratch; then tail(part, parts) on the part's thread.
template <typename Body, typename Tail = NoPartTail>
void for_each_item(const ActivationCodes& in, const ExpertRowMap& rows,
                   const std::vector<ExpertWorkspace::Item>& items,
                   const std::vector<int64_t>& part_begin, std::vector<GemmScratch>& scratch,
                   const Body& body, const Tail& tail = {}) {
  const int64_t parts = static_cast<int64_t>(part_begin.size()) - 1;
  if (static_cast<int64_t>(scratch.size()) < parts) scratch.resize(static_cast<size_t>(parts));
  parallel_for(parts, [&](int64_t first_part, int64_t end_part) {
    for (int64_t p = first_part; p < end_part; ++p) {
      for (int64_t i = part_begin[p]; i < part_begin[p + 1]; ++i) {
        ActivationCodes a = activation_rows_from(in, rows.offsets[items[i].expert]);
        a.scratch = &scratch[p];
        body(p, items[i], a);
      }
      tail(p, parts);
    }
  });
}

// The GEMM input codes of `count` stored rows [count, k] in place: quantized by the GEMM's
// quantizer (scales into `scales`; only rows with used[r] when `used` is given), or used as they
// are (values of act_dtype). Every quantizer emits fp8, fp4 or int8 code values, which bf16
// holds exactly, as it holds bf16 activations. quantized_already: the rows hold codes already.
ActivationCodes input_codes(const ExpertGemm& g, DType act_dtype, float* rows, int64_t count,
                            std::vector<float>& scales, bool quantized_already) {
  const int64_t k = g.weight.k;
  ActivationCodes codes;
  codes.codes = rows;
  codes.ld = k;
  codes.bf16_exact = g.quantize || act_dtype == DType::kBF16;
  if (!g.quantize) return codes;
  float* s = grown(scales, count * g.scales_per_row);
  if (!quantized_already)
    parallel_for(count, [&](int64_t begin, int64_t end) {
      g.quantize(rows + begin * k, end - begin, k, k, s + begin * g.scales_per_row);
    });
  codes.scales = s;
  codes.scales_per_row = g.scales_per_row;
  codes.integer = g.integer_codes;
  codes.bounded_codes = true;
  return codes;
}

int schedule_parts() { return ThreadPool::instance().num_threads(); }

// The most work items plan_items can make for a GEMM over num_experts experts.
int64_t max_items(const WeightOperand& w) {
  return w.num_experts * ceil_div(w.n, kColumnAlign);
}

}  // namespace

// GEMM2's (expert, H column block) items over ws.rows, planned at construction (GEMM2's input
// quantized first where GEMM1's epilogue did not): each computes its rows' block into the
// workspace's y rows, + b2 (× scale if kGemm2), rounded. Both forms of phase 2 run them, each
// with its own epilogue.
struct Gemm2Items {
  ExpertWorkspace& ws;
  ActivationCodes in;
  int64_t block_cols = 0;  // every block's width but an expert's last, which may be narrower

  Gemm2Items(const ExpertMlp& mlp, ExpertWorkspace& workspace) : ws(workspace) {
    const ExpertGemm& g2 = mlp.gemm2;
    const int64_t n = g2.weight.n;
    grown(ws.y_, ws.rows.rows() * n);
    const bool quantized_in_gemm1 = g2.quantize && g2.quantize_segment > 0;
    in = input_codes(g2, mlp.act_dtype, ws.h2_.data(), ws.rows.rows(), ws.scales2_,
                     quantized_in_gemm1);
    in.tag = new_activation_tag();
    block_cols = plan_items(ws.rows, mlp.gemm, n, weight_row_bytes(g2.weight), kColumnAlign,
                            schedule_parts(), ws.items_, ws.part_begin_);
  }

  const float* y() const { return ws.y_.data(); }

  // Runs the items: done(item) once the item's rows are final (y rows of GEMM2's N columns),
  // then tail(part, parts) after each part's items, on its thread.
  template <typename Done, typename Tail = NoPartTail>
  void run(const ExpertMlp& mlp, RowScaleAt scale_at, const Done& done,
           const Tail& tail = {}) {
    const ExpertGemm& g2 = mlp.gemm2;
    const ExpertRowMap& rows = ws.rows;
    const int64_t n = g2.weight.n;
    float* y = ws.y_.data();
    float* bias_rows = grown(ws.bias_, static_cast<int64_t>(ws.part_begin_.size() - 1) * n);
    for_each_item(
        in, rows, ws.items_, ws.part_begin_, ws.scratch_,
        [&](int64_t part, const ExpertWorkspace::Item& item, const ActivationCodes& a) {
          const auto [e, c0, cols] = item;
          const int64_t r0 = rows.offsets[e], m = rows.offsets[e + 1] - r0;
          float* block = y + r0 * n + c0;
          mlp.gemm(a, m, g2.weight, e, c0, cols, block, n);
          finish_block(mlp, g2, rows, e, r0, m, c0, cols, scale_at == RowScaleAt::kGemm2, block,
                       n, bias_rows + part * n);
          done(item);
        },
        tail);
  }

  // The workspace's per-(token, block) counters, grown to at least `count`.
  static std::atomic<int32_t>* pending_rows(ExpertWorkspace& ws, int64_t count) {
    if (ws.pending_rows_size_ < count) {
      ws.pending_rows_ = std::make_unique<std::atomic<int32_t>[]>(static_cast<size_t>(count));
      ws.pending_rows_size_ = count;
    }
    return ws.pending_rows_.get();
  }
};

void ExpertWorkspace::reserve(const ExpertMlp& mlp, int64_t max_rows) {
  const int64_t parts = schedule_parts();
  const WeightOperand& w1 = mlp.gemm1.weight;
  const WeightOperand& w2 = mlp.gemm2.weight;
  rows.reserve(max_rows, w1.num_experts);
  grown(a_, max_rows * mlp.hidden);  // stored source rows: at most one per token ≤ max_rows
  grown(source_used_, max_rows);
  grown(slot_row_, max_rows);
  grown(h1_, max_rows * w1.n);
  grown(h2_, max_rows * mlp.inter);
  grown(y_, max_rows * mlp.hidden);
  grown(scales1_, max_rows * mlp.gemm1.scales_per_row);
  grown(scales2_, max_rows * mlp.gemm2.scales_per_row);
  grown(bias_, parts * std::max(w1.n, w2.n));
  // Backends reserve T·k rows for calls of T tokens; GEMM2 cuts its columns into at most this
  // many blocks.
  Gemm2Items::pending_rows(
      *this, max_rows * max_column_blocks(w2.n, weight_row_bytes(w2), kColumnAlign,
                                          scaled_gemm_min_call_columns(mlp.gemm), parts, 1));
  items_.reserve(static_cast<size_t>(std::max(max_items(w1), max_items(w2))));
  part_begin_.reserve(static_cast<size_t>(parts + 1));
  if (static_cast<int64_t>(scratch_.size()) < parts) scratch_.resize(static_cast<size_t>(parts));
  const size_t bytes =
      std::max(gemm_scratch_bytes(mlp.gemm, w1), gemm_scratch_bytes(mlp.gemm, w2));
  for (GemmScratch& s : scratch_) s.grow(bytes);
}

void expert_gemm1_phase(const ExpertMlp& mlp, ExpertWorkspace& ws, SourceRowFn load,
                        RowScaleAt scale_at) {
  const ExpertRowMap& rows = ws.rows;
  const ExpertGemm& g1 = mlp.gemm1;
  const ExpertGemm& g2 = mlp.gemm2;
  const int64_t count = rows.rows(), h = mlp.hidden, n1 = g1.weight.n, inter = mlp.inter;
  // Source rows by index: each one the call reads is loaded and quantized once.
  int64_t sources = 0;
  for (int64_t r = 0; r < count; ++r) sources = std::max(sources, rows.source[r] + 1);
  uint8_t* used = grown(ws.source_used_, sources);
  std::fill(used, used + sources, uint8_t{0});
  for (int64_t r = 0; r < count; ++r) used[rows.source[r]] = 1;
  float* stored = grown(ws.a_, sources * h);
  float* s1 = g1.quantize ? grown(ws.scales1_, sources * g1.scales_per_row) : nullptr;
  parallel_for(sources, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      if (!used[s]) continue;
      load(s, stored + s * h);
      if (g1.quantize) g1.quantize(stored + s * h, 1, h, h, s1 + s * g1.scales_per_row);
    }
  });
  ActivationCodes in = input_codes(g1, mlp.act_dtype, stored, sources, ws.scales1_,
                                   /*quantized_already=*/true);
  in.row_index = rows.source.data();
  in.tag = new_activation_tag();

  float* h1 = grown(ws.h1_, count * n1);
  float* h2 = grown(ws.h2_, count * inter);
  const bool quantize2 = g2.quantize && g2.quantize_segment > 0;
  float* s2 = quantize2 ? grown(ws.scales2_, count * g2.scales_per_row) : nullptr;
  ActivationSpec rounded = mlp.activation;
  rounded.round_dtype = mlp.act_dtype;
  auto expert_spec = [&](int64_t e) {
    if (mlp.expert_alpha.data == nullptr) return rounded;
    ActivationSpec spec = rounded;
    spec.alpha = mlp.expert_alpha.ptr<float>()[e];
    spec.beta = mlp.expert_beta.ptr<float>()[e];
    spec.clamp_limit = mlp.expert_limit.ptr<float>()[e];
    return spec;
  };
  const ActivationFn activate = activation_kernel(scaled_gemm_kernel_level(mlp.gemm));
  const int64_t w1_bytes = weight_row_bytes(g1.weight) * (n1 / inter);
  plan_items(rows, mlp.gemm, inter, w1_bytes, gemm1_column_align(mlp, quantize2), schedule_parts(),
             ws.items_, ws.part_begin_);
  float* bias_rows = grown(ws.bias_, static_cast<int64_t>(ws.part_begin_.size() - 1) * n1);
  for_each_item(
      in, rows, ws.items_, ws.part_begin_, ws.scratch_,
      [&](int64_t part, const ExpertWorkspace::Item& item, const ActivationCodes& a) {
        const auto [e, col0, cols] = item;
        if (mlp.check_gemm1_item) mlp.check_gemm1_item(e, col0, cols);
        const int64_t r0 = rows.offsets[e], m = rows.offsets[e + 1] - r0;
        float* block = h1 + r0 * n1;
        for (const ColumnSpan& span : activation_gemm1_spans(mlp.activation, inter, col0, cols)) {
          if (span.size == 0) continue;
          mlp.gemm(a, m, g1.weight, e, span.begin, span.size, block + span.begin, n1);
          finish_block(mlp, g1, rows, e, r0, m, span.begin, span.size,
                       scale_at == RowScaleAt::kGemm1, block + span.begin, n1,
                       bias_rows + part * n1);
        }
        float* act = h2 + r0 * inter + col0;
        activate(expert_spec(e), block, n1, act, inter, m, inter, col0, cols);
        if (!quantize2) return;
        // A rule with one scale per row writes the same scale from every block of the row: the
        // row's first block stores it, the others write a scale of their own (no shared write).
        const bool one_scale = g2.scales_per_row == 1;
        float discarded;
        for (int64_t r = 0; r < m; ++r) {
          float* scales = s2 + (r0 + r) * g2.scales_per_row;
          float* mine = !one_scale  ? scales + col0 / g2.quantize_segment
                        : col0 == 0 ? scales
                                    : &discarded;
          g2.quantize(act + r * inter, 1, cols, inter, mine);
        }
      });
}

const float* expert_activations(const ExpertWorkspace& ws) { return ws.h2_.data(); }

void expert_gemm2_phase(const ExpertMlp& mlp, ExpertWorkspace& ws, RowScaleAt scale_at,
                        const TensorView& out) {
  const ExpertRowMap& rows = ws.rows;
  const int64_t n = mlp.gemm2.weight.n;
  Gemm2Items items(mlp, ws);
  items.run(mlp, scale_at, [&](const ExpertWorkspace::Item& item) {
    if (out.data == nullptr) return;
    const auto [e, c0, cols] = item;
    for (int64_t r = rows.offsets[e]; r < rows.offsets[e + 1]; ++r)
      store_f32(items.y() + r * n + c0, cols, mlp.act_dtype, out.at({rows.dest[r], c0}));
  });
}

namespace {

constexpr int64_t kCombineChunk = 512;  // hidden elements per stack chunk of the combine

// The combine's arithmetic for token t's columns [h0, h0 + width ≤ kCombineChunk):
// out[t] = round(rsf · Σ_j v[t, j] (× w[t, j] if weighted)) over slots j with id ≥ 0 in
// increasing j, in fp32 (each element's sum is independent, so any column range gives the same
// bits). slot(t, j, h0, width, buf) gives slot (t, j)'s values [h0, h0 + width), written into buf
// when they need converting.
template <typename SlotValues>
void sum_token_columns(const RoutedTokens& tokens, int64_t t, int64_t h0, int64_t width,
                       bool weighted, float rsf, const TensorView& out, const SlotValues& slot) {
  float acc[kCombineChunk], buf[kCombineChunk];
  std::fill(acc, acc + width, 0.0f);
  for (int64_t j = 0; j < tokens.top_k; ++j) {
    if (tokens.id(t, j) < 0) continue;
    const float* v = slot(t, j, h0, width, buf);
    const float w = weighted ? tokens.weight(t, j) : 1.0f;
    for (int64_t h = 0; h < width; ++h) acc[h] += weighted ? v[h] * w : v[h];
  }
  for (int64_t h = 0; h < width; ++h) acc[h] *= rsf;
  store_f32(acc, width, out.dtype, out.at({t, h0}));
}

// The same over columns [c0, c1) of token t, in chunks.
template <typename SlotValues>
void sum_token_span(const RoutedTokens& tokens, int64_t t, int64_t c0, int64_t c1, bool weighted,
                    float rsf, const TensorView& out, const SlotValues& slot) {
  for (int64_t h0 = c0; h0 < c1; h0 += kCombineChunk)
    sum_token_columns(tokens, t, h0, std::min(kCombineChunk, c1 - h0), weighted, rsf, out, slot);
}

// The combine over every token, in parallel over tokens.
template <typename SlotValues>
void sum_top_k(const RoutedTokens& tokens, bool weighted, float rsf, const TensorView& out,
               const SlotValues& slot) {
  parallel_for(tokens.num_tokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      sum_token_span(tokens, t, 0, out.shape[1], weighted, rsf, out, slot);
  });
}

}  // namespace

void expert_gemm2_summed_phase(const ExpertMlp& mlp, ExpertWorkspace& ws, RowScaleAt scale_at,
                               const TopkSum& sum) {
  const RoutedTokens& tokens = *sum.tokens;
  const ExpertRowMap& rows = ws.rows;
  const int64_t n = mlp.gemm2.weight.n, k = tokens.top_k, num_tokens = tokens.num_tokens;
  int64_t* slot_row = grown(ws.slot_row_, num_tokens * k);
  std::fill(slot_row, slot_row + num_tokens * k, int64_t{-1});
  for (int64_t r = 0; r < rows.rows(); ++r) slot_row[rows.dest[r]] = r;
  auto rows_of = [&](int64_t t) {
    int32_t count = 0;
    for (int64_t j = 0; j < k; ++j) count += slot_row[t * k + j] >= 0;
    return count;
  };

  Gemm2Items items(mlp, ws);
  const int64_t blocks = ceil_div(n, items.block_cols);
  std::atomic<int32_t>* pending = Gemm2Items::pending_rows(ws, num_tokens * blocks);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int32_t count = rows_of(t);
    for (int64_t b = 0; b < blocks; ++b)
      pending[t * blocks + b].store(count, std::memory_order_relaxed);
  }  // (published to the items' threads by the pool's hand-off)
  const float* y = items.y();
  auto slot = [&](int64_t t, int64_t j, int64_t h0, int64_t width, float* buf) -> const float* {
    const int64_t r = slot_row[t * k + j];
    if (r < 0) {
      std::fill(buf, buf + width, 0.0f);  // the zeros a stored slot row would hold
      return buf;
    }
    if (sum.bias.data == nullptr) return y + r * n + h0;
    load_f32(sum.bias.at({tokens.id(t, j), h0}), sum.bias.dtype, width, buf);
    for (int64_t h = 0; h < width; ++h) buf[h] += y[r * n + h0 + h];
    return buf;
  };
  const int64_t width = sum.out.shape[1];  // ≤ n: the columns the sum writes
  items.run(
      mlp, scale_at,
      [&](const ExpertWorkspace::Item& item) {
        for (int64_t c0 = item.col; c0 < item.col + item.cols; c0 += items.block_cols) {
          const int64_t b = c0 / items.block_cols, c1 = std::min(c0 + items.block_cols, width);
          for (int64_t r = rows.offsets[item.expert]; r < rows.offsets[item.expert + 1]; ++r) {
            const int64_t t = rows.dest[r] / k;
            // acq_rel: the item that finishes the token's last row of the block sees every other
            // item's rows of it, and sums them.
            if (pending[t * blocks + b].fetch_sub(1, std::memory_order_acq_rel) == 1)
              sum_token_span(tokens, t, c0, c1, sum.weighted, sum.routed_scaling_factor, sum.out,
                             slot);
          }
        }
      },
      [&](int64_t part, int64_t parts) {  // tokens with no row: their zeros, a share per part
        for (int64_t t = num_tokens * part / parts; t < num_tokens * (part + 1) / parts; ++t)
          if (rows_of(t) == 0)
            sum_token_span(tokens, t, 0, width, sum.weighted, sum.routed_scaling_factor, sum.out,
                           slot);
      });
}

void run_expert_mlp(const ExpertMlp& mlp, ExpertWorkspace& ws, SourceRowFn load,
                    RowScaleAt scale_at, const TensorView& out) {
  expert_gemm1_phase(mlp, ws, load, scale_at);
  expert_gemm2_phase(mlp, ws, scale_at, out);
}

TensorView slot_rows(const TensorView& slots) {
  MOECORE_INTERNAL_CHECK(slots.ndim == 3 && slots.is_contiguous(),
                         "slot outputs must be contiguous [T, k, H], got ", slots.describe());
  TensorView rows = slots;
  rows.ndim = 2;
  rows.shape[0] = slots.shape[0] * slots.shape[1];
  rows.shape[1] = slots.shape[2];
  rows.strides[0] = slots.shape[2];
  rows.strides[1] = 1;
  return rows;
}

void combine_topk(const RoutedTokens& tokens, const TensorView& slot_out, bool weighted, float rsf,
                  const TensorView& out) {
  sum_top_k(tokens, weighted, rsf, out,
            [&](int64_t t, int64_t j, int64_t h0, int64_t width, float* buf) -> const float* {
              load_f32(slot_out.at({t, j, h0}), slot_out.dtype, width, buf);
              return buf;
            });
}

void weight_slots(const RoutedTokens& tokens, const TensorView& slot_out) {
  const int64_t hidden = slot_out.shape[2];
  parallel_for(tokens.num_tokens, [&](int64_t begin, int64_t end) {
    float row[kCombineChunk];
    for (int64_t t = begin; t < end; ++t)
      for (int64_t j = 0; j < tokens.top_k; ++j) {
        if (tokens.id(t, j) < 0) continue;
        const float w = tokens.weight(t, j);
        for (int64_t h0 = 0; h0 < hidden; h0 += kCombineChunk) {
          const int64_t width = std::min(kCombineChunk, hidden - h0);
          void* slot = slot_out.at({t, j, h0});
          load_f32(slot, slot_out.dtype, width, row);
          for (int64_t h = 0; h < width; ++h) row[h] *= w;
          store_f32(row, width, slot_out.dtype, slot);
        }
      }
  });
}

}  // namespace moecore
