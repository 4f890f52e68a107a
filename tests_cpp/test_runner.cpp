// MoeRunner and its registries: the registered keys, sglang's construction errors (R1, R2),
// every executable path against the fp64 Eigen reference, fused == forced-permute path (R3),
// determinism across threads and ISA levels, batch invariance, empty input (R9), ids −1 (R14).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <set>
#include <thread>
#include <utility>

#include "moecore/core/error.h"
#include "moecore/core/thread_pool.h"
#include "moecore/dispatch/dispatcher.h"
#include "moecore/formats/quantize.h"
#include "moecore/runner/expert_compute.h"
#include "moecore/runner/quant_compute.h"
#include "moecore/runner/runner.h"
#include "support/counting_allocator.h"
#include "support/moe_problem.h"

namespace moecore {
namespace {

using testing::make_problem;

using testing::count_allocations;
using testing::MoeProblem;

TEST(RegistryTest, RegisteredKeysEqualTheExpectedTable) {
  EXPECT_TRUE(registration_errors().empty());
  std::set<std::pair<std::string, std::string>> fused, pre, post;
  std::set<std::string> cores;
  for (const auto& [k, origin] : registered_fused_funcs())
    fused.insert({to_string(k.first), to_string(k.second)});
  for (const auto& [k, origin] : registered_pre_permutes())
    pre.insert({to_string(k.first), to_string(k.second)});
  for (const auto& [k, origin] : registered_post_permutes())
    post.insert({to_string(k.first), to_string(k.second)});
  for (const auto& [k, origin] : registered_runner_cores()) cores.insert(to_string(k));
  const std::set<std::pair<std::string, std::string>> expected_fused = {
      {"none", "triton"},
      {"none", "torch_native"},
      {"none", "flashinfer_cutlass"},
      {"flashinfer", "flashinfer_cutlass"},
      {"none", "flashinfer_cutedsl"},
      {"flashinfer", "flashinfer_cutedsl"},
      {"deepep", "flashinfer_cutedsl"},
      {"none", "flashinfer_mxfp4"}};
  const std::set<std::pair<std::string, std::string>> expected_pre = {
      {"standard", "triton"},
      {"standard", "torch_native"},
      {"standard", "deep_gemm"},
      {"deepep_ll", "deep_gemm"},
      {"deepep_normal", "deep_gemm"}};
  const std::set<std::pair<std::string, std::string>> expected_post = {
      {"triton", "standard"},
      {"torch_native", "standard"},
      {"deep_gemm", "standard"},
      {"deep_gemm", "deepep_ll"},
      {"deep_gemm", "deepep_normal"}};
  EXPECT_EQ(fused, expected_fused);
  EXPECT_EQ(pre, expected_pre);
  EXPECT_EQ(post, expected_post);
  EXPECT_EQ(cores, (std::set<std::string>{"triton", "torch_native", "deep_gemm"}));
  for (const auto& [k, origin] : registered_fused_funcs())
    EXPECT_EQ(origin.rfind("cpp/moecore/runner/backends/", 0), 0u) << origin;
}

TEST(RegistryTest, DuplicatesAreRejectedWithSglangMessages) {
  auto noop_fused = [](const DispatchOutputPtr&, const QuantInfoPtr&, const MoeRunnerConfig&) {
    return CombineInputPtr();
  };
  try {
    register_fused_func(MoeA2ABackend::NONE, MoeRunnerBackend::TRITON, noop_fused, "test");
    FAIL() << "duplicate accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "Fused function for none to triton is already registered.");
  }
  try {
    register_pre_permute(DispatchOutputFormat::STANDARD, MoeRunnerBackend::TRITON,
                         [](auto&&...) { return RunnerInputPtr(); }, "test");
    FAIL() << "duplicate accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "Pre-permute method for standard to triton is already registered.");
  }
  try {
    register_post_permute(MoeRunnerBackend::TRITON, DispatchOutputFormat::STANDARD,
                          [](auto&&...) { return CombineInputPtr(); }, "test");
    FAIL() << "duplicate accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "Post-permute method for triton to standard is already registered.");
  }
}

TEST(MoeRunnerTest, ConstructionErrorsR1) {
  MoeRunnerConfig config;
  try {
    MoeRunner r(MoeRunnerBackend::MARLIN, config, MoeA2ABackend::DEEPEP);
    FAIL();
  } catch (const Unsupported& e) {
    EXPECT_STREQ(e.what(),
                 "Runner backend MoeRunnerBackend.MARLIN requires a fused func for a2a backend "
                 "deepep, but none is registered.");
  }
  try {
    MoeRunner r(MoeRunnerBackend::AITER, config, MoeA2ABackend::NONE);
    FAIL();
  } catch (const Unsupported& e) {
    EXPECT_EQ(std::string(e.what()).rfind("Unsupported runner backend: MoeRunnerBackend.AITER", 0), 0u);
  }
  EXPECT_THROW(MoeRunner(MoeRunnerBackend::AUTO, config), Unsupported);
  EXPECT_THROW(MoeRunner(MoeRunnerBackend::TRITON, config, MoeA2ABackend::NONE, true), Unsupported);
  config.activation = "swish";
  try {
    MoeRunner r(MoeRunnerBackend::TRITON, config);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "Unsupported activation: activation='swish'");
  }
}

struct PathParam {
  MoeRunnerBackend backend;
  bool unfused;
  DType dtype;
};

QuantInfoPtr quant_info_for(MoeRunnerBackend backend, const MoeProblem& p) {
  if (backend == MoeRunnerBackend::TORCH_NATIVE) {
    auto q = std::make_shared<TorchNativeMoeQuantInfo>();
    q->w13_weight = p.w13;
    q->w2_weight = p.w2;
    return q;
  }
  auto q = std::make_shared<TritonMoeQuantInfo>();
  q->w13_weight = p.w13;
  q->w2_weight = p.w2;
  return q;
}

Tensor run_path(const PathParam& param, const MoeProblem& p, float rsf = 1.0f,
                std::optional<IsaLevel> level = std::nullopt) {
  MoeRunnerConfig config;
  config.inplace = false;
  config.force_unfused = param.unfused;
  config.isa_level = level;
  if (rsf != 1.0f) config.routed_scaling_factor = rsf;
  MoeRunner runner(param.backend, config, MoeA2ABackend::NONE);
  EXPECT_EQ(runner.uses_fused_func(), !param.unfused);
  auto d = std::make_shared<StandardDispatchOutput>();
  d->hidden_states = p.x;
  d->topk_output = StandardTopKOutput{p.topk_weights, p.topk_ids, {}};
  auto out = runner.run(d, quant_info_for(param.backend, p));
  return std::dynamic_pointer_cast<StandardCombineInput>(out)->hidden_states;
}

class RunnerPathTest : public ::testing::TestWithParam<PathParam> {};

TEST_P(RunnerPathTest, MatchesFp64Reference) {
  const PathParam param = GetParam();
  std::mt19937 rng(11);
  for (auto [T, E, H, I, k] : {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{1, 4, 32, 16, 2},
                               {7, 8, 40, 24, 2}, {64, 8, 64, 48, 4}, {3, 1, 17, 5, 1}}) {
    MoeProblem p = make_problem(rng, T, E, H, I, k, param.dtype);
    const float rsf = 1.5f;
    Tensor out = run_path(param, p, rsf);
    const std::vector<double> ref = testing::reference_moe(p, rsf);
    const std::vector<float> got = testing::to_floats(out);
    double err = 0, norm = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      err += (got[i] - ref[i]) * (got[i] - ref[i]);
      norm += ref[i] * ref[i];
      const double tol = param.dtype == DType::kF32 ? 1e-5 : 2e-2;
      EXPECT_NEAR(got[i], ref[i], tol + tol * std::abs(ref[i])) << i;
    }
    EXPECT_LT(err / std::max(norm, 1e-30), param.dtype == DType::kF32 ? 1e-10 : 1e-4);
  }
}

