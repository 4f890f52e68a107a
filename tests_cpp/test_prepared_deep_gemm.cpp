// The deep_gemm prepared runs ((standard | deepep_ll | deepep_normal), deep_gemm) in every quant
// mode: prepared once, then for changing contents (routings with −1 ids, masked_m, received
// counts, hidden states) run() allocates nothing on any thread and gives a fresh eager
// MoeRunner::run's bits; bad contents raise eager's error type and leave the output untouched.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/core/thread_pool.h"
#include "moecore/formats/quantize.h"
#include "moecore/runner/registry.h"
#include "moecore/runner/runner.h"
#include "support/counting_allocator.h"
#include "support/moe_problem.h"

namespace moecore {
namespace {

using testing::count_allocations;
using testing::random_tensor;

constexpr int64_t kE = 4, kH = 640, kI = 256, kGroups = kH / 128;  // 5 groups: 2 packed words

/// How the weights and the payload are quantized: BF16, FP8 with f32 scales, or FP8 with UE8M0
/// (power-of-two) scales, which DeepEP payloads carry packed in int32 words.
enum class Mode { kBf16, kFp8, kFp8Ue8m0 };

const char* mode_name(Mode m) {
  return m == Mode::kBf16 ? "bf16" : m == Mode::kFp8 ? "fp8" : "fp8_ue8m0_packed";
}

bool is_fp8(Mode m) { return m != Mode::kBf16; }

std::shared_ptr<DeepGemmMoeQuantInfo> make_quant_info(std::mt19937& rng, Mode mode) {
  const Tensor w13 = random_tensor(rng, {kE, 2 * kI, kH}, DType::kBF16, 0.05f);
  const Tensor w2 = random_tensor(rng, {kE, kH, kI}, DType::kBF16, 0.06f);
  auto q = std::make_shared<DeepGemmMoeQuantInfo>();
  q->use_fp8 = is_fp8(mode);
  if (!q->use_fp8) {
    q->w13_weight = w13;
    q->w2_weight = w2;
    return q;
  }
  const bool ue8m0 = mode == Mode::kFp8Ue8m0;
  QuantizedTensor a = quantize_fp8_block(w13.view(), 128, 128, kDefaultMinAmax, ue8m0);
  QuantizedTensor b = quantize_fp8_block(w2.view(), 128, 128, kDefaultMinAmax, ue8m0);
  q->w13_weight = a.q;
  q->w13_scale = a.scale;
  q->w2_weight = b.q;
  q->w2_scale = b.scale;
  q->block_shape = {128, 128};
  q->scale_ue8m0 = ue8m0;
  return q;
}

void copy_bytes(const Tensor& src, const Tensor& dst) {
  ASSERT_EQ(src.numel() * dtype_size(src.dtype()), dst.numel() * dtype_size(dst.dtype()));
  std::memcpy(dst.view().data, src.view().data,
              static_cast<size_t>(src.numel() * dtype_size(src.dtype())));
}

/// Rewrites a DeepEP payload in place: `rows` new bf16 rows, quantized per 1×128 group as the
/// dispatcher does for FP8 (codes [rows, H]; scales f32 [rows, H/128], or packed [rows, 2]).
/// scale_at(r, g) is where the f32 scale of row r, group g lives (DeepEP's layout).
template <typename ScaleAt>
void write_payload(std::mt19937& rng, Mode mode, int64_t rows, const Tensor& x, const Tensor& scale,
                   ScaleAt scale_at) {
  const Tensor values = random_tensor(rng, {rows, kH}, DType::kBF16);
  if (!is_fp8(mode)) return copy_bytes(values, x);
  QuantizedTensor q =
      quantize_fp8_per_token_group(values.view(), 128, kDefaultMinAmax, mode == Mode::kFp8Ue8m0);
  copy_bytes(q.q, x);
  if (mode == Mode::kFp8Ue8m0) return copy_bytes(pack_ue8m0(q.scale.view()), scale);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < kGroups; ++g) *scale_at(r, g) = q.scale.ptr<float>()[r * kGroups + g];
}

/// Random routing in place: distinct experts per token from [0, E), each slot −1 with
/// probability p_invalid.
void write_routing(std::mt19937& rng, const Tensor& ids, const Tensor& weights, double p_invalid) {
  const int64_t T = ids.size(0), k = ids.size(1);
  std::bernoulli_distribution invalid(p_invalid);
  std::uniform_real_distribution<float> weight(0.05f, 1.0f);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> experts = {0, 1, 2, 3};
    std::shuffle(experts.begin(), experts.end(), rng);
    for (int64_t j = 0; j < k; ++j) {
      ids.ptr<int32_t>()[t * k + j] = invalid(rng) ? -1 : experts[j];
      weights.ptr<float>()[t * k + j] = weight(rng);
    }
  }
}

