// The prepared run of (standard, flashinfer_mxfp4): prepared once per dispatch output, run() on
// changing contents (hidden states, routing with −1 ids and padding rows, routed weights) gives
// a fresh eager MoeRunner::run's bits and allocates nothing, for GPT-OSS (clamped SwiGLU, biases,
// padded hidden), DSv4 (with and without swiglu_limit) and a hand-built expert-parallel payload
// with int64 ids, at every kernel level and thread count, with the quant method's kernel layout
// and with one the run builds itself (which equal the deinterleaved contract byte for byte); bad
// contents raise eager's errors without touching the output.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/core/thread_pool.h"
#include "moecore/formats/layout.h"
#include "moecore/isa/isa.h"
#include "moecore/layer/fused_moe.h"
#include "moecore/quant/mxfp4.h"
#include "moecore/runner/runner.h"
#include "support/counting_allocator.h"
#include "support/moe_problem.h"

namespace moecore {
namespace {

using testing::count_allocations;

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

/// A payload and the layer shape it serves; `layer` keeps a method's parameters alive.
struct Payload {
  std::shared_ptr<FusedMoE> layer;
  QuantInfoPtr quant_info;
  int64_t hidden = 0, global_experts = 0;
};

FusedMoEOptions mxfp4_options(int64_t E, int64_t H, int64_t I) {
  FusedMoEOptions o;
  o.num_experts = E;
  o.hidden_size = H;
  o.intermediate_size = I;
  o.topk_config.top_k = 2;
  o.params_dtype = DType::kBF16;
  o.runner_backend = MoeRunnerBackend::FLASHINFER_MXFP4;
  o.a2a_backend = MoeA2ABackend::NONE;
  o.runner_config.inplace = false;
  return o;
}

/// GPT-OSS through Mxfp4MoEMethod: biases, α/β/limit per expert, H = 192 padded to 256.
Payload gpt_oss(std::mt19937& rng) {
  const int64_t E = 4, H = 192, I = 160;
  auto method = std::make_shared<Mxfp4MoEMethod>();
  auto layer = std::make_shared<FusedMoE>(mxfp4_options(E, H, I), method);
  const std::pair<const char*, Tensor> items[] = {
      {"gate_up_proj_blocks", random_bytes(rng, {E, 2 * I, H / 2})},
      {"gate_up_proj_scales", random_bytes(rng, {E, 2 * I, H / 32}, 121, 124)},
      {"gate_up_proj_bias", random_bf16(rng, {E, 2 * I}, 0.1f)},
      {"down_proj_blocks", random_bytes(rng, {E, H, I / 2})},
      {"down_proj_scales", random_bytes(rng, {E, H, I / 32}, 121, 124)},
      {"down_proj_bias", random_bf16(rng, {E, H}, 0.1f)}};
  for (const auto& [name, t] : items) method->load_fused_expert_weight(*layer, name, t);
  layer->process_weights_after_loading();
  return {layer, method->quant_info(*layer), H, E};
}

/// DSv4 through Mxfp4FlashinferCutlassMoEMethod: [w3; w1] halves, α = 1, β = 0 and the limit
/// when swiglu_limit is set, plain SwiGLU otherwise; no biases, no padding.
Payload dsv4(std::mt19937& rng, std::optional<float> swiglu_limit) {
  const int64_t E = 3, H = 128, I = 128;
  FusedMoEOptions o = mxfp4_options(E, H, I);
  o.runner_config.swiglu_limit = swiglu_limit;
  auto method = std::make_shared<Mxfp4FlashinferCutlassMoEMethod>();
  auto layer = std::make_shared<FusedMoE>(o, method);
  std::uniform_int_distribution<int> exponent(-4, -2);
  auto load = [&](const char* param, const char* shard, int64_t e, int64_t rows, int64_t cols) {
    const Tensor q = random_bytes(rng, {rows, cols / 2});
    TensorView as_i8 = q.view();
    as_i8.dtype = DType::kI8;
    Tensor s = Tensor::empty({rows, cols / 32}, DType::kF32);
    for (int64_t i = 0; i < s.numel(); ++i) s.ptr<float>()[i] = std::ldexp(1.0f, exponent(rng));
    layer->weight_loader(param, Tensor(as_i8, q.owner()), shard, e);
    layer->weight_loader(std::string(param) + "_scale_inv", s, shard, e);
  };
  for (int64_t e = 0; e < E; ++e) {
    load("w13_weight", "w1", e, I, H);
    load("w13_weight", "w3", e, I, H);
    load("w2_weight", "w2", e, H, I);
  }
  layer->process_weights_after_loading();
  return {layer, method->quant_info(*layer), H, E};
}

/// A hand-built payload of EP rank 1 of 2 (ids are global, [0, 2E)): no biases, no swiglu.
Payload expert_parallel(std::mt19937& rng) {
  const int64_t E = 3, N = 128, K = 256;
  auto q = std::make_shared<FlashInferMxfp4CutlassMoeQuantInfo>();
  q->w13_weight =
      interleave_moe_weights_for_sm90_mixed_gemm(random_bytes(rng, {E, 2 * N, K / 2}).view());
  q->w2_weight =
      interleave_moe_weights_for_sm90_mixed_gemm(random_bytes(rng, {E, K, N / 2}).view());
  q->w13_weight_scale = interleave_moe_scales_for_sm90_mixed_gemm(
      random_bytes(rng, {E, 2 * N, K / 32}, 120, 123).view());
  q->w2_weight_scale =
      interleave_moe_scales_for_sm90_mixed_gemm(random_bytes(rng, {E, K, N / 32}, 120, 123).view());
  q->moe_ep_size = 2;
  q->moe_ep_rank = 1;
  return {nullptr, q, K, 2 * E};
}

/// Rewrites every input's contents in place: hidden states, routed weights, and ids drawn from
/// [-1, global) (a token's slots distinct), the last `padding_rows` rows all −1 as a captured
/// batch's padding.
void refill(std::mt19937& rng, const StandardDispatchOutput& d, int64_t global,
            int64_t padding_rows) {
  const Tensor& x = d.hidden_states;
  const Tensor fresh = random_bf16(rng, {x.size(0), x.size(1)}, 1.0f);
  std::memcpy(x.ptr<uint8_t>(), fresh.ptr<uint8_t>(), static_cast<size_t>(x.numel() * 2));
  const auto& topk = std::get<StandardTopKOutput>(d.topk_output);
  const Tensor& ids = topk.topk_ids;
  const int64_t T = ids.size(0), k = ids.size(1);
  std::uniform_real_distribution<float> weight(0.1f, 1.0f);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int64_t> perm(static_cast<size_t>(global + 1));
    for (int64_t e = 0; e <= global; ++e) perm[e] = e - 1;  // −1 is one more choice
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t id = t >= T - padding_rows ? -1 : perm[j];
      if (ids.dtype() == DType::kI32)
        ids.ptr<int32_t>()[t * k + j] = static_cast<int32_t>(id);
      else
        ids.ptr<int64_t>()[t * k + j] = id;
      topk.topk_weights.ptr<float>()[t * k + j] = weight(rng);
    }
  }
}

