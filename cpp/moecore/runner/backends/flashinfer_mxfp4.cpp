// Runner backend "flashinfer_mxfp4" (sglang moe_runner/flashinfer_mxfp4.py): FlashInfer's SM90
// cutlass_fused_moe(use_w4_group_scaling=True), W4A16 MXFP4, for GPT-OSS and DSv4 experts.
// Registers: fused func (none, flashinfer_mxfp4) only — fused-only, no runner core, no permutes.
// Payload: FlashInferMxfp4CutlassMoeQuantInfo (anything else is a TypeError).
//
// Numeric contract (per (token, slot) routed to a local expert e; N = fc1 half width, K = hidden):
//   weights: W = e2m1 · 2^(s − 127) per 32-block, decoded exactly (exact in bf16 and fp32) from
//     the SM90-interleaved bytes and folded E8M0 scales; activations stay bf16 (no quantization).
//   GEMM1: h1 = bf16(fp32 Σ_k x[k]·W13[n, k] + b13[n]) — fp32 accumulation in moecore's canonical
//     order (kernels/gemm.h), bias (bf16 → fp32) added in fp32, ONE rounding to bf16 (the stored
//     fc1 output). Rows [0, N) of fc1 are `up`, rows [N, 2N) are `gate` (halved [up; gate]).
//   activation (fp32, one rounding to bf16): with swiglu tensors g = min(gate, L[e]),
//     u = clamp(up, −L[e], L[e]), h2 = bf16(g · σ(α[e]·g) · (u + β[e])), σ(z) = 1/(1 + exp(−z));
//     without them h2 = bf16(silu(gate) · up).
//   GEMM2: y = bf16(fp32 Σ_n h2[n]·W2[h, n]) — no bias yet (stored per (token, slot)).
//   finalize (TRT-LLM's unfused finalizeMoeRouting): out[t, h] = bf16(Σ_j w_j · (y_j[h] + b2[h]))
//     in fp32, slots j in increasing order, starting from +0; the routed weight applies exactly
//     once here. routed_scaling_factor is NOT applied (sglang passes none to the kernel; layers
//     fold it into the top-k weights). Output bf16 [T, K], trimmed by the fused func.
// The fused func: R9 (T = 0 returns hidden_states unchanged after validating the payload, no
// kernel), R8 (bypassed top-k → to_standard()), zero-pads x on the right to padded_hidden when
// set and different, trims the bf16 output back to the input's width (a contiguous copy). tp
// size/rank do not change a rank's math (weights arrive sharded; the caller reduces); ids are
// global, only [ep_rank·E, (ep_rank+1)·E) count. R15: apply_router_weight_on_input is rejected.
// Deviations from sglang: activations other than gated silu and no_combine are rejected (sglang's
// kernel would silently run SwiGLU and sum); E8M0 0xFF scales are errors, not NaN outputs.
#include "moecore/runner/backends/flashinfer_mxfp4.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/core/thread_pool.h"
#include "moecore/formats/e8m0.h"
#include "moecore/formats/fp4.h"
#include "moecore/formats/layout.h"
#include "moecore/kernels/convert.h"
#include "moecore/kernels/quant_gemm.h"
#include "moecore/quant/quant_info.h"
#include "moecore/runner/registry.h"