TEST_P(RunnerPathTest, DeterministicAcrossThreadsLevelsAndBatches) {
  const PathParam param = GetParam();
  std::mt19937 rng(5);
  MoeProblem p = make_problem(rng, 64, 8, 40, 24, 2, param.dtype);
  ThreadPool::instance().set_num_threads(1);
  const std::vector<float> base = testing::to_floats(run_path(param, p, 1.0f, IsaLevel::kScalar));
  for (int threads : {1, 2, 3}) {
    ThreadPool::instance().set_num_threads(threads);
    for (IsaLevel level : available_isa_levels())
      EXPECT_EQ(testing::to_floats(run_path(param, p, 1.0f, level)), base)
          << threads << " threads, " << isa_level_name(level);
  }
  ThreadPool::instance().set_num_threads(available_cpus());
  // Batch invariance: every token alone gives the bits it gets inside the batch.
  for (int64_t t : {0, 13, 63}) {
    MoeProblem one = p;
    one.T = 1;
    one.x = Tensor::copy_of([&] {
      TensorView v = p.x.view();
      v.data = v.at({t, 0});
      v.shape[0] = 1;
      return v;
    }());
    auto slice_row = [&](const Tensor& src) {
      TensorView v = src.view();
      v.data = v.at({t, 0});
      v.shape[0] = 1;
      return Tensor::copy_of(v);
    };
    one.topk_ids = slice_row(p.topk_ids);
    one.topk_weights = slice_row(p.topk_weights);
    const std::vector<float> alone = testing::to_floats(run_path(param, one));
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), base.begin() + t * p.H)) << "token " << t;
  }
}

TEST_P(RunnerPathTest, EmptyInputR9AndInvalidIdsR14) {
  const PathParam param = GetParam();
  std::mt19937 rng(9);
  MoeProblem empty = make_problem(rng, 0, 4, 16, 8, 2, param.dtype);
  Tensor out = run_path(param, empty);
  EXPECT_EQ(out.size(0), 0);
  EXPECT_EQ(out.size(1), 16);
  // A slot with id −1 contributes exactly nothing: equals the same problem with k reduced.
  MoeProblem p = make_problem(rng, 5, 4, 16, 8, 2, param.dtype);
  MoeProblem reduced = p;
  reduced.k = 1;
  reduced.topk_ids = Tensor::empty({5, 1}, DType::kI32);
  reduced.topk_weights = Tensor::empty({5, 1}, DType::kF32);
  for (int64_t t = 0; t < 5; ++t) {
    reduced.topk_ids.ptr<int32_t>()[t] = p.topk_ids.ptr<int32_t>()[2 * t];
    reduced.topk_weights.ptr<float>()[t] = p.topk_weights.ptr<float>()[2 * t];
    p.topk_ids.ptr<int32_t>()[2 * t + 1] = -1;
  }
  EXPECT_EQ(testing::to_floats(run_path(param, p)), testing::to_floats(run_path(param, reduced)));
}

