// Runner backend "triton" (sglang moe_runner/triton.py + fused_moe_triton), unquantized and the
// 8-bit TritonMoeQuantInfo flags. Registers: runner core TRITON, fused func (none, triton),
// pre-permute (standard, triton), post-permute (triton, standard). The fused func runs the same
// three steps without lookups.
//
// Numeric contract, unquantized (spec §7.1): GEMM1 accumulates in fp32, adds b13, multiplies the
// routed weight when apply_router_weight_on_input, rounds to the activation dtype; the activation
// runs in fp32 and rounds once; GEMM2 accumulates in fp32, adds b2, multiplies the routed weight
// (unless applied on input) and rounds each (token, slot) row; the top-k sum is fp32 in slot
// order, times routed_scaling_factor, rounded once. With top_k == 1 the same path applies, so
// out = round(rsf · round(w · expert_out)) — sglang's uninitialised-buffer hazard (R16) cannot
// occur. no_combine returns the per-slot rows [T, k, H] (weighted, rsf not applied, as sglang).
// Slots with id −1 contribute nothing. inplace writes the output into hidden_states.
//
// Numeric contract, quantized (fused_moe_triton_kernels.py, invoke_fused_moe_kernel): the same
// rounding points, with each GEMM input A quantized first and each GEMM scaled per K block b:
//   acc = Σ_b ((dot_b(qa, qw) · sa[row, b]) · sw[col, b])      (quant_gemm.h, fp32)
// then + bias, × routed weight, round. The Triton kernel forms sa·sw first and multiplies once
// (per K block for block scales, at the end otherwise); moecore multiplies dot·sa, then ·sw — one
// fp32 rounding apart, far below the act-dtype rounding that follows.
//   use_fp8_w8a8, block_shape [bn, bk]: W e4m3 with scales [E, ⌈N/bn⌉, ⌈K/bk⌉]; A per token
//     group of bk (sglang_per_token_group_quant_fp8: s = max(amax, 1e-10)/448, q = x / s); H and
//     I must be multiples of bk; a13/a2 scales must be None (sglang ignores them).
//   use_fp8_w8a8, per_channel_quant: W scales [E, N] (or [E, N, 1]); A static per-tensor when
//     a13_scale/a2_scale is given, else dynamic per token (s = amax/448, q = x · (1/s)).
//   use_fp8_w8a8 (per-tensor): W scales [E]; A static (q = x · (1/s)) when a13_scale/a2_scale is
//     given, else DYNAMIC PER-TENSOR: s = amax/448 over the whole GEMM input — x [T, H] for GEMM1,
//     all T·k activation rows for GEMM2 — sglang's contract. This one mode is batch-dependent:
//     a token's result depends on the other tokens of its batch.
//   use_int8_w8a8 (per_channel_quant required): W int8 [E, N, K], scales [E, N]; A per token
//     (per_token_quant_int8: a = max(amax, 1e-10), s = a/127, q = round_half_away(x · (127/a)));
//     the int8 dot is exact int32 (the Triton kernel adds int32 block dots into fp32: equal while
//     partial sums stay below 2^24).
//   use_int8_w8a16: W int8 with per-channel scales [E, N]; A unquantized; acc = dot(a, qw)·sw.
// Weight scales must be finite and ≥ 0 (0 is an all-zero expert); static activation scales
// finite and > 0. Every mode except dynamic per-tensor is batch invariant and, like the
// unquantized path, bitwise deterministic across thread counts (the shared static schedule:
// each output is one dot of the kernel row, in its fixed order, whatever the blocks).
#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/kernels/convert.h"
#include "moecore/runner/expert_compute.h"
#include "moecore/runner/quant_compute.h"
#include "moecore/runner/registry.h"

