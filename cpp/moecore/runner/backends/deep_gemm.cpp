// Runner backend "deep_gemm" (sglang moe_runner/deep_gemm.py): DeepGEMM's grouped GEMMs over
// either runner-input layout. Registers: runner core DEEP_GEMM; pre-permute (standard, deep_gemm),
// pre-permute (deepep_ll, deep_gemm), pre-permute (deepep_normal, deep_gemm); post-permute
// (deep_gemm, standard), post-permute (deep_gemm, deepep_ll), post-permute (deep_gemm,
// deepep_normal); prepared runs (standard, deep_gemm), (deepep_ll, deep_gemm) and (deepep_normal,
// deep_gemm), which run the same helpers over buffers allocated at prepare and allocate nothing
// per run. No fused func (sglang registers none).
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
//   deepep_normal: per slot [N_recv, k, H]); the dispatcher's combine weights and sums. Both
//   layouts reduce to (expert, row run) segments of one flat [rows, H] buffer and share one per-row
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
#include <limits>
#include <optional>
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
  attach_weight_tiles(q.weight_tiles.get(), w.w13);
  attach_weight_tiles(q.weight_tiles.get(), w.w2);
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

/// One expert's rows of a flat [rows, H] input: rows [row, row + rows) all belong to `expert`.
struct ExpertRows {
  int64_t expert, row, rows;
};

/// What every layout hands to the shared per-row MLP: flat row-major views of the input codes
/// (e4m3 or bf16), their f32 per-token-group scales (FP8) and the output rows.
struct FlatRows {
  const void* x = nullptr;
  const float* scale = nullptr;
  uint16_t* y = nullptr;
};

FlatRows flat_rows(const Tensor& x, const Tensor& s, const Tensor& out) {
  FlatRows io;
  io.x = x.view().data;
  io.scale = s.defined() ? s.ptr<float>() : nullptr;
  io.y = out.ptr<uint16_t>();
  return io;
}

/// What the core computes with: the activation (check_config), the kernel row (picked once, from
/// config.isa_level) and the validated weights.
struct DeepGemmMlp {
  ActivationSpec spec;
  ScaledGemmFn gemm = nullptr;
  DeepGemmWeights w;
};

DeepGemmMlp make_mlp(const MoeRunnerConfig& config, const DeepGemmMoeQuantInfo& info) {
  DeepGemmMlp mlp;
  mlp.spec = check_config(config);
  mlp.gemm = config.gemm_kernel();
  mlp.w = check_weights(info);
  return mlp;
}