std::vector<PathParam> paths() {
  std::vector<PathParam> out;
  for (const auto& [backend, origin] : registered_runner_cores()) {
    // Backends whose payload carries plain f32/f16/bf16 experts (quant_info_for above); the
    // quantized backends (deep_gemm) have their own suites.
    if (backend != MoeRunnerBackend::TRITON && backend != MoeRunnerBackend::TORCH_NATIVE) continue;
    for (bool unfused : {false, true})
      for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) out.push_back({backend, unfused, d});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Paths, RunnerPathTest, ::testing::ValuesIn(paths()), [](const auto& info) {
  return to_string(info.param.backend) + (info.param.unfused ? "_permute_" : "_fused_") +
         dtype_name(info.param.dtype);
});

// A dispatch output whose format has no registered permute for the backend.
struct FakeLowLatencyOutput : DispatchOutput {
  DispatchOutputFormat format() const override { return DispatchOutputFormat::DEEPEP_LL; }
};

TEST(MoeRunnerTest, MissingPermuteIsSglangsAssertion) {
  MoeRunnerConfig config;
  config.force_unfused = true;
  MoeRunner runner(MoeRunnerBackend::TRITON, config, MoeA2ABackend::NONE);
  try {
    runner.run(std::make_shared<FakeLowLatencyOutput>(), std::make_shared<TritonMoeQuantInfo>());
    FAIL();
  } catch (const ContractViolation& e) {
    EXPECT_STREQ(e.what(), "Pre-permute function for deepep_ll to triton is not registered");
  }
}

TEST(ExpertLayoutTest, AlignBlockSizeMatchesSglangLayout) {
  // T=3, k=2: ids [[1, 0], [1, -1], [0, 1]]; block 4.
  Tensor ids = Tensor::empty({3, 2}, DType::kI32);
  const int32_t values[] = {1, 0, 1, -1, 0, 1};
  std::copy(values, values + 6, ids.ptr<int32_t>());
  Tensor w = Tensor::zeros({3, 2}, DType::kF32);
  RoutedTokens tokens;
  tokens.topk_ids = ids.view();
  tokens.topk_weights = w.view();
  tokens.num_tokens = 3;
  tokens.top_k = 2;
  BlockLayout layout = align_block_size(tokens, 3, 4);
  EXPECT_EQ(layout.num_tokens_post_padded, 8);
  const std::vector<int32_t> sorted(layout.sorted_token_ids.ptr<int32_t>(),
                                    layout.sorted_token_ids.ptr<int32_t>() + 8);
  EXPECT_EQ(sorted, (std::vector<int32_t>{1, 4, 6, 6, 0, 2, 5, 6}));
  EXPECT_EQ(layout.expert_ids.ptr<int32_t>()[0], 0);
  EXPECT_EQ(layout.expert_ids.ptr<int32_t>()[1], 1);
  int64_t slots[4];
  ASSERT_EQ(block_slots(layout.sorted_token_ids.ptr<int32_t>(), 0, 4, 6, slots), 2);
  EXPECT_EQ(std::vector<int64_t>(slots, slots + 2), (std::vector<int64_t>{1, 4}));
  ASSERT_EQ(block_slots(layout.sorted_token_ids.ptr<int32_t>(), 1, 4, 6, slots), 3);
  EXPECT_EQ(std::vector<int64_t>(slots, slots + 3), (std::vector<int64_t>{0, 2, 5}));
  SortedLayout sorted_layout = sort_by_expert(tokens, 3);
  const std::vector<int64_t> idxs(sorted_layout.idxs.ptr<int64_t>(),
                                  sorted_layout.idxs.ptr<int64_t>() + 5);
  EXPECT_EQ(idxs, (std::vector<int64_t>{1, 4, 0, 2, 5}));
  EXPECT_EQ(sorted_layout.tokens_per_expert.ptr<int64_t>()[2], 0);
}

TEST(StandardDispatcherTest, MapsGlobalIdsToLocalR14) {
  // 8 routed + 1 shared expert over 2 ranks; rank 1 owns routed 4..7 → 0..3, shared 8 → 4.
  StandardDispatcher d(9, 2, 1, 1);
  const int32_t* map = d.local_expert_mapping().ptr<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(map, map + 9), (std::vector<int32_t>{-1, -1, -1, -1, 0, 1, 2, 3, 4}));
  Tensor ids = Tensor::empty({1, 4}, DType::kI32);
  const int32_t values[] = {5, -1, 8, 0};
  std::copy(values, values + 4, ids.ptr<int32_t>());
  auto out = std::dynamic_pointer_cast<StandardDispatchOutput>(
      d.dispatch(Tensor::zeros({1, 4}, DType::kF32),
                 StandardTopKOutput{Tensor::zeros({1, 4}, DType::kF32), ids, {}}));
  const int32_t* local = std::get<StandardTopKOutput>(out->topk_output).topk_ids.ptr<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(local, local + 4), (std::vector<int32_t>{1, -1, 4, -1}));
  EXPECT_THROW(StandardDispatcher(9, 2, 2, 1), OutOfRange);
  EXPECT_THROW(StandardDispatcher(10, 4, 0, 1), InvalidArgument);
}


// The triton runner core and its pre-permute'd input for a bf16 problem (force_unfused).
struct TritonCoreCall {
  MoeRunner runner;
  QuantInfoPtr quant_info;
  RunnerInputPtr input;
  RunningState state;