/// One dispatch format with its dispatch output, whose contents `next_contents` rewrites in place
/// for round r (shapes stay), and `corrupt` spoils so that eager raises (returning a function
/// that repairs it).
struct Scenario {
  DispatchOutputPtr dispatch;
  MoeA2ABackend a2a;
  std::function<void(int round)> next_contents;
  std::function<std::function<void()>(int kind)> corrupt;
  int corruptions = 0;
};

Scenario standard_scenario(std::mt19937& rng, Mode) {
  constexpr int64_t T = 20, k = 3;
  auto d = std::make_shared<StandardDispatchOutput>();
  d->hidden_states = Tensor::empty({T, kH}, DType::kBF16);
  const Tensor ids = Tensor::empty({T, k}, DType::kI32);
  const Tensor weights = Tensor::empty({T, k}, DType::kF32);
  d->topk_output = StandardTopKOutput{weights, ids, {}};
  Scenario s{d, MoeA2ABackend::NONE};
  s.next_contents = [&rng, d, ids, weights](int round) {
    copy_bytes(random_tensor(rng, {T, kH}, DType::kBF16), d->hidden_states);
    write_routing(rng, ids, weights, round == 0 ? 0.0 : 0.1 * round);
    if (round == 2)  // expert 3 gets no rows
      for (int64_t i = 0; i < T * k; ++i)
        if (ids.ptr<int32_t>()[i] == 3) ids.ptr<int32_t>()[i] = -1;
    if (round == 3)  // every slot invalid
      std::fill(ids.ptr<int32_t>(), ids.ptr<int32_t>() + T * k, -1);
  };
  s.corrupt = [ids](int) -> std::function<void()> {
    const int32_t saved = ids.ptr<int32_t>()[7];
    ids.ptr<int32_t>()[7] = static_cast<int32_t>(kE);  // out of range
    return [ids, saved] { ids.ptr<int32_t>()[7] = saved; };
  };
  s.corruptions = 1;
  return s;
}

Scenario deepep_ll_scenario(std::mt19937& rng, Mode mode) {
  constexpr int64_t m_cap = 24, T = 10, k = 2;
  auto d = std::make_shared<DeepEPLLDispatchOutput>();
  const bool fp8 = is_fp8(mode);
  d->hidden_states = Tensor::empty({kE, m_cap, kH}, fp8 ? DType::kF8E4M3 : DType::kBF16);
  Tensor scale;
  if (mode == Mode::kFp8) {  // DeepEP's f32 scales: column-major in the last two dims
    const Tensor storage = Tensor::empty({kE, kGroups, m_cap}, DType::kF32);
    TensorView v = storage.view();
    v.shape[1] = m_cap;
    v.shape[2] = kGroups;
    v.strides[1] = 1;
    v.strides[2] = m_cap;
    scale = Tensor(v, storage.owner());
  } else if (mode == Mode::kFp8Ue8m0) {
    scale = Tensor::empty({kE, m_cap, (kGroups + 3) / 4}, DType::kI32);
  }
  d->hidden_states_scale = scale;
  d->topk_ids = Tensor::empty({T, k}, DType::kI32);
  d->topk_weights = Tensor::empty({T, k}, DType::kF32);
  d->masked_m = Tensor::empty({kE}, DType::kI32);
  d->expected_m = 8;
  Scenario s{d, MoeA2ABackend::DEEPEP};
  s.next_contents = [&rng, d, mode, scale](int round) {
    auto scale_at = [&](int64_t r, int64_t g) {  // row r = e·m_cap + m
      return scale.ptr<float>() + (r / m_cap) * kGroups * m_cap + g * m_cap + r % m_cap;
    };
    write_payload(rng, mode, kE * m_cap, d->hidden_states, scale, scale_at);
    write_routing(rng, d->topk_ids, d->topk_weights, 0.2);
    std::uniform_int_distribution<int32_t> rows(0, static_cast<int32_t>(m_cap));
    int32_t* masked = d->masked_m.ptr<int32_t>();
    for (int64_t e = 0; e < kE; ++e) masked[e] = rows(rng);
    masked[round % kE] = round % 2 == 0 ? 0 : static_cast<int32_t>(m_cap);  // the bounds
  };
  s.corrupt = [d, scale, mode](int kind) -> std::function<void()> {
    if (kind == 0) {
      const int32_t saved = d->masked_m.ptr<int32_t>()[2];
      d->masked_m.ptr<int32_t>()[2] = static_cast<int32_t>(m_cap) + 1;
      return [d, saved] { d->masked_m.ptr<int32_t>()[2] = saved; };
    }
    // A 0xFF (NaN) UE8M0 byte, in a row past masked_m: eager rejects it all the same.
    EXPECT_EQ(mode, Mode::kFp8Ue8m0);
    int32_t& word = scale.ptr<int32_t>()[(kE * m_cap - 1) * 2 + 1];
    const int32_t saved = word;
    word = static_cast<int32_t>(static_cast<uint32_t>(word) | 0xFFu);
    return [&word, saved] { word = saved; };
  };
  s.corruptions = mode == Mode::kFp8Ue8m0 ? 2 : 1;
  return s;
}

