// Runner backend "flashinfer_cutedsl" (sglang moe_runner/flashinfer_cutedsl.py), fused-only.
// Registers: fused func (none, flashinfer_cutedsl) and fused func (flashinfer,
// flashinfer_cutedsl) — the v2 path (FlashInfer CuteDslMoEWrapper.run) on a
// StandardDispatchOutput or a FlashinferDispatchOutput; fused func (deepep, flashinfer_cutedsl) —
// the v1 path (flashinfer_cutedsl_moe_masked) on a DeepEPLLDispatchOutput. Prepared runs
// (standard | flashinfer, flashinfer_cutedsl) capture v2 (flashinfer_moe_common's TokenMajorRun)
// and (deepep_ll, flashinfer_cutedsl) captures v1 (MaskedRun); each fused func is its prepared
// run built and run once.
//
// Numeric contract (scalar reference; the kernels are opaque, spec §6.8, §7.2). Both versions
// run the same per-row expert MLP (expert_compute's expert_mlp):
//   x → NVFP4 with the a1 global scale (16-blocks, e4m3 scales, spec §7.2 rounding), unless the
//       dispatcher sent NVFP4 already (its codes and scales are used as they are);
//   h1 = round_bf16(w1_alpha[e] · Σ (qa·sa)(qw·sw))  (fp32 dot over exact products);
//   h2 = round_bf16(silu(gate) · up) in fp32; h2 → NVFP4 with the a2 global scale;
//   y = round_bf16(w2_alpha[e] · Σ …).
// v2: w13 u8 [E, 2I, H/2] is [Up; Gate] interleaved in 64-row chunks [U0, G0, U1, G1, …], block
//   scales in the MMA view (w13 rows in that order), a1_scale / a2_scale scalar (R13). Ids are
//   global; this rank holds [local_expert_offset, local_expert_offset + E) (a FlashinferDispatch-
//   Output may carry the invalid-token id num_experts: it contributes nothing). Pre-quantized
//   input: hidden_states u8 [T, H/2] + linear e4m3 hidden_states_scale [T, H/16] (a2a flashinfer
//   only). out[t] = round_bf16(Σ_j w_j · y_j) in fp32, slot order, bf16 [T, H], written into
//   moe_output when the FlashinferDispatchOutput has one.
// v1: w13 [Gate; Up] not interleaved, 128×4-swizzled block scales, per-expert a1_scale /
//   a2_scale / alphas ([E], or one value for all). Input [E, M, H] bf16 (or u8 [E, M, H/2] with
//   e4m3 scales [E, M, H/16] when use_nvfp4_dispatch); only the first masked_m[e] rows of expert
//   e are read. Output bf16 [E, M, H], UNWEIGHTED (rows past masked_m[e] zero), handed on as a
//   DeepEPLLCombineInput with the dispatch output's routing (DeepEP's combine weights and sums).
// routed_scaling_factor is never applied here (the NVFP4 method folds it into the top-k
// weights). Guards (R15): silu only ("Only silu is supported for CuteDSL MoE."), gated only,
// apply_router_weight_on_input rejected, v2 needs a standard top-k. Empty input → [0, H] (R9).
#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/formats/quantize.h"
#include "moecore/kernels/convert.h"
#include "moecore/runner/backends/flashinfer_moe_common.h"
#include "moecore/runner/registry.h"

