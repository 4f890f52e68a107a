// Block quantizers and dequantizers (quantize.h): the row kernels (one per sglang rule, scalar fp32
// in the kernel's operation order, no FMA contraction) and the validated tensor-level entry points
// built from them. Work is split over rows with parallel_for, and each row's result depends only
// on that row (per-tensor amax is a max, which is exact), so thread count never changes a bit.
#include "moecore/formats/quantize.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/core/thread_pool.h"
#include "moecore/formats/e8m0.h"
#include "moecore/formats/fp4.h"
#include "moecore/formats/fp8.h"
#include "moecore/formats/view_util.h"

namespace moecore {

using formats_detail::ceil_div;
using formats_detail::check_float_input;
using formats_detail::check_out_dtype;
using formats_detail::check_positive_scale;
using formats_detail::leading_shape;
using formats_detail::Rows;

namespace {

std::vector<int64_t> shape_of(const TensorView& v) { return v.shape_vector(); }

/// The first non-finite element of a float input, as InvalidArgument; checked before any output
/// is computed so the message is deterministic (the lowest row that has one).
void check_finite(const TensorView& x, const char* api, const char* what) {
  const Rows rows(x);
  const int64_t cols = rows.cols();
  std::atomic<int64_t> first_bad{rows.rows()};
  parallel_for(rows.rows(), [&](int64_t begin, int64_t end) {
    std::vector<float> buf(static_cast<size_t>(cols));
    for (int64_t r = begin; r < end && r < first_bad.load(); ++r) {
      rows.load_f32(r, buf.data());
      for (int64_t c = 0; c < cols; ++c) {
        if (!std::isfinite(buf[c])) {
          int64_t seen = first_bad.load();
          while (r < seen && !first_bad.compare_exchange_weak(seen, r)) {
          }
          break;
        }
      }
    }
  });
  const int64_t r = first_bad.load();
  if (r == rows.rows()) return;
  std::vector<float> buf(static_cast<size_t>(cols));
  rows.load_f32(r, buf.data());
  int64_t c = 0;
  while (std::isfinite(buf[c])) ++c;
  MOECORE_THROW(InvalidArgument, api, ": expected finite ", what, ", got ", buf[c], " in row ", r,
                " column ", c);
}

void check_eps(float eps, const char* api) {
  MOECORE_CHECK(std::isfinite(eps) && eps > 0.0f, api, ": expected eps finite and > 0, got ", eps);
}

/// Codes dtype for packed-fp4 inputs: the tagged dtype or plain uint8.
void check_packed_fp4(const TensorView& q, const char* api, const char* what) {
  MOECORE_CHECK_DTYPE(q.dtype == DType::kFp4E2M1x2 || q.dtype == DType::kU8, api, ": expected ",
                      what, " dtype fp4_e2m1x2 (or u8), got ", dtype_name(q.dtype));
  MOECORE_CHECK(q.ndim >= 1, api, ": expected ", what, " with at least 1 dim, got a scalar");
}

void check_same_leading(const TensorView& a, const TensorView& b, int drop, const char* api,
                        const char* what_a, const char* what_b) {
  MOECORE_CHECK(a.ndim == b.ndim && leading_shape(a, drop) == leading_shape(b, drop), api,
                ": expected ", what_b, " leading dims to match ", what_a, " ",
                shape_string(shape_of(a)), ", got ", shape_string(shape_of(b)));
}

/// f32 scale tensor, every value finite and > 0.
void check_scale_tensor(const TensorView& s, const char* api, const char* what) {
  MOECORE_CHECK_DTYPE(s.dtype == DType::kF32, api, ": expected ", what, " dtype f32, got ",
                      dtype_name(s.dtype));
  const Rows rows(s);
  std::vector<float> buf(static_cast<size_t>(rows.cols()));
  for (int64_t r = 0; r < rows.rows(); ++r) {
    rows.load_f32(r, buf.data());
    for (int64_t c = 0; c < rows.cols(); ++c)
      MOECORE_CHECK(std::isfinite(buf[c]) && buf[c] > 0.0f, api, ": expected ", what,
                    " finite and > 0, got ", buf[c], " at row ", r, " column ", c);
  }
}

/// Global scales: one value (any shape) or one per x.shape[0] (1-d). Returns them as a vector.
std::vector<float> read_global_scales(const TensorView& gs, const TensorView& x, const char* api) {
  MOECORE_CHECK_DTYPE(gs.dtype == DType::kF32, api, ": expected global_scale dtype f32, got ",
                      dtype_name(gs.dtype));
  const int64_t n = gs.numel();
  const bool per_leading = n != 1;
  if (per_leading)
    MOECORE_CHECK(gs.ndim == 1 && x.ndim >= 2 && n == x.shape[0], api,
                  ": expected global_scale with 1 value or [", x.ndim >= 2 ? x.shape[0] : 1,
                  "] (one per leading index of ", shape_string(shape_of(x)), "), got ",
                  shape_string(shape_of(gs)));
  std::vector<float> out(static_cast<size_t>(n));
  const int64_t stride = gs.ndim == 0 ? 0 : gs.strides[gs.ndim - 1];
  for (int64_t i = 0; i < n; ++i) out[i] = gs.ptr<float>()[per_leading ? i * stride : 0];
  for (int64_t i = 0; i < n; ++i)
    MOECORE_CHECK(std::isfinite(out[i]) && out[i] > 0.0f, api,
                  ": expected global_scale finite and > 0, got ", out[i], " at index ", i);
  return out;
}

/// Global scale of flattened row r when there is one value per leading index.
float global_scale_of_row(const std::vector<float>& gs, int64_t r, int64_t rows) {
  if (gs.size() == 1) return gs[0];
  return gs[static_cast<size_t>(r / (rows / static_cast<int64_t>(gs.size())))];
}

/// Shared driver for "one scale per row" quantizers: q with x's shape, scale [..., R, 1].
template <typename RowFn>
QuantizedTensor quantize_rows(const TensorView& x, DType q_dtype, RowFn row_fn) {
  const Rows rows(x);
  std::vector<int64_t> scale_shape = leading_shape(x, 1);
  scale_shape.push_back(1);
  QuantizedTensor out{Tensor::empty(shape_of(x), q_dtype), Tensor::empty(scale_shape, DType::kF32)};
  uint8_t* q = out.q.ptr<uint8_t>();
  float* s = out.scale.ptr<float>();
  const int64_t cols = rows.cols();
  parallel_for(rows.rows(), [&](int64_t begin, int64_t end) {
    std::vector<float> buf(static_cast<size_t>(cols));
    for (int64_t r = begin; r < end; ++r) {
      rows.load_f32(r, buf.data());
      s[r] = row_fn(buf.data(), cols, q + r * cols);
    }
  });
  return out;
}

/// Decodes 1-byte fp8 codes of `dtype` into fp32.
inline float decode_fp8(uint8_t code, DType dtype) {
  return dtype == DType::kF8E5M2 ? fp8_e5m2_to_f32(code) : fp8_e4m3_table()[code];
}

/// x̂ = value(code) · s for 1-byte codes q [..., R, K] with one f32 scale per row [..., R, 1].
template <typename DecodeFn>
Tensor dequantize_rows(const TensorView& q, const TensorView& scale, DType out_dtype,
                       const char* api, DecodeFn decode) {
  MOECORE_CHECK(q.ndim >= 1, api, ": expected q with at least 1 dim, got a scalar");
  std::vector<int64_t> expected = leading_shape(q, 1);
  expected.push_back(1);
  MOECORE_CHECK(shape_of(scale) == expected, api, ": expected scale shape ", shape_string(expected),
                " for q ", shape_string(shape_of(q)), ", got ", shape_string(shape_of(scale)));
  check_scale_tensor(scale, api, "scale");
  check_out_dtype(out_dtype, api);
  const Rows qrows(q), srows(scale);
  const int64_t k = qrows.cols();
  Tensor out = Tensor::empty(shape_of(q), out_dtype);
  char* o = out.ptr<char>();
  const int64_t elem = dtype_size(out_dtype);
  parallel_for(qrows.rows(), [&](int64_t begin, int64_t end) {
    std::vector<uint8_t> codes(static_cast<size_t>(k));
    std::vector<float> buf(static_cast<size_t>(k));
    for (int64_t r = begin; r < end; ++r) {
      qrows.load_bytes(r, codes.data());
      float s;
      srows.load_f32(r, &s);
      for (int64_t c = 0; c < k; ++c) buf[c] = decode(codes[c]) * s;
      store_f32(buf.data(), k, out_dtype, o + r * k * elem);
    }
  });
  return out;
}

}  // namespace

const char* mxfp4_rounding_name(Mxfp4Rounding rounding) {
  return rounding == Mxfp4Rounding::kSglangCeil ? "sglang_ceil" : "ocp_floor";
}

Mxfp4Rounding parse_mxfp4_rounding(const std::string& name) {
  if (name == "sglang_ceil") return Mxfp4Rounding::kSglangCeil;
  if (name == "ocp_floor") return Mxfp4Rounding::kOcpFloor;
  MOECORE_THROW(InvalidArgument,
                "quantize_mxfp4: expected rounding 'sglang_ceil' or 'ocp_floor', "
                "got '",
                name, "'");
}

// ---------------------------------------------------------------------------------------------
// Row kernels.

float amax_row(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::fmax(m, std::fabs(x[i]));
  return m;
}

float amax_rows(const float* x, int64_t m, int64_t n, int64_t ld) {
  float a = 0.0f;
  for (int64_t r = 0; r < m; ++r) a = std::fmax(a, amax_row(x + r * ld, n));
  return a;
}

float fp8_dynamic_scale(float amax, float eps) { return std::fmax(amax, eps) / kFp8E4M3Max; }

float ue8m0_round_up(float s) { return exp2_int(std::max(ceil_log2(s), kE8M0MinExp)); }

float ue8m0_round_up_floored(float s) { return ue8m0_round_up(std::fmax(s, 1e-10f)); }

void fp8_quantize_row_mul(const float* x, int64_t n, float inv, uint8_t* q) {
  for (int64_t i = 0; i < n; ++i)
    q[i] = f32_to_fp8_e4m3(std::fmax(std::fmin(x[i] * inv, kFp8E4M3Max), -kFp8E4M3Max));
}

void fp8_quantize_row_div(const float* x, int64_t n, float s, uint8_t* q) {
  for (int64_t i = 0; i < n; ++i)
    q[i] = f32_to_fp8_e4m3(std::fmax(std::fmin(x[i] / s, kFp8E4M3Max), -kFp8E4M3Max));
}

void fp8_quantize_row_static(const float* x, int64_t n, float scale, uint8_t* q) {
  fp8_quantize_row_mul(x, n, 1.0f / scale, q);
}

float fp8_quantize_row_per_token(const float* x, int64_t n, float eps, uint8_t* q) {
  const float s = fp8_dynamic_scale(amax_row(x, n), eps);
  fp8_quantize_row_mul(x, n, s == 0.0f ? 0.0f : 1.0f / s, q);
  return s;
}

float fp8_group_scale(float amax, float eps, bool ue8m0, Fp8GroupRule rule) {
  const float s = fp8_dynamic_scale(amax, eps);
  if (!ue8m0) return s;
  return rule == Fp8GroupRule::kSglangCuda ? ue8m0_round_up_floored(s) : ue8m0_round_up(s);
}

float fp8_quantize_group_row(const float* x, int64_t n, float eps, bool ue8m0, Fp8GroupRule rule,
                             uint8_t* q) {
  const float s = fp8_group_scale(amax_row(x, n), eps, ue8m0, rule);
  fp8_quantize_row_div(x, n, s, q);
  return s;
}

float fp8_block_scale(float amax, float eps, bool ue8m0) {
  const float s = fp8_dynamic_scale(amax, eps);
  return ue8m0 ? ue8m0_round_up(s) : s;
}

void nvfp4_quantize_row(const float* x, int64_t n, float global_scale, uint8_t* q, uint8_t* sf) {
  // fp32 reciprocals, as the reference's get_reciprocal and the kernel's reciprocal(6.0f).
  const float inv6 = 1.0f / kE2M1Max;
  const float inv_gs = 1.0f / global_scale;
  for (int64_t b = 0; b < n / kNvfp4BlockSize; ++b) {
    const float* xb = x + b * kNvfp4BlockSize;
    const float vmax = amax_row(xb, kNvfp4BlockSize);
    const float s = std::min(global_scale * (vmax * inv6), kFp8E4M3Max);
    const uint8_t code = f32_to_fp8_e4m3(s);
    sf[b] = code;
    const float s8 = fp8_e4m3_to_f32(code);
    const float inv = s8 != 0.0f ? 1.0f / (s8 * inv_gs) : 0.0f;
    for (int64_t i = 0; i < kNvfp4BlockSize; i += 2) {
      const float lo = std::min(std::max(xb[i] * inv, -kE2M1Max), kE2M1Max);
      const float hi = std::min(std::max(xb[i + 1] * inv, -kE2M1Max), kE2M1Max);
      q[(b * kNvfp4BlockSize + i) / 2] = pack_e2m1x2(f32_to_e2m1_rne(lo), f32_to_e2m1_rne(hi));
    }
  }
}

void mxfp4_quantize_row(const float* x, int64_t n, Mxfp4Rounding rounding, uint8_t* q,
                        uint8_t* sf) {
  const bool sglang = rounding == Mxfp4Rounding::kSglangCeil;
  for (int64_t b = 0; b < n / kMxfp4BlockSize; ++b) {
    const float* xb = x + b * kMxfp4BlockSize;
    const float amax = amax_row(xb, kMxfp4BlockSize);
    int e;
    if (sglang) {
      // descale = amax / 6 in fp32; ceil(log2) exactly (log2(0) = −inf clamps to −127).
      const float descale = amax / kE2M1Max;
      e = descale == 0.0f ? kE8M0MinExp : std::max(ceil_log2(descale), kE8M0MinExp);
    } else {
      e = amax == 0.0f ? kE8M0MinExp
                       : std::min(std::max(floor_log2(amax) - 2, kE8M0MinExp), kE8M0MaxExp);
    }
    sf[b] = static_cast<uint8_t>(e + kE8M0Bias);
    const float scale = exp2_int(e);
    for (int64_t i = 0; i < kMxfp4BlockSize; i += 2) {
      const float lo = xb[i] / scale, hi = xb[i + 1] / scale;
      q[(b * kMxfp4BlockSize + i) / 2] =
          sglang ? pack_e2m1x2(f32_to_e2m1_ties_down(lo), f32_to_e2m1_ties_down(hi))
                 : pack_e2m1x2(f32_to_e2m1_rne(lo), f32_to_e2m1_rne(hi));
    }
  }
}

void nvfp4_code_values_row(const uint8_t* q, const uint8_t* sf, int64_t n, float* out) {
  for (int64_t i = 0; i < n; i += 2) {
    const float s = fp8_e4m3_table()[sf[i / kNvfp4BlockSize]];
    out[i] = e2m1_to_f32(e2m1x2_lo(q[i / 2])) * s;
    out[i + 1] = e2m1_to_f32(e2m1x2_hi(q[i / 2])) * s;
  }
}

void nvfp4_dequantize_row(const uint8_t* q, const uint8_t* sf, int64_t n, float global_scale,
                          float* out) {
  nvfp4_code_values_row(q, sf, n, out);  // e2m1 · s8 is exact; one rounding for the division
  for (int64_t i = 0; i < n; ++i) out[i] /= global_scale;
}

void mxfp4_dequantize_row(const uint8_t* q, const uint8_t* sf, int64_t n, float* out) {
  for (int64_t i = 0; i < n; i += 2) {
    const float s = e8m0_to_f32(sf[i / kMxfp4BlockSize]);
    out[i] = e2m1_to_f32(e2m1x2_lo(q[i / 2])) * s;
    out[i + 1] = e2m1_to_f32(e2m1x2_hi(q[i / 2])) * s;
  }
}

void int8_quantize_row(const float* x, int64_t n, float amax, int8_t* q) {
  const float mul = 127.0f / amax;
  for (int64_t i = 0; i < n; ++i) {
    const float r = std::round(x[i] * mul);  // libdevice.round: half away from zero
    q[i] = static_cast<int8_t>(r != r ? 0.0f : std::fmax(std::fmin(r, 127.0f), -127.0f));
  }
}

float int8_quantize_row_per_token(const float* x, int64_t n, float eps, int8_t* q) {
  const float a = std::fmax(amax_row(x, n), eps);
  int8_quantize_row(x, n, a, q);
  return a / 127.0f;
}

// ---------------------------------------------------------------------------------------------
// Codecs over tensors.

Tensor encode_fp8(const TensorView& x, DType fp8_dtype) {
  constexpr const char* kApi = "encode_fp8";
  check_float_input(x, kApi, "x", 0);
  MOECORE_CHECK_DTYPE(fp8_dtype == DType::kF8E4M3 || fp8_dtype == DType::kF8E5M2, kApi,
                      ": expected dtype fp8_e4m3fn or fp8_e5m2, got ", dtype_name(fp8_dtype));
  const Rows rows(x);
  Tensor out = Tensor::empty(shape_of(x), fp8_dtype);
  uint8_t* q = out.ptr<uint8_t>();
  const int64_t cols = rows.cols();
  const bool e4m3 = fp8_dtype == DType::kF8E4M3;
  parallel_for(rows.rows(), [&](int64_t begin, int64_t end) {
    std::vector<float> buf(static_cast<size_t>(cols));
    for (int64_t r = begin; r < end; ++r) {
      rows.load_f32(r, buf.data());
      for (int64_t c = 0; c < cols; ++c)
        q[r * cols + c] = e4m3 ? f32_to_fp8_e4m3(buf[c]) : f32_to_fp8_e5m2(buf[c]);
    }
  });
  return out;
}

Tensor decode_to_f32(const TensorView& codes) {
  constexpr const char* kApi = "decode_to_f32";
  MOECORE_CHECK_DTYPE(
      codes.dtype == DType::kF8E4M3 || codes.dtype == DType::kF8E5M2 || codes.dtype == DType::kE8M0,
      kApi, ": expected codes dtype fp8_e4m3fn, fp8_e5m2 or e8m0, got ", dtype_name(codes.dtype));
  const Rows rows(codes);
  Tensor out = Tensor::empty(shape_of(codes), DType::kF32);
  float* o = out.ptr<float>();
  const int64_t cols = rows.cols();
  parallel_for(rows.rows(), [&](int64_t begin, int64_t end) {
    std::vector<uint8_t> buf(static_cast<size_t>(cols));
    for (int64_t r = begin; r < end; ++r) {
      rows.load_bytes(r, buf.data());
      for (int64_t c = 0; c < cols; ++c)
        o[r * cols + c] =
            codes.dtype == DType::kE8M0 ? e8m0_to_f32(buf[c]) : decode_fp8(buf[c], codes.dtype);
    }
  });
  return out;
}

Tensor encode_e2m1(const TensorView& x, bool ties_down) {
  constexpr const char* kApi = "encode_e2m1";
  check_float_input(x, kApi, "x", 1);
  const Rows rows(x);
  const int64_t cols = rows.cols();
  MOECORE_CHECK(cols % 2 == 0, kApi, ": expected an even last dim (two values per byte), got ",
                cols);
  std::vector<int64_t> shape = shape_of(x);
  shape.back() = cols / 2;
  Tensor out = Tensor::empty(shape, DType::kFp4E2M1x2);
  uint8_t* q = out.ptr<uint8_t>();
  parallel_for(rows.rows(), [&](int64_t begin, int64_t end) {
    std::vector<float> buf(static_cast<size_t>(cols));
    for (int64_t r = begin; r < end; ++r) {
      rows.load_f32(r, buf.data());
      for (int64_t c = 0; c < cols; c += 2) {
        const uint8_t lo = ties_down ? f32_to_e2m1_ties_down(buf[c]) : f32_to_e2m1_rne(buf[c]);
        const uint8_t hi =
            ties_down ? f32_to_e2m1_ties_down(buf[c + 1]) : f32_to_e2m1_rne(buf[c + 1]);
        q[(r * cols + c) / 2] = pack_e2m1x2(lo, hi);
      }
    }
  });
  return out;
}

Tensor unpack_e2m1(const TensorView& packed) {
  constexpr const char* kApi = "unpack_e2m1";
  check_packed_fp4(packed, kApi, "packed");
  const Rows rows(packed);
  const int64_t cols = rows.cols();
  std::vector<int64_t> shape = shape_of(packed);
  shape.back() = cols * 2;
  Tensor out = Tensor::empty(shape, DType::kU8);
  uint8_t* o = out.ptr<uint8_t>();
  parallel_for(rows.rows(), [&](int64_t begin, int64_t end) {
    std::vector<uint8_t> buf(static_cast<size_t>(cols));
    for (int64_t r = begin; r < end; ++r) {
      rows.load_bytes(r, buf.data());
      for (int64_t c = 0; c < cols; ++c) {
        o[(r * cols + c) * 2] = e2m1x2_lo(buf[c]);
        o[(r * cols + c) * 2 + 1] = e2m1x2_hi(buf[c]);
      }
    }
  });
  return out;
}

Tensor decode_e2m1(const TensorView& packed) {
  check_packed_fp4(packed, "decode_e2m1", "packed");
  Tensor nibbles = unpack_e2m1(packed);
  Tensor out = Tensor::empty(nibbles.view().shape_vector(), DType::kF32);
  const uint8_t* n = nibbles.ptr<uint8_t>();
  float* o = out.ptr<float>();
  for (int64_t i = 0; i < nibbles.numel(); ++i) o[i] = e2m1_to_f32(n[i]);
  return out;
}

Tensor pack_e2m1(const TensorView& nibbles) {
  constexpr const char* kApi = "pack_e2m1";
  MOECORE_CHECK_DTYPE(nibbles.dtype == DType::kU8, kApi, ": expected nibbles dtype u8, got ",
                      dtype_name(nibbles.dtype));
  MOECORE_CHECK(nibbles.ndim >= 1, kApi, ": expected nibbles with at least 1 dim, got a scalar");
  const Rows rows(nibbles);
  const int64_t cols = rows.cols();
  MOECORE_CHECK(cols % 2 == 0, kApi, ": expected an even last dim, got ", cols);
  std::vector<uint8_t> all(static_cast<size_t>(rows.rows() * cols));
  for (int64_t r = 0; r < rows.rows(); ++r) rows.load_bytes(r, all.data() + r * cols);
  for (size_t i = 0; i < all.size(); ++i)
    MOECORE_CHECK(all[i] < 16, kApi, ": expected nibble codes 0..15, got ", int(all[i]),
                  " at flat index ", i);
  std::vector<int64_t> shape = shape_of(nibbles);
  shape.back() = cols / 2;
  Tensor out = Tensor::empty(shape, DType::kFp4E2M1x2);
  uint8_t* o = out.ptr<uint8_t>();
  for (size_t i = 0; i < all.size(); i += 2) o[i / 2] = pack_e2m1x2(all[i], all[i + 1]);
  return out;
}

// ---------------------------------------------------------------------------------------------
// E8M0 / UE8M0.

Tensor round_scales_ue8m0(const TensorView& scale) {
  constexpr const char* kApi = "round_scales_ue8m0";
  check_scale_tensor(scale, kApi, "scale");
  const Rows rows(scale);
  Tensor out = Tensor::empty(shape_of(scale), DType::kF32);
  float* o = out.ptr<float>();
  const int64_t cols = rows.cols();
  std::vector<float> buf(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows.rows(); ++r) {
    rows.load_f32(r, buf.data());
    for (int64_t c = 0; c < cols; ++c) {
      const int e = ceil_log2(buf[c]);
      MOECORE_CHECK(e <= kE8M0MaxExp, kApi, ": expected scales ≤ 2^127 (E8M0 range), got ", buf[c]);
      o[r * cols + c] = ue8m0_round_up(buf[c]);
    }
  }
  return out;
}

Tensor scales_to_e8m0(const TensorView& scale) {
  constexpr const char* kApi = "scales_to_e8m0";
  MOECORE_CHECK_DTYPE(scale.dtype == DType::kF32, kApi, ": expected scale dtype f32, got ",
                      dtype_name(scale.dtype));
  const Rows rows(scale);
  Tensor out = Tensor::empty(shape_of(scale), DType::kE8M0);
  uint8_t* o = out.ptr<uint8_t>();
  const int64_t cols = rows.cols();
  std::vector<float> buf(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows.rows(); ++r) {
    rows.load_f32(r, buf.data());
    for (int64_t c = 0; c < cols; ++c)
      MOECORE_CHECK(e8m0_from_pow2(buf[c], &o[r * cols + c]), kApi,
                    ": expected powers of two in [2^-127, 2^127], got ", buf[c], " at row ", r,
                    " column ", c, " (round first with round_scales_ue8m0)");
  }
  return out;
}

Tensor e8m0_to_scales(const TensorView& e8m0) {
  constexpr const char* kApi = "e8m0_to_scales";
  MOECORE_CHECK_DTYPE(e8m0.dtype == DType::kE8M0 || e8m0.dtype == DType::kU8, kApi,
                      ": expected scale dtype e8m0 (or u8), got ", dtype_name(e8m0.dtype));
  const Rows rows(e8m0);
  Tensor out = Tensor::empty(shape_of(e8m0), DType::kF32);
  float* o = out.ptr<float>();
  const int64_t cols = rows.cols();
  std::vector<uint8_t> buf(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows.rows(); ++r) {
    rows.load_bytes(r, buf.data());
    for (int64_t c = 0; c < cols; ++c) {
      MOECORE_CHECK(buf[c] != kE8M0NaN, kApi,
                    ": expected E8M0 scales other than 0xFF (NaN), got "
                    "0xFF at row ",
                    r, " column ", c);
      o[r * cols + c] = e8m0_to_f32(buf[c]);
    }
  }
  return out;
}

Tensor pack_ue8m0(const TensorView& scale) {
  constexpr const char* kApi = "pack_ue8m0";
  MOECORE_CHECK(scale.ndim >= 1, kApi, ": expected scale with at least 1 dim, got a scalar");
  Tensor bytes = scales_to_e8m0(scale);  // validates dtype and powers of two
  const int64_t groups = scale.shape[scale.ndim - 1];
  const int64_t words = ceil_div(groups, 4);
  std::vector<int64_t> shape = shape_of(scale);
  shape.back() = words;
  Tensor out = Tensor::zeros(shape, DType::kI32);
  const uint8_t* b = bytes.ptr<uint8_t>();
  uint32_t* o = out.ptr<uint32_t>();
  const int64_t rows = groups == 0 ? 0 : bytes.numel() / groups;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g)
      o[r * words + g / 4] |= static_cast<uint32_t>(b[r * groups + g]) << (8 * (g % 4));
  return out;
}