namespace moecore {
namespace {

constexpr int64_t kBlockM = 16;  // rows per block of the sorted layout (BLOCK_SIZE_M)
constexpr const char* kApi = "MoeRunner(triton)";

/// TritonRunnerInput (hidden_states, topk_weights, topk_ids, sorted_token_ids, expert_ids,
/// num_tokens_post_padded).
struct TritonRunnerInput : RunnerInput {
  Tensor hidden_states, topk_weights, topk_ids, sorted_token_ids, expert_ids;
  int64_t num_tokens_post_padded = 0;
  MoeRunnerBackend runner_backend() const override { return MoeRunnerBackend::TRITON; }
};

/// TritonRunnerOutput(hidden_states): the per-slot expert outputs [T, k, H].
struct TritonRunnerOutput : RunnerOutput {
  Tensor hidden_states;
  MoeRunnerBackend runner_backend() const override { return MoeRunnerBackend::TRITON; }
};

const TritonMoeQuantInfo& as_triton_info(const QuantInfoPtr& q) {
  auto* info = dynamic_cast<const TritonMoeQuantInfo*>(q.get());
  MOECORE_CHECK_DTYPE(info != nullptr, "MoeRunner(triton): expected TritonMoeQuantInfo, got ",
                      q->name());
  return *info;
}

// ---------------------------------------------------------------------------------------------
// The quantized contract: validation and the plan it resolves to.

/// A quantized payload resolved against the activation dtype: the expert MLP (weights as
/// WeightOperands, biases, activation) and the quantization rule of each GEMM input.
struct QuantPlan {
  ExpertWeights shape;  // dims and the activation dtype (no dense weights)
  ExpertMlp mlp;        // quantizers are made per call (a dynamic scale needs the batch)
  ActQuant q1 = ActQuant::kNone, q2 = ActQuant::kNone;
  float s1 = 0.0f, s2 = 0.0f;  // static per-tensor scales
  int64_t group = 0;           // block_k of the group rule
  bool integer = false;        // int8 codes on both sides (exact int32 dots)
  IsaLevel level = IsaLevel::kScalar;  // the quantizers' kernel row (config.kernel_level())
  // The weight scales whose values check_weight_scales checks ([E, ...] views).
  struct ScaleValues {
    const char* name;
    TensorView scale;
  };
  std::vector<ScaleValues> weight_scales;
};

/// The plan's weight scales are finite and ≥ 0: with `routed`, only the experts the call's tokens
/// reach (a decode reads a few of E experts; checking all E would read every expert's scales on
/// every call); without, all of them (a prepared run checks once for every routing it replays).
void check_weight_scales(const QuantPlan& plan, const RoutedTokens* routed) {
  std::vector<uint8_t> experts;
  if (routed != nullptr) {
    experts.assign(static_cast<size_t>(plan.shape.num_experts), 0);
    for (int64_t t = 0; t < routed->num_tokens; ++t)
      for (int64_t j = 0; j < routed->top_k; ++j)
        if (const int32_t e = routed->id(t, j); e >= 0) experts[e] = 1;
  }
  for (const auto& s : plan.weight_scales)
    check_scale_values(kApi, s.name, s.scale, /*allow_zero=*/true,
                       routed != nullptr ? &experts : nullptr);
}

void check_bias(const Tensor& b, const char* name, int64_t e, int64_t n) {
  if (!b.defined()) return;
  MOECORE_CHECK_DTYPE(is_activation_dtype(b.dtype()), kApi, ": ", name,
                      " must be f32, f16 or bf16, got ", b.describe());
  MOECORE_CHECK(b.view().shape_vector() == std::vector<int64_t>({e, n}) && b.view().is_contiguous(),
                kApi, ": expected contiguous ", name, " [", e, ", ", n, "], got ", b.describe());
}

WeightOperand operand(WeightCoding coding, const Tensor& w, TensorView scale, int64_t e, int64_t n,
                      int64_t k) {
  WeightOperand op;
  op.coding = coding;
  op.data = w.view();
  op.scale = scale;
  op.num_experts = e;
  op.n = n;
  op.k = k;
  return op;
}

// Per-tensor weight scales [E] (one per expert, sglang's w13_weight_scale after the max-requant).
TensorView per_tensor_weight_scale(const char* name, const Tensor& s, int64_t e) {
  MOECORE_CHECK(s.defined(), kApi, ": ", name, " is required for use_fp8_w8a8");
  MOECORE_CHECK(s.ndim() == 1 && s.size(0) == e, kApi, ": expected per-tensor ", name, " [", e,
                "] (one scale per expert), got ", s.describe());
  return s.view();
}

QuantPlan make_quant_plan(const TritonMoeQuantInfo& q, const MoeRunnerConfig& config,
                          DType act_dtype) {
  MOECORE_CHECK_DTYPE(is_activation_dtype(act_dtype), kApi,
                      ": hidden_states must be f32, f16 or bf16, got ", dtype_name(act_dtype));
  const int flags = q.use_fp8_w8a8 + q.use_int8_w8a8 + q.use_int8_w8a16 + q.use_int4_w4a16;
  MOECORE_CHECK(flags == 1, kApi,
                ": expected exactly one of use_fp8_w8a8, use_int8_w8a8, "
                "use_int8_w8a16, use_int4_w4a16, got ",
                flags);
  if (q.use_int4_w4a16)
    MOECORE_UNSUPPORTED(kApi,
                        ": use_int4_w4a16 (GPTQ/AWQ) is not built; supported quantized "
                        "flags: use_fp8_w8a8, use_int8_w8a8, use_int8_w8a16");
  if (q.w13_zp.defined() || q.w2_zp.defined())
    MOECORE_UNSUPPORTED(kApi,
                        ": weight zero points (w13_zp/w2_zp) belong to the GPTQ/AWQ "
                        "kernel, which is not built");
  const Tensor& w13 = q.w13_weight;
  const Tensor& w2 = q.w2_weight;
  MOECORE_CHECK(w13.defined() && w2.defined(), kApi, ": w13_weight and w2_weight are required");
  const DType wdt = q.use_fp8_w8a8 ? DType::kF8E4M3 : DType::kI8;
  MOECORE_CHECK_DTYPE(w13.dtype() == wdt && w2.dtype() == wdt, kApi, ": ",
                      q.use_fp8_w8a8    ? "use_fp8_w8a8"
                      : q.use_int8_w8a8 ? "use_int8_w8a8"
                                        : "use_int8_w8a16",
                      " expects ", dtype_name(wdt), " weights, got ", w13.describe(), " and ",
                      w2.describe());
  MOECORE_CHECK(w13.ndim() == 3 && w2.ndim() == 3, kApi,
                ": expected w13_weight [E, 2I, H] and w2_weight [E, H, I], got ", w13.describe(),
                " and ", w2.describe());
  MOECORE_CHECK(w13.view().is_contiguous() && w2.view().is_contiguous(), kApi,
                ": expert weights must be contiguous");
  QuantPlan plan;
  ExpertWeights& w = plan.shape;
  w.num_experts = w13.size(0);
  w.n1 = w13.size(1);
  w.hidden = w13.size(2);
  w.inter = w2.size(2);
  w.dtype = act_dtype;
  const bool gated = config.is_gated;
  MOECORE_CHECK(w2.size(0) == w.num_experts && w2.size(1) == w.hidden, kApi,
                ": w2_weight must be [E, H, I] = [", w.num_experts, ", ", w.hidden, ", I], got ",
                w2.describe());
  MOECORE_CHECK(w.n1 == (gated ? 2 : 1) * w.inter, kApi, ": w13_weight rows must be ",
                gated ? "2·I" : "I", " (is_gated=", gated ? "True" : "False", ", I=", w.inter,
                "), got ", w13.describe());
  MOECORE_CHECK(w.num_experts > 0 && w.hidden > 0 && w.inter > 0, kApi,
                ": expected E, H, I > 0, got w13 ", w13.describe(), ", w2 ", w2.describe());
  check_bias(q.b13, "b13", w.num_experts, w.n1);
  check_bias(q.b2, "b2", w.num_experts, w.hidden);
  const int64_t E = w.num_experts;

  ExpertMlp& mlp = plan.mlp;
  mlp.gemm = config.gemm_kernel();
  plan.level = config.kernel_level();
  WeightOperand& o1 = mlp.gemm1.weight;
  WeightOperand& o2 = mlp.gemm2.weight;
  if (q.use_fp8_w8a8 && !q.block_shape.empty()) {
    MOECORE_CHECK(q.block_shape.size() == 2 && q.block_shape[0] > 0 && q.block_shape[1] > 0, kApi,
                  ": block_shape must be [block_n, block_k] > 0, got ",
                  shape_string(q.block_shape));
    MOECORE_CHECK(!q.per_channel_quant, kApi,
                  ": per_channel_quant=True and block_shape are "
                  "exclusive (block scales win in sglang's kernel); pass one of them");
    MOECORE_CHECK(!q.a13_scale.defined() && !q.a2_scale.defined(), kApi,
                  ": block-quantized fp8 quantizes activations dynamically per token group; "
                  "a13_scale and a2_scale must be None (sglang ignores them)");
    const int64_t bn = q.block_shape[0], bk = q.block_shape[1];
    MOECORE_CHECK(w.hidden % bk == 0 && w.inter % bk == 0, kApi,
                  ": block-quantized fp8 quantizes activations per token group of block_k=", bk,
                  "; expected H and I divisible by it, got H=", w.hidden, ", I=", w.inter);
    auto block_scale = [&](const char* name, const Tensor& s, int64_t n, int64_t k) {
      const std::vector<int64_t> want = {E, (n + bn - 1) / bn, (k + bk - 1) / bk};
      MOECORE_CHECK(s.defined() && s.view().shape_vector() == want, kApi, ": expected ", name, " ",
                    shape_string(want), " (block scales of block_shape [", bn, ", ", bk, "]), got ",
                    s.describe());
      plan.weight_scales.push_back({name, s.view()});
      return s.view();
    };
    o1 = operand(WeightCoding::kFp8, w13, block_scale("w13_scale", q.w13_scale, w.n1, w.hidden), E,
                 w.n1, w.hidden);
    o2 = operand(WeightCoding::kFp8, w2, block_scale("w2_scale", q.w2_scale, w.hidden, w.inter), E,
                 w.hidden, w.inter);
    o1.block_n = o2.block_n = bn;
    o1.block_k = o2.block_k = bk;
    plan.q1 = plan.q2 = ActQuant::kFp8PerTokenGroup;
    plan.group = bk;
  } else if (q.use_fp8_w8a8) {
    TensorView s13, s2;
    if (q.per_channel_quant) {
      s13 = per_channel_scale_view(kApi, "w13_scale", q.w13_scale, E, w.n1);
      s2 = per_channel_scale_view(kApi, "w2_scale", q.w2_scale, E, w.hidden);
    } else {
      s13 = per_tensor_weight_scale("w13_scale", q.w13_scale, E);
      s2 = per_tensor_weight_scale("w2_scale", q.w2_scale, E);
    }
    plan.weight_scales.push_back({"w13_scale", s13});
    plan.weight_scales.push_back({"w2_scale", s2});
    o1 = operand(WeightCoding::kFp8, w13, s13, E, w.n1, w.hidden);
    o2 = operand(WeightCoding::kFp8, w2, s2, E, w.hidden, w.inter);
    const ActQuant dynamic =
        q.per_channel_quant ? ActQuant::kFp8PerToken : ActQuant::kFp8PerTensorDynamic;
    plan.q1 = q.a13_scale.defined() ? ActQuant::kFp8Static : dynamic;
    plan.q2 = q.a2_scale.defined() ? ActQuant::kFp8Static : dynamic;
    if (q.a13_scale.defined()) plan.s1 = scalar_scale(kApi, "a13_scale", q.a13_scale);
    if (q.a2_scale.defined()) plan.s2 = scalar_scale(kApi, "a2_scale", q.a2_scale);
  } else {
    if (q.use_int8_w8a8) {
      if (!q.block_shape.empty())
        MOECORE_UNSUPPORTED(kApi,
                            ": block-wise int8 w8a8 (per_token_group_quant_int8) is not "
                            "built; use per_channel_quant=True without block_shape");
      MOECORE_ASSERT(q.per_channel_quant,
                     "int8 quantization only supports channel-wise quantization except for "
                     "block-wise quantization");
    } else if (!q.block_shape.empty()) {
      MOECORE_UNSUPPORTED(kApi,
                          ": use_int8_w8a16 with block_shape (the grouped GPTQ/AWQ kernel) "
                          "is not built; pass per-channel scales and block_shape=None");
    }
    MOECORE_CHECK(!q.a13_scale.defined() && !q.a2_scale.defined(), kApi, ": ",
                  q.use_int8_w8a8 ? "use_int8_w8a8 quantizes activations dynamically per token"
                                  : "use_int8_w8a16 does not quantize activations",
                  "; a13_scale and a2_scale must be None");
    const TensorView s13 = per_channel_scale_view(kApi, "w13_scale", q.w13_scale, E, w.n1);
    const TensorView s2 = per_channel_scale_view(kApi, "w2_scale", q.w2_scale, E, w.hidden);
    plan.weight_scales.push_back({"w13_scale", s13});
    plan.weight_scales.push_back({"w2_scale", s2});
    o1 = operand(WeightCoding::kInt8, w13, s13, E, w.n1, w.hidden);
    o2 = operand(WeightCoding::kInt8, w2, s2, E, w.hidden, w.inter);
    if (q.use_int8_w8a8) {
      plan.q1 = plan.q2 = ActQuant::kInt8PerToken;
      plan.integer = true;
    }
  }
  if (q.b13.defined()) mlp.gemm1.bias = q.b13.view();
  if (q.b2.defined()) mlp.gemm2.bias = q.b2.view();
  mlp.activation = activation_spec(config, kApi);
  mlp.act_dtype = act_dtype;
  mlp.hidden = w.hidden;
  mlp.inter = w.inter;
  attach_weight_tiles(q.weight_tiles.get(), mlp);
  return plan;
}

/// The dims and activation dtype of a payload (validated), for check_routed_tokens.
ExpertWeights validated_weights(const TritonMoeQuantInfo& q, const MoeRunnerConfig& config,
                                const Tensor& x) {
  if (!q.is_quantized()) {
    ExpertWeights w =
        check_expert_weights(kApi, q.w13_weight, q.w2_weight, q.b13, q.b2, config.is_gated);
    w.tiles = q.weight_tiles.get();
    return w;
  }
  MOECORE_CHECK(x.defined(), kApi, ": hidden_states is required");
  return make_quant_plan(q, config, x.dtype()).shape;
}

// Installs the quantizer of a GEMM for this call; a dynamic per-tensor rule becomes the static
// rule with the scale the batch gives (amax of the whole GEMM input / 448).
void set_quantizer(ExpertGemm& g, IsaLevel level, ActQuant rule, float static_scale, int64_t group,
                   bool integer) {
  g.quantize = make_act_quantizer(level, rule, static_scale, group);
  g.scales_per_row = act_scales_per_row(rule, g.weight.k, group);
  g.quantize_segment = act_quant_segment(rule, group);
  g.integer_codes = integer;
}

/// GEMM2's phase: into the per-slot rows `slots` [T, k, H], or, with `sum`, summed over top-k
/// into sum->out straight from GEMM2's rows (the post-permute's combine, without slot rows).
void gemm2_phase(const ExpertMlp& mlp, ExpertWorkspace& ws, RowScaleAt scale_at,
                 const TensorView& slots, const TopkSum* sum) {
  if (sum != nullptr)
    expert_gemm2_summed_phase(mlp, ws, scale_at, *sum);
  else
    expert_gemm2_phase(mlp, ws, scale_at, slot_rows(slots));
}

/// The quantized expert compute on the shared schedule, its two phases apart so that a dynamic
/// per-tensor GEMM2 scale sees every activation row first (rows of invalid slots would be zero
/// in sglang's buffer, so they never change the amax). ws.rows holds the call's rows.
void run_quantized(QuantPlan& plan, const RoutedTokens& tokens, ExpertWorkspace& ws,
                   RowScaleAt scale_at, const TensorView& slots, const TopkSum* sum) {
  ExpertMlp& mlp = plan.mlp;
  const int64_t H = plan.shape.hidden, I = plan.shape.inter;
  if (plan.q1 == ActQuant::kFp8PerTensorDynamic) {
    float amax = 0.0f, chunk[512];
    for (int64_t t = 0; t < tokens.num_tokens; ++t)
      for (int64_t h0 = 0; h0 < H; h0 += 512) {
        const int64_t width = std::min<int64_t>(512, H - h0);
        load_f32(tokens.x.at({t, h0}), tokens.x.dtype, width, chunk);
        amax = std::fmax(amax, amax_rows(chunk, 1, width, width));
      }
    plan.s1 = fp8_dynamic_scale(amax, 0.0f);  // per_tensor_absmax: no eps
  }
  set_quantizer(mlp.gemm1, plan.level, plan.q1, plan.s1, plan.group, plan.integer);
  // A segment rule quantizes GEMM2's input in GEMM1's epilogue; the dynamic per-tensor rule
  // (segment 0) reads every activation first and is set again once its scale is known.
  set_quantizer(mlp.gemm2, plan.level, plan.q2, plan.s2, plan.group, plan.integer);
  expert_gemm1_phase(mlp, ws, token_rows(tokens), scale_at);
  if (plan.q2 == ActQuant::kFp8PerTensorDynamic) {
    plan.s2 = fp8_dynamic_scale(amax_rows(expert_activations(ws), ws.rows.rows(), I, I), 0.0f);
    set_quantizer(mlp.gemm2, plan.level, plan.q2, plan.s2, plan.group, plan.integer);
  }
  gemm2_phase(mlp, ws, scale_at, slots, sum);
}

// ---------------------------------------------------------------------------------------------

const StandardDispatchOutput& as_standard(const DispatchOutputPtr& d) {
  auto* out = dynamic_cast<const StandardDispatchOutput*>(d.get());
  MOECORE_CHECK_DTYPE(out != nullptr, "MoeRunner(triton): expected a StandardDispatchOutput");
  return *out;
}

RunnerInputPtr pre_permute_standard_to_triton(const DispatchOutputPtr& dispatch,
                                              const QuantInfoPtr& quant_info,
                                              const MoeRunnerConfig& config, RunningState& state) {
  const StandardDispatchOutput& d = as_standard(dispatch);
  const ExpertWeights w = validated_weights(as_triton_info(quant_info), config, d.hidden_states);
  StandardTopKOutput topk = to_standard(d.topk_output);
  const RoutedTokens tokens = check_routed_tokens("MoeRunner(triton)", d.hidden_states, topk, w);
  MOECORE_CHECK(!config.apply_router_weight_on_input || tokens.top_k == 1,
                "Only support topk=1 when `apply_router_weight_on_input` is True");
  if (config.inplace && !config.no_combine)
    MOECORE_CHECK(d.hidden_states.view().writable,
                  "MoeRunner(triton): inplace=True writes the "
                  "output into hidden_states, which is read-only");
  BlockLayout layout = align_block_size(tokens, w.num_experts, kBlockM);
  auto input = std::make_shared<TritonRunnerInput>();
  input->hidden_states = d.hidden_states;
  input->topk_weights = topk.topk_weights;
  input->topk_ids = topk.topk_ids;
  input->sorted_token_ids = layout.sorted_token_ids;
  input->expert_ids = layout.expert_ids;
  input->num_tokens_post_padded = layout.num_tokens_post_padded;
  state.backend = input;  // the post-permute needs the routing and the output buffer
  return input;
}

/// The core: the shared expert schedule over the runner input's moe_align_block_size layout,
/// with a workspace reused across calls (its own, or the fused func's).
class TritonRunnerCore : public RunnerCore {
 public:
  TritonRunnerCore(const MoeRunnerConfig& config, std::shared_ptr<ExpertWorkspace> workspace)
      : RunnerCore(config),
        spec_(activation_spec(config, "MoeRunner(triton)")),
        gemm_(config.gemm_kernel()),
        workspace_(std::move(workspace)) {}