Scenario deepep_normal_scenario(std::mt19937& rng, Mode mode) {
  constexpr int64_t N = 18, k = 3;
  auto d = std::make_shared<DeepEPNormalDispatchOutput>();
  const bool fp8 = is_fp8(mode);
  d->hidden_states = Tensor::empty({N, kH}, fp8 ? DType::kF8E4M3 : DType::kBF16);
  if (mode == Mode::kFp8) d->hidden_states_scale = Tensor::empty({N, kGroups}, DType::kF32);
  if (mode == Mode::kFp8Ue8m0)
    d->hidden_states_scale = Tensor::empty({N, (kGroups + 3) / 4}, DType::kI32);
  d->topk_ids = Tensor::empty({N, k}, DType::kI32);
  d->topk_weights = Tensor::empty({N, k}, DType::kF32);
  Scenario s{d, MoeA2ABackend::DEEPEP};
  s.next_contents = [&rng, d, mode](int round) {
    const Tensor& scale = d->hidden_states_scale;
    write_payload(rng, mode, N, d->hidden_states, scale,
                  [&](int64_t r, int64_t g) { return scale.ptr<float>() + r * kGroups + g; });
    write_routing(rng, d->topk_ids, d->topk_weights, 0.15 * round);
    // The dispatcher's counts, rounded up to its expert alignment (1, 4 or 128), or more.
    const int64_t align = round == 0 ? 1 : round == 1 ? 4 : 128;
    d->num_recv_tokens_per_expert.assign(kE, 0);
    for (int64_t i = 0; i < N * k; ++i)
      if (d->topk_ids.ptr<int32_t>()[i] >= 0)
        ++d->num_recv_tokens_per_expert[d->topk_ids.ptr<int32_t>()[i]];
    for (int64_t& c : d->num_recv_tokens_per_expert) c = (c + align - 1) / align * align + round;
  };
  s.corrupt = [d](int kind) -> std::function<void()> {
    if (kind == 0) {  // fewer received tokens than pairs
      std::vector<int64_t> saved = d->num_recv_tokens_per_expert;
      for (int64_t i = 0; i < N * k; ++i)
        if (d->topk_ids.ptr<int32_t>()[i] >= 0) {
          d->num_recv_tokens_per_expert[d->topk_ids.ptr<int32_t>()[i]] = 0;
          break;
        }
      return [d, saved] { d->num_recv_tokens_per_expert = saved; };
    }
    const int32_t saved = d->topk_ids.ptr<int32_t>()[4];
    d->topk_ids.ptr<int32_t>()[4] = -2;
    return [d, saved] { d->topk_ids.ptr<int32_t>()[4] = saved; };
  };
  s.corruptions = 2;
  return s;
}

