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

std::string field_repr(const char* name, const Tensor& t) {
  return std::string(name) + "=" + t.describe();
}

}  // namespace

void bind_quant(py::module_& m) {
  py::class_<MoeQuantInfo, QuantInfoPtr>(m, "MoeQuantInfo", "Base of the QuantInfo payloads.");

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

  py::class_<FusedMoEMethod, std::shared_ptr<FusedMoEMethod>>(m, "FusedMoEMethodBase")
      .def_property_readonly("name", &FusedMoEMethod::name)
      .def("create_weights", [](FusedMoEMethod& q, FusedMoE& layer, int64_t num_experts,
                                int64_t hidden, int64_t inter, py::object params_dtype, bool with_bias) {
        q.create_weights(layer, num_experts, hidden, inter, *to_dtype(params_dtype), with_bias);
      }, "layer"_a, "num_experts"_a, "hidden_size"_a, "intermediate_size_per_partition"_a,
         "params_dtype"_a, "with_bias"_a = false)
      .def("process_weights_after_loading", &FusedMoEMethod::process_weights_after_loading, "layer"_a)
      .def("create_moe_runner", &FusedMoEMethod::create_moe_runner, "layer"_a, "moe_runner_config"_a)
      .def("apply", [](FusedMoEMethod& q, FusedMoE& layer, py::object dispatch_output) {
        DispatchOutputPtr d = to_dispatch_output(dispatch_output);
        CombineInputPtr out;
        {
          py::gil_scoped_release release;
          out = q.apply(layer, d);
        }
        return from_combine_input(out);
      }, "layer"_a, "dispatch_output"_a)
      .def_property_readonly("load_up_proj_weight_first", &FusedMoEMethod::load_up_proj_weight_first)
      .def_property_readonly("runner", &FusedMoEMethod::runner);

  py::class_<UnquantizedFusedMoEMethod, FusedMoEMethod, std::shared_ptr<UnquantizedFusedMoEMethod>>(
      m, "UnquantizedFusedMoEMethod", "Plain f32/f16/bf16 experts (triton or torch_native).")
      .def(py::init<>())
      .def("quant_info", &UnquantizedFusedMoEMethod::quant_info, "layer"_a);
}

}  // namespace moecore::bindings