  MoeRunnerBackend runner_backend() const override { return MoeRunnerBackend::TRITON; }

  RunnerOutputPtr run(const RunnerInputPtr& runner_input, const QuantInfoPtr& quant_info,
                      RunningState&) override {
    auto* in = dynamic_cast<const TritonRunnerInput*>(runner_input.get());
    MOECORE_CHECK_DTYPE(in != nullptr, "TritonRunnerCore.run: expected a TritonRunnerInput");
    auto out = std::make_shared<TritonRunnerOutput>();
    out->hidden_states = compute(*in, quant_info, /*combine=*/false);
    return out;
  }

  /// The expert compute of one runner input: the per-slot rows [T, k, H] (the core's output),
  /// or, with `combine`, the post-permute's result ([T, H], or hidden_states when inplace) with
  /// the top-k sum read from GEMM2's rows (the same bits as the core, then the combine).
  Tensor compute(const TritonRunnerInput& in, const QuantInfoPtr& quant_info, bool combine) {
    const TritonMoeQuantInfo& info = as_triton_info(quant_info);
    std::optional<QuantPlan> plan;
    ExpertWeights w;
    if (info.is_quantized()) {
      MOECORE_CHECK(in.hidden_states.defined(), kApi, ": hidden_states is required");
      plan = make_quant_plan(info, config_, in.hidden_states.dtype());
      w = plan->shape;
    } else {
      w = validated_weights(info, config_, in.hidden_states);
    }
    const RoutedTokens tokens =
        check_routed_tokens("TritonRunnerCore.run", in.hidden_states,
                            StandardTopKOutput{in.topk_weights, in.topk_ids, {}}, w);
    if (plan) check_weight_scales(*plan, &tokens);
    Tensor result;
    if (!combine)
      result = Tensor::zeros({tokens.num_tokens, tokens.top_k, w.hidden}, w.dtype);
    else if (config_.inplace)
      result = in.hidden_states;
    else
      result = Tensor::empty({tokens.num_tokens, w.hidden}, w.dtype);
    if (tokens.num_tokens == 0) return result;  // R9: no kernel for empty input

    const RowScaleAt scale_at =
        config_.apply_router_weight_on_input ? RowScaleAt::kGemm1 : RowScaleAt::kGemm2;
    ExpertWorkspace& ws = *workspace_;
    std::lock_guard<std::mutex> lock(ws.mutex);
    ws.rows.from_block_layout(in.sorted_token_ids.ptr<int32_t>(), in.expert_ids.ptr<int32_t>(),
                              in.num_tokens_post_padded / kBlockM, kBlockM, tokens, w.num_experts,
                              /*with_scale=*/true);
    const TopkSum sum{&tokens, /*weighted=*/false, config_.routed_scaling_factor.value_or(1.0f),
                      result.view(), /*bias=*/{}};
    const TopkSum* summed = combine ? &sum : nullptr;
    const TensorView slots = combine ? TensorView{} : result.view();
    if (plan) {
      run_quantized(*plan, tokens, ws, scale_at, slots, summed);
    } else {
      const ExpertMlp mlp = dense_expert_mlp(w, spec_, gemm_);
      expert_gemm1_phase(mlp, ws, token_rows(tokens), scale_at);
      gemm2_phase(mlp, ws, scale_at, slots, summed);
    }
    return result;
  }

