// Prepared runs of flashinfer_cutlass (bf16, fp8, fp4; float, swizzled and linear NVFP4 inputs;
// bypassed top-k) and flashinfer_cutedsl (v2 on standard and flashinfer dispatch outputs, v1
// masked with bf16 and NVFP4 payloads): prepared once, each run() over new contents equals a
// fresh eager MoeRunner::run bit for bit without a heap allocation; bad contents throw what eager
// throws and write nothing; every registered FlashInfer prepared run has a case here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <typeinfo>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/formats/fp8.h"
#include "moecore/formats/layout.h"
#include "moecore/formats/quantize.h"
#include "moecore/runner/backends/flashinfer_moe_common.h"
#include "moecore/runner/runner.h"
#include "support/counting_allocator.h"
#include "support/moe_problem.h"

namespace moecore {
namespace {

using testing::count_allocations;
using testing::random_tensor;

// ---------------------------------------------------------------------------------------------
// Contents, rewritten in place (shapes never change between runs).

void fill_normal(std::mt19937& rng, const Tensor& t, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> values(static_cast<size_t>(t.numel()));
  for (float& v : values) v = dist(rng);
  store_f32(values.data(), t.numel(), t.dtype(), t.view().data);
}

// Every storage byte of t uniform in [lo, hi] (packed e2m1 codes, e4m3 scale codes).
void fill_bytes(std::mt19937& rng, const Tensor& t, int lo, int hi) {
  std::uniform_int_distribution<int> byte(lo, hi);
  uint8_t* p = static_cast<uint8_t*>(t.view().data);
  const int64_t n = t.numel() * dtype_size(t.dtype());
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(byte(rng));
}

void set_id(const Tensor& ids, int64_t flat, int64_t id) {
  if (ids.dtype() == DType::kI32)
    ids.ptr<int32_t>()[flat] = static_cast<int32_t>(id);
  else
    ids.ptr<int64_t>()[flat] = id;
}

// Ids uniform in [lo, hi] (repeats allowed: two slots may pick one expert), weights in [0.1, 1).
void fill_routing(std::mt19937& rng, const Tensor& ids, const Tensor& weights, int64_t lo,
                  int64_t hi) {
  std::uniform_int_distribution<int64_t> id(lo, hi);
  std::uniform_real_distribution<float> w(0.1f, 1.0f);
  for (int64_t i = 0; i < ids.numel(); ++i) {
    set_id(ids, i, id(rng));
    weights.ptr<float>()[i] = w(rng);
  }
}

Tensor scalar_f32(float v) {
  Tensor t = Tensor::empty({1}, DType::kF32);
  t.ptr<float>()[0] = v;
  return t;
}

Tensor per_expert_f32(int64_t e, const std::function<float(int64_t)>& value) {
  Tensor t = Tensor::empty({e}, DType::kF32);
  for (int64_t i = 0; i < e; ++i) t.ptr<float>()[i] = value(i);
  return t;
}

// NVFP4 experts from f32 weights: packed codes and linear block scales, one global scale each.
struct Fp4Weights {
  Tensor w13, w13_sf, w2, w2_sf;
  float gs13 = 0.0f, gs2 = 0.0f;
};

Fp4Weights fp4_weights(std::mt19937& rng, int64_t e, int64_t h, int64_t inter) {
  const Tensor w13 = random_tensor(rng, {e, 2 * inter, h}, DType::kF32, 0.1f);
  const Tensor w2 = random_tensor(rng, {e, h, inter}, DType::kF32, 0.1f);
  Fp4Weights f;
  f.gs13 = nvfp4_global_scales(w13.view(), false).ptr<float>()[0];
  f.gs2 = nvfp4_global_scales(w2.view(), false).ptr<float>()[0];
  QuantizedTensor q13 = quantize_nvfp4(w13.view(), f.gs13);
  QuantizedTensor q2 = quantize_nvfp4(w2.view(), f.gs2);
  f.w13 = q13.q;
  f.w13_sf = q13.scale;
  f.w2 = q2.q;
  f.w2_sf = q2.scale;
  return f;
}

constexpr float kA1 = 100.0f, kA2 = 2000.0f;  // activation global scales

Tensor mma_scales(const Tensor& linear) {
  const Tensor swizzled = swizzle_nvfp4_scales(linear.view());
  return Tensor(nvfp4_scales_mma_view(swizzled.view()), swizzled.owner());
}

// ---------------------------------------------------------------------------------------------
// Cases.

/// Makes the current contents invalid; the prepared and the eager run must both throw.
struct Corruption {
  std::string what;
  std::function<void()> apply;
  const std::type_info* error;
};

struct PreparedCase {
  MoeRunnerBackend runner = MoeRunnerBackend::FLASHINFER_CUTLASS;
  MoeA2ABackend a2a = MoeA2ABackend::NONE;
  MoeRunnerConfig config;
  QuantInfoPtr quant_info;
  DispatchOutputPtr dispatch;
  std::function<void(std::mt19937&)> refill;  // new valid contents
  std::vector<Corruption> corruptions;
  Tensor moe_output;  // defined: the result must land here
};

struct CaseSpec {
  std::string name;
  /// `tokens`: T of a token-major case, the masked capacity M of a v1 case.
  std::function<PreparedCase(int64_t tokens)> build;
};

void PrintTo(const CaseSpec& spec, std::ostream* os) { *os << spec.name; }

constexpr int64_t kTopK = 3;

MoeRunnerConfig base_config() {
  MoeRunnerConfig config;
  config.inplace = false;
  return config;
}

std::shared_ptr<StandardDispatchOutput> standard_dispatch(const Tensor& x, const Tensor& ids,
                                                          const Tensor& weights) {
  auto d = std::make_shared<StandardDispatchOutput>();
  d->hidden_states = x;
  d->topk_output = StandardTopKOutput{weights, ids, {}};
  return d;
}

// A bad id in the last token's first slot (nothing when there are no tokens to corrupt).
Corruption bad_id(const Tensor& ids, int64_t id) {
  return {str_cat("id ", id),
          [ids, id] {
            if (ids.numel() > 0) set_id(ids, ids.numel() - ids.size(1), id);
          },
          &typeid(OutOfRange)};
}

// flashinfer_cutlass, quant_type "bf16": i64 ids, H past one stack chunk, routed scaling.
PreparedCase cutlass_bf16_standard(int64_t tokens) {
  std::mt19937 rng(11);
  const int64_t E = 4, H = 528, I = 32;
  auto q = std::make_shared<FlashInferCutlassMoeQuantInfo>();
  q->quant_type = "bf16";
  q->w13_weight = random_tensor(rng, {E, 2 * I, H}, DType::kBF16, 0.05f);
  q->w2_weight = random_tensor(rng, {E, H, I}, DType::kBF16, 0.15f);
  const Tensor x = random_tensor(rng, {tokens, H}, DType::kBF16);
  const Tensor ids = Tensor::empty({tokens, kTopK}, DType::kI64);
  const Tensor weights = Tensor::empty({tokens, kTopK}, DType::kF32);
  fill_routing(rng, ids, weights, -1, E - 1);
  PreparedCase c;
  c.config = base_config();
  c.config.routed_scaling_factor = 1.5f;
  c.quant_info = q;
  c.dispatch = standard_dispatch(x, ids, weights);
  c.refill = [=](std::mt19937& r) {
    fill_normal(r, x);
    fill_routing(r, ids, weights, -1, E - 1);
  };
  c.corruptions = {bad_id(ids, E), bad_id(ids, -2)};
  return c;
}

// quant_type "fp8", rank 1 of 2 (ids of rank 0's experts contribute nothing), f32 output.
PreparedCase cutlass_fp8_standard(int64_t tokens) {
  std::mt19937 rng(12);
  const int64_t E = 3, H = 48, I = 32;
  auto q = std::make_shared<FlashInferCutlassMoeQuantInfo>();
  q->quant_type = "fp8";
  q->w13_weight =
      encode_fp8(random_tensor(rng, {E, 2 * I, H}, DType::kF32, 20.0f).view(), DType::kF8E4M3);
  q->w2_weight =
      encode_fp8(random_tensor(rng, {E, H, I}, DType::kF32, 20.0f).view(), DType::kF8E4M3);
  q->quant_scales = {
      per_expert_f32(E, [](int64_t e) { return 0.002f + 0.0005f * e; }), scalar_f32(40.0f),
      per_expert_f32(E, [](int64_t e) { return 0.003f - 0.0004f * e; }), scalar_f32(0.02f)};
  q->output_dtype = DType::kF32;
  q->moe_ep_size = 2;
  q->moe_ep_rank = 1;
  const Tensor x = random_tensor(rng, {tokens, H}, DType::kBF16);
  const Tensor ids = Tensor::empty({tokens, kTopK}, DType::kI32);
  const Tensor weights = Tensor::empty({tokens, kTopK}, DType::kF32);
  fill_routing(rng, ids, weights, -1, 2 * E - 1);
  PreparedCase c;
  c.config = base_config();
  c.config.routed_scaling_factor = 0.75f;
  c.quant_info = q;
  c.dispatch = standard_dispatch(x, ids, weights);
  c.refill = [=](std::mt19937& r) {
    fill_normal(r, x);
    fill_routing(r, ids, weights, -1, 2 * E - 1);
  };
  c.corruptions = {bad_id(ids, 2 * E)};
  return c;
}

// The same StandardDispatchOutput under a2a flashinfer: its rules (the invalid-token id
// num_experts = 2E is a token with no expert here) follow the runner's a2a backend, not the format.
PreparedCase cutlass_fp8_standard_flashinfer_a2a(int64_t tokens) {
  PreparedCase c = cutlass_fp8_standard(tokens);
  c.a2a = MoeA2ABackend::FLASHINFER;
  auto d = std::static_pointer_cast<StandardDispatchOutput>(c.dispatch);
  const auto& topk = std::get<StandardTopKOutput>(d->topk_output);
  const Tensor ids = topk.topk_ids, weights = topk.topk_weights;
  const int64_t E = 3;
  std::mt19937 rng(14);
  fill_routing(rng, ids, weights, -1, 2 * E);
  const Tensor x = d->hidden_states;
  c.refill = [=](std::mt19937& r) {
    fill_normal(r, x);
    fill_routing(r, ids, weights, -1, 2 * E);
  };
  c.corruptions = {bad_id(ids, 2 * E + 1)};
  return c;
}

// quant_type "fp8" over a bypassed top-k: the router logits are routed again by every run.
PreparedCase cutlass_fp8_bypassed(int64_t tokens) {
  PreparedCase c = cutlass_fp8_standard(tokens);
  auto d = std::static_pointer_cast<StandardDispatchOutput>(c.dispatch);
  std::mt19937 rng(13);
  const int64_t E_total = 6;
  const Tensor x = d->hidden_states;
  const Tensor logits = random_tensor(rng, {tokens, E_total}, DType::kF32);
  TopKConfig topk;
  topk.top_k = static_cast<int>(kTopK);
  topk.renormalize = true;
  d->topk_output = BypassedTopKOutput{x, logits, topk, std::max<int64_t>(tokens - 3, 0)};
  c.refill = [=](std::mt19937& r) {
    fill_normal(r, x);
    fill_normal(r, logits);
  };
  c.corruptions = {{"NaN logit",
                    [logits] {
                      if (logits.numel() > 0) logits.ptr<float>()[1] = std::nanf("");
                    },
                    &typeid(InvalidArgument)}};
  return c;
}

QuantInfoPtr cutlass_fp4_info(const Fp4Weights& f, int64_t e) {
  auto q = std::make_shared<FlashInferCutlassMoeQuantInfo>();
  q->quant_type = "fp4";
  q->w13_weight = f.w13;
  q->w2_weight = f.w2;
  q->quant_scales = {
      scalar_f32(kA1),
      swizzle_nvfp4_scales(f.w13_sf.view()),
      per_expert_f32(e, [&](int64_t i) { return (1.0f + 0.1f * i) / (kA1 * f.gs13); }),
      scalar_f32(kA2),
      swizzle_nvfp4_scales(f.w2_sf.view()),
      per_expert_f32(e, [&](int64_t i) { return (1.0f - 0.1f * i) / (kA2 * f.gs2); })};
  return q;
}

// quant_type "fp4" on bf16 input, quantized by every run (H past one stack chunk).
PreparedCase cutlass_fp4_standard(int64_t tokens) {
  std::mt19937 rng(14);
  const int64_t E = 4, H = 544, I = 64;
  const Fp4Weights f = fp4_weights(rng, E, H, I);
  const Tensor x = random_tensor(rng, {tokens, H}, DType::kBF16);
  const Tensor ids = Tensor::empty({tokens, kTopK}, DType::kI32);
  const Tensor weights = Tensor::empty({tokens, kTopK}, DType::kF32);
  fill_routing(rng, ids, weights, -1, E - 1);
  PreparedCase c;
  c.config = base_config();
  c.quant_info = cutlass_fp4_info(f, E);
  c.dispatch = standard_dispatch(x, ids, weights);
  c.refill = [=](std::mt19937& r) {
    fill_normal(r, x);
    fill_routing(r, ids, weights, -1, E - 1);
  };
  c.corruptions = {bad_id(ids, E)};
  return c;
}

// quant_type "fp4" on an NVFP4 input with 128×4-swizzled scales (the FP4 all-gather's).
PreparedCase cutlass_fp4_standard_swizzled_input(int64_t tokens) {
  std::mt19937 rng(15);
  const int64_t E = 4, H = 64, I = 64, kb = H / kNvfp4BlockSize;
  const int64_t mp = (tokens + 127) / 128 * 128, kbp = (kb + 3) / 4 * 4;
  const Fp4Weights f = fp4_weights(rng, E, H, I);
  const Tensor x = Tensor::empty({tokens, H / 2}, DType::kU8);
  const Tensor xs = Tensor::empty({mp, kbp}, DType::kF8E4M3);
  fill_bytes(rng, x, 0, 255);
  fill_bytes(rng, xs, 0x30, 0x40);
  const Tensor ids = Tensor::empty({tokens, kTopK}, DType::kI32);
  const Tensor weights = Tensor::empty({tokens, kTopK}, DType::kF32);
  fill_routing(rng, ids, weights, -1, E - 1);
  PreparedCase c;
  c.config = base_config();
  c.quant_info = cutlass_fp4_info(f, E);
  auto d = standard_dispatch(x, ids, weights);
  d->hidden_states_scale = xs;
  c.dispatch = d;
  c.refill = [=](std::mt19937& r) {
    fill_bytes(r, x, 0, 255);
    fill_bytes(r, xs, 0x30, 0x40);
    fill_routing(r, ids, weights, -1, E - 1);
  };
  const int64_t last_scale = nvfp4_swizzled_offset(std::max<int64_t>(tokens - 1, 0), kb - 1, kbp);
  c.corruptions = {bad_id(ids, E),
                   {"NaN scale byte",
                    [xs, last_scale] {
                      if (xs.numel() > 0) xs.ptr<uint8_t>()[last_scale] = 0x7f;
                    },
                    &typeid(InvalidArgument)}};
  return c;
}

// A FlashinferDispatchOutput as the dispatcher builds it: global ids of 2 ranks' experts plus the
// invalid-token id, written into moe_output when `with_moe_output`.
struct FlashinferRows {
  Tensor ids, weights, moe_output;
  std::shared_ptr<FlashinferDispatchOutput> dispatch;
};

FlashinferRows flashinfer_rows(std::mt19937& rng, const Tensor& x, int64_t tokens, int64_t H,
                               int64_t num_experts, bool with_moe_output) {
  FlashinferRows r;
  r.ids = Tensor::empty({tokens, kTopK}, DType::kI32);
  r.weights = Tensor::empty({tokens, kTopK}, DType::kF32);
  fill_routing(rng, r.ids, r.weights, -1, num_experts);
  r.dispatch = std::make_shared<FlashinferDispatchOutput>();
  r.dispatch->hidden_states = x;
  r.dispatch->topk_output = StandardTopKOutput{r.weights, r.ids, {}};
  r.dispatch->output_dtype = DType::kBF16;
  if (with_moe_output) {
    r.moe_output = Tensor::zeros({tokens, H}, DType::kBF16);
    r.dispatch->moe_output = r.moe_output;
  }
  return r;
}

// quant_type "fp4", flashinfer dispatch: NVFP4 input with linear scales, rank 0 of 2, moe_output.
PreparedCase cutlass_fp4_flashinfer_linear_input(int64_t tokens) {
  std::mt19937 rng(16);
  const int64_t E = 3, H = 64, I = 32;
  const Fp4Weights f = fp4_weights(rng, E, H, I);
  auto q = std::static_pointer_cast<FlashInferCutlassMoeQuantInfo>(cutlass_fp4_info(f, E));
  q->moe_ep_size = 2;
  const Tensor x = Tensor::empty({tokens, H / 2}, DType::kU8);
  const Tensor xs = Tensor::empty({tokens, H / kNvfp4BlockSize}, DType::kU8);
  fill_bytes(rng, x, 0, 255);
  fill_bytes(rng, xs, 0x30, 0x40);
  FlashinferRows rows = flashinfer_rows(rng, x, tokens, H, 2 * E, /*with_moe_output=*/true);
  rows.dispatch->hidden_states_scale = xs;
  PreparedCase c;
  c.a2a = MoeA2ABackend::FLASHINFER;
  c.config = base_config();
  c.quant_info = q;
  c.dispatch = rows.dispatch;
  c.moe_output = rows.moe_output;
  const Tensor ids = rows.ids, weights = rows.weights;
  c.refill = [=](std::mt19937& r) {
    fill_bytes(r, x, 0, 255);
    fill_bytes(r, xs, 0x30, 0x40);
    fill_routing(r, ids, weights, -1, 2 * E);
  };
  c.corruptions = {bad_id(ids, 2 * E + 1),
                   {"NaN scale byte",
                    [xs] {
                      if (xs.numel() > 0) xs.ptr<uint8_t>()[xs.numel() - 1] = 0xff;
                    },
                    &typeid(InvalidArgument)}};
  return c;
}

// quant_type "bf16", flashinfer dispatch of bf16 rows, result in a new tensor.
PreparedCase cutlass_bf16_flashinfer(int64_t tokens) {
  std::mt19937 rng(17);
  const int64_t E = 4, H = 32, I = 48;
  auto q = std::make_shared<FlashInferCutlassMoeQuantInfo>();
  q->quant_type = "bf16";
  q->w13_weight = random_tensor(rng, {E, 2 * I, H}, DType::kBF16, 0.2f);
  q->w2_weight = random_tensor(rng, {E, H, I}, DType::kBF16, 0.15f);
  const Tensor x = random_tensor(rng, {tokens, H}, DType::kBF16);
  FlashinferRows rows = flashinfer_rows(rng, x, tokens, H, E, /*with_moe_output=*/false);
  PreparedCase c;
  c.a2a = MoeA2ABackend::FLASHINFER;
  c.config = base_config();
  c.quant_info = q;
  c.dispatch = rows.dispatch;
  const Tensor ids = rows.ids, weights = rows.weights;
  c.refill = [=](std::mt19937& r) {
    fill_normal(r, x);
    fill_routing(r, ids, weights, -1, E);
  };
  c.corruptions = {bad_id(ids, E + 1)};
  return c;
}

// CuteDSL v2 weights: [Up; Gate] interleaved in 64-row chunks, block scales in the MMA view.
std::shared_ptr<CuteDslFp4MoeQuantInfo> cutedsl_v2_info(const Fp4Weights& f, int64_t e) {
  auto q = std::make_shared<CuteDslFp4MoeQuantInfo>();
  q->w13_weight = interleave_w13_halves(f.w13.view(), 64, 1);
  q->w13_weight_sf = mma_scales(interleave_w13_halves(f.w13_sf.view(), 64, 1));
  q->w2_weight = f.w2;
  q->w2_weight_sf = mma_scales(f.w2_sf);
  q->a1_scale = scalar_f32(kA1);
  q->a2_scale = scalar_f32(kA2);
  q->w1_alpha = per_expert_f32(e, [&](int64_t i) { return (1.0f + 0.1f * i) / (kA1 * f.gs13); });
  q->w2_alpha = per_expert_f32(e, [&](int64_t i) { return (1.0f - 0.1f * i) / (kA2 * f.gs2); });
  return q;
}

// CuteDSL v2 on a StandardDispatchOutput (a2a none): bf16 input quantized by every run.
PreparedCase cutedsl_v2_standard(int64_t tokens) {
  std::mt19937 rng(18);
  const int64_t E = 4, H = 64, I = 64;
  const Fp4Weights f = fp4_weights(rng, E, H, I);
  const Tensor x = random_tensor(rng, {tokens, H}, DType::kBF16);
  const Tensor ids = Tensor::empty({tokens, kTopK}, DType::kI32);
  const Tensor weights = Tensor::empty({tokens, kTopK}, DType::kF32);
  fill_routing(rng, ids, weights, -1, E - 1);
  PreparedCase c;
  c.runner = MoeRunnerBackend::FLASHINFER_CUTEDSL;
  c.config = base_config();
  c.quant_info = cutedsl_v2_info(f, E);
  c.dispatch = standard_dispatch(x, ids, weights);
  c.refill = [=](std::mt19937& r) {
    fill_normal(r, x);
    fill_routing(r, ids, weights, -1, E - 1);
  };
  c.corruptions = {bad_id(ids, E)};
  return c;
}

// CuteDSL v2 on a FlashinferDispatchOutput: rank 1 of 2 (local_expert_offset E), NVFP4 input
// with linear scales when `nvfp4_input` (else bf16), moe_output when `with_moe_output`.
PreparedCase cutedsl_v2_flashinfer(int64_t tokens, bool nvfp4_input, bool with_moe_output) {
  std::mt19937 rng(nvfp4_input ? 19 : 20);
  const int64_t E = 3, H = 64, I = 64;
  const Fp4Weights f = fp4_weights(rng, E, H, I);
  auto q = cutedsl_v2_info(f, E);
  q->local_expert_offset = E;
  const Tensor x = nvfp4_input ? Tensor::empty({tokens, H / 2}, DType::kU8)
                               : random_tensor(rng, {tokens, H}, DType::kBF16);
  const Tensor xs = Tensor::empty({tokens, H / kNvfp4BlockSize}, DType::kF8E4M3);
  if (nvfp4_input) {
    fill_bytes(rng, x, 0, 255);
    fill_bytes(rng, xs, 0x30, 0x40);
  }
  FlashinferRows rows = flashinfer_rows(rng, x, tokens, H, 2 * E, with_moe_output);
  if (nvfp4_input) rows.dispatch->hidden_states_scale = xs;
  PreparedCase c;
  c.runner = MoeRunnerBackend::FLASHINFER_CUTEDSL;
  c.a2a = MoeA2ABackend::FLASHINFER;
  c.config = base_config();
  c.config.num_experts = 2 * E;
  c.quant_info = q;
  c.dispatch = rows.dispatch;
  c.moe_output = rows.moe_output;
  const Tensor ids = rows.ids, weights = rows.weights;
  c.refill = [=](std::mt19937& r) {
    if (nvfp4_input) {
      fill_bytes(r, x, 0, 255);
      fill_bytes(r, xs, 0x30, 0x40);
    } else {
      fill_normal(r, x);
    }
    fill_routing(r, ids, weights, -1, 2 * E);
  };
  c.corruptions = {bad_id(ids, 2 * E + 1)};
  if (nvfp4_input)
    c.corruptions.push_back({"NaN scale byte",
                             [xs] {
                               if (xs.numel() > 0) xs.ptr<uint8_t>()[0] = 0x7f;
                             },
                             &typeid(InvalidArgument)});
  return c;
}

// CuteDSL v1 (DeepEP low-latency, masked [E, M, ·]): [Gate; Up] weights with 128×4-swizzled
// block scales, per-expert a1_scale, one a2_scale for all. masked_m covers 0 and M; rows past
// masked_m hold garbage (NaN bf16, NaN scale bytes) that must never be read.
PreparedCase cutedsl_v1(int64_t capacity, bool nvfp4_payload) {
  std::mt19937 rng(nvfp4_payload ? 21 : 22);
  const int64_t E = 4, H = 64, I = 32, M = capacity, T_local = 5;
  const Fp4Weights f = fp4_weights(rng, E, H, I);
  auto q = std::make_shared<CuteDslFp4MoeQuantInfo>();
  q->w13_weight = f.w13;
  q->w13_weight_sf = swizzle_nvfp4_scales(f.w13_sf.view());
  q->w2_weight = f.w2;
  q->w2_weight_sf = swizzle_nvfp4_scales(f.w2_sf.view());
  const Tensor a1 = per_expert_f32(E, [](int64_t i) { return kA1 * (1.0f + 0.25f * i); });
  q->a1_scale = a1;
  q->a2_scale = scalar_f32(kA2);
  q->w1_alpha = per_expert_f32(E, [&](int64_t i) { return 1.0f / (a1.ptr<float>()[i] * f.gs13); });
  q->w2_alpha = per_expert_f32(E, [&](int64_t) { return 1.0f / (kA2 * f.gs2); });
  q->use_nvfp4_dispatch = nvfp4_payload;

  auto d = std::make_shared<DeepEPLLDispatchOutput>();
  // DeepEP hands NVFP4 scales out as int32 words of four e4m3 bytes.
  const Tensor x = nvfp4_payload ? Tensor::empty({E, M, H / 2}, DType::kU8)
                                 : Tensor::empty({E, M, H}, DType::kBF16);
  const Tensor xs = Tensor::empty({E, M, H / kNvfp4BlockSize / 4}, DType::kI32);
  const Tensor masked_m = Tensor::empty({E}, DType::kI32);
  d->hidden_states = x;
  if (nvfp4_payload) d->hidden_states_scale = xs;
  d->masked_m = masked_m;
  d->topk_ids = Tensor::empty({T_local, kTopK}, DType::kI32);
  d->topk_weights = Tensor::empty({T_local, kTopK}, DType::kF32);
  fill_routing(rng, d->topk_ids, d->topk_weights, -1, E - 1);
  auto refill = [=](std::mt19937& r) {
    std::uniform_int_distribution<int32_t> count(0, static_cast<int32_t>(M));
    for (int64_t e = 0; e < E; ++e) masked_m.ptr<int32_t>()[e] = count(r);
    if (M > 0) {  // one expert full, one empty
      masked_m.ptr<int32_t>()[0] = static_cast<int32_t>(M);
      masked_m.ptr<int32_t>()[E - 1] = 0;
    }
    if (nvfp4_payload) {
      fill_bytes(r, x, 0, 255);
      fill_bytes(r, xs, 0x30, 0x40);
    } else {
      fill_normal(r, x);
    }
    const int64_t row_bytes = x.size(2) * dtype_size(x.dtype());
    const int64_t scale_row_bytes = H / kNvfp4BlockSize;
    for (int64_t e = 0; e < E; ++e)
      for (int64_t m = masked_m.ptr<int32_t>()[e]; m < M; ++m) {
        std::memset(x.ptr<uint8_t>() + (e * M + m) * row_bytes, 0xff, row_bytes);
        std::memset(xs.ptr<uint8_t>() + (e * M + m) * scale_row_bytes, 0xff, scale_row_bytes);
      }
  };
  refill(rng);
  PreparedCase c;
  c.runner = MoeRunnerBackend::FLASHINFER_CUTEDSL;
  c.a2a = MoeA2ABackend::DEEPEP;
  c.config = base_config();
  c.quant_info = q;
  c.dispatch = d;
  c.refill = refill;
  c.corruptions = {
      {"masked_m past M", [=] { masked_m.ptr<int32_t>()[1] = M + 1; }, &typeid(InvalidArgument)},
      {"negative masked_m", [=] { masked_m.ptr<int32_t>()[2] = -1; }, &typeid(InvalidArgument)}};
  if (nvfp4_payload && M > 0)
    c.corruptions.push_back({"NaN scale byte in a valid row",
                             [=] { xs.ptr<uint8_t>()[0] = 0x7f; },  // masked_m[0] == M > 0
                             &typeid(InvalidArgument)});
  return c;
}

std::vector<CaseSpec> cases() {
  return {
      {"cutlass_bf16_standard", cutlass_bf16_standard},
      {"cutlass_fp8_standard_ep", cutlass_fp8_standard},
      {"cutlass_fp8_standard_bypassed_topk", cutlass_fp8_bypassed},
      {"cutlass_fp8_standard_under_flashinfer_a2a", cutlass_fp8_standard_flashinfer_a2a},
      {"cutlass_fp4_standard", cutlass_fp4_standard},
      {"cutlass_fp4_standard_swizzled_nvfp4_input", cutlass_fp4_standard_swizzled_input},
      {"cutlass_fp4_flashinfer_linear_nvfp4_input_moe_output", cutlass_fp4_flashinfer_linear_input},
      {"cutlass_bf16_flashinfer", cutlass_bf16_flashinfer},
      {"cutedsl_v2_standard", cutedsl_v2_standard},
      {"cutedsl_v2_flashinfer_nvfp4_input_moe_output",
       [](int64_t t) { return cutedsl_v2_flashinfer(t, true, true); }},
      {"cutedsl_v2_flashinfer_bf16_input",
       [](int64_t t) { return cutedsl_v2_flashinfer(t, false, false); }},
      {"cutedsl_v1_deepep_ll_bf16", [](int64_t m) { return cutedsl_v1(m, false); }},
      {"cutedsl_v1_deepep_ll_nvfp4", [](int64_t m) { return cutedsl_v1(m, true); }},
  };
}

// ---------------------------------------------------------------------------------------------

Tensor combine_hidden_states(const CombineInputPtr& c) {
  if (auto* s = dynamic_cast<const StandardCombineInput*>(c.get())) return s->hidden_states;
  if (auto* f = dynamic_cast<const FlashinferCombineInput*>(c.get())) return f->hidden_states;
  if (auto* l = dynamic_cast<const DeepEPLLCombineInput*>(c.get())) return l->hidden_states;
  ADD_FAILURE() << "unexpected combine input format " << to_string(c->format());
  return {};
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  EXPECT_TRUE(t.view().is_contiguous());
  const uint8_t* p = static_cast<const uint8_t*>(t.view().data);
  return std::vector<uint8_t>(p, p + t.numel() * dtype_size(t.dtype()));
}

bool any_nonzero(const std::vector<uint8_t>& bytes) {
  return std::any_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b != 0; });
}