std::shared_ptr<StandardDispatchOutput> make_dispatch(int64_t T, int64_t H, int64_t k,
                                                      DType id_dtype) {
  auto d = std::make_shared<StandardDispatchOutput>();
  d->hidden_states = Tensor::zeros({T, H}, DType::kBF16);
  d->topk_output =
      StandardTopKOutput{Tensor::zeros({T, k}, DType::kF32), Tensor::zeros({T, k}, id_dtype), {}};
  return d;
}

/// What eager MoeRunner::run gives for the same contents, on a fresh dispatch output (copies).
Tensor eager_output(MoeRunner& runner, const StandardDispatchOutput& d, const QuantInfoPtr& q) {
  auto fresh = std::make_shared<StandardDispatchOutput>();
  fresh->hidden_states = Tensor::copy_of(d.hidden_states.view());
  const auto& topk = std::get<StandardTopKOutput>(d.topk_output);
  fresh->topk_output = StandardTopKOutput{
      Tensor::copy_of(topk.topk_weights.view()), Tensor::copy_of(topk.topk_ids.view()), {}};
  return std::dynamic_pointer_cast<StandardCombineInput>(runner.run(fresh, q))->hidden_states;
}

const Tensor& prepared_output(const PreparedRun& prepared) {
  return std::dynamic_pointer_cast<StandardCombineInput>(prepared.combine_input())->hidden_states;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.view().shape_vector() == b.view().shape_vector() && a.dtype() == b.dtype() &&
         std::memcmp(a.ptr<char>(), b.ptr<char>(),
                     static_cast<size_t>(a.numel() * dtype_size(a.dtype()))) == 0;
}

