// The 8-bit activation-quantizer plumbing and scale checks (see quant_compute.h). Every rule is
// formats arithmetic (moecore/formats/quantize.h): quantize_activation runs its whole-row kernel;
// the in-place callback runs the same rule as the two steps quantize.h documents (scale from the
// whole row or group, then the elementwise encode) on its act_quant_kernels row, whose rows give
// the formats rules' bits without allocating; the tests hold the two paths bitwise equal.
#include "moecore/runner/quant_compute.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/core/thread_pool.h"
#include "moecore/kernels/act_quant.h"
#include "moecore/kernels/convert.h"

namespace moecore {
namespace {

// One row of k values under `rule` → codes q (E4M3 bytes, or int8 for kInt8PerToken) and its
// scales (one, or ⌈k/group⌉ for the group rules). static_scale: the per-tensor scale.
void quantize_row(ActQuant rule, const float* row, int64_t k, float static_scale, int64_t group,
                  bool ue8m0, uint8_t* q, float* scales) {
  switch (rule) {
    case ActQuant::kFp8Static:
    case ActQuant::kFp8PerTensorDynamic:
      fp8_quantize_row_static(row, k, static_scale, q);
      scales[0] = static_scale;
      return;
    case ActQuant::kFp8PerToken:  // sgl-kernel per_token_quant_fp8 has no eps
      scales[0] = fp8_quantize_row_per_token(row, k, 0.0f, q);
      return;
    case ActQuant::kFp8PerTokenGroup:
    case ActQuant::kFp8SiluPostGroup:
      for (int64_t b = 0, k0 = 0; k0 < k; ++b, k0 += group)
        scales[b] = fp8_quantize_group_row(row + k0, std::min(group, k - k0), kActQuantEps, ue8m0,
                                           fp8_group_rule(rule), q + k0);
      return;
    case ActQuant::kInt8PerToken:
      scales[0] = int8_quantize_row_per_token(row, k, kActQuantEps, reinterpret_cast<int8_t*>(q));
      return;
    case ActQuant::kNone:
      return;
  }
}

bool is_group_rule(ActQuant rule) {
  return rule == ActQuant::kFp8PerTokenGroup || rule == ActQuant::kFp8SiluPostGroup;
}

// The elementwise step of a rule over values that share one scale (a segment), in place.
struct SegmentEncoder {
  ActQuant rule;
  // kFp8Static / kFp8PerTensorDynamic: the scale; kFp8PerToken: the multiplier (1/s, 0 when s is
  // 0); group rules: the scale s (a divisor); kInt8PerToken: a = max(amax, eps).
  float value;

  // x[0, n) replaced by their codes' fp32 values.
  void encode_in_place(const ActQuantKernels& kernels, float* x, int64_t n) const {
    switch (rule) {
      case ActQuant::kFp8Static:
      case ActQuant::kFp8PerTensorDynamic:  // fp8_quantize_row_static
        return kernels.fp8_mul(x, n, 1.0f / value);
      case ActQuant::kFp8PerToken:
        return kernels.fp8_mul(x, n, value);
      case ActQuant::kFp8PerTokenGroup:
      case ActQuant::kFp8SiluPostGroup:
        return kernels.fp8_div(x, n, value);
      case ActQuant::kInt8PerToken:
        return kernels.int8(x, n, value);
      case ActQuant::kNone:
        return;
    }
  }
};

// make_act_quantizer's callback: the kernel row and the rule's parameters packed into 16
// trivially copyable bytes, which std::function stores inline (no heap allocation when it is made
// or copied). A rule reads one parameter: the static rules their scale, the group rules their
// group (and ue8m0).
struct InPlaceQuantizer {
  const ActQuantKernels* kernels;  // act_quant_kernels(level), picked by make_act_quantizer
  union {
    float static_scale;  // kFp8Static, kFp8PerTensorDynamic
    int32_t group;       // kFp8PerTokenGroup, kFp8SiluPostGroup
  };
  ActQuant rule;
  bool ue8m0;