Tensor unpack_ue8m0(const TensorView& packed, int64_t groups) {
  constexpr const char* kApi = "unpack_ue8m0";
  MOECORE_CHECK_DTYPE(packed.dtype == DType::kI32, kApi, ": expected packed dtype i32, got ",
                      dtype_name(packed.dtype));
  MOECORE_CHECK(packed.ndim >= 1, kApi, ": expected packed with at least 1 dim, got a scalar");
  const int64_t words = packed.shape[packed.ndim - 1];
  MOECORE_CHECK(groups >= 0 && ceil_div(groups, 4) == words, kApi, ": expected groups in (",
                4 * (words - 1), ", ", 4 * words, "] for ", words, " packed words, got ", groups);
  const Rows rows(packed);
  std::vector<int64_t> shape = shape_of(packed);
  shape.back() = groups;
  Tensor out = Tensor::empty(shape, DType::kF32);
  float* o = out.ptr<float>();
  std::vector<uint32_t> buf(static_cast<size_t>(words));
  for (int64_t r = 0; r < rows.rows(); ++r) {
    rows.load_bytes(r, buf.data());
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t code = static_cast<uint8_t>(buf[g / 4] >> (8 * (g % 4)));
      MOECORE_CHECK(code != kE8M0NaN, kApi,
                    ": expected E8M0 bytes other than 0xFF (NaN), got "
                    "0xFF at row ",
                    r, " group ", g);
      o[r * groups + g] = e8m0_to_f32(code);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// FP8.

namespace {

/// The static per-tensor rule over validated input.
Tensor fp8_static_unchecked(const TensorView& x, float scale) {
  const Rows rows(x);
  Tensor out = Tensor::empty(shape_of(x), DType::kF8E4M3);
  uint8_t* q = out.ptr<uint8_t>();
  const int64_t cols = rows.cols();
  parallel_for(rows.rows(), [&](int64_t begin, int64_t end) {
    std::vector<float> buf(static_cast<size_t>(cols));
    for (int64_t r = begin; r < end; ++r) {
      rows.load_f32(r, buf.data());
      fp8_quantize_row_static(buf.data(), cols, scale, q + r * cols);
    }
  });
  return out;
}

}  // namespace

Tensor quantize_fp8_static(const TensorView& x, float scale) {
  constexpr const char* kApi = "quantize_fp8_static";
  check_float_input(x, kApi, "x", 0);
  check_positive_scale(scale, kApi, "scale");
  check_finite(x, kApi, "x");
  return fp8_static_unchecked(x, scale);
}

QuantizedTensor quantize_fp8_per_tensor(const TensorView& x, float eps) {
  constexpr const char* kApi = "quantize_fp8_per_tensor";
  check_float_input(x, kApi, "x", 0);
  check_eps(eps, kApi);
  check_finite(x, kApi, "x");
  const Rows rows(x);
  const int64_t cols = rows.cols();
  std::vector<float> chunk_max;
  std::mutex mutex;
  parallel_for(rows.rows(), [&](int64_t begin, int64_t end) {
    std::vector<float> buf(static_cast<size_t>(cols));
    float m = 0.0f;
    for (int64_t r = begin; r < end; ++r) {
      rows.load_f32(r, buf.data());
      m = std::max(m, amax_row(buf.data(), cols));
    }
    std::lock_guard<std::mutex> lock(mutex);
    chunk_max.push_back(m);  // max is order-independent, so the push order does not matter
  });
  float amax = 0.0f;
  for (float m : chunk_max) amax = std::max(amax, m);
  const float scale = fp8_dynamic_scale(amax, eps);
  QuantizedTensor out{fp8_static_unchecked(x, scale), Tensor::empty({1}, DType::kF32)};
  out.scale.ptr<float>()[0] = scale;
  return out;
}

QuantizedTensor quantize_fp8_per_channel(const TensorView& w, float eps) {
  constexpr const char* kApi = "quantize_fp8_per_channel";
  check_float_input(w, kApi, "w", 1);
  check_eps(eps, kApi);
  check_finite(w, kApi, "w");
  return quantize_rows(w, DType::kF8E4M3, [eps](const float* x, int64_t n, uint8_t* q) {
    return fp8_quantize_row_per_token(x, n, eps, q);
  });
}

QuantizedTensor quantize_fp8_per_token(const TensorView& x, float eps) {
  constexpr const char* kApi = "quantize_fp8_per_token";
  check_float_input(x, kApi, "x", 1);
  check_eps(eps, kApi);
  check_finite(x, kApi, "x");
  return quantize_rows(x, DType::kF8E4M3, [eps](const float* v, int64_t n, uint8_t* q) {
    return fp8_quantize_row_per_token(v, n, eps, q);
  });
}

QuantizedTensor quantize_fp8_per_token_group(const TensorView& x, int64_t group_size, float eps,
                                             bool scale_ue8m0) {
  constexpr const char* kApi = "quantize_fp8_per_token_group";
  check_float_input(x, kApi, "x", 1);
  MOECORE_CHECK(group_size > 0, kApi, ": expected group_size > 0, got ", group_size);
  const Rows rows(x);
  const int64_t cols = rows.cols();
  MOECORE_CHECK(cols % group_size == 0, kApi,
                ": expected the last dim to be a multiple of "
                "group_size=",
                group_size, ", got ", cols);
  check_eps(eps, kApi);
  check_finite(x, kApi, "x");
  const int64_t groups = cols / group_size;
  std::vector<int64_t> scale_shape = shape_of(x);
  scale_shape.back() = groups;
  QuantizedTensor out{Tensor::empty(shape_of(x), DType::kF8E4M3),
                      Tensor::empty(scale_shape, DType::kF32)};
  uint8_t* q = out.q.ptr<uint8_t>();
  float* s = out.scale.ptr<float>();
  parallel_for(rows.rows(), [&](int64_t begin, int64_t end) {
    std::vector<float> buf(static_cast<size_t>(cols));
    for (int64_t r = begin; r < end; ++r) {
      rows.load_f32(r, buf.data());
      for (int64_t g = 0; g < groups; ++g) {
        s[r * groups + g] =
            fp8_quantize_group_row(buf.data() + g * group_size, group_size, eps, scale_ue8m0,
                                   Fp8GroupRule::kSglangCuda, q + r * cols + g * group_size);
      }
    }
  });
  return out;
}

QuantizedTensor quantize_fp8_block(const TensorView& w, int64_t block_n, int64_t block_k, float eps,
                                   bool scale_ue8m0) {
  constexpr const char* kApi = "quantize_fp8_block";
  check_float_input(w, kApi, "w", 2);
  MOECORE_CHECK(block_n > 0 && block_k > 0, kApi, ": expected block_n and block_k > 0, got [",
                block_n, ", ", block_k, "]");
  check_eps(eps, kApi);
  check_finite(w, kApi, "w");
  const Rows rows(w);
  const int64_t n = w.shape[w.ndim - 2], k = w.shape[w.ndim - 1];
  const int64_t nb = ceil_div(n, block_n), kb = ceil_div(k, block_k);
  const int64_t lead = n == 0 ? 0 : rows.rows() / n;
  std::vector<int64_t> scale_shape = leading_shape(w, 2);
  scale_shape.push_back(nb);
  scale_shape.push_back(kb);
  QuantizedTensor out{Tensor::empty(shape_of(w), DType::kF8E4M3),
                      Tensor::empty(scale_shape, DType::kF32)};
  uint8_t* q = out.q.ptr<uint8_t>();
  float* s = out.scale.ptr<float>();
  // One work item per (leading index, row block); two passes over its rows (amax, quantize).
  parallel_for(lead * nb, [&](int64_t begin, int64_t end) {
    std::vector<float> buf(static_cast<size_t>(k));
    std::vector<float> amax(static_cast<size_t>(kb));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t l = item / nb, ib = item % nb;
      const int64_t r0 = l * n + ib * block_n, r1 = l * n + std::min(n, (ib + 1) * block_n);
      std::fill(amax.begin(), amax.end(), 0.0f);
      for (int64_t r = r0; r < r1; ++r) {
        rows.load_f32(r, buf.data());
        for (int64_t j = 0; j < kb; ++j) {
          const int64_t c0 = j * block_k, len = std::min(k, c0 + block_k) - c0;
          amax[j] = std::fmax(amax[j], amax_row(buf.data() + c0, len));
        }
      }
      float* srow = s + item * kb;
      for (int64_t j = 0; j < kb; ++j) srow[j] = fp8_block_scale(amax[j], eps, scale_ue8m0);
      for (int64_t r = r0; r < r1; ++r) {
        rows.load_f32(r, buf.data());
        for (int64_t j = 0; j < kb; ++j) {
          const int64_t c0 = j * block_k, len = std::min(k, c0 + block_k) - c0;
          fp8_quantize_row_mul(buf.data() + c0, len, 1.0f / srow[j], q + r * k + c0);
        }
      }
    }
  });
  return out;
}

Tensor dequantize_fp8_per_tensor(const TensorView& q, float scale, DType out_dtype) {
  constexpr const char* kApi = "dequantize_fp8_per_tensor";
  MOECORE_CHECK_DTYPE(q.dtype == DType::kF8E4M3 || q.dtype == DType::kF8E5M2, kApi,
                      ": expected q dtype fp8_e4m3fn or fp8_e5m2, got ", dtype_name(q.dtype));
  check_positive_scale(scale, kApi, "scale");
  check_out_dtype(out_dtype, kApi);
  const Rows rows(q);
  const int64_t cols = rows.cols();
  Tensor out = Tensor::empty(shape_of(q), out_dtype);
  char* o = out.ptr<char>();
  const int64_t elem = dtype_size(out_dtype);
  parallel_for(rows.rows(), [&](int64_t begin, int64_t end) {
    std::vector<uint8_t> codes(static_cast<size_t>(cols));
    std::vector<float> buf(static_cast<size_t>(cols));
    for (int64_t r = begin; r < end; ++r) {
      rows.load_bytes(r, codes.data());
      for (int64_t c = 0; c < cols; ++c) buf[c] = decode_fp8(codes[c], q.dtype) * scale;
      store_f32(buf.data(), cols, out_dtype, o + r * cols * elem);
    }
  });
  return out;
}

Tensor dequantize_fp8_block(const TensorView& q, const TensorView& scale, int64_t block_n,
                            int64_t block_k, DType out_dtype) {
  constexpr const char* kApi = "dequantize_fp8_block";
  MOECORE_CHECK_DTYPE(q.dtype == DType::kF8E4M3 || q.dtype == DType::kF8E5M2, kApi,
                      ": expected q dtype fp8_e4m3fn or fp8_e5m2, got ", dtype_name(q.dtype));
  MOECORE_CHECK(q.ndim >= 2, kApi, ": expected q with at least 2 dims [..., N, K], got ",
                shape_string(shape_of(q)));
  MOECORE_CHECK(block_n > 0 && block_k > 0, kApi, ": expected block_n and block_k > 0, got [",
                block_n, ", ", block_k, "]");
  check_out_dtype(out_dtype, kApi);
  const int64_t n = q.shape[q.ndim - 2], k = q.shape[q.ndim - 1];
  const int64_t nb = ceil_div(n, block_n), kb = ceil_div(k, block_k);
  std::vector<int64_t> expected = leading_shape(q, 2);
  expected.push_back(nb);
  expected.push_back(kb);
  MOECORE_CHECK(shape_of(scale) == expected, kApi, ": expected scale shape ",
                shape_string(expected), " for q ", shape_string(shape_of(q)), " and block [",
                block_n, ", ", block_k, "], got ", shape_string(shape_of(scale)));
  check_scale_tensor(scale, kApi, "scale");
  const Rows qrows(q), srows(scale);
  const int64_t lead = n == 0 ? 0 : qrows.rows() / n;
  Tensor out = Tensor::empty(shape_of(q), out_dtype);
  char* o = out.ptr<char>();
  const int64_t elem = dtype_size(out_dtype);
  parallel_for(lead * n, [&](int64_t begin, int64_t end) {
    std::vector<uint8_t> codes(static_cast<size_t>(k));
    std::vector<float> srow(static_cast<size_t>(kb)), buf(static_cast<size_t>(k));
    for (int64_t r = begin; r < end; ++r) {
      const int64_t l = r / n, row = r % n;
      qrows.load_bytes(r, codes.data());
      srows.load_f32(l * nb + row / block_n, srow.data());
      for (int64_t c = 0; c < k; ++c) buf[c] = decode_fp8(codes[c], q.dtype) * srow[c / block_k];
      store_f32(buf.data(), k, out_dtype, o + r * k * elem);
    }
  });
  return out;
}

Tensor dequantize_fp8_per_row(const TensorView& q, const TensorView& scale, DType out_dtype) {
  constexpr const char* kApi = "dequantize_fp8_per_row";
  MOECORE_CHECK_DTYPE(q.dtype == DType::kF8E4M3 || q.dtype == DType::kF8E5M2, kApi,
                      ": expected q dtype fp8_e4m3fn or fp8_e5m2, got ", dtype_name(q.dtype));
  const DType dtype = q.dtype;
  return dequantize_rows(q, scale, out_dtype, kApi,
                         [dtype](uint8_t code) { return decode_fp8(code, dtype); });
}

Tensor dequantize_fp8_per_token_group(const TensorView& q, const TensorView& scale,
                                      int64_t group_size, DType out_dtype) {
  constexpr const char* kApi = "dequantize_fp8_per_token_group";
  MOECORE_CHECK(group_size > 0, kApi, ": expected group_size > 0, got ", group_size);
  MOECORE_CHECK(q.ndim >= 1, kApi, ": expected q with at least 1 dim [..., K], got a scalar");
  MOECORE_CHECK(q.shape[q.ndim - 1] % group_size == 0, kApi,
                ": expected the last dim to be a multiple of group_size=", group_size, ", got ",
                q.shape[q.ndim - 1]);
  if (q.ndim >= 2) return dequantize_fp8_block(q, scale, 1, group_size, out_dtype);
  // A single row [K] with scales [K/G]: the block rule on [1, K] and [1, K/G].
  MOECORE_CHECK(scale.ndim == 1, kApi, ": expected scale [K/G] for q ", shape_string(shape_of(q)),
                ", got ", shape_string(shape_of(scale)));
  Tensor out = dequantize_fp8_block(formats_detail::unsqueeze0(q),
                                    formats_detail::unsqueeze0(scale), 1, group_size, out_dtype);
  return Tensor(make_view(out.view().data, out_dtype, shape_of(q)), out.owner());
}

// ---------------------------------------------------------------------------------------------
// NVFP4.

Tensor nvfp4_global_scales(const TensorView& x, bool per_leading) {
  constexpr const char* kApi = "nvfp4_global_scales";
  check_float_input(x, kApi, "x", per_leading ? 2 : 0);
  check_finite(x, kApi, "x");
  const Rows rows(x);
  const int64_t cols = rows.cols();
  const int64_t groups = per_leading ? x.shape[0] : 1;
  const int64_t rows_per = groups == 0 ? 0 : rows.rows() / groups;
  Tensor out = Tensor::empty({groups}, DType::kF32);
  float* gs = out.ptr<float>();
  parallel_for(groups, [&](int64_t begin, int64_t end) {
    std::vector<float> buf(static_cast<size_t>(cols));
    for (int64_t g = begin; g < end; ++g) {
      float amax = 0.0f;
      for (int64_t r = g * rows_per; r < (g + 1) * rows_per; ++r) {
        rows.load_f32(r, buf.data());
        amax = std::max(amax, amax_row(buf.data(), cols));
      }
      gs[g] = amax == 0.0f ? 1.0f : (kFp8E4M3Max * kE2M1Max) / amax;
    }
  });
  return out;
}

QuantizedTensor quantize_nvfp4(const TensorView& x, const TensorView& global_scale) {
  constexpr const char* kApi = "quantize_nvfp4";
  check_float_input(x, kApi, "x", 1);
  const Rows rows(x);
  const int64_t cols = rows.cols();
  MOECORE_CHECK(cols % kNvfp4BlockSize == 0, kApi,
                ": expected the last dim to be a multiple of "
                "16 (NVFP4 block), got ",
                cols);
  const std::vector<float> gs = read_global_scales(global_scale, x, kApi);
  check_finite(x, kApi, "x");
  std::vector<int64_t> qshape = shape_of(x), sshape = shape_of(x);
  qshape.back() = cols / 2;
  sshape.back() = cols / kNvfp4BlockSize;
  QuantizedTensor out{Tensor::empty(qshape, DType::kFp4E2M1x2),
                      Tensor::empty(sshape, DType::kF8E4M3)};
  uint8_t* q = out.q.ptr<uint8_t>();
  uint8_t* sf = out.scale.ptr<uint8_t>();
  parallel_for(rows.rows(), [&](int64_t begin, int64_t end) {
    std::vector<float> buf(static_cast<size_t>(cols));
    for (int64_t r = begin; r < end; ++r) {
      rows.load_f32(r, buf.data());
      nvfp4_quantize_row(buf.data(), cols, global_scale_of_row(gs, r, rows.rows()),
                         q + r * (cols / 2), sf + r * (cols / kNvfp4BlockSize));
    }
  });
  return out;
}

QuantizedTensor quantize_nvfp4(const TensorView& x, float global_scale) {
  float gs = global_scale;
  return quantize_nvfp4(x, make_view(&gs, DType::kF32, {1}));
}

Tensor dequantize_nvfp4(const TensorView& q, const TensorView& block_scale,
                        const TensorView& global_scale, DType out_dtype) {
  constexpr const char* kApi = "dequantize_nvfp4";
  check_packed_fp4(q, kApi, "q");
  MOECORE_CHECK_DTYPE(block_scale.dtype == DType::kF8E4M3, kApi,
                      ": expected block_scale dtype fp8_e4m3fn, got ",
                      dtype_name(block_scale.dtype));
  check_same_leading(q, block_scale, 1, kApi, "q", "block_scale");
  const int64_t kbytes = q.shape[q.ndim - 1];
  MOECORE_CHECK(kbytes * 2 == block_scale.shape[block_scale.ndim - 1] * kNvfp4BlockSize, kApi,
                ": expected block_scale last dim K/16 = ", kbytes * 2 / kNvfp4BlockSize,
                " for q last dim K/2 = ", kbytes, " (K a multiple of 16), got ",
                block_scale.shape[block_scale.ndim - 1]);
  check_out_dtype(out_dtype, kApi);
  const std::vector<float> gs = read_global_scales(global_scale, q, kApi);
  const Rows qrows(q), srows(block_scale);
  const int64_t k = kbytes * 2, nsf = k / kNvfp4BlockSize;
  {  // block scales: non-negative and not NaN (a zero scale is a legitimate all-zero block)
    std::vector<uint8_t> sbuf(static_cast<size_t>(nsf));
    for (int64_t r = 0; r < srows.rows(); ++r) {
      srows.load_bytes(r, sbuf.data());
      for (int64_t c = 0; c < nsf; ++c)
        MOECORE_CHECK(sbuf[c] < 0x7f, kApi, ": expected block_scale finite and >= 0, got ",
                      fp8_e4m3_to_f32(sbuf[c]), " (code 0x", Hex{sbuf[c]}, ") at row ", r,
                      " block ", c);
    }
  }
  Tensor out = Tensor::empty(
      [&] {
        std::vector<int64_t> s = shape_of(q);
        s.back() = k;
        return s;
      }(),
      out_dtype);
  char* o = out.ptr<char>();
  const int64_t elem = dtype_size(out_dtype);
  parallel_for(qrows.rows(), [&](int64_t begin, int64_t end) {
    std::vector<uint8_t> codes(static_cast<size_t>(kbytes)), sf(static_cast<size_t>(nsf));
    std::vector<float> buf(static_cast<size_t>(k));
    for (int64_t r = begin; r < end; ++r) {
      qrows.load_bytes(r, codes.data());
      srows.load_bytes(r, sf.data());
      nvfp4_dequantize_row(codes.data(), sf.data(), k, global_scale_of_row(gs, r, qrows.rows()),
                           buf.data());
      store_f32(buf.data(), k, out_dtype, o + r * k * elem);
    }
  });
  return out;
}

Tensor dequantize_nvfp4(const TensorView& q, const TensorView& block_scale, float global_scale,
                        DType out_dtype) {
  float gs = global_scale;
  return dequantize_nvfp4(q, block_scale, make_view(&gs, DType::kF32, {1}), out_dtype);
}

// ---------------------------------------------------------------------------------------------
// MXFP4.

QuantizedTensor quantize_mxfp4(const TensorView& x, Mxfp4Rounding rounding) {
  constexpr const char* kApi = "quantize_mxfp4";
  check_float_input(x, kApi, "x", 1);
  const Rows rows(x);
  const int64_t cols = rows.cols();
  MOECORE_CHECK(cols % kMxfp4BlockSize == 0, kApi,
                ": expected the last dim to be a multiple of "
                "32 (MXFP4 block), got ",
                cols);
  check_finite(x, kApi, "x");
  std::vector<int64_t> qshape = shape_of(x), sshape = shape_of(x);
  qshape.back() = cols / 2;
  sshape.back() = cols / kMxfp4BlockSize;
  QuantizedTensor out{Tensor::empty(qshape, DType::kFp4E2M1x2),
                      Tensor::empty(sshape, DType::kE8M0)};
  uint8_t* q = out.q.ptr<uint8_t>();
  uint8_t* sf = out.scale.ptr<uint8_t>();
  parallel_for(rows.rows(), [&](int64_t begin, int64_t end) {
    std::vector<float> buf(static_cast<size_t>(cols));
    for (int64_t r = begin; r < end; ++r) {
      rows.load_f32(r, buf.data());
      mxfp4_quantize_row(buf.data(), cols, rounding, q + r * (cols / 2),
                         sf + r * (cols / kMxfp4BlockSize));
    }
  });
  return out;
}

Tensor dequantize_mxfp4(const TensorView& q, const TensorView& scale, DType out_dtype) {
  constexpr const char* kApi = "dequantize_mxfp4";
  check_packed_fp4(q, kApi, "q");
  MOECORE_CHECK_DTYPE(scale.dtype == DType::kE8M0 || scale.dtype == DType::kU8, kApi,
                      ": expected scale dtype e8m0 (or u8), got ", dtype_name(scale.dtype));
  check_same_leading(q, scale, 1, kApi, "q", "scale");
  const int64_t kbytes = q.shape[q.ndim - 1];
  MOECORE_CHECK(kbytes * 2 == scale.shape[scale.ndim - 1] * kMxfp4BlockSize, kApi,
                ": expected scale last dim K/32 = ", kbytes * 2 / kMxfp4BlockSize,
                " for q last dim K/2 = ", kbytes, " (K a multiple of 32), got ",
                scale.shape[scale.ndim - 1]);
  check_out_dtype(out_dtype, kApi);
  const Rows qrows(q), srows(scale);
  const int64_t k = kbytes * 2, nsf = k / kMxfp4BlockSize;
  {
    std::vector<uint8_t> sbuf(static_cast<size_t>(nsf));
    for (int64_t r = 0; r < srows.rows(); ++r) {
      srows.load_bytes(r, sbuf.data());
      for (int64_t c = 0; c < nsf; ++c)
        MOECORE_CHECK(sbuf[c] != kE8M0NaN, kApi,
                      ": expected E8M0 scales other than 0xFF (NaN), "
                      "got 0xFF at row ",
                      r, " block ", c);
    }
  }
  std::vector<int64_t> shape = shape_of(q);
  shape.back() = k;
  Tensor out = Tensor::empty(shape, out_dtype);
  char* o = out.ptr<char>();
  const int64_t elem = dtype_size(out_dtype);
  parallel_for(qrows.rows(), [&](int64_t begin, int64_t end) {
    std::vector<uint8_t> codes(static_cast<size_t>(kbytes)), sf(static_cast<size_t>(nsf));
    std::vector<float> buf(static_cast<size_t>(k));
    for (int64_t r = begin; r < end; ++r) {
      qrows.load_bytes(r, codes.data());
      srows.load_bytes(r, sf.data());
      mxfp4_dequantize_row(codes.data(), sf.data(), k, buf.data());
      store_f32(buf.data(), k, out_dtype, o + r * k * elem);
    }
  });
  return out;
}

// ---------------------------------------------------------------------------------------------
// INT8.

namespace {

QuantizedTensor quantize_int8_rows(const TensorView& x, float eps, const char* api,
                                   const char* what) {
  check_float_input(x, api, what, 1);
  check_eps(eps, api);
  check_finite(x, api, what);
  return quantize_rows(x, DType::kI8, [eps](const float* v, int64_t n, uint8_t* q) {
    return int8_quantize_row_per_token(v, n, eps, reinterpret_cast<int8_t*>(q));
  });
}

}  // namespace

QuantizedTensor quantize_int8_per_channel(const TensorView& w, float eps) {
  return quantize_int8_rows(w, eps, "quantize_int8_per_channel", "w");
}

QuantizedTensor quantize_int8_per_token(const TensorView& x, float eps) {
  return quantize_int8_rows(x, eps, "quantize_int8_per_token", "x");
}

Tensor dequantize_int8_per_row(const TensorView& q, const TensorView& scale, DType out_dtype) {
  constexpr const char* kApi = "dequantize_int8_per_row";
  MOECORE_CHECK_DTYPE(q.dtype == DType::kI8, kApi, ": expected q dtype i8, got ",
                      dtype_name(q.dtype));
  return dequantize_rows(q, scale, out_dtype, kApi, [](uint8_t code) {
    return static_cast<float>(static_cast<int8_t>(code));
  });
}

}  // namespace moecore