/// "Type: message" of the moecore error fn throws, or "nothing".
std::string thrown(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return std::string(typeid(e).name()) + ": " + e.what();
  }
  return "nothing";
}

class PreparedFlashinferTest : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(PreparedFlashinferTest, RunEqualsEagerBitwiseWithoutAllocating) {
  PreparedCase c = GetParam().build(13);
  MoeRunner runner(c.runner, c.config, c.a2a);
  const PreparedRunPtr prepared = runner.prepare(c.dispatch, c.quant_info);
  const Tensor out = combine_hidden_states(prepared->combine_input());
  if (c.moe_output.defined()) EXPECT_EQ(out.view().data, c.moe_output.view().data);
  std::mt19937 rng(5);
  for (int round = 0; round < 4; ++round) {
    if (round > 0) c.refill(rng);  // round 0: the contents the run was prepared with
    EXPECT_EQ(count_allocations([&] { prepared->run(); }), 0) << "round " << round;
    const std::vector<uint8_t> got = bytes_of(out);
    EXPECT_TRUE(any_nonzero(got)) << "round " << round;
    const CombineInputPtr eager = runner.run(c.dispatch, c.quant_info);
    EXPECT_EQ(eager->format(), prepared->combine_input()->format());
    const Tensor want = combine_hidden_states(eager);
    EXPECT_EQ(want.view().shape_vector(), out.view().shape_vector());
    EXPECT_EQ(want.dtype(), out.dtype());
    EXPECT_TRUE(bytes_of(want) == got) << "round " << round;
  }
}

