// Layout transforms (layout.h). Most are one gather along a dim (gather_dim: each output entry of
// `dim` is one source entry or zeros), so every transform and its inverse share one tested copy
// loop; the swizzle and the SM90 layouts have their own index maps. Inputs are validated first.
#include "moecore/formats/layout.h"

#include <array>
#include <cstring>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/core/thread_pool.h"
#include "moecore/formats/view_util.h"

namespace moecore {

using formats_detail::ceil_div;
using formats_detail::normalize_dim;

namespace {

/// A contiguous Tensor with t's contents: t itself when already contiguous (borrowed), else a copy.
Tensor contiguous(const TensorView& t) {
  if (t.is_contiguous()) return Tensor(t, nullptr);
  return Tensor::copy_of(t);
}

void check_defined(const TensorView& t, const char* api, const char* what) {
  MOECORE_CHECK(t.data != nullptr || t.numel() == 0, api, ": expected ", what,
                " to be a tensor, got an undefined one");
}

/// New tensor equal to t except along `dim`, which gets `out_size` entries: entry o copies source
/// entry src[o] (all inner elements at once), or is zero-filled when src[o] < 0.
Tensor gather_dim(const TensorView& t, int dim, int64_t out_size, const std::vector<int64_t>& src) {
  const Tensor in = contiguous(t);
  const TensorView& v = in.view();
  int64_t outer = 1, inner = dtype_size(v.dtype);
  for (int d = 0; d < dim; ++d) outer *= v.shape[d];
  for (int d = dim + 1; d < v.ndim; ++d) inner *= v.shape[d];
  const int64_t size = v.shape[dim];
  std::vector<int64_t> shape = v.shape_vector();
  shape[dim] = out_size;
  Tensor out = Tensor::empty(shape, v.dtype);
  const char* from = static_cast<const char*>(v.data);
  char* to = out.ptr<char>();
  parallel_for(outer * out_size, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t o = item % out_size, block = item / out_size;
      char* dst = to + item * inner;
      if (src[o] < 0)
        std::memset(dst, 0, static_cast<size_t>(inner));
      else
        std::memcpy(dst, from + (block * size + src[o]) * inner, static_cast<size_t>(inner));
    }
  });
  return out;
}

/// Source index along `dim` of output index o for interleave_w13_halves (forward) or its inverse.
std::vector<int64_t> w13_interleave_map(int64_t size, int64_t group, bool inverse) {
  const int64_t split = size / 2;
  std::vector<int64_t> src(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) {
    // Interleaved position of half `which`, group `g`, offset `w` is (2g + which)·group + w.
    const int64_t which = i / split, j = i % split;
    const int64_t pos = (2 * (j / group) + which) * group + j % group;
    if (inverse)
      src[i] = pos;  // output i (halves order) reads interleaved position pos
    else
      src[pos] = i;
  }
  return src;
}

void check_w13_interleave_args(const TensorView& t, int64_t group_size, int dim) {
  // sglang's ValueError texts, verbatim (R12).
  if (t.shape[dim] % 2 != 0)
    MOECORE_THROW(InvalidArgument,
                  "Expected even size on interleave dimension for W13 half split.");
  const int64_t split = t.shape[dim] / 2;
  if (split % group_size != 0)
    MOECORE_THROW(InvalidArgument, "Expected split dim divisible by group_size=", group_size,
                  ", got ", split, ".");
}

int checked_dim(const TensorView& t, int dim, const char* api) {
  check_defined(t, api, "t");
  return normalize_dim(dim, t.ndim, api);
}

void check_even(const TensorView& t, int dim, const char* api) {
  MOECORE_CHECK(t.shape[dim] % 2 == 0, api, ": expected an even size along dim ", dim, ", got ",
                t.shape[dim]);
}

// SM90 FP4 weight interleave: destination bit of each source bit of the gathered 32-bit word
// (bytes (r, c), (r+8, c), (r, c+4), (r+8, c+4) little-endian). Read off the masks and shifts of
// TRT-LLM's interleave_fp4_weights_for_sm90_mixed_gemm_kernel, which FlashInfer calls.
constexpr int kSm90Fp4BitDest[32] = {6, 7, 8, 15, 22, 23, 24, 31, 3,  4,  5,  12, 19, 20, 21, 28,
                                     0, 1, 2, 9,  16, 17, 18, 25, 13, 10, 11, 14, 29, 26, 27, 30};