int64_t div_up(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename T>
void grow(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

}  // namespace

/// The working memory of the deep_gemm loops, one set per schedule part: part p of a
/// for_each_part loop uses parts[p] whichever thread runs it, so a workspace sized once (a
/// prepared run's, at prepare) serves every later call without allocating. Eager calls size a
/// fresh one. One call at a time.
struct DeepGemmWorkspace {
  /// One part's buffers: one ≤ 16-row item of the expert MLP, or one token of the token loops
  /// (x: the token's f32 values, x_scales and codes: its quantization; y: post_reorder's sums).
  struct Part {
    std::vector<float> x, x_scales, h1, act, act_scales, y;
    std::vector<uint8_t> codes;  // one row's e4m3 codes (a token, or an activation row)
    GemmScratch gemm;            // the kernel row's working memory
  };
  std::vector<Part> parts;
  std::vector<ExpertRows> segments;  // run_expert_rows' input: the expert row runs of one call
  std::vector<ExpertRows> items;     // the segments cut into ≤ 16-row work items

  /// num_parts sets; any count gives the same bits (the default spreads over the pool's threads).
  explicit DeepGemmWorkspace(int64_t num_parts = ThreadPool::instance().num_threads())
      : parts(static_cast<size_t>(num_parts)) {}

  /// Room for the token loops over rows of `hidden` values.
  void reserve_tokens(int64_t hidden) {
    for (Part& p : parts) {
      grow(p.x, hidden);
      grow(p.x_scales, div_up(hidden, kDeepGemmBlock));
      grow(p.codes, hidden);
      grow(p.y, hidden);
    }
  }

  /// Room for run_expert_rows of `mlp` over up to max_rows rows in up to max_segments segments.
  void reserve_expert_rows(const DeepGemmMlp& mlp, int64_t max_rows, int64_t max_segments) {
    const int64_t H = mlp.w.hidden, I = mlp.w.inter;
    const size_t gemm_bytes =
        std::max(gemm_scratch_bytes(mlp.gemm, mlp.w.w13), gemm_scratch_bytes(mlp.gemm, mlp.w.w2));
    reserve_tokens(H);
    for (Part& p : parts) {
      grow(p.x, kRowsPerItem * H);
      grow(p.x_scales, kRowsPerItem * div_up(H, kDeepGemmBlock));
      grow(p.h1, kRowsPerItem * 2 * I);
      grow(p.act, kRowsPerItem * I);
      grow(p.act_scales, kRowsPerItem * div_up(I, kDeepGemmBlock));
      grow(p.y, kRowsPerItem * H);
      grow(p.codes, std::max(H, I));
      p.gemm.grow(gemm_bytes);
    }
    segments.reserve(static_cast<size_t>(max_segments));
    // Σ_e ⌈m_e/16⌉ ≤ Σ_e m_e / 16 + (number of segments).
    items.reserve(static_cast<size_t>(max_rows / kRowsPerItem + max_segments));
  }
};

namespace {

/// fn(part, begin, end) over `parts` near-equal contiguous chunks of [0, n) (empty ones are
/// skipped), the parts spread over the thread pool.
template <typename F>
void for_each_part(int64_t n, size_t parts, const F& fn) {
  if (n <= 0) return;
  const int64_t count = static_cast<int64_t>(parts);
  auto run_parts = [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      const int64_t per = n / count, extra = n % count;
      const int64_t begin = p * per + std::min(p, extra);
      const int64_t end = begin + per + (p < extra ? 1 : 0);
      if (begin < end) fn(p, begin, end);
    }
  };
  parallel_for(count, run_parts);
}

/// The per-row contract (top of this file) over ws.segments: each segment is cut into 16-row
/// work items from its first row, spread over ws's parts. An expert's rows therefore make the
/// same kernel calls wherever its segment lies, so every layout gives the same bits (and a row's
/// result is batch invariant anyway). Rows outside the segments are never read or written.
void run_expert_rows(const DeepGemmMlp& mlp, const FlatRows& io, DeepGemmWorkspace& ws) {
  const DeepGemmWeights& w = mlp.w;
  const int64_t H = w.hidden, I = w.inter, groups = H / kDeepGemmBlock;
  const int64_t act_groups = I / kDeepGemmBlock;
  ws.items.clear();
  for (const ExpertRows& s : ws.segments)
    for (int64_t r = 0; r < s.rows; r += kRowsPerItem)
      ws.items.push_back({s.expert, s.row + r, std::min(kRowsPerItem, s.rows - r)});
  const float* table = fp8_e4m3_table();
  const ActivationFn activate = activation_kernel(scaled_gemm_kernel_level(mlp.gemm));
  auto run_items = [&](int64_t part, int64_t begin, int64_t end) {
    DeepGemmWorkspace::Part& b = ws.parts[static_cast<size_t>(part)];
    for (int64_t it = begin; it < end; ++it) {
      const auto [e, r0, m] = ws.items[static_cast<size_t>(it)];
      ActivationCodes c1;  // fp8 code values or bf16 activations: bf16-exact
      c1.codes = b.x.data();
      c1.ld = H;
      c1.bf16_exact = true;
      c1.scratch = &b.gemm;
      if (w.fp8) {
        const uint8_t* q = static_cast<const uint8_t*>(io.x) + r0 * H;
        for (int64_t i = 0; i < m * H; ++i) b.x[i] = table[q[i]];
        std::copy_n(io.scale + r0 * groups, m * groups, b.x_scales.data());
        c1.scales = b.x_scales.data();
        c1.scales_per_row = groups;
      } else {
        load_f32(static_cast<const uint16_t*>(io.x) + r0 * H, DType::kBF16, m * H, b.x.data());
      }
      mlp.gemm(c1, m, w.w13, e, 0, 2 * I, b.h1.data(), 2 * I);
      round_in_place(b.h1.data(), m * 2 * I, DType::kBF16);
      activate(mlp.spec, b.h1.data(), 2 * I, b.act.data(), I, m, I, 0, I);
      ActivationCodes c2;  // fp8 code values or the bf16-rounded activation: bf16-exact
      c2.codes = b.act.data();
      c2.ld = I;
      c2.bf16_exact = true;
      c2.scratch = &b.gemm;
      if (w.fp8) {
        // _silu_and_mul_post_quant_kernel: each 1×128 group to e4m3, kept as the codes' values.
        for (int64_t r = 0; r < m; ++r) {
          float* row = b.act.data() + r * I;
          for (int64_t g = 0; g < act_groups; ++g)
            b.act_scales[r * act_groups + g] =
                fp8_quant_group(row + g * kDeepGemmBlock, kDeepGemmBlock, w.ue8m0,
                                ActQuant::kFp8SiluPostGroup, b.codes.data() + g * kDeepGemmBlock);
          for (int64_t i = 0; i < I; ++i) row[i] = table[b.codes[i]];
        }
        c2.scales = b.act_scales.data();
        c2.scales_per_row = act_groups;
      }
      mlp.gemm(c2, m, w.w2, e, 0, H, b.y.data(), H);
      store_f32(b.y.data(), m * H, DType::kBF16, io.y + r0 * H);
    }
  };
  for_each_part(static_cast<int64_t>(ws.items.size()), ws.parts.size(), run_items);
}

/// Marks "no slab limits an expert's rows" for count_expert_slots.
constexpr int64_t kNoRowLimit = std::numeric_limits<int64_t>::max();

/// counts[e] = the valid slots of expert e. m_max is the masked layout's slab height:
/// moe_ep_deepgemm_preprocess rejects an expert with more rows, checked in slot order.
void count_expert_slots(const RoutedTokens& tokens, int64_t num_experts, int64_t m_max,
                        int64_t* counts) {
  std::fill(counts, counts + num_experts, 0);
  const int64_t k = tokens.top_k;
  for (int64_t s = 0; s < tokens.num_tokens * k; ++s) {
    const int32_t e = tokens.id(s / k, s % k);
    if (e < 0) continue;
    MOECORE_CHECK(counts[e] < m_max, "moe_ep_deepgemm_preprocess: expert ", e,
                  " receives more than m_max=", m_max,
                  " rows (duplicate expert ids within tokens)");
    ++counts[e];
  }
}

/// The stable sort by expert: src2dst[s] = first_row[e] + the rank of slot s among expert e's
/// slots in slot order, −1 for ids −1. cursor: num_experts entries of scratch.
void assign_slot_rows(const RoutedTokens& tokens, int64_t num_experts, const int64_t* first_row,
                      int64_t* cursor, int32_t* src2dst) {
  std::copy_n(first_row, num_experts, cursor);
  const int64_t k = tokens.top_k;
  for (int64_t s = 0; s < tokens.num_tokens * k; ++s) {
    const int32_t e = tokens.id(s / k, s % k);
    src2dst[s] = e < 0 ? -1 : static_cast<int32_t>(cursor[e]++);
  }
}

/// A prepared run's compact layout: the experts' rows back to back (first_row[e] =
/// Σ_{e' < e} counts[e']), one segment per expert that has rows.
void pack_expert_rows(const int64_t* counts, int64_t num_experts, int64_t* first_row,
                      std::vector<ExpertRows>& segments) {
  segments.clear();
  int64_t row = 0;
  for (int64_t e = 0; e < num_experts; ++e) {
    first_row[e] = row;
    if (counts[e] > 0) segments.push_back({e, row, counts[e]});
    row += counts[e];
  }
}

/// moe_ep_deepgemm_preprocess's gather: token t's bf16 row (FP8: quantized once per 1×128 group,
/// sglang_per_token_group_quant_fp8) goes to row src2dst[t·k + j] of `rows` ([*, H] e4m3 codes
/// or bf16) for each valid slot j, and its group scales to the same row of `scales` ([*, H/128]
/// f32; FP8 only). x: bf16 [T, H] with contiguous rows.
void gather_token_rows(const TensorView& x, int64_t k, const int32_t* src2dst, bool fp8, bool ue8m0,
                       void* rows, float* scales, DeepGemmWorkspace& ws) {
  const int64_t H = x.shape[1], groups = H / kDeepGemmBlock;
  auto gather = [&](int64_t part, int64_t begin, int64_t end) {
    DeepGemmWorkspace::Part& b = ws.parts[static_cast<size_t>(part)];
    for (int64_t t = begin; t < end; ++t) {
      const void* src = x.at({t, 0});
      if (fp8) {
        load_f32(src, DType::kBF16, H, b.x.data());
        for (int64_t g = 0; g < groups; ++g)
          b.x_scales[g] =
              fp8_quant_group(b.x.data() + g * kDeepGemmBlock, kDeepGemmBlock, ue8m0,
                              ActQuant::kFp8PerTokenGroup, b.codes.data() + g * kDeepGemmBlock);
      }
      for (int64_t j = 0; j < k; ++j) {
        const int32_t dst = src2dst[t * k + j];
        if (dst < 0) continue;
        if (fp8) {
          std::copy_n(b.codes.data(), H, static_cast<uint8_t*>(rows) + dst * H);
          std::copy_n(b.x_scales.data(), groups, scales + dst * groups);
        } else {
          std::memcpy(static_cast<uint16_t*>(rows) + dst * H, src, static_cast<size_t>(H) * 2);
        }
      }
    }
  };
  for_each_part(x.shape[0], ws.parts.size(), gather);
}

/// ep_scatter's copy: for each valid slot s, its token's row of x ([N, H] e4m3 codes or bf16,
/// contiguous rows) to row src2dst[s] of `rows`, and with FP8 (scales f32 [N, H/128]) the
/// token's scales to the same row of row_scales.
void gather_slot_rows(const TensorView& x, const float* scales, int64_t k, const int32_t* src2dst,
                      void* rows, float* row_scales) {
  const int64_t H = x.shape[1], groups = H / kDeepGemmBlock;
  const int64_t row_bytes = H * dtype_size(x.dtype);
  for (int64_t s = 0; s < x.shape[0] * k; ++s) {
    const int64_t row = src2dst[s];
    if (row < 0) continue;
    std::memcpy(static_cast<char*>(rows) + row * row_bytes, x.at({s / k, 0}),
                static_cast<size_t>(row_bytes));
    if (scales != nullptr)
      std::copy_n(scales + (s / k) * groups, groups, row_scales + row * groups);
  }
}

/// num_recv_tokens_per_expert must have one entry per local expert, each covering the expert's
/// received (token, slot) pairs.
void check_recv_counts(const char* api, const std::vector<int64_t>& recv, const int64_t* counts,
                       int64_t num_experts) {
  MOECORE_CHECK(static_cast<int64_t>(recv.size()) == num_experts, api,
                ": expected num_recv_tokens_per_expert with ", num_experts, " entries, got ",
                recv.size());
  for (int64_t e = 0; e < num_experts; ++e)
    MOECORE_CHECK(recv[e] >= counts[e], api, ": num_recv_tokens_per_expert[", e, "] = ", recv[e],
                  " is less than the ", counts[e], " received (token, slot) pairs of expert ", e);
}

/// post_reorder (the numeric contract above): out[t] ([T, H] bf16) from rows src2dst[t·k + j]
/// of `down` ([*, H] bf16) over the valid slots of `tokens`, then routed scaling.
void reorder_tokens(const RoutedTokens& tokens, const uint16_t* down, const int32_t* src2dst,
                    int64_t H, std::optional<float> rsf, uint16_t* out, DeepGemmWorkspace& ws) {
  const int64_t k = tokens.top_k;
  auto reorder = [&](int64_t part, int64_t begin, int64_t end) {
    float* acc = ws.parts[static_cast<size_t>(part)].y.data();
    for (int64_t t = begin; t < end; ++t) {
      std::fill(acc, acc + H, 0.0f);
      for (int64_t j = 0; j < k; ++j) {
        if (tokens.id(t, j) < 0) continue;
        const float w = round_to(DType::kBF16, tokens.weight(t, j));
        const uint16_t* row = down + static_cast<int64_t>(src2dst[t * k + j]) * H;
        for (int64_t h = 0; h < H; ++h) {
          const float p = round_to(DType::kBF16, bf16_to_f32(row[h]) * w);
          acc[h] = round_to(DType::kBF16, acc[h] + p);
        }
      }
      if (rsf)
        for (int64_t h = 0; h < H; ++h) acc[h] = round_to(DType::kBF16, acc[h] * *rsf);
      store_f32(acc, H, DType::kBF16, out + t * H);
    }
  };
  for_each_part(tokens.num_tokens, ws.parts.size(), reorder);
}

/// deepep_normal's post-permute: slot s's row of `slots` ([N·k, H] bf16) is row src2dst[s] of
/// `rows` ([*, H] bf16), zero where the slot's expert is not local.
void scatter_slot_rows(const uint16_t* rows, const int32_t* src2dst, int64_t num_slots, int64_t H,
                       uint16_t* slots) {
  for (int64_t s = 0; s < num_slots; ++s) {
    if (src2dst[s] >= 0)
      std::copy_n(rows + static_cast<int64_t>(src2dst[s]) * H, H, slots + s * H);
    else
      std::fill_n(slots + s * H, H, uint16_t{0});
  }
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

/// masked_m i32 [E] (the masked layout's rows per expert slab of m_cap rows).
void check_masked_m(const Tensor& mm, int64_t num_experts) {
  MOECORE_CHECK(
      mm.defined() && mm.dtype() == DType::kI32 && mm.ndim() == 1 && mm.size(0) == num_experts,
      kApi, ": expected masked_m int32 [", num_experts, "], got ", mm.describe());
}

int64_t masked_rows(const TensorView& mm, int64_t e) {
  return mm.ptr<int32_t>()[e * mm.strides[0]];
}

/// The masked layout's segments: expert e's rows are e·m_cap + [0, masked_m[e]); each
/// masked_m[e] must be in [0, m_cap].
void masked_segments(const TensorView& mm, int64_t m_cap, std::vector<ExpertRows>& segments) {
  segments.clear();
  for (int64_t e = 0; e < mm.shape[0]; ++e) {
    const int64_t m = masked_rows(mm, e);
    MOECORE_CHECK(m >= 0 && m <= m_cap, kApi, ": masked_m[", e, "] must be in [0, ", m_cap,
                  "], got ", m);
    if (m > 0) segments.push_back({e, e * m_cap, m});
  }
}

int64_t total_rows(const std::vector<ExpertRows>& segments) {
  int64_t rows = 0;
  for (const ExpertRows& s : segments) rows += s.rows;
  return rows;
}

/// Masked layout: hidden_states [E, m_max, H], masked_m i32 [E]; expert e's rows are
/// e·m_max + [0, masked_m[e]). Output bf16 [E, m_max, H], rows past masked_m[e] zero.
Tensor masked_core(const DeepGemmMlp& mlp, const Tensor& x, const Tensor& s, const Tensor& mm) {
  const int64_t E = mlp.w.num_experts, H = mlp.w.hidden;
  MOECORE_CHECK(x.defined() && x.ndim() == 3, kApi,
                ": expected hidden_states [E, m, H] for the masked layout, got ", x.describe());
  const int64_t m_cap = x.size(1);
  check_layout_input(mlp.w, x, s, {E, m_cap}, "[E, m, H]");
  check_masked_m(mm, E);
  DeepGemmWorkspace ws;
  masked_segments(mm.view(), m_cap, ws.segments);
  ws.reserve_expert_rows(mlp, total_rows(ws.segments), E);
  Tensor out = Tensor::zeros({E, m_cap, H}, DType::kBF16);
  run_expert_rows(mlp, flat_rows(x, s, out), ws);
  return out;
}

/// Contiguous layout (sglang's ep_scatter): hidden_states [M, H], m_indices i32 [M]; each
/// maximal run of one expert id is that expert's rows, and −1 marks padding. Validates that
/// every id is in [−1, E), each expert has one run, every run starts on a 128-row boundary and
/// M is a multiple of 128 (DeepGEMM's contiguous-layout alignment), so each 128-row block holds
/// one expert followed by padding. Output bf16 [M, H], padding rows zero.
Tensor contiguous_core(const DeepGemmMlp& mlp, const Tensor& x, const Tensor& s, const Tensor& mi) {
  const int64_t E = mlp.w.num_experts, H = mlp.w.hidden;
  MOECORE_CHECK(x.defined() && x.ndim() == 2, kApi,
                ": expected hidden_states [M, H] for the contiguous layout, got ", x.describe());
  const int64_t M = x.size(0);
  check_layout_input(mlp.w, x, s, {M}, "[M, H]");
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
  DeepGemmWorkspace ws;
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
      ws.segments.push_back({e, r, end - r});
    }
    r = end;
  }
  ws.reserve_expert_rows(mlp, total_rows(ws.segments), E);
  Tensor out = Tensor::zeros({M, H}, DType::kBF16);
  run_expert_rows(mlp, flat_rows(x, s, out), ws);
  return out;
}

