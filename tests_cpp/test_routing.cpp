// GoogleTest for routing/topk: hand-computed cases for each path, random batches against a naive
// twin written here (full stable sorts, no shared code with topk.cpp), layouts and dtypes,
// thread-count and batch invariance, padded rows, custom routing functions and a bad-input
// table. Python-side checks against numpy/torch live in tests_py/test_*routing.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/core/thread_pool.h"
#include "moecore/formats/half.h"
#include "moecore/routing/topk.h"

namespace moecore {
namespace {

constexpr float kWeightTol = 1e-6f;  // TESTING.md routing row

Tensor f32_tensor(const std::vector<float>& values, const std::vector<int64_t>& shape) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  if (!values.empty()) std::memcpy(t.ptr<float>(), values.data(), values.size() * sizeof(float));
  return t;
}

Tensor i32_tensor(const std::vector<int32_t>& values, const std::vector<int64_t>& shape) {
  Tensor t = Tensor::empty(shape, DType::kI32);
  std::memcpy(t.ptr<int32_t>(), values.data(), values.size() * sizeof(int32_t));
  return t;
}

/// Logits stored as bf16 or f16 (rounded from `values`).
Tensor half_tensor(const std::vector<float>& values, const std::vector<int64_t>& shape,
                   DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  uint16_t* d = t.ptr<uint16_t>();
  for (size_t i = 0; i < values.size(); ++i)
    d[i] = dtype == DType::kBF16 ? f32_to_bf16(values[i]) : f32_to_f16(values[i]);
  return t;
}

std::vector<float> weights_of(const StandardTopKOutput& out) {
  const float* p = out.topk_weights.ptr<float>();
  return {p, p + out.topk_weights.numel()};
}
std::vector<int32_t> ids_of(const StandardTopKOutput& out) {
  const int32_t* p = out.topk_ids.ptr<int32_t>();
  return {p, p + out.topk_ids.numel()};
}

void expect_weights_near(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], kWeightTol) << "at " << i;
}

StandardTopKOutput route(const std::vector<float>& logits, int64_t num_tokens,
                         const TopKConfig& config) {
  const int64_t E = num_tokens ? static_cast<int64_t>(logits.size()) / num_tokens : 4;
  return select_experts(Tensor(), f32_tensor(logits, {num_tokens, E}), config);
}

TopKConfig config_k(int top_k) {
  TopKConfig c;
  c.top_k = top_k;
  return c;
}

/// Sets the pool size for one scope.
class ScopedThreads {
 public:
  explicit ScopedThreads(int n) : saved_(ThreadPool::instance().num_threads()) {
    ThreadPool::instance().set_num_threads(n);
  }
  ~ScopedThreads() { ThreadPool::instance().set_num_threads(saved_); }

 private:
  int saved_;
};

// ------------------------------------------------------------------ naive twin

std::vector<float> naive_scores(const std::vector<double>& x, ScoringFunc f) {
  std::vector<float> s(x.size());
  if (f == ScoringFunc::SOFTMAX) {
    const double m = *std::max_element(x.begin(), x.end());
    double sum = 0;
    for (double v : x) sum += std::exp(v - m);
    for (size_t i = 0; i < x.size(); ++i) s[i] = static_cast<float>(std::exp(x[i] - m) / sum);
  } else if (f == ScoringFunc::SIGMOID) {
    for (size_t i = 0; i < x.size(); ++i) s[i] = static_cast<float>(1 / (1 + std::exp(-x[i])));
  } else {
    for (size_t i = 0; i < x.size(); ++i)
      s[i] = static_cast<float>(std::sqrt(std::log1p(std::exp(-std::fabs(x[i]))) +
                                          std::max(x[i], 0.0)));
  }
  return s;
}

/// Indices of `keys` by descending value, equal values in index order (stable sort).
std::vector<int> naive_order(const std::vector<float>& keys) {
  std::vector<int> order(keys.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return keys[a] > keys[b]; });
  return order;
}

