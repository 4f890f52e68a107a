// NVFP4 and the FlashInfer backends in C++: flashinfer_cutlass (bf16 against the fp64 Eigen
// reference, fp4 determinism / batch invariance / R9 / R15), flashinfer_cutedsl v2 equal to
// flashinfer_cutlass on the equivalent layout, ModelOptNvFp4FusedMoEMethod's processing (formats
// layouts, the block-scale dtype assertion, R11, R13, R17) and the EP loader of global-id
// backends.
#include <gtest/gtest.h>

#include <cmath>

#include "moecore/core/error.h"
#include "moecore/core/thread_pool.h"
#include "moecore/formats/layout.h"
#include "moecore/formats/quantize.h"
#include "moecore/layer/fused_moe.h"
#include "moecore/quant/modelopt_nvfp4.h"
#include "moecore/runner/runner.h"
#include "support/moe_problem.h"

namespace moecore {
namespace {

Tensor scalar_f32(float v) {
  Tensor t = Tensor::empty({1}, DType::kF32);
  t.ptr<float>()[0] = v;
  return t;
}

Tensor filled_f32(int64_t n, float v) {
  Tensor t = Tensor::empty({n}, DType::kF32);
  for (int64_t i = 0; i < n; ++i) t.ptr<float>()[i] = v;
  return t;
}

// NVFP4 experts from f32 weights (one global scale per tensor), [Up; Gate] w13.
struct Fp4Experts {
  int64_t E, H, I;
  Tensor w13, w13_sf, w2, w2_sf;  // packed + linear scales; w13 is [Up; Gate]
  float w13_gs, w2_gs;
};

Fp4Experts make_fp4_experts(std::mt19937& rng, int64_t E, int64_t H, int64_t I) {
  Fp4Experts f{E, H, I};
  Tensor w13 = testing::random_tensor(rng, {E, 2 * I, H}, DType::kF32, 0.1f);
  Tensor w2 = testing::random_tensor(rng, {E, H, I}, DType::kF32, 0.1f);
  f.w13_gs = nvfp4_global_scales(w13.view(), false).ptr<float>()[0];
  f.w2_gs = nvfp4_global_scales(w2.view(), false).ptr<float>()[0];
  QuantizedTensor q13 = quantize_nvfp4(w13.view(), f.w13_gs);
  QuantizedTensor q2 = quantize_nvfp4(w2.view(), f.w2_gs);
  f.w13 = q13.q;
  f.w13_sf = q13.scale;
  f.w2 = q2.q;
  f.w2_sf = q2.scale;
  return f;
}

constexpr float kA1 = 100.0f, kA2 = 2000.0f;

QuantInfoPtr cutlass_fp4_info(const Fp4Experts& f) {
  auto q = std::make_shared<FlashInferCutlassMoeQuantInfo>();
  q->quant_type = "fp4";
  q->w13_weight = f.w13;
  q->w2_weight = f.w2;
  q->quant_scales = {scalar_f32(kA1),
                     swizzle_nvfp4_scales(f.w13_sf.view()),
                     filled_f32(f.E, 1.0f / (kA1 * f.w13_gs)),
                     scalar_f32(kA2),
                     swizzle_nvfp4_scales(f.w2_sf.view()),
                     filled_f32(f.E, 1.0f / (kA2 * f.w2_gs))};
  return q;
}

struct Routed {
  Tensor x, ids, weights;
};

Routed make_routed(std::mt19937& rng, int64_t T, int64_t E, int64_t H, int64_t k) {
  testing::MoeProblem p = testing::make_problem(rng, T, E, H, 16, k, DType::kBF16);
  return {p.x, p.topk_ids, p.topk_weights};
}

Tensor run(MoeRunnerBackend backend, const Routed& r, const QuantInfoPtr& q,
           MoeRunnerConfig config = {}, MoeA2ABackend a2a = MoeA2ABackend::NONE) {
  config.inplace = false;
  MoeRunner runner(backend, config, a2a);
  auto d = std::make_shared<StandardDispatchOutput>();
  d->hidden_states = r.x;
  d->topk_output = StandardTopKOutput{r.weights, r.ids, {}};
  auto out = std::dynamic_pointer_cast<StandardCombineInput>(runner.run(d, q));
  return out->hidden_states;
}

Routed slice_tokens(const Routed& r, int64_t t0, int64_t n) {
  return {Tensor::copy_of(r.x.view().narrow(0, t0, n)),
          Tensor::copy_of(r.ids.view().narrow(0, t0, n)),
          Tensor::copy_of(r.weights.view().narrow(0, t0, n))};
}

TEST(FlashInferCutlassTest, Bf16QuantTypeMatchesFp64ReferenceOnUpGateWeights) {
  std::mt19937 rng(3);
  testing::MoeProblem p = testing::make_problem(rng, 9, 5, 32, 24, 2, DType::kF32);
  // The reference takes [Gate; Up]; flashinfer_cutlass takes [Up; Gate].
  auto q = std::make_shared<FlashInferCutlassMoeQuantInfo>();
  q->quant_type = "bf16";
  q->w13_weight = swap_w13_halves(p.w13.view(), 1);
  q->w2_weight = p.w2;
  MoeRunnerConfig config;
  config.routed_scaling_factor = 1.5f;
  const std::vector<float> got = testing::to_floats(
      run(MoeRunnerBackend::FLASHINFER_CUTLASS, {p.x, p.topk_ids, p.topk_weights}, q, config));
  const std::vector<double> ref = testing::reference_moe(p, 1.5);
  for (size_t i = 0; i < ref.size(); ++i)
    EXPECT_NEAR(got[i], ref[i], 1e-4 + 1e-4 * std::abs(ref[i])) << i;
}

TEST(FlashInferCutlassTest, Fp4DeterministicAcrossThreadsAndBatchInvariant) {
  std::mt19937 rng(5);
  Fp4Experts f = make_fp4_experts(rng, 6, 64, 32);
  Routed r = make_routed(rng, 37, 6, 64, 3);
  QuantInfoPtr q = cutlass_fp4_info(f);
  const int before = ThreadPool::instance().num_threads();
  ThreadPool::instance().set_num_threads(1);
  const std::vector<float> one =
      testing::to_floats(run(MoeRunnerBackend::FLASHINFER_CUTLASS, r, q));
  ThreadPool::instance().set_num_threads(2);
  const std::vector<float> two =
      testing::to_floats(run(MoeRunnerBackend::FLASHINFER_CUTLASS, r, q));
  ThreadPool::instance().set_num_threads(before);
  EXPECT_EQ(one, two);
  for (int64_t t : {0, 20, 36}) {
    const std::vector<float> alone =
        testing::to_floats(run(MoeRunnerBackend::FLASHINFER_CUTLASS, slice_tokens(r, t, 1), q));
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), one.begin() + t * 64)) << "token " << t;
  }
}

