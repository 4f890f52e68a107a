// Mxfp4MoEMethod (GPT-OSS) and Mxfp4FlashinferCutlassMoEMethod (DSv4): weights, the GPT-OSS
// checkpoint loader, the SM90 cutlass layout (formats/layout.h transforms only) and the
// flashinfer_mxfp4 payload with its kernel layout. Everything is validated before a parameter is
// written or replaced.
#include "moecore/quant/mxfp4.h"

#include <algorithm>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/formats/e8m0.h"
#include "moecore/formats/layout.h"
#include "moecore/formats/quantize.h"
#include "moecore/layer/fused_moe.h"

namespace moecore {
namespace {

constexpr int64_t kMxBlock = 32;
constexpr int64_t kGptOssPad = 64;   // create_weights: I → round_up(I, 64)
constexpr int64_t kSm90Align = 128;  // the SM90 mixed GEMM: N and K multiples of 128
constexpr float kGptOssAlpha = 1.702f, kGptOssBeta = 1.0f, kGptOssLimit = 7.0f;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/// The same storage with another 1-byte dtype tag (packed fp4 ↔ u8 ↔ i8, e8m0 ↔ u8).
Tensor retag(const Tensor& t, DType dtype) {
  TensorView v = t.view();
  v.dtype = dtype;
  return Tensor(v, t.owner());
}

Tensor filled(int64_t n, float value) {
  Tensor t = Tensor::empty({n}, DType::kF32);
  std::fill(t.ptr<float>(), t.ptr<float>() + n, value);
  return t;
}

void check_no_nan_scales(const Tensor& s, const char* api, const char* name) {
  const Tensor c = s.view().is_contiguous() ? s : Tensor::copy_of(s.view());
  const uint8_t* p = c.ptr<uint8_t>();
  for (int64_t i = 0; i < c.numel(); ++i)
    MOECORE_CHECK(p[i] != kE8M0NaN, api, ": ", name, " holds the E8M0 NaN code 0xFF (flat index ",
                  i, ")");
}

/// AUTO → FLASHINFER_MXFP4; anything but those two is not executable for MXFP4 here.
MoeRunnerBackend resolve_backend(const FusedMoE& layer, const char* method) {
  const MoeRunnerBackend b = layer.runner_backend();
  if (b == MoeRunnerBackend::AUTO || b == MoeRunnerBackend::FLASHINFER_MXFP4)
    return MoeRunnerBackend::FLASHINFER_MXFP4;
  MOECORE_UNSUPPORTED(method, ": runner backend '", to_string(b),
                      "' is not supported for MXFP4 MoE in moecore (supported: auto, "
                      "flashinfer_mxfp4)");
}

void fill_topology(const FusedMoE& layer, FlashInferMxfp4CutlassMoeQuantInfo& q) {
  q.moe_tp_size = layer.options().tp_size;
  q.moe_tp_rank = layer.options().tp_rank;
  q.moe_ep_size = layer.options().ep_size;
  q.moe_ep_rank = layer.options().ep_rank;
}

/// A 1-byte tensor as contiguous u8 (the kernel layout's storage type).
Tensor contiguous_u8(const Tensor& t) {
  const Tensor c = t.view().is_contiguous() ? t : Tensor::copy_of(t.view());
  return retag(c, DType::kU8);
}

/// The kernel layout of processed weights: `plain_*` are the contract tensors' bytes before the
/// SM90 interleave (weights) and fold (scales).
Mxfp4KernelLayout make_kernel_layout(const Tensor& plain_w13, const Tensor& plain_w13_scale,
                                     const Tensor& plain_w2, const Tensor& plain_w2_scale) {
  return {contiguous_u8(plain_w13), contiguous_u8(plain_w13_scale), contiguous_u8(plain_w2),
          contiguous_u8(plain_w2_scale)};
}

/// The SM90 byte interleave and scale fold of FlashInfer (formats/layout.h).
Tensor sm90_weights(const Tensor& packed) {
  return interleave_moe_weights_for_sm90_mixed_gemm(retag(packed, DType::kU8).view(), "fp4");
}
Tensor sm90_scales(const Tensor& e8m0) {
  return retag(interleave_moe_scales_for_sm90_mixed_gemm(retag(e8m0, DType::kU8).view(), kMxBlock),
               DType::kU8);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Mxfp4MoEMethod (GPT-OSS)

void Mxfp4MoEMethod::create_weights(FusedMoE& layer, int64_t num_experts, int64_t hidden_size,
                                    int64_t inter, DType params_dtype, bool) {
  const char* api = "Mxfp4MoEMethod.create_weights";
  MOECORE_CHECK_DTYPE(params_dtype == DType::kBF16, api,
                      ": expected params_dtype bf16 (W4A16 MXFP4 runs bf16 activations), got ",
                      dtype_name(params_dtype));
  MOECORE_CHECK(layer.config().is_gated, api, ": GPT-OSS experts are gated (is_gated=True)");
  MOECORE_CHECK(hidden_size > 0 && hidden_size % kMxBlock == 0 && inter > 0, api,
                ": expected hidden_size a positive multiple of 32 (MXFP4 blocks) and "
                "intermediate_size_per_partition > 0, got ",
                hidden_size, " and ", inter);
  hidden_ = hidden_size;
  inter_ = inter;
  inter_after_pad_ = round_up(inter, kGptOssPad);
  padded_inter_ = round_up(inter, kSm90Align);
  padded_hidden_ = round_up(hidden_size, kSm90Align);
  const int64_t e = num_experts, ip = inter_after_pad_, h = hidden_size;
  // Per-expert weight_loader calls copy a whole (already sliced and padded) expert tensor.
  const ParamSpec per_expert{ShardLayout::kPerExpert};
  layer.register_parameter("w13_weight", Tensor::zeros({e, 2 * ip, h / 2}, DType::kU8), per_expert);
  layer.register_parameter("w13_weight_scale", Tensor::zeros({e, 2 * ip, h / kMxBlock}, DType::kU8),
                           per_expert);
  layer.register_parameter("w13_weight_bias", Tensor::zeros({e, 2 * ip}, DType::kBF16), per_expert);
  layer.register_parameter("w2_weight", Tensor::zeros({e, h, ip / 2}, DType::kU8), per_expert);
  layer.register_parameter("w2_weight_scale", Tensor::zeros({e, h, ip / kMxBlock}, DType::kU8),
                           per_expert);
  layer.register_parameter("w2_weight_bias", Tensor::zeros({e, h}, DType::kBF16),
                           {ShardLayout::kPerExpert, /*tp_rank0_only=*/true});
}

std::string Mxfp4MoEMethod::load_fused_expert_weight(FusedMoE& layer, const std::string& name,
                                                     const Tensor& loaded) {
  const char* api = "Mxfp4MoEMethod.load_fused_expert_weight";
  MOECORE_CHECK(inter_after_pad_ > 0, api, ": create_weights has not run");
  MOECORE_CHECK(!layer.find_parameter("swiglu_alpha").defined(), api,
                ": the weights are already processed; load before process_weights_after_loading");
  struct Entry {
    const char* suffix;
    const char* param;
  };
  static const Entry kEntries[] = {
      {"gate_up_proj_blocks", "w13_weight"},    {"gate_up_proj_scales", "w13_weight_scale"},
      {"gate_up_proj_bias", "w13_weight_bias"}, {"down_proj_blocks", "w2_weight"},
      {"down_proj_scales", "w2_weight_scale"},  {"down_proj_bias", "w2_weight_bias"}};
  const Entry* entry = nullptr;
  for (const Entry& en : kEntries) {
    const std::string suffix = en.suffix;
    if (name.size() >= suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      entry = &en;
  }
  MOECORE_CHECK(entry != nullptr, api,
                ": expected a name ending in gate_up_proj_blocks, "
                "gate_up_proj_scales, gate_up_proj_bias, down_proj_blocks, down_proj_scales or "
                "down_proj_bias, got '",
                name, "'");
  MOECORE_CHECK(loaded.defined(), api, ": ", name, ": loaded_weight is required");
  const std::string kind = entry->suffix;
  const FusedMoEOptions& o = layer.options();
  const int64_t shared = o.topk_config.num_fused_shared_experts;
  MOECORE_CHECK(shared == 0, api, ": GPT-OSS layers have no fused shared experts, got ", shared);
  const int64_t global = o.num_experts, local = layer.num_local_experts();
  const int64_t i_full = o.intermediate_size, h = o.hidden_size;
  MOECORE_CHECK(i_full % kMxBlock == 0, api, ": intermediate_size=", i_full,
                " must be divisible by mxfp4_block=32");
  // sglang's TP slice of the MXFP4 intermediate dim: whole 32-blocks, the last rank shorter.
  const int64_t per_rank = (i_full / kMxBlock + o.tp_size - 1) / o.tp_size * kMxBlock;
  const int64_t start = std::min(o.tp_rank * per_rank, i_full);
  const int64_t len = std::min(start + per_rank, i_full) - start;
  MOECORE_INTERNAL_CHECK(len <= inter_after_pad_, "TP slice ", len, " exceeds the buffer ",
                         inter_after_pad_);
  const int64_t e0 = o.ep_rank * local;

  TensorView src = loaded.view();
  const bool blocks = kind.find("blocks") != std::string::npos;
  const bool scales = kind.find("scales") != std::string::npos;
  const bool w13 = kind.rfind("gate_up", 0) == 0;
  if (blocks) {
    MOECORE_CHECK_DTYPE(src.dtype == DType::kU8 || src.dtype == DType::kFp4E2M1x2, api, ": ", name,
                        ": expected packed e2m1 blocks (uint8), got ", loaded.describe());
    src.dtype = DType::kU8;
    if (src.ndim == 4) {  // [E, rows, G, 16] → [E, rows, G·16]
      MOECORE_CHECK(src.shape[3] == 16 && src.strides[3] == 1 && src.strides[2] == 16, api, ": ",
                    name, ": expected blocks [E, rows, G, 16] with contiguous blocks, got ",
                    loaded.describe());
      src.shape[2] *= 16;
      src.strides[2] = 1;
      src.ndim = 3;
    }
  } else if (scales) {
    MOECORE_CHECK_DTYPE(src.dtype == DType::kU8 || src.dtype == DType::kE8M0, api, ": ", name,
                        ": expected E8M0 scale bytes (uint8), got ", loaded.describe());
    src.dtype = DType::kU8;
  } else {
    MOECORE_CHECK_DTYPE(src.dtype == DType::kBF16, api, ": ", name,
                        ": expected a bf16 bias (convert explicitly), got ", loaded.describe());
  }
  std::vector<int64_t> want;
  if (w13) {
    want = {global, 2 * i_full};
    if (blocks) want.push_back(h / 2);
    if (scales) want.push_back(h / kMxBlock);
  } else {
    want = {global, h};
    if (blocks) want.push_back(i_full / 2);
    if (scales) want.push_back(i_full / kMxBlock);
  }
  MOECORE_CHECK(src.shape_vector() == want, api, ": expected ", name, " ", shape_string(want),
                (blocks ? " (or its [.., G, 16] block form)" : ""), ", got ", loaded.describe());

  const Tensor& param = layer.parameter(entry->param);
  TensorView experts = src.narrow(0, e0, local);
  TensorView dest = param.view();
  if (w13) {
    experts = experts.narrow(1, 2 * start, 2 * len);
    dest = dest.narrow(1, 0, 2 * len);
  } else if (blocks || scales) {
    const int64_t unit = blocks ? 2 : kMxBlock;  // elements per stored unit along I
    experts = experts.narrow(2, start / unit, len / unit);
    dest = dest.narrow(2, 0, len / unit);
  }
  if (!w13 && !blocks && !scales && o.tp_rank != 0) {
    zero_view(dest);  // down_proj_bias counts once over the TP ranks' sum
  } else {
    copy_view(experts, dest);
  }
  return entry->param;
}

void Mxfp4MoEMethod::process_weights_after_loading(FusedMoE& layer) {
  const char* api = "Mxfp4MoEMethod.process_weights_after_loading";
  resolve_backend(layer, api);
  MOECORE_CHECK(inter_after_pad_ > 0, api, ": create_weights has not run");
  MOECORE_CHECK(!layer.find_parameter("swiglu_alpha").defined(), api,
                ": the weights are already processed (process_weights_after_loading runs once)");
  const Tensor w13 = layer.parameter("w13_weight"), w13_s = layer.parameter("w13_weight_scale");
  const Tensor b13 = layer.parameter("w13_weight_bias"), w2 = layer.parameter("w2_weight");
  const Tensor w2_s = layer.parameter("w2_weight_scale"), b2 = layer.parameter("w2_weight_bias");
  check_no_nan_scales(w13_s, api, "w13_weight_scale");
  check_no_nan_scales(w2_s, api, "w2_weight_scale");
  const int64_t np = padded_inter_, kp = padded_hidden_, experts = w13.size(0);

  // GPT-OSS rows [g0, u0, g1, u1, …] → [gate; up] → [up; gate] → each half padded to Np rows,
  // then the hidden (last) dim padded to Kp's storage units.
  auto up_gate = [&](const Tensor& t, int64_t last_padded) {
    Tensor halves = deinterleave_gate_up_rows(t.view(), 1);
    Tensor swapped = swap_w13_halves(halves.view(), 1);
    Tensor padded = pad_w13_intermediate(swapped.view(), np, /*gated=*/true, 1);
    return last_padded > 0 ? pad_dim(padded.view(), 2, last_padded) : padded;
  };
  auto pad_w2 = [&](const Tensor& t, int64_t last_padded) {
    Tensor rows = pad_dim(t.view(), 1, kp);
    return last_padded > 0 ? pad_dim(rows.view(), 2, last_padded) : rows;
  };
  const Tensor plain_w13 = up_gate(w13, kp / 2), plain_w13_s = up_gate(w13_s, kp / kMxBlock);
  const Tensor plain_w2 = pad_w2(w2, np / 2), plain_w2_s = pad_w2(w2_s, np / kMxBlock);
  Tensor new_w13 = sm90_weights(plain_w13);
  Tensor new_w13_s = sm90_scales(plain_w13_s);
  Tensor new_b13 = up_gate(b13, 0);
  Tensor new_w2 = sm90_weights(plain_w2);
  Tensor new_w2_s = sm90_scales(plain_w2_s);
  Tensor new_b2 = pad_w2(b2, 0);
  // The kernel layout: the same bytes before the interleave and fold (DESIGN.md §4, Weights).
  Mxfp4KernelLayout layout = make_kernel_layout(plain_w13, plain_w13_s, plain_w2, plain_w2_s);

  const ParamSpec processed{ShardLayout::kPerExpert};
  layer.register_parameter("w13_weight", new_w13, processed);
  layer.register_parameter("w13_weight_scale", new_w13_s, processed);
  layer.register_parameter("w13_weight_bias", new_b13, processed);
  layer.register_parameter("w2_weight", new_w2, processed);
  layer.register_parameter("w2_weight_scale", new_w2_s, processed);
  layer.register_parameter("w2_weight_bias", new_b2, processed);
  layer.register_parameter("swiglu_alpha", filled(experts, kGptOssAlpha), processed);
  layer.register_parameter("swiglu_beta", filled(experts, kGptOssBeta), processed);
  layer.register_parameter("swiglu_limit", filled(experts, kGptOssLimit), processed);
  kernel_layout_ = std::move(layout);
}

void Mxfp4MoEMethod::create_moe_runner(FusedMoE& layer, const MoeRunnerConfig& config) {
  const MoeRunnerBackend backend = resolve_backend(layer, "Mxfp4MoEMethod.create_moe_runner");
  runner_ = std::make_shared<MoeRunner>(backend, config, layer.a2a_backend());
}

QuantInfoPtr Mxfp4MoEMethod::quant_info(const FusedMoE& layer) const {
  MOECORE_CHECK(layer.find_parameter("swiglu_alpha").defined(), name(),
                ": process_weights_after_loading has not run");
  auto q = std::make_shared<FlashInferMxfp4CutlassMoeQuantInfo>();
  q->w13_weight = layer.parameter("w13_weight");
  q->w2_weight = layer.parameter("w2_weight");
  q->w13_weight_scale = layer.parameter("w13_weight_scale");
  q->w2_weight_scale = layer.parameter("w2_weight_scale");
  q->w13_bias = layer.parameter("w13_weight_bias");
  q->w2_bias = layer.parameter("w2_weight_bias");
  q->swiglu_alpha = layer.parameter("swiglu_alpha");
  q->swiglu_beta = layer.parameter("swiglu_beta");
  q->swiglu_limit = layer.parameter("swiglu_limit");
  fill_topology(layer, *q);
  q->padded_hidden = padded_hidden_;
  q->kernel_layout = kernel_layout_;
  return q;
}

QuantInfoPtr Mxfp4MoEMethod::apply_quant_info(FusedMoE& layer,
                                             const DispatchOutputPtr& dispatch_output) {
  return quant_info(layer);
}

// ---------------------------------------------------------------------------------------------
// Mxfp4FlashinferCutlassMoEMethod (DSv4)

void Mxfp4FlashinferCutlassMoEMethod::create_weights(FusedMoE& layer, int64_t num_experts,
                                                     int64_t hidden_size, int64_t inter, DType,
                                                     bool with_bias) {
  const char* api = "Mxfp4FlashinferCutlassMoEMethod.create_weights";
  if (hidden_size % kSm90Align != 0 || inter % kSm90Align != 0)
    MOECORE_THROW(InvalidArgument,
                  "Mxfp4FlashinferCutlassMoEMethod requires hidden_size and "
                  "intermediate_size_per_partition to be multiples of 128 (got hidden=",
                  hidden_size, ", intermediate=", inter, ").");
  MOECORE_CHECK(layer.config().is_gated, api, ": DSv4 experts are gated (is_gated=True)");
  MOECORE_CHECK(!with_bias, api, ": DSv4 MXFP4 experts have no bias (with_bias=True given)");
  const int64_t e = num_experts, h = hidden_size;
  layer.register_parameter("w13_weight", Tensor::zeros({e, 2 * inter, h / 2}, DType::kI8),
                           {ShardLayout::kW13});
  layer.register_parameter("w2_weight", Tensor::zeros({e, h, inter / 2}, DType::kI8),
                           {ShardLayout::kW2});
  layer.register_parameter("w13_weight_scale_inv",
                           Tensor::zeros({e, 2 * inter, h / kMxBlock}, DType::kF32),
                           {ShardLayout::kW13});
  layer.register_parameter("w2_weight_scale_inv",
                           Tensor::zeros({e, h, inter / kMxBlock}, DType::kF32),
                           {ShardLayout::kW2});
}

void Mxfp4FlashinferCutlassMoEMethod::process_weights_after_loading(FusedMoE& layer) {
  const char* api = "Mxfp4FlashinferCutlassMoEMethod.process_weights_after_loading";
  resolve_backend(layer, api);
  const Tensor w13 = layer.parameter("w13_weight"), w2 = layer.parameter("w2_weight");
  MOECORE_CHECK(w13.dtype() == DType::kI8, api,
                ": the weights are already processed (process_weights_after_loading runs once)");
  const Tensor w13_s = layer.parameter("w13_weight_scale_inv");
  const Tensor w2_s = layer.parameter("w2_weight_scale_inv");
  // f32 power-of-two scales → E8M0 bytes (the fp32 exponent); anything else is rejected here.
  auto to_e8m0 = [&](const Tensor& s, const char* what) {
    try {
      return scales_to_e8m0(s.view());
    } catch (const InvalidArgument& err) {
      MOECORE_THROW(InvalidArgument, api, ": ", what,
                    " must hold f32 powers of two in E8M0's range: ", err.what());
    }
  };
  const Tensor e13 = to_e8m0(w13_s, "w13_weight_scale_inv");
  const Tensor e2 = to_e8m0(w2_s, "w2_weight_scale_inv");
  // cutlass_fused_moe wants fc1 as [w3; w1] = [up; gate]; the loader wrote [w1; w3].
  const Tensor w31 = swap_w13_halves(retag(w13, DType::kU8).view(), 1);
  const Tensor e31 = swap_w13_halves(e13.view(), 1);
  Tensor new_w13 = sm90_weights(w31), new_w2 = sm90_weights(w2);
  Tensor new_e13 = sm90_scales(e31), new_e2 = sm90_scales(e2);
  // The kernel layout: the same bytes before the interleave and fold (DESIGN.md §4, Weights).
  Mxfp4KernelLayout layout = make_kernel_layout(w31, e31, w2, e2);
  const ParamSpec processed{ShardLayout::kPerExpert};
  layer.register_parameter("w13_weight", new_w13, processed);
  layer.register_parameter("w2_weight", new_w2, processed);
  layer.register_parameter("w13_weight_scale_inv", new_e13, processed);
  layer.register_parameter("w2_weight_scale_inv", new_e2, processed);
  kernel_layout_ = std::move(layout);
}

void Mxfp4FlashinferCutlassMoEMethod::create_moe_runner(FusedMoE& layer,
                                                        const MoeRunnerConfig& config) {
  const MoeRunnerBackend backend =
      resolve_backend(layer, "Mxfp4FlashinferCutlassMoEMethod.create_moe_runner");
  // Plain SwiGLU plus the checkpoint's clamp: all three tensors, or none (never a mix).
  if (config.swiglu_limit) {
    const int64_t e = layer.num_local_experts();
    swiglu_alpha_ = filled(e, 1.0f);
    swiglu_beta_ = filled(e, 0.0f);
    swiglu_limit_ = filled(e, *config.swiglu_limit);
  } else {
    swiglu_alpha_ = swiglu_beta_ = swiglu_limit_ = Tensor();
  }
  runner_ = std::make_shared<MoeRunner>(backend, config, layer.a2a_backend());
}

QuantInfoPtr Mxfp4FlashinferCutlassMoEMethod::quant_info(const FusedMoE& layer) const {
  MOECORE_CHECK(runner_ != nullptr && layer.parameter("w13_weight").dtype() == DType::kU8, name(),
                ": process_weights_after_loading has not run");
  auto q = std::make_shared<FlashInferMxfp4CutlassMoeQuantInfo>();
  q->w13_weight = layer.parameter("w13_weight");
  q->w2_weight = layer.parameter("w2_weight");
  q->w13_weight_scale = layer.parameter("w13_weight_scale_inv");
  q->w2_weight_scale = layer.parameter("w2_weight_scale_inv");
  q->swiglu_alpha = swiglu_alpha_;
  q->swiglu_beta = swiglu_beta_;
  q->swiglu_limit = swiglu_limit_;
  fill_topology(layer, *q);
  q->padded_hidden = std::nullopt;  // DSv4's hidden size is already a multiple of 128
  q->kernel_layout = kernel_layout_;
  return q;
}

QuantInfoPtr Mxfp4FlashinferCutlassMoEMethod::apply_quant_info(FusedMoE& layer,
                                                              const DispatchOutputPtr& dispatch_output) {
  // DSv4 always feeds standard top-k; sglang keeps this strict check as a contract guard.
  if (auto* d = dynamic_cast<const StandardDispatchOutput*>(dispatch_output.get())) {
    const TopKOutputFormat format = topk_output_format(d->topk_output);
    MOECORE_CHECK(format == TopKOutputFormat::STANDARD,
                  "Unsupported topk output format: TopKOutputFormat.",
                  topk_output_format_name(format));
  }
  return quant_info(layer);
}

}  // namespace moecore
