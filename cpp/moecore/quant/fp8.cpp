// Fp8MoEMethod (sglang quantization/fp8.py) and the FP8 weight-processing steps shared with
// ModelOptFp8MoEMethod. Validation happens before any parameter is replaced; processing runs once.
#include "moecore/quant/fp8.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/core/thread_pool.h"
#include "moecore/formats/e8m0.h"
#include "moecore/formats/fp8.h"
#include "moecore/kernels/convert.h"
#include "moecore/layer/fused_moe.h"
#include "moecore/runner/backends/deep_gemm.h"
#include "moecore/runner/quant_compute.h"

namespace moecore {

using WeightScheme = Fp8MoEOptions::WeightScheme;
using ActivationScheme = Fp8MoEOptions::ActivationScheme;

const char* to_string(WeightScheme s) {
  switch (s) {
    case WeightScheme::kPerTensor:
      return "per_tensor";
    case WeightScheme::kPerChannel:
      return "per_channel";
    case WeightScheme::kBlock:
      return "block";
  }
  return "?";
}

const char* to_string(ActivationScheme s) {
  return s == ActivationScheme::kStatic ? "static" : "dynamic";
}

void validate_fp8_options(const Fp8MoEOptions& o) {
  if (o.weight_scheme == WeightScheme::kBlock) {
    if (!o.checkpoint_fp8)
      MOECORE_THROW(InvalidArgument,
                    "The block-wise quantization only supports fp8-serialized checkpoint for now.");
    MOECORE_CHECK(o.block_shape.size() == 2,
                  "The quantization block size of weight must have 2 "
                  "dimensions, but got ",
                  o.block_shape.size(), " dimensions.");
    MOECORE_CHECK(o.block_shape[0] > 0 && o.block_shape[1] > 0,
                  "Fp8MoEMethod: expected "
                  "weight_block_size [block_n, block_k] > 0, got ",
                  shape_string(o.block_shape));
    if (o.activation_scheme != ActivationScheme::kDynamic)
      MOECORE_THROW(InvalidArgument,
                    "The block-wise quantization only supports dynamic "
                    "activation scheme for now, but got static activation scheme.");
  }
  if (o.activation_scheme == ActivationScheme::kStatic && !o.checkpoint_fp8)
    MOECORE_THROW(InvalidArgument,
                  "Found static activation scheme for checkpoint that was not serialized fp8.");
  if (o.scale_ue8m0)
    MOECORE_CHECK(o.weight_scheme == WeightScheme::kBlock &&
                      o.block_shape == std::vector<int64_t>({128, 128}),
                  "Fp8MoEMethod: scale_ue8m0 (DeepGEMM's UE8M0 mode) needs the block scheme with "
                  "weight_block_size [128, 128], got ",
                  to_string(o.weight_scheme),
                  o.weight_scheme == WeightScheme::kBlock ? " " + shape_string(o.block_shape) : "");
}

namespace fp8_detail {
namespace {

// Reads e4m3 rows of an [E, N, K] contiguous tensor.
inline const uint8_t* row_of(const Tensor& w, int64_t e, int64_t r) {
  return w.ptr<uint8_t>() + (e * w.size(1) + r) * w.size(2);
}

}  // namespace

Tensor max_scale(const char* api, const char* name, const Tensor& scales) {
  MOECORE_CHECK(scales.defined() && scales.numel() > 0, api, ": ", name, " is missing");
  check_scale_values(api, name, scales.view(), false);
  const Tensor c = scales.view().is_contiguous() ? scales : Tensor::copy_of(scales.view());
  float m = c.ptr<float>()[0];
  for (int64_t i = 1; i < c.numel(); ++i) m = std::max(m, c.ptr<float>()[i]);
  Tensor out = Tensor::empty({1}, DType::kF32);
  out.ptr<float>()[0] = m;
  return out;
}

Tensor requantize_w13_to_max_scale(const Tensor& w13, const Tensor& shard_scales, int64_t inter,
                                   const std::vector<int>& shard_cols) {
  const int64_t E = w13.size(0), H = w13.size(2), S = shard_scales.size(1);
  Tensor max_scales = Tensor::empty({E}, DType::kF32);
  const float* table = fp8_e4m3_table();
  parallel_for(E, [&](int64_t begin, int64_t end) {
    std::vector<float> dq(static_cast<size_t>(H));
    for (int64_t e = begin; e < end; ++e) {
      const float* s = shard_scales.ptr<float>() + e * S;
      float smax = s[0];
      for (int64_t j = 1; j < S; ++j) smax = std::max(smax, s[j]);
      max_scales.ptr<float>()[e] = smax;
      for (size_t shard = 0; shard < shard_cols.size(); ++shard) {
        const float own = s[shard_cols[shard]];
        for (int64_t r = shard * inter; r < static_cast<int64_t>(shard + 1) * inter; ++r) {
          uint8_t* q = const_cast<uint8_t*>(row_of(w13, e, r));
          // per_tensor_dequantize: fp16(q) · scale → an fp16 result (one rounding).
          for (int64_t i = 0; i < H; ++i) dq[i] = round_to(DType::kF16, table[q[i]] * own);
          fp8_quantize_row_static(dq.data(), H, smax, q);
        }
      }
    }
  });
  return max_scales;
}

Tensor quantize_per_expert(const Tensor& w, Tensor* scale) {
  const int64_t E = w.size(0), n = w.size(1) * w.size(2);
  Tensor q = Tensor::empty(w.view().shape_vector(), DType::kF8E4M3);
  *scale = Tensor::empty({E}, DType::kF32);
  parallel_for(E, [&](int64_t begin, int64_t end) {
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t e = begin; e < end; ++e) {
      load_f32(w.view().at({e, 0, 0}), w.dtype(), n, x.data());
      const float s = fp8_dynamic_scale(amax_row(x.data(), n), 0.0f);  // scaled_fp8_quant: no eps
      scale->ptr<float>()[e] = s;
      fp8_quantize_row_static(x.data(), n, s, q.ptr<uint8_t>() + e * n);
    }
  });
  return q;
}

Tensor quantize_per_channel(const Tensor& w, Tensor* scale) {
  const int64_t E = w.size(0), N = w.size(1), K = w.size(2);
  Tensor q = Tensor::empty({E, N, K}, DType::kF8E4M3);
  *scale = Tensor::empty({E, N, 1}, DType::kF32);
  parallel_for(E * N, [&](int64_t begin, int64_t end) {
    std::vector<float> x(static_cast<size_t>(K));
    for (int64_t r = begin; r < end; ++r) {
      load_f32(w.view().at({r / N, r % N, 0}), w.dtype(), K, x.data());
      scale->ptr<float>()[r] =
          fp8_quantize_row_per_token(x.data(), K, 0.0f, q.ptr<uint8_t>() + r * K);
    }
  });
  return q;
}

Tensor requantize_block_ue8m0(const Tensor& w, const Tensor& scale) {
  const int64_t E = w.size(0), N = w.size(1), K = w.size(2);
  const int64_t B = kDeepGemmBlock, nb = (N + B - 1) / B, kb = (K + B - 1) / B;
  Tensor out = Tensor::empty({E, nb, kb}, DType::kF32);
  const float* table = fp8_e4m3_table();
  parallel_for(E * nb * kb, [&](int64_t begin, int64_t end) {
    std::vector<float> tile(static_cast<size_t>(B * B));
    for (int64_t t = begin; t < end; ++t) {
      const int64_t e = t / (nb * kb), bi = (t / kb) % nb, bj = t % kb;
      const int64_t r0 = bi * B, c0 = bj * B, rows = std::min(B, N - r0),
                    cols = std::min(B, K - c0);
      const float s = scale.ptr<float>()[t];
      float amax = 0.0f;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          // block_quant_dequant: (q · s).to(bf16)
          const float v = round_to(DType::kBF16, table[row_of(w, e, r0 + r)[c0 + c]] * s);
          tile[r * B + c] = v;
          amax = std::max(amax, std::fabs(v));
        }
      // per_block_cast_to_fp8: amax clamped at 1e-4, scale rounded up to a power of two.
      const float sf = fp8_block_scale(amax, 1e-4f, /*ue8m0=*/true);
      out.ptr<float>()[t] = sf;
      for (int64_t r = 0; r < rows; ++r)
        fp8_quantize_row_mul(tile.data() + r * B, cols, 1.0f / sf,
                             const_cast<uint8_t*>(row_of(w, e, r0 + r)) + c0);
    }
  });
  return out;
}