  void operator()(float* rows, int64_t m, int64_t k, int64_t ld, float* scales) const {
    const int64_t per_row = is_group_rule(rule) ? act_scales_per_row(rule, k, group) : 1;
    for (int64_t r = 0; r < m; ++r) quantize_row_in_place(rows + r * ld, k, scales + r * per_row);
  }

  // Segments are the whole row, or each group of the group rules; each one's scale reads all of
  // its values before any is overwritten.
  void quantize_row_in_place(float* row, int64_t k, float* scales) const {
    const int64_t segment = is_group_rule(rule) ? group : k;
    for (int64_t b = 0, k0 = 0; k0 < k; ++b, k0 += segment) {
      const int64_t n = std::min(segment, k - k0);
      scale_step(row + k0, n, scales + b).encode_in_place(*kernels, row + k0, n);
    }
  }

  // The first step of the formats rule (which quantize_row runs whole): the scale of one segment,
  // written to *scale, and the encoder of the segment's values.
  SegmentEncoder scale_step(const float* x, int64_t n, float* scale) const {
    switch (rule) {
      case ActQuant::kFp8Static:
      case ActQuant::kFp8PerTensorDynamic:
        *scale = static_scale;
        return {rule, static_scale};
      case ActQuant::kFp8PerToken: {  // fp8_quantize_row_per_token, eps 0
        const float s = fp8_dynamic_scale(kernels->amax(x, n), 0.0f);
        *scale = s;
        return {rule, s == 0.0f ? 0.0f : 1.0f / s};
      }
      case ActQuant::kFp8PerTokenGroup:
      case ActQuant::kFp8SiluPostGroup: {  // fp8_quantize_group_row
        const float s =
            fp8_group_scale(kernels->amax(x, n), kActQuantEps, ue8m0, fp8_group_rule(rule));
        *scale = s;
        return {rule, s};
      }
      case ActQuant::kInt8PerToken: {  // int8_quantize_row_per_token
        const float a = std::fmax(kernels->amax(x, n), kActQuantEps);
        *scale = a / 127.0f;
        return {rule, a};
      }
      case ActQuant::kNone:
        break;
    }
    return {ActQuant::kNone, 0.0f};
  }
};
static_assert(std::is_trivially_copyable_v<InPlaceQuantizer> && sizeof(InPlaceQuantizer) <= 16,
              "std::function must store the quantizer inline");

// Offset (in elements) of the flat index i of a strided view, row-major order.
int64_t strided_offset(const TensorView& v, int64_t i) {
  int64_t off = 0;
  for (int d = v.ndim - 1; d >= 0; --d) {
    off += (i % v.shape[d]) * v.strides[d];
    i /= v.shape[d];
  }
  return off;
}

std::string index_string(const TensorView& v, int64_t i) {
  std::vector<int64_t> idx(v.ndim);
  for (int d = v.ndim - 1; d >= 0; --d) {
    idx[d] = i % v.shape[d];
    i /= v.shape[d];
  }
  return shape_string(idx);
}

}  // namespace

const char* act_quant_name(ActQuant q) {
  switch (q) {
    case ActQuant::kNone:
      return "none";
    case ActQuant::kFp8Static:
      return "fp8_static";
    case ActQuant::kFp8PerTensorDynamic:
      return "fp8_per_tensor";
    case ActQuant::kFp8PerToken:
      return "fp8_per_token";
    case ActQuant::kFp8PerTokenGroup:
      return "fp8_per_token_group";
    case ActQuant::kFp8SiluPostGroup:
      return "fp8_silu_post_group";
    case ActQuant::kInt8PerToken:
      return "int8_per_token";
  }
  return "?";
}

ActQuant parse_act_quant(const std::string& name) {
  for (ActQuant q : {ActQuant::kNone, ActQuant::kFp8Static, ActQuant::kFp8PerTensorDynamic,
                     ActQuant::kFp8PerToken, ActQuant::kFp8PerTokenGroup,
                     ActQuant::kFp8SiluPostGroup, ActQuant::kInt8PerToken})
    if (name == act_quant_name(q)) return q;
  MOECORE_THROW(InvalidArgument,
                "quantize_activation: expected rule 'fp8_static', "
                "'fp8_per_tensor', 'fp8_per_token', 'fp8_per_token_group', 'fp8_silu_post_group' "
                "or 'int8_per_token', got '",
                name, "'");
}

Fp8GroupRule fp8_group_rule(ActQuant rule) {
  return rule == ActQuant::kFp8SiluPostGroup ? Fp8GroupRule::kDeepGemmSiluPost
                                             : Fp8GroupRule::kSglangCuda;
}

int64_t act_scales_per_row(ActQuant rule, int64_t k, int64_t group) {
  return is_group_rule(rule) ? (k + group - 1) / group : 1;
}

int64_t act_quant_segment(ActQuant rule, int64_t group) {
  if (is_group_rule(rule)) return group;
  return rule == ActQuant::kFp8Static ? 1 : 0;
}

ActivationQuantizer make_act_quantizer(IsaLevel level, ActQuant rule, float static_scale,
                                       int64_t group, bool ue8m0) {
  if (rule == ActQuant::kNone) return {};
  MOECORE_INTERNAL_CHECK(
      !is_group_rule(rule) || (group > 0 && group <= std::numeric_limits<int32_t>::max()),
      "make_act_quantizer: group ", group, " out of range");
  InPlaceQuantizer q{};
  q.kernels = &act_quant_kernels(level);
  if (is_group_rule(rule))
    q.group = static_cast<int32_t>(group);
  else
    q.static_scale = static_scale;
  q.rule = rule;
  q.ue8m0 = ue8m0;
  return q;
}

ActQuantResult quantize_activation(const TensorView& x, ActQuant rule, float scale, int64_t group,
                                   bool ue8m0) {
  const char* api = "quantize_activation";
  MOECORE_CHECK_DTYPE(is_activation_dtype(x.dtype), api, ": expected x f32, f16 or bf16, got ",
                      x.describe());
  MOECORE_CHECK(x.ndim == 2 && x.rows_contiguous(), api,
                ": expected x [rows, K] with contiguous rows, got ", x.describe());
  MOECORE_CHECK(rule != ActQuant::kNone, api, ": rule 'none' quantizes nothing");
  const int64_t rows = x.shape[0], k = x.shape[1];
  const bool grouped = is_group_rule(rule);
  if (grouped)
    MOECORE_CHECK(group > 0 && k % group == 0, api, ": expected K divisible by group_size=", group,
                  ", got K=", k);
  if (rule == ActQuant::kFp8Static)
    MOECORE_CHECK(std::isfinite(scale) && scale > 0.0f, api, ": expected a finite scale > 0, got ",
                  scale);
  ActQuantResult out;
  const bool int8 = rule == ActQuant::kInt8PerToken;
  out.q = Tensor::empty({rows, k}, int8 ? DType::kI8 : DType::kF8E4M3);
  const int64_t nb = grouped ? k / group : 1;
  out.scale = rule == ActQuant::kFp8Static || rule == ActQuant::kFp8PerTensorDynamic
                  ? Tensor::empty({1}, DType::kF32)
                  : Tensor::empty({rows, nb}, DType::kF32);
  std::vector<float> buf(static_cast<size_t>(rows * k));
  for (int64_t r = 0; r < rows; ++r) load_f32(x.at({r, 0}), x.dtype, k, buf.data() + r * k);
  if (rule == ActQuant::kFp8PerTensorDynamic)  // sgl-kernel per_tensor_absmax: no eps
    scale = fp8_dynamic_scale(amax_rows(buf.data(), rows, k, k), 0.0f);
  if (rule == ActQuant::kFp8Static || rule == ActQuant::kFp8PerTensorDynamic)
    out.scale.ptr<float>()[0] = scale;
  uint8_t* q = out.q.ptr<uint8_t>();
  float* s = out.scale.ptr<float>();
  const bool per_tensor = rule == ActQuant::kFp8Static || rule == ActQuant::kFp8PerTensorDynamic;
  parallel_for(rows, [&](int64_t begin, int64_t end) {
    float unused;
    for (int64_t r = begin; r < end; ++r)
      quantize_row(rule, buf.data() + r * k, k, scale, group, ue8m0, q + r * k,
                   per_tensor ? &unused : s + r * nb);
  });
  return out;
}

void check_scale_values(const char* api, const char* name, const TensorView& scale, bool allow_zero,
                        const std::vector<uint8_t>* experts) {
  MOECORE_CHECK_DTYPE(scale.dtype == DType::kF32, api, ": ", name, " must be float32, got ",
                      scale.describe());
  const float* p = scale.ptr<float>();
  const int64_t n = scale.numel();
  const float low = allow_zero ? 0.0f : std::numeric_limits<float>::denorm_min();
  const float high = std::numeric_limits<float>::max();
  auto ok = [&](float v) { return v >= low && v <= high; };  // false for NaN
  // Flat indices [begin, end): one pass without a branch over contiguous memory (bitwise |, not
  // ||, so the loop vectorizes); the failing index is searched for only when there is one.
  auto check_range = [&](int64_t begin, int64_t end) {
    if (scale.is_contiguous()) {
      int out_of_range = 0;
      for (int64_t i = begin; i < end; ++i) out_of_range |= !(p[i] >= low) | !(p[i] <= high);
      if (out_of_range == 0) return;
    }
    for (int64_t i = begin; i < end; ++i) {
      const float v = p[strided_offset(scale, i)];
      MOECORE_CHECK(ok(v), api, ": ", name, " must be finite and ", allow_zero ? ">= 0" : "> 0",
                    ", got ", v, " at ", index_string(scale, i));
    }
  };
  if (experts == nullptr || scale.ndim == 0) return check_range(0, n);
  MOECORE_INTERNAL_CHECK(static_cast<int64_t>(experts->size()) == scale.shape[0],
                         "expert flags for ", name, " ", scale.describe());
  const int64_t per_expert = scale.shape[0] == 0 ? 0 : n / scale.shape[0];
  for (int64_t e = 0; e < scale.shape[0]; ++e)
    if ((*experts)[e]) check_range(e * per_expert, (e + 1) * per_expert);
}

TensorView per_channel_scale_view(const char* api, const char* name, const Tensor& scale,
                                  int64_t num_experts, int64_t n) {
  MOECORE_CHECK(scale.defined(), api, ": ", name, " is required (per-channel scales [", num_experts,
                ", ", n, "] or [", num_experts, ", ", n, ", 1])");
  TensorView v = scale.view();
  const bool ok = (v.ndim == 2 || (v.ndim == 3 && v.shape[2] == 1)) && v.shape[0] == num_experts &&
                  v.shape[1] == n;
  MOECORE_CHECK(ok, api, ": expected ", name, " [", num_experts, ", ", n, "] or [", num_experts,
                ", ", n, ", 1], got ", scale.describe());
  v.ndim = 2;
  return v;
}

float scalar_scale(const char* api, const char* name, const Tensor& scale) {
  MOECORE_CHECK_DTYPE(scale.dtype() == DType::kF32, api, ": ", name, " must be float32, got ",
                      scale.describe());
  MOECORE_CHECK(scale.numel() == 1, api, ": expected ", name,
                " with one value (a per-tensor "
                "activation scale; reduce per-expert scales to their max first), got ",
                scale.describe());
  check_scale_values(api, name, scale.view(), false);
  return scale.ptr<float>()[0];
}

}  // namespace moecore
