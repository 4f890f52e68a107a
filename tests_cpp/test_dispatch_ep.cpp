// Expert-parallel transport and dispatchers: the loopback collectives for R ∈ {1,2,3,4,8}, group
// poisoning, the DeepEP layouts (re-derived here from the routing), the stage machine, payload
// resolution (R5) and capacity errors, and a full dispatch → fake experts → combine round that
// must equal the single-rank reduction bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "moecore/dispatch/deepep.h"
#include "moecore/dispatch/flashinfer.h"
#include "moecore/dispatch/transport.h"
#include "moecore/formats/half.h"
#include "moecore/runner/backends/deep_gemm.h"
#include "support/counting_allocator.h"

namespace moecore {
namespace {

using testing::count_allocations;

class LoopbackTest : public ::testing::TestWithParam<int> {};

TEST_P(LoopbackTest, CollectivesDeliverWhatPeersSent) {
  const int R = GetParam();
  auto group = LoopbackGroup::create(R);
  std::vector<std::vector<int64_t>> counts(R);
  std::vector<std::vector<std::vector<uint8_t>>> bytes(R);
  group->run([&](int r) {
    TransportPtr t = group->transport(r);
    std::vector<int64_t> send(R);
    std::vector<std::vector<uint8_t>> payload(R);
    for (int d = 0; d < R; ++d) {
      send[d] = 100 * r + d;
      payload[d].assign(static_cast<size_t>(r + d), static_cast<uint8_t>(16 * r + d));
    }
    for (int round = 0; round < 3; ++round) {  // repeated rounds reuse the mailboxes safely
      counts[r] = t->exchange_counts(send);
      bytes[r] = t->all_to_all_v(payload);
      t->barrier();
    }
  });
  for (int r = 0; r < R; ++r)
    for (int s = 0; s < R; ++s) {
      EXPECT_EQ(counts[r][s], 100 * s + r);
      EXPECT_EQ(bytes[r][s],
                std::vector<uint8_t>(static_cast<size_t>(s + r), static_cast<uint8_t>(16 * s + r)));
    }
}

TEST_P(LoopbackTest, FailingRankPoisonsTheGroupAndItsErrorReachesTheCaller) {
  const int R = GetParam();
  auto group = LoopbackGroup::create(R);
  const int failing = R - 1;
  try {
    group->run([&](int r) {
      if (r == failing) throw OutOfRange("rank-specific failure");
      group->transport(r)->barrier();
    });
    FAIL() << "expected the failure";
  } catch (const OutOfRange& e) {
    EXPECT_STREQ(e.what(), "rank-specific failure");
  }
  // Directly blocked collectives name the failed rank; a run resets the group afterwards.
  group->run([&](int r) { group->transport(r)->barrier(); });
}

TEST_P(LoopbackTest, AllToAllIntoDeliversAndRunsAllocateNothing) {
  const int R = GetParam();
  const int64_t block = 40;
  auto group = LoopbackGroup::create(R);
  std::vector<TransportPtr> transports;
  std::vector<std::vector<uint8_t>> send(R), recv(R);
  std::vector<std::vector<int64_t>> send_bytes(R), recv_bytes(R);
  for (int r = 0; r < R; ++r) {
    transports.push_back(group->transport(r));
    send[r].assign(static_cast<size_t>(R * block), 0);
    recv[r].assign(static_cast<size_t>(R * block), 0xEE);
    recv_bytes[r].assign(static_cast<size_t>(R), -1);
    for (int d = 0; d < R; ++d) {
      send_bytes[r].push_back((r + 3 * d) % (block + 1));
      for (int64_t i = 0; i < block; ++i)
        send[r][d * block + i] = static_cast<uint8_t>(16 * r + d + i);
    }
  }
  const std::function<void(int)> body = [&](int r) {
    transports[r]->all_to_all_into(send[r].data(), send_bytes[r].data(), recv[r].data(),
                                   recv_bytes[r].data(), block);
  };
  EXPECT_EQ(count_allocations([&] {
              for (int i = 0; i < 3; ++i) group->run(body);
            }),
            0);
  for (int r = 0; r < R; ++r)
    for (int s = 0; s < R; ++s) {
      ASSERT_EQ(recv_bytes[r][s], send_bytes[s][r]);
      for (int64_t i = 0; i < recv_bytes[r][s]; ++i)
        EXPECT_EQ(recv[r][s * block + i], send[s][r * block + i]) << r << " from " << s;
    }
}

INSTANTIATE_TEST_SUITE_P(Ranks, LoopbackTest, ::testing::Values(1, 2, 3, 4, 8));

TEST(LoopbackTest, AllToAllIntoRejectsOversizedSendsAndMismatchedBlocks) {
  auto group = LoopbackGroup::create(2);
  std::vector<uint8_t> send(64), recv(64);
  std::vector<int64_t> counts = {4, 4}, got(2);
  try {
    group->run([&](int r) {
      std::vector<int64_t> sizes = {r == 1 ? 9 : 4, 4};
      group->transport(r)->all_to_all_into(send.data(), sizes.data(), recv.data(), got.data(), 8);
    });
    FAIL() << "expected the oversized send to raise";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("send_bytes[0] = 9"), std::string::npos) << e.what();
  }
  try {
    group->run([&](int r) {
      std::vector<uint8_t> own_send(64), own_recv(64);
      std::vector<int64_t> own_got(2);
      group->transport(r)->all_to_all_into(own_send.data(), counts.data(), own_recv.data(),
                                           own_got.data(), r == 0 ? 8 : 16);
    });
    FAIL() << "expected mismatched block sizes to raise";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("passed block_bytes"), std::string::npos) << e.what();
  }
  std::vector<std::vector<uint8_t>> recvs(2, std::vector<uint8_t>(16));
  std::vector<std::vector<int64_t>> gots(2, std::vector<int64_t>(2));
  group->run([&](int r) {  // the group recovers
    group->transport(r)->all_to_all_into(send.data(), counts.data(), recvs[r].data(),
                                         gots[r].data(), 8);
  });
  EXPECT_EQ(gots[1], counts);
}