Tensor expand_per_tensor_to_blocks(const Tensor& scale, int64_t n, int64_t k) {
  const int64_t E = scale.size(0), B = kDeepGemmBlock, nb = (n + B - 1) / B, kb = (k + B - 1) / B;
  Tensor out = Tensor::empty({E, nb, kb}, DType::kF32);
  for (int64_t e = 0; e < E; ++e)
    std::fill(out.ptr<float>() + e * nb * kb, out.ptr<float>() + (e + 1) * nb * kb,
              *static_cast<const float*>(scale.view().at({e})));
  return out;
}

}  // namespace fp8_detail

// ---------------------------------------------------------------------------------------------

Fp8MoEMethod::Fp8MoEMethod(Fp8MoEOptions options) : options_(std::move(options)) {
  validate_fp8_options(options_);
}

MoeRunnerBackend Fp8MoEMethod::resolve_backend(const FusedMoE& layer) const {
  MoeRunnerBackend b = layer.runner_backend();
  switch (b) {
    case MoeRunnerBackend::AUTO:
    case MoeRunnerBackend::FLASHINFER_CUTLASS:  // no fp8 path there: sglang pins triton
    case MoeRunnerBackend::FLASHINFER_CUTEDSL:
      return MoeRunnerBackend::TRITON;
    case MoeRunnerBackend::TRITON:
    case MoeRunnerBackend::DEEP_GEMM:
      return b;
    default:
      MOECORE_UNSUPPORTED(name(), ": runner backend '", to_string(b),
                          "' is not supported for FP8 "
                          "MoE (supported: auto, triton, deep_gemm; flashinfer_cutlass and "
                          "flashinfer_cutedsl run triton)");
  }
}

