// CapturedForward: a captured FusedMoE forward replays with no heap allocation (counted on every
// thread) and gives layer.forward's bits on the real rows, for routing and top-k inputs, with an
// expert-parallel id map, and over thread counts; CapturedGroupForward does the same for an
// expert-parallel group against ExpertParallelGroup::forward.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "moecore/core/thread_pool.h"
#include "moecore/layer/capture.h"
#include "moecore/layer/ep_group.h"
#include "support/counting_allocator.h"
#include "support/moe_problem.h"

namespace moecore {
namespace {

using testing::count_allocations;
using testing::random_tensor;

std::shared_ptr<FusedMoE> make_layer(std::mt19937& rng, MoeRunnerBackend backend,
                                     int64_t ep_size = 1, int64_t ep_rank = 0) {
  FusedMoEOptions o;
  o.num_experts = 8;
  o.hidden_size = 48;
  o.intermediate_size = 32;
  o.topk_config.top_k = 2;
  o.params_dtype = DType::kBF16;
  o.ep_size = ep_size;
  o.ep_rank = ep_rank;
  o.runner_backend = backend;
  o.a2a_backend = MoeA2ABackend::NONE;
  o.runner_config.inplace = false;
  auto layer = std::make_shared<FusedMoE>(o);
  for (const char* name : {"w13_weight", "w2_weight"}) {
    const Tensor& p = layer->parameter(name);
    const Tensor r = random_tensor(rng, p.view().shape_vector(), DType::kBF16, 0.2f);
    std::memcpy(p.view().data, r.view().data, static_cast<size_t>(p.numel() * 2));
  }
  layer->process_weights_after_loading();
  return layer;
}

void fill(std::mt19937& rng, const Tensor& dst, int64_t rows) {
  const Tensor r = random_tensor(rng, {rows, dst.size(1)}, dst.dtype());
  std::memcpy(dst.view().data, r.view().data,
              static_cast<size_t>(rows * dst.size(1) * dtype_size(dst.dtype())));
}

Tensor first_rows(const Tensor& t, int64_t rows) {
  return Tensor::copy_of(t.view().narrow(0, 0, rows));
}

void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.view().shape_vector(), b.view().shape_vector()) << what;
  EXPECT_EQ(std::memcmp(a.view().data, b.view().data,
                        static_cast<size_t>(a.numel() * dtype_size(a.dtype()))),
            0)
      << what;
}

struct CaptureCase {
  MoeRunnerBackend backend;
  int64_t ep_size;
};

class CaptureTest : public ::testing::TestWithParam<CaptureCase> {};

TEST_P(CaptureTest, RouterLogitsReplayAllocatesNothingAndEqualsForward) {
  std::mt19937 rng(3);
  const CaptureCase c = GetParam();
  for (int threads : {1, 2}) {
    ThreadPool::instance().set_num_threads(threads);
    auto layer = make_layer(rng, c.backend, c.ep_size, c.ep_size - 1);
    CapturedForward graph(layer, 16, CaptureInput::kRouterLogits, DType::kBF16);
    for (int64_t t : {16, 5, 1, 0, 12}) {
      fill(rng, graph.hidden_states(), 16);  // padding rows hold garbage too
      fill(rng, graph.router_logits(), 16);
      EXPECT_EQ(count_allocations([&] { graph.replay(t); }), 0) << t << " tokens";
      if (t == 0) continue;
      const Tensor want = layer->forward(first_rows(graph.hidden_states(), t),
                                         first_rows(graph.router_logits(), t));
      expect_same_bits(first_rows(graph.output(), t), want, std::to_string(t) + " tokens");
    }
  }
  ThreadPool::instance().set_num_threads(available_cpus());
}

