// The 8-bit MoE paths in C++: sglang's activation quantizer rules on hand-computed values, the
// triton backend's quantized modes (fused == forced permute, threads, ISA levels, batch
// invariance, R9), the deep_gemm preprocess / post-reorder invariants, R15 guards and the
// contiguous (m_indices) layout against the masked one (bitwise) with its bad inputs, and the
// Fp8MoEMethod / ModelOptFp8MoEMethod / INT8 methods through FusedMoE (errors, padding, shard
// scale pairing). Numerics against the numpy reference live in tests_py/test_quant_{fp8,int8}.py.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <random>

#include "moecore/core/error.h"
#include "moecore/core/thread_pool.h"
#include "moecore/formats/fp8.h"
#include "moecore/formats/quantize.h"
#include "moecore/layer/fused_moe.h"
#include "moecore/quant/fp8.h"
#include "moecore/quant/modelopt_fp8.h"
#include "moecore/quant/w8a8_int8.h"
#include "moecore/runner/backends/deep_gemm.h"
#include "moecore/runner/quant_compute.h"
#include "moecore/runner/runner.h"
#include "support/moe_problem.h"

namespace moecore {
namespace {

using testing::make_problem;
using testing::MoeProblem;
using testing::to_floats;

std::vector<uint8_t> bytes(const Tensor& t) {
  Tensor c = t.view().is_contiguous() ? t : Tensor::copy_of(t.view());
  const uint8_t* p = static_cast<const uint8_t*>(c.view().data);
  return std::vector<uint8_t>(p, p + c.numel() * dtype_size(c.dtype()));
}

TEST(Fp8ActQuantTest, StaticRuleSaturatesAndTurnsNanIntoMax) {
  const float x[5] = {1e6f, -1e6f, NAN, 448.0f, 1.5f};
  uint8_t q[5];
  fp8_quantize_row_static(x, 5, 1.0f, q);
  EXPECT_EQ(q[0], 0x7e);
  EXPECT_EQ(q[1], 0xfe);
  EXPECT_EQ(q[2], 0x7e);  // fminf(NaN, 448) = 448, as the CUDA kernel
  EXPECT_EQ(q[3], 0x7e);
  EXPECT_EQ(q[4], f32_to_fp8_e4m3(1.5f));
}

TEST(Fp8ActQuantTest, ZeroInputScales) {
  const float z[4] = {0, 0, 0, 0};
  uint8_t q[4];
  EXPECT_EQ(fp8_quantize_row_per_token(z, 4, 0.0f, q), 0.0f);
  for (uint8_t c : q) EXPECT_EQ(c, 0);  // inv = 0 when s = 0
  fp8_quantize_row_static(z, 4, fp8_dynamic_scale(0.0f, 0.0f), q);
  for (uint8_t c : q) EXPECT_EQ(c, 0x7e);  // 0 · (1/0) = NaN → +448, dequantized by scale 0
  EXPECT_EQ(fp8_quant_group(z, 4, false, ActQuant::kFp8PerTokenGroup, q), kActQuantEps / 448.0f);
}

TEST(Fp8ActQuantTest, Ue8m0FloorDiffersBetweenTheTwoGroupRules) {
  std::vector<float> x(128, 1e-9f);
  std::vector<uint8_t> q(128);
  EXPECT_EQ(fp8_quant_group(x.data(), 128, true, ActQuant::kFp8PerTokenGroup, q.data()),
            std::ldexp(1.0f, -33));
  EXPECT_EQ(fp8_quant_group(x.data(), 128, true, ActQuant::kFp8SiluPostGroup, q.data()),
            std::ldexp(1.0f, -38));
}

TEST(Int8ActQuantTest, RoundsHalfAwayFromZero) {
  const float x[6] = {127.0f, 2.5f, -2.5f, 0.5f, -0.5f, 0.49999997f};
  int8_t q[6];
  EXPECT_EQ(int8_quantize_row_per_token(x, 6, kActQuantEps, q), 1.0f);
  const int8_t want[6] = {127, 3, -3, 1, -1, 0};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(q[i], want[i]) << i;
}

// ---------------------------------------------------------------------------------------------
// The triton backend's quantized modes.

struct QuantCase {
  const char* name;
  bool fp8;
  bool per_channel;
  bool block;
  bool static_act;
  bool batch_invariant;
};

// Quantizes a dense problem's experts per the case (per-channel rows, per-tensor, 32×32 blocks).
std::shared_ptr<TritonMoeQuantInfo> quantize(const MoeProblem& p, const QuantCase& c) {
  auto q = std::make_shared<TritonMoeQuantInfo>();
  auto one = [&](const Tensor& w, Tensor* s) {
    if (!c.fp8) {
      QuantizedTensor r = quantize_int8_per_channel(w.view());
      Tensor codes = r.q;
      codes = Tensor(make_view(codes.view().data, DType::kI8, codes.view().shape_vector()),
                     codes.owner());
      *s = r.scale;
      return codes;
    }
    if (c.block) {
      QuantizedTensor r = quantize_fp8_block(w.view(), 32, 32);
      *s = r.scale;
      return r.q;
    }
    QuantizedTensor r = quantize_fp8_per_channel(w.view());
    if (c.per_channel) {
      *s = r.scale;
      return r.q;
    }
    // Per-tensor: one scale per expert from the per-expert amax.
    Tensor out = Tensor::empty(w.view().shape_vector(), DType::kF8E4M3);
    *s = Tensor::empty({w.size(0)}, DType::kF32);
    const int64_t n = w.size(1) * w.size(2);
    std::vector<float> row(n);
    for (int64_t e = 0; e < w.size(0); ++e) {
      load_f32(w.view().at({e, 0, 0}), w.dtype(), n, row.data());
      const float sc = fp8_dynamic_scale(amax_row(row.data(), n), 0.0f);
      s->ptr<float>()[e] = sc;
      fp8_quantize_row_static(row.data(), n, sc, out.ptr<uint8_t>() + e * n);
    }
    return out;
  };
  q->w13_weight = one(p.w13, &q->w13_scale);
  q->w2_weight = one(p.w2, &q->w2_scale);
  q->use_fp8_w8a8 = c.fp8;
  q->use_int8_w8a8 = !c.fp8;
  q->per_channel_quant = c.per_channel;
  if (c.block) q->block_shape = {32, 32};
  if (c.static_act) {
    q->a13_scale = Tensor::empty({1}, DType::kF32);
    q->a13_scale.ptr<float>()[0] = 0.01f;
    q->a2_scale = Tensor::empty({1}, DType::kF32);
    q->a2_scale.ptr<float>()[0] = 0.004f;
  }
  return q;
}

Tensor run(const std::shared_ptr<TritonMoeQuantInfo>& q, const Tensor& x, const Tensor& ids,
           const Tensor& wts, bool unfused = false, std::optional<IsaLevel> level = std::nullopt) {
  MoeRunnerConfig config;
  config.inplace = false;
  config.force_unfused = unfused;
  config.isa_level = level;
  MoeRunner runner(MoeRunnerBackend::TRITON, config, MoeA2ABackend::NONE);
  auto d = std::make_shared<StandardDispatchOutput>();
  d->hidden_states = x;
  d->topk_output = StandardTopKOutput{wts, ids, {}};
  return std::dynamic_pointer_cast<StandardCombineInput>(runner.run(d, q))->hidden_states;
}

Tensor row_slice(const Tensor& t, int64_t r) {
  TensorView v = t.view();
  v.data = v.at({r, 0});
  v.shape[0] = 1;
  return Tensor::copy_of(v);
}

class TritonQuantTest : public ::testing::TestWithParam<QuantCase> {};

TEST_P(TritonQuantTest, FusedEqualsPermuteDeterministicAndBatchInvariant) {
  const QuantCase c = GetParam();
  std::mt19937 rng(17);
  MoeProblem p = make_problem(rng, 40, 8, 64, 32, 2, DType::kBF16);
  auto q = quantize(p, c);
  ThreadPool::instance().set_num_threads(1);
  const std::vector<float> base =
      to_floats(run(q, p.x, p.topk_ids, p.topk_weights, false, IsaLevel::kScalar));
  EXPECT_EQ(to_floats(run(q, p.x, p.topk_ids, p.topk_weights, true)), base);
  for (int threads : {2, 3}) {
    ThreadPool::instance().set_num_threads(threads);
    for (IsaLevel level : available_isa_levels())
      EXPECT_EQ(to_floats(run(q, p.x, p.topk_ids, p.topk_weights, false, level)), base)
          << threads << " threads, " << isa_level_name(level);
  }
  ThreadPool::instance().set_num_threads(available_cpus());
  for (float v : base) EXPECT_TRUE(std::isfinite(v));
  if (!c.batch_invariant) return;
  for (int64_t t : {0, 21, 39}) {
    const std::vector<float> alone = to_floats(
        run(q, row_slice(p.x, t), row_slice(p.topk_ids, t), row_slice(p.topk_weights, t)));
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), base.begin() + t * p.H)) << "token " << t;
  }
}