TEST_P(PreparedFlashinferTest, BadContentsThrowWhatEagerThrowsAndWriteNothing) {
  PreparedCase c = GetParam().build(13);
  MoeRunner runner(c.runner, c.config, c.a2a);
  const PreparedRunPtr prepared = runner.prepare(c.dispatch, c.quant_info);
  const Tensor out = combine_hidden_states(prepared->combine_input());
  ASSERT_FALSE(c.corruptions.empty());
  std::mt19937 rng(6);
  for (const Corruption& bad : c.corruptions) {
    c.refill(rng);
    prepared->run();  // valid contents run again after the previous failure
    const std::vector<uint8_t> before = bytes_of(out);
    bad.apply();
    const std::string from_prepared = thrown([&] { prepared->run(); });
    EXPECT_EQ(bytes_of(out), before) << bad.what;
    EXPECT_EQ(from_prepared.rfind(bad.error->name(), 0), 0u) << bad.what << ": " << from_prepared;
    EXPECT_EQ(thrown([&] { runner.run(c.dispatch, c.quant_info); }), from_prepared) << bad.what;
    EXPECT_EQ(bytes_of(out), before) << bad.what;
  }
}

TEST_P(PreparedFlashinferTest, EmptyInputRunsNothing) {
  PreparedCase c = GetParam().build(0);
  MoeRunner runner(c.runner, c.config, c.a2a);
  const PreparedRunPtr prepared = runner.prepare(c.dispatch, c.quant_info);
  EXPECT_EQ(count_allocations([&] { prepared->run(); }), 0);
  const Tensor out = combine_hidden_states(prepared->combine_input());
  const Tensor want = combine_hidden_states(runner.run(c.dispatch, c.quant_info));
  EXPECT_EQ(out.numel(), 0);
  EXPECT_EQ(want.view().shape_vector(), out.view().shape_vector());
  EXPECT_EQ(want.dtype(), out.dtype());
}