TEST_P(CaptureTest, TopKReplayPadsAndAllocatesNothing) {
  std::mt19937 rng(5);
  const CaptureCase c = GetParam();
  auto layer = make_layer(rng, c.backend, c.ep_size, 0);
  CapturedForward graph(layer, 8, CaptureInput::kTopK, DType::kBF16);
  std::uniform_int_distribution<int> expert(-1, 7);
  std::uniform_real_distribution<float> weight(0.0f, 1.0f);
  for (int64_t t : {8, 3}) {
    fill(rng, graph.hidden_states(), 8);
    for (int64_t i = 0; i < 8 * 2; ++i) {
      graph.topk_ids().ptr<int32_t>()[i] = expert(rng);
      graph.topk_weights().ptr<float>()[i] = weight(rng);
    }
    const Tensor ids = first_rows(graph.topk_ids(), t), weights = first_rows(graph.topk_weights(), t);
    EXPECT_EQ(count_allocations([&] { graph.replay(t); }), 0) << t << " tokens";
    const Tensor want = layer->forward_topk(first_rows(graph.hidden_states(), t),
                                            StandardTopKOutput{weights, ids, {}});
    expect_same_bits(first_rows(graph.output(), t), want, std::to_string(t) + " tokens");
    for (int64_t i = t * 2; i < 16; ++i) EXPECT_EQ(graph.topk_ids().ptr<int32_t>()[i], -1);
  }
}

TEST_P(CaptureTest, BadIdsAtReplayRaiseAndTheNextReplayRecovers) {
  std::mt19937 rng(7);
  auto layer = make_layer(rng, GetParam().backend, GetParam().ep_size, 0);
  CapturedForward graph(layer, 4, CaptureInput::kTopK, DType::kBF16);
  fill(rng, graph.hidden_states(), 4);
  graph.topk_ids().ptr<int32_t>()[0] = 99;
  EXPECT_THROW(graph.replay(2), OutOfRange);
  graph.topk_ids().ptr<int32_t>()[0] = 1;
  graph.topk_ids().ptr<int32_t>()[1] = 2;
  EXPECT_NO_THROW(graph.replay(1));
}

INSTANTIATE_TEST_SUITE_P(
    Backends, CaptureTest,
    ::testing::Values(CaptureCase{MoeRunnerBackend::TRITON, 1},
                      CaptureCase{MoeRunnerBackend::TORCH_NATIVE, 1},
                      CaptureCase{MoeRunnerBackend::TRITON, 2}),
    [](const auto& info) {
      return to_string(info.param.backend) + "_ep" + std::to_string(info.param.ep_size);
    });

TEST(CaptureErrorsTest, LayerMustBeProcessedAndCapacityPositive) {
  FusedMoEOptions o;
  o.num_experts = 4;
  o.hidden_size = 16;
  o.intermediate_size = 8;
  o.topk_config.top_k = 1;
  o.a2a_backend = MoeA2ABackend::NONE;
  auto layer = std::make_shared<FusedMoE>(o);
  EXPECT_THROW(CapturedForward(layer, 4, CaptureInput::kTopK, DType::kBF16), InvalidArgument);
  layer->process_weights_after_loading();
  EXPECT_THROW(CapturedForward(layer, 0, CaptureInput::kTopK, DType::kBF16), InvalidArgument);
  EXPECT_THROW(CapturedForward(layer, 4, CaptureInput::kTopK, DType::kI8), DTypeError);
}

std::unique_ptr<ExpertParallelGroup> make_group(std::mt19937& rng, int ranks) {
  FusedMoEOptions o;
  o.num_experts = 8;
  o.hidden_size = 128;
  o.intermediate_size = 32;
  o.topk_config.top_k = 2;
  o.params_dtype = DType::kBF16;
  o.runner_backend = MoeRunnerBackend::DEEP_GEMM;
  o.a2a_backend = MoeA2ABackend::DEEPEP;
  o.num_max_dispatch_tokens_per_rank = 8;
  o.runner_config.inplace = false;
  o.runner_config.routed_scaling_factor = 1.25f;
  auto group = std::make_unique<ExpertParallelGroup>(ranks, o, nullptr);
  const int64_t H = o.hidden_size, I = o.intermediate_size;
  for (int64_t e = 0; e < o.num_experts; ++e) {
    group->weight_loader("w13_weight", random_tensor(rng, {I, H}, DType::kBF16, 0.2f), "w1", e);
    group->weight_loader("w13_weight", random_tensor(rng, {I, H}, DType::kBF16, 0.2f), "w3", e);
    group->weight_loader("w2_weight", random_tensor(rng, {H, I}, DType::kBF16, 0.2f), "w2", e);
  }
  group->process_weights_after_loading();
  return group;
}

