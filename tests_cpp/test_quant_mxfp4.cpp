// MXFP4 quant methods and the flashinfer_mxfp4 backend in C++: processing equals a manual
// construction (loops here, then the formats SM90 transforms), the layer path is bit-identical
// to the direct kernel call (R7), the kernel agrees with an Eigen fp64 reference on weights
// decoded by the formats codec, empty input skips the kernel (R9), results are identical across
// thread counts and batch compositions, the quant method's kernel layout is the deinterleaved
// contract layout (and a quant info without it gives the same bits), and misuse raises the
// documented errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "moecore/core/error.h"
#include "moecore/core/thread_pool.h"
#include "moecore/formats/e8m0.h"
#include "moecore/formats/half.h"
#include "moecore/formats/layout.h"
#include "moecore/formats/quantize.h"
#include "moecore/layer/fused_moe.h"
#include "moecore/quant/mxfp4.h"
#include "moecore/runner/backends/flashinfer_mxfp4.h"
#include "support/moe_problem.h"

namespace moecore {
namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

Tensor random_bytes(std::mt19937& rng, const std::vector<int64_t>& shape, int lo = 0,
                    int hi = 255) {
  Tensor t = Tensor::empty(shape, DType::kU8);
  std::uniform_int_distribution<int> d(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<uint8_t>()[i] = static_cast<uint8_t>(d(rng));
  return t;
}

Tensor random_bf16(std::mt19937& rng, const std::vector<int64_t>& shape, float scale) {
  return testing::random_tensor(rng, shape, DType::kBF16, scale);
}

/// The six GPT-OSS checkpoint tensors (all experts, 3-D block form).
struct GptOssCkpt {
  int64_t E, H, I;
  Tensor gu_blocks, gu_scales, gu_bias, dn_blocks, dn_scales, dn_bias;
};

GptOssCkpt make_ckpt(std::mt19937& rng, int64_t E, int64_t H, int64_t I, int scale_lo = 121,
                     int scale_hi = 124) {
  GptOssCkpt c{E, H, I};
  c.gu_blocks = random_bytes(rng, {E, 2 * I, H / 2});
  c.gu_scales = random_bytes(rng, {E, 2 * I, H / 32}, scale_lo, scale_hi);
  c.gu_bias = random_bf16(rng, {E, 2 * I}, 0.1f);
  c.dn_blocks = random_bytes(rng, {E, H, I / 2});
  c.dn_scales = random_bytes(rng, {E, H, I / 32}, scale_lo, scale_hi);
  c.dn_bias = random_bf16(rng, {E, H}, 0.1f);
  return c;
}

struct GptOssLayer {
  std::unique_ptr<FusedMoE> layer;
  std::shared_ptr<Mxfp4MoEMethod> method;
};

GptOssLayer make_gpt_oss(const GptOssCkpt& c, int64_t top_k = 2, bool process = true) {
  FusedMoEOptions o;
  o.num_experts = c.E;
  o.hidden_size = c.H;
  o.intermediate_size = c.I;
  o.topk_config.top_k = top_k;
  o.params_dtype = DType::kBF16;
  o.runner_backend = MoeRunnerBackend::FLASHINFER_MXFP4;
  o.a2a_backend = MoeA2ABackend::NONE;
  o.runner_config.inplace = false;
  GptOssLayer out;
  out.method = std::make_shared<Mxfp4MoEMethod>();
  out.layer = std::make_unique<FusedMoE>(o, out.method);
  const std::pair<const char*, const Tensor*> items[] = {
      {"gate_up_proj_blocks", &c.gu_blocks}, {"gate_up_proj_scales", &c.gu_scales},
      {"gate_up_proj_bias", &c.gu_bias},     {"down_proj_blocks", &c.dn_blocks},
      {"down_proj_scales", &c.dn_scales},    {"down_proj_bias", &c.dn_bias}};
  for (const auto& [name, t] : items) out.method->load_fused_expert_weight(*out.layer, name, *t);
  if (process) out.layer->process_weights_after_loading();
  return out;
}

/// The manual SM90 construction of a [E, 2I, W] (interleaved rows) tensor: halved [up; gate],
/// each half padded to np rows, the last dim to wp; 2-D biases when w == 0.
Tensor manual_up_gate(const Tensor& t, int64_t np, int64_t wp) {
  const int64_t e = t.size(0), rows = t.size(1), w = t.ndim() == 3 ? t.size(2) : 1;
  const int64_t elem = dtype_size(t.dtype()), n = rows / 2;
  std::vector<int64_t> shape = {e, 2 * np};
  if (t.ndim() == 3) shape.push_back(wp);
  Tensor out = Tensor::zeros(shape, t.dtype());
  const int64_t ow = t.ndim() == 3 ? wp : 1;
  const char* src = t.ptr<char>();
  char* dst = out.ptr<char>();
  for (int64_t ex = 0; ex < e; ++ex)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t gate_src = (ex * rows + 2 * i) * w, up_src = (ex * rows + 2 * i + 1) * w;
      std::memcpy(dst + ((ex * 2 * np + i) * ow) * elem, src + up_src * elem, w * elem);
      std::memcpy(dst + ((ex * 2 * np + np + i) * ow) * elem, src + gate_src * elem, w * elem);
    }
  return out;
}

void expect_same_bytes(const Tensor& a, const Tensor& b, const char* what) {
  ASSERT_EQ(a.view().shape_vector(), b.view().shape_vector()) << what;
  ASSERT_EQ(dtype_size(a.dtype()), dtype_size(b.dtype())) << what;
  EXPECT_EQ(std::memcmp(a.ptr<char>(), b.ptr<char>(), a.numel() * dtype_size(a.dtype())), 0)
      << what;
}

StandardTopKOutput random_topk(std::mt19937& rng, int64_t T, int64_t E, int64_t k) {
  testing::MoeProblem p = testing::make_problem(rng, T, E, 32, 32, k, DType::kF32);
  return {p.topk_weights, p.topk_ids, {}};
}

Mxfp4CutlassMoeArgs direct_args(const FlashInferMxfp4CutlassMoeQuantInfo& q, const Tensor& x,
                                const StandardTopKOutput& topk) {
  Mxfp4CutlassMoeArgs a;
  a.topk_ids = topk.topk_ids;
  a.topk_weights = topk.topk_weights;
  a.w13 = q.w13_weight;
  a.w2 = q.w2_weight;
  a.w13_scale = q.w13_weight_scale;
  a.w2_scale = q.w2_weight_scale;
  a.w13_bias = q.w13_bias;
  a.w2_bias = q.w2_bias;
  a.swiglu_alpha = q.swiglu_alpha;
  a.swiglu_beta = q.swiglu_beta;
  a.swiglu_limit = q.swiglu_limit;
  const int64_t k = q.w13_weight.size(2) * 2;
  Tensor xp = Tensor::zeros({x.size(0), k}, DType::kBF16);
  copy_view(x.view(), xp.view().narrow(1, 0, x.size(1)));
  a.input = xp;
  return a;
}

const FlashInferMxfp4CutlassMoeQuantInfo& info_of(const QuantInfoPtr& q) {
  return *dynamic_cast<const FlashInferMxfp4CutlassMoeQuantInfo*>(q.get());
}

TEST(Mxfp4QuantTest, ProcessedLayoutEqualsManualConstruction) {
  std::mt19937 rng(3);
  for (auto [E, H, I] : {std::tuple<int64_t, int64_t, int64_t>{2, 192, 192}, {3, 96, 160}}) {
    GptOssCkpt c = make_ckpt(rng, E, H, I);
    GptOssLayer l = make_gpt_oss(c);
    const int64_t np = round_up(I, 128), kp = round_up(H, 128);
    EXPECT_EQ(l.method->padded_intermediate(), np);
    EXPECT_EQ(l.method->padded_hidden(), kp);
    const Tensor w13 =
        interleave_moe_weights_for_sm90_mixed_gemm(manual_up_gate(c.gu_blocks, np, kp / 2).view());
    const Tensor s13 =
        interleave_moe_scales_for_sm90_mixed_gemm(manual_up_gate(c.gu_scales, np, kp / 32).view());
    const Tensor b13 = manual_up_gate(c.gu_bias, np, 0);
    expect_same_bytes(l.layer->parameter("w13_weight"), w13, "w13_weight");
    expect_same_bytes(l.layer->parameter("w13_weight_scale"), s13, "w13_weight_scale");
    expect_same_bytes(l.layer->parameter("w13_weight_bias"), b13, "w13_weight_bias");
    const Tensor w2 = interleave_moe_weights_for_sm90_mixed_gemm(
        pad_dim(pad_dim(c.dn_blocks.view(), 1, kp).view(), 2, np / 2).view());
    expect_same_bytes(l.layer->parameter("w2_weight"), w2, "w2_weight");
    const Tensor& alpha = l.layer->parameter("swiglu_alpha");
    for (int64_t e = 0; e < E; ++e) {
      EXPECT_EQ(alpha.ptr<float>()[e], 1.702f);
      EXPECT_EQ(l.layer->parameter("swiglu_beta").ptr<float>()[e], 1.0f);
      EXPECT_EQ(l.layer->parameter("swiglu_limit").ptr<float>()[e], 7.0f);
    }
  }
}

/// The kernel layout made by processing is the SM90 contract layout with the interleave and fold
/// undone, byte for byte, and every quant info of the method carries it. A quant info without it
/// (built by hand) gives the same bits through the runner, as does the direct kernel call; a
/// kernel layout of the wrong shape, dtype or contiguity, or only part of one, is rejected.
TEST(Mxfp4QuantTest, KernelLayoutIsTheDeinterleavedContractLayout) {
  std::mt19937 rng(5);
  GptOssCkpt c = make_ckpt(rng, 3, 96, 160);
  GptOssLayer l = make_gpt_oss(c);
  QuantInfoPtr qp = l.method->quant_info(*l.layer);
  const FlashInferMxfp4CutlassMoeQuantInfo& q = info_of(qp);
  const Mxfp4KernelLayout& kl = q.kernel_layout;
  ASSERT_TRUE(kl.w13_weight.defined() && kl.w13_weight_scale.defined() && kl.w2_weight.defined() &&
              kl.w2_weight_scale.defined());
  expect_same_bytes(kl.w13_weight,
                    deinterleave_moe_weights_for_sm90_mixed_gemm(q.w13_weight.view()),
                    "w13_weight");
  expect_same_bytes(kl.w2_weight, deinterleave_moe_weights_for_sm90_mixed_gemm(q.w2_weight.view()),
                    "w2_weight");
  expect_same_bytes(kl.w13_weight_scale,
                    deinterleave_moe_scales_for_sm90_mixed_gemm(q.w13_weight_scale.view()),
                    "w13_weight_scale");
  expect_same_bytes(kl.w2_weight_scale,
                    deinterleave_moe_scales_for_sm90_mixed_gemm(q.w2_weight_scale.view()),
                    "w2_weight_scale");
  EXPECT_EQ(kl.w13_weight.view().shape_vector(), (std::vector<int64_t>{3, 2 * 256, 128 / 2}));
  EXPECT_EQ(kl.w2_weight_scale.view().shape_vector(), (std::vector<int64_t>{3, 128, 256 / 32}));
  for (const Tensor* t :
       {&kl.w13_weight, &kl.w13_weight_scale, &kl.w2_weight, &kl.w2_weight_scale}) {
    EXPECT_EQ(t->dtype(), DType::kU8);
    EXPECT_TRUE(t->view().is_contiguous());
  }
  EXPECT_EQ(info_of(l.method->quant_info(*l.layer)).kernel_layout.w13_weight.ptr<uint8_t>(),
            kl.w13_weight.ptr<uint8_t>());  // made once, shared by every quant info

  // Without the layout (a quant info built by hand) the runner derives it: the same bits.
  auto d = std::make_shared<StandardDispatchOutput>();
  d->hidden_states = random_bf16(rng, {5, 96}, 1.0f);
  d->topk_output = random_topk(rng, 5, 3, 2);
  const auto run = [&](const QuantInfoPtr& info) {
    return std::dynamic_pointer_cast<StandardCombineInput>(l.layer->runner()->run(d, info))
        ->hidden_states;
  };
  const Tensor with_layout = run(qp);
  auto bare = std::make_shared<FlashInferMxfp4CutlassMoeQuantInfo>(q);
  bare->kernel_layout = Mxfp4KernelLayout();
  expect_same_bytes(run(bare), with_layout, "kernel layout derived by the runner");
  const Tensor direct = cutlass_fused_moe_mxfp4(
      direct_args(q, d->hidden_states, std::get<StandardTopKOutput>(d->topk_output)),
      scaled_gemm_kernel(current_isa_level()));
  expect_same_bytes(Tensor::copy_of(direct.view().narrow(1, 0, 96)), with_layout,
                    "direct kernel call");

  // A bad kernel layout is an InvalidArgument naming the field (a dtype: DTypeError).
  const auto expect_rejected = [&](const char* field, auto edit, bool dtype = false) {
    auto bad = std::make_shared<FlashInferMxfp4CutlassMoeQuantInfo>(q);
    edit(bad->kernel_layout);
    try {
      run(bad);
      ADD_FAILURE() << field << ": accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_FALSE(dtype) << e.what();
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    } catch (const DTypeError& e) {
      EXPECT_TRUE(dtype) << e.what();
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  expect_rejected("kernel_layout.w13_weight", [&](Mxfp4KernelLayout& k) {
    k.w13_weight = Tensor::copy_of(k.w13_weight.view().narrow(1, 0, 256));
  });
  expect_rejected("kernel_layout.w2_weight_scale", [&](Mxfp4KernelLayout& k) {
    k.w2_weight_scale = k.w13_weight_scale;  // [3, 512, 4] for [3, 128, 8]
  });
  expect_rejected("kernel_layout.w13_weight_scale", [&](Mxfp4KernelLayout& k) {
    k.w13_weight_scale = Tensor::zeros({3, 2 * 256, 128 / 32 + 1}, DType::kU8);
  });
  expect_rejected("kernel_layout.w2_weight", [&](Mxfp4KernelLayout& k) {
    const Tensor wide = Tensor::zeros({3, 128, 256}, DType::kU8);  // not contiguous once narrowed
    k.w2_weight = Tensor(wide.view().narrow(2, 0, 128), wide.owner());
  });
  expect_rejected("kernel_layout.w2_weight", [&](Mxfp4KernelLayout& k) { k.w2_weight = Tensor(); });
  expect_rejected(
      "kernel_layout.w13_weight",
      [&](Mxfp4KernelLayout& k) { k.w13_weight = Tensor::zeros({3, 512, 64}, DType::kBF16); },
      /*dtype=*/true);
}

TEST(Mxfp4QuantTest, R7LayerPathEqualsDirectKernelCall) {
  std::mt19937 rng(7);
  GptOssCkpt c = make_ckpt(rng, 4, 192, 160);
  GptOssLayer l = make_gpt_oss(c);
  const Tensor x = random_bf16(rng, {9, 192}, 1.0f);
  const StandardTopKOutput topk = random_topk(rng, 9, 4, 2);
  const Tensor out = l.layer->forward_topk(x, topk);
  ASSERT_EQ(out.view().shape_vector(), (std::vector<int64_t>{9, 192}));
  const QuantInfoPtr q = l.method->quant_info(*l.layer);
  EXPECT_EQ(info_of(q).padded_hidden, std::optional<int64_t>(256));
  const Tensor direct = cutlass_fused_moe_mxfp4(direct_args(info_of(q), x, topk), scaled_gemm_ref);
  const Tensor trimmed = Tensor::copy_of(direct.view().narrow(1, 0, 192));
  expect_same_bytes(out, trimmed, "layer vs direct");
}

/// An fp64 reference on weights decoded by the formats codec (logical layout).
TEST(Mxfp4QuantTest, KernelMatchesFp64ReferenceOnFormatsDecodedWeights) {
  std::mt19937 rng(11);
  const int64_t E = 3, N = 128, K = 256, T = 6, k = 2;
  // Logical [up; gate] weights with small scales so outputs stay O(1).
  Tensor w13 = random_bytes(rng, {E, 2 * N, K / 2});
  Tensor s13 = random_bytes(rng, {E, 2 * N, K / 32}, 121, 123);
  Tensor w2 = random_bytes(rng, {E, K, N / 2});
  Tensor s2 = random_bytes(rng, {E, K, N / 32}, 121, 123);
  Tensor b2 = random_bf16(rng, {E, K}, 0.1f);
  const Tensor x = random_bf16(rng, {T, K}, 1.0f);
  const StandardTopKOutput topk = random_topk(rng, T, E, k);
  Mxfp4CutlassMoeArgs a;
  a.input = x;
  a.topk_ids = topk.topk_ids;
  a.topk_weights = topk.topk_weights;
  a.w13 = interleave_moe_weights_for_sm90_mixed_gemm(w13.view());
  a.w2 = interleave_moe_weights_for_sm90_mixed_gemm(w2.view());
  a.w13_scale = interleave_moe_scales_for_sm90_mixed_gemm(s13.view());
  a.w2_scale = interleave_moe_scales_for_sm90_mixed_gemm(s2.view());
  a.w2_bias = b2;
  const Tensor out = cutlass_fused_moe_mxfp4(a, scaled_gemm_kernel(current_isa_level()));
  const std::vector<float> W13 = testing::to_floats(dequantize_mxfp4(w13.view(), s13.view()));
  const std::vector<float> W2 = testing::to_floats(dequantize_mxfp4(w2.view(), s2.view()));
  // The decode path the kernel uses agrees with the formats codec bit for bit.
  EXPECT_EQ(testing::to_floats(dequantize_sm90_mxfp4(a.w13.view(), a.w13_scale.view())), W13);
  const std::vector<float> X = testing::to_floats(x), B2 = testing::to_floats(b2);
  const std::vector<float> got = testing::to_floats(out);
  double err = 0, energy = 0;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> acc(K, 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = topk.topk_ids.ptr<int32_t>()[t * k + j];
      const double w = topk.topk_weights.ptr<float>()[t * k + j];
      std::vector<double> h2(N);
      for (int64_t n = 0; n < N; ++n) {
        double up = 0, gate = 0;
        for (int64_t c = 0; c < K; ++c) {
          up += X[t * K + c] * double(W13[(e * 2 * N + n) * K + c]);
          gate += X[t * K + c] * double(W13[(e * 2 * N + N + n) * K + c]);
        }
        h2[n] = gate / (1.0 + std::exp(-gate)) * up;
      }
      for (int64_t h = 0; h < K; ++h) {
        double y = 0;
        for (int64_t n = 0; n < N; ++n) y += h2[n] * W2[(e * K + h) * N + n];
        acc[h] += w * (y + B2[e * K + h]);
      }
    }
    for (int64_t h = 0; h < K; ++h) {
      err += (got[t * K + h] - acc[h]) * (got[t * K + h] - acc[h]);
      energy += acc[h] * acc[h];
    }
  }
  EXPECT_GT(energy, 0.0);
  EXPECT_LT(err / energy, 1e-4);  // bf16 pipeline vs exact math ("bf16_vs_exact" NMSE)
}

TEST(Mxfp4QuantTest, R9EmptyInputNeverDecodes) {
  std::mt19937 rng(9);
  GptOssCkpt c = make_ckpt(rng, 2, 128, 128);
  GptOssLayer l = make_gpt_oss(c);
  const Tensor& s = l.layer->parameter("w2_weight_scale");
  std::memset(s.ptr<uint8_t>(), 0xFF, s.numel());
  StandardTopKOutput empty{
      Tensor::zeros({0, 2}, DType::kF32), Tensor::zeros({0, 2}, DType::kI32), {}};
  const Tensor x0 = Tensor::zeros({0, 128}, DType::kBF16);
  const Tensor out = l.layer->forward_topk(x0, empty);
  EXPECT_EQ(out.view().shape_vector(), (std::vector<int64_t>{0, 128}));
  const Tensor x1 = random_bf16(rng, {1, 128}, 1.0f);
  EXPECT_THROW(l.layer->forward_topk(x1, random_topk(rng, 1, 2, 2)), InvalidArgument);
}

TEST(Mxfp4QuantTest, DeterministicAcrossThreadsAndBatchInvariant) {
  std::mt19937 rng(13);
  GptOssCkpt c = make_ckpt(rng, 4, 160, 96);
  GptOssLayer l = make_gpt_oss(c);
  const Tensor x = random_bf16(rng, {11, 160}, 1.0f);
  const StandardTopKOutput topk = random_topk(rng, 11, 4, 2);
  ThreadPool& pool = ThreadPool::instance();
  const int before = pool.num_threads();
  pool.set_num_threads(1);
  const Tensor one = l.layer->forward_topk(x, topk);
  pool.set_num_threads(3);
  const Tensor three = l.layer->forward_topk(x, topk);
  pool.set_num_threads(before);
  expect_same_bytes(one, three, "1 vs 3 threads");
  for (int64_t t : {0, 5, 10}) {
    StandardTopKOutput single{Tensor::copy_of(topk.topk_weights.view().narrow(0, t, 1)),
                              Tensor::copy_of(topk.topk_ids.view().narrow(0, t, 1)),
                              {}};
    const Tensor alone = l.layer->forward_topk(Tensor::copy_of(x.view().narrow(0, t, 1)), single);
    expect_same_bytes(alone, Tensor::copy_of(one.view().narrow(0, t, 1)), "batch invariance");
  }
}

TEST(Mxfp4QuantTest, Dsv4ProcessSwapsHalvesAndMatchesDirectCall) {
  std::mt19937 rng(17);
  const int64_t E = 2, H = 128, I = 128;
  FusedMoEOptions o;
  o.num_experts = E;
  o.hidden_size = H;
  o.intermediate_size = I;
  o.topk_config.top_k = 2;
  o.runner_backend = MoeRunnerBackend::FLASHINFER_MXFP4;
  o.a2a_backend = MoeA2ABackend::NONE;
  o.runner_config.inplace = false;
  o.runner_config.swiglu_limit = 10.0f;
  auto method = std::make_shared<Mxfp4FlashinferCutlassMoEMethod>();
  FusedMoE layer(o, method);
  std::vector<Tensor> w13_bytes, w13_scales;
  for (int64_t e = 0; e < E; ++e)
    for (const char* shard : {"w1", "w3"}) {
      Tensor q = random_bytes(rng, {I, H / 2});
      TensorView qi = q.view();
      qi.dtype = DType::kI8;
      Tensor s = Tensor::empty({I, H / 32}, DType::kF32);
      std::uniform_int_distribution<int> ex(-3, 1);
      for (int64_t i = 0; i < s.numel(); ++i) s.ptr<float>()[i] = std::ldexp(1.0f, ex(rng));
      layer.weight_loader("w13_weight", Tensor(qi, q.owner()), shard, e);
      layer.weight_loader("w13_weight_scale_inv", s, shard, e);
      w13_bytes.push_back(q);
      w13_scales.push_back(s);
    }
  for (int64_t e = 0; e < E; ++e) {
    Tensor q = random_bytes(rng, {H, I / 2});
    TensorView qi = q.view();
    qi.dtype = DType::kI8;
    Tensor s = Tensor::empty({H, I / 32}, DType::kF32);
    for (int64_t i = 0; i < s.numel(); ++i) s.ptr<float>()[i] = 0.25f;
    layer.weight_loader("w2_weight", Tensor(qi, q.owner()), "w2", e);
    layer.weight_loader("w2_weight_scale_inv", s, "w2", e);
  }
  layer.process_weights_after_loading();
  // Manual [w3; w1] for expert 1, then the SM90 interleave of the whole tensor.
  Tensor manual = Tensor::empty({E, 2 * I, H / 2}, DType::kU8);
  for (int64_t e = 0; e < E; ++e) {
    std::memcpy(manual.ptr<uint8_t>() + e * 2 * I * H / 2, w13_bytes[2 * e + 1].ptr<uint8_t>(),
                I * H / 2);
    std::memcpy(manual.ptr<uint8_t>() + (e * 2 + 1) * I * H / 2, w13_bytes[2 * e].ptr<uint8_t>(),
                I * H / 2);
  }
  expect_same_bytes(layer.parameter("w13_weight"),
                    interleave_moe_weights_for_sm90_mixed_gemm(manual.view()), "dsv4 w13");
  const Tensor& folded = layer.parameter("w13_weight_scale_inv");
  EXPECT_EQ(folded.dtype(), DType::kU8);
  uint8_t code = 0;
  ASSERT_TRUE(e8m0_from_pow2(w13_scales[1].ptr<float>()[0], &code));  // expert 0, w3, row 0
  EXPECT_EQ(folded.ptr<uint8_t>()[0], code);  // folded [0, 0, 0, 0, 0] = row 0 (up), block 0
  const Tensor x = random_bf16(rng, {5, H}, 1.0f);
  const StandardTopKOutput topk = random_topk(rng, 5, E, 2);
  const Tensor out = layer.forward_topk(x, topk);
  const QuantInfoPtr q = method->quant_info(layer);
  EXPECT_FALSE(info_of(q).padded_hidden.has_value());
  ASSERT_TRUE(info_of(q).swiglu_limit.defined());
  EXPECT_EQ(info_of(q).swiglu_limit.ptr<float>()[1], 10.0f);
  EXPECT_EQ(info_of(q).swiglu_beta.ptr<float>()[0], 0.0f);
  expect_same_bytes(out, cutlass_fused_moe_mxfp4(direct_args(info_of(q), x, topk), scaled_gemm_ref),
                    "dsv4 layer vs direct");
}

TEST(Mxfp4QuantTest, ErrorsCarrySglangTexts) {
  FusedMoEOptions o;
  o.num_experts = 2;
  o.hidden_size = 192;
  o.intermediate_size = 128;
  o.topk_config.top_k = 1;
  o.runner_backend = MoeRunnerBackend::FLASHINFER_MXFP4;
  o.a2a_backend = MoeA2ABackend::NONE;
  try {
    FusedMoE layer(o, std::make_shared<Mxfp4FlashinferCutlassMoEMethod>());
    FAIL() << "H = 192 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "Mxfp4FlashinferCutlassMoEMethod requires hidden_size and "
                 "intermediate_size_per_partition to be multiples of 128 (got hidden=192, "
                 "intermediate=128).");
  }
  // A payload of another backend is a TypeError with sglang's text.
  std::mt19937 rng(1);
  GptOssCkpt c = make_ckpt(rng, 2, 128, 128);
  GptOssLayer l = make_gpt_oss(c);
  auto d = std::make_shared<StandardDispatchOutput>();
  d->hidden_states = random_bf16(rng, {2, 128}, 1.0f);
  d->topk_output = random_topk(rng, 2, 2, 1);
  try {
    l.layer->runner()->run(d, std::make_shared<TritonMoeQuantInfo>());
    FAIL() << "foreign payload accepted";
  } catch (const DTypeError& e) {
    EXPECT_STREQ(e.what(), "Unexpected quant_info type for flashinfer_mxfp4: TritonMoeQuantInfo");
  }
  // Half-given swiglu tensors and processing twice.
  auto q =
      std::make_shared<FlashInferMxfp4CutlassMoeQuantInfo>(info_of(l.method->quant_info(*l.layer)));
  q->swiglu_beta = Tensor();
  EXPECT_THROW(l.layer->runner()->run(d, q), InvalidArgument);
  EXPECT_THROW(l.layer->process_weights_after_loading(), InvalidArgument);
}

}  // namespace
}  // namespace moecore
