// Runner backend "deep_gemm" (sglang moe_runner/deep_gemm.py): DeepGEMM's grouped GEMMs over
// either runner-input layout. Registers: runner core DEEP_GEMM; pre-permute (standard, deep_gemm),
// pre-permute (deepep_ll, deep_gemm), pre-permute (deepep_normal, deep_gemm); post-permute
// (deep_gemm, standard), post-permute (deep_gemm, deepep_ll), post-permute (deep_gemm,
// deepep_normal). No fused func (sglang registers none).
//
// Layouts (DeepGemmRunnerInput.use_masked_gemm):
//   masked (True; the standard pre-permute, deepep_ll): hidden_states [E, m_max, H] + masked_m
//     i32 [E]; expert e's rows are [0, masked_m[e]) of slab e. Output bf16 [E, m_max, H].
//   contiguous (False; the deepep_normal pre-permute, sglang's ep_scatter): hidden_states
//     [M, H] + m_indices i32 [M] (expert of each row, −1 = padding); each expert's rows are one
//     run starting on a 128-row boundary, M % 128 == 0. Output bf16 [M, H].
//   FP8 flows carry f32 per-token-group scales [..., H/128] alongside; the DeepEP pre-permutes
//   unpack DeepEP's int32-packed UE8M0 scales [..., H/512] to f32 exactly (2^(byte − 127)). The
//   DeepEP post-permutes return UNWEIGHTED expert outputs (deepep_ll: the masked output as is;
//   deepep_normal: per slot [N_recv, k, H]); the dispatcher's combine weights and sums. Both layouts
//   reduce to (expert, row run) segments of one flat [rows, H] buffer and share one per-row
//   computation (run_expert_rows), so a row's output is the same bits in either layout; rows
//   outside the segments (masked tail, contiguous padding) are never read and come out zero.
//
// Numeric contract (hidden_states bf16; every stored intermediate is bf16, as DeepGEMM's
// f8f8bf16 / bf16 GEMMs write):
//   pre-permute (moe_ep_deepgemm_preprocess): FP8 flow — each token quantized per 1×128 group,
//     s = max(amax, 1e-10)/448 (UE8M0: s = 2^ceil(log2 max(s, 1e-10))), q = e4m3(x / s); rows
//     gathered to expert e's slot rank (stable order). BF16 flow — rows copied.
//   core, per row r of expert e (r < masked_m[e], or m_indices[r] == e):
//     h1 = bf16(Σ_b (dot_b(q, W13) · s_x[r, b]) · s_w[n/128, b])   (fp32; BF16: bf16(x·W13ᵀ))
//     g = h1[:I] (≤ L, and up ∈ [−L, L] with swiglu_limit), a = bf16(bf16(silu(g)) · up)
//     FP8: a quantized per 1×128 group, s = max(amax, 1e-10)/448 (UE8M0: 2^ceil(log2 s)),
//       q = e4m3(a / s) (_silu_and_mul_post_quant_kernel); y = bf16(Σ_b (dot_b · s_a) · s_w)
//     BF16: y = bf16(a · W2ᵀ), fp32 accumulation.
//   post-permute (post_reorder): out[t] = Σ_j bf16(bf16(w_j) · y[src2dst[t, j]]) over ids ≥ 0
//     in slot order, accumulated in bf16 (rounded after every add), then bf16(out · rsf) if
//     routed_scaling_factor is set. Routed weights and rsf apply there, exactly once.
// DeepGEMM multiplies each 128-K block by s_a·s_w formed first; moecore multiplies dot·s_a then
// ·s_w (quant_gemm.h) — one fp32 rounding apart. Deviation: sglang's contiguous FP8 flow runs
// silu_and_mul (one bf16 rounding of silu(g)·up) then the per-token-group quantizer (its UE8M0
// floor differs from the silu-post rule's); moecore keeps the masked path's rounding points on
// both layouts so the layouts agree bit for bit. Requires silu, gated (R15), no gemm1_alpha, no
// apply_router_weight_on_input, no no_combine; FP8 needs H and I multiples of 128 and 128×128
// block scales. Per row, so batch invariant; deterministic across thread counts and ISA levels
// (FP8: scalar canonical dots; BF16: the GEMM table rows agree bitwise).
#include "moecore/runner/backends/deep_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/core/thread_pool.h"
#include "moecore/formats/e8m0.h"
#include "moecore/formats/fp8.h"
#include "moecore/formats/half.h"
#include "moecore/kernels/convert.h"
#include "moecore/runner/expert_compute.h"
#include "moecore/runner/quant_compute.h"
#include "moecore/runner/registry.h"