TEST(FlashInferCutlassTest, R9EmptyInputAndR15Guards) {
  std::mt19937 rng(6);
  Fp4Experts f = make_fp4_experts(rng, 4, 32, 16);
  QuantInfoPtr q = cutlass_fp4_info(f);
  Routed empty = make_routed(rng, 0, 4, 32, 2);
  Tensor out = run(MoeRunnerBackend::FLASHINFER_CUTLASS, empty, q);
  EXPECT_EQ(out.view().shape_vector(), (std::vector<int64_t>{0, 32}));
  EXPECT_EQ(out.dtype(), DType::kBF16);
  Routed r = make_routed(rng, 3, 4, 32, 2);
  MoeRunnerConfig config;
  config.apply_router_weight_on_input = true;
  try {
    run(MoeRunnerBackend::FLASHINFER_CUTLASS, r, q, config);
    FAIL() << "expected ContractViolation";
  } catch (const ContractViolation& e) {
    EXPECT_STREQ(e.what(), "apply_router_weight_on_input is not supported for Flashinfer");
  }
  MoeRunnerConfig relu;
  relu.activation = "relu2";  // gated relu2 is rejected by activation_spec already
  relu.is_gated = true;
  EXPECT_THROW(run(MoeRunnerBackend::FLASHINFER_CUTLASS, r, q, relu), InvalidArgument);
  MoeRunnerConfig silu;
  silu.is_gated = false;
  try {
    run(MoeRunnerBackend::FLASHINFER_CUTLASS, r, q, silu);
    FAIL() << "expected ContractViolation";
  } catch (const ContractViolation& e) {
    EXPECT_STREQ(e.what(),
                 "Activation 'silu' (is_gated=False) maps to Silu, which is not "
                 "supported by flashinfer cutlass moe.");
  }
}