  explicit TritonCoreCall(const MoeProblem& p)
      : runner(MoeRunnerBackend::TRITON, unfused_config(), MoeA2ABackend::NONE) {
    quant_info = quant_info_for(MoeRunnerBackend::TRITON, p);
    auto d = std::make_shared<StandardDispatchOutput>();
    d->hidden_states = p.x;
    d->topk_output = StandardTopKOutput{p.topk_weights, p.topk_ids, {}};
    const auto pre = find_pre_permute(DispatchOutputFormat::STANDARD, MoeRunnerBackend::TRITON);
    input = (*pre)(d, quant_info, runner.config(), state);
  }
  std::vector<float> run() {
    RunnerOutputPtr out = runner.runner_core()->run(input, quant_info, state);
    CombineInputPtr combined = (*find_post_permute(MoeRunnerBackend::TRITON,
                                                   DispatchOutputFormat::STANDARD))(
        out, quant_info, runner.config(), state);
    return testing::to_floats(
        std::dynamic_pointer_cast<StandardCombineInput>(combined)->hidden_states);
  }
  static MoeRunnerConfig unfused_config() {
    MoeRunnerConfig config;
    config.inplace = false;
    config.force_unfused = true;
    return config;
  }
};

TEST(ExpertWorkspaceTest, SteadyStateTritonCoreAllocatesOnlyItsOutput) {
  std::mt19937 rng(21);
  const MoeProblem p = make_problem(rng, 16, 8, 64, 40, 2, DType::kBF16);
  for (int threads : {1, 2}) {
    ThreadPool::instance().set_num_threads(threads);
    TritonCoreCall call(p);
    RunnerCore& core = *call.runner.runner_core();
    core.run(call.input, call.quant_info, call.state);  // the first call grows the workspace
    // What the output costs: its tensor, plus one make_shared for the RunnerOutput holding it.
    const int64_t output = count_allocations([&] {
      Tensor::zeros({p.T, p.k, p.H}, DType::kBF16);
    }) + 1;
    for (int repeat = 0; repeat < 3; ++repeat)
      EXPECT_EQ(count_allocations([&] { core.run(call.input, call.quant_info, call.state); }),
                output)
          << threads << " threads, call " << repeat + 2;
  }
  ThreadPool::instance().set_num_threads(available_cpus());
}

TEST(ExpertWorkspaceTest, RunnerUsedFromTwoThreadsTakesTurns) {
  std::mt19937 rng(22);
  const MoeProblem small = make_problem(rng, 3, 4, 32, 16, 2, DType::kBF16);
  const MoeProblem large = make_problem(rng, 40, 4, 32, 16, 2, DType::kBF16);
  TritonCoreCall a(small), b(large);
  const std::vector<float> want_a = a.run(), want_b = b.run();
  // Both inputs through a's runner at once: one workspace, two callers with different shapes.
  std::atomic<int> mismatches{0};
  auto hammer = [&](TritonCoreCall& call, const std::vector<float>& want, MoeRunner& runner) {
    for (int i = 0; i < 20; ++i) {
      RunnerOutputPtr out = runner.runner_core()->run(call.input, call.quant_info, call.state);
      CombineInputPtr combined = (*find_post_permute(MoeRunnerBackend::TRITON,
                                                     DispatchOutputFormat::STANDARD))(
          out, call.quant_info, runner.config(), call.state);
      if (testing::to_floats(std::dynamic_pointer_cast<StandardCombineInput>(combined)
                                 ->hidden_states) != want)
        ++mismatches;
    }
  };
  std::thread first([&] { hammer(a, want_a, a.runner); });
  std::thread second([&] { hammer(b, want_b, a.runner); });
  first.join();
  second.join();
  EXPECT_EQ(mismatches, 0);
}

// The expert schedule's fused epilogues (GEMM1's activation per column block, GEMM2's input
// quantized there when its quantizer works on segments, each token's row loaded and quantized
// once) give the bits of the unfused pipeline written out here: whole GEMM1 rows, the whole-row
// activation, whole-row quantization, per-slot input copies. Every activation layout, quantizers
// with and without segments (group 32 with I a multiple of it and not), 1, 3 and 8 threads.
struct UnfusedPipeline {
  const ExpertMlp& mlp;
  const MoeProblem& p;

  // The output rows [T·k, H] (slot order) of the valid slots, as run_expert_mlp stores them.
  std::vector<float> run(const ExpertRowMap& rows, RowScaleAt scale_at) const {
    const int64_t H = p.H, I = p.I, n1 = mlp.gemm1.weight.n;
    std::vector<float> out(static_cast<size_t>(p.T * p.k * H), 0.0f);
    for (int64_t e = 0; e < rows.num_experts(); ++e)
      for (int64_t r = rows.offsets[e]; r < rows.offsets[e + 1]; ++r) {
        std::vector<float> x(H), h1(n1), act(I), y(H);
        load_f32(p.x.view().at({rows.source[r], 0}), p.x.dtype(), H, x.data());
        std::vector<float> s1(static_cast<size_t>(mlp.gemm1.scales_per_row), 1.0f);
        if (mlp.gemm1.quantize) mlp.gemm1.quantize(x.data(), 1, H, H, s1.data());
        gemm_row(mlp.gemm1, e, x.data(), s1.data(), h1.data());
        finish(mlp.gemm1, e, scale_at == RowScaleAt::kGemm1 ? rows.scale[r] : 1.0f, h1);
        ActivationSpec spec = mlp.activation;
        spec.round_dtype = mlp.act_dtype;
        apply_activation(spec, h1.data(), n1, act.data(), I, 1, I);
        std::vector<float> s2(static_cast<size_t>(mlp.gemm2.scales_per_row), 1.0f);
        if (mlp.gemm2.quantize) mlp.gemm2.quantize(act.data(), 1, I, I, s2.data());
        gemm_row(mlp.gemm2, e, act.data(), s2.data(), y.data());
        finish(mlp.gemm2, e, scale_at == RowScaleAt::kGemm2 ? rows.scale[r] : 1.0f, y);
        std::copy(y.begin(), y.end(), out.begin() + rows.dest[r] * H);
      }
    return out;
  }