namespace moecore {
namespace {

constexpr const char* kApi = "cutlass_fused_moe_mxfp4(flashinfer_mxfp4)";
constexpr int64_t kMxBlock = 32;     // MXFP4 group size along K
constexpr int64_t kTile = 64;        // weight rows decoded per work item (a folded scale row tile)
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

/// Validated geometry of a call.
struct Geometry {
  int64_t experts = 0, n = 0, k = 0, tokens = 0, top_k = 0;
  bool swiglu = false;
};

int64_t raw_id(const TensorView& ids, int64_t t, int64_t j) {
  const int64_t off = t * ids.strides[0] + j * ids.strides[1];
  return ids.dtype == DType::kI32 ? ids.ptr<int32_t>()[off] : ids.ptr<int64_t>()[off];
}

Geometry check_args(const Mxfp4CutlassMoeArgs& a) {
  Geometry g;
  MOECORE_CHECK(a.w13.defined() && a.w2.defined(), kApi,
                ": fc1_expert_weights and fc2_expert_weights are required");
  MOECORE_CHECK(a.w13.ndim() == 3 && a.w2.ndim() == 3, kApi,
                ": expected w13_weight [E, 2N, K/2] and w2_weight [E, K, N/2], got ",
                a.w13.describe(), " and ", a.w2.describe());
  g.experts = a.w13.size(0);
  g.n = a.w13.size(1) / 2;
  g.k = a.w13.size(2) * 2;
  MOECORE_CHECK(g.experts > 0 && g.n > 0 && g.k > 0 && a.w13.size(1) % 2 == 0, kApi,
                ": expected w13_weight [E, 2N, K/2] with E, N, K > 0, got ", a.w13.describe());
  MOECORE_CHECK(g.n % kSm90Align == 0 && g.k % kSm90Align == 0, kApi,
                ": expected N and K multiples of 128 (the SM90 mixed-GEMM layout; pad with the "
                "quant method), got N = ",
                g.n, ", K = ", g.k);
  check_packed(a.w13, "w13_weight", {g.experts, 2 * g.n, g.k / 2});
  check_packed(a.w2, "w2_weight", {g.experts, g.k, g.n / 2});
  check_folded_scale(a.w13_scale, "w13_weight_scale", g.experts, 2 * g.n, g.k);
  check_folded_scale(a.w2_scale, "w2_weight_scale", g.experts, g.k, g.n);
  check_vector(a.w13_bias, "w13_bias", DType::kBF16, {g.experts, 2 * g.n});
  check_vector(a.w2_bias, "w2_bias", DType::kBF16, {g.experts, g.k});
  const int given = a.swiglu_alpha.defined() + a.swiglu_beta.defined() + a.swiglu_limit.defined();
  MOECORE_CHECK(given == 0 || given == 3, kApi,
                ": swiglu_alpha, swiglu_beta and swiglu_limit go together (all or none), got ",
                given, " of 3");
  g.swiglu = given == 3;
  check_vector(a.swiglu_alpha, "swiglu_alpha", DType::kF32, {g.experts});
  check_vector(a.swiglu_beta, "swiglu_beta", DType::kF32, {g.experts});
  check_vector(a.swiglu_limit, "swiglu_limit", DType::kF32, {g.experts});
  MOECORE_CHECK(a.tp_size >= 1 && a.ep_size >= 1, kApi, ": expected tp_size, ep_size >= 1, got ",
                a.tp_size, " and ", a.ep_size);
  MOECORE_CHECK_INDEX(
      a.tp_rank >= 0 && a.tp_rank < a.tp_size && a.ep_rank >= 0 && a.ep_rank < a.ep_size, kApi,
      ": rank out of range (tp ", a.tp_rank, "/", a.tp_size, ", ep ", a.ep_rank, "/", a.ep_size,
      ")");

  const Tensor& x = a.input;
  MOECORE_CHECK(x.defined(), kApi, ": input is required");
  MOECORE_CHECK_DTYPE(x.dtype() == DType::kBF16, kApi,
                      ": expected input bf16 (W4A16: bf16 activations), got ", x.describe());
  MOECORE_CHECK(x.ndim() == 2 && x.size(1) == g.k, kApi, ": expected input [T, ", g.k,
                "] (the weights' K; pad it first), got ", x.describe());
  MOECORE_CHECK(x.view().rows_contiguous(), kApi, ": input rows must be contiguous");
  g.tokens = x.size(0);
  const Tensor& ids = a.topk_ids;
  const Tensor& wts = a.topk_weights;
  MOECORE_CHECK(ids.defined() && wts.defined(), kApi, ": topk_ids and topk_weights are required");
  MOECORE_CHECK_DTYPE(ids.dtype() == DType::kI32 || ids.dtype() == DType::kI64, kApi,
                      ": topk_ids must be int32 or int64, got ", ids.describe());
  MOECORE_CHECK_DTYPE(wts.dtype() == DType::kF32, kApi, ": topk_weights must be float32, got ",
                      wts.describe());
  MOECORE_CHECK(ids.ndim() == 2 && ids.size(0) == g.tokens && ids.size(1) >= 1, kApi,
                ": expected topk_ids [", g.tokens, ", k] with k >= 1, got ", ids.describe());
  MOECORE_CHECK(wts.view().shape_vector() == ids.view().shape_vector(), kApi,
                ": topk_weights shape must equal topk_ids', got ", wts.describe(), " and ",
                ids.describe());
  g.top_k = ids.size(1);
  const int64_t global = g.experts * a.ep_size;
  for (int64_t t = 0; t < g.tokens; ++t)
    for (int64_t j = 0; j < g.top_k; ++j) {
      const int64_t e = raw_id(ids.view(), t, j);
      MOECORE_CHECK_INDEX(e >= -1 && e < global, kApi, ": topk_ids must be in [-1, ", global,
                          ") (E·ep_size), got ", e, " at [", t, ", ", j, "]");
    }
  return g;
}

/// Decodes rows [r0, r0 + kTile) of expert e of an SM90-interleaved weight [E, R, C/2] with
/// folded scales [E, R/64, C/128, 16, 16] into out [kTile, C] fp32 (exact values).
void decode_tile(const TensorView& w, const TensorView& s, const char* scale_name, int64_t e,
                 int64_t r0, float* out) {
  const int64_t rows = w.shape[1], c = w.shape[2] * 2;
  const Tensor bytes =
      deinterleave_moe_weights_for_sm90_mixed_gemm(w.narrow(0, e, 1).narrow(1, r0, kTile), "fp4");
  const uint8_t* packed = bytes.ptr<uint8_t>();
  const uint8_t* folded = static_cast<const uint8_t*>(s.data);
  const int64_t kb128 = c / kSm90Align, gpk = kSm90Align / kMxBlock;
  const int64_t tile_base = (e * (rows / kSm90ScaleRowTile) + r0 / kSm90ScaleRowTile) * kb128;
  for (int64_t i = 0; i < kTile; ++i) {
    const int64_t slice = i / kSm90ScaleFoldedM, f = i % kSm90ScaleFoldedM;
    const uint8_t* row = packed + i * (c / 2);
    float* dst = out + i * c;
    for (int64_t b = 0; b < c / kMxBlock; ++b) {
      const uint8_t code = folded[((tile_base + b / gpk) * kSm90ScaleFoldedM + f) * kSm90ScaleCols +
                                  slice * gpk + b % gpk];
      MOECORE_CHECK(code != kE8M0NaN, kApi, ": ", scale_name,
                    " holds the E8M0 NaN code 0xFF (expert ", e, ", row ", r0 + i, ", K block ", b,
                    ")");
      const float scale = e8m0_to_f32(code);
      for (int64_t q = b * kMxBlock / 2; q < (b + 1) * kMxBlock / 2; ++q) {
        dst[2 * q] = e2m1_to_f32(e2m1x2_lo(row[q])) * scale;
        dst[2 * q + 1] = e2m1_to_f32(e2m1x2_hi(row[q])) * scale;
      }
    }
  }
}

/// One GEMM of the MLP over the experts' gathered rows: for each (active expert, 64-row weight
/// tile) decodes the tile and computes out[rows of e, tile] = in[rows of e] · tileᵀ (fp32,
/// canonical order), then bias (optional, bf16 [E, n_out]) and the bf16 rounding.
void expert_gemm(const TensorView& w, const TensorView& s, const char* scale_name,
                 const TensorView& bias, const std::vector<int64_t>& offsets, const float* in,
                 int64_t k_in, float* out, int64_t n_out, ScaledGemmFn gemm) {
  const int64_t experts = static_cast<int64_t>(offsets.size()) - 1;
  const int64_t tiles = n_out / kTile;
  std::vector<int64_t> items;  // e · tiles + tile, for experts with rows
  for (int64_t e = 0; e < experts; ++e)
    if (offsets[e + 1] > offsets[e])
      for (int64_t t = 0; t < tiles; ++t) items.push_back(e * tiles + t);
  parallel_for(static_cast<int64_t>(items.size()), [&](int64_t begin, int64_t end) {
    std::vector<float> tile(static_cast<size_t>(kTile * k_in)), b(kTile);
    WeightOperand decoded;  // the decoded tile: dense f32 rows of one "expert"
    decoded.data = make_view(tile.data(), DType::kF32, {1, kTile, k_in});
    decoded.num_experts = 1;
    decoded.n = kTile;
    decoded.k = k_in;
    for (int64_t it = begin; it < end; ++it) {
      const int64_t e = items[it] / tiles, r0 = (items[it] % tiles) * kTile;
      const int64_t m = offsets[e + 1] - offsets[e];
      decode_tile(w, s, scale_name, e, r0, tile.data());
      float* dst = out + offsets[e] * n_out + r0;
      ActivationCodes rows;
      rows.codes = in + offsets[e] * k_in;
      rows.ld = k_in;
      gemm(rows, m, decoded, 0, 0, kTile, dst, n_out);
      const bool has_bias = bias.data != nullptr;
      if (has_bias) load_f32(bias.at({e, r0}), DType::kBF16, kTile, b.data());
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < kTile; ++c) {
          float& v = dst[r * n_out + c];
          v = round_to(DType::kBF16, has_bias ? v + b[c] : v);
        }
    }
  });
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
  Tensor out = Tensor::empty({experts, rows, c}, DType::kF32);
  const int64_t tiles = rows / kTile;
  parallel_for(experts * tiles, [&](int64_t begin, int64_t end) {
    for (int64_t it = begin; it < end; ++it)
      decode_tile(weight, folded_scale, "scale", it / tiles, (it % tiles) * kTile,
                  out.ptr<float>() + it * kTile * c);
  });
  return out;
}

Tensor cutlass_fused_moe_mxfp4(const Mxfp4CutlassMoeArgs& a, IsaLevel level) {
  const Geometry g = check_args(a);
  const int64_t n = g.n, k = g.k, tokens = g.tokens, top_k = g.top_k;
  Tensor out = Tensor::empty({tokens, k}, DType::kBF16);
  if (tokens == 0) return out;
  const ScaledGemmFn gemm = scaled_gemm_kernel(level);

  // Gather: the valid local (token, slot) pairs grouped by expert, in slot order t·k + j.
  const TensorView ids = a.topk_ids.view();
  const int64_t first = a.ep_rank * g.experts;
  std::vector<int64_t> row_of_slot(static_cast<size_t>(tokens * top_k), -1);
  std::vector<int64_t> offsets(static_cast<size_t>(g.experts + 1), 0);
  for (int64_t s = 0; s < tokens * top_k; ++s) {
    const int64_t e = raw_id(ids, s / top_k, s % top_k) - first;
    if (e >= 0 && e < g.experts) ++offsets[e + 1];
  }
  for (int64_t e = 0; e < g.experts; ++e) offsets[e + 1] += offsets[e];
  const int64_t rows = offsets[g.experts];
  std::vector<int64_t> cursor(offsets.begin(), offsets.end() - 1);
  std::vector<int64_t> expert_of_row(static_cast<size_t>(rows));
  std::vector<float> a1(static_cast<size_t>(rows * k));
  for (int64_t s = 0; s < tokens * top_k; ++s) {
    const int64_t e = raw_id(ids, s / top_k, s % top_k) - first;
    if (e < 0 || e >= g.experts) continue;
    const int64_t r = cursor[e]++;
    row_of_slot[s] = r;
    expert_of_row[r] = e;
    load_f32(a.input.view().at({s / top_k, 0}), DType::kBF16, k, a1.data() + r * k);
  }

  // GEMM1 (+ b13, bf16) → activation (bf16) → GEMM2 (bf16).
  std::vector<float> h1(static_cast<size_t>(rows * 2 * n)), h2(static_cast<size_t>(rows * n));
  const TensorView none;
  expert_gemm(a.w13.view(), a.w13_scale.view(), "w13_weight_scale",
              a.w13_bias.defined() ? a.w13_bias.view() : none, offsets, a1.data(), k, h1.data(),
              2 * n, gemm);
  parallel_for(rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t e = expert_of_row[r];
      const float* up = h1.data() + r * 2 * n;
      const float* gate = up + n;
      float* dst = h2.data() + r * n;
      if (g.swiglu) {
        const float alpha = a.swiglu_alpha.ptr<float>()[e];
        const float beta = a.swiglu_beta.ptr<float>()[e];
        const float limit = a.swiglu_limit.ptr<float>()[e];
        for (int64_t i = 0; i < n; ++i) {
          const float gt = std::min(gate[i], limit);
          const float u = std::clamp(up[i], -limit, limit);
          const float glu = gt / (1.0f + std::exp(-(alpha * gt)));
          dst[i] = round_to(DType::kBF16, glu * (u + beta));
        }
      } else {
        for (int64_t i = 0; i < n; ++i) {
          const float glu = gate[i] / (1.0f + std::exp(-gate[i]));
          dst[i] = round_to(DType::kBF16, glu * up[i]);
        }
      }
    }
  });
  std::vector<float> y(static_cast<size_t>(rows * k));
  expert_gemm(a.w2.view(), a.w2_scale.view(), "w2_weight_scale", none, offsets, h2.data(), n,
              y.data(), k, gemm);

  // Finalize: Σ_j w_j · (y_j + b2) in fp32, slot order, one bf16 rounding.
  const TensorView wts = a.topk_weights.view();
  const bool has_b2 = a.w2_bias.defined();
  parallel_for(tokens, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(static_cast<size_t>(k)), bias(static_cast<size_t>(k));
    for (int64_t t = begin; t < end; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < top_k; ++j) {
        const int64_t r = row_of_slot[t * top_k + j];
        if (r < 0) continue;
        const float w = wts.ptr<float>()[t * wts.strides[0] + j * wts.strides[1]];
        const float* yr = y.data() + r * k;
        if (has_b2) {
          load_f32(a.w2_bias.view().at({expert_of_row[r], 0}), DType::kBF16, k, bias.data());
          for (int64_t h = 0; h < k; ++h) acc[h] += w * (yr[h] + bias[h]);
        } else {
          for (int64_t h = 0; h < k; ++h) acc[h] += w * yr[h];
        }
      }
      store_f32(acc.data(), k, DType::kBF16, out.view().at({t, 0}));
    }
  });
  return out;
}