TEST(FlashInferCuteDslTest, V2EqualsCutlassOnTheEquivalentLayout) {
  std::mt19937 rng(7);
  Fp4Experts f = make_fp4_experts(rng, 5, 64, 128);
  Routed r = make_routed(rng, 23, 5, 64, 2);
  QuantInfoPtr cut = cutlass_fp4_info(f);
  auto cute = std::make_shared<CuteDslFp4MoeQuantInfo>();
  cute->w13_weight = interleave_w13_halves(f.w13.view(), 64, 1);
  Tensor sw13 = swizzle_nvfp4_scales(interleave_w13_halves(f.w13_sf.view(), 64, 1).view());
  Tensor sw2 = swizzle_nvfp4_scales(f.w2_sf.view());
  cute->w13_weight_sf = Tensor(nvfp4_scales_mma_view(sw13.view()), sw13.owner());
  cute->w2_weight_sf = Tensor(nvfp4_scales_mma_view(sw2.view()), sw2.owner());
  cute->w2_weight = f.w2;
  auto* c = static_cast<FlashInferCutlassMoeQuantInfo*>(cut.get());
  cute->a1_scale = c->quant_scales[0];
  cute->w1_alpha = c->quant_scales[2];
  cute->a2_scale = c->quant_scales[3];
  cute->w2_alpha = c->quant_scales[5];
  EXPECT_EQ(testing::to_floats(run(MoeRunnerBackend::FLASHINFER_CUTEDSL, r, cute)),
            testing::to_floats(run(MoeRunnerBackend::FLASHINFER_CUTLASS, r, cut)));
  MoeRunnerConfig gelu;
  gelu.activation = "gelu";
  try {
    run(MoeRunnerBackend::FLASHINFER_CUTEDSL, r, cute, gelu);
    FAIL() << "expected ContractViolation";
  } catch (const ContractViolation& e) {
    EXPECT_STREQ(e.what(), "Only silu is supported for CuteDSL MoE.");
  }
}

// ---------------------------------------------------------------------------------------------
// ModelOptNvFp4FusedMoEMethod.

FusedMoEOptions nvfp4_options(MoeRunnerBackend backend, int64_t E, int64_t H, int64_t I,
                              int64_t ep_size = 1, int64_t ep_rank = 0) {
  FusedMoEOptions o;
  o.num_experts = E;
  o.hidden_size = H;
  o.intermediate_size = I;
  o.topk_config.top_k = 2;
  o.ep_size = ep_size;
  o.ep_rank = ep_rank;
  o.runner_backend = backend;
  o.a2a_backend = MoeA2ABackend::NONE;
  o.runner_config.inplace = false;
  return o;
}

// Fills every loaded parameter of the layer with valid NVFP4 data directly (no loader).
void fill_params(FusedMoE& layer, std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255), scale(0x30, 0x40);
  for (const char* name : {"w13_weight", "w2_weight"}) {
    const Tensor& t = layer.parameter(name);
    for (int64_t i = 0; i < t.numel(); ++i) t.ptr<uint8_t>()[i] = static_cast<uint8_t>(byte(rng));
  }
  for (const char* name : {"w13_weight_scale", "w2_weight_scale"}) {
    const Tensor& t = layer.parameter(name);
    for (int64_t i = 0; i < t.numel(); ++i) t.ptr<uint8_t>()[i] = static_cast<uint8_t>(scale(rng));
  }
  std::uniform_real_distribution<float> u(0.5f, 2.0f);
  for (const char* name :
       {"w13_weight_scale_2", "w2_weight_scale_2", "w13_input_scale", "w2_input_scale"}) {
    const Tensor& t = layer.parameter(name);
    for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = u(rng) * 1e-3f;
  }
}

