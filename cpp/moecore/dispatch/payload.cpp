// Payload quantization and byte records of the expert-parallel dispatchers.
#include "moecore/dispatch/payload.h"

#include <atomic>
#include <cmath>
#include <cstring>

#include "moecore/core/error.h"
#include "moecore/core/thread_pool.h"
#include "moecore/formats/quantize.h"
#include "moecore/kernels/convert.h"
#include "moecore/runner/expert_compute.h"

namespace moecore {

const char* payload_name(DispatchPayload payload) {
  switch (payload) {
    case DispatchPayload::kBF16:
      return "bf16";
    case DispatchPayload::kFP8:
      return "fp8";
    case DispatchPayload::kNVFP4:
      return "nvfp4";
  }
  return "?";
}

DispatchPayload parse_payload(const std::string& name, const char* api) {
  if (name == "bf16") return DispatchPayload::kBF16;
  if (name == "fp8") return DispatchPayload::kFP8;
  if (name == "nvfp4") return DispatchPayload::kNVFP4;
  if (name == "int8")
    MOECORE_UNSUPPORTED(api,
                        ": dispatcher_output_dtype 'int8' is not supported (supported: "
                        "bf16, fp8, nvfp4)");
  MOECORE_THROW(InvalidArgument, api,
                ": expected dispatcher_output_dtype bf16, fp8 or nvfp4, got '", name, "'");
}

std::optional<float> input_global_scale(const QuantConfig& config, const char* api) {
  auto it = config.find("input_global_scale");
  if (it == config.end() || std::holds_alternative<std::monostate>(it->second)) return std::nullopt;
  float gs = 0.0f;
  if (const auto* t = std::get_if<Tensor>(&it->second)) {
    MOECORE_CHECK_DTYPE(t->defined() && t->dtype() == DType::kF32 && t->numel() == 1, api,
                        ": quant_config['input_global_scale'] must hold one float32 value, got ",
                        t->describe());
    gs = *static_cast<const float*>(t->view().data);
  } else if (const auto* d = std::get_if<double>(&it->second)) {
    gs = static_cast<float>(*d);
  } else if (const auto* i = std::get_if<int64_t>(&it->second)) {
    gs = static_cast<float>(*i);
  } else {
    MOECORE_THROW(DTypeError, api,
                  ": quant_config['input_global_scale'] must be a float or a "
                  "float32 tensor");
  }
  MOECORE_CHECK(std::isfinite(gs) && gs > 0.0f, api,
                ": quant_config['input_global_scale'] must be finite and > 0, got ", gs);
  return gs;
}

DType PayloadCodec::q_dtype() const {
  switch (payload) {
    case DispatchPayload::kBF16:
      return DType::kBF16;
    case DispatchPayload::kFP8:
      return DType::kF8E4M3;
    case DispatchPayload::kNVFP4:
      return DType::kFp4E2M1x2;
  }
  return DType::kBF16;
}

int64_t PayloadCodec::scale_cols() const {
  switch (payload) {
    case DispatchPayload::kBF16:
      return 0;
    case DispatchPayload::kFP8:
      return ue8m0 ? (hidden / kFp8GroupSize + 3) / 4 : hidden / kFp8GroupSize;
    case DispatchPayload::kNVFP4:
      return hidden / kNvfp4BlockSize;
  }
  return 0;
}

DType PayloadCodec::scale_dtype() const {
  if (payload == DispatchPayload::kNVFP4) return DType::kF8E4M3;
  return payload == DispatchPayload::kFP8 && ue8m0 ? DType::kI32 : DType::kF32;
}

int64_t PayloadCodec::q_bytes() const {
  return payload == DispatchPayload::kBF16  ? 2 * hidden
         : payload == DispatchPayload::kFP8 ? hidden
                                            : hidden / 2;
}

int64_t PayloadCodec::scale_bytes() const { return scale_cols() * dtype_size(scale_dtype()); }

namespace {
/// n bf16 values → f32; false if one is not finite.
bool load_finite(const uint16_t* x, int64_t n, float* out) {
  load_f32(x, DType::kBF16, n, out);
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) finite = finite && std::isfinite(out[i]);
  return finite;
}
}  // namespace

bool PayloadCodec::encode_row(const uint16_t* x, uint8_t* q, uint8_t* scale) const {
  switch (payload) {
    case DispatchPayload::kBF16:
      std::memcpy(q, x, static_cast<size_t>(2 * hidden));
      return true;
    case DispatchPayload::kFP8: {
      // sglang_per_token_group_quant_fp8 per group of 128; DeepEP's UE8M0 mode sends the
      // power-of-two scales as E8M0 bytes (the float's exponent), four per int32.
      float group[kFp8GroupSize];
      if (ue8m0) std::memset(scale, 0, static_cast<size_t>(scale_bytes()));
      for (int64_t g = 0; g * kFp8GroupSize < hidden; ++g) {
        if (!load_finite(x + g * kFp8GroupSize, kFp8GroupSize, group)) return false;
        const float s = fp8_quantize_group_row(group, kFp8GroupSize, kDefaultMinAmax, ue8m0,
                                               Fp8GroupRule::kSglangCuda, q + g * kFp8GroupSize);
        if (ue8m0) {
          uint32_t bits;
          std::memcpy(&bits, &s, 4);
          scale[g] = static_cast<uint8_t>(bits >> 23);
        } else {
          std::memcpy(scale + 4 * g, &s, 4);
        }
      }
      return true;
    }
    case DispatchPayload::kNVFP4: {
      float block[kNvfp4BlockSize];
      for (int64_t b = 0; b * kNvfp4BlockSize < hidden; ++b) {
        if (!load_finite(x + b * kNvfp4BlockSize, kNvfp4BlockSize, block)) return false;
        nvfp4_quantize_row(block, kNvfp4BlockSize, global_scale, q + b * kNvfp4BlockSize / 2,
                           scale + b);
      }
      return true;
    }
  }
  return true;
}