TEST(LoopbackTest, BlockedCollectiveRaisesNamingTheFailedRank) {
  auto group = LoopbackGroup::create(2);
  std::string message;
  std::thread waiter([&] {
    try {
      group->transport(0)->barrier();
    } catch (const CollectiveAborted& e) {
      message = e.what();
    }
  });
  group->poison(1, "boom");
  waiter.join();
  EXPECT_NE(message.find("rank 1 failed: boom"), std::string::npos) << message;
}

// ---------------------------------------------------------------------------------------------

struct Batch {
  Tensor hidden;  // bf16 [T, H]
  StandardTopKOutput topk;
};

Batch make_batch(int64_t T, int64_t H, int64_t E, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> expert(-1, static_cast<int>(E) - 1);  // −1 ids included
  Batch b;
  b.hidden = Tensor::empty({T, H}, DType::kBF16);
  for (int64_t i = 0; i < T * H; ++i) b.hidden.ptr<uint16_t>()[i] = f32_to_bf16(normal(rng));
  b.topk.topk_ids = Tensor::empty({T, k}, DType::kI32);
  b.topk.topk_weights = Tensor::empty({T, k}, DType::kF32);
  for (int64_t i = 0; i < T * k; ++i) {
    b.topk.topk_ids.ptr<int32_t>()[i] = expert(rng);
    b.topk.topk_weights.ptr<float>()[i] = std::uniform_real_distribution<float>(0.1f, 1.0f)(rng);
  }
  return b;
}

// A fake expert: out = bf16(x · (1 + global expert id / 8)), so a misplaced row shows.
uint16_t fake_expert(uint16_t x, int64_t global_expert) {
  return f32_to_bf16(bf16_to_f32(x) * (1.0f + static_cast<float>(global_expert) / 8.0f));
}