TEST_P(TritonQuantTest, EmptyInputR9) {
  std::mt19937 rng(3);
  MoeProblem p = make_problem(rng, 0, 4, 64, 32, 2, DType::kBF16);
  Tensor out = run(quantize(p, GetParam()), p.x, p.topk_ids, p.topk_weights);
  EXPECT_EQ(out.size(0), 0);
  EXPECT_EQ(out.size(1), 64);
  EXPECT_EQ(out.dtype(), DType::kBF16);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, TritonQuantTest,
    ::testing::Values(QuantCase{"fp8_per_tensor_static", true, false, false, true, true},
                      QuantCase{"fp8_per_tensor_dynamic", true, false, false, false, false},
                      QuantCase{"fp8_per_channel_dynamic", true, true, false, false, true},
                      QuantCase{"fp8_block32", true, false, true, false, true},
                      QuantCase{"int8_w8a8", false, true, false, false, true}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(TritonQuantTest, ScaleValuesAreValidatedBeforeAnyOutput) {
  std::mt19937 rng(4);
  MoeProblem p = make_problem(rng, 3, 4, 64, 32, 2, DType::kBF16);
  auto q = quantize(p, {"", true, false, false, true, true});
  q->w13_scale.ptr<float>()[1] = -1.0f;
  EXPECT_THROW(run(q, p.x, p.topk_ids, p.topk_weights), InvalidArgument);
  q->w13_scale.ptr<float>()[1] = 1.0f;
  q->a2_scale.ptr<float>()[0] = 0.0f;
  EXPECT_THROW(run(q, p.x, p.topk_ids, p.topk_weights), InvalidArgument);
  q->a2_scale.ptr<float>()[0] = NAN;
  EXPECT_THROW(run(q, p.x, p.topk_ids, p.topk_weights), InvalidArgument);
  auto i8 = quantize(p, {"", false, true, false, false, true});
  i8->per_channel_quant = false;
  EXPECT_THROW(run(i8, p.x, p.topk_ids, p.topk_weights), ContractViolation);
}

// check_scale_values over the flagged experts only: the flat indices of expert e's slice, in the
// contiguous pass and in the strided one, with the bad value's index in the whole view.
TEST(ScaleValuesTest, ChecksTheFlaggedExpertsAndNamesTheIndexInTheWholeView) {
  Tensor storage = Tensor::empty({3, 2, 4}, DType::kF32);
  for (int64_t i = 0; i < storage.numel(); ++i) storage.ptr<float>()[i] = 1.0f;
  TensorView contiguous = storage.view();  // [3, 2, 4]
  TensorView strided = contiguous;         // [3, 4, 2]: dims 1 and 2 swapped
  std::swap(strided.shape[1], strided.shape[2]);
  std::swap(strided.strides[1], strided.strides[2]);
  ASSERT_FALSE(strided.is_contiguous());
  storage.ptr<float>()[2 * 8 + 1 * 4 + 3] = NAN;  // contiguous [2, 1, 3], strided [2, 3, 1]
  const std::vector<uint8_t> first_two = {1, 1, 0}, last = {0, 0, 1};
  for (const auto& [view, index] :
       {std::pair{contiguous, "[2, 1, 3]"}, std::pair{strided, "[2, 3, 1]"}}) {
    EXPECT_NO_THROW(check_scale_values("api", "s", view, true, &first_two));
    for (const std::vector<uint8_t>* experts : {&last, static_cast<decltype(&last)>(nullptr)}) {
      try {
        check_scale_values("api", "s", view, true, experts);
        ADD_FAILURE() << "no error for " << view.describe();
      } catch (const InvalidArgument& e) {
        EXPECT_EQ(std::string(e.what()),
                  std::string("api: s must be finite and >= 0, got nan at ") + index);
      }
    }
  }
  storage.ptr<float>()[2 * 8 + 1 * 4 + 3] = 0.0f;
  EXPECT_NO_THROW(check_scale_values("api", "s", contiguous, true, &last));
  EXPECT_THROW(check_scale_values("api", "s", contiguous, false, &last), InvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// deep_gemm.

TEST(DeepGemmTest, PreprocessInvariants) {
  std::mt19937 rng(6);
  MoeProblem p = make_problem(rng, 300, 4, 256, 128, 3, DType::kBF16);
  p.topk_ids.ptr<int32_t>()[5] = -1;
  DeepGemmPreprocessed pre = moe_ep_deepgemm_preprocess(p.topk_ids, 4, p.x, true, false);
  EXPECT_EQ(pre.m_max, 512);
  EXPECT_EQ(pre.expected_m, (300 * 3 - 1) / 4 + 1);
  int64_t total = 0;
  for (int e = 0; e < 4; ++e) total += pre.masked_m.ptr<int32_t>()[e];
  EXPECT_EQ(total, 300 * 3 - 1);
  std::vector<int> next(4, 0);
  const uint8_t* rows = pre.hidden_states.ptr<uint8_t>();
  QuantizedTensor ref = quantize_fp8_per_token_group(p.x.view(), 128);
  for (int64_t s = 0; s < 900; ++s) {
    const int32_t e = p.topk_ids.ptr<int32_t>()[s];
    const int32_t dst = pre.src2dst.ptr<int32_t>()[s];
    if (e < 0) {
      EXPECT_EQ(dst, -1);
      continue;
    }
    EXPECT_EQ(dst, e * pre.m_max + next[e]++) << "stable order within expert " << e;
    // The gathered row is the token's per-token-group quantization (same rule as formats').
    EXPECT_EQ(0, std::memcmp(rows + dst * 256, ref.q.ptr<uint8_t>() + (s / 3) * 256, 256));
  }
}

TEST(DeepGemmTest, R15GuardsAtConstruction) {
  MoeRunnerConfig config;
  config.activation = "gelu";
  EXPECT_THROW(MoeRunner(MoeRunnerBackend::DEEP_GEMM, config), ContractViolation);
  config.activation = "silu";
  config.is_gated = false;
  EXPECT_THROW(MoeRunner(MoeRunnerBackend::DEEP_GEMM, config), ContractViolation);
  config.is_gated = true;
  config.activation = "bogus";
  EXPECT_THROW(MoeRunner(MoeRunnerBackend::DEEP_GEMM, config), InvalidArgument);
  config.activation = "silu";
  MoeRunner ok(MoeRunnerBackend::DEEP_GEMM, config);
  EXPECT_FALSE(ok.uses_fused_func());
}

TEST(DeepGemmTest, PostReorderAccumulatesInBf16) {
  // Two slots of one token: bf16(bf16(a·w0) + bf16(b·w1)), then × rsf.
  Tensor down = Tensor::zeros({1, 256, 1}, DType::kBF16);
  std::vector<float> v = {1.0f, 1.0f / 256.0f};
  store_f32(v.data(), 2, DType::kBF16, down.view().data);
  Tensor src2dst = Tensor::empty({2}, DType::kI32);
  src2dst.ptr<int32_t>()[0] = 0;
  src2dst.ptr<int32_t>()[1] = 1;
  Tensor ids = Tensor::zeros({1, 2}, DType::kI32);
  Tensor wts = Tensor::empty({1, 2}, DType::kF32);
  wts.ptr<float>()[0] = 1.0f;
  wts.ptr<float>()[1] = 1.0f;
  // 1 + 2^-8 is not a bf16 value: the bf16 sum rounds it back to 1 (ties to even).
  EXPECT_EQ(to_floats(deepgemm_post_reorder(down, src2dst, ids, wts, std::nullopt))[0], 1.0f);
  EXPECT_EQ(to_floats(deepgemm_post_reorder(down, src2dst, ids, wts, 3.0f))[0], 3.0f);
}

// The contiguous (m_indices) layout: the masked layout's rows re-laid as sglang's ep_scatter
// does (each expert one 128-aligned run, −1 padding rows holding garbage) give the same bits.
struct ContiguousLayout {
  Tensor x, scale, m_indices;
  std::vector<std::array<int64_t, 3>> runs;  // (expert, first row, rows)
};

ContiguousLayout to_contiguous(const DeepGemmPreprocessed& pre, bool fp8, int64_t H,
                               const std::vector<int32_t>& order, int64_t gap_before) {
  ContiguousLayout c;
  int64_t M = 0;
  for (int32_t e : order) {
    if (e == gap_before) M += 128;
    const int64_t m = pre.masked_m.ptr<int32_t>()[e];
    if (m == 0) continue;
    c.runs.push_back({e, M, m});
    M += (m + 127) / 128 * 128;
  }
  const int64_t groups = H / 128, m_max = pre.m_max, esize = fp8 ? 1 : 2;
  c.x = Tensor::empty({M, H}, fp8 ? DType::kF8E4M3 : DType::kBF16);
  auto* bytes_out = static_cast<uint8_t*>(c.x.view().data);
  for (int64_t i = 0; i < M * H * esize; ++i) bytes_out[i] = static_cast<uint8_t>(i * 37 % 113);
  if (fp8) {
    c.scale = Tensor::empty({M, groups}, DType::kF32);
    for (int64_t i = 0; i < M * groups; ++i) c.scale.ptr<float>()[i] = 1.5f;
  }
  c.m_indices = Tensor::empty({M}, DType::kI32);
  std::fill(c.m_indices.ptr<int32_t>(), c.m_indices.ptr<int32_t>() + M, -1);
  const auto* src = static_cast<const uint8_t*>(pre.hidden_states.view().data);
  for (const auto& [e, r0, m] : c.runs) {
    std::fill(c.m_indices.ptr<int32_t>() + r0, c.m_indices.ptr<int32_t>() + r0 + m,
              static_cast<int32_t>(e));
    std::memcpy(bytes_out + r0 * H * esize, src + e * m_max * H * esize, m * H * esize);
    if (fp8)
      std::memcpy(c.scale.ptr<float>() + r0 * groups,
                  pre.hidden_states_scale.ptr<float>() + e * m_max * groups, m * groups * 4);
  }
  return c;
}

DeepGemmMoeQuantInfo deep_gemm_info(const MoeProblem& p, bool fp8) {
  DeepGemmMoeQuantInfo q;
  q.use_fp8 = fp8;
  if (!fp8) {
    q.w13_weight = p.w13;
    q.w2_weight = p.w2;
    return q;
  }
  QuantizedTensor a = quantize_fp8_block(p.w13.view(), 128, 128);
  QuantizedTensor b = quantize_fp8_block(p.w2.view(), 128, 128);
  q.w13_weight = a.q;
  q.w13_scale = a.scale;
  q.w2_weight = b.q;
  q.w2_scale = b.scale;
  q.block_shape = {128, 128};
  return q;
}

TEST(DeepGemmTest, ContiguousLayoutEqualsMaskedBitwise) {
  for (bool fp8 : {true, false}) {
    for (int64_t E : {1, 4, 8}) {
      std::mt19937 rng(static_cast<unsigned>(40 + E + fp8));
      MoeProblem p = make_problem(rng, 150, E, 256, 128, std::min<int64_t>(2, E), DType::kBF16);
      // Expert E−1 gets no rows (when E > 1); some slots are −1.
      for (int64_t s = 0; s < p.T * p.k; ++s) {
        int32_t& id = p.topk_ids.ptr<int32_t>()[s];
        if (E > 1 && id == E - 1) id = -1;
        if (s % 7 == 3) id = -1;
      }
      const DeepGemmMoeQuantInfo info = deep_gemm_info(p, fp8);
      DeepGemmPreprocessed pre = moe_ep_deepgemm_preprocess(p.topk_ids, E, p.x, fp8, false);
      std::vector<int32_t> order;
      for (int32_t e = static_cast<int32_t>(E) - 1; e >= 0; --e) order.push_back(e);  // descending
      ContiguousLayout c = to_contiguous(pre, fp8, 256, order, /*gap_before=*/0);
      MoeRunnerConfig config;
      const Tensor masked = deep_gemm_masked_core(config, info, pre.hidden_states,
                                                  pre.hidden_states_scale, pre.masked_m);
      const Tensor contig = deep_gemm_contiguous_core(config, info, c.x, c.scale, c.m_indices);
      ASSERT_EQ(contig.size(0), c.x.size(0));
      const uint16_t* a = contig.ptr<uint16_t>();
      const uint16_t* b = masked.ptr<uint16_t>();
      int64_t rows = 0;
      for (const auto& [e, r0, m] : c.runs) {
        EXPECT_EQ(0, std::memcmp(a + r0 * 256, b + e * pre.m_max * 256, m * 256 * 2))
            << "fp8=" << fp8 << " E=" << E << " expert " << e;
        rows += m;
      }
      if (E > 1) EXPECT_EQ(pre.masked_m.ptr<int32_t>()[E - 1], 0);
      EXPECT_GT(rows, 128);  // some expert spans two blocks or more experts than one block
      for (int64_t r = 0; r < c.x.size(0); ++r)
        if (c.m_indices.ptr<int32_t>()[r] < 0)
          for (int64_t h = 0; h < 256; ++h) ASSERT_EQ(a[r * 256 + h], 0) << "padding row " << r;
    }
  }
}

TEST(DeepGemmTest, ContiguousLayoutRejectsBadMIndices) {
  std::mt19937 rng(9);
  MoeProblem p = make_problem(rng, 20, 2, 256, 128, 1, DType::kBF16);
  const DeepGemmMoeQuantInfo info = deep_gemm_info(p, true);
  DeepGemmPreprocessed pre = moe_ep_deepgemm_preprocess(p.topk_ids, 2, p.x, true, false);
  ASSERT_GE(pre.masked_m.ptr<int32_t>()[0], 3);
  ASSERT_GE(pre.masked_m.ptr<int32_t>()[1], 3);
  const ContiguousLayout c = to_contiguous(pre, true, 256, {0, 1}, -1);
  ASSERT_EQ(c.x.size(0), 256);
  MoeRunnerConfig config;
  auto run_with = [&](const Tensor& ids) {
    return deep_gemm_contiguous_core(config, info, c.x, c.scale, ids);
  };
  EXPECT_NO_THROW(run_with(c.m_indices));
  auto edited = [&](int64_t row, int32_t value) {
    Tensor t = Tensor::copy_of(c.m_indices.view());
    t.ptr<int32_t>()[row] = value;
    return t;
  };
  EXPECT_THROW(run_with(edited(0, 2)), OutOfRange);         // id ≥ E
  EXPECT_THROW(run_with(edited(5, -3)), OutOfRange);        // id < −1
  EXPECT_THROW(run_with(edited(200, 0)), InvalidArgument);  // expert 0 split in two runs
  EXPECT_THROW(run_with(edited(1, -1)), InvalidArgument);   // hole inside expert 0's run
  EXPECT_THROW(run_with(edited(127, 1)), InvalidArgument);  // expert 1 starts mid-block
  Tensor i64 = Tensor::zeros({256}, DType::kI64);
  EXPECT_THROW(run_with(i64), DTypeError);
  TensorView shorter = c.m_indices.view();
  shorter.shape[0] = 255;
  EXPECT_THROW(run_with(Tensor::copy_of(shorter)), InvalidArgument);
  // M not a multiple of 128 (all three shortened together).
  TensorView x200 = c.x.view(), s200 = c.scale.view(), i200 = c.m_indices.view();
  x200.shape[0] = s200.shape[0] = i200.shape[0] = 200;
  EXPECT_THROW(deep_gemm_contiguous_core(config, info, Tensor::copy_of(x200), Tensor::copy_of(s200),
                                         Tensor::copy_of(i200)),
               InvalidArgument);
  EXPECT_THROW(deep_gemm_contiguous_core(config, info, c.x, Tensor(), c.m_indices),
               InvalidArgument);  // FP8 needs the scales
  // Empty contiguous input: [0, H] out, no kernels.
  const Tensor empty = deep_gemm_contiguous_core(
      config, info, Tensor::empty({0, 256}, DType::kF8E4M3), Tensor::empty({0, 2}, DType::kF32),
      Tensor::empty({0}, DType::kI32));
  EXPECT_EQ(empty.size(0), 0);
  EXPECT_EQ(empty.size(1), 256);
}

// ---------------------------------------------------------------------------------------------
// Quant methods through FusedMoE.

FusedMoEOptions layer_options(int64_t inter, int64_t tp = 1, int64_t rank = 0) {
  FusedMoEOptions o;
  o.num_experts = 4;
  o.hidden_size = 128;
  o.intermediate_size = inter;
  o.topk_config.top_k = 2;
  o.tp_size = tp;
  o.tp_rank = rank;
  o.runner_config.inplace = false;
  return o;
}

TEST(Fp8MoEMethodTest, BlockDivisibilityErrorsAreSglangs) {
  Fp8MoEOptions opts;
  opts.weight_scheme = Fp8MoEOptions::WeightScheme::kBlock;
  try {
    FusedMoE layer(layer_options(96), std::make_shared<Fp8MoEMethod>(opts));
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "The output_size of gate's and up's weight = 96 is not divisible by "
                 "weight quantization block_n = 128.");
  }
  opts.block_shape = {64, 128};
  try {
    FusedMoE layer(layer_options(384, 2, 1), std::make_shared<Fp8MoEMethod>(opts));
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "The input_size of down's weight = 192 is not divisible by weight "
                 "quantization block_k = 128.");
  }
}

TEST(Fp8MoEMethodTest, PerTensorProcessingRequantizesToTheMaxScale) {
  auto method = std::make_shared<Fp8MoEMethod>();
  FusedMoE layer(layer_options(32), method);
  std::mt19937 rng(2);
  std::uniform_int_distribution<int> code(0, 0x7d);
  Tensor w13 = layer.parameter("w13_weight");
  for (int64_t i = 0; i < w13.numel(); ++i) w13.ptr<uint8_t>()[i] = static_cast<uint8_t>(code(rng));
  Tensor s13 = layer.parameter("w13_weight_scale");
  for (int64_t e = 0; e < 4; ++e) {
    s13.ptr<float>()[2 * e] = 0.01f * (e + 1);
    s13.ptr<float>()[2 * e + 1] = 0.02f;
  }
  const Tensor before = Tensor::copy_of(w13.view());
  layer.process_weights_after_loading();
  const Tensor& max13 = layer.parameter("w13_weight_scale");
  ASSERT_EQ(max13.ndim(), 1);
  for (int64_t e = 0; e < 4; ++e)
    EXPECT_EQ(max13.ptr<float>()[e], std::max(0.01f * (e + 1), 0.02f));
  // Expert 1: both shards at 0.02 already → requant is the identity; expert 0: w1 rows shrink.
  const Tensor& after = layer.parameter("w13_weight");
  EXPECT_EQ(
      0, std::memcmp(after.ptr<uint8_t>() + 64 * 128, before.ptr<uint8_t>() + 64 * 128, 64 * 128));
  EXPECT_NE(0, std::memcmp(after.ptr<uint8_t>(), before.ptr<uint8_t>(), 32 * 128));
  EXPECT_THROW(layer.process_weights_after_loading(), InvalidArgument);  // once only
  EXPECT_EQ(layer.runner()->runner_backend(), MoeRunnerBackend::TRITON);
}

TEST(ModelOptFp8MoEMethodTest, CutlassPadsHalvesAndPairsShardScales) {
  FusedMoEOptions o = layer_options(40);
  o.runner_backend = MoeRunnerBackend::FLASHINFER_CUTLASS;
  auto method = std::make_shared<ModelOptFp8MoEMethod>();
  FusedMoE layer(o, method);
  EXPECT_TRUE(method->load_up_proj_weight_first());
  Tensor w1 = Tensor::empty({40, 128}, DType::kF8E4M3),
         w3 = Tensor::empty({40, 128}, DType::kF8E4M3);
  std::fill(w1.ptr<uint8_t>(), w1.ptr<uint8_t>() + w1.numel(), f32_to_fp8_e4m3(2.0f));
  std::fill(w3.ptr<uint8_t>(), w3.ptr<uint8_t>() + w3.numel(), f32_to_fp8_e4m3(3.0f));
  Tensor w2 = Tensor::empty({128, 40}, DType::kF8E4M3);
  std::fill(w2.ptr<uint8_t>(), w2.ptr<uint8_t>() + w2.numel(), f32_to_fp8_e4m3(1.0f));
  auto scalar = [](float v) {
    Tensor t = Tensor::empty({1}, DType::kF32);
    t.ptr<float>()[0] = v;
    return t;
  };
  for (int64_t e = 0; e < 4; ++e) {
    layer.weight_loader("w13_weight", w1, "w1", e);
    layer.weight_loader("w13_weight", w3, "w3", e);
    layer.weight_loader("w2_weight", w2, "w2", e);
    layer.weight_loader("w13_weight_scale", scalar(0.5f), "w1", e);   // gate: 2 · 0.5 = 1
    layer.weight_loader("w13_weight_scale", scalar(0.25f), "w3", e);  // up: 3 · 0.25 = 0.75
    layer.weight_loader("w2_weight_scale", scalar(0.125f), "w2", e);
    layer.weight_loader("w13_input_scale", scalar(0.1f), "w1", e);
    layer.weight_loader("w2_input_scale", scalar(0.2f), "w2", e);
  }
  method->process_weights_after_loading(layer);
  const Tensor& w13 = layer.parameter("w13_weight");
  ASSERT_EQ(w13.view().shape_vector(), (std::vector<int64_t>{4, 96, 128}));  // 2 · round_up(40, 16)
  ASSERT_EQ(layer.parameter("w2_weight").view().shape_vector(), (std::vector<int64_t>{4, 128, 48}));
  const float* table = fp8_e4m3_table();
  // Rows [0, 40): up = 3 · 0.25 requantized with the max scale 0.5 → 1.5; [40, 48): zeros;
  // [48, 88): gate = 2 · 0.5 / 0.5 → 2; [88, 96): zeros.
  EXPECT_EQ(table[w13.ptr<uint8_t>()[0]], 1.5f);
  EXPECT_EQ(w13.ptr<uint8_t>()[40 * 128], 0);
  EXPECT_EQ(table[w13.ptr<uint8_t>()[48 * 128]], 2.0f);
  EXPECT_EQ(w13.ptr<uint8_t>()[95 * 128 + 127], 0);
  EXPECT_EQ(layer.parameter("fc1_dequant").ptr<float>()[0], 0.5f * 0.1f);
  EXPECT_EQ(layer.parameter("fc2_quant").ptr<float>()[0], 1.0f / 0.2f);
  EXPECT_EQ(layer.parameter("fc2_dequant").ptr<float>()[0], 0.2f * 0.125f);
  EXPECT_EQ(layer.parameter("fc1_input_dequant").ptr<float>()[0], 0.1f);
}

TEST(Int8MoEMethodTest, ParametersAndTritonPayload) {
  auto method = std::make_shared<W8A8Int8MoEMethod>();
  FusedMoE layer(layer_options(32), method);
  EXPECT_EQ(layer.parameter("w13_weight").dtype(), DType::kI8);
  EXPECT_EQ(layer.parameter("w13_weight_scale").view().shape_vector(),
            (std::vector<int64_t>{4, 64, 1}));
  EXPECT_EQ(layer.parameter("w2_weight_scale").view().shape_vector(),
            (std::vector<int64_t>{4, 128, 1}));
  layer.process_weights_after_loading();
  auto q = std::dynamic_pointer_cast<TritonMoeQuantInfo>(method->quant_info(layer));
  ASSERT_NE(q, nullptr);
  EXPECT_TRUE(q->use_int8_w8a8 && q->per_channel_quant && !q->use_int8_w8a16);
}

}  // namespace
}  // namespace moecore