  void gemm_row(const ExpertGemm& g, int64_t e, const float* in, const float* scales,
                float* out) const {
    ActivationCodes a;
    a.codes = in;
    a.ld = g.weight.k;
    a.scales = g.quantize ? scales : nullptr;
    a.scales_per_row = g.scales_per_row;
    scaled_gemm_ref(a, 1, g.weight, e, 0, g.weight.n, out, g.weight.n);
  }
  void finish(const ExpertGemm& g, int64_t e, float scale, std::vector<float>& row) const {
    for (int64_t c = 0; c < static_cast<int64_t>(row.size()); ++c) {
      float v = row[c];
      if (g.bias.data != nullptr) {
        float b;
        load_f32(g.bias.at({e, c}), g.bias.dtype, 1, &b);
        v += b;
      }
      row[c] = round_to(mlp.act_dtype, v * scale);
    }
  }
};

TEST(ExpertScheduleTest, FusedEpiloguesGiveTheBitsOfTheUnfusedPipeline) {
  struct Layout {
    const char* name;
    ActivationSpec spec;
  };
  std::vector<Layout> layouts(5);
  layouts[0] = {"gate_up", {}};
  layouts[1] = {"up_gate", {}};
  layouts[1].spec.layout = GateUpLayout::kUpGate;
  layouts[2] = {"interleaved_32", {}};
  layouts[2].spec.layout = GateUpLayout::kUpGateInterleaved;
  layouts[2].spec.interleave_group = 32;
  layouts[3] = {"gpt_oss_pairs", {}};
  layouts[3].spec.alpha = 1.702f;
  layouts[3].spec.clamp_limit = 7.0f;
  layouts[4] = {"relu2", {}};
  layouts[4].spec.gated = false;
  layouts[4].spec.kind = Activation::RELU2;
  struct Quant {
    const char* name;
    ActQuant rule;
  };
  const Quant quants[] = {{"none", ActQuant::kNone},
                          {"fp8_group_32", ActQuant::kFp8PerTokenGroup},
                          {"fp8_per_token", ActQuant::kFp8PerToken}};
  std::mt19937 rng(31);
  for (int64_t I : {96, 80}) {
    const MoeProblem p = make_problem(rng, 9, 6, 64, I, 3, DType::kBF16);
    for (const Layout& layout : layouts)
      for (const Quant& quant : quants)
        for (RowScaleAt scale_at : {RowScaleAt::kGemm1, RowScaleAt::kGemm2}) {
          // The interleaved layout is defined for I a multiple of its group only.
          if (I % activation_column_align(layout.spec) != 0) continue;
          const bool gated = layout.spec.gated;
          const Tensor w13 = gated ? p.w13 : Tensor::copy_of(p.w13.view().narrow(1, 0, I));
          const Tensor b13 = testing::random_tensor(rng, {p.E, w13.size(1)}, DType::kBF16);
          const ExpertWeights w = check_expert_weights("test", w13, p.w2, b13, Tensor(), gated);
          ExpertMlp mlp = dense_expert_mlp(w, layout.spec, scaled_gemm_ref);
          std::vector<QuantizedTensor> fp8_weights;  // group rules: fp8 weights in 32 × 32 blocks
          fp8_weights.reserve(2);
          for (ExpertGemm* g : {&mlp.gemm1, &mlp.gemm2}) {
            if (quant.rule == ActQuant::kFp8PerTokenGroup) {
              fp8_weights.push_back(quantize_fp8_block(g->weight.data, 32, 32));
              g->weight.coding = WeightCoding::kFp8;
              g->weight.data = fp8_weights.back().q.view();
              g->weight.scale = fp8_weights.back().scale.view();
              g->weight.block_n = g->weight.block_k = 32;
            }
            g->quantize = make_act_quantizer(current_isa_level(), quant.rule, 0.0f, 32);
            g->scales_per_row = act_scales_per_row(quant.rule, g->weight.k, 32);
            g->quantize_segment = act_quant_segment(quant.rule, 32);
          }
          const RoutedTokens tokens = check_routed_tokens(
              "test", p.x, StandardTopKOutput{p.topk_weights, p.topk_ids, {}}, w);
          for (int threads : {1, 3, 8}) {  // 8: several column blocks per expert
            SCOPED_TRACE(::testing::Message() << "I=" << I << " " << layout.name << " "
                                              << quant.name << " threads=" << threads);
            ThreadPool::instance().set_num_threads(threads);
            ExpertWorkspace ws;
            ws.rows.group_slots(tokens, p.E, /*with_scale=*/true);
            const Tensor out = Tensor::zeros({p.T * p.k, p.H}, mlp.act_dtype);
            run_expert_mlp(mlp, ws, token_rows(tokens), scale_at, out.view());
            const std::vector<float> got = testing::to_floats(out);
            const std::vector<float> want = UnfusedPipeline{mlp, p}.run(ws.rows, scale_at);
            ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
          }
        }
  }
  ThreadPool::instance().set_num_threads(available_cpus());
}