/// The combine input's expert output: the tensor a prepared run rewrites.
const Tensor& combine_hidden(const CombineInputPtr& c) {
  if (auto* s = dynamic_cast<const StandardCombineInput*>(c.get())) return s->hidden_states;
  if (auto* ll = dynamic_cast<const DeepEPLLCombineInput*>(c.get())) return ll->hidden_states;
  auto* normal = dynamic_cast<const DeepEPNormalCombineInput*>(c.get());
  EXPECT_NE(normal, nullptr);
  return normal->hidden_states;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.view().data);
  return std::vector<uint8_t>(p, p + t.numel() * dtype_size(t.dtype()));
}

void expect_same_combine(const CombineInputPtr& got, const CombineInputPtr& want,
                         const std::string& what) {
  ASSERT_EQ(got->format(), want->format()) << what;
  const Tensor& a = combine_hidden(got);
  const Tensor& b = combine_hidden(want);
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  ASSERT_EQ(a.view().shape_vector(), b.view().shape_vector()) << what;
  EXPECT_TRUE(bytes_of(a) == bytes_of(b)) << what << ": prepared run differs from eager";
  auto routing = [](const CombineInputPtr& c) -> std::pair<const void*, const void*> {
    if (auto* ll = dynamic_cast<const DeepEPLLCombineInput*>(c.get()))
      return {ll->topk_ids.view().data, ll->topk_weights.view().data};
    if (auto* n = dynamic_cast<const DeepEPNormalCombineInput*>(c.get()))
      return {n->topk_ids.view().data, n->topk_weights.view().data};
    return {nullptr, nullptr};
  };
  EXPECT_EQ(routing(got), routing(want)) << what << ": the routing combine reads";
}

/// The moecore error type that fn throws, or "none".
template <typename F>
std::string thrown_type(F&& fn) {
  try {
    fn();
  } catch (const OutOfRange&) {
    return "OutOfRange";
  } catch (const InvalidArgument&) {
    return "InvalidArgument";
  } catch (const DTypeError&) {
    return "DTypeError";
  } catch (const ContractViolation&) {
    return "ContractViolation";
  } catch (const std::exception& e) {
    return std::string("other: ") + e.what();
  }
  return "none";
}

using ScenarioFn = Scenario (*)(std::mt19937&, Mode);

struct PreparedCase {
  const char* format;
  ScenarioFn scenario;
  Mode mode;
};

void PrintTo(const PreparedCase& c, std::ostream* os) {
  *os << c.format << "-" << mode_name(c.mode);
}

class DeepGemmPreparedTest : public ::testing::TestWithParam<PreparedCase> {
 protected:
  void TearDown() override { ThreadPool::instance().set_num_threads(available_cpus()); }
};

TEST_P(DeepGemmPreparedTest, RunAllocatesNothingAndEqualsEagerForEveryContent) {
  const PreparedCase c = GetParam();
  for (int threads : {1, 2}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    std::mt19937 rng(static_cast<unsigned>(11 + threads + 7 * static_cast<int>(c.mode)));
    ThreadPool::instance().set_num_threads(threads);
    const QuantInfoPtr quant = make_quant_info(rng, c.mode);
    Scenario s = c.scenario(rng, c.mode);
    MoeRunnerConfig config;
    config.routed_scaling_factor = 1.5f;
    MoeRunner runner(MoeRunnerBackend::DEEP_GEMM, config, s.a2a);
    s.next_contents(0);
    PreparedRunPtr prepared = runner.prepare(s.dispatch, quant);
    for (int round = 0; round < 4; ++round) {
      s.next_contents(round);
      EXPECT_EQ(count_allocations([&] { prepared->run(); }), 0) << "round " << round;
      expect_same_combine(prepared->combine_input(), runner.run(s.dispatch, quant),
                          "round " + std::to_string(round));
    }
  }
}

