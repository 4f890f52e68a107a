// Format bindings: the codecs, quantizers and layout transforms of cpp/moecore/formats/ as the
// submodule _moecore.formats (public face: python/moecore/formats.py). Arrays cross without copies
// (convert.h); fp8 / e8m0 results come back as ml_dtypes arrays, packed fp4 as uint8. The GIL is
// released around every computation; inputs are converted (and validated) before that.
#include <optional>
#include <utility>

#include "bind_all.h"
#include "moecore/formats/layout.h"
#include "moecore/formats/quantize.h"

namespace moecore::bindings {
namespace {

/// Runs f() with the GIL released and returns its result.
template <typename F>
auto nogil(F&& f) {
  py::gil_scoped_release release;
  return f();
}

DType out_dtype_of(py::handle obj) {
  const std::optional<DType> d = to_dtype(obj);
  return d ? *d : DType::kF32;
}

py::tuple pair(const QuantizedTensor& q) {
  return py::make_tuple(to_numpy(q.q), to_numpy(q.scale));
}

/// A global scale given as a Python/numpy number rather than an array.
bool is_scalar(py::handle obj) {
  return !py::isinstance<py::array>(obj) && !py::hasattr(obj, "__moecore_tagged__");
}

#define MOECORE_OUT_DTYPE_DOC " out_dtype: 'f32' (default), 'f16' or 'bf16'."

void bind_codecs(py::module_& m) {
  m.def(
      "encode_fp8",
      [](py::object x, py::object dtype) {
        Tensor t = to_required_tensor(x, "encode_fp8: x");
        const std::optional<DType> d = to_dtype(dtype);
        MOECORE_CHECK(d.has_value(), "encode_fp8: expected dtype fp8_e4m3fn or fp8_e5m2, got None");
        return to_numpy(nogil([&] { return encode_fp8(t.view(), *d); }));
      },
      "x"_a, "dtype"_a = "fp8_e4m3fn",
      "x (f32/f16/bf16) → fp8 codes (float8_e4m3fn or float8_e5m2), round to nearest even. "
      "Saturates like the GPU kernels: |x| beyond the finite max (448 / 57344) and ±inf become "
      "±max (ml_dtypes would give NaN/inf); NaN stays NaN.");
  m.def(
      "decode_to_f32",
      [](py::object codes) {
        Tensor t = to_required_tensor(codes, "decode_to_f32: codes");
        return to_numpy(nogil([&] { return decode_to_f32(t.view()); }));
      },
      "codes"_a, "fp8 e4m3fn / e5m2 or e8m0 codes → float32, exact (NaN codes give NaN).");
  m.def(
      "encode_e2m1",
      [](py::object x, bool ties_down) {
        Tensor t = to_required_tensor(x, "encode_e2m1: x");
        return to_numpy(nogil([&] { return encode_e2m1(t.view(), ties_down); }));
      },
      "x"_a, "ties_down"_a = false,
      "x [..., K] (K even) → packed E2M1 uint8 [..., K/2], element 2i in the low nibble. Round "
      "half to even with saturation to ±6 (NVFP4/OCP), or sglang's MXFP4QuantizeUtil rule with "
      "ties_down=True (midpoints round down, zero encodes as 0x8).");
  m.def(
      "decode_e2m1",
      [](py::object packed) {
        Tensor t = to_required_tensor(packed, "decode_e2m1: packed");
        return to_numpy(nogil([&] { return decode_e2m1(t.view()); }));
      },
      "packed"_a, "Packed E2M1 uint8 [..., Kb] → float32 [..., 2·Kb], exact.");
  m.def(
      "pack_e2m1",
      [](py::object nibbles) {
        Tensor t = to_required_tensor(nibbles, "pack_e2m1: nibbles");
        return to_numpy(nogil([&] { return pack_e2m1(t.view()); }));
      },
      "nibbles"_a,
      "uint8 nibble codes [..., K] (0..15, K even) → packed uint8 [..., K/2], low "
      "nibble first.");
  m.def(
      "unpack_e2m1",
      [](py::object packed) {
        Tensor t = to_required_tensor(packed, "unpack_e2m1: packed");
        return to_numpy(nogil([&] { return unpack_e2m1(t.view()); }));
      },
      "packed"_a, "Packed uint8 [..., Kb] → nibble codes uint8 [..., 2·Kb].");

  m.def(
      "round_scales_ue8m0",
      [](py::object s) {
        Tensor t = to_required_tensor(s, "round_scales_ue8m0: scale");
        return to_numpy(nogil([&] { return round_scales_ue8m0(t.view()); }));
      },
      "scale"_a,
      "float32 scales (finite, > 0) → 2^ceil(log2 s) (UE8M0 rounding, spec §7.4), "
      "at least 2^-127.");
  m.def(
      "scales_to_e8m0",
      [](py::object s) {
        Tensor t = to_required_tensor(s, "scales_to_e8m0: scale");
        return to_numpy(nogil([&] { return scales_to_e8m0(t.view()); }));
      },
      "scale"_a,
      "float32 powers of two in [2^-127, 2^127] → float8_e8m0fnu bytes (their exponent "
      "field); anything else raises ValueError.");
  m.def(
      "e8m0_to_scales",
      [](py::object s) {
        Tensor t = to_required_tensor(s, "e8m0_to_scales: e8m0");
        return to_numpy(nogil([&] { return e8m0_to_scales(t.view()); }));
      },
      "e8m0"_a,
      "float8_e8m0fnu (or uint8) scale bytes → float32 2^(e-127); 0xFF raises "
      "ValueError.");
  m.def(
      "pack_ue8m0",
      [](py::object s) {
        Tensor t = to_required_tensor(s, "pack_ue8m0: scale");
        return to_numpy(nogil([&] { return pack_ue8m0(t.view()); }));
      },
      "scale"_a,
      "float32 powers of two [..., G] → int32 [..., ceil(G/4)], 4 E8M0 bytes per word "
      "little-endian, tail bytes 0 (DeepGEMM's packed UE8M0).");
  m.def(
      "unpack_ue8m0",
      [](py::object packed, int64_t groups) {
        Tensor t = to_required_tensor(packed, "unpack_ue8m0: packed");
        return to_numpy(nogil([&] { return unpack_ue8m0(t.view(), groups); }));
      },
      "packed"_a, "groups"_a, "Inverse of pack_ue8m0 → float32 [..., groups].");
}

void bind_quantizers(py::module_& m) {
  m.def(
      "quantize_fp8_static",
      [](py::object x, float scale) {
        Tensor t = to_required_tensor(x, "quantize_fp8_static: x");
        return to_numpy(nogil([&] { return quantize_fp8_static(t.view(), scale); }));
      },
      "x"_a, "scale"_a,
      "Static per-tensor FP8 (sgl-kernel per_tensor_quant_fp8): q = e4m3(clamp(x · "
      "fp32(1/scale), ±448)), scale finite > 0.");
  m.def(
      "quantize_fp8_per_tensor",
      [](py::object x, float eps) {
        Tensor t = to_required_tensor(x, "quantize_fp8_per_tensor: x");
        return pair(nogil([&] { return quantize_fp8_per_tensor(t.view(), eps); }));
      },
      "x"_a, "eps"_a = kDefaultMinAmax,
      "Dynamic per-tensor FP8 → (q e4m3, scale f32 [1]), s = max(amax, eps)/448, then the "
      "static rule (sgl-kernel per_tensor_quant_fp8).");
  m.def(
      "quantize_fp8_per_channel",
      [](py::object w, float eps) {
        Tensor t = to_required_tensor(w, "quantize_fp8_per_channel: w");
        return pair(nogil([&] { return quantize_fp8_per_channel(t.view(), eps); }));
      },
      "w"_a, "eps"_a = kDefaultMinAmax,
      "Per-output-channel FP8 of w [..., N, K] → (q, scale f32 [..., N, 1]); the per-token rule "
      "(sgl-kernel per_token_quant_fp8): s = max(amax, eps)/448, q = e4m3(clamp(x · fp32(1/s))).");
  m.def(
      "quantize_fp8_per_token",
      [](py::object x, float eps) {
        Tensor t = to_required_tensor(x, "quantize_fp8_per_token: x");
        return pair(nogil([&] { return quantize_fp8_per_token(t.view(), eps); }));
      },
      "x"_a, "eps"_a = kDefaultMinAmax,
      "Per-token FP8 of x [..., T, H] → (q, scale f32 [..., T, 1]) (sgl-kernel "
      "per_token_quant_fp8): s = max(amax, eps)/448, q = e4m3(clamp(x · fp32(1/s))).");
  m.def(
      "quantize_fp8_per_token_group",
      [](py::object x, int64_t group_size, float eps, bool scale_ue8m0) {
        Tensor t = to_required_tensor(x, "quantize_fp8_per_token_group: x");
        return pair(nogil(
            [&] { return quantize_fp8_per_token_group(t.view(), group_size, eps, scale_ue8m0); }));
      },
      "x"_a, "group_size"_a = kFp8GroupSize, "eps"_a = kDefaultMinAmax, "scale_ue8m0"_a = false,
      "Per-token-group FP8 (1×G, K % G == 0; sgl-kernel per_token_group_quant_8bit) → (q, scale "
      "f32 [..., K/G]); s = max(amax, eps)/448, with scale_ue8m0 s = 2^ceil(log2 max(s, 1e-10)); "
      "q = e4m3(clamp(x / s)).");
  m.def(
      "quantize_fp8_block",
      [](py::object w, int64_t block_n, int64_t block_k, float eps, bool scale_ue8m0) {
        Tensor t = to_required_tensor(w, "quantize_fp8_block: w");
        return pair(nogil(
            [&] { return quantize_fp8_block(t.view(), block_n, block_k, eps, scale_ue8m0); }));
      },
      "w"_a, "block_n"_a = kFp8WeightBlock, "block_k"_a = kFp8WeightBlock,
      "eps"_a = kDefaultMinAmax, "scale_ue8m0"_a = false,
      "Block FP8 of w [..., N, K] (edge tiles may be partial; DeepGEMM per_block_cast_to_fp8) → "
      "(q, weight_scale_inv f32 [..., ceil(N/bn), ceil(K/bk)]), the dequant multiplier per tile; "
      "s = max(amax, eps)/448 (UE8M0: 2^ceil(log2 s)), q = e4m3(clamp(x · fp32(1/s))).");
  m.def(
      "dequantize_fp8_per_tensor",
      [](py::object q, float scale, py::object out_dtype) {
        Tensor t = to_required_tensor(q, "dequantize_fp8_per_tensor: q");
        const DType od = out_dtype_of(out_dtype);
        return to_numpy(nogil([&] { return dequantize_fp8_per_tensor(t.view(), scale, od); }));
      },
      "q"_a, "scale"_a, "out_dtype"_a = "f32", "x = q · scale." MOECORE_OUT_DTYPE_DOC);
  m.def(
      "dequantize_fp8_per_row",
      [](py::object q, py::object scale, py::object out_dtype) {
        Tensor tq = to_required_tensor(q, "dequantize_fp8_per_row: q");
        Tensor ts = to_required_tensor(scale, "dequantize_fp8_per_row: scale");
        const DType od = out_dtype_of(out_dtype);
        return to_numpy(nogil([&] { return dequantize_fp8_per_row(tq.view(), ts.view(), od); }));
      },
      "q"_a, "scale"_a, "out_dtype"_a = "f32",
      "x = q · scale with scale [..., R, 1] (per channel or per token)." MOECORE_OUT_DTYPE_DOC);
  m.def(
      "dequantize_fp8_per_token_group",
      [](py::object q, py::object scale, int64_t group_size, py::object out_dtype) {
        Tensor tq = to_required_tensor(q, "dequantize_fp8_per_token_group: q");
        Tensor ts = to_required_tensor(scale, "dequantize_fp8_per_token_group: scale");
        const DType od = out_dtype_of(out_dtype);
        return to_numpy(nogil(
            [&] { return dequantize_fp8_per_token_group(tq.view(), ts.view(), group_size, od); }));
      },
      "q"_a, "scale"_a, "group_size"_a = kFp8GroupSize, "out_dtype"_a = "f32",
      "x = q · scale with scale [..., K/G]." MOECORE_OUT_DTYPE_DOC);
  m.def(
      "dequantize_fp8_block",
      [](py::object q, py::object scale, int64_t block_n, int64_t block_k, py::object out_dtype) {
        Tensor tq = to_required_tensor(q, "dequantize_fp8_block: q");
        Tensor ts = to_required_tensor(scale, "dequantize_fp8_block: scale");
        const DType od = out_dtype_of(out_dtype);
        return to_numpy(nogil(
            [&] { return dequantize_fp8_block(tq.view(), ts.view(), block_n, block_k, od); }));
      },
      "q"_a, "scale"_a, "block_n"_a = kFp8WeightBlock, "block_k"_a = kFp8WeightBlock,
      "out_dtype"_a = "f32",
      "x = q · scale[n / bn, k / bk] for q [..., N, K]." MOECORE_OUT_DTYPE_DOC);

  m.def(
      "nvfp4_global_scales",
      [](py::object x, bool per_leading) {
        Tensor t = to_required_tensor(x, "nvfp4_global_scales: x");
        return to_numpy(nogil([&] { return nvfp4_global_scales(t.view(), per_leading); }));
      },
      "x"_a, "per_leading"_a = true,
      "NVFP4 global scales gs = 448·6/amax (f32 [E] per leading index, or [1]); an all-zero "
      "slice gets 1. ModelOpt's weight_scale_2 is 1/gs.");
  m.def(
      "quantize_nvfp4",
      [](py::object x, py::object global_scale) {
        Tensor t = to_required_tensor(x, "quantize_nvfp4: x");
        if (is_scalar(global_scale)) {
          const float gs = global_scale.cast<float>();
          return pair(nogil([&] { return quantize_nvfp4(t.view(), gs); }));
        }
        Tensor g = to_required_tensor(global_scale, "quantize_nvfp4: global_scale");
        return pair(nogil([&] { return quantize_nvfp4(t.view(), g.view()); }));
      },
      "x"_a, "global_scale"_a,
      "NVFP4 (spec §7.2) of x [..., K] (K % 16 == 0) → (packed uint8 [..., K/2], block scales "
      "float8_e4m3fn [..., K/16], linear layout). global_scale: a float or float32 [x.shape[0]] "
      "(one per expert). Also the activation-side quantize (gs = 1/input_scale).");
  m.def(
      "dequantize_nvfp4",
      [](py::object q, py::object block_scale, py::object global_scale, py::object out_dtype) {
        Tensor tq = to_required_tensor(q, "dequantize_nvfp4: q");
        Tensor ts = to_required_tensor(block_scale, "dequantize_nvfp4: block_scale");
        const DType od = out_dtype_of(out_dtype);
        if (is_scalar(global_scale)) {
          const float gs = global_scale.cast<float>();
          return to_numpy(nogil([&] { return dequantize_nvfp4(tq.view(), ts.view(), gs, od); }));
        }
        Tensor g = to_required_tensor(global_scale, "dequantize_nvfp4: global_scale");
        return to_numpy(
            nogil([&] { return dequantize_nvfp4(tq.view(), ts.view(), g.view(), od); }));
      },
      "q"_a, "block_scale"_a, "global_scale"_a = 1.0f, "out_dtype"_a = "f32",
      "x = (e2m1 · s_e4m3) / gs." MOECORE_OUT_DTYPE_DOC);

  m.def(
      "quantize_mxfp4",
      [](py::object x, const std::string& rounding) {
        Tensor t = to_required_tensor(x, "quantize_mxfp4: x");
        const Mxfp4Rounding r = parse_mxfp4_rounding(rounding);
        return pair(nogil([&] { return quantize_mxfp4(t.view(), r); }));
      },
      "x"_a, "rounding"_a = "sglang_ceil",
      "MXFP4 (OCP MX, spec §7.3) of x [..., K] (K % 32 == 0) → (packed uint8 [..., K/2], "
      "float8_e8m0fnu [..., K/32]). rounding: 'sglang_ceil' (MXFP4QuantizeUtil: E = "
      "ceil(log2(amax/6)), ties down) or 'ocp_floor' (E = floor(log2 amax) - 2, RNE, saturating).");
  m.def(
      "dequantize_mxfp4",
      [](py::object q, py::object scale, py::object out_dtype) {
        Tensor tq = to_required_tensor(q, "dequantize_mxfp4: q");
        Tensor ts = to_required_tensor(scale, "dequantize_mxfp4: scale");
        const DType od = out_dtype_of(out_dtype);
        return to_numpy(nogil([&] { return dequantize_mxfp4(tq.view(), ts.view(), od); }));
      },
      "q"_a, "scale"_a, "out_dtype"_a = "f32",
      "x = e2m1 · 2^(e-127), exact; scale float8_e8m0fnu or uint8, 0xFF "
      "raises." MOECORE_OUT_DTYPE_DOC);

  m.def(
      "quantize_int8_per_channel",
      [](py::object w, float eps) {
        Tensor t = to_required_tensor(w, "quantize_int8_per_channel: w");
        return pair(nogil([&] { return quantize_int8_per_channel(t.view(), eps); }));
      },
      "w"_a, "eps"_a = kDefaultMinAmax,
      "Symmetric INT8 per output channel of w [..., N, K] → (q int8, scale f32 [..., N, 1]); "
      "sglang's per_token_quant_int8: a = max(amax, eps), s = a/127, q = round_half_away(x · "
      "fp32(127/a)).");
  m.def(
      "quantize_int8_per_token",
      [](py::object x, float eps) {
        Tensor t = to_required_tensor(x, "quantize_int8_per_token: x");
        return pair(nogil([&] { return quantize_int8_per_token(t.view(), eps); }));
      },
      "x"_a, "eps"_a = kDefaultMinAmax,
      "Symmetric INT8 per token of x [..., T, H] → (q int8, scale f32 [..., T, 1]); sglang's "
      "per_token_quant_int8 (ties away from zero).");
  m.def(
      "dequantize_int8_per_row",
      [](py::object q, py::object scale, py::object out_dtype) {
        Tensor tq = to_required_tensor(q, "dequantize_int8_per_row: q");
        Tensor ts = to_required_tensor(scale, "dequantize_int8_per_row: scale");
        const DType od = out_dtype_of(out_dtype);
        return to_numpy(nogil([&] { return dequantize_int8_per_row(tq.view(), ts.view(), od); }));
      },
      "q"_a, "scale"_a, "out_dtype"_a = "f32",
      "x = q · scale for int8 q [..., R, K], scale f32 [..., R, 1]." MOECORE_OUT_DTYPE_DOC);
}

/// Binds a one-tensor layout transform `fn(view, args...)`.
template <typename Fn, typename... Args>
py::object layout_call(const char* what, py::object t, Fn fn, Args... args) {
  Tensor tt = to_required_tensor(t, what);
  return to_numpy(nogil([&] { return fn(tt.view(), args...); }));
}

void bind_layouts(py::module_& m) {
  m.def("nvfp4_swizzled_offset", &nvfp4_swizzled_offset, "m"_a, "kb"_a, "kb_padded"_a,
        "Offset of scale (m, kb) in one swizzled [Mp, Kbp] matrix (spec §7.2).");
  m.def(
      "swizzle_nvfp4_scales",
      [](py::object s) {
        return layout_call("swizzle_nvfp4_scales: scale", s,
                           [](const TensorView& v) { return swizzle_nvfp4_scales(v); });
      },
      "scale"_a,
      "Block scales [M, Kb] or [B, M, Kb] → 128×4 swizzled [.., ceil(M/128)·128, "
      "ceil(Kb/4)·4], zero padded (sglang swizzle_blockscale).");
  m.def(
      "unswizzle_nvfp4_scales",
      [](py::object s, int64_t mm, int64_t kb) {
        return layout_call(
            "unswizzle_nvfp4_scales: swizzled", s,
            [](const TensorView& v, int64_t a, int64_t b) {
              return unswizzle_nvfp4_scales(v, a, b);
            },
            mm, kb);
      },
      "swizzled"_a, "m"_a, "kb"_a, "Exact inverse of swizzle_nvfp4_scales → [.., m, kb].");
  m.def(
      "nvfp4_scales_mma_view",
      [](py::object s) {
        Tensor t = to_required_tensor(s, "nvfp4_scales_mma_view: swizzled");
        return to_numpy(Tensor(nvfp4_scales_mma_view(t.view()), t.owner()));
      },
      "swizzled"_a,
      "The MMA view (FlashInfer convert_sf_to_mma_layout): a strided 6-d view (32, 4, m_tiles, "
      "4, k_tiles, B) of the same memory as the contiguous swizzled scales; no copy.");
  m.def(
      "nvfp4_scales_from_mma_view",
      [](py::object v) {
        Tensor t = to_required_tensor(v, "nvfp4_scales_from_mma_view: mma");
        return to_numpy(Tensor(nvfp4_scales_from_mma_view(t.view()), t.owner()));
      },
      "mma"_a, "Inverse of nvfp4_scales_mma_view: the [B, Mp, Kbp] view of the same memory.");
  m.def(
      "interleave_w13_halves",
      [](py::object t, int64_t group_size, int dim) {
        return layout_call(
            "interleave_w13_halves: tensor", t,
            [](const TensorView& v, int64_t g, int d) { return interleave_w13_halves(v, g, d); },
            group_size, dim);
      },
      "tensor"_a, "group_size"_a = 64, "dim"_a = 1,
      "sglang's CuteDSL interleave_w13_halves: halves A, B along dim → [A0, B0, A1, B1, ...] in "
      "group_size chunks; sglang's ValueError texts (R12).");
  m.def(
      "deinterleave_w13_halves",
      [](py::object t, int64_t group_size, int dim) {
        return layout_call(
            "deinterleave_w13_halves: tensor", t,
            [](const TensorView& v, int64_t g, int d) { return deinterleave_w13_halves(v, g, d); },
            group_size, dim);
      },
      "tensor"_a, "group_size"_a = 64, "dim"_a = 1, "Exact inverse of interleave_w13_halves.");
  m.def(
      "swap_w13_halves",
      [](py::object t, int dim) {
        return layout_call(
            "swap_w13_halves: tensor", t,
            [](const TensorView& v, int d) { return swap_w13_halves(v, d); }, dim);
      },
      "tensor"_a, "dim"_a = 1, "[Gate, Up] <-> [Up, Gate] along dim (its own inverse).");
  m.def(
      "deinterleave_gate_up_rows",
      [](py::object t, int dim) {
        return layout_call(
            "deinterleave_gate_up_rows: tensor", t,
            [](const TensorView& v, int d) { return deinterleave_gate_up_rows(v, d); }, dim);
      },
      "tensor"_a, "dim"_a = 1, "GPT-OSS [g0, u0, g1, u1, ...] → [G; U] halves along dim.");
  m.def(
      "interleave_gate_up_rows",
      [](py::object t, int dim) {
        return layout_call(
            "interleave_gate_up_rows: tensor", t,
            [](const TensorView& v, int d) { return interleave_gate_up_rows(v, d); }, dim);
      },
      "tensor"_a, "dim"_a = 1, "[G; U] halves → GPT-OSS [g0, u0, g1, u1, ...] along dim.");
  m.def(
      "pad_dim",
      [](py::object t, int dim, int64_t padded_size) {
        return layout_call(
            "pad_dim: tensor", t,
            [](const TensorView& v, int d, int64_t p) { return pad_dim(v, d, p); }, dim,
            padded_size);
      },
      "tensor"_a, "dim"_a, "padded_size"_a, "Zero-pads dim at its end to padded_size.");
  m.def(
      "unpad_dim",
      [](py::object t, int dim, int64_t size) {
        return layout_call(
            "unpad_dim: tensor", t,
            [](const TensorView& v, int d, int64_t s) { return unpad_dim(v, d, s); }, dim, size);
      },
      "tensor"_a, "dim"_a, "size"_a, "Keeps the first size entries of dim (inverse of pad_dim).");
  m.def(
      "pad_w13_intermediate",
      [](py::object t, int64_t padded_size, bool gated, int dim) {
        return layout_call(
            "pad_w13_intermediate: w13", t,
            [](const TensorView& v, int64_t p, bool g, int d) {
              return pad_w13_intermediate(v, p, g, d);
            },
            padded_size, gated, dim);
      },
      "w13"_a, "padded_size"_a, "gated"_a = true, "dim"_a = 1,
      "Zero-pads the intermediate dim to padded_size per half (gated: halves padded separately, "
      "sglang R10) or as a whole (non-gated).");
  m.def(
      "unpad_w13_intermediate",
      [](py::object t, int64_t size, bool gated, int dim) {
        return layout_call(
            "unpad_w13_intermediate: w13", t,
            [](const TensorView& v, int64_t s, bool g, int d) {
              return unpad_w13_intermediate(v, s, g, d);
            },
            size, gated, dim);
      },
      "w13"_a, "size"_a, "gated"_a = true, "dim"_a = 1, "Inverse of pad_w13_intermediate.");
  m.def(
      "interleave_moe_weights_for_sm90_mixed_gemm",
      [](py::object w, const std::string& qt) {
        return layout_call(
            "interleave_moe_weights_for_sm90_mixed_gemm: weight", w,
            [](const TensorView& v, const std::string& q) {
              return interleave_moe_weights_for_sm90_mixed_gemm(v, q);
            },
            qt);
      },
      "weight"_a, "quant_type"_a = "fp4",
      "FlashInfer's SM90 mixed-GEMM FP4 weight interleave of packed [E, N, K/2] (N % 16 == 0, "
      "K % 64 == 0); only 'fp4' is implemented.");
  m.def(
      "deinterleave_moe_weights_for_sm90_mixed_gemm",
      [](py::object w, const std::string& qt) {
        return layout_call(
            "deinterleave_moe_weights_for_sm90_mixed_gemm: weight", w,
            [](const TensorView& v, const std::string& q) {
              return deinterleave_moe_weights_for_sm90_mixed_gemm(v, q);
            },
            qt);
      },
      "weight"_a, "quant_type"_a = "fp4", "Exact inverse of the SM90 weight interleave.");
  m.def(
      "interleave_moe_scales_for_sm90_mixed_gemm",
      [](py::object s, int64_t group_size) {
        return layout_call(
            "interleave_moe_scales_for_sm90_mixed_gemm: scales", s,
            [](const TensorView& v, int64_t g) {
              return interleave_moe_scales_for_sm90_mixed_gemm(v, g);
            },
            group_size);
      },
      "scales"_a, "group_size"_a = 32,
      "FlashInfer's SM90 scale fold: [E, rows, K/g] → [E, rows/64, K/128, folded_m, "
      "physical_cols].");
  m.def(
      "deinterleave_moe_scales_for_sm90_mixed_gemm",
      [](py::object s, int64_t group_size) {
        return layout_call(
            "deinterleave_moe_scales_for_sm90_mixed_gemm: folded", s,
            [](const TensorView& v, int64_t g) {
              return deinterleave_moe_scales_for_sm90_mixed_gemm(v, g);
            },
            group_size);
      },
      "folded"_a, "group_size"_a = 32, "Exact inverse of the SM90 scale fold.");
}

}  // namespace

void bind_formats(py::module_& m) {
  py::module_ f = m.def_submodule(
      "formats", "Codecs, block quantizers and layout transforms (public face: moecore.formats).");
  bind_codecs(f);
  bind_quantizers(f);
  bind_layouts(f);
}

}  // namespace moecore::bindings