void naive_route(const std::vector<float>& logits, int64_t T, int64_t E, const TopKConfig& c,
                 const std::vector<float>& bias, std::vector<float>* w, std::vector<int32_t>* ids) {
  const int k = c.top_k, S = c.num_fused_shared_experts, kr = k - S;
  const float rsf = c.routed_scaling_factor.value_or(1.0f);
  w->assign(T * k, 0.0f);
  ids->assign(T * k, 0);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> x(logits.begin() + t * E, logits.begin() + (t + 1) * E);
    const bool biased = !bias.empty();
    ScoringFunc f = c.scoring_func;
    if (c.use_grouped_topk) f = biased ? ScoringFunc::SIGMOID : ScoringFunc::SOFTMAX;
    const std::vector<float> s = naive_scores(x, f);
    std::vector<float> key(E);
    for (int64_t e = 0; e < E; ++e) key[e] = biased ? s[e] + bias[e] : s[e];
    if (c.use_grouped_topk) {
      const int G = *c.num_expert_group, per = static_cast<int>(E / G);
      std::vector<float> gscore(G);
      for (int g = 0; g < G; ++g) {
        std::vector<float> members(key.begin() + g * per, key.begin() + (g + 1) * per);
        std::sort(members.rbegin(), members.rend());  // descending
        gscore[g] = biased ? members[0] + members[1] : members[0];
      }
      const std::vector<int> gorder = naive_order(gscore);
      std::vector<bool> kept(G, false);
      for (int i = 0; i < *c.topk_group; ++i) kept[gorder[i]] = true;
      for (int64_t e = 0; e < E; ++e)
        if (!kept[e / per]) key[e] = -INFINITY;
    }
    const std::vector<int> order = naive_order(key);
    float* wr = w->data() + t * k;
    int32_t* ir = ids->data() + t * k;
    float sum = 0;
    for (int j = 0; j < kr; ++j) {
      ir[j] = order[j];
      wr[j] = s[order[j]];
      sum += wr[j];
    }
    for (int j = kr; j < k; ++j) {
      ir[j] = static_cast<int32_t>(E + (j - kr));
      wr[j] = sum / rsf;
    }
    if (c.renormalize) {
      for (int j = 0; j < k; ++j) wr[j] = sum > 0 ? wr[j] / sum : wr[j];
      if (c.apply_routed_scaling_factor_on_output)
        for (int j = 0; j < k; ++j) wr[j] *= rsf;
    }
    if (c.fused_shared_experts_scaling_factor)
      for (int j = kr; j < k; ++j) wr[j] *= *c.fused_shared_experts_scaling_factor;
  }
}

// ------------------------------------------------------------------ hand-computed cases

TEST(RoutingTestSoftmax, HandValues) {
  const std::vector<float> logits = {std::log(1.f), std::log(2.f), std::log(3.f), std::log(4.f)};
  TopKConfig c = config_k(2);
  c.renormalize = false;
  StandardTopKOutput out = route(logits, 1, c);
  EXPECT_EQ(ids_of(out), (std::vector<int32_t>{3, 2}));
  expect_weights_near(weights_of(out), {0.4f, 0.3f});
  c.renormalize = true;
  out = route(logits, 1, c);
  expect_weights_near(weights_of(out), {4.f / 7, 3.f / 7});
  EXPECT_EQ(out.router_logits.ndim(), 2);
}

TEST(RoutingTestSoftmax, TiesGoToLowerIndex) {
  for (ScoringFunc f : {ScoringFunc::SOFTMAX, ScoringFunc::SIGMOID, ScoringFunc::SQRTSOFTPLUS}) {
    TopKConfig c = config_k(3);
    c.scoring_func = f;
    StandardTopKOutput out = route(std::vector<float>(12, 0.5f), 2, c);
    EXPECT_EQ(ids_of(out), (std::vector<int32_t>{0, 1, 2, 0, 1, 2}));
    expect_weights_near(weights_of(out), std::vector<float>(6, 1.f / 3));
  }
  // A tie inside the selection keeps index order too: experts 3 and 1 share the top value.
  StandardTopKOutput out = route({0.f, 2.f, 1.f, 2.f}, 1, config_k(3));
  EXPECT_EQ(ids_of(out), (std::vector<int32_t>{1, 3, 2}));
}

TEST(RoutingTestSigmoid, BiasChoosesButDoesNotWeigh) {
  TopKConfig c = config_k(2);
  c.scoring_func = ScoringFunc::SIGMOID;
  c.renormalize = false;
  c.correction_bias = f32_tensor({0.f, 0.f, 0.f, 10.f}, {4});
  StandardTopKOutput out = route({2.f, 1.f, 0.f, -1.f}, 1, c);
  EXPECT_EQ(ids_of(out), (std::vector<int32_t>{3, 0}));
  expect_weights_near(weights_of(out), {1.f / (1.f + std::exp(1.f)), 1.f / (1.f + std::exp(-2.f))});
}