 private:
  ActivationSpec spec_;
  ScaledGemmFn gemm_;
  std::shared_ptr<ExpertWorkspace> workspace_;
};

CombineInputPtr post_permute_triton_to_standard(const RunnerOutputPtr& runner_output,
                                                const QuantInfoPtr& quant_info,
                                                const MoeRunnerConfig& config,
                                                RunningState& state) {
  auto* out = dynamic_cast<const TritonRunnerOutput*>(runner_output.get());
  MOECORE_CHECK_DTYPE(out != nullptr,
                      "post-permute(triton→standard): expected a TritonRunnerOutput");
  auto* stashed = std::any_cast<std::shared_ptr<TritonRunnerInput>>(&state.backend);
  MOECORE_ASSERT(stashed != nullptr,
                 "post-permute(triton→standard): the running state holds no triton pre-permute "
                 "result (run the (standard, triton) pre-permute first)");
  const auto& input = *stashed;
  const Tensor& slots = out->hidden_states;
  if (config.no_combine) return std::make_shared<StandardCombineInput>(slots);
  const int64_t num_tokens = slots.size(0), hidden = slots.size(2);
  Tensor result =
      config.inplace ? input->hidden_states : Tensor::empty({num_tokens, hidden}, slots.dtype());
  if (num_tokens == 0) return std::make_shared<StandardCombineInput>(result);
  RoutedTokens tokens;
  tokens.topk_ids = input->topk_ids.view();
  tokens.topk_weights = input->topk_weights.view();
  tokens.num_tokens = num_tokens;
  tokens.top_k = slots.size(1);
  combine_topk(tokens, slots.view(), /*weighted=*/false,
               config.routed_scaling_factor.value_or(1.0f), result.view());
  return std::make_shared<StandardCombineInput>(result);
}

/// The (standard, triton) path prepared for one dispatch output's shapes: pre-permute, core and
/// post-permute in one, over buffers allocated here.
class TritonPreparedRun : public PreparedRun {
 public:
  TritonPreparedRun(const DispatchOutputPtr& dispatch, const QuantInfoPtr& quant_info,
                    const MoeRunnerConfig& config)
      : PreparedRun(nullptr), dispatch_(dispatch), quant_info_(quant_info), config_(config) {
    const StandardDispatchOutput& d = as_standard(dispatch);
    const TritonMoeQuantInfo& info = as_triton_info(quant_info);
    x_ = d.hidden_states;
    topk_ = prepared_topk(d.topk_output);
    if (info.is_quantized()) {
      MOECORE_CHECK(x_.defined(), kApi, ": hidden_states is required");
      plan_ = make_quant_plan(info, config, x_.dtype());
      check_weight_scales(*plan_, /*routed=*/nullptr);
      weights_ = plan_->shape;
    } else {
      weights_ = validated_weights(info, config, x_);
      mlp_ = dense_expert_mlp(weights_, activation_spec(config, kApi), config.gemm_kernel());
    }
    const RoutedTokens tokens = check_routed_tokens(kApi, x_, topk_, weights_);
    MOECORE_CHECK(!config.apply_router_weight_on_input || tokens.top_k == 1,
                  "Only support topk=1 when `apply_router_weight_on_input` is True");
    if (config.inplace && !config.no_combine)
      MOECORE_CHECK(x_.view().writable, "MoeRunner(triton): inplace=True writes the output into "
                    "hidden_states, which is read-only");
    const int64_t T = tokens.num_tokens, k = tokens.top_k, E = weights_.num_experts;
    const int64_t padded = max_padded_slots(T * k, E, kBlockM);
    sorted_token_ids_ = Tensor::empty({std::max<int64_t>(padded, 1)}, DType::kI32);
    expert_ids_ = Tensor::empty({std::max<int64_t>(padded / kBlockM, 1)}, DType::kI32);
    start_.resize(static_cast<size_t>(E + 1));
    if (config.no_combine)
      result_ = Tensor::zeros({T, k, weights_.hidden}, weights_.dtype);  // the per-slot rows
    else  // the top-k sum reads GEMM2's rows: no per-slot rows
      result_ = config.inplace ? x_ : Tensor::empty({T, weights_.hidden}, weights_.dtype);
    combine_input_ = std::make_shared<StandardCombineInput>(result_);
    workspace_.reserve(plan_ ? plan_->mlp : mlp_, T * k);
    workspace_.rows.reserve(padded, E);  // from_block_layout sizes its rows by the padded layout
  }