/// Per-byte lookup tables of a 32-bit permutation (forward or inverse): word → OR of 4 entries.
struct BitPermTables {
  std::array<std::array<uint32_t, 256>, 4> t{};
  explicit BitPermTables(bool inverse) {
    int dest[32];
    for (int b = 0; b < 32; ++b) {
      if (inverse)
        dest[kSm90Fp4BitDest[b]] = b;
      else
        dest[b] = kSm90Fp4BitDest[b];
    }
    for (int k = 0; k < 4; ++k)
      for (int v = 0; v < 256; ++v) {
        uint32_t o = 0;
        for (int bit = 0; bit < 8; ++bit)
          if ((v >> bit) & 1) o |= 1u << dest[8 * k + bit];
        t[k][v] = o;
      }
  }
  uint32_t operator()(uint32_t w) const {
    return t[0][w & 0xff] | t[1][(w >> 8) & 0xff] | t[2][(w >> 16) & 0xff] | t[3][w >> 24];
  }
};

Tensor sm90_fp4_weights(const TensorView& weight, const std::string& quant_type, bool inverse) {
  const char* api = inverse ? "deinterleave_moe_weights_for_sm90_mixed_gemm"
                            : "interleave_moe_weights_for_sm90_mixed_gemm";
  check_defined(weight, api, "weight");
  if (quant_type == "fp4_fp8" || quant_type == "int4")
    MOECORE_UNSUPPORTED(api, ": quant_type '", quant_type,
                        "' is not implemented (supported: 'fp4')");
  MOECORE_CHECK(quant_type == "fp4", api,
                ": expected quant_type 'fp4' (FlashInfer also names "
                "'fp4_fp8' and 'int4'), got '",
                quant_type, "'");
  MOECORE_CHECK_DTYPE(weight.dtype == DType::kFp4E2M1x2 || weight.dtype == DType::kU8, api,
                      ": expected weight dtype fp4_e2m1x2 (or u8), got ", dtype_name(weight.dtype));
  MOECORE_CHECK(weight.ndim == 3, api, ": expected weight [E, N, K/2], got ",
                shape_string(weight.shape_vector()));
  const int64_t e = weight.shape[0], n = weight.shape[1], kbytes = weight.shape[2];
  MOECORE_CHECK(n % 16 == 0, api, ": expected N divisible by 16, got ", n);
  MOECORE_CHECK(kbytes % 32 == 0, api,
                ": expected logical K divisible by 64 (K/2 bytes "
                "divisible by 32), got K = ",
                2 * kbytes);
  static const BitPermTables forward(false), backward(true);
  const BitPermTables& perm = inverse ? backward : forward;
  const Tensor in = contiguous(weight);
  const uint8_t* src = in.ptr<uint8_t>();
  Tensor out = Tensor::empty({e, n, kbytes}, weight.dtype);
  uint8_t* dst = out.ptr<uint8_t>();
  const int64_t tiles = n / 16;
  parallel_for(e * tiles, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t base = (item / tiles) * n * kbytes;
      const int64_t tile_row = (item % tiles) * 16;
      for (int64_t h = 0; h < 8; ++h) {
        const int64_t r = tile_row + h;
        for (int64_t p = 0; p < kbytes / 32; ++p) {
          for (int lane = 0; lane < 16; ++lane) {
            // Source: bytes c and c+4 of rows r and r+8; destination: 4 bytes at (dr, dc).
            const int64_t c = 32 * p + 8 * (lane / 4) + lane % 4;
            const int64_t dr = r + 8 * ((lane / 4) % 2);
            const int64_t dc = 32 * p + 16 * (lane / 8) + 4 * (lane % 4);
            const int64_t gathered[4] = {r * kbytes + c, (r + 8) * kbytes + c, r * kbytes + c + 4,
                                         (r + 8) * kbytes + c + 4};
            const int64_t packed = dr * kbytes + dc;
            if (!inverse) {
              uint32_t w = 0;
              for (int b = 0; b < 4; ++b)
                w |= static_cast<uint32_t>(src[base + gathered[b]]) << (8 * b);
              const uint32_t o = perm(w);
              for (int b = 0; b < 4; ++b)
                dst[base + packed + b] = static_cast<uint8_t>(o >> (8 * b));
            } else {
              uint32_t w = 0;
              for (int b = 0; b < 4; ++b)
                w |= static_cast<uint32_t>(src[base + packed + b]) << (8 * b);
              const uint32_t o = perm(w);
              for (int b = 0; b < 4; ++b)
                dst[base + gathered[b]] = static_cast<uint8_t>(o >> (8 * b));
            }
          }
        }
      }
    }
  });
  return out;
}

