// Runner backend "flashinfer_mxfp4" (sglang moe_runner/flashinfer_mxfp4.py): FlashInfer's SM90
// cutlass_fused_moe(use_w4_group_scaling=True), W4A16 MXFP4, for GPT-OSS and DSv4 experts.
// Registers: fused func (none, flashinfer_mxfp4) and its prepared run (standard,
// flashinfer_mxfp4) — fused-only, no runner core, no permutes. The fused func is that prepared
// run built and run once, so both give the same bits by construction. The MLP runs on
// expert_compute's static schedule: no permuted copy of the input, the activation in GEMM1's
// epilogue, b2 and the routed weight in the top-k sum of GEMM2's epilogue. The GEMMs stream the
// weights' kernel layout (Mxfp4KernelLayout: deinterleaved packed bytes, linear E8M0 scales)
// through the shared scaled-GEMM table as WeightCoding::kMxfp4, decoded in registers; the layout
// is the quant info's kernel_layout (made by the quant method; shapes checked) when defined,
// else derived from the contract layout (once per prepared run; an eager call derives it per
// call). The contract scales stay the ones a call validates (0xFF): each GEMM1 work item checks
// the 64-row tiles it reads and its share of GEMM2's before GEMM2 writes anything, so a scale
// overwritten after processing still raises and leaves the output as it was.
// Payload: FlashInferMxfp4CutlassMoeQuantInfo (anything else is a TypeError).
//
// Numeric contract (per (token, slot) routed to a local expert e; N = fc1 half width, K = hidden):
//   weights: W = e2m1 · 2^(s − 127) per 32-block, exact in fp32 (the kMxfp4 operand folds the
//     E8M0 scale into the codes; one K block, weight scale 1); activations stay bf16 (no
//     quantization), so the kernel row may multiply them in bf16 (bf16_exact).
//   GEMM1: h1 = bf16(fp32 Σ_k x[k]·W13[n, k] + b13[n]) — fp32 accumulation in the kernel row's
//     order (canonical, kernels/gemm.h, up to avx512; the avx512_bf16 and amx rows sum in their
//     instructions' order), bias (bf16 → fp32) added in fp32, ONE rounding to bf16 (the stored
//     fc1 output). Rows [0, N) of fc1 are `up`, rows [N, 2N) are `gate` (halved [up; gate]).
//   activation (fp32, one rounding to bf16): with swiglu tensors g = min(gate, L[e]),
//     u = clamp(up, −L[e], L[e]), h2 = bf16(g · σ(α[e]·g) · (u + β[e])), σ(z) = 1/(1 + exp(−z));
//     without them h2 = bf16(silu(gate) · up) (the activation table's rows: kernels/activation.h).
//   GEMM2: y = bf16(fp32 Σ_n h2[n]·W2[h, n]) — no bias yet (one row per (token, slot)).
//   finalize (TRT-LLM's unfused finalizeMoeRouting): out[t, h] = bf16(Σ_j w_j · (y_j[h] + b2[h]))
//     in fp32, slots j in increasing order, starting from +0; the routed weight applies exactly
//     once here. routed_scaling_factor is NOT applied (sglang passes none to the kernel; layers
//     fold it into the top-k weights). Output bf16 [T, K], trimmed by the fused func.
// The fused func: R9 (T = 0 returns hidden_states unchanged after validating the payload, no
// kernel), R8 (bypassed top-k → to_standard(); a prepared run rejects it, as it would route on
// every call), zero-pads x on the right to padded_hidden when set and different, and finalizes
// only the input's width into a [T, H] output (the trim). tp size/rank do not change a rank's
// math (weights arrive sharded; the caller reduces); ids are global, only
// [ep_rank·E, (ep_rank+1)·E) count. R15: apply_router_weight_on_input is rejected.
// Deviations from sglang: activations other than gated silu and no_combine are rejected (sglang's
// kernel would silently run SwiGLU and sum); E8M0 0xFF scales are errors, not NaN outputs.
#include "moecore/runner/backends/flashinfer_mxfp4.h"

#include <cstring>
#include <memory>
#include <mutex>
#include <variant>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/core/thread_pool.h"
#include "moecore/formats/e8m0.h"
#include "moecore/formats/layout.h"
#include "moecore/kernels/activation.h"
#include "moecore/kernels/quant_gemm.h"
#include "moecore/quant/quant_info.h"
#include "moecore/runner/backends/flashinfer_moe_common.h"
#include "moecore/runner/expert_compute.h"
#include "moecore/runner/registry.h"