// The single-rank answer: post_reorder over the per-slot fake outputs.
Tensor single_rank(const Batch& b, std::optional<float> rsf) {
  const int64_t T = b.hidden.size(0), H = b.hidden.size(1), k = b.topk.topk_ids.size(1);
  const int32_t* ids = b.topk.topk_ids.ptr<int32_t>();
  const int64_t E = T == 0 ? 1 : 1 + std::max(0, *std::max_element(ids, ids + T * k));
  Tensor slots = Tensor::zeros({E, T * k, H}, DType::kBF16);
  Tensor src2dst = Tensor::empty({T * k}, DType::kI32);
  for (int64_t s = 0; s < T * k; ++s) {
    src2dst.ptr<int32_t>()[s] = static_cast<int32_t>(s);
    const int32_t e = b.topk.topk_ids.ptr<int32_t>()[s];
    if (e < 0) continue;
    for (int64_t h = 0; h < H; ++h)
      slots.ptr<uint16_t>()[s * H + h] = fake_expert(b.hidden.ptr<uint16_t>()[(s / k) * H + h], e);
  }
  return deepgemm_post_reorder(slots, src2dst, b.topk.topk_ids, b.topk.topk_weights, rsf);
}

struct EpCase {
  int ranks;
  DeepEPMode mode;
};

class DeepEPRoundTest : public ::testing::TestWithParam<EpCase> {};