void Fp8MoEMethod::create_weights(FusedMoE& layer, int64_t num_experts, int64_t hidden,
                                  int64_t inter, DType params_dtype, bool with_bias) {
  const Fp8MoEOptions& o = options_;
  gated_ = layer.config().is_gated;
  const int64_t shards = gated_ ? 2 : 1, n1 = shards * inter, E = num_experts;
  if (o.weight_scheme == WeightScheme::kBlock) {
    const int64_t bn = o.block_shape[0], bk = o.block_shape[1];
    if (inter % bn != 0)
      MOECORE_THROW(InvalidArgument, "The output_size of gate's and up's weight = ", inter,
                    " is not divisible by weight quantization block_n = ", bn, ".");
    if (layer.options().tp_size > 1 && inter % bk != 0)
      MOECORE_THROW(InvalidArgument, "The input_size of down's weight = ", inter,
                    " is not divisible by weight quantization block_k = ", bk, ".");
  }
  MOECORE_CHECK_DTYPE(o.checkpoint_fp8 || is_activation_dtype(params_dtype), name(),
                      ": params_dtype must be f32, f16 or bf16, got ", dtype_name(params_dtype));
  const DType wdt = o.checkpoint_fp8 ? DType::kF8E4M3 : params_dtype;
  layer.register_parameter("w13_weight", Tensor::zeros({E, n1, hidden}, wdt), {ShardLayout::kW13});
  layer.register_parameter("w2_weight", Tensor::zeros({E, hidden, inter}, wdt), {ShardLayout::kW2});
  if (with_bias) {
    layer.register_parameter("w13_weight_bias", Tensor::zeros({E, n1}, DType::kF32),
                             {ShardLayout::kW13});
    layer.register_parameter("w2_weight_bias", Tensor::zeros({E, hidden}, DType::kF32),
                             {ShardLayout::kPerExpert, /*tp_rank0_only=*/true});
  }
  auto ones = [](const std::vector<int64_t>& shape) {
    Tensor t = Tensor::empty(shape, DType::kF32);
    std::fill(t.ptr<float>(), t.ptr<float>() + t.numel(), 1.0f);
    return t;
  };
  switch (o.weight_scheme) {
    case WeightScheme::kPerTensor:
      layer.register_parameter("w13_weight_scale", ones({E, shards}), {ShardLayout::kPerShard});
      layer.register_parameter("w2_weight_scale", ones({E}), {ShardLayout::kPerExpert});
      break;
    case WeightScheme::kPerChannel:
      layer.register_parameter("w13_weight_scale", ones({E, n1, 1}), {ShardLayout::kW13});
      layer.register_parameter("w2_weight_scale", ones({E, hidden, 1}), {ShardLayout::kPerExpert});
      break;
    case WeightScheme::kBlock: {
      const int64_t bn = o.block_shape[0], bk = o.block_shape[1];
      layer.register_parameter("w13_weight_scale_inv",
                               ones({E, shards * ((inter + bn - 1) / bn), (hidden + bk - 1) / bk}),
                               {ShardLayout::kW13});
      layer.register_parameter("w2_weight_scale_inv",
                               ones({E, (hidden + bn - 1) / bn, (inter + bk - 1) / bk}),
                               {ShardLayout::kW2});
      break;
    }
  }
  if (o.activation_scheme == ActivationScheme::kStatic) {
    layer.register_parameter("w13_input_scale", ones({E}), {ShardLayout::kPerExpert});
    layer.register_parameter("w2_input_scale", ones({E}), {ShardLayout::kPerExpert});
  }
}