namespace moecore {
namespace {

using namespace flashinfer_detail;

constexpr const char* kApi = "MoeRunner(flashinfer_cutedsl)";
constexpr int64_t kInterleaveGroup = 64;

const CuteDslFp4MoeQuantInfo& as_info(const QuantInfoPtr& q) {
  auto* info = dynamic_cast<const CuteDslFp4MoeQuantInfo*>(q.get());
  MOECORE_CHECK_DTYPE(info != nullptr, kApi, ": expected CuteDslFp4MoeQuantInfo, got ", q->name());
  return *info;
}

/// The config guards both versions share (sglang asserts silu and no router weight on input).
ActivationSpec cutedsl_activation(const MoeRunnerConfig& config) {
  MOECORE_ASSERT(config.activation == "silu", "Only silu is supported for CuteDSL MoE.");
  const ActivationSpec spec = activation_spec(config, kApi);
  MOECORE_CHECK(config.is_gated, kApi,
                ": CuteDSL MoE runs gated SwiGLU only, got "
                "is_gated=False");
  if (config.gemm1_alpha || config.swiglu_limit)
    MOECORE_UNSUPPORTED(kApi, ": gemm1_alpha / swiglu_limit are not supported by CuteDSL MoE");
  MOECORE_ASSERT(!config.apply_router_weight_on_input,
                 "apply_router_weight_on_input is not supported for Flashinfer");
  if (config.no_combine)
    MOECORE_UNSUPPORTED(kApi, ": no_combine is not supported (CuteDSL always combines)");
  return spec;
}

/// Validated packed weights: E, H and I from w13 [E, 2I, H/2] and w2 [E, H, I/2].
struct Fp4Shapes {
  int64_t e = 0, h = 0, inter = 0;
};
Fp4Shapes check_fp4_weights(const CuteDslFp4MoeQuantInfo& q) {
  const Tensor& w13 = q.w13_weight;
  const Tensor& w2 = q.w2_weight;
  MOECORE_CHECK(w13.defined() && w2.defined() && w13.ndim() == 3 && w2.ndim() == 3 &&
                    w13.size(0) == w2.size(0),
                kApi, ": expected w13_weight [E, 2I, H/2] and w2_weight [E, H, I/2], got ",
                w13.describe(), " and ", w2.describe());
  Fp4Shapes s{w13.size(0), w2.size(1), w2.size(2) * 2};
  MOECORE_CHECK(s.h % kNvfp4BlockSize == 0 && s.inter % kNvfp4BlockSize == 0 && s.inter > 0, kApi,
                ": NVFP4 needs H and I multiples of 16 (K of both GEMMs), got H = ", s.h,
                ", I = ", s.inter);
  check_packed_fp4(kApi, "w13_weight", w13, s.e, 2 * s.inter, s.h / 2);
  check_packed_fp4(kApi, "w2_weight", w2, s.e, s.h, s.inter / 2);
  check_per_expert(kApi, "w1_alpha", q.w1_alpha, s.e);
  check_per_expert(kApi, "w2_alpha", q.w2_alpha, s.e);
  return s;
}

/// The fused funcs' state: one workspace for every runner of this backend (calls take turns).
const std::shared_ptr<ExpertWorkspace>& shared_workspace() {
  static const auto workspace = std::make_shared<ExpertWorkspace>();
  return workspace;
}

/// The expert MLP over linear block scales; the caller sets the activation quantizers.
ExpertMlp cutedsl_mlp(const CuteDslFp4MoeQuantInfo& q, const Fp4Shapes& s, const Tensor& sf13,
                      const Tensor& sf2, const ActivationSpec& spec, GateUpLayout layout,
                      const MoeRunnerConfig& config) {
  ExpertMlp mlp;
  auto operand = [&](WeightOperand& w, const Tensor& data, const Tensor& sf, const Tensor& alpha,
                     int64_t n, int64_t k) {
    w.coding = WeightCoding::kNvfp4;
    w.data = data.view();
    w.scale = sf.view();
    w.alpha = alpha.view();
    w.num_experts = s.e;
    w.n = n;
    w.k = k;
  };
  operand(mlp.gemm1.weight, q.w13_weight, sf13, q.w1_alpha, 2 * s.inter, s.h);
  operand(mlp.gemm2.weight, q.w2_weight, sf2, q.w2_alpha, s.h, s.inter);
  attach_weight_tiles(q.weight_tiles.get(), mlp);
  mlp.activation = spec;
  mlp.activation.layout = layout;
  mlp.activation.interleave_group = kInterleaveGroup;
  mlp.act_dtype = DType::kBF16;
  mlp.gemm = config.gemm_kernel();
  mlp.hidden = s.h;
  mlp.inter = s.inter;
  return mlp;
}

/// Packed NVFP4 activations: codes u8 [lead..., H/2] and e4m3 scales [lead..., H/16], both
/// contiguous (shapes and dtypes checked; the caller checks the scale bytes it will read).
void check_nvfp4_payload(const Tensor& x, const Tensor& s, std::vector<int64_t> lead, int64_t h) {
  MOECORE_CHECK_DTYPE(x.dtype() == DType::kU8 || x.dtype() == DType::kFp4E2M1x2, kApi,
                      ": with hidden_states_scale, expected packed NVFP4 hidden_states uint8, got ",
                      x.describe());
  std::vector<int64_t> want = lead;
  want.push_back(h / 2);
  MOECORE_CHECK(x.view().shape_vector() == want && x.view().is_contiguous(), kApi,
                ": expected contiguous packed hidden_states ", shape_string(want), ", got ",
                x.describe());
  MOECORE_CHECK_DTYPE(s.dtype() == DType::kF8E4M3 || s.dtype() == DType::kU8, kApi,
                      ": expected hidden_states_scale float8_e4m3fn (or uint8), got ",
                      s.describe());
  want.back() = h / kNvfp4BlockSize;
  MOECORE_CHECK(s.view().shape_vector() == want && s.view().is_contiguous(), kApi,
                ": expected contiguous linear hidden_states_scale ", shape_string(want),
                " (non-swizzled), got ", s.describe());
}

// ---------------------------------------------------------------------------------------------
// v2

// The whole v2 call resolved from the dispatch output, the quant info and the config.
TokenMajorPlan cutedsl_v2_plan(const DispatchOutputPtr& dispatch, const QuantInfoPtr& quant_info,
                               const MoeRunnerConfig& config, bool flashinfer_a2a, bool capture) {
  MOECORE_CHECK(dispatch != nullptr && quant_info != nullptr, kApi,
                ": expected a dispatch output and a quant info");
  const ActivationSpec spec = cutedsl_activation(config);
  const CuteDslFp4MoeQuantInfo& q = as_info(quant_info);
  TokenMajorPlan plan;
  plan.input = flashinfer_input(kApi, dispatch, flashinfer_a2a, true, capture);
  const FlashinferInput& in = plan.input;
  const Fp4Shapes s = check_fp4_weights(q);
  const int64_t e = s.e, h = s.h, inter = s.inter;
  MOECORE_CHECK(inter % kInterleaveGroup == 0, kApi,
                ": the v2 w13 layout interleaves 64-row "
                "chunks, so I must be a multiple of 64, got ",
                inter);
  MOECORE_CHECK(q.a1_scale.defined() && q.a1_scale.numel() == 1, kApi,
                ": the v2 path takes a scalar a1_scale (reduce per-expert scales with "
                "cutedsl_quant_scale_to_scalar), got ",
                q.a1_scale.describe());
  MOECORE_CHECK(q.a2_scale.defined() && q.a2_scale.numel() == 1, kApi,
                ": the v2 path takes a scalar a2_scale (fc2_input_scale), got ",
                q.a2_scale.describe());
  const float a1 = scalar_of(kApi, "a1_scale", q.a1_scale);
  const float a2 = scalar_of(kApi, "a2_scale", q.a2_scale);
  check_global_scale(kApi, "a1_scale", a1);
  check_global_scale(kApi, "a2_scale", a2);
  const Nvfp4LinearScales& linear = q.linear_scales;
  const Tensor sf13 = linear.w13.defined()
                          ? checked_linear_scales(kApi, "linear_scales.w13", linear.w13, e,
                                                  2 * inter, h / kNvfp4BlockSize)
                          : linear_from_mma(kApi, "w13_weight_sf", q.w13_weight_sf, e, 2 * inter,
                                            h / kNvfp4BlockSize);
  const Tensor sf2 =
      linear.w2.defined()
          ? checked_linear_scales(kApi, "linear_scales.w2", linear.w2, e, h,
                                  inter / kNvfp4BlockSize)
          : linear_from_mma(kApi, "w2_weight_sf", q.w2_weight_sf, e, h, inter / kNvfp4BlockSize);
  MOECORE_CHECK(q.local_expert_offset >= 0, kApi, ": expected local_expert_offset >= 0, got ",
                q.local_expert_offset);

  // Input rows.
  const Tensor& x = in.hidden_states;
  MOECORE_CHECK(x.defined() && x.ndim() == 2, kApi, ": expected hidden_states [T, ·], got ",
                x.describe());
  const bool prequantized = flashinfer_a2a && in.hidden_states_scale.defined();
  if (prequantized) {
    check_nvfp4_payload(x, in.hidden_states_scale, {x.size(0)}, h);
    plan.input_scales.emplace(in.hidden_states_scale);
    const uint8_t* xq = x.ptr<uint8_t>();
    const uint8_t* xsf = plan.input_scales->bytes();  // checked by every run before it is read
    plan.load_row = [xq, xsf, h](int64_t t, float* dst) {
      nvfp4_code_values_row(xq + t * (h / 2), xsf + t * (h / kNvfp4BlockSize), h, dst);
    };
  } else {
    MOECORE_CHECK_DTYPE(is_activation_dtype(x.dtype()), kApi,
                        ": expected hidden_states f32, f16 or bf16, got ", x.describe());
    MOECORE_CHECK(x.size(1) == h && x.view().rows_contiguous(), kApi,
                  ": expected hidden_states [T, ", h, "] with contiguous rows, got ", x.describe());
    const TensorView v = x.view();
    plan.load_row = [v, h](int64_t t, float* dst) { load_f32(v.at({t, 0}), v.dtype, h, dst); };
  }

  plan.dispatch = dispatch;
  plan.quant_info = quant_info;
  plan.mlp = cutedsl_mlp(q, s, sf13, sf2, spec, GateUpLayout::kUpGateInterleaved, config);
  if (!prequantized) use_nvfp4_quantizer(plan.mlp.gemm1, config.kernel_level(), a1);
  use_nvfp4_quantizer(plan.mlp.gemm2, config.kernel_level(), a2);
  plan.keep_alive = {sf13, sf2};
  plan.expert_offset = q.local_expert_offset;
  plan.num_local_experts = e;
  plan.id_limit = config.num_experts.value_or(q.local_expert_offset + e);
  plan.allow_invalid_id = in.flashinfer_format;
  return plan;
}

CombineInputPtr run_cutedsl_v2(const DispatchOutputPtr& dispatch, const QuantInfoPtr& quant_info,
                               const MoeRunnerConfig& config, bool flashinfer_a2a) {
  TokenMajorRun call(kApi, cutedsl_v2_plan(dispatch, quant_info, config, flashinfer_a2a, false),
                     shared_workspace());
  call.run();
  return call.combine_input();
}

PreparedRunPtr prepare_cutedsl_v2(const DispatchOutputPtr& dispatch, const QuantInfoPtr& quant_info,
                                  const MoeRunnerConfig& config, MoeA2ABackend a2a) {
  return std::make_unique<TokenMajorRun>(
      kApi, cutedsl_v2_plan(dispatch, quant_info, config, a2a == MoeA2ABackend::FLASHINFER, true),
      std::make_shared<ExpertWorkspace>());
}

// ---------------------------------------------------------------------------------------------
// v1

/// A per-expert f32 scale given as [E] or as one value for all experts; every value finite > 0.
std::vector<float> per_expert_global_scales(const char* what, const Tensor& t, int64_t e) {
  MOECORE_CHECK(t.defined(), kApi, ": expected ", what, " float32 [", e, "], got None");
  MOECORE_CHECK_DTYPE(t.dtype() == DType::kF32, kApi, ": expected ", what, " float32, got ",
                      t.describe());
  MOECORE_CHECK(t.numel() == 1 || (t.ndim() == 1 && t.size(0) == e), kApi, ": expected ", what,
                " [", e, "] (one global scale per local expert) or one value, got ", t.describe());
  std::vector<float> v(static_cast<size_t>(e));
  for (int64_t i = 0; i < e; ++i) {
    v[i] = t.numel() == 1 ? *t.ptr<float>() : t.ptr<float>()[i * t.view().strides[0]];
    check_global_scale(kApi, what, v[i]);
  }
  return v;
}

/// DeepEP's NVFP4 scales as bytes: e4m3/u8 as they are; a wider dtype (DeepEP hands out int32
/// words) is viewed as its bytes, which sglang's .view(torch.float8_e4m3fn) can do only with a
/// unit last stride.
Tensor nvfp4_dispatch_scale_bytes(const Tensor& s) {
  if (dtype_size(s.dtype()) == 1) return s;
  MOECORE_ASSERT(
      s.ndim() >= 1 && s.view().strides[s.ndim() - 1] == 1,
      "NVFP4 dispatch scale has stride(-1)=", s.ndim() >= 1 ? s.view().strides[s.ndim() - 1] : 0,
      ", dtype=", dtype_name(s.dtype()),
      "; .view(float8_e4m3fn) requires stride(-1)==1. Try "
      "SGLANG_MOE_NVFP4_DISPATCH=0 or check DeepEP version.");
  TensorView v = s.view();
  const int64_t width = dtype_size(s.dtype());
  v.shape[v.ndim - 1] *= width;
  for (int i = 0; i < v.ndim - 1; ++i) v.strides[i] *= width;
  v.dtype = DType::kF8E4M3;
  return Tensor(v, s.owner());
}

/// The v1 path prepared for one DeepEPLLDispatchOutput's shapes. Each run() validates masked_m
/// (and, for an NVFP4 payload, the scale bytes of the valid rows) before writing anything, then
/// runs expert e's first masked_m[e] rows through expert e alone (its own activation global
/// scales) and zeroes the rows past them.
class MaskedRun final : public PreparedRun {
 public:
  MaskedRun(const DispatchOutputPtr& dispatch, const QuantInfoPtr& quant_info,
            const MoeRunnerConfig& config, std::shared_ptr<ExpertWorkspace> workspace)
      : PreparedRun(nullptr),
        dispatch_(dispatch),
        quant_info_(quant_info),
        workspace_(std::move(workspace)) {
    MOECORE_CHECK(dispatch != nullptr && quant_info != nullptr, kApi,
                  ": expected a dispatch output and a quant info");
    const ActivationSpec spec = cutedsl_activation(config);
    const CuteDslFp4MoeQuantInfo& q = as_info(quant_info);
    auto* d = dynamic_cast<const DeepEPLLDispatchOutput*>(dispatch.get());
    MOECORE_CHECK_DTYPE(d != nullptr, kApi,
                        ": the v1 path (a2a deepep) takes a DeepEPLLDispatchOutput (DeepEP "
                        "low-latency mode), got format ",
                        to_string(dispatch->format()));
    const Fp4Shapes s = check_fp4_weights(q);
    e_ = s.e;
    h_ = s.h;
    const Nvfp4LinearScales& linear = q.linear_scales;
    const Tensor sf13 = linear.w13.defined()
                            ? checked_linear_scales(kApi, "linear_scales.w13", linear.w13, e_,
                                                    2 * s.inter, h_ / kNvfp4BlockSize)
                            : linear_from_swizzled(kApi, "w13_weight_sf", q.w13_weight_sf, e_,
                                                   2 * s.inter, h_ / kNvfp4BlockSize);
    const Tensor sf2 = linear.w2.defined()
                           ? checked_linear_scales(kApi, "linear_scales.w2", linear.w2, e_, h_,
                                                   s.inter / kNvfp4BlockSize)
                           : linear_from_swizzled(kApi, "w2_weight_sf", q.w2_weight_sf, e_, h_,
                                                  s.inter / kNvfp4BlockSize);
    const std::vector<float> a2 = per_expert_global_scales("a2_scale", q.a2_scale, e_);

    x_ = d->hidden_states;
    MOECORE_CHECK(x_.defined() && x_.ndim() == 3 && x_.size(0) == e_, kApi,
                  ": expected hidden_states [E_local=", e_, ", M, ·] (the masked layout), got ",
                  x_.describe());
    m_cap_ = x_.size(1);
    prequantized_ = d->hidden_states_scale.defined();
    MOECORE_CHECK(
        prequantized_ == q.use_nvfp4_dispatch, kApi,
        ": use_nvfp4_dispatch=", q.use_nvfp4_dispatch ? "True" : "False",
        " but the DeepEP payload ",
        prequantized_ ? "is NVFP4 (hidden_states_scale given)" : "is BF16 (no hidden_states_scale)",
        "; the quant method and the dispatcher must agree");
    std::vector<float> a1;
    if (prequantized_) {
      xs_ = nvfp4_dispatch_scale_bytes(d->hidden_states_scale);
      check_nvfp4_payload(x_, xs_, {e_, m_cap_}, h_);
    } else {
      MOECORE_CHECK_DTYPE(x_.dtype() == DType::kBF16, kApi,
                          ": expected a bf16 DeepEP payload, got ", x_.describe());
      MOECORE_CHECK(x_.size(2) == h_ && x_.view().is_contiguous(), kApi,
                    ": expected contiguous hidden_states [", e_, ", ", m_cap_, ", ", h_, "], got ",
                    x_.describe());
      a1 = per_expert_global_scales("a1_scale", q.a1_scale, e_);
    }
    masked_m_ = d->masked_m;
    MOECORE_CHECK(masked_m_.defined() && masked_m_.dtype() == DType::kI32 &&
                      masked_m_.ndim() == 1 && masked_m_.size(0) == e_,
                  kApi, ": expected masked_m int32 [", e_, "], got ", masked_m_.describe());

    // One MLP per expert: the activation global scales are per expert, so experts run one
    // after another, each over the shared schedule's column blocks.
    const ExpertMlp base = cutedsl_mlp(q, s, sf13, sf2, spec, GateUpLayout::kGateUp, config);
    mlps_.assign(static_cast<size_t>(e_), base);
    for (int64_t i = 0; i < e_; ++i) {
      if (!prequantized_) use_nvfp4_quantizer(mlps_[i].gemm1, config.kernel_level(), a1[i]);
      use_nvfp4_quantizer(mlps_[i].gemm2, config.kernel_level(), a2[i]);
    }
    weight_scales_ = {sf13, sf2};
    counts_.resize(static_cast<size_t>(e_));
    only_.resize(static_cast<size_t>(e_));
    out_ = Tensor::empty({e_, m_cap_, h_}, DType::kBF16);
    auto combine = std::make_shared<DeepEPLLCombineInput>();
    combine->hidden_states = out_;
    combine->topk_ids = d->topk_ids;
    combine->topk_weights = d->topk_weights;
    combine_input_ = combine;
    std::lock_guard<std::mutex> lock(workspace_->mutex);  // a shared workspace may be in use
    workspace_->reserve(base, m_cap_);
  }