struct Sm90ScaleGeometry {
  int64_t gpk, physical_cols, m_slices, folded_m;
};

Sm90ScaleGeometry sm90_scale_geometry(DType dtype, int64_t group_size, const char* api) {
  MOECORE_CHECK(group_size > 0 && 128 % group_size == 0, api,
                ": expected group_size positive and dividing 128, got ", group_size);
  const int64_t elem = dtype_size(dtype);
  MOECORE_CHECK(elem == 1 || elem == 2 || elem == 4, api,
                ": expected a 1, 2 or 4-byte scale dtype, got ", dtype_name(dtype));
  Sm90ScaleGeometry g;
  g.gpk = 128 / group_size;
  g.physical_cols = 16 / elem;
  MOECORE_CHECK(g.physical_cols % g.gpk == 0, api, ": expected ", g.gpk,
                " scale groups per 128 columns to divide the ", g.physical_cols,
                " scales of 16 bytes (dtype ", dtype_name(dtype), ", group_size ", group_size, ")");
  g.m_slices = g.physical_cols / g.gpk;
  g.folded_m = 64 / g.m_slices;
  return g;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// NVFP4 swizzle.

Tensor swizzle_nvfp4_scales(const TensorView& scale) {
  constexpr const char* kApi = "swizzle_nvfp4_scales";
  check_defined(scale, kApi, "scale");
  MOECORE_CHECK(scale.ndim == 2 || scale.ndim == 3, kApi,
                ": expected scale [M, Kb] or [B, M, Kb],"
                " got ",
                shape_string(scale.shape_vector()));
  const Tensor in = contiguous(scale);
  const int64_t b = scale.ndim == 3 ? scale.shape[0] : 1;
  const int64_t m = scale.shape[scale.ndim - 2], kb = scale.shape[scale.ndim - 1];
  const int64_t mp = ceil_div(m, kSwizzleRowTile) * kSwizzleRowTile;
  const int64_t kbp = ceil_div(kb, kSwizzleColTile) * kSwizzleColTile;
  std::vector<int64_t> shape =
      scale.ndim == 3 ? std::vector<int64_t>{b, mp, kbp} : std::vector<int64_t>{mp, kbp};
  Tensor out = Tensor::zeros(shape, scale.dtype);
  const int64_t elem = dtype_size(scale.dtype);
  const char* src = in.ptr<char>();
  char* dst = out.ptr<char>();
  parallel_for(b * m, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t g = row / m, mi = row % m;
      for (int64_t k = 0; k < kb; ++k)
        std::memcpy(dst + (g * mp * kbp + nvfp4_swizzled_offset(mi, k, kbp)) * elem,
                    src + (row * kb + k) * elem, static_cast<size_t>(elem));
    }
  });
  return out;
}

Tensor unswizzle_nvfp4_scales(const TensorView& swizzled, int64_t m, int64_t kb) {
  constexpr const char* kApi = "unswizzle_nvfp4_scales";
  check_defined(swizzled, kApi, "swizzled");
  MOECORE_CHECK(swizzled.ndim == 2 || swizzled.ndim == 3, kApi,
                ": expected swizzled [Mp, Kbp] or [B, Mp, Kbp], got ",
                shape_string(swizzled.shape_vector()));
  MOECORE_CHECK(m >= 0 && kb >= 0, kApi, ": expected m, kb >= 0, got ", m, ", ", kb);
  const int64_t mp = swizzled.shape[swizzled.ndim - 2], kbp = swizzled.shape[swizzled.ndim - 1];
  MOECORE_CHECK(mp == ceil_div(m, kSwizzleRowTile) * kSwizzleRowTile &&
                    kbp == ceil_div(kb, kSwizzleColTile) * kSwizzleColTile,
                kApi, ": expected swizzled trailing dims [", ceil_div(m, 128) * 128, ", ",
                ceil_div(kb, 4) * 4, "] for m=", m, ", kb=", kb, ", got [", mp, ", ", kbp, "]");
  const Tensor in = contiguous(swizzled);
  const int64_t b = swizzled.ndim == 3 ? swizzled.shape[0] : 1;
  std::vector<int64_t> shape =
      swizzled.ndim == 3 ? std::vector<int64_t>{b, m, kb} : std::vector<int64_t>{m, kb};
  Tensor out = Tensor::empty(shape, swizzled.dtype);
  const int64_t elem = dtype_size(swizzled.dtype);
  const char* src = in.ptr<char>();
  char* dst = out.ptr<char>();
  parallel_for(b * m, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t g = row / m, mi = row % m;
      for (int64_t k = 0; k < kb; ++k)
        std::memcpy(dst + (row * kb + k) * elem,
                    src + (g * mp * kbp + nvfp4_swizzled_offset(mi, k, kbp)) * elem,
                    static_cast<size_t>(elem));
    }
  });
  return out;
}