void Fp8MoEMethod::process_weights_after_loading(FusedMoE& layer) {
  const char* api = "Fp8MoEMethod.process_weights_after_loading";
  MOECORE_CHECK(!processed_, api, ": the weights were already processed (run it once)");
  const Fp8MoEOptions& o = options_;
  const MoeRunnerBackend backend = resolve_backend(layer);
  const ParamSpec processed{ShardLayout::kPerExpert};
  const int64_t inter = layer.intermediate_size_per_partition();
  // Validate everything first, then replace parameters.
  Tensor in13, in2;
  if (o.activation_scheme == ActivationScheme::kStatic) {
    in13 = fp8_detail::max_scale(api, "w13_input_scale", layer.parameter("w13_input_scale"));
    in2 = fp8_detail::max_scale(api, "w2_input_scale", layer.parameter("w2_input_scale"));
  }
  const Tensor w13 = layer.parameter("w13_weight");
  const Tensor w2 = layer.parameter("w2_weight");
  if (o.checkpoint_fp8 && o.weight_scheme == WeightScheme::kPerTensor) {
    const Tensor& s13 = layer.parameter("w13_weight_scale");
    check_scale_values(api, "w13_weight_scale", s13.view(), false);
    check_scale_values(api, "w2_weight_scale", layer.parameter("w2_weight_scale").view(), false);
    // Fp8 MoE kernels take one w13 scale per expert: requantize both shards to the max.
    Tensor max13 = gated_ ? fp8_detail::requantize_w13_to_max_scale(w13, s13, inter, {0, 1})
                          : Tensor::copy_of(s13.view().select(1, 0));
    layer.register_parameter("w13_weight_scale", max13, processed);
  } else if (!o.checkpoint_fp8 && o.weight_scheme == WeightScheme::kPerTensor) {
    Tensor s13, s2;
    Tensor q13 = fp8_detail::quantize_per_expert(w13, &s13);
    Tensor q2 = fp8_detail::quantize_per_expert(w2, &s2);
    layer.register_parameter("w13_weight", q13, {ShardLayout::kW13});
    layer.register_parameter("w2_weight", q2, {ShardLayout::kW2});
    layer.register_parameter("w13_weight_scale", s13, processed);
    layer.register_parameter("w2_weight_scale", s2, processed);
  } else if (!o.checkpoint_fp8 && o.weight_scheme == WeightScheme::kPerChannel) {
    Tensor s13, s2;
    Tensor q13 = fp8_detail::quantize_per_channel(w13, &s13);
    Tensor q2 = fp8_detail::quantize_per_channel(w2, &s2);
    layer.register_parameter("w13_weight", q13, {ShardLayout::kW13});
    layer.register_parameter("w2_weight", q2, {ShardLayout::kW2});
    layer.register_parameter("w13_weight_scale", s13, {ShardLayout::kW13});
    layer.register_parameter("w2_weight_scale", s2, processed);
  } else if (o.weight_scheme == WeightScheme::kBlock && o.scale_ue8m0 &&
             backend == MoeRunnerBackend::DEEP_GEMM) {
    // requant_block_scale_ue8m0_for_deepgemm: DeepGEMM on Blackwell takes UE8M0 scales.
    const Tensor& s13 = layer.parameter("w13_weight_scale_inv");
    const Tensor& s2 = layer.parameter("w2_weight_scale_inv");
    check_scale_values(api, "w13_weight_scale_inv", s13.view(), false);
    check_scale_values(api, "w2_weight_scale_inv", s2.view(), false);
    layer.register_parameter("w13_weight_scale_inv", fp8_detail::requantize_block_ue8m0(w13, s13),
                             {ShardLayout::kW13});
    layer.register_parameter("w2_weight_scale_inv", fp8_detail::requantize_block_ue8m0(w2, s2),
                             {ShardLayout::kW2});
  }
  if (in13.defined()) {
    layer.register_parameter("w13_input_scale", in13, processed);
    layer.register_parameter("w2_input_scale", in2, processed);
  }
  processed_ = true;
}