MoeRunnerConfig runner_config(IsaLevel level, const Payload& p) {
  MoeRunnerConfig config = p.layer ? p.layer->runner()->config() : MoeRunnerConfig{};
  config.inplace = false;
  config.isa_level = level;
  return config;
}

struct PreparedCase {
  std::string name;
  Payload (*make)(std::mt19937&);
  DType id_dtype;
};

void PrintTo(const PreparedCase& c, std::ostream* os) { *os << c.name; }

class PreparedMxfp4Test : public ::testing::TestWithParam<PreparedCase> {
 protected:
  void TearDown() override { ThreadPool::instance().set_num_threads(available_cpus()); }
};

TEST_P(PreparedMxfp4Test, RunEqualsEagerOnNewContentsAndAllocatesNothing) {
  std::mt19937 rng(41);
  const Payload p = GetParam().make(rng);
  const int64_t T = 9, k = 2;
  for (IsaLevel level : {IsaLevel::kScalar, current_isa_level()}) {
    for (int threads : {1, 2}) {
      ThreadPool::instance().set_num_threads(threads);
      MoeRunner runner(MoeRunnerBackend::FLASHINFER_MXFP4, runner_config(level, p),
                       MoeA2ABackend::NONE);
      const auto d = make_dispatch(T, p.hidden, k, GetParam().id_dtype);
      const PreparedRunPtr prepared = runner.prepare(d, p.quant_info);
      for (int64_t padding_rows : {int64_t{0}, int64_t{3}, int64_t{0}, T, int64_t{1}}) {
        refill(rng, *d, p.global_experts, padding_rows);
        EXPECT_EQ(count_allocations([&] { prepared->run(); }), 0)
            << threads << " threads, " << padding_rows << " padding rows";
        EXPECT_TRUE(same_bits(prepared_output(*prepared), eager_output(runner, *d, p.quant_info)))
            << threads << " threads, " << padding_rows << " padding rows";
      }
    }
  }
}

TEST_P(PreparedMxfp4Test, ThreadCountMayChangeAfterPrepare) {
  std::mt19937 rng(42);
  const Payload p = GetParam().make(rng);
  ThreadPool::instance().set_num_threads(2);
  MoeRunner runner(MoeRunnerBackend::FLASHINFER_MXFP4, runner_config(current_isa_level(), p),
                   MoeA2ABackend::NONE);
  const auto d = make_dispatch(7, p.hidden, 2, GetParam().id_dtype);
  const PreparedRunPtr prepared = runner.prepare(d, p.quant_info);
  // The shared schedule's workspace is sized for prepare's thread count: fewer threads run in
  // it as they are; more grow it on their first run (each new part's kernel scratch), after
  // which runs allocate nothing again. The bits never depend on the count.
  for (int threads : {1, 3}) {
    ThreadPool::instance().set_num_threads(threads);
    for (int round = 0; round < 2; ++round) {
      refill(rng, *d, p.global_experts, 2);
      const int64_t allocations = count_allocations([&] { prepared->run(); });
      if (threads <= 2 || round > 0)
        EXPECT_EQ(allocations, 0) << threads << " threads, round " << round;
      EXPECT_TRUE(same_bits(prepared_output(*prepared), eager_output(runner, *d, p.quant_info)))
          << threads << " threads, round " << round;
    }
  }
}

// Eager calls share one workspace: a steady-state call allocates what it returns and its
// checks need, the same at 1 thread and at 4 (a workspace per call would allocate every
// thread's kernel scratch and buffers again).
TEST_P(PreparedMxfp4Test, SteadyStateEagerCallsAllocateTheSameAtEveryThreadCount) {
  std::mt19937 rng(44);
  const Payload p = GetParam().make(rng);
  MoeRunner runner(MoeRunnerBackend::FLASHINFER_MXFP4, runner_config(current_isa_level(), p),
                   MoeA2ABackend::NONE);
  const auto d = make_dispatch(7, p.hidden, 2, GetParam().id_dtype);
  refill(rng, *d, p.global_experts, 2);
  std::vector<int64_t> counts;
  for (int threads : {1, 4}) {
    ThreadPool::instance().set_num_threads(threads);
    runner.run(d, p.quant_info);  // grows the shared workspace for this thread count
    counts.push_back(count_allocations([&] { runner.run(d, p.quant_info); }));
  }
  ThreadPool::instance().set_num_threads(available_cpus());
  EXPECT_EQ(counts[0], counts[1]);
}