  void run() override {
    const TensorView mm = masked_m_.view();
    for (int64_t i = 0; i < e_; ++i) {
      const int64_t m = mm.ptr<int32_t>()[i * mm.strides[0]];
      MOECORE_CHECK(m >= 0 && m <= m_cap_, kApi, ": masked_m[", i, "] must be in [0, ", m_cap_,
                    "], got ", m);
      if (prequantized_ && m > 0)  // only the valid rows: the rest is garbage by contract
        check_block_scale_bytes(kApi, "hidden_states_scale",
                                xs_.view().select(0, i).narrow(0, 0, m));
      counts_[i] = m;
    }
    ExpertWorkspace& ws = *workspace_;
    std::lock_guard<std::mutex> lock(ws.mutex);
    const size_t row_bytes = static_cast<size_t>(h_) * sizeof(uint16_t);
    for (int64_t i = 0; i < e_; ++i) {
      const int64_t count = counts_[i];
      const int64_t base_row = i * m_cap_;
      std::memset(out_.ptr<uint16_t>() + (base_row + count) * h_, 0,
                  static_cast<size_t>(m_cap_ - count) * row_bytes);  // rows past masked_m[i]
      if (count == 0) continue;
      // Rows 0..masked_m[i] of expert i alone: its slice of the masked layout in and out.
      std::fill(only_.begin(), only_.end(), 0);
      only_[i] = count;
      ws.rows.sorted_rows(only_.data(), e_);
      auto load = [&](int64_t r, float* dst) {
        const int64_t row = base_row + r;
        if (prequantized_)
          nvfp4_code_values_row(x_.ptr<uint8_t>() + row * (h_ / 2),
                                xs_.ptr<uint8_t>() + row * (h_ / kNvfp4BlockSize), h_, dst);
        else
          load_f32(x_.ptr<uint16_t>() + row * h_, DType::kBF16, h_, dst);
      };
      run_expert_mlp(mlps_[i], ws, load, RowScaleAt::kNone, out_.view().select(0, i));
    }
  }