void Fp8MoEMethod::create_moe_runner(FusedMoE& layer, const MoeRunnerConfig& config) {
  const MoeRunnerBackend backend = resolve_backend(layer);
  if (backend == MoeRunnerBackend::DEEP_GEMM) {
    if (options_.weight_scheme == WeightScheme::kPerChannel)
      MOECORE_UNSUPPORTED(name(),
                          ": the deep_gemm runner takes 128×128 block scales (or "
                          "per-tensor scales it expands to blocks); per-channel FP8 runs triton");
    if (layer.find_parameter("w13_weight_bias").defined())
      MOECORE_UNSUPPORTED(name(), ": the deep_gemm runner has no expert biases");
  }
  runner_ = std::make_shared<MoeRunner>(backend, config, layer.a2a_backend());
}

QuantInfoPtr Fp8MoEMethod::quant_info(const FusedMoE& layer) const {
  MOECORE_CHECK(runner_ != nullptr && processed_, name(),
                ": run process_weights_after_loading (it builds the runner) first");
  const Fp8MoEOptions& o = options_;
  const bool block = o.weight_scheme == WeightScheme::kBlock;
  if (runner_->runner_backend() == MoeRunnerBackend::DEEP_GEMM) {
    auto info = std::make_shared<DeepGemmMoeQuantInfo>();
    info->w13_weight = layer.parameter("w13_weight");
    info->w2_weight = layer.parameter("w2_weight");
    info->use_fp8 = true;
    if (block) {
      info->w13_scale = layer.parameter("w13_weight_scale_inv");
      info->w2_scale = layer.parameter("w2_weight_scale_inv");
      info->block_shape = o.block_shape;
    } else {
      info->w13_scale = fp8_detail::expand_per_tensor_to_blocks(
          layer.parameter("w13_weight_scale"), info->w13_weight.size(1), info->w13_weight.size(2));
      info->w2_scale = fp8_detail::expand_per_tensor_to_blocks(
          layer.parameter("w2_weight_scale"), info->w2_weight.size(1), info->w2_weight.size(2));
      info->block_shape = {kDeepGemmBlock, kDeepGemmBlock};
    }
    info->scale_ue8m0 = o.scale_ue8m0;
    return info;
  }
  auto info = std::make_shared<TritonMoeQuantInfo>();
  info->w13_weight = layer.parameter("w13_weight");
  info->w2_weight = layer.parameter("w2_weight");
  info->b13 = layer.find_parameter("w13_weight_bias");
  info->b2 = layer.find_parameter("w2_weight_bias");
  info->use_fp8_w8a8 = true;
  info->per_channel_quant = o.weight_scheme == WeightScheme::kPerChannel;
  info->w13_scale = layer.parameter(block ? "w13_weight_scale_inv" : "w13_weight_scale");
  info->w2_scale = layer.parameter(block ? "w2_weight_scale_inv" : "w2_weight_scale");
  info->a13_scale = layer.find_parameter("w13_input_scale");
  info->a2_scale = layer.find_parameter("w2_input_scale");
  if (block) info->block_shape = o.block_shape;
  return info;
}

QuantInfoPtr Fp8MoEMethod::apply_quant_info(FusedMoE& layer,
                                           const DispatchOutputPtr& dispatch_output) {
  return quant_info(layer);
}

}  // namespace moecore