TEST_P(PreparedMxfp4Test, BadIdsRaiseEagersErrorWithoutTouchingTheOutput) {
  std::mt19937 rng(43);
  const Payload p = GetParam().make(rng);
  MoeRunner runner(MoeRunnerBackend::FLASHINFER_MXFP4, runner_config(IsaLevel::kScalar, p),
                   MoeA2ABackend::NONE);
  const auto d = make_dispatch(5, p.hidden, 2, GetParam().id_dtype);
  const PreparedRunPtr prepared = runner.prepare(d, p.quant_info);
  refill(rng, *d, p.global_experts, 0);
  prepared->run();
  const Tensor good = Tensor::copy_of(prepared_output(*prepared).view());
  const Tensor& ids = std::get<StandardTopKOutput>(d->topk_output).topk_ids;
  for (int64_t bad : {p.global_experts, int64_t{-2}}) {
    if (ids.dtype() == DType::kI32)
      ids.ptr<int32_t>()[7] = static_cast<int32_t>(bad);
    else
      ids.ptr<int64_t>()[7] = bad;
    EXPECT_THROW(eager_output(runner, *d, p.quant_info), OutOfRange) << bad;
    EXPECT_THROW(prepared->run(), OutOfRange) << bad;
    EXPECT_TRUE(same_bits(prepared_output(*prepared), good)) << bad;
  }
  refill(rng, *d, p.global_experts, 1);  // the next good contents recover
  prepared->run();
  EXPECT_TRUE(same_bits(prepared_output(*prepared), eager_output(runner, *d, p.quant_info)));
}

INSTANTIATE_TEST_SUITE_P(
    Payloads, PreparedMxfp4Test,
    ::testing::Values(PreparedCase{"gpt_oss", gpt_oss, DType::kI32},
                      PreparedCase{"dsv4_clamped",
                                   [](std::mt19937& rng) { return dsv4(rng, 10.0f); }, DType::kI32},
                      PreparedCase{"dsv4_plain",
                                   [](std::mt19937& rng) { return dsv4(rng, std::nullopt); },
                                   DType::kI32},
                      PreparedCase{"expert_parallel_i64", expert_parallel, DType::kI64}),
    [](const ::testing::TestParamInfo<PreparedCase>& info) { return info.param.name; });

/// The payload's quant info without a kernel layout (as one built by hand): every prepared run
/// (and eager call) derives the layout from the contract layout itself.
QuantInfoPtr without_kernel_layout(const QuantInfoPtr& quant_info) {
  auto q = std::make_shared<FlashInferMxfp4CutlassMoeQuantInfo>(
      dynamic_cast<const FlashInferMxfp4CutlassMoeQuantInfo&>(*quant_info));
  q->kernel_layout = Mxfp4KernelLayout();
  return q;
}

/// The payload's quant info with a kernel layout: the method's, or for a hand-built payload the
/// deinterleaved contract tensors (as a caller building one by hand may pass them).
QuantInfoPtr with_kernel_layout(const QuantInfoPtr& quant_info) {
  const auto& given = dynamic_cast<const FlashInferMxfp4CutlassMoeQuantInfo&>(*quant_info);
  if (given.kernel_layout.w13_weight.defined()) return quant_info;
  auto q = std::make_shared<FlashInferMxfp4CutlassMoeQuantInfo>(given);
  q->kernel_layout = {deinterleave_moe_weights_for_sm90_mixed_gemm(q->w13_weight.view()),
                      deinterleave_moe_scales_for_sm90_mixed_gemm(q->w13_weight_scale.view()),
                      deinterleave_moe_weights_for_sm90_mixed_gemm(q->w2_weight.view()),
                      deinterleave_moe_scales_for_sm90_mixed_gemm(q->w2_weight_scale.view())};
  return q;
}