namespace moecore {
namespace {

constexpr const char* kApi = "MoeRunner(deep_gemm)";
constexpr int64_t kRowsPerItem = 16;  // rows of one expert per work item

struct DeepGemmRunnerInput : RunnerInput {
  Tensor hidden_states;        // e4m3 or bf16: [E, m_max, H] (masked) or [M, H] (contiguous)
  Tensor hidden_states_scale;  // f32 [..., H/128] per-token-group scales (FP8), or undefined
  bool use_masked_gemm = true;
  Tensor masked_m;  // i32 [E]
  int64_t expected_m = 0;
  Tensor m_indices;  // i32 [M]: contiguous layout (use_masked_gemm=False), hidden_states [M, H]
  MoeRunnerBackend runner_backend() const override { return MoeRunnerBackend::DEEP_GEMM; }
};

struct DeepGemmRunnerOutput : RunnerOutput {
  Tensor hidden_states;  // bf16, the input's layout: [E, m_max, H] (masked) or [M, H]
  MoeRunnerBackend runner_backend() const override { return MoeRunnerBackend::DEEP_GEMM; }
};

/// What the standard pre-permute leaves for the post-permute (sglang's running_state keys
/// topk_ids, topk_weights and src2dst; the shape and dtype follow from them: bf16 [T, H]).
struct DeepGemmState {
  Tensor topk_ids, topk_weights, src2dst;
};

/// A validated DeepGemmMoeQuantInfo.
struct DeepGemmWeights {
  int64_t num_experts = 0, n1 = 0, hidden = 0, inter = 0;
  bool fp8 = true;
  bool ue8m0 = false;
  WeightOperand w13, w2;
};

const DeepGemmMoeQuantInfo& as_deep_gemm_info(const QuantInfoPtr& q) {
  auto* info = dynamic_cast<const DeepGemmMoeQuantInfo*>(q.get());
  MOECORE_CHECK_DTYPE(info != nullptr, kApi, ": expected DeepGemmMoeQuantInfo, got ", q->name());
  return *info;
}

/// R15 and the config rules of the DeepGEMM path (sglang asserts silu and gated in
/// DeepGemmRunnerCore.__init__).
ActivationSpec check_config(const MoeRunnerConfig& config) {
  ActivationSpec spec = activation_spec(config, kApi);  // unknown names: ValueError (R15)
  MOECORE_ASSERT(config.activation == "silu",
                 "DeepGEMM MoE requires activation='silu' "
                 "(DeepGemmRunnerCore asserts it), got activation='",
                 config.activation, "'");
  MOECORE_ASSERT(config.is_gated, "DeepGEMM MoE requires a gated activation (is_gated=True)");
  MOECORE_CHECK(!spec.alpha, kApi,
                ": gemm1_alpha (GPT-OSS clamped SwiGLU) is not supported; "
                "DeepGEMM runs SwiGLU, optionally with swiglu_limit");
  MOECORE_CHECK(!config.apply_router_weight_on_input, kApi,
                ": apply_router_weight_on_input is not supported (the routed weights apply in "
                "the post-permute)");
  MOECORE_CHECK(!config.no_combine, kApi,
                ": no_combine is not supported (post_reorder always "
                "combines)");
  spec.round_before_mul = true;  // bf16(silu(g)) · up, as the masked activation kernels
  spec.round_dtype = DType::kBF16;
  return spec;
}

DeepGemmWeights check_weights(const DeepGemmMoeQuantInfo& q) {
  if (q.is_fp4_experts)
    MOECORE_UNSUPPORTED(kApi,
                        ": is_fp4_experts (DSv4 MXFP4 experts, recipe (1, 32)) is not "
                        "built; supported: FP8 128×128 blocks and BF16");
  const Tensor& w13 = q.w13_weight;
  const Tensor& w2 = q.w2_weight;
  MOECORE_CHECK(w13.defined() && w2.defined(), kApi, ": w13_weight and w2_weight are required");
  const DType want = q.use_fp8 ? DType::kF8E4M3 : DType::kBF16;
  MOECORE_CHECK_DTYPE(w13.dtype() == want && w2.dtype() == want, kApi,
                      ": use_fp8=", q.use_fp8 ? "True" : "False", " expects ", dtype_name(want),
                      " weights, got ", w13.describe(), " and ", w2.describe());
  MOECORE_CHECK(
      w13.ndim() == 3 && w2.ndim() == 3 && w13.view().is_contiguous() && w2.view().is_contiguous(),
      kApi, ": expected contiguous w13_weight [E, 2I, H] and w2_weight [E, H, I], got ",
      w13.describe(), " and ", w2.describe());
  DeepGemmWeights w;
  w.num_experts = w13.size(0);
  w.n1 = w13.size(1);
  w.hidden = w13.size(2);
  w.inter = w2.size(2);
  w.fp8 = q.use_fp8;
  w.ue8m0 = q.scale_ue8m0;
  MOECORE_CHECK(w2.size(0) == w.num_experts && w2.size(1) == w.hidden && w.n1 == 2 * w.inter &&
                    w.num_experts > 0 && w.hidden > 0 && w.inter > 0,
                kApi, ": expected w13_weight [E, 2I, H] and w2_weight [E, H, I] (gated), got ",
                w13.describe(), " and ", w2.describe());
  auto op = [&](const Tensor& t, int64_t n, int64_t k) {
    WeightOperand o;
    o.coding = q.use_fp8 ? WeightCoding::kFp8 : WeightCoding::kDense;
    o.data = t.view();
    o.num_experts = w.num_experts;
    o.n = n;
    o.k = k;
    return o;
  };
  w.w13 = op(w13, w.n1, w.hidden);
  w.w2 = op(w2, w.hidden, w.inter);
  if (!q.use_fp8) {
    MOECORE_CHECK(!q.w13_scale.defined() && !q.w2_scale.defined(), kApi,
                  ": use_fp8=False (BF16 DeepGEMM) takes no w13_scale/w2_scale");
    MOECORE_CHECK(!q.scale_ue8m0, kApi, ": scale_ue8m0 applies to the FP8 flow only");
    return w;
  }
  MOECORE_CHECK(q.block_shape.empty() ||
                    q.block_shape == std::vector<int64_t>({kDeepGemmBlock, kDeepGemmBlock}),
                kApi, ": expected block_shape [128, 128] (DeepGEMM's FP8 recipe), got ",
                shape_string(q.block_shape));
  MOECORE_CHECK(w.hidden % kDeepGemmBlock == 0 && w.inter % kDeepGemmBlock == 0, kApi,
                ": FP8 DeepGEMM quantizes activations per 1×128 group; expected H and I "
                "multiples of 128, got H=",
                w.hidden, ", I=", w.inter);
  auto scale = [&](const char* name, const Tensor& s, int64_t n, int64_t k) {
    const std::vector<int64_t> shape = {w.num_experts, (n + kDeepGemmBlock - 1) / kDeepGemmBlock,
                                        (k + kDeepGemmBlock - 1) / kDeepGemmBlock};
    MOECORE_CHECK(s.defined() && s.view().shape_vector() == shape, kApi, ": expected ", name, " ",
                  shape_string(shape), " (128×128 block scales), got ", s.describe());
    check_scale_values(kApi, name, s.view(), /*allow_zero=*/!q.scale_ue8m0);
    if (q.scale_ue8m0) {
      const Tensor c = s.view().is_contiguous() ? s : Tensor::copy_of(s.view());
      for (int64_t i = 0; i < c.numel(); ++i) {
        uint8_t code;
        MOECORE_CHECK(e8m0_from_pow2(c.ptr<float>()[i], &code), kApi, ": scale_ue8m0=True needs ",
                      name,
                      " to hold powers of two (requantize the weights with UE8M0 scales), "
                      "got ",
                      c.ptr<float>()[i], " at flat index ", i);
      }
    }
    return s.view();
  };
  w.w13.scale = scale("w13_scale", q.w13_scale, w.n1, w.hidden);
  w.w2.scale = scale("w2_scale", q.w2_scale, w.hidden, w.inter);
  w.w13.block_n = w.w2.block_n = kDeepGemmBlock;
  w.w13.block_k = w.w2.block_k = kDeepGemmBlock;
  return w;
}

const StandardDispatchOutput& as_standard(const DispatchOutputPtr& d) {
  auto* out = dynamic_cast<const StandardDispatchOutput*>(d.get());
  MOECORE_CHECK_DTYPE(out != nullptr, kApi, ": expected a StandardDispatchOutput");
  return *out;
}

RunnerInputPtr pre_permute_standard_to_deep_gemm(const DispatchOutputPtr& dispatch,
                                                 const QuantInfoPtr& quant_info,
                                                 const MoeRunnerConfig& config,
                                                 RunningState& state) {
  check_config(config);
  const StandardDispatchOutput& d = as_standard(dispatch);
  const DeepGemmMoeQuantInfo& info = as_deep_gemm_info(quant_info);
  const DeepGemmWeights w = check_weights(info);
  MOECORE_CHECK(d.hidden_states.defined(), kApi, ": hidden_states is required");
  MOECORE_CHECK(d.hidden_states.ndim() == 2 && d.hidden_states.size(1) == w.hidden, kApi,
                ": expected hidden_states [T, ", w.hidden, "], got ", d.hidden_states.describe());
  StandardTopKOutput topk = to_standard(d.topk_output);
  ExpertWeights shape;
  shape.num_experts = w.num_experts;
  shape.hidden = w.hidden;
  shape.dtype = DType::kBF16;
  check_routed_tokens(kApi, d.hidden_states, topk, shape);  // x bf16, ids, weights
  DeepGemmPreprocessed pre =
      moe_ep_deepgemm_preprocess(topk.topk_ids, w.num_experts, d.hidden_states, w.fp8, w.ue8m0);
  auto input = std::make_shared<DeepGemmRunnerInput>();
  input->hidden_states = pre.hidden_states;
  input->hidden_states_scale = pre.hidden_states_scale;
  input->use_masked_gemm = true;
  input->masked_m = pre.masked_m;
  input->expected_m = pre.expected_m;
  auto st = std::make_shared<DeepGemmState>();
  st->topk_ids = topk.topk_ids;
  st->topk_weights = topk.topk_weights;
  st->src2dst = pre.src2dst;
  state.backend = st;
  return input;
}

/// One expert's rows of the flat [rows, H] input: rows [row, row + rows) all belong to `expert`.
struct ExpertRows {
  int64_t expert, row, rows;
};

/// What both layouts hand to the shared per-row MLP: flat row-major views of the input codes
/// (e4m3 or bf16), their f32 per-token-group scales (FP8) and the output rows.
struct FlatRows {
  const void* x = nullptr;
  const float* scale = nullptr;
  uint16_t* y = nullptr;
};

/// The per-row contract (top of this file), for both layouts: every segment is split into
/// 16-row work items in segment order, run on a static schedule. Rows outside the segments are
/// never read and never written (the caller zero-fills the output).
void run_expert_rows(const ActivationSpec& spec, ScaledGemmFn gemm, const DeepGemmWeights& w,
                     const FlatRows& io, const std::vector<ExpertRows>& segments) {
  const int64_t H = w.hidden, I = w.inter, groups = H / kDeepGemmBlock;
  std::vector<ExpertRows> items;  // (expert, first row, rows ≤ 16)
  for (const ExpertRows& s : segments)
    for (int64_t r = 0; r < s.rows; r += kRowsPerItem)
      items.push_back({s.expert, s.row + r, std::min(kRowsPerItem, s.rows - r)});
  const float* table = fp8_e4m3_table();
  parallel_for(static_cast<int64_t>(items.size()), [&](int64_t begin, int64_t end) {
    std::vector<float> a(kRowsPerItem * H), sa(kRowsPerItem * groups), h1(kRowsPerItem * 2 * I),
        act(kRowsPerItem * I), s2(kRowsPerItem * (I / kDeepGemmBlock)), y(kRowsPerItem * H);
    const ActivationQuantizer quant2 =
        make_act_quantizer(ActQuant::kFp8SiluPostGroup, 0.0f, kDeepGemmBlock, w.ue8m0);
    for (int64_t it = begin; it < end; ++it) {
      const auto [e, r0, m] = items[it];
      ActivationCodes c1;
      c1.codes = a.data();
      c1.ld = H;
      if (w.fp8) {
        const uint8_t* q = static_cast<const uint8_t*>(io.x) + r0 * H;
        for (int64_t i = 0; i < m * H; ++i) a[i] = table[q[i]];
        const float* s = io.scale + r0 * groups;
        std::copy(s, s + m * groups, sa.begin());
        c1.scales = sa.data();
        c1.scales_per_row = groups;
      } else {
        load_f32(static_cast<const uint16_t*>(io.x) + r0 * H, DType::kBF16, m * H, a.data());
      }
      gemm(c1, m, w.w13, e, 0, 2 * I, h1.data(), 2 * I);
      round_in_place(h1.data(), m * 2 * I, DType::kBF16);
      apply_activation(spec, h1.data(), 2 * I, act.data(), I, m, I);
      ActivationCodes c2;
      c2.codes = act.data();
      c2.ld = I;
      if (w.fp8) {
        quant2(act.data(), m, I, I, s2.data());
        c2.scales = s2.data();
        c2.scales_per_row = I / kDeepGemmBlock;
      }
      gemm(c2, m, w.w2, e, 0, H, y.data(), H);
      store_f32(y.data(), m * H, DType::kBF16, io.y + r0 * H);
    }
  });
}

/// hidden_states (`lead` leading dims, then H; contiguous; e4m3 for FP8, bf16 for BF16) and,
/// with FP8, a contiguous f32 hidden_states_scale of the same leading dims, then H/128.
void check_layout_input(const DeepGemmWeights& w, const Tensor& x, const Tensor& s,
                        const std::vector<int64_t>& lead, const char* x_shape) {
  std::vector<int64_t> want = lead;
  want.push_back(w.hidden);
  MOECORE_CHECK(x.defined() && x.view().shape_vector() == want && x.view().is_contiguous(), kApi,
                ": expected contiguous hidden_states ", x_shape, " = ", shape_string(want),
                ", got ", x.describe());
  MOECORE_CHECK_DTYPE(x.dtype() == (w.fp8 ? DType::kF8E4M3 : DType::kBF16), kApi,
                      ": hidden_states must be ", w.fp8 ? "fp8_e4m3 codes" : "bf16",
                      " for use_fp8=", w.fp8 ? "True" : "False", ", got ", x.describe());
  if (!w.fp8) {
    MOECORE_CHECK(!s.defined(), kApi,
                  ": use_fp8=False (BF16 DeepGEMM) takes no hidden_states_scale, got ",
                  s.describe());
    return;
  }
  want.back() = w.hidden / kDeepGemmBlock;
  MOECORE_CHECK(s.defined() && s.dtype() == DType::kF32 && s.view().shape_vector() == want &&
                    s.view().is_contiguous(),
                kApi, ": expected contiguous f32 hidden_states_scale ", shape_string(want),
                " (1×128 group scales), got ", s.describe());
}

FlatRows flat_rows(const Tensor& x, const Tensor& s, const Tensor& out) {
  FlatRows io;
  io.x = x.view().data;
  io.scale = s.defined() ? s.ptr<float>() : nullptr;
  io.y = out.ptr<uint16_t>();
  return io;
}

/// Masked layout: hidden_states [E, m_max, H], masked_m i32 [E]; expert e's rows are
/// e·m_max + [0, masked_m[e]). Output bf16 [E, m_max, H], rows past masked_m[e] zero.
Tensor masked_core(const ActivationSpec& spec, ScaledGemmFn gemm, const DeepGemmWeights& w,
                   const Tensor& x, const Tensor& s, const Tensor& mm) {
  const int64_t E = w.num_experts, H = w.hidden;
  MOECORE_CHECK(x.defined() && x.ndim() == 3, kApi,
                ": expected hidden_states [E, m, H] for the masked layout, got ", x.describe());
  const int64_t m_cap = x.size(1);
  check_layout_input(w, x, s, {E, m_cap}, "[E, m, H]");
  MOECORE_CHECK(mm.defined() && mm.dtype() == DType::kI32 && mm.ndim() == 1 && mm.size(0) == E,
                kApi, ": expected masked_m int32 [", E, "], got ", mm.describe());
  std::vector<ExpertRows> segments;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t m = mm.ptr<int32_t>()[e * mm.view().strides[0]];
    MOECORE_CHECK(m >= 0 && m <= m_cap, kApi, ": masked_m[", e, "] must be in [0, ", m_cap,
                  "], got ", m);
    if (m > 0) segments.push_back({e, e * m_cap, m});
  }
  Tensor out = Tensor::zeros({E, m_cap, H}, DType::kBF16);
  run_expert_rows(spec, gemm, w, flat_rows(x, s, out), segments);
  return out;
}

/// Contiguous layout (sglang's ep_scatter): hidden_states [M, H], m_indices i32 [M]; each
/// maximal run of one expert id is that expert's rows, and −1 marks padding. Validates that
/// every id is in [−1, E), each expert has one run, every run starts on a 128-row boundary and
/// M is a multiple of 128 (DeepGEMM's contiguous-layout alignment), so each 128-row block holds
/// one expert followed by padding. Output bf16 [M, H], padding rows zero.
Tensor contiguous_core(const ActivationSpec& spec, ScaledGemmFn gemm, const DeepGemmWeights& w,
                       const Tensor& x, const Tensor& s, const Tensor& mi) {
  const int64_t E = w.num_experts, H = w.hidden;
  MOECORE_CHECK(x.defined() && x.ndim() == 2, kApi,
                ": expected hidden_states [M, H] for the contiguous layout, got ", x.describe());
  const int64_t M = x.size(0);
  check_layout_input(w, x, s, {M}, "[M, H]");
  MOECORE_CHECK(mi.defined(), kApi,
                ": the contiguous layout (use_masked_gemm=False) needs m_indices");
  MOECORE_CHECK_DTYPE(mi.dtype() == DType::kI32, kApi, ": expected m_indices int32, got ",
                      mi.describe());
  MOECORE_CHECK(mi.ndim() == 1 && mi.size(0) == M, kApi, ": expected m_indices int32 [", M,
                "] (one expert id per hidden_states row), got ", mi.describe());
  MOECORE_CHECK(M % kDeepGemmBlock == 0, kApi,
                ": the contiguous layout pads every expert's rows to a multiple of 128; "
                "expected M a multiple of 128, got M=",
                M);
  std::vector<ExpertRows> segments;
  std::vector<char> seen(static_cast<size_t>(E), 0);
  const int32_t* ids = mi.ptr<int32_t>();
  const int64_t stride = mi.view().strides[0];
  for (int64_t r = 0; r < M;) {
    const int64_t e = ids[r * stride];
    MOECORE_CHECK_INDEX(e >= -1 && e < E, kApi, ": m_indices must be in [-1, ", E, "), got ", e,
                        " at row ", r);
    int64_t end = r + 1;
    while (end < M && ids[end * stride] == e) ++end;
    if (e >= 0) {
      MOECORE_CHECK(!seen[e], kApi, ": m_indices: the rows of expert ", e,
                    " must be contiguous, but it appears again at row ", r);
      MOECORE_CHECK(r % kDeepGemmBlock == 0, kApi, ": m_indices: the rows of expert ", e,
                    " must start on a 128-row boundary (DeepGEMM's contiguous-layout "
                    "alignment), got row ",
                    r);
      seen[e] = 1;
      segments.push_back({e, r, end - r});
    }
    r = end;
  }
  Tensor out = Tensor::zeros({M, H}, DType::kBF16);
  run_expert_rows(spec, gemm, w, flat_rows(x, s, out), segments);
  return out;
}

class DeepGemmRunnerCore : public RunnerCore {
 public:
  explicit DeepGemmRunnerCore(const MoeRunnerConfig& config)
      : RunnerCore(config),
        spec_(check_config(config)),
        gemm_(scaled_gemm_kernel(config.isa_level.value_or(IsaLevel::kScalar))) {}