TEST(CaptureGroupTest, ReplayEqualsGroupForwardAndAllocatesNothing) {
  std::mt19937 rng(11);
  for (int ranks : {1, 2, 4}) {
    auto group = make_group(rng, ranks);
    std::unique_ptr<CapturedGroupForward> graph = group->capture(8, CaptureInput::kRouterLogits);
    ASSERT_EQ(graph->size(), ranks);
    std::vector<int64_t> counts(static_cast<size_t>(ranks));
    for (int pass = 0; pass < 3; ++pass) {
      std::vector<Tensor> hidden, logits;
      for (int r = 0; r < ranks; ++r) {
        const CapturedForward& g = *graph->rank(r);
        counts[r] = (3 * pass + 5 * r + 1) % 9;
        fill(rng, g.hidden_states(), 8);
        fill(rng, g.router_logits(), 8);
        hidden.push_back(first_rows(g.hidden_states(), counts[r]));
        logits.push_back(first_rows(g.router_logits(), counts[r]));
      }
      EXPECT_EQ(count_allocations([&] { graph->replay(counts); }), 0)
          << ranks << " ranks, pass " << pass;
      const std::vector<Tensor> want = group->forward(hidden, logits, /*is_extend_in_batch=*/false);
      for (int r = 0; r < ranks; ++r)
        expect_same_bits(first_rows(graph->rank(r)->output(), counts[r]), want[r],
                         std::to_string(ranks) + " ranks, rank " + std::to_string(r));
    }
  }
}

TEST(CaptureGroupTest, BadCountsAndFailingRanksRaiseAndTheGroupRecovers) {
  std::mt19937 rng(13);
  auto group = make_group(rng, 2);
  std::unique_ptr<CapturedGroupForward> graph = group->capture(4, CaptureInput::kTopK);
  EXPECT_THROW(graph->replay({1}), InvalidArgument);
  EXPECT_THROW(graph->replay({1, 5}), OutOfRange);
  for (int r = 0; r < 2; ++r) fill(rng, graph->rank(r)->hidden_states(), 4);
  graph->rank(1)->topk_ids().ptr<int32_t>()[0] = 8;  // out of range on rank 1
  graph->rank(1)->topk_ids().ptr<int32_t>()[1] = 0;
  EXPECT_THROW(graph->replay({0, 1}), OutOfRange);
  graph->rank(1)->topk_ids().ptr<int32_t>()[0] = 3;
  graph->rank(1)->topk_weights().ptr<float>()[0] = 0.5f;
  graph->rank(1)->topk_weights().ptr<float>()[1] = 0.5f;
  EXPECT_NO_THROW(graph->replay({0, 1}));
  const std::vector<Tensor> want =
      group->forward_topk({first_rows(graph->rank(0)->hidden_states(), 0),
                           first_rows(graph->rank(1)->hidden_states(), 1)},
                          {StandardTopKOutput{first_rows(graph->rank(0)->topk_weights(), 0),
                                              first_rows(graph->rank(0)->topk_ids(), 0),
                                              {}},
                           StandardTopKOutput{first_rows(graph->rank(1)->topk_weights(), 1),
                                              first_rows(graph->rank(1)->topk_ids(), 1),
                                              {}}},
                          /*is_extend_in_batch=*/false);
  expect_same_bits(first_rows(graph->rank(1)->output(), 1), want[1], "after recovery");
}

}  // namespace
}  // namespace moecore
