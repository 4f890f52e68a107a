// FusedMoE: checkpoint loading places w1/w3/w2 shards where the backend expects them, TP ranks
// and EP ranks each compute a slice whose sum equals the unsharded layer, and misuse is rejected.
#include <gtest/gtest.h>

#include "moecore/core/error.h"
#include "moecore/layer/fused_moe.h"
#include "support/moe_problem.h"

namespace moecore {
namespace {

struct Checkpoint {
  int64_t E, H, I;
  std::vector<Tensor> w1, w3, w2;  // [I, H], [I, H], [H, I] per expert, f32
};

Checkpoint make_checkpoint(std::mt19937& rng, int64_t E, int64_t H, int64_t I) {
  Checkpoint c{E, H, I};
  for (int64_t e = 0; e < E; ++e) {
    c.w1.push_back(testing::random_tensor(rng, {I, H}, DType::kF32, 0.2f));
    c.w3.push_back(testing::random_tensor(rng, {I, H}, DType::kF32, 0.2f));
    c.w2.push_back(testing::random_tensor(rng, {H, I}, DType::kF32, 0.2f));
  }
  return c;
}

std::unique_ptr<FusedMoE> make_layer(const Checkpoint& c, int64_t tp_size, int64_t tp_rank,
                                     int64_t ep_size, int64_t ep_rank) {
  FusedMoEOptions o;
  o.num_experts = c.E;
  o.hidden_size = c.H;
  o.intermediate_size = c.I;
  o.topk_config.top_k = 2;
  o.params_dtype = DType::kF32;
  o.tp_size = tp_size;
  o.tp_rank = tp_rank;
  o.ep_size = ep_size;
  o.ep_rank = ep_rank;
  o.runner_backend = MoeRunnerBackend::TRITON;
  o.a2a_backend = MoeA2ABackend::NONE;
  o.runner_config.inplace = false;
  auto layer = std::make_unique<FusedMoE>(o);
  for (int64_t e = 0; e < c.E; ++e) {
    const bool local = layer->weight_loader("w13_weight", c.w1[e], "w1", e);
    EXPECT_EQ(layer->weight_loader("w13_weight", c.w3[e], "w3", e), local);
    EXPECT_EQ(layer->weight_loader("w2_weight", c.w2[e], "w2", e), local);
  }
  layer->process_weights_after_loading();
  return layer;
}

TEST(FusedMoETest, LoaderPlacesGateThenUpAndNarrowsForTp) {
  std::mt19937 rng(1);
  Checkpoint c = make_checkpoint(rng, 4, 8, 6);
  auto layer = make_layer(c, 2, 1, 1, 0);  // TP rank 1 of 2: rows [3, 6) of w1/w3, cols of w2
  const Tensor& w13 = layer->parameter("w13_weight");
  const Tensor& w2 = layer->parameter("w2_weight");
  ASSERT_EQ(w13.view().shape_vector(), (std::vector<int64_t>{4, 6, 8}));
  const int64_t e = 2, H = 8, I = 3;
  for (int64_t r = 0; r < I; ++r)
    for (int64_t h = 0; h < H; ++h) {
      EXPECT_EQ(w13.ptr<float>()[(e * 2 * I + r) * H + h], c.w1[e].ptr<float>()[(3 + r) * H + h]);
      EXPECT_EQ(w13.ptr<float>()[(e * 2 * I + I + r) * H + h], c.w3[e].ptr<float>()[(3 + r) * H + h]);
      EXPECT_EQ(w2.ptr<float>()[(e * H + h) * I + r], c.w2[e].ptr<float>()[h * 6 + 3 + r]);
    }
}

Tensor forward(FusedMoE& layer, const Tensor& x, const Tensor& logits) {
  return layer.forward(x, logits);
}

TEST(FusedMoETest, TensorAndExpertParallelSlicesSumToTheFullLayer) {
  std::mt19937 rng(2);
  Checkpoint c = make_checkpoint(rng, 8, 16, 12);
  Tensor x = testing::random_tensor(rng, {9, 16}, DType::kF32);
  Tensor logits = testing::random_tensor(rng, {9, 8}, DType::kF32);
  const std::vector<float> full = testing::to_floats(forward(*make_layer(c, 1, 0, 1, 0), x, logits));
  for (auto [tp, ep] : {std::pair<int64_t, int64_t>{2, 1}, {1, 2}, {1, 4}, {2, 2}}) {
    std::vector<double> sum(full.size(), 0.0);
    for (int64_t t = 0; t < tp; ++t)
      for (int64_t r = 0; r < ep; ++r) {
        const std::vector<float> part = testing::to_floats(forward(*make_layer(c, tp, t, ep, r), x, logits));
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
      }
    for (size_t i = 0; i < sum.size(); ++i)
      EXPECT_NEAR(sum[i], full[i], 1e-5 + 1e-5 * std::abs(full[i])) << "tp " << tp << " ep " << ep;
  }
}

TEST(FusedMoETest, RejectsMisuse) {
  std::mt19937 rng(3);
  Checkpoint c = make_checkpoint(rng, 4, 8, 6);
  FusedMoEOptions o;
  o.num_experts = 4;
  o.hidden_size = 8;
  o.intermediate_size = 6;
  o.topk_config.top_k = 2;
  o.params_dtype = DType::kF32;
  o.runner_backend = MoeRunnerBackend::TRITON;
  o.a2a_backend = MoeA2ABackend::NONE;
  FusedMoE layer(o);
  Tensor x = testing::random_tensor(rng, {2, 8}, DType::kF32);
  Tensor logits = testing::random_tensor(rng, {2, 4}, DType::kF32);
  EXPECT_THROW(layer.forward(x, logits), InvalidArgument);  // runner not built yet
  EXPECT_THROW(layer.weight_loader("w13_weight", c.w1[0], "w4", 0), InvalidArgument);
  EXPECT_THROW(layer.weight_loader("w13_weight", c.w1[0], "w1", 4), OutOfRange);
  EXPECT_THROW(layer.weight_loader("w13_weight", c.w2[0], "w1", 0), InvalidArgument);
  EXPECT_THROW(layer.weight_loader("w2_weight", c.w1[0], "w1", 0), InvalidArgument);
  EXPECT_THROW(layer.weight_loader("w13_weight",
                                   testing::random_tensor(rng, {6, 8}, DType::kBF16), "w1", 0),
               DTypeError);
  EXPECT_THROW(layer.weight_loader("w9_weight", c.w1[0], "w1", 0), InvalidArgument);
  o.tp_size = 4;  // 6 does not divide over 4
  EXPECT_THROW(FusedMoE bad(o), InvalidArgument);
}

}  // namespace
}  // namespace moecore