TEST_P(DeepGemmPreparedTest, BadContentsRaiseEagersErrorAndLeaveTheOutput) {
  const PreparedCase c = GetParam();
  std::mt19937 rng(29);
  ThreadPool::instance().set_num_threads(2);
  const QuantInfoPtr quant = make_quant_info(rng, c.mode);
  Scenario s = c.scenario(rng, c.mode);
  MoeRunner runner(MoeRunnerBackend::DEEP_GEMM, MoeRunnerConfig{}, s.a2a);
  s.next_contents(1);
  PreparedRunPtr prepared = runner.prepare(s.dispatch, quant);
  for (int kind = 0; kind < s.corruptions; ++kind) {
    SCOPED_TRACE("corruption " + std::to_string(kind));
    s.next_contents(1);
    prepared->run();
    const std::vector<uint8_t> before = bytes_of(combine_hidden(prepared->combine_input()));
    s.next_contents(2);  // new contents, one of them bad: a run that wrote anything shows
    std::function<void()> repair = s.corrupt(kind);
    const std::string eager = thrown_type([&] { runner.run(s.dispatch, quant); });
    EXPECT_NE(eager, "none");
    EXPECT_EQ(thrown_type([&] { prepared->run(); }), eager);
    EXPECT_TRUE(bytes_of(combine_hidden(prepared->combine_input())) == before)
        << "the failed run wrote the output";
    repair();  // the next run recovers
    prepared->run();
    expect_same_combine(prepared->combine_input(), runner.run(s.dispatch, quant), "after repair");
  }
}

std::vector<PreparedCase> all_cases() {
  std::vector<PreparedCase> cases;
  for (Mode mode : {Mode::kBf16, Mode::kFp8, Mode::kFp8Ue8m0}) {
    cases.push_back({"standard", standard_scenario, mode});
    cases.push_back({"deepep_ll", deepep_ll_scenario, mode});
    cases.push_back({"deepep_normal", deepep_normal_scenario, mode});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(FormatsModes, DeepGemmPreparedTest, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<PreparedCase>& info) {
                           return std::string(info.param.format) + "_" + mode_name(info.param.mode);
                         });

TEST(DeepGemmPreparedRegistryTest, EveryDeepGemmDispatchFormatHasAPreparedRun) {
  std::vector<std::string> formats;
  for (const auto& [key, origin] : registered_prepared_runs())
    if (key.second == MoeRunnerBackend::DEEP_GEMM) {
      formats.push_back(to_string(key.first));
      EXPECT_EQ(origin.rfind("cpp/moecore/runner/backends/deep_gemm.cpp", 0), 0u) << origin;
    }
  std::vector<std::string> permuted;  // every format the eager path runs...
  for (const auto& [key, origin] : registered_pre_permutes())
    if (key.second == MoeRunnerBackend::DEEP_GEMM) permuted.push_back(to_string(key.first));
  EXPECT_EQ(formats, permuted);
  std::set<std::string> tested;  // ...and the suite above covers each of them
  for (const PreparedCase& c : all_cases()) tested.insert(c.format);
  EXPECT_EQ(tested, std::set<std::string>(formats.begin(), formats.end()));
}

TEST(DeepGemmPreparedEmptyTest, NoTokensGiveEmptyOutputs) {
  std::mt19937 rng(31);
  const QuantInfoPtr quant = make_quant_info(rng, Mode::kFp8);
  MoeRunner runner(MoeRunnerBackend::DEEP_GEMM, MoeRunnerConfig{}, MoeA2ABackend::DEEPEP);
  auto normal = std::make_shared<DeepEPNormalDispatchOutput>();
  normal->hidden_states = Tensor::empty({0, kH}, DType::kF8E4M3);
  normal->hidden_states_scale = Tensor::empty({0, kGroups}, DType::kF32);
  normal->topk_ids = Tensor::empty({0, 2}, DType::kI32);
  normal->topk_weights = Tensor::empty({0, 2}, DType::kF32);
  normal->num_recv_tokens_per_expert.assign(kE, 0);
  auto standard = std::make_shared<StandardDispatchOutput>();
  standard->hidden_states = Tensor::empty({0, kH}, DType::kBF16);
  standard->topk_output = StandardTopKOutput{
      Tensor::empty({0, 2}, DType::kF32), Tensor::empty({0, 2}, DType::kI32), {}};
  for (const DispatchOutputPtr& d : std::vector<DispatchOutputPtr>{normal, standard}) {
    PreparedRunPtr prepared = runner.prepare(d, quant);
    EXPECT_EQ(count_allocations([&] { prepared->run(); }), 0);
    expect_same_combine(prepared->combine_input(), runner.run(d, quant), to_string(d->format()));
  }
}

}  // namespace
}  // namespace moecore