  MoeRunnerBackend runner_backend() const override { return MoeRunnerBackend::DEEP_GEMM; }

  RunnerOutputPtr run(const RunnerInputPtr& runner_input, const QuantInfoPtr& quant_info,
                      RunningState&) override {
    auto* in = dynamic_cast<const DeepGemmRunnerInput*>(runner_input.get());
    MOECORE_CHECK_DTYPE(in != nullptr, "DeepGemmRunnerCore.run: expected a DeepGemmRunnerInput");
    const DeepGemmWeights w = check_weights(as_deep_gemm_info(quant_info));
    auto out = std::make_shared<DeepGemmRunnerOutput>();
    out->hidden_states =
        in->use_masked_gemm
            ? masked_core(spec_, gemm_, w, in->hidden_states, in->hidden_states_scale, in->masked_m)
            : contiguous_core(spec_, gemm_, w, in->hidden_states, in->hidden_states_scale,
                              in->m_indices);
    return out;
  }

 private:
  ActivationSpec spec_;
  ScaledGemmFn gemm_;
};

CombineInputPtr post_permute_deep_gemm_to_standard(const RunnerOutputPtr& runner_output,
                                                   const QuantInfoPtr&,
                                                   const MoeRunnerConfig& config,
                                                   RunningState& state) {
  auto* out = dynamic_cast<const DeepGemmRunnerOutput*>(runner_output.get());
  MOECORE_CHECK_DTYPE(out != nullptr,
                      "post-permute(deep_gemm→standard): expected a DeepGemmRunnerOutput");
  auto* stashed = std::any_cast<std::shared_ptr<DeepGemmState>>(&state.backend);
  MOECORE_ASSERT(stashed != nullptr,
                 "post-permute(deep_gemm→standard): the running state holds no deep_gemm "
                 "pre-permute result (run the (standard, deep_gemm) pre-permute first)");
  const DeepGemmState& st = **stashed;
  // The output has the hidden_states dtype, which the pre-permute requires to be bf16.
  return std::make_shared<StandardCombineInput>(deepgemm_post_reorder(
      out->hidden_states, st.src2dst, st.topk_ids, st.topk_weights, config.routed_scaling_factor));
}

// ---------------------------------------------------------------------------------------------
// DeepEP permutes. The dispatcher's payload already has the activation quantization (FP8
// per-token-group-128 or BF16); these only change the layout and carry the routing to combine.

/// What a DeepEP pre-permute leaves for its post-permute: the dispatch output's routing and,
/// for deepep_normal, each (token, slot)'s row in the contiguous layout (−1: not local).
struct DeepEPState {
  Tensor topk_ids, topk_weights, src2dst;
};

/// DeepEP's FP8 activation scales → contiguous f32 [lead..., H/128]: f32 scales (any strides;
/// DeepEP's are column-major in the last two dims) are copied; int32-packed UE8M0 scales
/// [lead..., ⌈H/512⌉] (group g in byte g % 4 of word g / 4, little end first) are unpacked to
/// 2^(byte − 127) exactly.
Tensor deepep_scales_f32(const char* api, const Tensor& s, std::vector<int64_t> shape,
                         int64_t hidden) {
  const int64_t groups = hidden / kDeepGemmBlock;
  MOECORE_CHECK(s.defined(), api,
                ": an FP8 payload needs hidden_states_scale (f32 [..., H/128] or int32-packed "
                "UE8M0 [..., H/512])");
  shape.push_back(groups);
  if (s.dtype() == DType::kF32) {
    MOECORE_CHECK(s.view().shape_vector() == shape, api, ": expected f32 hidden_states_scale ",
                  shape_string(shape), ", got ", s.describe());
    return Tensor::copy_of(s.view());
  }
  MOECORE_CHECK_DTYPE(s.dtype() == DType::kI32, api,
                      ": expected hidden_states_scale f32 or int32 (packed UE8M0), got ",
                      s.describe());
  const int64_t words = (groups + 3) / 4;
  std::vector<int64_t> packed = shape;
  packed.back() = words;
  MOECORE_CHECK(s.view().shape_vector() == packed, api,
                ": expected int32-packed UE8M0 hidden_states_scale ", shape_string(packed),
                " (four scale bytes per int32), got ", s.describe());
  return unpack_ue8m0(s.view(), groups);  // 0xFF (NaN) bytes are an error there
}

/// The FP8 scale of a DeepEP payload, or undefined for BF16 (where a scale is an error).
Tensor deepep_payload_scale(const char* api, const DeepGemmWeights& w, const Tensor& scale,
                            std::vector<int64_t> lead) {
  if (w.fp8) return deepep_scales_f32(api, scale, std::move(lead), w.hidden);
  MOECORE_CHECK(!scale.defined(), api,
                ": use_fp8=False (BF16 DeepGEMM) takes a BF16 payload without "
                "hidden_states_scale, got ",
                scale.describe());
  return {};
}

RunnerInputPtr pre_permute_deepep_ll_to_deep_gemm(const DispatchOutputPtr& dispatch,
                                                  const QuantInfoPtr& quant_info,
                                                  const MoeRunnerConfig& config,
                                                  RunningState& state) {
  constexpr const char* api = "pre-permute(deepep_ll→deep_gemm)";
  check_config(config);
  auto* d = dynamic_cast<const DeepEPLLDispatchOutput*>(dispatch.get());
  MOECORE_CHECK_DTYPE(d != nullptr, api, ": expected a DeepEPLLDispatchOutput");
  const DeepGemmWeights w = check_weights(as_deep_gemm_info(quant_info));
  const Tensor& x = d->hidden_states;
  MOECORE_CHECK(x.defined() && x.ndim() == 3 && x.size(0) == w.num_experts, api,
                ": expected hidden_states [E_local=", w.num_experts, ", M_cap, H], got ",
                x.describe());
  auto input = std::make_shared<DeepGemmRunnerInput>();
  input->hidden_states = x;  // the masked layout as DeepEP packed it: pass-through
  input->hidden_states_scale =
      deepep_payload_scale(api, w, d->hidden_states_scale, {x.size(0), x.size(1)});
  input->use_masked_gemm = true;
  input->masked_m = d->masked_m;
  input->expected_m = d->expected_m;
  auto st = std::make_shared<DeepEPState>();
  st->topk_ids = d->topk_ids;
  st->topk_weights = d->topk_weights;
  state.backend = st;
  return input;
}

/// sglang's ep_scatter: the received tokens' local (token, slot) pairs grouped by expert into
/// the contiguous layout, each expert's run starting on a 128-row boundary (DeepGEMM's
/// alignment, whatever alignment the dispatcher used), rows in (token, slot) order; padding
/// rows are zero with m_indices −1. num_recv_tokens_per_expert[e] must cover expert e's pairs.
RunnerInputPtr pre_permute_deepep_normal_to_deep_gemm(const DispatchOutputPtr& dispatch,
                                                      const QuantInfoPtr& quant_info,
                                                      const MoeRunnerConfig& config,
                                                      RunningState& state) {
  constexpr const char* api = "pre-permute(deepep_normal→deep_gemm)";
  check_config(config);
  auto* d = dynamic_cast<const DeepEPNormalDispatchOutput*>(dispatch.get());
  MOECORE_CHECK_DTYPE(d != nullptr, api, ": expected a DeepEPNormalDispatchOutput");
  const DeepGemmWeights w = check_weights(as_deep_gemm_info(quant_info));
  const int64_t E = w.num_experts, H = w.hidden, groups = H / kDeepGemmBlock;
  ExpertWeights shape;
  shape.num_experts = E;
  shape.hidden = H;
  shape.dtype = w.fp8 ? DType::kF8E4M3 : DType::kBF16;
  const RoutedTokens tokens = check_routed_tokens(
      api, d->hidden_states, StandardTopKOutput{d->topk_weights, d->topk_ids, {}}, shape);
  const int64_t N = tokens.num_tokens, k = tokens.top_k;
  const Tensor scale = deepep_payload_scale(api, w, d->hidden_states_scale, {N});
  const std::vector<int64_t>& recv = d->num_recv_tokens_per_expert;
  MOECORE_CHECK(static_cast<int64_t>(recv.size()) == E, api,
                ": expected num_recv_tokens_per_expert with ", E, " entries, got ", recv.size());
  std::vector<int64_t> count(static_cast<size_t>(E), 0);
  for (int64_t s = 0; s < N * k; ++s)
    if (tokens.id(s / k, s % k) >= 0) ++count[tokens.id(s / k, s % k)];
  std::vector<int64_t> start(static_cast<size_t>(E) + 1, 0);
  for (int64_t e = 0; e < E; ++e) {
    MOECORE_CHECK(recv[e] >= count[e], api, ": num_recv_tokens_per_expert[", e, "] = ", recv[e],
                  " is less than the ", count[e], " received (token, slot) pairs of expert ", e);
    start[e + 1] = start[e] + (count[e] + kDeepGemmBlock - 1) / kDeepGemmBlock * kDeepGemmBlock;
  }
  const int64_t M = start[E];
  auto input = std::make_shared<DeepGemmRunnerInput>();
  input->use_masked_gemm = false;
  input->hidden_states = Tensor::zeros({M, H}, shape.dtype);
  if (w.fp8) input->hidden_states_scale = Tensor::zeros({M, groups}, DType::kF32);
  input->m_indices = Tensor::empty({M}, DType::kI32);
  int32_t* m_indices = input->m_indices.ptr<int32_t>();
  std::fill(m_indices, m_indices + M, -1);
  auto st = std::make_shared<DeepEPState>();
  st->topk_ids = d->topk_ids;
  st->topk_weights = d->topk_weights;
  st->src2dst = Tensor::empty({N * k}, DType::kI32);
  int32_t* src2dst = st->src2dst.ptr<int32_t>();
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  const int64_t row_bytes = H * dtype_size(shape.dtype);
  for (int64_t s = 0; s < N * k; ++s) {
    const int32_t e = tokens.id(s / k, s % k);
    if (e < 0) {
      src2dst[s] = -1;
      continue;
    }
    const int64_t row = next[e]++;
    src2dst[s] = static_cast<int32_t>(row);
    m_indices[row] = e;
    std::memcpy(static_cast<char*>(input->hidden_states.view().data) + row * row_bytes,
                tokens.x.at({s / k, 0}), static_cast<size_t>(row_bytes));
    if (w.fp8)
      std::copy_n(scale.ptr<float>() + (s / k) * groups, groups,
                  input->hidden_states_scale.ptr<float>() + row * groups);
  }
  state.backend = st;
  return input;
}

const DeepEPState& deepep_state(const RunningState& state, const char* api) {
  auto* stashed = std::any_cast<std::shared_ptr<DeepEPState>>(&state.backend);
  MOECORE_ASSERT(stashed != nullptr, api,
                 ": the running state holds no DeepEP pre-permute result (run the matching "
                 "pre-permute first)");
  return **stashed;
}

const DeepGemmRunnerOutput& as_output(const RunnerOutputPtr& o, const char* api) {
  auto* out = dynamic_cast<const DeepGemmRunnerOutput*>(o.get());
  MOECORE_CHECK_DTYPE(out != nullptr, api, ": expected a DeepGemmRunnerOutput");
  return *out;
}

CombineInputPtr post_permute_deep_gemm_to_deepep_ll(const RunnerOutputPtr& runner_output,
                                                    const QuantInfoPtr&, const MoeRunnerConfig&,
                                                    RunningState& state) {
  constexpr const char* api = "post-permute(deep_gemm→deepep_ll)";
  const DeepGemmRunnerOutput& out = as_output(runner_output, api);
  const DeepEPState& st = deepep_state(state, api);
  auto combine = std::make_shared<DeepEPLLCombineInput>();
  combine->hidden_states = out.hidden_states;  // [E_local, M_cap, H], unweighted
  combine->topk_ids = st.topk_ids;
  combine->topk_weights = st.topk_weights;
  return combine;
}

/// The contiguous output's rows gathered back per (token, slot): [N_recv, k, H] bf16,
/// unweighted, zero where the slot's expert is not local.
CombineInputPtr post_permute_deep_gemm_to_deepep_normal(const RunnerOutputPtr& runner_output,
                                                        const QuantInfoPtr&,
                                                        const MoeRunnerConfig&,
                                                        RunningState& state) {
  constexpr const char* api = "post-permute(deep_gemm→deepep_normal)";
  const DeepGemmRunnerOutput& out = as_output(runner_output, api);
  const DeepEPState& st = deepep_state(state, api);
  const int64_t N = st.topk_ids.size(0), k = st.topk_ids.size(1), H = out.hidden_states.size(1);
  Tensor slots = Tensor::zeros({N, k, H}, DType::kBF16);
  const int32_t* src2dst = st.src2dst.ptr<int32_t>();
  const uint16_t* rows = out.hidden_states.ptr<uint16_t>();
  uint16_t* dst = slots.ptr<uint16_t>();
  for (int64_t s = 0; s < N * k; ++s)
    if (src2dst[s] >= 0) std::copy_n(rows + src2dst[s] * H, H, dst + s * H);
  auto combine = std::make_shared<DeepEPNormalCombineInput>();
  combine->hidden_states = slots;
  combine->topk_ids = st.topk_ids;
  combine->topk_weights = st.topk_weights;
  return combine;
}

std::unique_ptr<RunnerCore> make_deep_gemm_core(const MoeRunnerConfig& config) {
  return std::make_unique<DeepGemmRunnerCore>(config);
}

}  // namespace