INSTANTIATE_TEST_SUITE_P(Paths, PreparedFlashinferTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<CaseSpec>& info) {
                           return info.param.name;
                         });

TEST(PreparedFlashinferRegistryTest, EveryFlashinferPreparedRunHasACase) {
  std::set<PreKey> covered;
  for (const CaseSpec& spec : cases()) {
    const PreparedCase c = spec.build(2);
    covered.insert({c.dispatch->format(), c.runner});
  }
  int registered = 0;
  for (const auto& [key, origin] : registered_prepared_runs()) {
    if (key.second != MoeRunnerBackend::FLASHINFER_CUTLASS &&
        key.second != MoeRunnerBackend::FLASHINFER_CUTEDSL)
      continue;
    ++registered;
    EXPECT_EQ(covered.count(key), 1u) << to_string(key.first) << " → " << to_string(key.second);
  }
  EXPECT_EQ(registered, 5);  // (standard | flashinfer) × 2 runners, and (deepep_ll, cutedsl)
}

// At every level, the quantizers give the bits of formats' whole-row functions without
// allocating, on rows longer than a stack chunk and not a multiple of one.
TEST(PreparedFlashinferQuantizerTest, QuantizersEqualWholeRowsWithoutAllocatingAtEveryLevel) {
  std::mt19937 rng(7);
  const int64_t rows = 3, k = 1040, ld = 1056;
  const Tensor x = random_tensor(rng, {rows, ld}, DType::kF32, 3.0f);
  const float* src = x.ptr<float>();
  const float gs = 150.0f, multiplier = 37.5f;
  for (IsaLevel level : available_isa_levels()) {
    SCOPED_TRACE(isa_level_name(level));
    std::vector<float> nvfp4(src, src + rows * ld), fp8 = nvfp4, scales(rows);
    const ActivationQuantizer nvfp4_q = flashinfer_detail::nvfp4_quantizer(level, gs);
    const ActivationQuantizer fp8_q = flashinfer_detail::fp8_multiply_quantizer(level, multiplier);
    EXPECT_EQ(count_allocations([&] {
                nvfp4_q(nvfp4.data(), rows, k, ld, scales.data());
                fp8_q(fp8.data(), rows, k, ld, scales.data());
              }),
              0);
    std::vector<uint8_t> q(k), sf(k / kNvfp4BlockSize);
    std::vector<float> want(k);
    for (int64_t r = 0; r < rows; ++r) {
      nvfp4_quantize_row(src + r * ld, k, gs, q.data(), sf.data());
      nvfp4_code_values_row(q.data(), sf.data(), k, want.data());
      EXPECT_EQ(std::memcmp(want.data(), nvfp4.data() + r * ld, k * sizeof(float)), 0) << r;
      fp8_quantize_row_mul(src + r * ld, k, multiplier, q.data());
      for (int64_t i = 0; i < k; ++i) want[i] = fp8_e4m3_table()[q[i]];
      EXPECT_EQ(std::memcmp(want.data(), fp8.data() + r * ld, k * sizeof(float)), 0) << r;
      // Columns past k are not touched.
      EXPECT_EQ(std::memcmp(src + r * ld + k, nvfp4.data() + r * ld + k, (ld - k) * sizeof(float)),
                0);
    }
  }
}

}  // namespace
}  // namespace moecore