TEST(QuantNvfp4Test, ProcessedLayoutsAreTheFormatsTransforms) {
  std::mt19937 rng(11);
  for (MoeRunnerBackend backend :
       {MoeRunnerBackend::FLASHINFER_CUTLASS, MoeRunnerBackend::FLASHINFER_CUTEDSL}) {
    auto method = std::make_shared<ModelOptNvFp4FusedMoEMethod>();
    FusedMoE layer(nvfp4_options(backend, 4, 64, 64), method);
    fill_params(layer, rng);
    const Tensor w13 = Tensor::copy_of(layer.parameter("w13_weight").view());
    const Tensor s13 = Tensor::copy_of(layer.parameter("w13_weight_scale").view());
    layer.process_weights_after_loading();
    const bool v2 = backend == MoeRunnerBackend::FLASHINFER_CUTEDSL;
    EXPECT_EQ(method->is_cutedsl_v2(), v2);
    const Tensor want_w13 = v2 ? interleave_w13_halves(w13.view(), 64, 1) : w13;
    const Tensor want_s13 =
        swizzle_nvfp4_scales((v2 ? interleave_w13_halves(s13.view(), 64, 1) : s13).view());
    auto bytes = [](const Tensor& t) {
      const uint8_t* p = static_cast<const uint8_t*>(t.view().data);
      return std::vector<uint8_t>(p, p + t.numel());
    };
    EXPECT_EQ(bytes(layer.parameter("w13_weight")), bytes(want_w13));
    EXPECT_EQ(bytes(layer.parameter("w13_blockscale_swizzled")), bytes(want_s13));
    if (v2) {  // the MMA view shares the swizzled storage
      EXPECT_EQ(layer.parameter("w13_blockscale_mma").view().data,
                layer.parameter("w13_blockscale_swizzled").view().data);
    }
  }
}

TEST(QuantNvfp4Test, BlockscaleDtypeMustBeE4m3) {
  auto method = std::make_shared<ModelOptNvFp4FusedMoEMethod>();
  FusedMoE layer(nvfp4_options(MoeRunnerBackend::FLASHINFER_CUTLASS, 4, 32, 32), method);
  layer.register_parameter("w2_weight_scale", Tensor::zeros({4, 32, 2}, DType::kU8),
                           {ShardLayout::kW2});
  try {
    layer.process_weights_after_loading();
    FAIL() << "expected ContractViolation";
  } catch (const ContractViolation& e) {
    EXPECT_STREQ(e.what(), "w2 Weight Blockscale must be represented as FP8-E4M3");
  }
}

TEST(QuantNvfp4Test, R11GatedPaddingAsserts) {
  std::mt19937 rng(12);
  auto method = std::make_shared<ModelOptNvFp4FusedMoEMethod>();
  FusedMoE layer(nvfp4_options(MoeRunnerBackend::FLASHINFER_CUTLASS, 4, 32, 48), method);
  fill_params(layer, rng);
  try {
    layer.process_weights_after_loading();
    FAIL() << "expected ContractViolation";
  } catch (const ContractViolation& e) {
    EXPECT_STREQ(e.what(),
                 "The intermediate size required padding, but padding is also "
                 "implemented for gated activations");
  }
}