void PayloadCodec::throw_non_finite(const char* api, int64_t row) const {
  MOECORE_THROW(InvalidArgument, api, ": hidden_states row ", row,
                " holds a non-finite value, which a ", payload_name(payload),
                " payload cannot carry");
}

void PayloadRows::write_row(int64_t row, uint8_t* dst) const {
  std::memcpy(dst, q_row(row), static_cast<size_t>(q_bytes()));
  if (scale_bytes())
    std::memcpy(dst + q_bytes(), scale_row(row), static_cast<size_t>(scale_bytes()));
}

void PayloadRows::read_row(const uint8_t* src, int64_t row) const {
  std::memcpy(q_row(row), src, static_cast<size_t>(q_bytes()));
  if (scale_bytes())
    std::memcpy(scale_row(row), src + q_bytes(), static_cast<size_t>(scale_bytes()));
}

PayloadRows allocate_payload(const PayloadCodec& codec, const std::vector<int64_t>& lead) {
  PayloadRows rows;
  rows.codec = codec;
  std::vector<int64_t> shape = lead;
  shape.push_back(codec.q_bytes() / dtype_size(codec.q_dtype()));
  rows.q = Tensor::zeros(shape, codec.q_dtype());
  if (codec.scale_cols()) {
    shape.back() = codec.scale_cols();
    rows.scale = Tensor::zeros(shape, codec.scale_dtype());
  }
  return rows;
}

PayloadRows quantize_payload(const char* api, const Tensor& x, const PayloadCodec& codec) {
  const int64_t T = x.size(0);
  PayloadRows rows = allocate_payload(codec, {T});
  const auto* src = static_cast<const uint16_t*>(x.view().data);
  const int64_t stride = x.view().strides[0];
  std::atomic<int64_t> first_bad{T};
  parallel_for(T, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      if (!codec.encode_row(src + t * stride, rows.q_row(t), rows.scale_row(t))) {
        int64_t seen = first_bad.load();
        while (t < seen && !first_bad.compare_exchange_weak(seen, t)) {
        }
      }
  });
  if (first_bad.load() < T) codec.throw_non_finite(api, first_bad.load());
  return rows;
}

StandardTopKOutput check_dispatch_input(const char* api, const Tensor& hidden_states,
                                        const TopKOutput& topk, int64_t hidden, int64_t top_k,
                                        int64_t num_experts) {
  StandardTopKOutput standard = to_standard(topk);
  ExpertWeights shape;
  shape.num_experts = num_experts;
  shape.hidden = hidden;
  shape.dtype = DType::kBF16;
  const RoutedTokens tokens = check_routed_tokens(api, hidden_states, standard, shape);
  MOECORE_CHECK(tokens.top_k == top_k, api, ": expected top_k ", top_k, " ids per token, got ",
                tokens.top_k);
  const int64_t T = tokens.num_tokens;
  Tensor ids = Tensor::empty({T, top_k}, DType::kI32);
  Tensor weights = Tensor::empty({T, top_k}, DType::kF32);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < top_k; ++j) {
      ids.ptr<int32_t>()[t * top_k + j] = tokens.id(t, j);
      weights.ptr<float>()[t * top_k + j] = tokens.weight(t, j);
    }
  standard.topk_ids = ids;
  standard.topk_weights = weights;
  return standard;
}

void check_round_buffers(const char* api, const Tensor& hidden_states,
                         const StandardTopKOutput& topk, int64_t hidden, int64_t top_k,
                         int64_t num_experts) {
  check_dispatch_input(api, hidden_states, topk, hidden, top_k, num_experts);
  MOECORE_CHECK_DTYPE(
      topk.topk_ids.dtype() == DType::kI32 && topk.topk_ids.view().is_contiguous() &&
          topk.topk_weights.dtype() == DType::kF32 && topk.topk_weights.view().is_contiguous(),
      api,
      ": a prepared round reads contiguous i32 topk_ids and f32 topk_weights, "
      "got ",
      topk.topk_ids.describe(), " and ", topk.topk_weights.describe());
}

void check_combine_rows(const char* api, const char* what, const Tensor& hidden,
                        const std::vector<int64_t>& shape) {
  MOECORE_CHECK_DTYPE(hidden.defined() && hidden.dtype() == DType::kBF16, api, ": expected bf16 ",
                      what, ", got ", hidden.describe());
  MOECORE_CHECK(hidden.view().shape_vector() == shape && hidden.view().is_contiguous(), api,
                ": expected contiguous hidden_states ", shape_string(shape), ", got ",
                hidden.describe());
}

void stage_round_tokens(const char* api, const Tensor& hidden_states,
                        const StandardTopKOutput& topk, int64_t num_tokens, int64_t num_experts,
                        PayloadRows& staged) {
  const int64_t k = topk.topk_ids.size(1);
  const int32_t* ids = topk.topk_ids.ptr<int32_t>();
  for (int64_t s = 0; s < num_tokens * k; ++s)
    MOECORE_CHECK_INDEX(ids[s] >= -1 && ids[s] < num_experts, api, ": topk_ids must be in [-1, ",
                        num_experts, "), got ", ids[s], " at [", s / k, ", ", s % k, "]");
  const auto* x = hidden_states.ptr<uint16_t>();
  const int64_t stride = hidden_states.view().strides[0];
  for (int64_t t = 0; t < num_tokens; ++t)
    if (!staged.codec.encode_row(x + t * stride, staged.q_row(t), staged.scale_row(t)))
      staged.codec.throw_non_finite(api, t);
}

}  // namespace moecore