// GEMM2's phase with the top-k sum over its own rows gives the bits of the phase storing
// per-slot rows followed by combine_topk: weighted and not, a routed scaling factor, ids −1,
// bf16 and f32 activations, 1, 3 and 8 threads; and with at most 8 rows an expert (one pass of
// the avx512 rows: a part's blocks of one expert merge into one item, summed block by block).
TEST(ExpertScheduleTest, SummedGemm2GivesTheBitsOfSlotRowsThenCombine) {
  std::mt19937 rng(37);
  struct Size {
    int64_t T, E, H, I, k;
  };
  for (const Size size : {Size{11, 5, 96, 48, 3}, Size{6, 5, 256, 48, 2}}) {
    for (DType dtype : {DType::kBF16, DType::kF32}) {
      MoeProblem p = make_problem(rng, size.T, size.E, size.H, size.I, size.k, dtype);
      p.topk_ids.ptr<int32_t>()[4] = -1;  // two slots of no expert
      p.topk_ids.ptr<int32_t>()[9] = -1;
      const Tensor b2 = testing::random_tensor(rng, {p.E, p.H}, dtype);
      const ExpertWeights w = check_expert_weights("test", p.w13, p.w2, Tensor(), b2, true);
      const ExpertMlp mlp =
          dense_expert_mlp(w, ActivationSpec{}, scaled_gemm_kernel(current_isa_level()));
      const RoutedTokens tokens =
          check_routed_tokens("test", p.x, StandardTopKOutput{p.topk_weights, p.topk_ids, {}}, w);
      for (bool weighted : {false, true})
        for (int threads : {1, 3, 8}) {
          SCOPED_TRACE(::testing::Message() << "T=" << p.T << " " << dtype_name(dtype)
                                            << " weighted=" << weighted << " threads=" << threads);
          ThreadPool::instance().set_num_threads(threads);
          const RowScaleAt scale_at = weighted ? RowScaleAt::kNone : RowScaleAt::kGemm2;
          ExpertWorkspace ws;
          ws.rows.group_slots(tokens, p.E, /*with_scale=*/true);
          expert_gemm1_phase(mlp, ws, token_rows(tokens), scale_at);
          const Tensor slots = Tensor::zeros({p.T, p.k, p.H}, dtype);
          expert_gemm2_phase(mlp, ws, scale_at, slot_rows(slots.view()));
          const Tensor want = Tensor::empty({p.T, p.H}, dtype);
          combine_topk(tokens, slots.view(), weighted, 0.75f, want.view());
          const Tensor got = Tensor::empty({p.T, p.H}, dtype);
          expert_gemm2_summed_phase(mlp, ws, scale_at,
                                    TopkSum{&tokens, weighted, 0.75f, got.view(), /*bias=*/{}});
          ASSERT_EQ(testing::to_floats(got), testing::to_floats(want));
        }
    }
  }
  ThreadPool::instance().set_num_threads(available_cpus());
}

// With a bias in the sum (TRT-LLM's finalize, flashinfer_mxfp4's contract), the summed phase
// gives out[t] = round(Σ_j w_j · (y_j + b2[e_j])) over the first W columns: y_j GEMM2's rounded
// row, the bias added in fp32 after that rounding, slots in order, ids −1 left out. Checked bit
// for bit against slot rows and that sum written out here, for W = H and a trimmed W < H.
TEST(ExpertScheduleTest, SummedGemm2AddsASumBiasAfterRoundingAndTrimsTheOutput) {
  std::mt19937 rng(39);
  MoeProblem p = make_problem(rng, 9, 5, 96, 48, 3, DType::kBF16);
  p.topk_ids.ptr<int32_t>()[4] = -1;  // token 1, slot 1
  const Tensor b2 = testing::random_tensor(rng, {p.E, p.H}, DType::kBF16);
  const ExpertWeights w = check_expert_weights("test", p.w13, p.w2, Tensor(), Tensor(), true);
  const ExpertMlp mlp =
      dense_expert_mlp(w, ActivationSpec{}, scaled_gemm_kernel(current_isa_level()));
  const RoutedTokens tokens =
      check_routed_tokens("test", p.x, StandardTopKOutput{p.topk_weights, p.topk_ids, {}}, w);
  const std::vector<float> bias = testing::to_floats(b2);
  for (int64_t width : {p.H, int64_t{80}})
    for (int threads : {1, 3, 8}) {
      SCOPED_TRACE(::testing::Message() << "W=" << width << " threads=" << threads);
      ThreadPool::instance().set_num_threads(threads);
      ExpertWorkspace ws;
      ws.rows.group_slots(tokens, p.E, /*with_scale=*/false);
      expert_gemm1_phase(mlp, ws, token_rows(tokens), RowScaleAt::kNone);
      const Tensor slots = Tensor::zeros({p.T, p.k, p.H}, DType::kBF16);
      expert_gemm2_phase(mlp, ws, RowScaleAt::kNone, slot_rows(slots.view()));
      const std::vector<float> y = testing::to_floats(slots);
      std::vector<float> want(static_cast<size_t>(p.T * width));
      for (int64_t t = 0; t < p.T; ++t)
        for (int64_t h = 0; h < width; ++h) {
          float acc = 0.0f;
          for (int64_t j = 0; j < p.k; ++j) {
            const int32_t e = tokens.id(t, j);
            if (e < 0) continue;
            const float v = y[(t * p.k + j) * p.H + h] + bias[e * p.H + h];
            acc += tokens.weight(t, j) * v;
          }
          want[t * width + h] = round_to(DType::kBF16, acc);
        }
      const Tensor got = Tensor::empty({p.T, width}, DType::kBF16);
      expert_gemm2_summed_phase(mlp, ws, RowScaleAt::kNone,
                                TopkSum{&tokens, /*weighted=*/true, 1.0f, got.view(), b2.view()});
      const std::vector<float> got_values = testing::to_floats(got);
      ASSERT_EQ(std::memcmp(got_values.data(), want.data(), want.size() * sizeof(float)), 0);
    }
  ThreadPool::instance().set_num_threads(available_cpus());
}