TEST_P(PreparedMxfp4Test, KernelLayoutIsTheDeinterleavedContractLayout) {
  std::mt19937 rng(47);
  const Payload p = GetParam().make(rng);
  const auto& q = dynamic_cast<const FlashInferMxfp4CutlassMoeQuantInfo&>(*p.quant_info);
  if (p.layer == nullptr) {  // hand-built: no quant method made a layout
    EXPECT_FALSE(q.kernel_layout.w13_weight.defined());
    return;
  }
  ASSERT_TRUE(q.kernel_layout.w13_weight.defined());
  const std::pair<const Tensor*, Tensor> expected[] = {
      {&q.kernel_layout.w13_weight,
       deinterleave_moe_weights_for_sm90_mixed_gemm(q.w13_weight.view())},
      {&q.kernel_layout.w2_weight,
       deinterleave_moe_weights_for_sm90_mixed_gemm(q.w2_weight.view())},
      {&q.kernel_layout.w13_weight_scale,
       deinterleave_moe_scales_for_sm90_mixed_gemm(q.w13_weight_scale.view())},
      {&q.kernel_layout.w2_weight_scale,
       deinterleave_moe_scales_for_sm90_mixed_gemm(q.w2_weight_scale.view())}};
  for (const auto& [kernel, contract] : expected) {
    EXPECT_EQ(kernel->dtype(), DType::kU8);
    EXPECT_TRUE(kernel->view().is_contiguous());
    EXPECT_TRUE(same_bits(*kernel, contract));
  }
}

/// Every ISA level this machine has, with a kernel layout in the quant info and without one (the
/// run derives it), at 1 and 2 threads: prepared equals eager, and all give the same bits.
TEST_P(PreparedMxfp4Test, EagerEqualsPreparedAtEveryIsaLevel) {
  std::mt19937 rng(48);
  const Payload p = GetParam().make(rng);
  const QuantInfoPtr with_layout = with_kernel_layout(p.quant_info);
  const QuantInfoPtr infos[] = {with_layout, without_kernel_layout(p.quant_info)};
  const auto d = make_dispatch(6, p.hidden, 2, GetParam().id_dtype);
  refill(rng, *d, p.global_experts, 1);
  std::optional<Tensor> first;
  for (IsaLevel level : available_isa_levels()) {
    for (const QuantInfoPtr& q : infos) {
      for (int threads : {1, 2}) {
        ThreadPool::instance().set_num_threads(threads);
        MoeRunner runner(MoeRunnerBackend::FLASHINFER_MXFP4, runner_config(level, p),
                         MoeA2ABackend::NONE);
        const PreparedRunPtr prepared = runner.prepare(d, q);
        EXPECT_EQ(count_allocations([&] { prepared->run(); }), 0);
        const std::string where = std::string(isa_level_name(level)) + ", " +
                                  std::to_string(threads) + " threads" +
                                  (q == with_layout ? "" : ", layout derived by the run");
        const Tensor eager = eager_output(runner, *d, q);
        EXPECT_TRUE(same_bits(prepared_output(*prepared), eager)) << where;
        if (!first) first = Tensor::copy_of(eager.view());
        EXPECT_TRUE(same_bits(eager, *first)) << where;
      }
    }
  }
}

TEST(PreparedMxfp4ErrorsTest, NanScaleOfARoutedExpertRaisesLikeEager) {
  std::mt19937 rng(44);
  const Payload p = expert_parallel(rng);
  // Local expert 2 (global id 5), the last, holds an E8M0 NaN in its w2 scales.
  const Tensor& s =
      dynamic_cast<const FlashInferMxfp4CutlassMoeQuantInfo&>(*p.quant_info).w2_weight_scale;
  s.ptr<uint8_t>()[s.numel() - 1] = 0xFF;
  MoeRunner runner(MoeRunnerBackend::FLASHINFER_MXFP4, runner_config(IsaLevel::kScalar, p),
                   MoeA2ABackend::NONE);
  const auto d = make_dispatch(4, p.hidden, 2, DType::kI64);
  const PreparedRunPtr prepared = runner.prepare(d, p.quant_info);
  const auto& topk = std::get<StandardTopKOutput>(d->topk_output);
  const int64_t healthy[] = {3, 4, -1, 1, 0, 3, 4, 2};  // local experts 0 and 1, or remote
  std::memcpy(topk.topk_ids.ptr<int64_t>(), healthy, sizeof(healthy));
  for (int64_t i = 0; i < 8; ++i) topk.topk_weights.ptr<float>()[i] = 0.5f;
  EXPECT_EQ(count_allocations([&] { prepared->run(); }), 0);
  const Tensor good = Tensor::copy_of(prepared_output(*prepared).view());
  EXPECT_TRUE(same_bits(good, eager_output(runner, *d, p.quant_info)));
  topk.topk_ids.ptr<int64_t>()[2] = 5;
  EXPECT_THROW(eager_output(runner, *d, p.quant_info), InvalidArgument);
  EXPECT_THROW(prepared->run(), InvalidArgument);
  EXPECT_TRUE(same_bits(prepared_output(*prepared), good));
}