TEST(QuantNvfp4Test, R13ScalarisationHelpers) {
  const Tensor q = Tensor::empty({3}, DType::kF32);
  q.ptr<float>()[0] = 4.0f;
  q.ptr<float>()[1] = 0.5f;
  q.ptr<float>()[2] = 2.0f;
  EXPECT_EQ(cutedsl_quant_scale_to_scalar(q.view(), "q").ptr<float>()[0], 0.5f);
  EXPECT_EQ(
      cutedsl_quant_scale_to_scalar(Tensor::empty({0}, DType::kF32).view(), "q").ptr<float>()[0],
      1.0f);
  CuteDslScaleInputs in;
  in.w13_input_scale_quant = q;
  in.w2_input_scale_quant = scalar_f32(8.0f);
  in.g1_alphas = filled_f32(4, 1.0f);
  in.g2_alphas = filled_f32(4, 1.0f);
  in.w13_weight_scale_2 = Tensor::zeros({4, 2}, DType::kF32);
  in.w2_weight_scale_2 = filled_f32(5, 1.0f);
  try {
    resolve_cutedsl_standard_scales(in);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "Unable to align w2_weight_scale_2 shape=(5,) to alpha shape=(4,) "
                 "for CuteDSL standard scale resolution.");
  }
  in.w2_weight_scale_2 = filled_f32(8, 3.0f);
  in.num_local_experts = 4;
  in.num_experts = 8;
  in.moe_ep_rank = 1;
  CuteDslStandardScales s = resolve_cutedsl_standard_scales(in);
  EXPECT_EQ(s.w2_alpha.ptr<float>()[3], 3.0f / 8.0f);
  EXPECT_EQ(s.used_input_scale.ptr<float>()[0], 0.5f);
}

TEST(QuantNvfp4Test, R17VersionFixedAtConstruction) {
  const MoeA2ABackend a2a_before = get_moe_a2a_backend();
  const MoeRunnerBackend runner_before = get_moe_runner_backend();
  set_moe_runner_backend(MoeRunnerBackend::FLASHINFER_CUTEDSL);
  auto method = std::make_shared<ModelOptNvFp4FusedMoEMethod>();
  FusedMoEOptions o = nvfp4_options(MoeRunnerBackend::AUTO, 4, 32, 64);
  o.runner_backend.reset();  // read the process-wide backend now
  FusedMoE layer(o, method);
  set_moe_a2a_backend(MoeA2ABackend::DEEPEP);  // a later swap
  set_moe_runner_backend(MoeRunnerBackend::FLASHINFER_CUTLASS);
  std::mt19937 rng(13);
  fill_params(layer, rng);
  layer.process_weights_after_loading();
  EXPECT_TRUE(method->is_cutedsl_v2());
  EXPECT_TRUE(method->load_up_proj_weight_first());
  EXPECT_EQ(method->resolved_backend(), MoeRunnerBackend::FLASHINFER_CUTEDSL);
  EXPECT_EQ(layer.runner()->a2a_backend(), MoeA2ABackend::NONE);
  EXPECT_NE(dynamic_cast<CuteDslFp4MoeQuantInfo*>(method->quant_info(layer).get()), nullptr);
  set_moe_a2a_backend(a2a_before);
  set_moe_runner_backend(runner_before);
}

TEST(QuantNvfp4Test, GlobalIdBackendLoaderKeepsOnlyThisRanksExperts) {
  auto method = std::make_shared<ModelOptNvFp4FusedMoEMethod>();
  FusedMoE layer(nvfp4_options(MoeRunnerBackend::FLASHINFER_CUTLASS, 8, 32, 32, 2, 1), method);
  EXPECT_FALSE(layer.dispatcher()->local_expert_mapping().defined());  // global ids
  EXPECT_EQ(layer.local_expert_id(1), -1);
  EXPECT_EQ(layer.local_expert_id(5), 1);
  Tensor w = Tensor::zeros({32, 16}, DType::kU8);
  w.ptr<uint8_t>()[0] = 0x77;
  EXPECT_FALSE(layer.weight_loader("w13_weight", w, "w1", 1));  // rank 0's expert
  EXPECT_TRUE(layer.weight_loader("w13_weight", w, "w1", 5));
  // [Up, Gate]: shard w1 (gate) lands in the second half.
  EXPECT_EQ(layer.parameter("w13_weight").ptr<uint8_t>()[(1 * 64 + 32) * 16], 0x77);
  // Global input scales are kept for every expert.
  EXPECT_TRUE(layer.weight_loader("w2_input_scale", scalar_f32(0.25f), "w2", 1));
  EXPECT_EQ(layer.parameter("w2_input_scale").ptr<float>()[1], 0.25f);
}

}  // namespace
}  // namespace moecore