TEST_P(DeepEPRoundTest, LayoutIsDerivableAndCombineEqualsSingleRankBitwise) {
  const auto [R, mode] = GetParam();
  const int64_t E = 4 * R, H = 32, k = 3, L = E / R, cap = 16;
  auto group = LoopbackGroup::create(R);
  std::vector<Batch> batches;
  for (int r = 0; r < R; ++r) batches.push_back(make_batch(r == 1 ? 0 : 5 + r, H, E, k, 7 + r));
  std::vector<Tensor> outputs(R);
  group->run([&](int r) {
    DeepEPConfig c;
    c.num_experts = E;
    c.num_local_experts = L;
    c.hidden_size = H;
    c.top_k = k;
    c.mode = mode;
    c.num_max_dispatch_tokens_per_rank = cap;
    c.routed_scaling_factor = 1.5f;
    DeepEPDispatcher d(group->transport(r), c);
    d.set_quant_config({{"dispatcher_output_dtype", std::string("bf16")}});
    d.dispatch_a(batches[r].hidden, batches[r].topk);
    DispatchOutputPtr out = d.dispatch_b();
    auto result = std::make_shared<DeepEPLLCombineInput>();
    if (mode == DeepEPMode::LOW_LATENCY) {
      auto* ll = dynamic_cast<DeepEPLLDispatchOutput*>(out.get());
      ASSERT_NE(ll, nullptr);
      // Re-derive: rows of local expert e = (source, token, slot) in order.
      const int64_t m_cap = cap * R;
      ASSERT_EQ(ll->hidden_states.view().shape_vector(), (std::vector<int64_t>{L, m_cap, H}));
      Tensor y = Tensor::zeros({L, m_cap, H}, DType::kBF16);
      for (int64_t e = 0; e < L; ++e) {
        int64_t row = 0;
        for (int s = 0; s < R; ++s)
          for (int64_t t = 0; t < batches[s].hidden.size(0); ++t)
            for (int64_t j = 0; j < k; ++j) {
              if (batches[s].topk.topk_ids.ptr<int32_t>()[t * k + j] != r * L + e) continue;
              ASSERT_EQ(0, std::memcmp(ll->hidden_states.ptr<uint16_t>() + (e * m_cap + row) * H,
                                       batches[s].hidden.ptr<uint16_t>() + t * H, H * 2));
              ++row;
            }
        ASSERT_EQ(ll->masked_m.ptr<int32_t>()[e], row);
        for (int64_t m = 0; m < row; ++m)
          for (int64_t h = 0; h < H; ++h)
            y.ptr<uint16_t>()[(e * m_cap + m) * H + h] =
                fake_expert(ll->hidden_states.ptr<uint16_t>()[(e * m_cap + m) * H + h], r * L + e);
      }
      const int64_t T = batches[r].hidden.size(0);
      EXPECT_EQ(ll->expected_m, (T * R * k + E) / E);
      result->hidden_states = y;
      d.combine_a(result);
    } else {
      auto* n = dynamic_cast<DeepEPNormalDispatchOutput*>(out.get());
      ASSERT_NE(n, nullptr);
      int64_t row = 0;  // tokens by source then token, once per rank owning one of their experts
      for (int s = 0; s < R; ++s)
        for (int64_t t = 0; t < batches[s].hidden.size(0); ++t) {
          bool mine = false;
          for (int64_t j = 0; j < k; ++j) {
            const int32_t e = batches[s].topk.topk_ids.ptr<int32_t>()[t * k + j];
            mine = mine || (e >= 0 && e / L == r);
          }
          if (!mine) continue;
          for (int64_t j = 0; j < k; ++j) {
            const int32_t e = batches[s].topk.topk_ids.ptr<int32_t>()[t * k + j];
            ASSERT_EQ(n->topk_ids.ptr<int32_t>()[row * k + j], e >= 0 && e / L == r ? e % L : -1);
          }
          ++row;
        }
      ASSERT_EQ(n->hidden_states.size(0), row);
      Tensor y = Tensor::zeros({row, k, H}, DType::kBF16);
      for (int64_t i = 0; i < row; ++i)
        for (int64_t j = 0; j < k; ++j) {
          const int32_t le = n->topk_ids.ptr<int32_t>()[i * k + j];
          if (le < 0) continue;
          for (int64_t h = 0; h < H; ++h)
            y.ptr<uint16_t>()[(i * k + j) * H + h] =
                fake_expert(n->hidden_states.ptr<uint16_t>()[i * H + h], r * L + le);
        }
      auto normal = std::make_shared<DeepEPNormalCombineInput>();
      normal->hidden_states = y;
      d.combine_a(normal);
    }
    outputs[r] = d.combine_b();
    EXPECT_EQ(d.stage(), DeepEPDispatcher::Stage::kInitial);
  });
  for (int r = 0; r < R; ++r) {
    Tensor want = single_rank(batches[r], 1.5f);
    ASSERT_EQ(outputs[r].view().shape_vector(), want.view().shape_vector());
    EXPECT_EQ(0, std::memcmp(outputs[r].view().data, want.view().data, want.numel() * 2)) << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    RanksModes, DeepEPRoundTest,
    ::testing::Values(EpCase{1, DeepEPMode::NORMAL}, EpCase{2, DeepEPMode::NORMAL},
                      EpCase{3, DeepEPMode::NORMAL}, EpCase{4, DeepEPMode::NORMAL},
                      EpCase{8, DeepEPMode::NORMAL}, EpCase{1, DeepEPMode::LOW_LATENCY},
                      EpCase{2, DeepEPMode::LOW_LATENCY}, EpCase{3, DeepEPMode::LOW_LATENCY},
                      EpCase{4, DeepEPMode::LOW_LATENCY}, EpCase{8, DeepEPMode::LOW_LATENCY}),
    [](const auto& info) {
      return std::to_string(info.param.ranks) +
             (info.param.mode == DeepEPMode::NORMAL ? "_normal" : "_low_latency");
    });

DeepEPConfig small_config(MoeRunnerBackend backend = MoeRunnerBackend::DEEP_GEMM) {
  DeepEPConfig c;
  c.num_experts = 4;
  c.num_local_experts = 4;
  c.hidden_size = 128;
  c.top_k = 2;
  c.num_max_dispatch_tokens_per_rank = 4;
  c.runner_backend = backend;
  return c;
}

TEST(DeepEPDispatcherTest, OutOfOrderCallsRaise) {
  auto group = LoopbackGroup::create(1);
  DeepEPDispatcher d(group->transport(0), small_config());
  EXPECT_THROW(d.dispatch_b(), ContractViolation);
  EXPECT_THROW(d.combine_b(), ContractViolation);
  EXPECT_THROW(d.combine_a(std::make_shared<DeepEPLLCombineInput>()), ContractViolation);
  EXPECT_EQ(d.stage(), DeepEPDispatcher::Stage::kInitial);
}

TEST(DeepEPDispatcherTest, PayloadResolutionTable) {
  auto t = LoopbackGroup::create(1)->transport(0);
  EXPECT_EQ(DeepEPDispatcher(t, small_config()).resolve_payload(), DispatchPayload::kFP8);
  EXPECT_EQ(
      DeepEPDispatcher(t, small_config(MoeRunnerBackend::FLASHINFER_CUTEDSL)).resolve_payload(),
      DispatchPayload::kBF16);
  EXPECT_EQ(DeepEPDispatcher(t, small_config(MoeRunnerBackend::CUTLASS)).resolve_payload(),
            DispatchPayload::kBF16);
  DeepEPDispatcher d(t, small_config(MoeRunnerBackend::FLASHINFER_CUTEDSL));
  d.set_quant_config({{"dispatcher_output_dtype", std::string("fp8")}});
  EXPECT_EQ(d.resolve_payload(), DispatchPayload::kFP8);
  d.set_quant_config(
      {{"input_global_scale", 2.0}, {"dispatcher_output_dtype", std::string("bf16")}});
  EXPECT_EQ(d.resolve_payload(), DispatchPayload::kNVFP4);  // input_global_scale wins
  d.set_quant_config({{"input_global_scale", std::monostate{}}});
  EXPECT_EQ(d.resolve_payload(), DispatchPayload::kBF16);  // None: absent
  d.set_quant_config({{"dispatcher_output_dtype", std::string("int8")}});
  EXPECT_THROW(d.resolve_payload(), Unsupported);
}

TEST(DeepEPDispatcherTest, R5_RoundScaleAndUe8m0OnlyWithFp8) {
  auto t = LoopbackGroup::create(1)->transport(0);
  DeepEPConfig c = small_config(MoeRunnerBackend::FLASHINFER_CUTEDSL);
  c.round_scale = true;
  EXPECT_THROW(DeepEPDispatcher(t, c), InvalidArgument);  // BF16 payload
  c.round_scale = false;
  c.use_ue8m0 = true;
  EXPECT_THROW(DeepEPDispatcher(t, c), InvalidArgument);
  DeepEPConfig fp8 = small_config();
  fp8.round_scale = fp8.use_ue8m0 = true;
  DeepEPDispatcher d(t, fp8);                         // FP8: allowed
  d.set_quant_config({{"input_global_scale", 1.0}});  // NVFP4 now: the dispatch refuses
  Batch b = make_batch(2, 128, 4, 2, 1);
  EXPECT_THROW(d.dispatch_a(b.hidden, b.topk), InvalidArgument);
  EXPECT_EQ(d.stage(), DeepEPDispatcher::Stage::kInitial);
}

TEST(DeepEPDispatcherTest, CapacityOverflowIsATypedErrorBeforeSending) {
  auto t = LoopbackGroup::create(1)->transport(0);
  DeepEPConfig c = small_config();
  c.mode = DeepEPMode::LOW_LATENCY;
  Batch b = make_batch(5, 128, 4, 2, 3);  // 5 tokens > 4
  DeepEPDispatcher d(t, c);
  EXPECT_THROW(d.dispatch_a(b.hidden, b.topk), DispatchCapacityError);
  EXPECT_EQ(d.stage(), DeepEPDispatcher::Stage::kInitial);
  c.num_max_dispatch_tokens_per_rank = 1025;
  EXPECT_THROW(DeepEPDispatcher(t, c), DispatchCapacityError);
  c.num_max_dispatch_tokens_per_rank = 4;
  c.num_local_experts = 3;  // uneven placement
  EXPECT_THROW(DeepEPDispatcher(t, c), InvalidArgument);
}

TEST(FlashinferDispatcherTest, PaddedLayoutAndPartialSums) {
  const int R = 3;
  const int64_t E = 6, H = 16, k = 2, L = E / R;
  auto group = LoopbackGroup::create(R);
  std::vector<Batch> batches;
  for (int r = 0; r < R; ++r) batches.push_back(make_batch(r == 2 ? 0 : 3 + r, H, E, k, 40 + r));
  std::vector<Tensor> outputs(R);
  group->run([&](int r) {
    FlashinferDispatcher d(group->transport(r), {E, L, H, k, MoeRunnerBackend::FLASHINFER_CUTLASS});
    DispatchOutputPtr out = d.dispatch(batches[r].hidden, batches[r].topk);
    auto* f = dynamic_cast<FlashinferDispatchOutput*>(out.get());
    ASSERT_NE(f, nullptr);
    const int64_t m = 4;  // the largest T_local
    ASSERT_EQ(f->hidden_states.size(0), R * m);
    const auto& topk = std::get<StandardTopKOutput>(f->topk_output);
    Tensor partial = Tensor::zeros({R * m, H}, DType::kBF16);
    for (int64_t n = 0; n < R * m; ++n)
      for (int64_t h = 0; h < H; ++h) {
        float acc = 0.0f;
        for (int64_t j = 0; j < k; ++j) {
          const int32_t e = topk.topk_ids.ptr<int32_t>()[n * k + j];
          if (e == E) continue;  // invalid token (flashinfer_cutlass convention)
          if (e >= 0 && e / L == r)
            acc += bf16_to_f32(f->hidden_states.ptr<uint16_t>()[n * H + h]) *
                   topk.topk_weights.ptr<float>()[n * k + j];
        }
        partial.ptr<uint16_t>()[n * H + h] = f32_to_bf16(acc);
      }
    outputs[r] = d.combine(std::make_shared<FlashinferCombineInput>(partial));
  });
  for (int r = 0; r < R; ++r) {
    const Batch& b = batches[r];
    for (int64_t t = 0; t < b.hidden.size(0); ++t)
      for (int64_t h = 0; h < H; ++h) {
        float sum = 0.0f;
        for (int d = 0; d < R; ++d) {
          float acc = 0.0f;
          for (int64_t j = 0; j < k; ++j) {
            const int32_t e = b.topk.topk_ids.ptr<int32_t>()[t * k + j];
            if (e >= 0 && e / L == d)
              acc += bf16_to_f32(b.hidden.ptr<uint16_t>()[t * H + h]) *
                     b.topk.topk_weights.ptr<float>()[t * k + j];
          }
          sum += bf16_to_f32(f32_to_bf16(acc));
        }
        EXPECT_EQ(outputs[r].ptr<uint16_t>()[t * H + h], f32_to_bf16(sum)) << r << " " << t;
      }
  }
}

// ---------------------------------------------------------------------------------------------
// Prepared rounds (capture): fixed buffers, no allocation, the eager round's bits.

// The fake experts of the eager tests above, into a prepared round's combine input.
void fake_low_latency(const DeepEPLLDispatchOutput& ll, int rank, int64_t L, const Tensor& y) {
  const int64_t m_cap = ll.hidden_states.size(1), H = ll.hidden_states.size(2);
  for (int64_t e = 0; e < L; ++e)
    for (int64_t m = 0; m < ll.masked_m.ptr<int32_t>()[e]; ++m)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t i = (e * m_cap + m) * H + h;
        y.ptr<uint16_t>()[i] = fake_expert(ll.hidden_states.ptr<uint16_t>()[i], rank * L + e);
      }
}

