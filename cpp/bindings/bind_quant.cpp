// QuantInfo classes (keyword constructors, read-only numpy fields, shape checks, readable repr)
// and the unquantized quant method.
#include "bind_all.h"
#include "moecore/layer/fused_moe.h"
#include "moecore/quant/method.h"
#include "moecore/quant/quant_info.h"
#include "py_objects.h"

namespace moecore::bindings {
namespace {

// Shape checks shared by the unquantized payloads: w13 [E, N1, H], w2 [E, H, I], b13 [E, N1],
// b2 [E, H]. dtypes are checked by the backend that consumes them.
void check_expert_shapes(const char* cls, const Tensor& w13, const Tensor& w2, const Tensor& b13,
                         const Tensor& b2) {
  MOECORE_CHECK(w13.ndim() == 3, cls, ": w13_weight must be [E, 2I, H], got ", w13.describe());
  MOECORE_CHECK(w2.ndim() == 3 && w2.size(0) == w13.size(0), cls, ": w2_weight must be [E, H, I] "
                "with E = ", w13.size(0), ", got ", w2.describe());
  MOECORE_CHECK(!b13.defined() || (b13.ndim() == 2 && b13.size(0) == w13.size(0) &&
                                   b13.size(1) == w13.size(1)),
                cls, ": b13 must be [", w13.size(0), ", ", w13.size(1), "], got ", b13.describe());
  MOECORE_CHECK(!b2.defined() || (b2.ndim() == 2 && b2.size(0) == w2.size(0) &&
                                  b2.size(1) == w2.size(1)),
                cls, ": b2 must be [", w2.size(0), ", ", w2.size(1), "], got ", b2.describe());
}

// Field dtype check at construction: an undefined (None) field passes; otherwise its dtype must
// be one of `allowed` (e.g. packed FP4 may arrive as uint8, as sglang stores it).
void check_field_dtype(const char* cls, const char* field, const Tensor& t,
                       std::initializer_list<DType> allowed) {
  if (!t.defined()) return;
  std::string names;
  for (DType d : allowed) {
    if (t.dtype() == d) return;
    names += std::string(names.empty() ? "" : " or ") + dtype_name(d);
  }
  MOECORE_THROW(DTypeError, cls, ": ", field, " must be ", names, ", got ", t.describe());
}

std::string field_repr(const char* name, const Tensor& t) {
  return std::string(name) + "=" + t.describe();
}

// Read-only numpy properties for Tensor fields.
template <typename Class, typename... Fields>
void tensor_properties(Class& cls, Fields... fields) {
  using C = typename Class::type;
  (cls.def_property_readonly(fields.first, [m = fields.second](const C& c) { return to_numpy(c.*m); }), ...);
}
template <typename C>
std::pair<const char*, Tensor C::*> field(const char* name, Tensor C::*member) {
  return {name, member};
}

std::vector<int64_t> check_block_shape(const char* cls, const std::optional<std::vector<int64_t>>& b) {
  if (!b) return {};
  MOECORE_CHECK(b->size() == 2 && (*b)[0] > 0 && (*b)[1] > 0, cls,
                ": block_shape must be [block_n, block_k] > 0");
  return *b;
}

std::string quant_repr(const char* cls, std::initializer_list<std::pair<const char*, const Tensor*>> fields) {
  std::string out = std::string(cls) + "(";
  bool first = true;
  for (const auto& [name, t] : fields) {
    if (!t->defined()) continue;
    out += (first ? "" : ", ") + field_repr(name, *t);
    first = false;
  }
  return out + ")";
}

}  // namespace

/// The moecore keyword `linear_scales`: None, or (w13, w2) NVFP4 block scales in the kernels'
/// linear layout (float8_e4m3fn [E, rows, K/16]; Nvfp4LinearScales).
Nvfp4LinearScales to_linear_scales(const char* cls, const py::object& value) {
  if (value.is_none()) return {};
  MOECORE_CHECK(py::isinstance<py::sequence>(value) && py::len(value) == 2, cls,
                ": linear_scales must be None or a pair (w13, w2)");
  const py::sequence pair = value.cast<py::sequence>();
  Nvfp4LinearScales s{to_required_tensor(pair[0], "linear_scales[0] (w13)"),
                      to_required_tensor(pair[1], "linear_scales[1] (w2)")};
  check_field_dtype(cls, "linear_scales[0]", s.w13, {DType::kF8E4M3});
  check_field_dtype(cls, "linear_scales[1]", s.w2, {DType::kF8E4M3});
  return s;
}

py::object from_linear_scales(const Nvfp4LinearScales& s) {
  if (!s.w13.defined()) return py::none();
  return py::make_tuple(to_numpy(s.w13), to_numpy(s.w2));
}

constexpr const char* kLinearScalesDoc =
    "moecore: the NVFP4 block scales (w13, w2) in the kernels' linear layout, float8_e4m3fn "
    "[E, rows, K/16], made once when a quant method processes its weights; None: the runner "
    "derives them from the contract layout on every call.";

void bind_quant(py::module_& m) {
  py::class_<MoeQuantInfo, QuantInfoPtr>(m, "MoeQuantInfo", "Base of the QuantInfo payloads.")
      .def("pack_weight_tiles", &MoeQuantInfo::pack_weight_tiles,
           py::call_guard<py::gil_scoped_release>(),
           "moecore: prepacks the expert weights the kernels read (w13_weight and w2_weight; an "
           "MXFP4 payload's kernel_layout) in weight tiles, which the avx512_bf16 and amx rows "
           "then stream instead (the same codes, so the same results). Doubles the weights' "
           "memory; pack again after changing the weights in place.")
      .def_property_readonly(
          "weight_tiles",
          [](const MoeQuantInfo& q) -> py::object {
            if (q.weight_tiles == nullptr) return py::none();
            py::list out;
            for (const Tensor& t : q.weight_tiles->tiles()) out.append(to_numpy(t));
            return py::tuple(out);
          },
          "moecore: the weight tiles (u8 [E, ceil(N/4), ceil(row bytes/64), 4, 64] each, in "
          "packing order), or None.");

  py::class_<TritonMoeQuantInfo, MoeQuantInfo, std::shared_ptr<TritonMoeQuantInfo>>(
      m, "TritonMoeQuantInfo",
      "Payload of the triton runner (sglang moe_runner/triton.py). Keeps the arrays alive.")
      .def(py::init([](py::object w13, py::object w2, py::object b13, py::object b2,
                       bool use_fp8_w8a8, bool use_int8_w8a8, bool use_int8_w8a16,
                       bool use_int4_w4a16, bool per_channel_quant, py::object w13_scale,
                       py::object w2_scale, py::object w13_zp, py::object w2_zp,
                       py::object a13_scale, py::object a2_scale,
                       std::optional<std::vector<int64_t>> block_shape) {
             auto q = std::make_shared<TritonMoeQuantInfo>();
             q->w13_weight = to_required_tensor(w13, "TritonMoeQuantInfo.w13_weight");
             q->w2_weight = to_required_tensor(w2, "TritonMoeQuantInfo.w2_weight");
             q->b13 = to_tensor(b13, "TritonMoeQuantInfo.b13");
             q->b2 = to_tensor(b2, "TritonMoeQuantInfo.b2");
             q->use_fp8_w8a8 = use_fp8_w8a8;
             q->use_int8_w8a8 = use_int8_w8a8;
             q->use_int8_w8a16 = use_int8_w8a16;
             q->use_int4_w4a16 = use_int4_w4a16;
             q->per_channel_quant = per_channel_quant;
             q->w13_scale = to_tensor(w13_scale, "TritonMoeQuantInfo.w13_scale");
             q->w2_scale = to_tensor(w2_scale, "TritonMoeQuantInfo.w2_scale");
             q->w13_zp = to_tensor(w13_zp, "TritonMoeQuantInfo.w13_zp");
             q->w2_zp = to_tensor(w2_zp, "TritonMoeQuantInfo.w2_zp");
             q->a13_scale = to_tensor(a13_scale, "TritonMoeQuantInfo.a13_scale");
             q->a2_scale = to_tensor(a2_scale, "TritonMoeQuantInfo.a2_scale");
             if (block_shape) {
               MOECORE_CHECK(block_shape->size() == 2 && (*block_shape)[0] > 0 && (*block_shape)[1] > 0,
                             "TritonMoeQuantInfo: block_shape must be [block_n, block_k] > 0");
               q->block_shape = *block_shape;
             }
             if (!q->is_quantized())
               check_expert_shapes("TritonMoeQuantInfo", q->w13_weight, q->w2_weight, q->b13, q->b2);
             return q;
           }),
           py::kw_only(), "w13_weight"_a, "w2_weight"_a, "b13"_a = py::none(), "b2"_a = py::none(),
           "use_fp8_w8a8"_a = false, "use_int8_w8a8"_a = false, "use_int8_w8a16"_a = false,
           "use_int4_w4a16"_a = false, "per_channel_quant"_a = false, "w13_scale"_a = py::none(),
           "w2_scale"_a = py::none(), "w13_zp"_a = py::none(), "w2_zp"_a = py::none(),
           "a13_scale"_a = py::none(), "a2_scale"_a = py::none(), "block_shape"_a = py::none())
      .def_property_readonly("w13_weight", [](const TritonMoeQuantInfo& q) { return to_numpy(q.w13_weight); })
      .def_property_readonly("w2_weight", [](const TritonMoeQuantInfo& q) { return to_numpy(q.w2_weight); })
      .def_property_readonly("b13", [](const TritonMoeQuantInfo& q) { return to_numpy(q.b13); })
      .def_property_readonly("b2", [](const TritonMoeQuantInfo& q) { return to_numpy(q.b2); })
      .def_property_readonly("w13_scale", [](const TritonMoeQuantInfo& q) { return to_numpy(q.w13_scale); })
      .def_property_readonly("w2_scale", [](const TritonMoeQuantInfo& q) { return to_numpy(q.w2_scale); })
      .def_property_readonly("w13_zp", [](const TritonMoeQuantInfo& q) { return to_numpy(q.w13_zp); })
      .def_property_readonly("w2_zp", [](const TritonMoeQuantInfo& q) { return to_numpy(q.w2_zp); })
      .def_property_readonly("a13_scale", [](const TritonMoeQuantInfo& q) { return to_numpy(q.a13_scale); })
      .def_property_readonly("a2_scale", [](const TritonMoeQuantInfo& q) { return to_numpy(q.a2_scale); })
      .def_readonly("use_fp8_w8a8", &TritonMoeQuantInfo::use_fp8_w8a8)
      .def_readonly("use_int8_w8a8", &TritonMoeQuantInfo::use_int8_w8a8)
      .def_readonly("use_int8_w8a16", &TritonMoeQuantInfo::use_int8_w8a16)
      .def_readonly("use_int4_w4a16", &TritonMoeQuantInfo::use_int4_w4a16)
      .def_readonly("per_channel_quant", &TritonMoeQuantInfo::per_channel_quant)
      .def_property_readonly("block_shape", [](const TritonMoeQuantInfo& q) -> py::object {
        if (q.block_shape.empty()) return py::none();
        return py::cast(q.block_shape);
      })
      .def("__repr__", [](const TritonMoeQuantInfo& q) {
        return "TritonMoeQuantInfo(" + field_repr("w13_weight", q.w13_weight) + ", " +
               field_repr("w2_weight", q.w2_weight) + ", " + field_repr("b13", q.b13) + ", " +
               field_repr("b2", q.b2) + (q.is_quantized() ? ", quantized" : "") + ")";
      });

  py::class_<TorchNativeMoeQuantInfo, MoeQuantInfo, std::shared_ptr<TorchNativeMoeQuantInfo>>(
      m, "TorchNativeMoeQuantInfo", "Payload of the torch_native reference runner.")
      .def(py::init([](py::object w13, py::object w2, py::object b13, py::object b2) {
             auto q = std::make_shared<TorchNativeMoeQuantInfo>();
             q->w13_weight = to_required_tensor(w13, "TorchNativeMoeQuantInfo.w13_weight");
             q->w2_weight = to_required_tensor(w2, "TorchNativeMoeQuantInfo.w2_weight");
             q->b13 = to_tensor(b13, "TorchNativeMoeQuantInfo.b13");
             q->b2 = to_tensor(b2, "TorchNativeMoeQuantInfo.b2");
             check_expert_shapes("TorchNativeMoeQuantInfo", q->w13_weight, q->w2_weight, q->b13, q->b2);
             return q;
           }),
           py::kw_only(), "w13_weight"_a, "w2_weight"_a, "b13"_a = py::none(), "b2"_a = py::none())
      .def_property_readonly("w13_weight", [](const TorchNativeMoeQuantInfo& q) { return to_numpy(q.w13_weight); })
      .def_property_readonly("w2_weight", [](const TorchNativeMoeQuantInfo& q) { return to_numpy(q.w2_weight); })
      .def_property_readonly("b13", [](const TorchNativeMoeQuantInfo& q) { return to_numpy(q.b13); })
      .def_property_readonly("b2", [](const TorchNativeMoeQuantInfo& q) { return to_numpy(q.b2); })
      .def("__repr__", [](const TorchNativeMoeQuantInfo& q) {
        return "TorchNativeMoeQuantInfo(" + field_repr("w13_weight", q.w13_weight) + ", " +
               field_repr("w2_weight", q.w2_weight) + ")";
      });

  {
    using Q = DeepGemmMoeQuantInfo;
    py::class_<Q, MoeQuantInfo, std::shared_ptr<Q>> cls(
        m, "DeepGemmMoeQuantInfo", "Payload of the deep_gemm runner (sglang moe_runner/deep_gemm.py).");
    cls.def(py::init([](py::object w13, py::object w2, bool use_fp8, py::object w13_scale,
                        py::object w2_scale, std::optional<std::vector<int64_t>> block_shape,
                        bool is_fp4_experts, bool scale_ue8m0) {
              auto q = std::make_shared<Q>();
              q->w13_weight = to_required_tensor(w13, "DeepGemmMoeQuantInfo.w13_weight");
              q->w2_weight = to_required_tensor(w2, "DeepGemmMoeQuantInfo.w2_weight");
              q->use_fp8 = use_fp8;
              q->w13_scale = to_tensor(w13_scale, "DeepGemmMoeQuantInfo.w13_scale");
              q->w2_scale = to_tensor(w2_scale, "DeepGemmMoeQuantInfo.w2_scale");
              q->block_shape = check_block_shape("DeepGemmMoeQuantInfo", block_shape);
              q->is_fp4_experts = is_fp4_experts;
              q->scale_ue8m0 = scale_ue8m0;
              MOECORE_CHECK(q->w13_weight.ndim() == 3 && q->w2_weight.ndim() == 3 &&
                                q->w13_weight.size(0) == q->w2_weight.size(0),
                            "DeepGemmMoeQuantInfo: expected w13_weight [E, 2I, H] and w2_weight "
                            "[E, H, I], got ", q->w13_weight.describe(), " and ", q->w2_weight.describe());
              MOECORE_CHECK(!use_fp8 || (q->w13_scale.defined() && q->w2_scale.defined()),
                            "DeepGemmMoeQuantInfo: use_fp8=True needs w13_scale and w2_scale");
              const char* c = "DeepGemmMoeQuantInfo";
              for (auto [f, t] : {std::pair{"w13_weight", &q->w13_weight}, {"w2_weight", &q->w2_weight}})
                check_field_dtype(c, f, *t, {use_fp8 ? DType::kF8E4M3 : DType::kBF16});
              check_field_dtype(c, "w13_scale", q->w13_scale, {DType::kF32});
              check_field_dtype(c, "w2_scale", q->w2_scale, {DType::kF32});
              return q;
            }),
            py::kw_only(), "w13_weight"_a, "w2_weight"_a, "use_fp8"_a, "w13_scale"_a = py::none(),
            "w2_scale"_a = py::none(), "block_shape"_a = py::none(), "is_fp4_experts"_a = false,
            "scale_ue8m0"_a = false);
    tensor_properties(cls, field("w13_weight", &Q::w13_weight), field("w2_weight", &Q::w2_weight),
                      field("w13_scale", &Q::w13_scale), field("w2_scale", &Q::w2_scale));
    cls.def_readonly("use_fp8", &Q::use_fp8)
        .def_readonly("is_fp4_experts", &Q::is_fp4_experts)
        .def_readonly("scale_ue8m0", &Q::scale_ue8m0)
        .def_property_readonly("block_shape", [](const Q& q) -> py::object {
          return q.block_shape.empty() ? py::none() : py::cast(q.block_shape);
        })
        .def("__repr__", [](const Q& q) {
          return quant_repr("DeepGemmMoeQuantInfo", {{"w13_weight", &q.w13_weight}, {"w2_weight", &q.w2_weight},
                                                     {"w13_scale", &q.w13_scale}, {"w2_scale", &q.w2_scale}});
        });
  }
  {
    using Q = CuteDslFp4MoeQuantInfo;
    py::class_<Q, MoeQuantInfo, std::shared_ptr<Q>> cls(
        m, "CuteDslFp4MoeQuantInfo",
        "Payload of the flashinfer_cutedsl runner (NVFP4; sglang moe_runner/flashinfer_cutedsl.py).");
    cls.def(py::init([](py::object w13, py::object w2, py::object w13_sf, py::object w2_sf,
                        py::object w1_alpha, py::object w2_alpha, py::object a1_scale,
                        py::object a2_scale, py::object wrapper, bool use_nvfp4_dispatch,
                        py::object down_gemm_overlap_args, int64_t local_expert_offset,
                        py::object linear_scales) {
              auto q = std::make_shared<Q>();
              q->w13_weight = to_required_tensor(w13, "CuteDslFp4MoeQuantInfo.w13_weight");
              q->w2_weight = to_required_tensor(w2, "CuteDslFp4MoeQuantInfo.w2_weight");
              q->w13_weight_sf = to_required_tensor(w13_sf, "CuteDslFp4MoeQuantInfo.w13_weight_sf");
              q->w2_weight_sf = to_required_tensor(w2_sf, "CuteDslFp4MoeQuantInfo.w2_weight_sf");
              q->w1_alpha = to_required_tensor(w1_alpha, "CuteDslFp4MoeQuantInfo.w1_alpha");
              q->w2_alpha = to_required_tensor(w2_alpha, "CuteDslFp4MoeQuantInfo.w2_alpha");
              q->a1_scale = to_required_tensor(a1_scale, "CuteDslFp4MoeQuantInfo.a1_scale");
              q->a2_scale = to_required_tensor(a2_scale, "CuteDslFp4MoeQuantInfo.a2_scale");
              q->use_nvfp4_dispatch = use_nvfp4_dispatch;
              MOECORE_CHECK(local_expert_offset >= 0, "CuteDslFp4MoeQuantInfo: "
                            "local_expert_offset must be >= 0, got ", local_expert_offset);
              q->local_expert_offset = local_expert_offset;
              const char* c = "CuteDslFp4MoeQuantInfo";
              q->linear_scales = to_linear_scales(c, linear_scales);
              for (auto [f, t] : {std::pair{"w13_weight", &q->w13_weight}, {"w2_weight", &q->w2_weight}})
                check_field_dtype(c, f, *t, {DType::kU8, DType::kFp4E2M1x2});
              for (auto [f, t] : {std::pair{"w1_alpha", &q->w1_alpha}, {"w2_alpha", &q->w2_alpha},
                                  {"a1_scale", &q->a1_scale}, {"a2_scale", &q->a2_scale}})
                check_field_dtype(c, f, *t, {DType::kF32});
              MOECORE_CHECK(q->w13_weight.ndim() == 3 && q->w2_weight.ndim() == 3 &&
                                q->w13_weight.size(0) == q->w2_weight.size(0),
                            "CuteDslFp4MoeQuantInfo: expected w13_weight [E, 2I, H/2] and "
                            "w2_weight [E, H, I/2], got ", q->w13_weight.describe(), " and ",
                            q->w2_weight.describe());
              return q;
            }),
            py::kw_only(), "w13_weight"_a, "w2_weight"_a, "w13_weight_sf"_a, "w2_weight_sf"_a,
            "w1_alpha"_a, "w2_alpha"_a, "a1_scale"_a, "a2_scale"_a, "wrapper"_a = py::none(),
            "use_nvfp4_dispatch"_a = false, "down_gemm_overlap_args"_a = py::none(),
            "local_expert_offset"_a = 0, "linear_scales"_a = py::none());
    tensor_properties(cls, field("w13_weight", &Q::w13_weight), field("w2_weight", &Q::w2_weight),
                      field("w13_weight_sf", &Q::w13_weight_sf), field("w2_weight_sf", &Q::w2_weight_sf),
                      field("w1_alpha", &Q::w1_alpha), field("w2_alpha", &Q::w2_alpha),
                      field("a1_scale", &Q::a1_scale), field("a2_scale", &Q::a2_scale));
    cls.def_readonly("use_nvfp4_dispatch", &Q::use_nvfp4_dispatch)
        .def_readonly("local_expert_offset", &Q::local_expert_offset)
        .def_property_readonly(
            "linear_scales", [](const Q& q) { return from_linear_scales(q.linear_scales); },
            kLinearScalesDoc)
        .def("__repr__", [](const Q& q) {
          return quant_repr("CuteDslFp4MoeQuantInfo", {{"w13_weight", &q.w13_weight}, {"w2_weight", &q.w2_weight},
                                                       {"w13_weight_sf", &q.w13_weight_sf}, {"w2_weight_sf", &q.w2_weight_sf},
                                                       {"w1_alpha", &q.w1_alpha}, {"w2_alpha", &q.w2_alpha}});
        });
  }
  {
    using Q = FlashInferMxfp4CutlassMoeQuantInfo;
    // The moecore keyword `kernel_layout`: None, or (w13_weight, w13_weight_scale, w2_weight,
    // w2_weight_scale) in the kernels' layout (Mxfp4KernelLayout).
    static constexpr const char* kKernelLayoutDoc =
        "moecore: the four weights in the kernels' layout, (w13_weight, w13_weight_scale, "
        "w2_weight, w2_weight_scale): uint8 packed e2m1 [E, rows, K/2] and uint8 E8M0 linear "
        "scales [E, rows, K/32] (the SM90 interleave and fold undone), made once when a quant "
        "method processes its weights; None: the runner derives it from the contract layout "
        "(once per prepared run; an eager call derives it per call).";
    const auto to_kernel_layout = [](const char* c, const py::object& value) {
      Mxfp4KernelLayout l;
      if (value.is_none()) return l;
      MOECORE_CHECK(py::isinstance<py::sequence>(value) && !py::isinstance<py::str>(value) &&
                        py::len(value) == 4,
                    c, ": kernel_layout must be None or a 4-tuple (w13_weight, w13_weight_scale, "
                    "w2_weight, w2_weight_scale)");
      const py::sequence t = value.cast<py::sequence>();
      l.w13_weight = to_required_tensor(t[0], "kernel_layout[0] (w13_weight)");
      l.w13_weight_scale = to_required_tensor(t[1], "kernel_layout[1] (w13_weight_scale)");
      l.w2_weight = to_required_tensor(t[2], "kernel_layout[2] (w2_weight)");
      l.w2_weight_scale = to_required_tensor(t[3], "kernel_layout[3] (w2_weight_scale)");
      check_field_dtype(c, "kernel_layout[0] (w13_weight)", l.w13_weight, {DType::kU8, DType::kFp4E2M1x2});
      check_field_dtype(c, "kernel_layout[1] (w13_weight_scale)", l.w13_weight_scale, {DType::kU8, DType::kE8M0});
      check_field_dtype(c, "kernel_layout[2] (w2_weight)", l.w2_weight, {DType::kU8, DType::kFp4E2M1x2});
      check_field_dtype(c, "kernel_layout[3] (w2_weight_scale)", l.w2_weight_scale, {DType::kU8, DType::kE8M0});
      return l;
    };
    py::class_<Q, MoeQuantInfo, std::shared_ptr<Q>> cls(
        m, "FlashInferMxfp4CutlassMoeQuantInfo",
        "Payload of the flashinfer_mxfp4 runner (sglang moe_runner/flashinfer_mxfp4.py).");
    cls.def(py::init([to_kernel_layout](py::object w13, py::object w2, py::object w13_scale,
                                        py::object w2_scale, py::object w13_bias, py::object w2_bias,
                                        py::object alpha, py::object beta, py::object limit,
                                        int64_t tp_size, int64_t tp_rank, int64_t ep_size,
                                        int64_t ep_rank, std::optional<int64_t> padded_hidden,
                                        py::object kernel_layout) {
              auto q = std::make_shared<Q>();
              const char* c = "FlashInferMxfp4CutlassMoeQuantInfo";
              q->w13_weight = to_required_tensor(w13, "FlashInferMxfp4CutlassMoeQuantInfo.w13_weight");
              q->w2_weight = to_required_tensor(w2, "FlashInferMxfp4CutlassMoeQuantInfo.w2_weight");
              q->w13_weight_scale = to_required_tensor(w13_scale, "FlashInferMxfp4CutlassMoeQuantInfo.w13_weight_scale");
              q->w2_weight_scale = to_required_tensor(w2_scale, "FlashInferMxfp4CutlassMoeQuantInfo.w2_weight_scale");
              q->w13_bias = to_tensor(w13_bias, "FlashInferMxfp4CutlassMoeQuantInfo.w13_bias");
              q->w2_bias = to_tensor(w2_bias, "FlashInferMxfp4CutlassMoeQuantInfo.w2_bias");
              q->swiglu_alpha = to_tensor(alpha, "FlashInferMxfp4CutlassMoeQuantInfo.swiglu_alpha");
              q->swiglu_beta = to_tensor(beta, "FlashInferMxfp4CutlassMoeQuantInfo.swiglu_beta");
              q->swiglu_limit = to_tensor(limit, "FlashInferMxfp4CutlassMoeQuantInfo.swiglu_limit");
              for (auto [f, t] : {std::pair{"w13_weight", &q->w13_weight}, {"w2_weight", &q->w2_weight}})
                check_field_dtype(c, f, *t, {DType::kU8, DType::kFp4E2M1x2});
              for (auto [f, t] : {std::pair{"w13_weight_scale", &q->w13_weight_scale},
                                  {"w2_weight_scale", &q->w2_weight_scale}})
                check_field_dtype(c, f, *t, {DType::kU8, DType::kE8M0});
              check_field_dtype(c, "w13_bias", q->w13_bias, {DType::kBF16});
              check_field_dtype(c, "w2_bias", q->w2_bias, {DType::kBF16});
              for (auto [f, t] : {std::pair{"swiglu_alpha", &q->swiglu_alpha}, {"swiglu_beta", &q->swiglu_beta},
                                  {"swiglu_limit", &q->swiglu_limit}})
                check_field_dtype(c, f, *t, {DType::kF32});
              const int given = q->swiglu_alpha.defined() + q->swiglu_beta.defined() + q->swiglu_limit.defined();
              MOECORE_CHECK(given == 0 || given == 3, c,
                            ": swiglu_alpha, swiglu_beta and swiglu_limit go together (all or none)");
              MOECORE_CHECK(tp_size >= 1 && ep_size >= 1 && tp_rank >= 0 && tp_rank < tp_size &&
                                ep_rank >= 0 && ep_rank < ep_size,
                            c, ": bad TP/EP topology (tp ", tp_rank, "/", tp_size, ", ep ", ep_rank, "/", ep_size, ")");
              MOECORE_CHECK(!padded_hidden || *padded_hidden > 0, c, ": padded_hidden must be > 0");
              q->moe_tp_size = tp_size;
              q->moe_tp_rank = tp_rank;
              q->moe_ep_size = ep_size;
              q->moe_ep_rank = ep_rank;
              q->padded_hidden = padded_hidden;
              q->kernel_layout = to_kernel_layout(c, kernel_layout);
              return q;
            }),
            py::kw_only(), "w13_weight"_a, "w2_weight"_a, "w13_weight_scale"_a, "w2_weight_scale"_a,
            "w13_bias"_a = py::none(), "w2_bias"_a = py::none(), "swiglu_alpha"_a = py::none(),
            "swiglu_beta"_a = py::none(), "swiglu_limit"_a = py::none(), "moe_tp_size"_a = 1,
            "moe_tp_rank"_a = 0, "moe_ep_size"_a = 1, "moe_ep_rank"_a = 0,
            "padded_hidden"_a = py::none(), "kernel_layout"_a = py::none());
    tensor_properties(cls, field("w13_weight", &Q::w13_weight), field("w2_weight", &Q::w2_weight),
                      field("w13_weight_scale", &Q::w13_weight_scale),
                      field("w2_weight_scale", &Q::w2_weight_scale), field("w13_bias", &Q::w13_bias),
                      field("w2_bias", &Q::w2_bias), field("swiglu_alpha", &Q::swiglu_alpha),
                      field("swiglu_beta", &Q::swiglu_beta), field("swiglu_limit", &Q::swiglu_limit));
    cls.def_readonly("moe_tp_size", &Q::moe_tp_size)
        .def_readonly("moe_tp_rank", &Q::moe_tp_rank)
        .def_readonly("moe_ep_size", &Q::moe_ep_size)
        .def_readonly("moe_ep_rank", &Q::moe_ep_rank)
        .def_readonly("padded_hidden", &Q::padded_hidden)
        .def_property_readonly(
            "kernel_layout",
            [](const Q& q) -> py::object {
              const Mxfp4KernelLayout& l = q.kernel_layout;
              if (!l.w13_weight.defined()) return py::none();
              return py::make_tuple(to_numpy(l.w13_weight), to_numpy(l.w13_weight_scale),
                                    to_numpy(l.w2_weight), to_numpy(l.w2_weight_scale));
            },
            kKernelLayoutDoc)
        .def("__repr__", [](const Q& q) {
          return quant_repr("FlashInferMxfp4CutlassMoeQuantInfo",
                            {{"w13_weight", &q.w13_weight}, {"w2_weight", &q.w2_weight},
                             {"w13_weight_scale", &q.w13_weight_scale}, {"w2_weight_scale", &q.w2_weight_scale},
                             {"w13_bias", &q.w13_bias}, {"w2_bias", &q.w2_bias}});
        });
  }
  {
    using Q = FlashInferCutlassMoeQuantInfo;
    py::class_<Q, MoeQuantInfo, std::shared_ptr<Q>> cls(
        m, "FlashInferCutlassMoeQuantInfo",
        "Payload of the flashinfer_cutlass runner (sglang moe_runner/flashinfer_cutlass.py).");
    cls.def(py::init([](std::string quant_type, py::object w13, py::object w2,
                        std::optional<std::vector<py::object>> quant_scales, py::object output_dtype,
                        int64_t tp_size, int64_t tp_rank, int64_t ep_size, int64_t ep_rank,
                        bool apply_rsf, py::object linear_scales) {
              const char* c = "FlashInferCutlassMoeQuantInfo";
              MOECORE_CHECK(quant_type == "bf16" || quant_type == "fp8" || quant_type == "fp4", c,
                            ": quant_type must be 'bf16', 'fp8' or 'fp4', got '", quant_type, "'");
              auto q = std::make_shared<Q>();
              q->quant_type = quant_type;
              q->w13_weight = to_required_tensor(w13, "FlashInferCutlassMoeQuantInfo.w13_weight");
              q->w2_weight = to_required_tensor(w2, "FlashInferCutlassMoeQuantInfo.w2_weight");
              if (quant_scales)
                for (size_t i = 0; i < quant_scales->size(); ++i)
                  q->quant_scales.push_back(to_required_tensor((*quant_scales)[i], "FlashInferCutlassMoeQuantInfo.quant_scales"));
              const size_t want = quant_type == "fp8" ? 4 : quant_type == "fp4" ? 6 : 0;
              MOECORE_CHECK(q->quant_scales.size() == want, c, ": quant_type '", quant_type,
                            "' needs ", want, " quant_scales, got ", q->quant_scales.size());
              q->output_dtype = to_dtype(output_dtype);
              MOECORE_CHECK(tp_size >= 1 && ep_size >= 1 && tp_rank >= 0 && tp_rank < tp_size &&
                                ep_rank >= 0 && ep_rank < ep_size,
                            c, ": bad TP/EP topology");
              q->moe_tp_size = tp_size;
              q->moe_tp_rank = tp_rank;
              q->moe_ep_size = ep_size;
              q->moe_ep_rank = ep_rank;
              q->apply_routed_scaling_factor = apply_rsf;
              q->linear_scales = to_linear_scales(c, linear_scales);
              MOECORE_CHECK(!q->linear_scales.w13.defined() || quant_type == "fp4", c,
                            ": linear_scales apply to quant_type 'fp4' only");
              return q;
            }),
            py::kw_only(), "quant_type"_a, "w13_weight"_a, "w2_weight"_a,
            "quant_scales"_a = py::none(), "output_dtype"_a = py::none(), "moe_tp_size"_a = 1,
            "moe_tp_rank"_a = 0, "moe_ep_size"_a = 1, "moe_ep_rank"_a = 0,
            "apply_routed_scaling_factor"_a = true, "linear_scales"_a = py::none());
    tensor_properties(cls, field("w13_weight", &Q::w13_weight), field("w2_weight", &Q::w2_weight));
    cls.def_readonly("quant_type", &Q::quant_type)
        .def_property_readonly("quant_scales", [](const Q& q) {
          py::list out;
          for (const Tensor& t : q.quant_scales) out.append(to_numpy(t));
          return out;
        })
        .def_property_readonly("output_dtype", [](const Q& q) -> py::object {
          if (!q.output_dtype) return py::none();
          return py::str(dtype_name(*q.output_dtype));
        })
        .def_readonly("moe_tp_size", &Q::moe_tp_size)
        .def_readonly("moe_tp_rank", &Q::moe_tp_rank)
        .def_readonly("moe_ep_size", &Q::moe_ep_size)
        .def_readonly("moe_ep_rank", &Q::moe_ep_rank)
        .def_readonly("apply_routed_scaling_factor", &Q::apply_routed_scaling_factor)
        .def_property_readonly(
            "linear_scales", [](const Q& q) { return from_linear_scales(q.linear_scales); },
            kLinearScalesDoc)
        .def("__repr__", [](const Q& q) {
          return "FlashInferCutlassMoeQuantInfo(quant_type='" + q.quant_type + "', " +
                 field_repr("w13_weight", q.w13_weight) + ", " + field_repr("w2_weight", q.w2_weight) +
                 ", " + std::to_string(q.quant_scales.size()) + " quant_scales)";
        });
  }

  py::class_<FusedMoEMethod, std::shared_ptr<FusedMoEMethod>>(m, "FusedMoEMethodBase")
      .def_property_readonly("name", &FusedMoEMethod::name)
      .def_property_readonly(
          "weight_tiles",
          [](const FusedMoEMethod& method) -> py::object {
            if (method.weight_tiles() == nullptr) return py::none();
            py::list out;
            for (const Tensor& t : method.weight_tiles()->tiles()) out.append(to_numpy(t));
            return py::tuple(out);
          },
          "moecore: the weight tiles process_weights_after_loading made (every QuantInfo of "
          "apply carries them), or None: the kernel row reads the contract layout only, or "
          "MoeRunnerConfig.prepack_weight_tiles is False.")
      .def(
          "create_weights",
          [](FusedMoEMethod& q, FusedMoE& layer, int64_t num_experts, int64_t hidden, int64_t inter,
             py::object params_dtype, bool with_bias) {
            q.create_weights(layer, num_experts, hidden, inter, *to_dtype(params_dtype), with_bias);
          },
          "layer"_a, "num_experts"_a, "hidden_size"_a, "intermediate_size_per_partition"_a,
          "params_dtype"_a, "with_bias"_a = false)
      .def("process_weights_after_loading", &FusedMoEMethod::process_weights_after_loading,
           "layer"_a)
      .def("create_moe_runner", &FusedMoEMethod::create_moe_runner, "layer"_a,
           "moe_runner_config"_a)
      .def(
          "apply",
          [](FusedMoEMethod& q, FusedMoE& layer, py::object dispatch_output) {
            DispatchOutputPtr d = to_dispatch_output(dispatch_output);
            CombineInputPtr out;
            {
              py::gil_scoped_release release;
              out = q.apply(layer, d);
            }
            return from_combine_input(out);
          },
          "layer"_a, "dispatch_output"_a)
      .def_property_readonly("load_up_proj_weight_first",
                             &FusedMoEMethod::load_up_proj_weight_first)
      .def_property_readonly("runner", &FusedMoEMethod::runner);

  py::class_<UnquantizedFusedMoEMethod, FusedMoEMethod, std::shared_ptr<UnquantizedFusedMoEMethod>>(
      m, "UnquantizedFusedMoEMethod", "Plain f32/f16/bf16 experts (triton or torch_native).")
      .def(py::init<>())
      .def("quant_info", &UnquantizedFusedMoEMethod::quant_info, "layer"_a);
}

}  // namespace moecore::bindings