TensorView nvfp4_scales_mma_view(const TensorView& swizzled) {
  constexpr const char* kApi = "nvfp4_scales_mma_view";
  check_defined(swizzled, kApi, "swizzled");
  MOECORE_CHECK(swizzled.ndim == 2 || swizzled.ndim == 3, kApi,
                ": expected swizzled [Mp, Kbp] or [B, Mp, Kbp], got ",
                shape_string(swizzled.shape_vector()));
  MOECORE_CHECK(swizzled.is_contiguous(), kApi,
                ": expected a contiguous swizzled tensor (the view reinterprets its storage)");
  const int64_t b = swizzled.ndim == 3 ? swizzled.shape[0] : 1;
  const int64_t mp = swizzled.shape[swizzled.ndim - 2], kbp = swizzled.shape[swizzled.ndim - 1];
  MOECORE_CHECK(mp % kSwizzleRowTile == 0 && kbp % kSwizzleColTile == 0, kApi,
                ": expected swizzled trailing dims multiples of [128, 4], got [", mp, ", ", kbp,
                "]");
  const int64_t mt = mp / 128, kt = kbp / 4;
  TensorView v;
  v.data = swizzled.data;
  v.dtype = swizzled.dtype;
  v.writable = swizzled.writable;
  v.ndim = 6;
  const int64_t shape[6] = {32, 4, mt, 4, kt, b};
  const int64_t strides[6] = {16, 4, kt * 512, 1, 512, mt * kt * 512};
  for (int d = 0; d < 6; ++d) {
    v.shape[d] = shape[d];
    v.strides[d] = strides[d];
  }
  return v;
}

TensorView nvfp4_scales_from_mma_view(const TensorView& mma) {
  constexpr const char* kApi = "nvfp4_scales_from_mma_view";
  check_defined(mma, kApi, "mma");
  MOECORE_CHECK(mma.ndim == 6 && mma.shape[0] == 32 && mma.shape[1] == 4 && mma.shape[3] == 4, kApi,
                ": expected an MMA view of shape [32, 4, m_tiles, 4, k_tiles, B], got ",
                shape_string(mma.shape_vector()));
  const int64_t mt = mma.shape[2], kt = mma.shape[4], b = mma.shape[5];
  const int64_t expected[6] = {16, 4, kt * 512, 1, 512, mt * kt * 512};
  for (int d = 0; d < 6; ++d)
    MOECORE_CHECK(mma.shape[d] == 1 || mma.strides[d] == expected[d], kApi,
                  ": expected the MMA view's strides [16, 4, ", kt * 512, ", 1, 512, ",
                  mt * kt * 512, "], got a different layout in dim ", d);
  TensorView v = make_view(mma.data, mma.dtype, {b, mt * 128, kt * 4});
  v.writable = mma.writable;
  return v;
}

// ---------------------------------------------------------------------------------------------
// Gate/up arrangements.

Tensor interleave_w13_halves(const TensorView& t, int64_t group_size, int dim) {
  constexpr const char* kApi = "interleave_w13_halves";
  const int d = checked_dim(t, dim, kApi);
  MOECORE_CHECK(group_size > 0, kApi, ": expected group_size > 0, got ", group_size);
  check_w13_interleave_args(t, group_size, d);
  return gather_dim(t, d, t.shape[d], w13_interleave_map(t.shape[d], group_size, false));
}

Tensor deinterleave_w13_halves(const TensorView& t, int64_t group_size, int dim) {
  constexpr const char* kApi = "deinterleave_w13_halves";
  const int d = checked_dim(t, dim, kApi);
  MOECORE_CHECK(group_size > 0, kApi, ": expected group_size > 0, got ", group_size);
  check_w13_interleave_args(t, group_size, d);
  return gather_dim(t, d, t.shape[d], w13_interleave_map(t.shape[d], group_size, true));
}