// Per-expert α, β and limit (ExpertMlp::expert_alpha/_beta/_limit) give each expert's rows the
// bits of a schedule whose activation has that expert's values as its own; and the GEMM1 item
// check sees each hit expert's activation columns [0, I) once, cut into its items, and a check
// that throws fails the call with its own error before GEMM2 writes anything.
TEST(ExpertScheduleTest, PerExpertSwigluAndTheGemm1ItemCheck) {
  std::mt19937 rng(43);
  // H = 2048: 8 KiB of w13 per activation column, so an expert's 256 columns are 4 L2 blocks.
  const MoeProblem p = make_problem(rng, 7, 4, 2048, 256, 2, DType::kBF16);
  const ExpertWeights w = check_expert_weights("test", p.w13, p.w2, Tensor(), Tensor(), true);
  ActivationSpec spec;
  spec.layout = GateUpLayout::kUpGate;
  const float alpha[] = {1.702f, 0.5f, 2.0f, 1.0f}, beta[] = {1.0f, -0.25f, 0.5f, 1.5f},
              limit[] = {7.0f, 0.25f, 1.0f, 1e30f};
  auto per_expert = [&](const float* values) {
    Tensor t = Tensor::empty({p.E}, DType::kF32);
    std::copy(values, values + p.E, t.ptr<float>());
    return t;
  };
  const Tensor alphas = per_expert(alpha), betas = per_expert(beta), limits = per_expert(limit);
  ExpertMlp mlp = dense_expert_mlp(w, spec, scaled_gemm_kernel(current_isa_level()));
  mlp.expert_alpha = alphas.view();
  mlp.expert_beta = betas.view();
  mlp.expert_limit = limits.view();
  const RoutedTokens tokens =
      check_routed_tokens("test", p.x, StandardTopKOutput{p.topk_weights, p.topk_ids, {}}, w);
  for (int threads : {1, 3, 8}) {
    SCOPED_TRACE(::testing::Message() << "threads=" << threads);
    ThreadPool::instance().set_num_threads(threads);
    std::mutex seen_mutex;
    std::vector<std::vector<std::pair<int64_t, int64_t>>> seen(p.E);
    mlp.check_gemm1_item = [&](int64_t e, int64_t col0, int64_t cols) {
      std::lock_guard<std::mutex> lock(seen_mutex);
      seen[e].push_back({col0, cols});
    };
    ExpertWorkspace ws;
    ws.rows.group_slots(tokens, p.E, /*with_scale=*/false);
    const Tensor got = Tensor::zeros({p.T * p.k, p.H}, DType::kBF16);
    run_expert_mlp(mlp, ws, token_rows(tokens), RowScaleAt::kNone, got.view());
    int64_t most_rows = 0;
    for (int64_t e = 0; e < p.E; ++e)
      most_rows = std::max(most_rows, ws.rows.offsets[e + 1] - ws.rows.offsets[e]);
    for (int64_t e = 0; e < p.E; ++e) {
      if (ws.rows.offsets[e + 1] == ws.rows.offsets[e]) {
        EXPECT_TRUE(seen[e].empty()) << "expert " << e;
        continue;
      }
      std::sort(seen[e].begin(), seen[e].end());
      int64_t covered = 0;
      for (const auto& [col0, cols] : seen[e]) {
        EXPECT_EQ(col0, covered) << "expert " << e;
        covered = col0 + cols;
      }
      EXPECT_EQ(covered, p.I) << "expert " << e;
      // One thread runs every block of an expert; with no more rows than one pass of the row
      // serves (an expert has at most 7 here), they merge into one item, else stay 4 (fewer
      // where the row asks for wider calls: the AMX float tiles' 512 columns make one).
      const int64_t min_cols = std::max<int64_t>(1, scaled_gemm_min_call_columns(mlp.gemm));
      const int64_t blocks = std::min<int64_t>(4, (p.I + min_cols - 1) / min_cols);
      if (threads == 1)
        EXPECT_EQ(static_cast<int64_t>(seen[e].size()),
                  most_rows <= scaled_gemm_one_pass_rows(mlp.gemm) ? 1 : blocks)
            << "expert " << e;
      ExpertMlp alone = dense_expert_mlp(w, spec, mlp.gemm);
      alone.activation.alpha = alpha[e];
      alone.activation.beta = beta[e];
      alone.activation.clamp_limit = limit[e];
      ExpertWorkspace alone_ws;
      alone_ws.rows.group_slots(tokens, p.E, /*with_scale=*/false);
      const Tensor want = Tensor::zeros({p.T * p.k, p.H}, DType::kBF16);
      run_expert_mlp(alone, alone_ws, token_rows(tokens), RowScaleAt::kNone, want.view());
      for (int64_t r = ws.rows.offsets[e]; r < ws.rows.offsets[e + 1]; ++r) {
        const int64_t slot = ws.rows.dest[r];
        EXPECT_EQ(std::memcmp(got.view().at({slot, 0}), want.view().at({slot, 0}), p.H * 2), 0)
            << "expert " << e << ", slot " << slot;
      }
    }
    mlp.check_gemm1_item = [](int64_t e, int64_t, int64_t) {
      MOECORE_CHECK(e != 2, "expert 2 refused");
    };
    const Tensor untouched = Tensor::zeros({p.T * p.k, p.H}, DType::kBF16);
    EXPECT_THROW(run_expert_mlp(mlp, ws, token_rows(tokens), RowScaleAt::kNone, untouched.view()),
                 InvalidArgument);
    for (float v : testing::to_floats(untouched)) ASSERT_EQ(v, 0.0f);
    mlp.check_gemm1_item = nullptr;
  }
  ThreadPool::instance().set_num_threads(available_cpus());
}