namespace moecore {
namespace {

constexpr const char* kApi = "cutlass_fused_moe_mxfp4(flashinfer_mxfp4)";
constexpr int64_t kMxBlock = 32;     // MXFP4 group size along K
constexpr int64_t kTile = 64;        // weight rows per work item (one folded scale row tile)
constexpr int64_t kSm90Align = 128;  // N and K of the SM90 layout

bool is_packed_fp4(DType d) { return d == DType::kU8 || d == DType::kFp4E2M1x2; }
bool is_e8m0_bytes(DType d) { return d == DType::kU8 || d == DType::kE8M0; }

void check_packed(const Tensor& w, const char* name, const std::vector<int64_t>& shape) {
  MOECORE_CHECK(w.defined(), kApi, ": ", name, " is required");
  MOECORE_CHECK_DTYPE(is_packed_fp4(w.dtype()), kApi, ": expected ", name,
                      " packed e2m1 (uint8), got ", w.describe());
  MOECORE_CHECK(w.view().shape_vector() == shape, kApi, ": expected ", name, " ",
                shape_string(shape), ", got ", w.describe());
  MOECORE_CHECK(w.view().is_contiguous(), kApi, ": ", name, " must be contiguous");
}

void check_folded_scale(const Tensor& s, const char* name, int64_t experts, int64_t rows,
                        int64_t k) {
  const std::vector<int64_t> shape = {experts, rows / kSm90ScaleRowTile, k / kSm90Align,
                                      kSm90ScaleFoldedM, kSm90ScaleCols};
  MOECORE_CHECK(s.defined(), kApi, ": ", name, " is required");
  MOECORE_CHECK_DTYPE(is_e8m0_bytes(s.dtype()), kApi, ": expected ", name,
                      " E8M0 bytes (uint8), got ", s.describe());
  MOECORE_CHECK(s.view().shape_vector() == shape, kApi, ": expected ", name,
                " in the SM90-folded layout of interleave_moe_scales_for_sm90_mixed_gemm ",
                shape_string(shape), ", got ", s.describe());
  MOECORE_CHECK(s.view().is_contiguous(), kApi, ": ", name, " must be contiguous");
}

void check_vector(const Tensor& t, const char* name, DType dtype,
                  const std::vector<int64_t>& shape) {
  if (!t.defined()) return;
  MOECORE_CHECK_DTYPE(t.dtype() == dtype, kApi, ": expected ", name, " ", dtype_name(dtype),
                      ", got ", t.describe());
  MOECORE_CHECK(t.view().shape_vector() == shape && t.view().is_contiguous(), kApi,
                ": expected contiguous ", name, " ", shape_string(shape), ", got ", t.describe());
}

/// One MXFP4 weight of the MLP, [E, R, C] logical. The contract: packed e2m1 [E, R, C/2] in the
/// SM90-interleaved order with folded E8M0 scales [E, R/64, C/128, 16, 16] (validated by every
/// call). `kernel`: the kMxfp4 operand over the kernel layout of the same weights (deinterleaved
/// bytes [E, R, C/2], linear scales [E, R, C/32]); its data is null until attach_kernel_layout.
struct Sm90Weight {
  TensorView packed, folded_scale;
  const char* scale_name = "";
  WeightOperand kernel;
};

/// The kMxfp4 operand of a contract weight, without data yet (its shape is all that
/// gemm_scratch_bytes reads).
WeightOperand kernel_operand_shape(const TensorView& packed) {
  WeightOperand w;
  w.coding = WeightCoding::kMxfp4;
  w.num_experts = packed.shape[0];
  w.n = packed.shape[1];
  w.k = packed.shape[2] * 2;
  return w;  // block_n = block_k = 0: one K block, the E8M0 scales fold into the codes
}

Sm90Weight sm90_weight(const TensorView& packed, const TensorView& folded_scale,
                       const char* scale_name) {
  return {packed, folded_scale, scale_name, kernel_operand_shape(packed)};
}

/// The validated payload of a call: everything that depends on the weights alone, as views of
/// the caller's tensors (which must outlive it), and the kernel row.
struct Mxfp4Moe {
  int64_t experts = 0, n = 0, k = 0;
  int64_t first_expert = 0, global_experts = 0;  // this EP rank owns ids [first, first + E)
  Sm90Weight w13, w2;
  TensorView w13_bias, w2_bias;  // bf16 [E, 2N] and [E, K]; data == nullptr when absent
  TensorView swiglu_alpha, swiglu_beta, swiglu_limit;  // f32 [E]; data == nullptr when absent
  ScaledGemmFn gemm = nullptr;
};

/// The validated shapes of a call's tokens; the id values are checked by run_moe on every call.
struct Mxfp4Tokens {
  TensorView x;             // bf16 [T, K], rows contiguous
  TensorView ids, weights;  // i32/i64 [T, k] and f32 [T, k]
  int64_t tokens = 0, top_k = 0;
};

TensorView view_or_none(const Tensor& t) { return t.defined() ? t.view() : TensorView{}; }

Mxfp4Moe check_moe(const Mxfp4CutlassMoeArgs& a, ScaledGemmFn gemm) {
  MOECORE_CHECK(a.w13.defined() && a.w2.defined(), kApi,
                ": fc1_expert_weights and fc2_expert_weights are required");
  MOECORE_CHECK(a.w13.ndim() == 3 && a.w2.ndim() == 3, kApi,
                ": expected w13_weight [E, 2N, K/2] and w2_weight [E, K, N/2], got ",
                a.w13.describe(), " and ", a.w2.describe());
  Mxfp4Moe m;
  m.experts = a.w13.size(0);
  m.n = a.w13.size(1) / 2;
  m.k = a.w13.size(2) * 2;
  MOECORE_CHECK(m.experts > 0 && m.n > 0 && m.k > 0 && a.w13.size(1) % 2 == 0, kApi,
                ": expected w13_weight [E, 2N, K/2] with E, N, K > 0, got ", a.w13.describe());
  MOECORE_CHECK(m.n % kSm90Align == 0 && m.k % kSm90Align == 0, kApi,
                ": expected N and K multiples of 128 (the SM90 mixed-GEMM layout; pad with the "
                "quant method), got N = ",
                m.n, ", K = ", m.k);
  check_packed(a.w13, "w13_weight", {m.experts, 2 * m.n, m.k / 2});
  check_packed(a.w2, "w2_weight", {m.experts, m.k, m.n / 2});
  check_folded_scale(a.w13_scale, "w13_weight_scale", m.experts, 2 * m.n, m.k);
  check_folded_scale(a.w2_scale, "w2_weight_scale", m.experts, m.k, m.n);
  check_vector(a.w13_bias, "w13_bias", DType::kBF16, {m.experts, 2 * m.n});
  check_vector(a.w2_bias, "w2_bias", DType::kBF16, {m.experts, m.k});
  const int given = a.swiglu_alpha.defined() + a.swiglu_beta.defined() + a.swiglu_limit.defined();
  MOECORE_CHECK(given == 0 || given == 3, kApi,
                ": swiglu_alpha, swiglu_beta and swiglu_limit go together (all or none), got ",
                given, " of 3");
  check_vector(a.swiglu_alpha, "swiglu_alpha", DType::kF32, {m.experts});
  check_vector(a.swiglu_beta, "swiglu_beta", DType::kF32, {m.experts});
  check_vector(a.swiglu_limit, "swiglu_limit", DType::kF32, {m.experts});
  MOECORE_CHECK(a.tp_size >= 1 && a.ep_size >= 1, kApi, ": expected tp_size, ep_size >= 1, got ",
                a.tp_size, " and ", a.ep_size);
  MOECORE_CHECK_INDEX(
      a.tp_rank >= 0 && a.tp_rank < a.tp_size && a.ep_rank >= 0 && a.ep_rank < a.ep_size, kApi,
      ": rank out of range (tp ", a.tp_rank, "/", a.tp_size, ", ep ", a.ep_rank, "/", a.ep_size,
      ")");
  m.first_expert = a.ep_rank * m.experts;
  m.global_experts = m.experts * a.ep_size;
  m.w13 = sm90_weight(a.w13.view(), a.w13_scale.view(), "w13_weight_scale");
  m.w2 = sm90_weight(a.w2.view(), a.w2_scale.view(), "w2_weight_scale");
  m.w13_bias = view_or_none(a.w13_bias);
  m.w2_bias = view_or_none(a.w2_bias);
  m.swiglu_alpha = view_or_none(a.swiglu_alpha);
  m.swiglu_beta = view_or_none(a.swiglu_beta);
  m.swiglu_limit = view_or_none(a.swiglu_limit);
  m.gemm = gemm;
  return m;
}

Mxfp4Tokens check_tokens(const Mxfp4Moe& m, const Mxfp4CutlassMoeArgs& a) {
  const Tensor& x = a.input;
  MOECORE_CHECK(x.defined(), kApi, ": input is required");
  MOECORE_CHECK_DTYPE(x.dtype() == DType::kBF16, kApi,
                      ": expected input bf16 (W4A16: bf16 activations), got ", x.describe());
  MOECORE_CHECK(x.ndim() == 2 && x.size(1) == m.k, kApi, ": expected input [T, ", m.k,
                "] (the weights' K; pad it first), got ", x.describe());
  MOECORE_CHECK(x.view().rows_contiguous(), kApi, ": input rows must be contiguous");
  Mxfp4Tokens in;
  in.tokens = x.size(0);
  const Tensor& ids = a.topk_ids;
  const Tensor& wts = a.topk_weights;
  MOECORE_CHECK(ids.defined() && wts.defined(), kApi, ": topk_ids and topk_weights are required");
  MOECORE_CHECK_DTYPE(ids.dtype() == DType::kI32 || ids.dtype() == DType::kI64, kApi,
                      ": topk_ids must be int32 or int64, got ", ids.describe());
  MOECORE_CHECK_DTYPE(wts.dtype() == DType::kF32, kApi, ": topk_weights must be float32, got ",
                      wts.describe());
  MOECORE_CHECK(ids.ndim() == 2 && ids.size(0) == in.tokens && ids.size(1) >= 1, kApi,
                ": expected topk_ids [", in.tokens, ", k] with k >= 1, got ", ids.describe());
  MOECORE_CHECK(wts.view().shape_vector() == ids.view().shape_vector(), kApi,
                ": topk_weights shape must equal topk_ids', got ", wts.describe(), " and ",
                ids.describe());
  in.top_k = ids.size(1);
  in.x = x.view();
  in.ids = ids.view();
  in.weights = wts.view();
  return in;
}

/// One tensor of a quant info's kernel_layout, checked against the contract's shapes.
void check_kernel_tensor(const Tensor& t, const char* name, bool scale,
                         const std::vector<int64_t>& shape) {
  MOECORE_CHECK(t.defined(), kApi, ": ", name,
                " is required (kernel_layout is all four tensors or none)");
  MOECORE_CHECK_DTYPE(scale ? is_e8m0_bytes(t.dtype()) : is_packed_fp4(t.dtype()), kApi,
                      ": expected ", name, scale ? " E8M0 bytes (uint8)" : " packed e2m1 (uint8)",
                      ", got ", t.describe());
  MOECORE_CHECK(t.view().shape_vector() == shape && t.view().is_contiguous(), kApi, ": expected ",
                name, " contiguous ", shape_string(shape),
                scale ? " (the linear E8M0 scales of the contract weights)"
                      : " (the deinterleaved bytes of the contract weights)",
                ", got ", t.describe());
}

bool has_kernel_layout(const Mxfp4KernelLayout& l) {
  return l.w13_weight.defined() || l.w13_weight_scale.defined() || l.w2_weight.defined() ||
         l.w2_weight_scale.defined();
}

/// A quant info's kernel_layout (has_kernel_layout), checked against m's contract shapes.
void check_kernel_layout(const Mxfp4Moe& m, const Mxfp4KernelLayout& l) {
  const int64_t e = m.experts, n = m.n, k = m.k;
  check_kernel_tensor(l.w13_weight, "kernel_layout.w13_weight", false, {e, 2 * n, k / 2});
  check_kernel_tensor(l.w13_weight_scale, "kernel_layout.w13_weight_scale", true,
                      {e, 2 * n, k / kMxBlock});
  check_kernel_tensor(l.w2_weight, "kernel_layout.w2_weight", false, {e, k, n / 2});
  check_kernel_tensor(l.w2_weight_scale, "kernel_layout.w2_weight_scale", true,
                      {e, k, n / kMxBlock});
}

/// The kernel layout of m's weights derived from the contract layout (the SM90 interleave and
/// fold undone; validated views, so the transforms cannot fail): what a quant info built by hand
/// runs on.
Mxfp4KernelLayout derive_kernel_layout(const Mxfp4Moe& m) {
  auto as_u8 = [](TensorView v) {
    v.dtype = DType::kU8;
    return v;
  };
  Mxfp4KernelLayout made;
  made.w13_weight = deinterleave_moe_weights_for_sm90_mixed_gemm(as_u8(m.w13.packed), "fp4");
  made.w13_weight_scale =
      deinterleave_moe_scales_for_sm90_mixed_gemm(as_u8(m.w13.folded_scale), kMxBlock);
  made.w2_weight = deinterleave_moe_weights_for_sm90_mixed_gemm(as_u8(m.w2.packed), "fp4");
  made.w2_weight_scale =
      deinterleave_moe_scales_for_sm90_mixed_gemm(as_u8(m.w2.folded_scale), kMxBlock);
  return made;
}

/// Points the kernel operands of m at `layout` (which must outlive m's runs).
void attach_kernel_layout(Mxfp4Moe& m, const Mxfp4KernelLayout& layout) {
  auto attach = [](Sm90Weight& w, const Tensor& packed, const Tensor& scale) {
    const int64_t e = w.kernel.num_experts, r = w.kernel.n, c = w.kernel.k;
    MOECORE_INTERNAL_CHECK(
        packed.view().shape_vector() == (std::vector<int64_t>{e, r, c / 2}) &&
            scale.view().shape_vector() == (std::vector<int64_t>{e, r, c / kMxBlock}) &&
            packed.view().is_contiguous() && scale.view().is_contiguous(),
        "mxfp4 kernel layout ", packed.describe(), " and ", scale.describe(), " for [", e, ", ", r,
        ", ", c, "] weights");
    w.kernel.data = packed.view();
    w.kernel.scale = scale.view();
    w.kernel.data.dtype = w.kernel.scale.dtype = DType::kU8;  // kFp4E2M1x2 / kE8M0 tags too
  };
  attach(m.w13, layout.w13_weight, layout.w13_weight_scale);
  attach(m.w2, layout.w2_weight, layout.w2_weight_scale);
}

/// The workspace eager calls share (the op and the fused func; they take turns), so that a
/// steady state allocates only its output and local ids: a fresh one per call would allocate
/// and zero every thread's kernel scratch.
const std::shared_ptr<ExpertWorkspace>& eager_workspace() {
  static const auto workspace = std::make_shared<ExpertWorkspace>();
  return workspace;
}

/// Checks the contract scales of rows [r0, r0 + kTile) of expert e (one contiguous folded row
/// tile of 64 · C/32 bytes) for the E8M0 NaN code; names the first such (row, K block).
void check_tile_scales(const Sm90Weight& w, int64_t e, int64_t r0) {
  const int64_t rows = w.packed.shape[1], c = w.packed.shape[2] * 2;
  const int64_t kb128 = c / kSm90Align, gpk = kSm90Align / kMxBlock;
  const uint8_t* tile = static_cast<const uint8_t*>(w.folded_scale.data) +
                        (e * (rows / kSm90ScaleRowTile) + r0 / kSm90ScaleRowTile) * kb128 *
                            kSm90ScaleFoldedM * kSm90ScaleCols;
  const size_t bytes = static_cast<size_t>(kb128 * kSm90ScaleFoldedM * kSm90ScaleCols);
  if (std::memchr(tile, kE8M0NaN, bytes) == nullptr) return;
  for (int64_t i = 0; i < kTile; ++i) {
    const int64_t slice = i / kSm90ScaleFoldedM, f = i % kSm90ScaleFoldedM;
    for (int64_t b = 0; b < c / kMxBlock; ++b) {
      const uint8_t code =
          tile[((b / gpk) * kSm90ScaleFoldedM + f) * kSm90ScaleCols + slice * gpk + b % gpk];
      MOECORE_CHECK(code != kE8M0NaN, kApi, ": ", w.scale_name,
                    " holds the E8M0 NaN code 0xFF (expert ", e, ", row ", r0 + i, ", K block ", b,
                    ")");
    }
  }
}

/// GEMM1's item check (ExpertMlp::check_gemm1_item): the contract scales of the weight tiles an
/// item's GEMM1 columns read (the up and gate rows of its activation columns), and its share of
/// the expert's GEMM2 tiles. An expert's items cover its activation columns [0, N), so their
/// shares cover every GEMM2 tile, all checked before GEMM2 writes anything. A tile that two
/// items' columns touch is checked by both.
struct ContractScaleCheck {
  Sm90Weight w13, w2;
  int64_t n = 0;