Tensor swap_w13_halves(const TensorView& t, int dim) {
  constexpr const char* kApi = "swap_w13_halves";
  const int d = checked_dim(t, dim, kApi);
  check_even(t, d, kApi);
  const int64_t size = t.shape[d], half = size / 2;
  std::vector<int64_t> src(static_cast<size_t>(size));
  for (int64_t o = 0; o < size; ++o) src[o] = o < half ? o + half : o - half;
  return gather_dim(t, d, size, src);
}

Tensor deinterleave_gate_up_rows(const TensorView& t, int dim) {
  constexpr const char* kApi = "deinterleave_gate_up_rows";
  const int d = checked_dim(t, dim, kApi);
  check_even(t, d, kApi);
  const int64_t size = t.shape[d], half = size / 2;
  std::vector<int64_t> src(static_cast<size_t>(size));
  for (int64_t o = 0; o < size; ++o) src[o] = o < half ? 2 * o : 2 * (o - half) + 1;
  return gather_dim(t, d, size, src);
}

Tensor interleave_gate_up_rows(const TensorView& t, int dim) {
  constexpr const char* kApi = "interleave_gate_up_rows";
  const int d = checked_dim(t, dim, kApi);
  check_even(t, d, kApi);
  const int64_t size = t.shape[d], half = size / 2;
  std::vector<int64_t> src(static_cast<size_t>(size));
  for (int64_t o = 0; o < size; ++o) src[o] = (o % 2 == 0) ? o / 2 : half + o / 2;
  return gather_dim(t, d, size, src);
}

// ---------------------------------------------------------------------------------------------
// Padding.

Tensor pad_dim(const TensorView& t, int dim, int64_t padded_size) {
  constexpr const char* kApi = "pad_dim";
  const int d = checked_dim(t, dim, kApi);
  MOECORE_CHECK(padded_size >= t.shape[d], kApi, ": expected padded_size >= ", t.shape[d],
                " (the size of dim ", d, "), got ", padded_size);
  std::vector<int64_t> src(static_cast<size_t>(padded_size));
  for (int64_t o = 0; o < padded_size; ++o) src[o] = o < t.shape[d] ? o : -1;
  return gather_dim(t, d, padded_size, src);
}

Tensor unpad_dim(const TensorView& t, int dim, int64_t size) {
  constexpr const char* kApi = "unpad_dim";
  const int d = checked_dim(t, dim, kApi);
  MOECORE_CHECK(size >= 0 && size <= t.shape[d], kApi, ": expected size in [0, ", t.shape[d],
                "] (the size of dim ", d, "), got ", size);
  std::vector<int64_t> src(static_cast<size_t>(size));
  for (int64_t o = 0; o < size; ++o) src[o] = o;
  return gather_dim(t, d, size, src);
}

Tensor pad_w13_intermediate(const TensorView& w13, int64_t padded_size, bool gated, int dim) {
  constexpr const char* kApi = "pad_w13_intermediate";
  const int d = checked_dim(w13, dim, kApi);
  if (!gated) return pad_dim(w13, d, padded_size);
  check_even(w13, d, kApi);
  const int64_t half = w13.shape[d] / 2;
  MOECORE_CHECK(padded_size >= half, kApi, ": expected padded_size >= ", half, " (half of dim ", d,
                "), got ", padded_size);
  std::vector<int64_t> src(static_cast<size_t>(2 * padded_size));
  for (int64_t o = 0; o < 2 * padded_size; ++o) {
    const int64_t which = o / padded_size, j = o % padded_size;
    src[o] = j < half ? which * half + j : -1;
  }
  return gather_dim(w13, d, 2 * padded_size, src);
}

Tensor unpad_w13_intermediate(const TensorView& w13, int64_t size, bool gated, int dim) {
  constexpr const char* kApi = "unpad_w13_intermediate";
  const int d = checked_dim(w13, dim, kApi);
  if (!gated) return unpad_dim(w13, d, size);
  check_even(w13, d, kApi);
  const int64_t half = w13.shape[d] / 2;
  MOECORE_CHECK(size >= 0 && size <= half, kApi, ": expected size in [0, ", half, "] (half of dim ",
                d, "), got ", size);
  std::vector<int64_t> src(static_cast<size_t>(2 * size));
  for (int64_t o = 0; o < 2 * size; ++o) src[o] = (o / size) * half + o % size;
  return gather_dim(w13, d, 2 * size, src);
}

// ---------------------------------------------------------------------------------------------
// FlashInfer SM90.