  void run() override {
    const RoutedTokens tokens = check_routed_tokens(kApi, x_, topk_, weights_);
    if (tokens.num_tokens == 0) return;  // R9
    const RowScaleAt scale_at =
        config_.apply_router_weight_on_input ? RowScaleAt::kGemm1 : RowScaleAt::kGemm2;
    const int64_t padded =
        align_block_size_into(tokens, weights_.num_experts, kBlockM,
                              sorted_token_ids_.ptr<int32_t>(), expert_ids_.ptr<int32_t>(),
                              start_.data());
    ExpertWorkspace& ws = workspace_;
    std::lock_guard<std::mutex> lock(ws.mutex);
    ws.rows.from_block_layout(sorted_token_ids_.ptr<int32_t>(), expert_ids_.ptr<int32_t>(),
                              padded / kBlockM, kBlockM, tokens, weights_.num_experts,
                              /*with_scale=*/true);
    const TopkSum sum{&tokens, /*weighted=*/false, config_.routed_scaling_factor.value_or(1.0f),
                      result_.view(), /*bias=*/{}};
    const TopkSum* summed = config_.no_combine ? nullptr : &sum;
    const TensorView slots = config_.no_combine ? result_.view() : TensorView{};
    if (summed == nullptr) zero_view(slots);  // invalid slots stay 0
    if (plan_) {
      run_quantized(*plan_, tokens, ws, scale_at, slots, summed);
    } else {
      expert_gemm1_phase(mlp_, ws, token_rows(tokens), scale_at);
      gemm2_phase(mlp_, ws, scale_at, slots, summed);
    }
  }