  void operator()(int64_t e, int64_t col0, int64_t cols) const {
    for (const int64_t half : {int64_t{0}, n})  // fc1 rows [0, N) are up, [N, 2N) gate
      for (int64_t r = (half + col0) / kTile * kTile; r < half + col0 + cols; r += kTile)
        check_tile_scales(w13, e, r);
    const int64_t tiles2 = w2.packed.shape[1] / kTile;
    for (int64_t t = col0 * tiles2 / n; t < (col0 + cols) * tiles2 / n; ++t)
      check_tile_scales(w2, e, t * kTile);
  }
};

/// The contract's MLP on the shared static schedule (expert_compute.h), over m's attached
/// kernel layout: GEMM1 on the kMxfp4 operand + b13, rounded to bf16, with the activation (the
/// expert's swiglu when given) in its epilogue; GEMM2 without bias, rounded to bf16. b2 and the
/// routed weight come in the top-k sum (run_moe).
ExpertMlp mxfp4_mlp(const Mxfp4Moe& m) {
  ExpertMlp mlp;
  mlp.gemm1.weight = m.w13.kernel;
  mlp.gemm1.bias = m.w13_bias;
  mlp.gemm2.weight = m.w2.kernel;
  mlp.activation.layout = GateUpLayout::kUpGate;
  mlp.expert_alpha = m.swiglu_alpha;
  mlp.expert_beta = m.swiglu_beta;
  mlp.expert_limit = m.swiglu_limit;
  mlp.check_gemm1_item = ContractScaleCheck{m.w13, m.w2, m.n};
  mlp.act_dtype = DType::kBF16;
  mlp.gemm = m.gemm;
  mlp.hidden = m.k;
  mlp.inter = m.n;
  return mlp;
}

/// The MoE of the contract into out (bf16 [T, W], rows contiguous, W ≤ K: the first W columns
/// of each token's result). Checks the ids first (every id in [-1, E·ep_size)) and writes the
/// call's local ids into `local_ids` (i32 [T, k]: this rank's experts, else −1); allocates
/// nothing when ws is reserved for T·k rows of `mlp`. The caller holds ws.mutex.
void run_moe(const Mxfp4Moe& m, const ExpertMlp& mlp, const Mxfp4Tokens& in,
             const TensorView& local_ids, ExpertWorkspace& ws, const TensorView& out) {
  flashinfer_detail::localize_expert_ids(kApi, in.ids, m.first_expert, m.experts,
                                         m.global_experts, /*allow_invalid_id=*/false,
                                         local_ids.ptr<int32_t>());
  RoutedTokens tokens;
  tokens.x = in.x;
  tokens.topk_ids = local_ids;
  tokens.topk_weights = in.weights;
  tokens.num_tokens = in.tokens;
  tokens.top_k = in.top_k;
  ws.rows.group_slots(tokens, m.experts, /*with_scale=*/false);
  expert_gemm1_phase(mlp, ws, token_rows(tokens), RowScaleAt::kNone);
  // Finalize: Σ_j w_j · (y_j + b2) in fp32, slot order, one bf16 rounding.
  expert_gemm2_summed_phase(mlp, ws, RowScaleAt::kNone,
                            TopkSum{&tokens, /*weighted=*/true, 1.0f, out, m.w2_bias});
}

}  // namespace

Tensor dequantize_sm90_mxfp4(const TensorView& weight, const TensorView& folded_scale) {
  constexpr const char* api = "dequantize_sm90_mxfp4";
  MOECORE_CHECK_DTYPE(is_packed_fp4(weight.dtype), api, ": expected packed e2m1 (uint8), got ",
                      weight.describe());
  MOECORE_CHECK(weight.ndim == 3, api, ": expected weight [E, R, C/2], got ", weight.describe());
  const int64_t experts = weight.shape[0], rows = weight.shape[1], c = weight.shape[2] * 2;
  MOECORE_CHECK(rows % kSm90ScaleRowTile == 0 && c % kSm90Align == 0 && rows > 0 && c > 0, api,
                ": expected R a multiple of 64 and C of 128, got R = ", rows, ", C = ", c);
  MOECORE_CHECK(weight.is_contiguous(), api, ": weight must be contiguous");
  const std::vector<int64_t> shape = {experts, rows / kSm90ScaleRowTile, c / kSm90Align,
                                      kSm90ScaleFoldedM, kSm90ScaleCols};
  MOECORE_CHECK_DTYPE(is_e8m0_bytes(folded_scale.dtype), api, ": expected E8M0 bytes, got ",
                      folded_scale.describe());
  MOECORE_CHECK(folded_scale.shape_vector() == shape && folded_scale.is_contiguous(), api,
                ": expected contiguous folded scales ", shape_string(shape), ", got ",
                folded_scale.describe());
  // The kernel layout and the kernel table's own row decoder (decode_weight_row).
  Sm90Weight w = sm90_weight(weight, folded_scale, "scale");
  const int64_t tiles = rows / kTile;
  for (int64_t it = 0; it < experts * tiles; ++it)
    check_tile_scales(w, it / tiles, (it % tiles) * kTile);
  TensorView packed = weight, scale = folded_scale;
  packed.dtype = scale.dtype = DType::kU8;
  const Tensor plain = deinterleave_moe_weights_for_sm90_mixed_gemm(packed, "fp4");
  const Tensor linear = deinterleave_moe_scales_for_sm90_mixed_gemm(scale, kMxBlock);
  w.kernel.data = plain.view();
  w.kernel.scale = linear.view();
  Tensor out = Tensor::empty({experts, rows, c}, DType::kF32);
  parallel_for(experts * rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float unit_scale;  // kMxfp4 folds its scales into the codes
      decode_weight_row(w.kernel, r / rows, r % rows, out.ptr<float>() + r * c, &unit_scale);
    }
  });
  return out;
}

