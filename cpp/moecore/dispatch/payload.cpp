// Payload quantization and byte records of the expert-parallel dispatchers.
#include "moecore/dispatch/payload.h"

#include <cmath>
#include <cstring>

#include "moecore/core/error.h"
#include "moecore/formats/quantize.h"
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

namespace {
int64_t row_bytes_of(const Tensor& t) {
  return t.defined() ? t.size(-1) * dtype_size(t.dtype()) : 0;
}
}  // namespace

void PayloadRows::write_row(int64_t row, uint8_t* dst) const {
  std::memcpy(dst, static_cast<const uint8_t*>(q.view().data) + row * q_bytes, q_bytes);
  if (scale_bytes)
    std::memcpy(dst + q_bytes, static_cast<const uint8_t*>(scale.view().data) + row * scale_bytes,
                scale_bytes);
}

PayloadRows quantize_payload(const Tensor& x, DispatchPayload payload, float global_scale,
                             bool ue8m0) {
  PayloadRows rows;
  rows.payload = payload;
  switch (payload) {
    case DispatchPayload::kBF16:
      rows.q = Tensor::copy_of(x.view());
      break;
    case DispatchPayload::kFP8: {
      QuantizedTensor qt =
          quantize_fp8_per_token_group(x.view(), kFp8GroupSize, kDefaultMinAmax, ue8m0);
      rows.q = qt.q;
      // DeepEP's UE8M0 mode sends the power-of-two scales as packed E8M0 bytes, four per int32.
      rows.scale = ue8m0 ? pack_ue8m0(qt.scale.view()) : qt.scale;
      break;
    }
    case DispatchPayload::kNVFP4: {
      QuantizedTensor qt = quantize_nvfp4(x.view(), global_scale);
      rows.q = qt.q;
      rows.scale = qt.scale;
      break;
    }
  }
  rows.q_bytes = row_bytes_of(rows.q);
  rows.scale_bytes = row_bytes_of(rows.scale);
  return rows;
}

PayloadRows allocate_payload(const PayloadRows& like, const std::vector<int64_t>& lead) {
  PayloadRows rows = like;
  std::vector<int64_t> shape = lead;
  shape.push_back(like.q.size(-1));
  rows.q = Tensor::zeros(shape, like.q.dtype());
  if (like.scale.defined()) {
    shape.back() = like.scale.size(-1);
    rows.scale = Tensor::zeros(shape, like.scale.dtype());
  }
  return rows;
}

void read_payload_row(const uint8_t* src, int64_t row, PayloadRows& dst) {
  std::memcpy(static_cast<uint8_t*>(dst.q.view().data) + row * dst.q_bytes, src, dst.q_bytes);
  if (dst.scale_bytes)
    std::memcpy(static_cast<uint8_t*>(dst.scale.view().data) + row * dst.scale_bytes,
                src + dst.q_bytes, dst.scale_bytes);
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

}  // namespace moecore
