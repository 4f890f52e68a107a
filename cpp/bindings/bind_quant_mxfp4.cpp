// Bindings of the MXFP4 quant methods (GPT-OSS Mxfp4MoEMethod with its fused-checkpoint loader,
// DSv4 Mxfp4FlashinferCutlassMoEMethod) and of the flashinfer_mxfp4 kernel entry points
// (cutlass_fused_moe_mxfp4, dequantize_sm90_mxfp4) that tests call directly.
#include "bind_all.h"
#include "moecore/isa/isa.h"
#include "moecore/layer/fused_moe.h"
#include "moecore/quant/mxfp4.h"
#include "moecore/runner/backends/flashinfer_mxfp4.h"
#include "py_objects.h"

namespace moecore::bindings {

void bind_quant_mxfp4(py::module_& m) {
  py::class_<Mxfp4MoEMethod, FusedMoEMethod, std::shared_ptr<Mxfp4MoEMethod>>(
      m, "Mxfp4MoEMethod",
      "GPT-OSS MXFP4 experts (sglang quantization/mxfp4.py, SM90 cutlass path): row-interleaved "
      "w13 with bf16 biases, processed to the halved [up; gate] layout padded to multiples of 128 "
      "and FlashInfer's SM90 interleave; runs on the flashinfer_mxfp4 backend.")
      .def(py::init<>())
      .def("quant_info", &Mxfp4MoEMethod::quant_info, "layer"_a,
           "The FlashInferMxfp4CutlassMoeQuantInfo apply() passes (after processing).")
      .def(
          "load_fused_expert_weight",
          [](Mxfp4MoEMethod& q, FusedMoE& layer, const std::string& name, py::object loaded) {
            return q.load_fused_expert_weight(
                layer, name, to_required_tensor(loaded, "load_fused_expert_weight: loaded_weight"));
          },
          "layer"_a, "name"_a, "loaded_weight"_a,
          "Loads one whole-layer GPT-OSS checkpoint tensor (all global experts; name ending in "
          "gate_up_proj_blocks/_scales/_bias or down_proj_blocks/_scales/_bias), taking this "
          "rank's EP experts and TP slice as sglang does. Returns the parameter name written.")
      .def_property_readonly("padded_hidden", &Mxfp4MoEMethod::padded_hidden,
                             "Kp = round_up(H, 128) (set by create_weights).")
      .def_property_readonly("padded_intermediate", &Mxfp4MoEMethod::padded_intermediate,
                             "Np = round_up(I, 128) (set by create_weights).");

  py::class_<Mxfp4FlashinferCutlassMoEMethod, FusedMoEMethod,
             std::shared_ptr<Mxfp4FlashinferCutlassMoEMethod>>(
      m, "Mxfp4FlashinferCutlassMoEMethod",
      "DeepSeek-V4 MXFP4 experts (sglang quantization/mxfp4_flashinfer_cutlass_moe.py): FP4-expert "
      "buffers with f32 power-of-two scales, [w1; w3] → [w3; w1], E8M0 bytes, SM90 interleave; "
      "no bias; H and I multiples of 128.")
      .def(py::init<>())
      .def("quant_info", &Mxfp4FlashinferCutlassMoEMethod::quant_info, "layer"_a,
           "The FlashInferMxfp4CutlassMoeQuantInfo apply() passes (after processing).");

  m.def(
      "cutlass_fused_moe_mxfp4",
      [](py::object input, py::object ids, py::object weights, py::object w13, py::object w2,
         std::vector<py::object> quant_scales, py::object b13, py::object b2, py::object alpha,
         py::object beta, py::object limit, int64_t tp_size, int64_t tp_rank, int64_t ep_size,
         int64_t ep_rank, std::optional<std::string> isa_level) {
        const char* api = "cutlass_fused_moe_mxfp4";
        MOECORE_CHECK(quant_scales.size() == 2, api,
                      ": quant_scales must be [w13_weight_scale, w2_weight_scale], got ",
                      quant_scales.size(), " tensors");
        Mxfp4CutlassMoeArgs a;
        a.input = to_required_tensor(input, "cutlass_fused_moe_mxfp4: input");
        a.topk_ids = to_required_tensor(ids, "cutlass_fused_moe_mxfp4: token_selected_experts");
        a.topk_weights = to_required_tensor(weights, "cutlass_fused_moe_mxfp4: token_final_scales");
        a.w13 = to_required_tensor(w13, "cutlass_fused_moe_mxfp4: fc1_expert_weights");
        a.w2 = to_required_tensor(w2, "cutlass_fused_moe_mxfp4: fc2_expert_weights");
        a.w13_scale =
            to_required_tensor(quant_scales[0], "cutlass_fused_moe_mxfp4: quant_scales[0]");
        a.w2_scale =
            to_required_tensor(quant_scales[1], "cutlass_fused_moe_mxfp4: quant_scales[1]");
        a.w13_bias = to_tensor(b13, "cutlass_fused_moe_mxfp4: fc1_expert_biases");
        a.w2_bias = to_tensor(b2, "cutlass_fused_moe_mxfp4: fc2_expert_biases");
        a.swiglu_alpha = to_tensor(alpha, "cutlass_fused_moe_mxfp4: swiglu_alpha");
        a.swiglu_beta = to_tensor(beta, "cutlass_fused_moe_mxfp4: swiglu_beta");
        a.swiglu_limit = to_tensor(limit, "cutlass_fused_moe_mxfp4: swiglu_limit");
        a.tp_size = tp_size;
        a.tp_rank = tp_rank;
        a.ep_size = ep_size;
        a.ep_rank = ep_rank;
        const IsaLevel level = isa_level ? parse_isa_level(*isa_level) : current_isa_level();
        Tensor out;
        {
          py::gil_scoped_release release;
          out = cutlass_fused_moe_mxfp4(a, scaled_gemm_kernel(level));
        }
        return to_numpy(out);
      },
      py::kw_only(), "input"_a, "token_selected_experts"_a, "token_final_scales"_a,
      "fc1_expert_weights"_a, "fc2_expert_weights"_a, "quant_scales"_a,
      "fc1_expert_biases"_a = py::none(), "fc2_expert_biases"_a = py::none(),
      "swiglu_alpha"_a = py::none(), "swiglu_beta"_a = py::none(), "swiglu_limit"_a = py::none(),
      "tp_size"_a = 1, "tp_rank"_a = 0, "ep_size"_a = 1, "ep_rank"_a = 0,
      "isa_level"_a = py::none(),
      "The flashinfer_mxfp4 kernel called directly (FlashInfer cutlass_fused_moe with "
      "use_w4_group_scaling=True, SwiGLU): input bf16 [T, K] already padded, SM90-interleaved "
      "weights and folded E8M0 scales → bf16 [T, K]. See runner/backends/flashinfer_mxfp4.cpp.");

  m.def(
      "dequantize_sm90_mxfp4",
      [](py::object weight, py::object scale) {
        Tensor w = to_required_tensor(weight, "dequantize_sm90_mxfp4: weight");
        Tensor s = to_required_tensor(scale, "dequantize_sm90_mxfp4: scale");
        Tensor out;
        {
          py::gil_scoped_release release;
          out = dequantize_sm90_mxfp4(w.view(), s.view());
        }
        return to_numpy(out);
      },
      "weight"_a, "scale"_a,
      "The flashinfer_mxfp4 backend's decode of SM90-interleaved MXFP4 weights [E, R, C/2] with "
      "folded E8M0 scales → f32 [E, R, C] (exact).");
}

}  // namespace moecore::bindings