Tensor cutlass_fused_moe_mxfp4(const Mxfp4CutlassMoeArgs& a, ScaledGemmFn gemm) {
  Mxfp4Moe m = check_moe(a, gemm);
  const Mxfp4Tokens in = check_tokens(m, a);
  Tensor out = Tensor::empty({in.tokens, m.k}, DType::kBF16);
  if (in.tokens == 0) return out;
  const Mxfp4KernelLayout layout = derive_kernel_layout(m);
  attach_kernel_layout(m, layout);
  const ExpertMlp mlp = mxfp4_mlp(m);
  const Tensor local_ids = Tensor::empty({in.tokens, in.top_k}, DType::kI32);
  ExpertWorkspace& ws = *eager_workspace();
  std::lock_guard<std::mutex> lock(ws.mutex);
  ws.reserve(mlp, in.tokens * in.top_k);
  run_moe(m, mlp, in, local_ids.view(), ws, out.view());
  return out;
}

namespace {

const FlashInferMxfp4CutlassMoeQuantInfo& as_mxfp4_info(const QuantInfoPtr& q) {
  auto* info = dynamic_cast<const FlashInferMxfp4CutlassMoeQuantInfo*>(q.get());
  if (info == nullptr)
    MOECORE_THROW(DTypeError, "Unexpected quant_info type for flashinfer_mxfp4: ", q->name());
  return *info;
}

/// x (bf16 [T, W], any strides) into the first W columns of the contiguous zero-padded input
/// [T, K]; the other columns were zeroed once and are never written.
void copy_into_padded(const TensorView& x, const TensorView& padded) {
  constexpr size_t kBf16Bytes = 2;
  const int64_t width = x.shape[1];
  for (int64_t t = 0; t < x.shape[0]; ++t) {
    char* dst = static_cast<char*>(padded.at({t, 0}));
    if (x.strides[1] == 1 && width > 0) {
      std::memcpy(dst, x.at({t, 0}), static_cast<size_t>(width) * kBf16Bytes);
    } else {
      for (int64_t h = 0; h < width; ++h)
        std::memcpy(dst + h * kBf16Bytes, x.at({t, h}), kBf16Bytes);
    }
  }
}

/// Whose call a Mxfp4FusedRun serves: the fused func's single eager call, or MoeRunner::prepare
/// (materialised routing only). Both run the same code on the same kernel layout.
enum class RunKind { kEagerCall, kPrepared };

/// The (none, flashinfer_mxfp4) fused func for one dispatch output's shapes: R15/R8 checks,
/// payload validation (kernel_layout included), the kernel layout (the quant info's, else
/// derived), padding buffer, output and workspace at construction; run() pads the current hidden
/// states, checks the current ids, computes and trims into the output.
class Mxfp4FusedRun : public PreparedRun {
 public:
  /// `workspace`: shared by the calls that reuse it (eager calls share one), or this run's own.
  Mxfp4FusedRun(const DispatchOutputPtr& dispatch, const QuantInfoPtr& quant_info,
                const MoeRunnerConfig& config, RunKind kind,
                std::shared_ptr<ExpertWorkspace> workspace)
      : PreparedRun(nullptr),
        dispatch_(dispatch),
        quant_info_(quant_info),
        ws_(std::move(workspace)),
        eager_(kind == RunKind::kEagerCall) {
    const FlashInferMxfp4CutlassMoeQuantInfo& q = as_mxfp4_info(quant_info);
    constexpr const char* api = "MoeRunner(flashinfer_mxfp4)";
    const ActivationSpec spec = activation_spec(config, api);  // R15: unknown activations
    MOECORE_CHECK(spec.kind == Activation::SILU && spec.gated, api,
                  ": the kernel runs SwiGLU only (activation 'silu', is_gated=True), got "
                  "activation='",
                  config.activation, "', is_gated=", config.is_gated ? "True" : "False");
    MOECORE_ASSERT(!config.apply_router_weight_on_input,
                   "apply_router_weight_on_input is not supported for Flashinfer");
    MOECORE_CHECK(!config.no_combine, api,
                  ": no_combine is not supported (the kernel always sums over top-k)");
    auto* d = dynamic_cast<const StandardDispatchOutput*>(dispatch.get());
    MOECORE_CHECK_DTYPE(d != nullptr, api, ": expected a StandardDispatchOutput");
    if (kind == RunKind::kPrepared) {
      const auto* standard = std::get_if<StandardTopKOutput>(&d->topk_output);
      if (standard == nullptr)
        MOECORE_UNSUPPORTED(api,
                            ": prepare needs materialised routing (a StandardTopKOutput); a "
                            "BypassedTopKOutput routes on every call, which a prepared run "
                            "cannot replay");
      topk_ = *standard;
    } else {
      topk_ = to_standard(d->topk_output);  // R8
    }
    x_ = d->hidden_states;
    MOECORE_CHECK(x_.defined() && x_.ndim() == 2, api, ": expected hidden_states [T, H], got ",
                  x_.describe());
    const int64_t origin_hidden = x_.size(1);
    const bool do_pad = q.padded_hidden && *q.padded_hidden != origin_hidden;
    MOECORE_CHECK(!do_pad || *q.padded_hidden > origin_hidden, api, ": padded_hidden (",
                  q.padded_hidden.value_or(0), ") must be at least hidden_states' width (",
                  origin_hidden, ")");

    Mxfp4CutlassMoeArgs args;
    args.topk_ids = topk_.topk_ids;
    args.topk_weights = topk_.topk_weights;
    args.w13 = q.w13_weight;
    args.w2 = q.w2_weight;
    args.w13_scale = q.w13_weight_scale;
    args.w2_scale = q.w2_weight_scale;
    args.w13_bias = q.w13_bias;
    args.w2_bias = q.w2_bias;
    args.swiglu_alpha = q.swiglu_alpha;
    args.swiglu_beta = q.swiglu_beta;
    args.swiglu_limit = q.swiglu_limit;
    args.tp_size = q.moe_tp_size;
    args.tp_rank = q.moe_tp_rank;
    args.ep_size = q.moe_ep_size;
    args.ep_rank = q.moe_ep_rank;
    const int64_t tokens = x_.size(0);
    if (do_pad) {
      MOECORE_CHECK_DTYPE(x_.dtype() == DType::kBF16, kApi,
                          ": expected input bf16 (W4A16: bf16 activations), got ", x_.describe());
      padded_ = Tensor::zeros({tokens, *q.padded_hidden}, DType::kBF16);
      args.input = padded_;
    } else {
      args.input = x_;
    }
    moe_ = check_moe(args, config.gemm_kernel());
    tokens_ = check_tokens(moe_, args);
    const bool given_layout = has_kernel_layout(q.kernel_layout);
    if (given_layout) check_kernel_layout(moe_, q.kernel_layout);  // part of the payload (R9 too)
    if (tokens == 0) {  // R9: validated; the combine input is hidden_states, no kernel runs
      combine_input_ = std::make_shared<StandardCombineInput>(x_);
      return;
    }
    const Tensor out = Tensor::empty({tokens, origin_hidden}, DType::kBF16);
    out_ = out.view();
    combine_input_ = std::make_shared<StandardCombineInput>(out);
    kernel_layout_ = given_layout ? q.kernel_layout : derive_kernel_layout(moe_);
    attach_kernel_layout(moe_, kernel_layout_);
    attach_weight_tiles(q.weight_tiles.get(), moe_.w13.kernel);  // tiles of q.kernel_layout's
    attach_weight_tiles(q.weight_tiles.get(), moe_.w2.kernel);
    mlp_ = mxfp4_mlp(moe_);
    local_ids_ = Tensor::empty({tokens, tokens_.top_k}, DType::kI32);
    if (!eager_) ws_->reserve(mlp_, tokens * tokens_.top_k);  // so that replays allocate nothing
  }