namespace {

const FlashInferMxfp4CutlassMoeQuantInfo& as_mxfp4_info(const QuantInfoPtr& q) {
  auto* info = dynamic_cast<const FlashInferMxfp4CutlassMoeQuantInfo*>(q.get());
  if (info == nullptr)
    MOECORE_THROW(DTypeError, "Unexpected quant_info type for flashinfer_mxfp4: ", q->name());
  return *info;
}

CombineInputPtr fused_none_to_flashinfer_mxfp4(const DispatchOutputPtr& dispatch,
                                               const QuantInfoPtr& quant_info,
                                               const MoeRunnerConfig& config) {
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
  const Tensor& x = d->hidden_states;
  const StandardTopKOutput topk = to_standard(d->topk_output);  // R8

  MOECORE_CHECK(x.defined() && x.ndim() == 2, api, ": expected hidden_states [T, H], got ",
                x.describe());
  const int64_t origin_hidden = x.size(1);
  const bool do_pad = q.padded_hidden && *q.padded_hidden != origin_hidden;
  MOECORE_CHECK(!do_pad || *q.padded_hidden > origin_hidden, api, ": padded_hidden (",
                q.padded_hidden.value_or(0), ") must be at least hidden_states' width (",
                origin_hidden, ")");

  Mxfp4CutlassMoeArgs args;
  args.topk_ids = topk.topk_ids;
  args.topk_weights = topk.topk_weights;
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
  const int64_t tokens = x.size(0);
  if (do_pad) {
    MOECORE_CHECK_DTYPE(x.dtype() == DType::kBF16, kApi,
                        ": expected input bf16 (W4A16: bf16 activations), got ", x.describe());
    Tensor padded = Tensor::zeros({tokens, *q.padded_hidden}, DType::kBF16);
    copy_view(x.view(), padded.view().narrow(1, 0, origin_hidden));
    args.input = padded;
  } else {
    args.input = x;
  }
  if (tokens == 0) {  // R9: validate, then return the input without running the kernel
    check_args(args);
    return std::make_shared<StandardCombineInput>(x);
  }
  const Tensor out = cutlass_fused_moe_mxfp4(args, config.isa_level.value_or(IsaLevel::kScalar));
  if (!do_pad) return std::make_shared<StandardCombineInput>(out);
  return std::make_shared<StandardCombineInput>(
      Tensor::copy_of(out.view().narrow(1, 0, origin_hidden)));
}

}  // namespace

MOECORE_REGISTER_FUSED_FUNC(NONE, FLASHINFER_MXFP4, fused_none_to_flashinfer_mxfp4);

}  // namespace moecore