Tensor deep_gemm_masked_core(const MoeRunnerConfig& config, const DeepGemmMoeQuantInfo& info,
                             const Tensor& hidden_states, const Tensor& hidden_states_scale,
                             const Tensor& masked_m) {
  const ActivationSpec spec = check_config(config);
  const DeepGemmWeights w = check_weights(info);
  return masked_core(spec, scaled_gemm_kernel(config.isa_level.value_or(IsaLevel::kScalar)),
                     w, hidden_states, hidden_states_scale, masked_m);
}

Tensor deep_gemm_contiguous_core(const MoeRunnerConfig& config, const DeepGemmMoeQuantInfo& info,
                                 const Tensor& hidden_states, const Tensor& hidden_states_scale,
                                 const Tensor& m_indices) {
  const ActivationSpec spec = check_config(config);
  const DeepGemmWeights w = check_weights(info);
  return contiguous_core(spec,
                         scaled_gemm_kernel(config.isa_level.value_or(IsaLevel::kScalar)),
                         w, hidden_states, hidden_states_scale, m_indices);
}

DeepGemmPreprocessed moe_ep_deepgemm_preprocess(const Tensor& topk_ids, int64_t num_local_experts,
                                                const Tensor& hidden_states, bool use_fp8,
                                                bool scale_ue8m0) {
  const char* api = "moe_ep_deepgemm_preprocess";
  MOECORE_CHECK(num_local_experts > 0, api, ": expected num_local_experts > 0, got ",
                num_local_experts);
  MOECORE_CHECK(hidden_states.defined(), api, ": hidden_states is required");
  MOECORE_CHECK_DTYPE(hidden_states.dtype() == DType::kBF16, api,
                      ": DeepGEMM takes bf16 hidden_states, got ", hidden_states.describe());
  MOECORE_CHECK(hidden_states.ndim() == 2 && hidden_states.view().rows_contiguous(), api,
                ": expected hidden_states [T, H] with contiguous rows, got ",
                hidden_states.describe());
  const int64_t T = hidden_states.size(0), H = hidden_states.size(1);
  MOECORE_CHECK(H > 0, api, ": expected H > 0");
  if (use_fp8)
    MOECORE_CHECK(H % kDeepGemmBlock == 0, api,
                  ": FP8 quantizes per 1×128 group; expected H a "
                  "multiple of 128, got ",
                  H);
  MOECORE_CHECK(!scale_ue8m0 || use_fp8, api, ": scale_ue8m0 applies to the FP8 flow only");
  ExpertWeights shape;
  shape.num_experts = num_local_experts;
  shape.hidden = H;
  shape.dtype = DType::kBF16;
  Tensor weights = Tensor::zeros(
      topk_ids.defined() ? topk_ids.view().shape_vector() : std::vector<int64_t>{T, 1},
      DType::kF32);
  const RoutedTokens tokens =
      check_routed_tokens(api, hidden_states, StandardTopKOutput{weights, topk_ids, {}}, shape);
  const int64_t k = tokens.top_k, E = num_local_experts;
  DeepGemmPreprocessed out;
  out.m_max = (T / 256 + 1) * 256;
  out.expected_m = T * k == 0 ? 0 : (T * k - 1) / E + 1;
  out.masked_m = Tensor::zeros({E}, DType::kI32);
  out.src2dst = Tensor::empty({T * k}, DType::kI32);
  int32_t* masked = out.masked_m.ptr<int32_t>();
  int32_t* src2dst = out.src2dst.ptr<int32_t>();
  // Stable sort by expert = each (t, j) gets its rank among earlier slots of the same expert.
  for (int64_t s = 0; s < T * k; ++s) {
    const int32_t e = tokens.id(s / k, s % k);
    if (e < 0) {
      src2dst[s] = -1;
      continue;
    }
    MOECORE_CHECK(masked[e] < out.m_max, api, ": expert ", e,
                  " receives more than m_max=", out.m_max,
                  " rows (duplicate expert ids within tokens)");
    src2dst[s] = static_cast<int32_t>(e * out.m_max + masked[e]++);
  }
  out.hidden_states = Tensor::zeros({E, out.m_max, H}, use_fp8 ? DType::kF8E4M3 : DType::kBF16);
  const int64_t groups = H / kDeepGemmBlock;
  if (use_fp8) out.hidden_states_scale = Tensor::zeros({E, out.m_max, groups}, DType::kF32);
  parallel_for(T, [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(H)), s(static_cast<size_t>(groups));
    std::vector<uint8_t> q(static_cast<size_t>(H));
    for (int64_t t = begin; t < end; ++t) {
      const void* src = hidden_states.view().at({t, 0});
      if (use_fp8) {
        load_f32(src, DType::kBF16, H, row.data());
        for (int64_t g = 0; g < groups; ++g)
          s[g] = fp8_quant_group(row.data() + g * kDeepGemmBlock, kDeepGemmBlock, scale_ue8m0,
                                 ActQuant::kFp8PerTokenGroup, q.data() + g * kDeepGemmBlock);
      }
      for (int64_t j = 0; j < k; ++j) {
        const int32_t dst = src2dst[t * k + j];
        if (dst < 0) continue;
        if (use_fp8) {
          std::copy(q.begin(), q.end(), out.hidden_states.ptr<uint8_t>() + dst * H);
          std::copy(s.begin(), s.end(), out.hidden_states_scale.ptr<float>() + dst * groups);
        } else {
          std::memcpy(out.hidden_states.ptr<uint16_t>() + dst * H, src, static_cast<size_t>(H) * 2);
        }
      }
    }
  });
  return out;
}