  void run() override {
    if (tokens_.tokens == 0) return;  // R9
    if (padded_.defined()) copy_into_padded(x_.view(), padded_.view());
    std::lock_guard<std::mutex> lock(ws_->mutex);
    if (eager_) ws_->reserve(mlp_, tokens_.tokens * tokens_.top_k);  // the shared one: grows only
    run_moe(moe_, mlp_, tokens_, local_ids_.view(), *ws_, out_);
  }

 private:
  DispatchOutputPtr dispatch_;  // keeps hidden states and routing alive
  QuantInfoPtr quant_info_;     // keeps the weights alive
  Tensor x_;
  StandardTopKOutput topk_;          // owns the routing R8 materialised from a bypassed top-k
  Tensor padded_;                    // zero-padded GEMM input [T, padded_hidden]; undefined if none
  Mxfp4KernelLayout kernel_layout_;  // what moe_'s kernel operands read
  Mxfp4Moe moe_;
  ExpertMlp mlp_;     // moe_'s MLP on the shared schedule
  Mxfp4Tokens tokens_;
  Tensor local_ids_;  // i32 [T, k]: this rank's expert ids of the current call
  std::shared_ptr<ExpertWorkspace> ws_;
  bool eager_;      // ws_ is the eager calls' shared workspace, reserved by each run
  TensorView out_;  // the combine input's bf16 [T, H]
};

CombineInputPtr fused_none_to_flashinfer_mxfp4(const DispatchOutputPtr& dispatch,
                                               const QuantInfoPtr& quant_info,
                                               const MoeRunnerConfig& config) {
  Mxfp4FusedRun call(dispatch, quant_info, config, RunKind::kEagerCall, eager_workspace());
  call.run();
  return call.combine_input();
}

PreparedRunPtr prepare_standard_flashinfer_mxfp4(const DispatchOutputPtr& dispatch,
                                                 const QuantInfoPtr& quant_info,
                                                 const MoeRunnerConfig& config, MoeA2ABackend) {
  return std::make_unique<Mxfp4FusedRun>(dispatch, quant_info, config, RunKind::kPrepared,
                                         std::make_shared<ExpertWorkspace>());
}

}  // namespace

MOECORE_REGISTER_FUSED_FUNC(NONE, FLASHINFER_MXFP4, fused_none_to_flashinfer_mxfp4);
MOECORE_REGISTER_PREPARED_RUN(STANDARD, FLASHINFER_MXFP4, prepare_standard_flashinfer_mxfp4);

}  // namespace moecore