class DeepGemmRunnerCore : public RunnerCore {
 public:
  explicit DeepGemmRunnerCore(const MoeRunnerConfig& config)
      : RunnerCore(config), spec_(check_config(config)), gemm_(config.gemm_kernel()) {}

  MoeRunnerBackend runner_backend() const override { return MoeRunnerBackend::DEEP_GEMM; }

  RunnerOutputPtr run(const RunnerInputPtr& runner_input, const QuantInfoPtr& quant_info,
                      RunningState&) override {
    auto* in = dynamic_cast<const DeepGemmRunnerInput*>(runner_input.get());
    MOECORE_CHECK_DTYPE(in != nullptr, "DeepGemmRunnerCore.run: expected a DeepGemmRunnerInput");
    const DeepGemmMlp mlp{spec_, gemm_, check_weights(as_deep_gemm_info(quant_info))};
    auto out = std::make_shared<DeepGemmRunnerOutput>();
    out->hidden_states =
        in->use_masked_gemm
            ? masked_core(mlp, in->hidden_states, in->hidden_states_scale, in->masked_m)
            : contiguous_core(mlp, in->hidden_states, in->hidden_states_scale, in->m_indices);
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

/// A DeepEP FP8 payload's scale: f32 [lead..., H/128] (any strides) or int32-packed UE8M0
/// [lead..., ⌈H/512⌉].
void check_deepep_scale(const char* api, const Tensor& s, std::vector<int64_t> shape,
                        int64_t hidden) {
  const int64_t groups = hidden / kDeepGemmBlock;
  MOECORE_CHECK(s.defined(), api,
                ": an FP8 payload needs hidden_states_scale (f32 [..., H/128] or int32-packed "
                "UE8M0 [..., H/512])");
  shape.push_back(groups);
  if (s.dtype() == DType::kF32) {
    MOECORE_CHECK(s.view().shape_vector() == shape, api, ": expected f32 hidden_states_scale ",
                  shape_string(shape), ", got ", s.describe());
    return;
  }
  MOECORE_CHECK_DTYPE(s.dtype() == DType::kI32, api,
                      ": expected hidden_states_scale f32 or int32 (packed UE8M0), got ",
                      s.describe());
  shape.back() = div_up(groups, 4);
  MOECORE_CHECK(s.view().shape_vector() == shape, api,
                ": expected int32-packed UE8M0 hidden_states_scale ", shape_string(shape),
                " (four scale bytes per int32), got ", s.describe());
}

/// Element offset of row r of a strided view, rows running over every dim but the last in
/// row-major order.
int64_t row_offset(const TensorView& v, int64_t r) {
  int64_t offset = 0;
  for (int d = v.ndim - 2; d >= 0; --d) {
    offset += (r % v.shape[d]) * v.strides[d];
    r /= v.shape[d];
  }
  return offset;
}

/// A checked DeepEP FP8 scale (check_deepep_scale) → out, contiguous f32 [rows, groups]: f32
/// scales (DeepEP's are column-major in the last two dims) are copied; int32-packed UE8M0 scales
/// (group g in byte g % 4 of word g / 4, little end first) are unpacked to 2^(byte − 127)
/// exactly, a 0xFF (NaN) byte being an error. No allocation.
void deepep_scales_into(const char* api, const TensorView& s, int64_t groups, float* out) {
  int64_t rows = 1;
  for (int d = 0; d + 1 < s.ndim; ++d) rows *= s.shape[d];
  const int64_t inner = s.strides[s.ndim - 1];
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t offset = row_offset(s, r);
    float* dst = out + r * groups;
    if (s.dtype == DType::kF32) {
      const float* src = s.ptr<float>() + offset;
      for (int64_t g = 0; g < groups; ++g) dst[g] = src[g * inner];
      continue;
    }
    const int32_t* words = s.ptr<int32_t>() + offset;
    for (int64_t g = 0; g < groups; ++g) {
      const uint32_t word = static_cast<uint32_t>(words[(g / 4) * inner]);
      const uint8_t code = static_cast<uint8_t>(word >> (8 * (g % 4)));
      MOECORE_CHECK(code != kE8M0NaN, api,
                    ": expected E8M0 bytes other than 0xFF (NaN) in the packed "
                    "hidden_states_scale, got 0xFF at row ",
                    r, " group ", g);
      dst[g] = e8m0_to_f32(code);
    }
  }
}

/// Checks a DeepEP payload's scale against the weights: an FP8 payload needs one
/// (check_deepep_scale over [lead..., ·]); a BF16 payload must have none.
void check_deepep_payload_scale(const char* api, const DeepGemmWeights& w, const Tensor& scale,
                                std::vector<int64_t> lead) {
  if (w.fp8) return check_deepep_scale(api, scale, std::move(lead), w.hidden);
  MOECORE_CHECK(!scale.defined(), api,
                ": use_fp8=False (BF16 DeepGEMM) takes a BF16 payload without "
                "hidden_states_scale, got ",
                scale.describe());
}

/// The FP8 scale of a DeepEP payload as contiguous f32 [lead..., H/128], or undefined for BF16.
Tensor deepep_payload_scale(const char* api, const DeepGemmWeights& w, const Tensor& scale,
                            std::vector<int64_t> lead) {
  check_deepep_payload_scale(api, w, scale, lead);
  if (!w.fp8) return {};
  const int64_t groups = w.hidden / kDeepGemmBlock;
  lead.push_back(groups);
  Tensor out = Tensor::empty(lead, DType::kF32);
  deepep_scales_into(api, scale.view(), groups, out.ptr<float>());
  return out;
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

/// The routed tokens of a DeepEP normal dispatch output: its payload rows (e4m3 codes or bf16,
/// as the weights need) and its local routing.
RoutedTokens deepep_normal_tokens(const char* api, const DeepEPNormalDispatchOutput& d,
                                  const DeepGemmWeights& w) {
  ExpertWeights shape;
  shape.num_experts = w.num_experts;
  shape.hidden = w.hidden;
  shape.dtype = w.fp8 ? DType::kF8E4M3 : DType::kBF16;
  return check_routed_tokens(api, d.hidden_states,
                             StandardTopKOutput{d.topk_weights, d.topk_ids, {}}, shape);
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
  const RoutedTokens tokens = deepep_normal_tokens(api, *d, w);
  const int64_t N = tokens.num_tokens, k = tokens.top_k;
  const Tensor scale = deepep_payload_scale(api, w, d->hidden_states_scale, {N});
  std::vector<int64_t> count(static_cast<size_t>(E)), start(static_cast<size_t>(E) + 1, 0),
      cursor(static_cast<size_t>(E));
  count_expert_slots(tokens, E, kNoRowLimit, count.data());
  check_recv_counts(api, d->num_recv_tokens_per_expert, count.data(), E);
  for (int64_t e = 0; e < E; ++e)
    start[e + 1] = start[e] + div_up(count[e], kDeepGemmBlock) * kDeepGemmBlock;
  const int64_t M = start[E];
  auto input = std::make_shared<DeepGemmRunnerInput>();
  input->use_masked_gemm = false;
  input->hidden_states = Tensor::zeros({M, H}, tokens.x.dtype);
  if (w.fp8) input->hidden_states_scale = Tensor::zeros({M, groups}, DType::kF32);
  input->m_indices = Tensor::empty({M}, DType::kI32);
  int32_t* m_indices = input->m_indices.ptr<int32_t>();
  std::fill(m_indices, m_indices + M, -1);
  auto st = std::make_shared<DeepEPState>();
  st->topk_ids = d->topk_ids;
  st->topk_weights = d->topk_weights;
  st->src2dst = Tensor::empty({N * k}, DType::kI32);
  int32_t* src2dst = st->src2dst.ptr<int32_t>();
  assign_slot_rows(tokens, E, start.data(), cursor.data(), src2dst);
  for (int64_t s = 0; s < N * k; ++s)
    if (src2dst[s] >= 0) m_indices[src2dst[s]] = tokens.id(s / k, s % k);
  gather_slot_rows(tokens.x, w.fp8 ? scale.ptr<float>() : nullptr, k, src2dst,
                   input->hidden_states.view().data,
                   w.fp8 ? input->hidden_states_scale.ptr<float>() : nullptr);
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
                                                        const QuantInfoPtr&, const MoeRunnerConfig&,
                                                        RunningState& state) {
  constexpr const char* api = "post-permute(deep_gemm→deepep_normal)";
  const DeepGemmRunnerOutput& out = as_output(runner_output, api);
  const DeepEPState& st = deepep_state(state, api);
  const int64_t N = st.topk_ids.size(0), k = st.topk_ids.size(1), H = out.hidden_states.size(1);
  Tensor slots = Tensor::empty({N, k, H}, DType::kBF16);
  scatter_slot_rows(out.hidden_states.ptr<uint16_t>(), st.src2dst.ptr<int32_t>(), N * k, H,
                    slots.ptr<uint16_t>());
  auto combine = std::make_shared<DeepEPNormalCombineInput>();
  combine->hidden_states = slots;
  combine->topk_ids = st.topk_ids;
  combine->topk_weights = st.topk_weights;
  return combine;
}

std::unique_ptr<RunnerCore> make_deep_gemm_core(const MoeRunnerConfig& config) {
  return std::make_unique<DeepGemmRunnerCore>(config);
}

// ---------------------------------------------------------------------------------------------
// Prepared runs (prepared.h): each format's pre-permute, core and post-permute in one object,
// over buffers allocated at prepare, through the helpers the eager permutes and cores use.
// Where the eager path's runner layout never reaches the combine input (standard: the masked
// [E, m_max, H] slabs; deepep_normal: the 128-aligned contiguous runs), they use the compact
// layout instead — the experts' rows back to back, at most T·k rows — whose segments hold the
// same rows in the same order, so run_expert_rows makes the same kernel calls. deepep_ll's
// combine input IS the masked layout, so that one keeps it.

/// What every deep_gemm prepared run holds: the dispatch output and the quant info it keeps
/// alive, the validated MLP and the workspace.
class DeepGemmPreparedRun : public PreparedRun {
 protected:
  DeepGemmPreparedRun(const DispatchOutputPtr& dispatch, const QuantInfoPtr& quant_info,
                      const MoeRunnerConfig& config)
      : PreparedRun(nullptr),
        dispatch_(dispatch),
        quant_info_(quant_info),
        mlp_(make_mlp(config, as_deep_gemm_info(quant_info))) {}

  DispatchOutputPtr dispatch_;  // keeps the inputs alive
  QuantInfoPtr quant_info_;     // keeps the weights alive
  DeepGemmMlp mlp_;
  DeepGemmWorkspace workspace_;
};

/// A prepared run over the compact layout (standard, deepep_normal): each run counts the slots
/// per expert (counts_), and run_compact lays them out, fills the rows and runs the core.
class CompactPreparedRun : public DeepGemmPreparedRun {
 protected:
  CompactPreparedRun(const DispatchOutputPtr& dispatch, const QuantInfoPtr& quant_info,
                     const MoeRunnerConfig& config)
      : DeepGemmPreparedRun(dispatch, quant_info, config) {}

  /// Sizes the layout for `slots` (token, slot) pairs whose input rows hold `dtype` values.
  void reserve_compact(int64_t slots, DType dtype) {
    const int64_t E = mlp_.w.num_experts, H = mlp_.w.hidden;
    counts_.resize(static_cast<size_t>(E));
    first_row_.resize(static_cast<size_t>(E));
    cursor_.resize(static_cast<size_t>(E));
    src2dst_.resize(static_cast<size_t>(slots));
    rows_ = Tensor::empty({slots, H}, dtype);
    if (mlp_.w.fp8) row_scales_ = Tensor::empty({slots, H / kDeepGemmBlock}, DType::kF32);
    down_ = Tensor::empty({slots, H}, DType::kBF16);
    workspace_.reserve_expert_rows(mlp_, slots, E);
  }

  /// With counts_ filled: assigns every valid slot its row (src2dst_), fills the rows
  /// (fill_rows) and runs the core into down_.
  void run_compact(const RoutedTokens& tokens) {
    const int64_t E = mlp_.w.num_experts;
    pack_expert_rows(counts_.data(), E, first_row_.data(), workspace_.segments);
    assign_slot_rows(tokens, E, first_row_.data(), cursor_.data(), src2dst_.data());
    fill_rows(tokens);
    run_expert_rows(mlp_, flat_rows(rows_, row_scales_, down_), workspace_);
  }
  /// Writes each valid slot s's input row (and FP8 scales) to row src2dst_[s] of rows_.
  virtual void fill_rows(const RoutedTokens& tokens) = 0;

  std::vector<int64_t> counts_, first_row_, cursor_;  // [E]
  std::vector<int32_t> src2dst_;                      // [slots]: each slot's row, −1 if none
  Tensor rows_, row_scales_, down_;  // [slots, H] input, [slots, H/128] f32 scales, bf16 output
};

/// (standard, deep_gemm): moe_ep_deepgemm_preprocess, the core and post_reorder.
class StandardPreparedRun : public CompactPreparedRun {
 public:
  StandardPreparedRun(const DispatchOutputPtr& dispatch, const QuantInfoPtr& quant_info,
                      const MoeRunnerConfig& config)
      : CompactPreparedRun(dispatch, quant_info, config), rsf_(config.routed_scaling_factor) {
    const StandardDispatchOutput& d = as_standard(dispatch);
    const DeepGemmWeights& w = mlp_.w;
    x_ = d.hidden_states;
    MOECORE_CHECK(x_.defined(), kApi, ": hidden_states is required");
    MOECORE_CHECK(x_.ndim() == 2 && x_.size(1) == w.hidden, kApi, ": expected hidden_states [T, ",
                  w.hidden, "], got ", x_.describe());
    topk_ = to_standard(d.topk_output);
    shape_.num_experts = w.num_experts;
    shape_.hidden = w.hidden;
    shape_.dtype = DType::kBF16;
    const RoutedTokens tokens = check_routed_tokens(kApi, x_, topk_, shape_);
    if (rsf_)
      MOECORE_CHECK(std::isfinite(*rsf_), "post_reorder: expected a finite routed_scaling_factor");
    const int64_t T = tokens.num_tokens;
    m_max_ = (T / 256 + 1) * 256;
    reserve_compact(T * tokens.top_k, w.fp8 ? DType::kF8E4M3 : DType::kBF16);
    result_ = Tensor::empty({T, w.hidden}, DType::kBF16);
    combine_input_ = std::make_shared<StandardCombineInput>(result_);
  }

  void run() override {
    const RoutedTokens tokens = check_routed_tokens(kApi, x_, topk_, shape_);
    count_expert_slots(tokens, mlp_.w.num_experts, m_max_, counts_.data());
    run_compact(tokens);
    reorder_tokens(tokens, down_.ptr<uint16_t>(), src2dst_.data(), mlp_.w.hidden, rsf_,
                   result_.ptr<uint16_t>(), workspace_);
  }

 private:
  void fill_rows(const RoutedTokens& tokens) override {
    gather_token_rows(tokens.x, tokens.top_k, src2dst_.data(), mlp_.w.fp8, mlp_.w.ue8m0,
                      rows_.view().data, mlp_.w.fp8 ? row_scales_.ptr<float>() : nullptr,
                      workspace_);
  }

  std::optional<float> rsf_;
  Tensor x_, result_;
  StandardTopKOutput topk_;
  ExpertWeights shape_;  // what check_routed_tokens checks against: E, H, bf16
  int64_t m_max_ = 0;    // moe_ep_deepgemm_preprocess's slab height (its duplicate-id check)
};

/// (deepep_normal, deep_gemm): ep_scatter, the core and the per-slot gather back.
class DeepEPNormalPreparedRun : public CompactPreparedRun {
 public:
  DeepEPNormalPreparedRun(const DispatchOutputPtr& dispatch, const QuantInfoPtr& quant_info,
                          const MoeRunnerConfig& config)
      : CompactPreparedRun(dispatch, quant_info, config) {
    d_ = dynamic_cast<const DeepEPNormalDispatchOutput*>(dispatch.get());
    MOECORE_CHECK_DTYPE(d_ != nullptr, kPreApi, ": expected a DeepEPNormalDispatchOutput");
    const DeepGemmWeights& w = mlp_.w;
    const RoutedTokens tokens = deepep_normal_tokens(kPreApi, *d_, w);
    const int64_t N = tokens.num_tokens, k = tokens.top_k;
    check_deepep_payload_scale(kPreApi, w, d_->hidden_states_scale, {N});
    if (w.fp8) token_scales_ = Tensor::empty({N, w.hidden / kDeepGemmBlock}, DType::kF32);
    reserve_compact(N * k, tokens.x.dtype);
    slots_ = Tensor::empty({N, k, w.hidden}, DType::kBF16);
    auto combine = std::make_shared<DeepEPNormalCombineInput>();
    combine->hidden_states = slots_;
    combine->topk_ids = d_->topk_ids;
    combine->topk_weights = d_->topk_weights;
    combine_input_ = combine;
  }

  void run() override {
    const DeepGemmWeights& w = mlp_.w;
    const RoutedTokens tokens = deepep_normal_tokens(kPreApi, *d_, w);
    if (w.fp8)
      deepep_scales_into(kPreApi, d_->hidden_states_scale.view(), w.hidden / kDeepGemmBlock,
                         token_scales_.ptr<float>());
    count_expert_slots(tokens, w.num_experts, kNoRowLimit, counts_.data());
    check_recv_counts(kPreApi, d_->num_recv_tokens_per_expert, counts_.data(), w.num_experts);
    run_compact(tokens);
    scatter_slot_rows(down_.ptr<uint16_t>(), src2dst_.data(), tokens.num_tokens * tokens.top_k,
                      w.hidden, slots_.ptr<uint16_t>());
  }

 private:
  static constexpr const char* kPreApi = "pre-permute(deepep_normal→deep_gemm)";

  void fill_rows(const RoutedTokens& tokens) override {
    const bool fp8 = mlp_.w.fp8;
    gather_slot_rows(tokens.x, fp8 ? token_scales_.ptr<float>() : nullptr, tokens.top_k,
                     src2dst_.data(), rows_.view().data, fp8 ? row_scales_.ptr<float>() : nullptr);
  }

  const DeepEPNormalDispatchOutput* d_ = nullptr;
  Tensor token_scales_;  // f32 [N, H/128]: the payload's scales, unpacked (FP8)
  Tensor slots_;         // the combine input's [N, k, H]
};

/// (deepep_ll, deep_gemm): the masked core on DeepEP's layout, whose output is the combine
/// input itself.
class DeepEPLLPreparedRun : public DeepGemmPreparedRun {
 public:
  DeepEPLLPreparedRun(const DispatchOutputPtr& dispatch, const QuantInfoPtr& quant_info,
                      const MoeRunnerConfig& config)
      : DeepGemmPreparedRun(dispatch, quant_info, config) {
    auto* d = dynamic_cast<const DeepEPLLDispatchOutput*>(dispatch.get());
    MOECORE_CHECK_DTYPE(d != nullptr, kPreApi, ": expected a DeepEPLLDispatchOutput");
    const DeepGemmWeights& w = mlp_.w;
    const int64_t E = w.num_experts, H = w.hidden;
    x_ = d->hidden_states;
    MOECORE_CHECK(x_.defined() && x_.ndim() == 3 && x_.size(0) == E, kPreApi,
                  ": expected hidden_states [E_local=", E, ", M_cap, H], got ", x_.describe());
    m_cap_ = x_.size(1);
    check_deepep_payload_scale(kPreApi, w, d->hidden_states_scale, {E, m_cap_});
    payload_scale_ = d->hidden_states_scale;
    if (w.fp8) scales_ = Tensor::empty({E, m_cap_, H / kDeepGemmBlock}, DType::kF32);
    check_layout_input(w, x_, scales_, {E, m_cap_}, "[E, m, H]");
    masked_m_ = d->masked_m;
    check_masked_m(masked_m_, E);
    out_ = Tensor::empty({E, m_cap_, H}, DType::kBF16);
    workspace_.reserve_expert_rows(mlp_, E * m_cap_, E);
    auto combine = std::make_shared<DeepEPLLCombineInput>();
    combine->hidden_states = out_;
    combine->topk_ids = d->topk_ids;
    combine->topk_weights = d->topk_weights;
    combine_input_ = combine;
  }

  void run() override {
    const DeepGemmWeights& w = mlp_.w;
    if (w.fp8)
      deepep_scales_into(kPreApi, payload_scale_.view(), w.hidden / kDeepGemmBlock,
                         scales_.ptr<float>());
    const TensorView mm = masked_m_.view();
    masked_segments(mm, m_cap_, workspace_.segments);
    // Rows past masked_m[e] are zero, as masked_core leaves them.
    uint16_t* out = out_.ptr<uint16_t>();
    const int64_t H = w.hidden;
    for (int64_t e = 0; e < w.num_experts; ++e)
      std::fill(out + (e * m_cap_ + masked_rows(mm, e)) * H, out + (e + 1) * m_cap_ * H,
                uint16_t{0});
    run_expert_rows(mlp_, flat_rows(x_, scales_, out_), workspace_);
  }

 private:
  static constexpr const char* kPreApi = "pre-permute(deepep_ll→deep_gemm)";

  Tensor x_, payload_scale_, masked_m_;
  int64_t m_cap_ = 0;
  Tensor scales_;  // f32 [E, M_cap, H/128]: the payload's scales, unpacked (FP8)
  Tensor out_;     // the combine input's [E, M_cap, H]
};

template <typename Run>
PreparedRunPtr prepare_deep_gemm(const DispatchOutputPtr& dispatch, const QuantInfoPtr& q,
                                 const MoeRunnerConfig& config, MoeA2ABackend) {
  return std::make_unique<Run>(dispatch, q, config);
}

}  // namespace

Tensor deep_gemm_masked_core(const MoeRunnerConfig& config, const DeepGemmMoeQuantInfo& info,
                             const Tensor& hidden_states, const Tensor& hidden_states_scale,
                             const Tensor& masked_m) {
  return masked_core(make_mlp(config, info), hidden_states, hidden_states_scale, masked_m);
}

Tensor deep_gemm_contiguous_core(const MoeRunnerConfig& config, const DeepGemmMoeQuantInfo& info,
                                 const Tensor& hidden_states, const Tensor& hidden_states_scale,
                                 const Tensor& m_indices) {
  return contiguous_core(make_mlp(config, info), hidden_states, hidden_states_scale, m_indices);
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
  std::vector<int64_t> counts(static_cast<size_t>(E)), first_row(static_cast<size_t>(E)),
      cursor(static_cast<size_t>(E));
  count_expert_slots(tokens, E, out.m_max, counts.data());
  out.masked_m = Tensor::empty({E}, DType::kI32);
  for (int64_t e = 0; e < E; ++e) {
    out.masked_m.ptr<int32_t>()[e] = static_cast<int32_t>(counts[e]);
    first_row[e] = e * out.m_max;  // expert e's slab
  }
  out.src2dst = Tensor::empty({T * k}, DType::kI32);
  assign_slot_rows(tokens, E, first_row.data(), cursor.data(), out.src2dst.ptr<int32_t>());
  out.hidden_states = Tensor::zeros({E, out.m_max, H}, use_fp8 ? DType::kF8E4M3 : DType::kBF16);
  if (use_fp8)
    out.hidden_states_scale = Tensor::zeros({E, out.m_max, H / kDeepGemmBlock}, DType::kF32);
  DeepGemmWorkspace ws;
  ws.reserve_tokens(H);
  gather_token_rows(hidden_states.view(), k, out.src2dst.ptr<int32_t>(), use_fp8, scale_ue8m0,
                    out.hidden_states.view().data,
                    use_fp8 ? out.hidden_states_scale.ptr<float>() : nullptr, ws);
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
  DeepGemmWorkspace ws;
  ws.reserve_tokens(H);
  reorder_tokens(tokens, down_output.ptr<uint16_t>(), dst, H, routed_scaling_factor,
                 out.ptr<uint16_t>(), ws);
  return out;
}

SlotReorder::SlotReorder(int64_t max_slots, int64_t hidden, std::optional<float> rsf)
    : workspace_(std::make_unique<DeepGemmWorkspace>()),
      identity_(static_cast<size_t>(max_slots)),
      hidden_(hidden),
      rsf_(rsf) {
  workspace_->reserve_tokens(hidden);
  for (int64_t s = 0; s < max_slots; ++s) identity_[s] = static_cast<int32_t>(s);
}

SlotReorder::~SlotReorder() = default;

void SlotReorder::run(const RoutedTokens& tokens, const uint16_t* slot_rows, uint16_t* out) {
  reorder_tokens(tokens, slot_rows, identity_.data(), hidden_, rsf_, out, *workspace_);
}

MOECORE_REGISTER_RUNNER_CORE(DEEP_GEMM, make_deep_gemm_core);
MOECORE_REGISTER_PRE_PERMUTE(STANDARD, DEEP_GEMM, pre_permute_standard_to_deep_gemm);
MOECORE_REGISTER_POST_PERMUTE(DEEP_GEMM, STANDARD, post_permute_deep_gemm_to_standard);
MOECORE_REGISTER_PRE_PERMUTE(DEEPEP_LL, DEEP_GEMM, pre_permute_deepep_ll_to_deep_gemm);
MOECORE_REGISTER_POST_PERMUTE(DEEP_GEMM, DEEPEP_LL, post_permute_deep_gemm_to_deepep_ll);
MOECORE_REGISTER_PRE_PERMUTE(DEEPEP_NORMAL, DEEP_GEMM, pre_permute_deepep_normal_to_deep_gemm);
MOECORE_REGISTER_POST_PERMUTE(DEEP_GEMM, DEEPEP_NORMAL, post_permute_deep_gemm_to_deepep_normal);
MOECORE_REGISTER_PREPARED_RUN(STANDARD, DEEP_GEMM, prepare_deep_gemm<StandardPreparedRun>);
MOECORE_REGISTER_PREPARED_RUN(DEEPEP_LL, DEEP_GEMM, prepare_deep_gemm<DeepEPLLPreparedRun>);
MOECORE_REGISTER_PREPARED_RUN(DEEPEP_NORMAL, DEEP_GEMM, prepare_deep_gemm<DeepEPNormalPreparedRun>);

}  // namespace moecore