Tensor deepgemm_post_reorder(const Tensor& down_output, const Tensor& src2dst,
                             const Tensor& topk_ids, const Tensor& topk_weights,
                             std::optional<float> routed_scaling_factor) {
  const char* api = "post_reorder";
  MOECORE_CHECK(down_output.defined() && down_output.dtype() == DType::kBF16 &&
                    down_output.ndim() == 3 && down_output.view().is_contiguous(),
                api, ": expected contiguous bf16 down_output [E, m_max, H], got ",
                down_output.describe());
  const int64_t rows = down_output.size(0) * down_output.size(1), H = down_output.size(2);
  MOECORE_CHECK(topk_ids.defined() && topk_ids.ndim() == 2, api, ": expected topk_ids [T, k]");
  const int64_t T = topk_ids.size(0), k = topk_ids.size(1);
  MOECORE_CHECK(src2dst.defined() && src2dst.dtype() == DType::kI32 && src2dst.numel() == T * k &&
                    src2dst.view().is_contiguous(),
                api, ": expected contiguous src2dst int32 [", T * k, "], got ", src2dst.describe());
  if (routed_scaling_factor)
    MOECORE_CHECK(std::isfinite(*routed_scaling_factor), api,
                  ": expected a finite routed_scaling_factor");
  ExpertWeights shape;
  shape.num_experts = down_output.size(0);
  shape.hidden = H;
  shape.dtype = DType::kBF16;
  Tensor dummy_x = Tensor(make_view(nullptr, DType::kBF16, {T, H}), nullptr);
  const RoutedTokens tokens =
      check_routed_tokens(api, dummy_x, StandardTopKOutput{topk_weights, topk_ids, {}}, shape);
  const int32_t* dst = src2dst.ptr<int32_t>();
  for (int64_t s = 0; s < T * k; ++s)
    if (tokens.id(s / k, s % k) >= 0)
      MOECORE_CHECK_INDEX(dst[s] >= 0 && dst[s] < rows, api, ": src2dst[", s, "] = ", dst[s],
                          " is outside down_output's ", rows, " rows");
  Tensor out = Tensor::empty({T, H}, DType::kBF16);
  const uint16_t* down = down_output.ptr<uint16_t>();
  uint16_t* o = out.ptr<uint16_t>();
  parallel_for(T, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(static_cast<size_t>(H));
    for (int64_t t = begin; t < end; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < k; ++j) {
        if (tokens.id(t, j) < 0) continue;
        const float w = round_to(DType::kBF16, tokens.weight(t, j));
        const uint16_t* row = down + static_cast<int64_t>(dst[t * k + j]) * H;
        for (int64_t h = 0; h < H; ++h) {
          const float p = round_to(DType::kBF16, bf16_to_f32(row[h]) * w);
          acc[h] = round_to(DType::kBF16, acc[h] + p);
        }
      }
      if (routed_scaling_factor)
        for (float& v : acc) v = round_to(DType::kBF16, v * *routed_scaling_factor);
      store_f32(acc.data(), H, DType::kBF16, o + t * H);
    }
  });
  return out;
}

MOECORE_REGISTER_RUNNER_CORE(DEEP_GEMM, make_deep_gemm_core);
MOECORE_REGISTER_PRE_PERMUTE(STANDARD, DEEP_GEMM, pre_permute_standard_to_deep_gemm);
MOECORE_REGISTER_POST_PERMUTE(DEEP_GEMM, STANDARD, post_permute_deep_gemm_to_standard);
MOECORE_REGISTER_PRE_PERMUTE(DEEPEP_LL, DEEP_GEMM, pre_permute_deepep_ll_to_deep_gemm);
MOECORE_REGISTER_POST_PERMUTE(DEEP_GEMM, DEEPEP_LL, post_permute_deep_gemm_to_deepep_ll);
MOECORE_REGISTER_PRE_PERMUTE(DEEPEP_NORMAL, DEEP_GEMM, pre_permute_deepep_normal_to_deep_gemm);
MOECORE_REGISTER_POST_PERMUTE(DEEP_GEMM, DEEPEP_NORMAL, post_permute_deep_gemm_to_deepep_normal);

}  // namespace moecore