void fake_partials(const FlashinferDispatchOutput& f, int rank, int64_t L, const Tensor& partial) {
  const auto& topk = std::get<StandardTopKOutput>(f.topk_output);
  const int64_t rows = f.hidden_states.size(0), H = f.hidden_states.size(1);
  const int64_t k = topk.topk_ids.size(1);
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t h = 0; h < H; ++h) {
      float acc = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = topk.topk_ids.ptr<int32_t>()[n * k + j];
        if (e >= 0 && e / L == rank)  // the invalid id (E) belongs to no rank
          acc += bf16_to_f32(f.hidden_states.ptr<uint16_t>()[n * H + h]) *
                 topk.topk_weights.ptr<float>()[n * k + j];
      }
      partial.ptr<uint16_t>()[n * H + h] = f32_to_bf16(acc);
    }
}

struct RoundCase {
  int ranks;
  MoeA2ABackend a2a;
  MoeRunnerBackend runner;
};

class PreparedRoundTest : public ::testing::TestWithParam<RoundCase> {};

// Every rank prepares a round over static buffers of `cap` rows; each replay (new contents, any
// token counts up to cap) must allocate nothing and equal the eager round on the same dispatcher.
TEST_P(PreparedRoundTest, ReplayEqualsEagerRoundAndAllocatesNothing) {
  const auto [R, a2a, runner] = GetParam();
  const int64_t E = 4 * R, H = 32, k = 3, L = E / R, cap = 6;
  auto group = LoopbackGroup::create(R);
  std::vector<std::unique_ptr<BaseDispatcher>> dispatchers;
  std::vector<Batch> statics;
  std::vector<PreparedRoundPtr> rounds;
  std::vector<Tensor> results, outputs;  // the fake experts' tensors, the rounds' outputs
  for (int r = 0; r < R; ++r) {
    if (a2a == MoeA2ABackend::DEEPEP) {
      DeepEPConfig c;
      c.num_experts = E;
      c.num_local_experts = L;
      c.hidden_size = H;
      c.top_k = k;
      c.mode = DeepEPMode::AUTO;  // captured as low-latency
      c.num_max_dispatch_tokens_per_rank = 8;
      c.runner_backend = runner;
      c.routed_scaling_factor = 1.5f;
      dispatchers.push_back(std::make_unique<DeepEPDispatcher>(group->transport(r), c));
      dispatchers.back()->set_quant_config({{"dispatcher_output_dtype", std::string("bf16")}});
    } else {
      dispatchers.push_back(std::make_unique<FlashinferDispatcher>(
          group->transport(r), FlashinferDispatchConfig{E, L, H, k, runner}));
    }
    statics.push_back(make_batch(cap, H, E, k, 90 + r));
    rounds.push_back(dispatchers[r]->prepare_round(statics[r].hidden, statics[r].topk));
    CombineInputPtr combine_input;
    if (a2a == MoeA2ABackend::DEEPEP) {
      results.push_back(Tensor::zeros({L, 8 * R, H}, DType::kBF16));  // m_cap = 8 · R
      auto ll = std::make_shared<DeepEPLLCombineInput>();
      ll->hidden_states = results.back();
      combine_input = ll;
    } else {
      results.push_back(Tensor::zeros({R * cap, H}, DType::kBF16));
      combine_input = std::make_shared<FlashinferCombineInput>(results.back());
    }
    outputs.push_back(rounds[r]->bind_combine(combine_input));
  }
  auto fake = [&](int r, const DispatchOutputPtr& out, const Tensor& y) {
    if (a2a == MoeA2ABackend::DEEPEP)
      fake_low_latency(dynamic_cast<const DeepEPLLDispatchOutput&>(*out), r, L, y);
    else
      fake_partials(dynamic_cast<const FlashinferDispatchOutput&>(*out), r, L, y);
  };
  std::vector<int64_t> counts(R);
  const std::function<void(int)> replay = [&](int r) {
    rounds[r]->dispatch(counts[r]);
    fake(r, rounds[r]->dispatch_output(), results[r]);
    rounds[r]->combine(counts[r]);
  };
  for (int pass = 0; pass < 4; ++pass) {
    for (int r = 0; r < R; ++r) {
      counts[r] = (pass + 2 * r) % (cap + 1);
      const Batch fresh = make_batch(cap, H, E, k, 200 + 10 * pass + r);
      std::memcpy(statics[r].hidden.view().data, fresh.hidden.view().data, cap * H * 2);
      std::memcpy(statics[r].topk.topk_ids.view().data, fresh.topk.topk_ids.view().data,
                  cap * k * 4);
      std::memcpy(statics[r].topk.topk_weights.view().data, fresh.topk.topk_weights.view().data,
                  cap * k * 4);
    }
    std::vector<Tensor> want(R);
    group->run([&](int r) {  // the eager round on the same dispatchers
      const Tensor x = Tensor::copy_of(statics[r].hidden.view().narrow(0, 0, counts[r]));
      StandardTopKOutput topk{
          Tensor::copy_of(statics[r].topk.topk_weights.view().narrow(0, 0, counts[r])),
          Tensor::copy_of(statics[r].topk.topk_ids.view().narrow(0, 0, counts[r])),
          {}};
      if (auto* deepep = dynamic_cast<DeepEPDispatcher*>(dispatchers[r].get()))
        deepep->set_is_extend_in_batch(false);
      DispatchOutputPtr out = dispatchers[r]->dispatch(x, topk);
      Tensor y;
      CombineInputPtr in;
      if (a2a == MoeA2ABackend::DEEPEP) {
        auto* ll = dynamic_cast<DeepEPLLDispatchOutput*>(out.get());
        y = Tensor::zeros(ll->hidden_states.view().shape_vector(), DType::kBF16);
        auto ll_in = std::make_shared<DeepEPLLCombineInput>();
        ll_in->hidden_states = y;
        in = ll_in;
      } else {
        y = Tensor::zeros({dynamic_cast<FlashinferDispatchOutput&>(*out).hidden_states.size(0), H},
                          DType::kBF16);
        in = std::make_shared<FlashinferCombineInput>(y);
      }
      fake(r, out, y);
      want[r] = dispatchers[r]->combine(in);
    });
    EXPECT_EQ(count_allocations([&] { group->run(replay); }), 0) << "pass " << pass;
    for (int r = 0; r < R; ++r) {
      ASSERT_EQ(want[r].size(0), counts[r]);
      EXPECT_EQ(0, std::memcmp(outputs[r].view().data, want[r].view().data, counts[r] * H * 2))
          << "rank " << r << " pass " << pass;
      for (int64_t i = counts[r] * H; i < cap * H; ++i)
        ASSERT_EQ(outputs[r].ptr<uint16_t>()[i], 0) << "padding row of rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    RanksBackends, PreparedRoundTest,
    ::testing::Values(RoundCase{1, MoeA2ABackend::DEEPEP, MoeRunnerBackend::DEEP_GEMM},
                      RoundCase{2, MoeA2ABackend::DEEPEP, MoeRunnerBackend::DEEP_GEMM},
                      RoundCase{4, MoeA2ABackend::DEEPEP, MoeRunnerBackend::DEEP_GEMM},
                      RoundCase{3, MoeA2ABackend::DEEPEP, MoeRunnerBackend::FLASHINFER_CUTEDSL},
                      RoundCase{1, MoeA2ABackend::FLASHINFER, MoeRunnerBackend::FLASHINFER_CUTLASS},
                      RoundCase{3, MoeA2ABackend::FLASHINFER, MoeRunnerBackend::FLASHINFER_CUTLASS},
                      RoundCase{4, MoeA2ABackend::FLASHINFER,
                                MoeRunnerBackend::FLASHINFER_CUTEDSL}),
    [](const auto& info) {
      return std::to_string(info.param.ranks) + "_" + to_string(info.param.a2a) + "_" +
             to_string(info.param.runner);
    });

TEST(PreparedRoundTest, NormalModeAndOversizedCapacityAreRefusedAtCapture) {
  auto group = LoopbackGroup::create(1);
  DeepEPConfig c = small_config();
  const Batch b = make_batch(4, c.hidden_size, c.num_experts, c.top_k, 3);
  c.mode = DeepEPMode::NORMAL;
  try {
    DeepEPDispatcher(group->transport(0), c).prepare_round(b.hidden, b.topk);
    FAIL() << "expected normal mode to be refused";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("normal mode cannot be captured"), std::string::npos);
  }
  c.mode = DeepEPMode::LOW_LATENCY;
  c.num_max_dispatch_tokens_per_rank = 3;
  EXPECT_THROW(DeepEPDispatcher(group->transport(0), c).prepare_round(b.hidden, b.topk),
               DispatchCapacityError);
}

TEST(PreparedRoundTest, BadIdsAndNonFinitePayloadsRaiseBeforeSending) {
  auto group = LoopbackGroup::create(1);
  DeepEPConfig c = small_config();  // FP8 payload
  c.mode = DeepEPMode::LOW_LATENCY;
  DeepEPDispatcher d(group->transport(0), c);
  Batch b = make_batch(4, c.hidden_size, c.num_experts, c.top_k, 5);
  PreparedRoundPtr round = d.prepare_round(b.hidden, b.topk);
  b.topk.topk_ids.ptr<int32_t>()[3] = 4;
  EXPECT_THROW(group->run([&](int) { round->dispatch(4); }), OutOfRange);
  b.topk.topk_ids.ptr<int32_t>()[3] = 1;
  b.topk.topk_ids.ptr<int32_t>()[0] = 0;
  b.hidden.ptr<uint16_t>()[5] = 0x7FC0;  // NaN in token 0
  try {
    group->run([&](int) { round->dispatch(4); });
    FAIL() << "expected the NaN to raise";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("row 0 holds a non-finite value"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace moecore