 private:
  DispatchOutputPtr dispatch_;  // keeps the static inputs alive
  QuantInfoPtr quant_info_;     // keeps the weights alive
  MoeRunnerConfig config_;
  Tensor x_;
  StandardTopKOutput topk_;
  ExpertWeights weights_;
  std::optional<QuantPlan> plan_;
  ExpertMlp mlp_;
  Tensor sorted_token_ids_, expert_ids_, result_;
  std::vector<int64_t> start_;
  ExpertWorkspace workspace_;
};

PreparedRunPtr prepare_standard_triton(const DispatchOutputPtr& dispatch, const QuantInfoPtr& q,
                                       const MoeRunnerConfig& config, MoeA2ABackend) {
  return std::make_unique<TritonPreparedRun>(dispatch, q, config);
}

CombineInputPtr fused_none_to_triton(const DispatchOutputPtr& dispatch, const QuantInfoPtr& q,
                                     const MoeRunnerConfig& config) {
  // The fused func's state: one workspace for every runner that uses it (calls take turns).
  static const auto workspace = std::make_shared<ExpertWorkspace>();
  RunningState state;
  RunnerInputPtr input = pre_permute_standard_to_triton(dispatch, q, config, state);
  TritonRunnerCore core(config, workspace);
  if (config.no_combine)
    return post_permute_triton_to_standard(core.run(input, q, state), q, config, state);
  const auto& in = static_cast<const TritonRunnerInput&>(*input);
  return std::make_shared<StandardCombineInput>(core.compute(in, q, /*combine=*/true));
}

std::unique_ptr<RunnerCore> make_triton_core(const MoeRunnerConfig& config) {
  return std::make_unique<TritonRunnerCore>(config, std::make_shared<ExpertWorkspace>());
}

}  // namespace

MOECORE_REGISTER_RUNNER_CORE(TRITON, make_triton_core);
MOECORE_REGISTER_FUSED_FUNC(NONE, TRITON, fused_none_to_triton);
MOECORE_REGISTER_PRE_PERMUTE(STANDARD, TRITON, pre_permute_standard_to_triton);
MOECORE_REGISTER_POST_PERMUTE(TRITON, STANDARD, post_permute_triton_to_standard);
MOECORE_REGISTER_PREPARED_RUN(STANDARD, TRITON, prepare_standard_triton);

}  // namespace moecore
