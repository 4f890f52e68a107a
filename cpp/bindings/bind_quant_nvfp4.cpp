// Bindings of the NVFP4 quant method (ModelOptNvFp4FusedMoEMethod) and sglang's CuteDSL scale
// helpers (cutedsl_quant_scale_to_scalar, resolve_cutedsl_standard_scales).
#include "bind_all.h"
#include "moecore/layer/fused_moe.h"
#include "moecore/quant/modelopt_nvfp4.h"
#include "py_objects.h"

namespace moecore::bindings {

void bind_quant_nvfp4(py::module_& m) {
  py::class_<ModelOptNvFp4FusedMoEMethod, FusedMoEMethod,
             std::shared_ptr<ModelOptNvFp4FusedMoEMethod>>(
      m, "ModelOptNvFp4FusedMoEMethod",
      "NVFP4 (ModelOpt FP4) experts: packed e2m1 weights, e4m3 16-block scales, fp32 per-tensor "
      "weight and input scales (sglang modelopt_quant.py). Backends flashinfer_cutlass (also for "
      "'auto') and flashinfer_cutedsl (v1 under a2a deepep: [Gate, Up], swizzled scales, "
      "per-expert alphas; v2 otherwise); the choice, the CuteDSL version and the load order are "
      "fixed when the layer is built. nvfp4_dispatch (sglang's SGLANG_MOE_NVFP4_DISPATCH, v1 "
      "only): the DeepEP dispatcher sends NVFP4. One instance per layer.")
      .def(py::init<bool>(), py::kw_only(), "nvfp4_dispatch"_a = false)
      .def("quant_info", &ModelOptNvFp4FusedMoEMethod::quant_info, "layer"_a,
           "The QuantInfo apply() passes to the runner (after process_weights_after_loading).")
      .def_property_readonly(
          "resolved_backend",
          [](const ModelOptNvFp4FusedMoEMethod& q) { return from_enum(q.resolved_backend()); })
      .def_property_readonly("is_cutedsl_v2", &ModelOptNvFp4FusedMoEMethod::is_cutedsl_v2)
      .def_property_readonly("is_cutedsl_v1", &ModelOptNvFp4FusedMoEMethod::is_cutedsl_v1)
      .def_property_readonly("nvfp4_dispatch", &ModelOptNvFp4FusedMoEMethod::nvfp4_dispatch)
      .def_property_readonly("weights_processed", &ModelOptNvFp4FusedMoEMethod::weights_processed);

  m.def(
      "cutedsl_quant_scale_to_scalar",
      [](py::object quant_scale, const std::string& name) {
        Tensor t = to_required_tensor(quant_scale, "cutedsl_quant_scale_to_scalar: quant_scale");
        if (t.numel() == 0) {
          const std::string msg = "CuteDSL got empty " + name + "; using 1.0 fallback.";
          if (PyErr_WarnEx(PyExc_UserWarning, msg.c_str(), 1) != 0) throw py::error_already_set();
        }
        return to_numpy(cutedsl_quant_scale_to_scalar(t.view(), name));
      },
      "quant_scale"_a, py::kw_only(), "name"_a,
      "sglang's cutedsl_quant_scale_to_scalar: per-expert activation quant scales (1 / raw) → "
      "float32 [1]: min (= 1 / max raw); one value passes through; empty → 1.0 with a warning.");

  m.def(
      "resolve_cutedsl_standard_scales",
      [](py::object layer, py::object w13_isq, py::object w2_isq, py::object g1, py::object g2,
         py::object w13_ws2, py::object w2_ws2, std::optional<int64_t> num_local,
         std::optional<int64_t> num_experts, int64_t ep_rank) {
        CuteDslScaleInputs in;
        if (!layer.is_none()) {
          const FusedMoE& l = layer.cast<const FusedMoE&>();
          in.w13_input_scale_quant = l.find_parameter("w13_input_scale_quant");
          in.w2_input_scale_quant = l.find_parameter("w2_input_scale_quant");
          in.g1_alphas = l.find_parameter("g1_alphas");
          in.g2_alphas = l.find_parameter("g2_alphas");
          in.w13_weight_scale_2 = l.find_parameter("w13_weight_scale_2");
          in.w2_weight_scale_2 = l.find_parameter("w2_weight_scale_2");
          in.num_local_experts = l.num_local_experts();
          in.num_experts = l.options().num_experts;
          in.moe_ep_rank = l.options().ep_rank;
        }
        const char* api = "resolve_cutedsl_standard_scales";
        auto take = [api](py::object o, Tensor& dst) {
          if (!o.is_none()) dst = to_required_tensor(o, api);
        };
        take(w13_isq, in.w13_input_scale_quant);
        take(w2_isq, in.w2_input_scale_quant);
        take(g1, in.g1_alphas);
        take(g2, in.g2_alphas);
        take(w13_ws2, in.w13_weight_scale_2);
        take(w2_ws2, in.w2_weight_scale_2);
        if (num_local) in.num_local_experts = num_local;
        if (num_experts) in.num_experts = num_experts;
        if (layer.is_none() || ep_rank != 0) in.moe_ep_rank = ep_rank;
        CuteDslStandardScales out;
        {
          py::gil_scoped_release release;
          out = resolve_cutedsl_standard_scales(in);
        }
        return py::make_tuple(to_numpy(out.w1_alpha), to_numpy(out.fc2_input_scale),
                              to_numpy(out.w2_alpha), to_numpy(out.used_input_scale));
      },
      "layer"_a = py::none(), py::kw_only(), "w13_input_scale_quant"_a = py::none(),
      "w2_input_scale_quant"_a = py::none(), "g1_alphas"_a = py::none(), "g2_alphas"_a = py::none(),
      "w13_weight_scale_2"_a = py::none(), "w2_weight_scale_2"_a = py::none(),
      "num_local_experts"_a = py::none(), "num_experts"_a = py::none(), "moe_ep_rank"_a = 0,
      "sglang's resolve_cutedsl_standard_scales → (w1_alpha, fc2_input_scale, w2_alpha, "
      "used_input_scale). Reads a processed FusedMoE's parameters when `layer` is given; keywords "
      "override. alpha = weight_scale_2 / max(scalar quant scale, 1e-12); vectors of global size "
      "are sliced to this EP rank; otherwise ValueError('Unable to align …').");
}

}  // namespace moecore::bindings