// The summed phase sums a token's block in whichever GEMM2 item finishes the token's last row of
// it, and gives tokens without rows their zeros from the items' threads: the same bits as slot
// rows then combine_topk (compared bit for bit, so −0 counts) for tokens with every slot −1, a
// slot routed to an expert with no rows here (as expert parallelism drops them), the same
// expert twice in one token, a batch with no row at all, and many column blocks per expert on
// 1, 2, 5 and 8 threads, repeated to give the decrements different interleavings.
TEST(ExpertScheduleTest, SummedGemm2SumsInTheItemThatFinishesAToken) {
  std::mt19937 rng(41);
  MoeProblem p = make_problem(rng, 13, 6, 160, 32, 4, DType::kBF16);
  int32_t* ids = p.topk_ids.ptr<int32_t>();
  for (int64_t j = 0; j < p.k; ++j) ids[2 * p.k + j] = -1;  // token 2: no slot
  ids[5 * p.k + 3] = ids[5 * p.k + 1];                       // token 5: one expert twice
  const ExpertWeights w = check_expert_weights("test", p.w13, p.w2, Tensor(), Tensor(), true);
  const ExpertMlp mlp =
      dense_expert_mlp(w, ActivationSpec{}, scaled_gemm_kernel(current_isa_level()));
  const RoutedTokens tokens =
      check_routed_tokens("test", p.x, StandardTopKOutput{p.topk_weights, p.topk_ids, {}}, w);
  // Expert `dropped`'s rows removed from the map (−1: none; E: every row).
  auto rows_without = [&](int64_t dropped) {
    ExpertRowMap rows;
    rows.group_slots(tokens, p.E, /*with_scale=*/true);
    int64_t first = 0, last = 0;  // the rows dropped
    if (dropped == p.E) last = rows.rows();
    if (dropped >= 0 && dropped < p.E) {
      first = rows.offsets[dropped];
      last = rows.offsets[dropped + 1];
    }
    for (auto* v : {&rows.source, &rows.dest}) v->erase(v->begin() + first, v->begin() + last);
    rows.scale.erase(rows.scale.begin() + first, rows.scale.begin() + last);
    for (int64_t e = 1; e <= p.E; ++e)
      rows.offsets[e] -= std::clamp(rows.offsets[e] - first, int64_t{0}, last - first);
    return rows;
  };
  for (int64_t dropped : {int64_t{-1}, int64_t{3}, p.E})
    for (bool weighted : {false, true})
      for (int threads : {1, 2, 5, 8})
        for (int repeat = 0; repeat < 4; ++repeat) {
          SCOPED_TRACE(::testing::Message() << "dropped=" << dropped << " weighted=" << weighted
                                            << " threads=" << threads);
          ThreadPool::instance().set_num_threads(threads);
          const RowScaleAt scale_at = weighted ? RowScaleAt::kNone : RowScaleAt::kGemm2;
          ExpertWorkspace ws;
          ws.rows = rows_without(dropped);
          expert_gemm1_phase(mlp, ws, token_rows(tokens), scale_at);
          const Tensor slots = Tensor::zeros({p.T, p.k, p.H}, DType::kBF16);
          expert_gemm2_phase(mlp, ws, scale_at, slot_rows(slots.view()));
          const Tensor want = Tensor::empty({p.T, p.H}, DType::kBF16);
          combine_topk(tokens, slots.view(), weighted, -0.5f, want.view());
          Tensor got = Tensor::empty({p.T, p.H}, DType::kBF16);
          std::memset(got.view().data, 0x7f, static_cast<size_t>(p.T * p.H * 2));  // overwritten
          expert_gemm2_summed_phase(mlp, ws, scale_at,
                                    TopkSum{&tokens, weighted, -0.5f, got.view()});
          ASSERT_EQ(std::memcmp(got.view().data, want.view().data,
                                static_cast<size_t>(p.T * p.H * 2)),
                    0);
        }
  ThreadPool::instance().set_num_threads(available_cpus());
}

}  // namespace
}  // namespace moecore