TEST(RoutingTestSqrtsoftplus, ValuesWithoutOverflow) {
  TopKConfig c = config_k(4);
  c.scoring_func = ScoringFunc::SQRTSOFTPLUS;
  c.renormalize = false;
  StandardTopKOutput out = route({0.f, 100.f, -100.f, 3.0e4f}, 1, c);
  EXPECT_EQ(ids_of(out), (std::vector<int32_t>{3, 1, 0, 2}));
  const std::vector<float> w = weights_of(out);
  EXPECT_FLOAT_EQ(w[0], std::sqrt(3.0e4f));
  EXPECT_FLOAT_EQ(w[1], 10.f);
  EXPECT_FLOAT_EQ(w[2], static_cast<float>(std::sqrt(std::log(2.0))));
  EXPECT_FLOAT_EQ(w[3], static_cast<float>(std::exp(-50.0)));
}

TEST(RoutingTestGrouped, KeepsBestGroupsNotBestExperts) {
  // Groups of 2, scored by their max: g0 = 9, g1 = 8, g2 = 0.5; g2 is dropped, so expert 3
  // (logit 0, in g1) is the 4th pick although experts 4 and 5 have larger logits.
  TopKConfig c = config_k(4);
  c.use_grouped_topk = true;
  c.num_expert_group = 3;
  c.topk_group = 2;
  StandardTopKOutput out = route({9.f, 8.5f, 8.f, 0.f, 0.5f, 0.4f}, 1, c);
  EXPECT_EQ(ids_of(out), (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(RoutingTestGrouped, NeverPicksDroppedGroupOnUnderflow) {
  TopKConfig c = config_k(2);
  c.use_grouped_topk = true;
  c.num_expert_group = 2;
  c.topk_group = 1;
  StandardTopKOutput out = route({-1000.f, -1000.f, 1000.f, -1000.f}, 1, c);
  EXPECT_EQ(ids_of(out), (std::vector<int32_t>{2, 3}));
}

TEST(RoutingTestBiasedGrouped, GroupScoreIsTopTwoSum) {
  // Group 0 holds the single best expert, group 1 the best pair: group 1 wins.
  TopKConfig c = config_k(1);
  c.use_grouped_topk = true;
  c.num_expert_group = 2;
  c.topk_group = 1;
  c.correction_bias = f32_tensor({0.f, 0.f, 0.f, 0.f}, {4});
  StandardTopKOutput out = route({4.f, -4.f, 2.f, 2.f}, 1, c);
  EXPECT_EQ(ids_of(out), (std::vector<int32_t>{2}));
  expect_weights_near(weights_of(out), {1.f});
}

TEST(RoutingTestBiasedGrouped, UsesSigmoidWhateverScoringFunc) {
  // sglang's biased_grouped_topk hard-codes sigmoid; scoring_func stays at its default.
  TopKConfig c = config_k(2);
  c.use_grouped_topk = true;
  c.num_expert_group = 1;
  c.topk_group = 1;
  c.renormalize = false;
  c.correction_bias = f32_tensor({0.f, 0.f, 0.f}, {3});
  StandardTopKOutput out = route({0.f, 1.f, -1.f}, 1, c);
  EXPECT_EQ(ids_of(out), (std::vector<int32_t>{1, 0}));
  expect_weights_near(weights_of(out), {1.f / (1.f + std::exp(-1.f)), 0.5f});
}

TEST(RoutingTestShared, ColumnsAndWeights) {
  std::mt19937 gen(3);
  std::normal_distribution<float> normal;
  std::vector<float> logits(5 * 16);
  for (float& v : logits) v = normal(gen);
  for (bool on_output : {false, true}) {
    TopKConfig c = config_k(4);
    c.num_fused_shared_experts = 2;
    c.scoring_func = ScoringFunc::SIGMOID;
    c.routed_scaling_factor = 2.5f;
    c.apply_routed_scaling_factor_on_output = on_output;
    const std::vector<float> w = weights_of(route(logits, 5, c));
    const std::vector<int32_t> ids = ids_of(route(logits, 5, c));
    for (int t = 0; t < 5; ++t) {
      EXPECT_EQ(ids[t * 4 + 2], 16);
      EXPECT_EQ(ids[t * 4 + 3], 17);
      EXPECT_NEAR(w[t * 4 + 2], on_output ? 1.f : 0.4f, kWeightTol);
      EXPECT_NEAR(w[t * 4 + 0] + w[t * 4 + 1], on_output ? 2.5f : 1.f, 1e-5f);
    }
    c.fused_shared_experts_scaling_factor = 0.25f;
    const std::vector<float> scaled = weights_of(route(logits, 5, c));
    EXPECT_NEAR(scaled[3], (on_output ? 1.f : 0.4f) * 0.25f, kWeightTol);
    EXPECT_EQ(scaled[0], w[0]);
  }
}

TEST(RoutingTestShared, WithoutRenormalize) {
  TopKConfig c = config_k(3);
  c.num_fused_shared_experts = 1;
  c.routed_scaling_factor = 2.f;
  c.renormalize = false;
  StandardTopKOutput out = route({0.f, 1.f, 2.f}, 1, c);
  const double z = 1 + std::exp(1.0) + std::exp(2.0);
  const float p2 = static_cast<float>(std::exp(2.0) / z), p1 = static_cast<float>(std::exp(1.0) / z);
  EXPECT_EQ(ids_of(out), (std::vector<int32_t>{2, 1, 3}));
  expect_weights_near(weights_of(out), {p2, p1, (p2 + p1) / 2.f});
}

TEST(RoutingTestRenormalize, ZeroSumGivesZeroWeightsNotNaN) {
  TopKConfig c = config_k(2);
  c.scoring_func = ScoringFunc::SIGMOID;
  StandardTopKOutput out = route(std::vector<float>(4, -200.f), 1, c);
  EXPECT_EQ(weights_of(out), (std::vector<float>{0.f, 0.f}));
}

// ------------------------------------------------------------------ random batches vs twin

struct RandomCase {
  const char* name;
  int64_t num_experts;
  std::function<void(TopKConfig&)> setup;
  bool bias;
};

std::vector<RandomCase> random_cases() {
  return {
      {"softmax", 8, [](TopKConfig& c) { c.top_k = 2; }, false},
      {"softmax_raw_bias", 16, [](TopKConfig& c) { c.top_k = 3; c.renormalize = false; }, true},
      {"sigmoid", 32, [](TopKConfig& c) { c.top_k = 4; c.scoring_func = ScoringFunc::SIGMOID; },
       false},
      {"sqrtsoftplus_dsv4", 64,
       [](TopKConfig& c) {
         c.top_k = 7;
         c.scoring_func = ScoringFunc::SQRTSOFTPLUS;
         c.num_fused_shared_experts = 1;
         c.routed_scaling_factor = 1.5f;
         c.apply_routed_scaling_factor_on_output = true;
       },
       true},
      {"grouped_dsv2", 16,
       [](TopKConfig& c) {
         c.top_k = 3;
         c.use_grouped_topk = true;
         c.num_expert_group = 4;
         c.topk_group = 2;
       },
       false},
      {"biased_grouped_dsv3", 64,
       [](TopKConfig& c) {
         c.top_k = 9;
         c.use_grouped_topk = true;
         c.num_expert_group = 8;
         c.topk_group = 4;
         c.num_fused_shared_experts = 1;
         c.routed_scaling_factor = 2.5f;
         c.apply_routed_scaling_factor_on_output = true;
       },
       true},
      {"biased_grouped_shared2_fssf", 32,
       [](TopKConfig& c) {
         c.top_k = 6;
         c.use_grouped_topk = true;
         c.num_expert_group = 4;
         c.topk_group = 2;
         c.num_fused_shared_experts = 2;
         c.routed_scaling_factor = 2.f;
         c.fused_shared_experts_scaling_factor = 0.25f;
       },
       true},
      {"k_equals_e", 4, [](TopKConfig& c) { c.top_k = 4; }, false},
  };
}

class RoutingTestRandom : public ::testing::TestWithParam<std::tuple<int, int64_t>> {};

TEST_P(RoutingTestRandom, MatchesNaiveTwin) {
  const RandomCase rc = random_cases()[std::get<0>(GetParam())];
  const int64_t T = std::get<1>(GetParam()), E = rc.num_experts;
  std::mt19937 gen(static_cast<uint32_t>(std::get<0>(GetParam()) * 1000 + T));
  std::normal_distribution<float> normal;
  std::vector<float> logits(T * E), bias;
  for (float& v : logits) v = 2.f * normal(gen);
  TopKConfig c;
  rc.setup(c);
  if (rc.bias) {
    for (int64_t e = 0; e < E; ++e) bias.push_back(0.1f * normal(gen));
    c.correction_bias = f32_tensor(bias, {E});
  }
  std::vector<float> want_w;
  std::vector<int32_t> want_ids;
  naive_route(logits, T, E, c, bias, &want_w, &want_ids);
  for (int threads : {1, 2}) {
    ScopedThreads scoped(threads);
    StandardTopKOutput out = select_experts(Tensor(), f32_tensor(logits, {T, E}), c);
    ASSERT_EQ(out.topk_ids.size(0), T);
    ASSERT_EQ(out.topk_ids.size(1), c.top_k);
    EXPECT_EQ(ids_of(out), want_ids);
    expect_weights_near(weights_of(out), want_w);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Routing, RoutingTestRandom,
    ::testing::Combine(::testing::Range(0, static_cast<int>(random_cases().size())),
                       ::testing::Values<int64_t>(0, 1, 2, 3, 7, 64, 513)),
    [](const ::testing::TestParamInfo<std::tuple<int, int64_t>>& info) {
      return std::string(random_cases()[std::get<0>(info.param)].name) + "_T" +
             std::to_string(std::get<1>(info.param));
    });

// ------------------------------------------------------------------ layouts, dtypes, threads

std::vector<float> random_logits(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (float& x : v) x = 2.f * normal(gen);
  return v;
}

TEST(RoutingTestLayout, StridedRowsEqualContiguous) {
  const int64_t T = 9, E = 12, wide = 20;
  const std::vector<float> big = random_logits(T * wide, 1);
  Tensor storage = f32_tensor(big, {T, wide});
  TensorView view = storage.view();
  view.shape[1] = E;  // big[:, :E]
  Tensor strided(view, storage.owner());
  std::vector<float> packed;
  for (int64_t t = 0; t < T; ++t)
    packed.insert(packed.end(), big.begin() + t * wide, big.begin() + t * wide + E);
  TopKConfig c = config_k(3);
  c.scoring_func = ScoringFunc::SIGMOID;
  StandardTopKOutput a = select_experts(Tensor(), strided, c);
  StandardTopKOutput b = route(packed, T, c);
  EXPECT_EQ(ids_of(a), ids_of(b));
  EXPECT_EQ(weights_of(a), weights_of(b));
  EXPECT_EQ(a.router_logits.view().data, strided.view().data);  // the input, not a copy
}

TEST(RoutingTestLayout, HalfDtypesEqualTheirF32Values) {
  const int64_t T = 17, E = 32;
  const std::vector<float> logits = random_logits(T * E, 2);
  TopKConfig c = config_k(4);
  c.use_grouped_topk = true;
  c.num_expert_group = 4;
  c.topk_group = 2;
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    Tensor half = half_tensor(logits, {T, E}, dtype);
    std::vector<float> widened(T * E);
    for (int64_t i = 0; i < T * E; ++i) {
      const uint16_t h = half.ptr<uint16_t>()[i];
      widened[i] = dtype == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
    StandardTopKOutput a = select_experts(Tensor(), half, c);
    StandardTopKOutput b = route(widened, T, c);
    EXPECT_EQ(ids_of(a), ids_of(b)) << dtype_name(dtype);
    EXPECT_EQ(weights_of(a), weights_of(b)) << dtype_name(dtype);
  }
}

TEST(RoutingTestDeterminism, BitwiseAcrossThreadCountsAndBatches) {
  const int64_t T = 64, E = 64;
  const std::vector<float> logits = random_logits(T * E, 4);
  TopKConfig c = config_k(9);
  c.use_grouped_topk = true;
  c.num_expert_group = 8;
  c.topk_group = 4;
  c.num_fused_shared_experts = 1;
  c.routed_scaling_factor = 2.5f;
  c.correction_bias = f32_tensor(std::vector<float>(E, 0.01f), {E});
  std::vector<float> w1;
  std::vector<int32_t> ids1;
  {
    ScopedThreads one(1);
    StandardTopKOutput out = route(logits, T, c);
    w1 = weights_of(out);
    ids1 = ids_of(out);
  }
  for (int threads : {2, 3}) {
    ScopedThreads scoped(threads);
    StandardTopKOutput out = route(logits, T, c);
    EXPECT_EQ(ids_of(out), ids1);
    EXPECT_EQ(weights_of(out), w1);
  }
  // Batch invariance: token 5 alone routes exactly as inside the batch.
  StandardTopKOutput alone =
      route(std::vector<float>(logits.begin() + 5 * E, logits.begin() + 6 * E), 1, c);
  EXPECT_EQ(ids_of(alone), std::vector<int32_t>(ids1.begin() + 5 * 9, ids1.begin() + 6 * 9));
  EXPECT_EQ(weights_of(alone), std::vector<float>(w1.begin() + 5 * 9, w1.begin() + 6 * 9));
}

// ------------------------------------------------------------------ padded and empty batches

TEST(RoutingTestPadded, RowsPastNonPaddedAreMinusOneAndNotRead) {
  const int64_t T = 6, E = 8;
  std::vector<float> logits = random_logits(T * E, 5);
  const StandardTopKOutput full = route(logits, T, config_k(2));
  for (int64_t i = 4 * E; i < T * E; ++i) logits[i] = NAN;
  StandardTopKOutput out =
      select_experts(Tensor(), f32_tensor(logits, {T, E}), config_k(2), int64_t{4});
  const std::vector<int32_t> ids = ids_of(out);
  const std::vector<float> w = weights_of(out);
  for (int i = 0; i < 4 * 2; ++i) {
    EXPECT_EQ(ids[i], ids_of(full)[i]);
    EXPECT_EQ(w[i], weights_of(full)[i]);
  }
  for (int i = 4 * 2; i < T * 2; ++i) {
    EXPECT_EQ(ids[i], -1);
    EXPECT_EQ(w[i], 0.f);
  }
  out = select_experts(Tensor(), f32_tensor(logits, {T, E}), config_k(2), int64_t{0});
  EXPECT_EQ(ids_of(out), std::vector<int32_t>(T * 2, -1));
}

TEST(RoutingTestPadded, EmptyBatchGivesEmptyOutputs) {
  TopKConfig c = config_k(3);
  c.num_fused_shared_experts = 1;
  StandardTopKOutput out = select_experts(Tensor(), f32_tensor({}, {0, 8}), c);
  EXPECT_EQ(out.topk_weights.size(0), 0);
  EXPECT_EQ(out.topk_weights.size(1), 3);
  EXPECT_EQ(out.topk_ids.dtype(), DType::kI32);
  EXPECT_EQ(out.topk_weights.dtype(), DType::kF32);
}

// ------------------------------------------------------------------ custom routing function

TEST(RoutingTestCustom, OutputsAreCheckedAndCopied) {
  int seen_top_k = 0;
  bool seen_renormalize = true;
  TopKConfig c = config_k(2);
  c.renormalize = false;
  c.custom_routing_function = [&](const Tensor& hidden, const Tensor& logits, int top_k,
                                  bool renormalize) {
    seen_top_k = top_k;
    seen_renormalize = renormalize;
    EXPECT_EQ(hidden.size(0), logits.size(0));
    return std::make_pair(f32_tensor({0.7f, 0.3f, 0.6f, 0.4f, 1.f, 0.f}, {3, 2}),
                          i32_tensor({1, 0, 3, 2, 0, 1}, {3, 2}));
  };
  StandardTopKOutput out = select_experts(Tensor::zeros({3, 5}, DType::kF32),
                                          f32_tensor(std::vector<float>(12, 0.f), {3, 4}), c,
                                          int64_t{2});
  EXPECT_EQ(seen_top_k, 2);
  EXPECT_FALSE(seen_renormalize);
  EXPECT_EQ(ids_of(out), (std::vector<int32_t>{1, 0, 3, 2, -1, -1}));
  EXPECT_EQ(weights_of(out), (std::vector<float>{0.7f, 0.3f, 0.6f, 0.4f, 0.f, 0.f}));
}

// ------------------------------------------------------------------ bad input table

enum class Thrown { kInvalidArgument, kDTypeError, kOutOfRange, kUnsupported };

struct BadCase {
  const char* name;
  std::function<void()> call;
  Thrown thrown;
  const char* message;  // substring of what()
};

TopKConfig grouped(int top_k, int groups, int topk_group) {
  TopKConfig c = config_k(top_k);
  c.use_grouped_topk = true;
  c.num_expert_group = groups;
  c.topk_group = topk_group;
  return c;
}

StandardTopKOutput route_4x8(const TopKConfig& c, std::optional<int64_t> non_padded = {}) {
  return select_experts(Tensor(), f32_tensor(random_logits(32, 9), {4, 8}), c, non_padded);
}

TopKConfig custom_returning(Tensor w, Tensor ids) {
  TopKConfig c = config_k(2);
  c.custom_routing_function = [w, ids](const Tensor&, const Tensor&, int, bool) {
    return std::make_pair(w, ids);
  };
  return c;
}

std::vector<BadCase> bad_cases() {
  auto with = [](std::function<void(TopKConfig&)> f, int top_k = 2) {
    TopKConfig c = config_k(top_k);
    f(c);
    return c;
  };
  std::vector<float> nan_logits = random_logits(32, 9);
  nan_logits[2 * 8 + 5] = NAN;
  std::vector<float> inf_logits = random_logits(32, 9);
  inf_logits[8] = INFINITY;
  return {
      {"k_zero", [] { route_4x8(config_k(0)); }, Thrown::kInvalidArgument, "top_k >= 1, got 0"},
      {"k_gt_e", [] { route_4x8(config_k(9)); }, Thrown::kInvalidArgument,
       "routed top-k (top_k - num_fused_shared_experts = 9 - 0) in [1, 8]"},
      {"shared_leaves_no_routed",
       [=] { route_4x8(with([](TopKConfig& c) { c.num_fused_shared_experts = 2; })); },
       Thrown::kInvalidArgument, "in [1, 8]"},
      {"negative_shared",
       [=] { route_4x8(with([](TopKConfig& c) { c.num_fused_shared_experts = -1; })); },
       Thrown::kInvalidArgument, "num_fused_shared_experts >= 0, got -1"},
      {"groups_not_dividing", [] { route_4x8(grouped(2, 3, 1)); }, Thrown::kInvalidArgument,
       "num_expert_group to divide E = 8, got num_expert_group=3"},
      {"groups_missing",
       [=] { route_4x8(with([](TopKConfig& c) { c.use_grouped_topk = true; })); },
       Thrown::kInvalidArgument, "got num_expert_group=None, topk_group=None"},
      {"topk_group_zero", [] { route_4x8(grouped(2, 4, 0)); }, Thrown::kInvalidArgument,
       "topk_group in [1, num_expert_group = 4], got 0"},
      {"topk_group_gt_groups", [] { route_4x8(grouped(2, 4, 5)); }, Thrown::kInvalidArgument,
       "topk_group in [1, num_expert_group = 4], got 5"},
      {"k_gt_kept_experts", [] { route_4x8(grouped(5, 4, 2)); }, Thrown::kInvalidArgument,
       "routed top-k <= topk_group * experts per group = 2 * 2, got 5"},
      {"biased_group_of_one",
       [] {
         TopKConfig c = grouped(2, 8, 4);
         c.correction_bias = Tensor::zeros({8}, DType::kF32);
         route_4x8(c);
       },
       Thrown::kInvalidArgument, "at least 2 experts per group"},
      {"bias_wrong_shape",
       [=] {
         route_4x8(with([](TopKConfig& c) { c.correction_bias = Tensor::zeros({7}, DType::kF32); }));
       },
       Thrown::kInvalidArgument, "correction_bias of shape [8], got [7] f32"},
      {"bias_wrong_dtype",
       [=] {
         route_4x8(
             with([](TopKConfig& c) { c.correction_bias = Tensor::zeros({8}, DType::kBF16); }));
       },
       Thrown::kDTypeError, "correction_bias of dtype f32, got [8] bf16"},
      {"bias_nan",
       [=] {
         route_4x8(with([](TopKConfig& c) {
           c.correction_bias = f32_tensor({0, 0, 0, NAN, 0, 0, 0, 0}, {8});
         }));
       },
       Thrown::kInvalidArgument, "finite correction_bias, got nan at [3]"},
      {"rsf_zero", [=] { route_4x8(with([](TopKConfig& c) { c.routed_scaling_factor = 0.f; })); },
       Thrown::kInvalidArgument, "routed_scaling_factor finite and > 0, got 0"},
      {"rsf_nan", [=] { route_4x8(with([](TopKConfig& c) { c.routed_scaling_factor = NAN; })); },
       Thrown::kInvalidArgument, "routed_scaling_factor finite and > 0"},
      {"scale_without_rsf",
       [=] {
         route_4x8(with([](TopKConfig& c) { c.apply_routed_scaling_factor_on_output = true; }));
       },
       Thrown::kInvalidArgument, "routed_scaling_factor with apply_routed_scaling_factor_on_output"},
      {"fssf_inf",
       [=] {
         route_4x8(with([](TopKConfig& c) { c.fused_shared_experts_scaling_factor = INFINITY; }));
       },
       Thrown::kInvalidArgument, "fused_shared_experts_scaling_factor finite"},
      {"logits_nan", [=] { route(nan_logits, 4, config_k(2)); }, Thrown::kInvalidArgument,
       "expected finite router_logits, got nan at [2, 5]"},
      {"logits_inf", [=] { route(inf_logits, 4, config_k(2)); }, Thrown::kInvalidArgument,
       "expected finite router_logits, got inf at [1, 0]"},
      {"logits_bf16_inf",
       [=] { select_experts(Tensor(), half_tensor(inf_logits, {4, 8}, DType::kBF16), config_k(2)); },
       Thrown::kInvalidArgument, "got inf at [1, 0]"},
      {"logits_i32",
       [] { select_experts(Tensor(), Tensor::zeros({4, 8}, DType::kI32), config_k(2)); },
       Thrown::kDTypeError, "router_logits of dtype f32, f16 or bf16, got [4, 8] i32"},
      {"logits_rank1",
       [] { select_experts(Tensor(), Tensor::zeros({8}, DType::kF32), config_k(2)); },
       Thrown::kInvalidArgument, "router_logits of rank 2 [T, E], got [8] f32"},
      {"logits_missing", [] { select_experts(Tensor(), Tensor(), config_k(2)); },
       Thrown::kInvalidArgument, "expected router_logits [T, E], got None"},
      {"logits_column_stride",
       [] {
         Tensor t = Tensor::zeros({4, 16}, DType::kF32);
         TensorView v = t.view();
         v.shape[1] = 8;
         v.strides[1] = 2;
         select_experts(Tensor(), Tensor(v, t.owner()), config_k(2));
       },
       Thrown::kInvalidArgument, "contiguous last dim (stride 1), got strides [16, 2]"},
      {"hidden_rows_mismatch",
       [] {
         select_experts(Tensor::zeros({3, 16}, DType::kF32), Tensor::zeros({4, 8}, DType::kF32),
                        config_k(2));
       },
       Thrown::kInvalidArgument, "hidden_states with T = 4 rows"},
      {"non_padded_gt_t", [] { route_4x8(config_k(2), 5); }, Thrown::kInvalidArgument,
       "num_token_non_padded in [0, T = 4], got 5"},
      {"non_padded_negative", [] { route_4x8(config_k(2), -1); }, Thrown::kInvalidArgument,
       "num_token_non_padded in [0, T = 4], got -1"},
      {"custom_weights_dtype",
       [] {
         route_4x8(custom_returning(Tensor::zeros({4, 2}, DType::kBF16),
                                    Tensor::zeros({4, 2}, DType::kI32)));
       },
       Thrown::kDTypeError, "custom_routing_function topk_weights of dtype f32, got [4, 2] bf16"},
      {"custom_ids_dtype",
       [] {
         route_4x8(custom_returning(Tensor::zeros({4, 2}, DType::kF32),
                                    Tensor::zeros({4, 2}, DType::kI64)));
       },
       Thrown::kDTypeError, "custom_routing_function topk_ids of dtype i32"},
      {"custom_shape",
       [] {
         route_4x8(custom_returning(Tensor::zeros({4, 3}, DType::kF32),
                                    Tensor::zeros({4, 2}, DType::kI32)));
       },
       Thrown::kInvalidArgument, "topk_weights of shape [4, 2], got [4, 3] f32"},
      {"custom_missing_output",
       [] { route_4x8(custom_returning(Tensor(), Tensor::zeros({4, 2}, DType::kI32))); },
       Thrown::kInvalidArgument, "to return (topk_weights, topk_ids), got None"},
      {"custom_id_out_of_range",
       [] {
         route_4x8(custom_returning(Tensor::zeros({4, 2}, DType::kF32),
                                    i32_tensor({0, 1, 2, 3, 4, 8, 6, 7}, {4, 2})));
       },
       Thrown::kOutOfRange, "topk_ids in [0, 8), got 8 at [2, 1]"},
      {"custom_with_output_scaling",
       [] {
         TopKConfig c = custom_returning(Tensor::zeros({4, 2}, DType::kF32),
                                         Tensor::zeros({4, 2}, DType::kI32));
         c.routed_scaling_factor = 2.f;
         c.apply_routed_scaling_factor_on_output = true;
         route_4x8(c);
       },
       Thrown::kUnsupported,
       "apply_routed_scaling_factor_on_output=False with a custom_routing_function"},
  };
}

class RoutingTestBadInput : public ::testing::TestWithParam<int> {};

TEST_P(RoutingTestBadInput, ThrowsTypedErrorWithMessage) {
  const BadCase bc = bad_cases()[GetParam()];
  try {
    bc.call();
    FAIL() << "no exception";
  } catch (const Error& e) {
    switch (bc.thrown) {
      case Thrown::kInvalidArgument:
        EXPECT_NE(dynamic_cast<const InvalidArgument*>(&e), nullptr) << e.what();
        break;
      case Thrown::kDTypeError:
        EXPECT_NE(dynamic_cast<const DTypeError*>(&e), nullptr) << e.what();
        break;
      case Thrown::kOutOfRange:
        EXPECT_NE(dynamic_cast<const OutOfRange*>(&e), nullptr) << e.what();
        break;
      case Thrown::kUnsupported:
        EXPECT_NE(dynamic_cast<const Unsupported*>(&e), nullptr) << e.what();
        break;
    }
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("select_experts: expected ", 0), 0u) << what;
    EXPECT_NE(what.find(bc.message), std::string::npos) << what;
  }
}

INSTANTIATE_TEST_SUITE_P(Routing, RoutingTestBadInput,
                         ::testing::Range(0, static_cast<int>(bad_cases().size())),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(bad_cases()[info.param].name);
                         });

}  // namespace
}  // namespace moecore