Tensor interleave_moe_weights_for_sm90_mixed_gemm(const TensorView& weight,
                                                  const std::string& quant_type) {
  return sm90_fp4_weights(weight, quant_type, false);
}

Tensor deinterleave_moe_weights_for_sm90_mixed_gemm(const TensorView& weight,
                                                    const std::string& quant_type) {
  return sm90_fp4_weights(weight, quant_type, true);
}

namespace {
// Moves scale bytes between the linear [E, rows, K/group] layout and FlashInfer's folded
// [E, rows/64, K/128, folded_m, physical_cols] layout: folded element [e, a, kb, f, s·gpk + gi]
// is linear element [e, a·64 + s·folded_m + f, kb·gpk + gi]. `fold` picks the direction.
void move_sm90_scales(const char* src, char* dst, int64_t elem, int64_t e, int64_t rows,
                      int64_t kb128, const Sm90ScaleGeometry& g, bool fold) {
  const int64_t r64 = rows / 64, kgs = kb128 * g.gpk;
  parallel_for(e * r64, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t ei = item / r64, a = item % r64;
      for (int64_t kb = 0; kb < kb128; ++kb)
        for (int64_t f = 0; f < g.folded_m; ++f)
          for (int64_t s = 0; s < g.m_slices; ++s)
            for (int64_t gi = 0; gi < g.gpk; ++gi) {
              const int64_t folded =
                  (((item * kb128 + kb) * g.folded_m + f) * g.physical_cols) + s * g.gpk + gi;
              const int64_t linear = (ei * rows + a * 64 + s * g.folded_m + f) * kgs + kb * g.gpk + gi;
              const int64_t o = fold ? folded : linear, i = fold ? linear : folded;
              std::memcpy(dst + o * elem, src + i * elem, static_cast<size_t>(elem));
            }
    }
  });
}
}  // namespace

Tensor interleave_moe_scales_for_sm90_mixed_gemm(const TensorView& scales, int64_t group_size) {
  constexpr const char* kApi = "interleave_moe_scales_for_sm90_mixed_gemm";
  check_defined(scales, kApi, "scales");
  MOECORE_CHECK(scales.ndim == 3, kApi, ": expected scales [E, rows, K/group_size], got ",
                shape_string(scales.shape_vector()));
  const Sm90ScaleGeometry g = sm90_scale_geometry(scales.dtype, group_size, kApi);
  const int64_t e = scales.shape[0], rows = scales.shape[1], kgs = scales.shape[2];
  MOECORE_CHECK(rows % 64 == 0, kApi, ": expected rows divisible by 64, got ", rows);
  MOECORE_CHECK(kgs % g.gpk == 0, kApi, ": expected K/group_size divisible by ", g.gpk,
                " (scale groups per 128 columns), got ", kgs);
  const int64_t kb128 = kgs / g.gpk;
  const Tensor in = contiguous(scales);
  const int64_t elem = dtype_size(scales.dtype);
  Tensor out = Tensor::empty({e, rows / 64, kb128, g.folded_m, g.physical_cols}, scales.dtype);
  const char* src = in.ptr<char>();
  char* dst = out.ptr<char>();
  move_sm90_scales(src, dst, elem, e, rows, kb128, g, /*fold=*/true);
  return out;
}

Tensor deinterleave_moe_scales_for_sm90_mixed_gemm(const TensorView& folded, int64_t group_size) {
  constexpr const char* kApi = "deinterleave_moe_scales_for_sm90_mixed_gemm";
  check_defined(folded, kApi, "folded");
  const Sm90ScaleGeometry g = sm90_scale_geometry(folded.dtype, group_size, kApi);
  MOECORE_CHECK(
      folded.ndim == 5 && folded.shape[3] == g.folded_m && folded.shape[4] == g.physical_cols, kApi,
      ": expected folded scales [E, rows/64, K/128, ", g.folded_m, ", ", g.physical_cols, "], got ",
      shape_string(folded.shape_vector()));
  const int64_t e = folded.shape[0], r64 = folded.shape[1], kb128 = folded.shape[2];
  const int64_t rows = r64 * 64, kgs = kb128 * g.gpk;
  const Tensor in = contiguous(folded);
  const int64_t elem = dtype_size(folded.dtype);
  Tensor out = Tensor::empty({e, rows, kgs}, folded.dtype);
  const char* src = in.ptr<char>();
  char* dst = out.ptr<char>();
  move_sm90_scales(src, dst, elem, e, rows, kb128, g, /*fold=*/false);
  return out;
}

}  // namespace moecore