 private:
  DispatchOutputPtr dispatch_;  // keeps the dispatch output alive
  QuantInfoPtr quant_info_;     // keeps the weights alive
  Tensor x_, xs_, masked_m_, out_;
  std::vector<Tensor> weight_scales_;  // the linear block scales the MLPs point into
  std::vector<ExpertMlp> mlps_;        // per expert: its activation global scales
  std::vector<int64_t> counts_, only_;
  int64_t e_ = 0, h_ = 0, m_cap_ = 0;
  bool prequantized_ = false;
  std::shared_ptr<ExpertWorkspace> workspace_;
};

CombineInputPtr run_cutedsl_v1(const DispatchOutputPtr& dispatch, const QuantInfoPtr& quant_info,
                               const MoeRunnerConfig& config) {
  MaskedRun call(dispatch, quant_info, config, shared_workspace());
  call.run();
  return call.combine_input();
}

PreparedRunPtr prepare_cutedsl_v1(const DispatchOutputPtr& dispatch, const QuantInfoPtr& quant_info,
                                  const MoeRunnerConfig& config, MoeA2ABackend) {
  return std::make_unique<MaskedRun>(dispatch, quant_info, config,
                                     std::make_shared<ExpertWorkspace>());
}

CombineInputPtr fused_none_to_flashinfer_cutedsl(const DispatchOutputPtr& d, const QuantInfoPtr& q,
                                                 const MoeRunnerConfig& config) {
  return run_cutedsl_v2(d, q, config, /*flashinfer_a2a=*/false);
}

CombineInputPtr fused_flashinfer_to_flashinfer_cutedsl(const DispatchOutputPtr& d,
                                                       const QuantInfoPtr& q,
                                                       const MoeRunnerConfig& config) {
  return run_cutedsl_v2(d, q, config, /*flashinfer_a2a=*/true);
}

}  // namespace

MOECORE_REGISTER_FUSED_FUNC(NONE, FLASHINFER_CUTEDSL, fused_none_to_flashinfer_cutedsl);
MOECORE_REGISTER_FUSED_FUNC(FLASHINFER, FLASHINFER_CUTEDSL, fused_flashinfer_to_flashinfer_cutedsl);
MOECORE_REGISTER_FUSED_FUNC(DEEPEP, FLASHINFER_CUTEDSL, run_cutedsl_v1);
MOECORE_REGISTER_PREPARED_RUN(STANDARD, FLASHINFER_CUTEDSL, prepare_cutedsl_v2);
MOECORE_REGISTER_PREPARED_RUN(FLASHINFER, FLASHINFER_CUTEDSL, prepare_cutedsl_v2);
MOECORE_REGISTER_PREPARED_RUN(DEEPEP_LL, FLASHINFER_CUTEDSL, prepare_cutedsl_v1);

}  // namespace moecore