/// A kernel layout whose shapes do not match the contract's is an InvalidArgument naming the
/// field, at prepare and eagerly, for an empty batch too (it is part of the payload).
TEST(PreparedMxfp4ErrorsTest, BadKernelLayoutShapesRaise) {
  std::mt19937 rng(49);
  const Payload p = gpt_oss(rng);
  MoeRunner runner(MoeRunnerBackend::FLASHINFER_MXFP4, runner_config(IsaLevel::kScalar, p),
                   MoeA2ABackend::NONE);
  const auto& good = dynamic_cast<const FlashInferMxfp4CutlassMoeQuantInfo&>(*p.quant_info);
  const Mxfp4KernelLayout& kl = good.kernel_layout;
  const Tensor &w13 = kl.w13_weight, &s13 = kl.w13_weight_scale;
  const Tensor &w2 = kl.w2_weight, &s2 = kl.w2_weight_scale;
  const std::pair<const char*, Mxfp4KernelLayout> bad_layouts[] = {
      {"kernel_layout.w13_weight", {w2, s13, w2, s2}},
      {"kernel_layout.w13_weight_scale", {w13, s2, w2, s2}},
      {"kernel_layout.w2_weight", {w13, s13, w13, s2}},
      {"kernel_layout.w2_weight_scale", {w13, s13, w2, Tensor()}}};
  for (int64_t tokens : {3, 0}) {
    const auto d = make_dispatch(tokens, p.hidden, 2, DType::kI32);
    if (tokens > 0) refill(rng, *d, p.global_experts, 1);
    for (const auto& [field, layout] : bad_layouts) {
      auto q = std::make_shared<FlashInferMxfp4CutlassMoeQuantInfo>(good);
      q->kernel_layout = layout;
      for (bool prepared : {true, false}) {
        try {
          if (prepared)
            runner.prepare(d, q);
          else
            runner.run(d, q);
          ADD_FAILURE() << field << " accepted (" << tokens << " tokens)";
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
        }
      }
    }
  }
}

TEST(PreparedMxfp4ErrorsTest, EmptyBatchReturnsHiddenStatesAndAllocatesNothing) {
  std::mt19937 rng(45);
  const Payload p = gpt_oss(rng);
  MoeRunner runner(MoeRunnerBackend::FLASHINFER_MXFP4, runner_config(IsaLevel::kScalar, p),
                   MoeA2ABackend::NONE);
  const auto d = make_dispatch(0, p.hidden, 2, DType::kI32);
  const PreparedRunPtr prepared = runner.prepare(d, p.quant_info);
  EXPECT_EQ(count_allocations([&] { prepared->run(); }), 0);
  EXPECT_EQ(prepared_output(*prepared).view().data, d->hidden_states.view().data);  // R9
}

TEST(PreparedMxfp4ErrorsTest, BypassedRoutingCannotBePrepared) {
  std::mt19937 rng(46);
  const Payload p = gpt_oss(rng);
  MoeRunner runner(MoeRunnerBackend::FLASHINFER_MXFP4, runner_config(IsaLevel::kScalar, p),
                   MoeA2ABackend::NONE);
  auto d = std::make_shared<StandardDispatchOutput>();
  d->hidden_states = random_bf16(rng, {3, p.hidden}, 1.0f);
  BypassedTopKOutput bypassed;
  bypassed.hidden_states = d->hidden_states;
  bypassed.router_logits = testing::random_tensor(rng, {3, p.global_experts}, DType::kF32);
  bypassed.topk_config.top_k = 2;
  d->topk_output = bypassed;
  EXPECT_THROW(runner.prepare(d, p.quant_info), Unsupported);
  EXPECT_NO_THROW(runner.run(d, p.quant_info));  // eager routes it (R8)
}

}  // namespace
}  // namespace moecore
