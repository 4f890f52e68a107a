// Bindings of the 8-bit quant methods (Fp8MoEMethod, ModelOptFp8MoEMethod, W8A8Int8MoEMethod,
// W8A16Int8MoEMethod) as FusedMoEMethodBase subclasses, and the submodule fp8_int8_ops with the
// exact activation quantizers, the DeepGEMM permute math and the FP8 weight-processing steps, so
// Python tests can compare them bit for bit with python/moecore/reference/moe_fp8.py.
#include "bind_all.h"
#include "moecore/layer/fused_moe.h"
#include "moecore/quant/fp8.h"
#include "moecore/quant/modelopt_fp8.h"
#include "moecore/quant/w8a8_int8.h"
#include "moecore/runner/backends/deep_gemm.h"
#include "moecore/runner/quant_compute.h"

namespace moecore::bindings {
namespace {

using WeightScheme = Fp8MoEOptions::WeightScheme;
using ActivationScheme = Fp8MoEOptions::ActivationScheme;

WeightScheme parse_weight_scheme(const std::string& s) {
  if (s == "per_tensor") return WeightScheme::kPerTensor;
  if (s == "per_channel") return WeightScheme::kPerChannel;
  if (s == "block") return WeightScheme::kBlock;
  MOECORE_THROW(InvalidArgument,
                "Fp8MoEMethod: weight_scheme must be 'per_tensor', "
                "'per_channel' or 'block', got '",
                s, "'");
}

ActivationScheme parse_activation_scheme(const std::string& s) {
  if (s == "static") return ActivationScheme::kStatic;
  if (s == "dynamic") return ActivationScheme::kDynamic;
  MOECORE_THROW(InvalidArgument, "Unsupported activation scheme ", s);  // sglang's Fp8Config text
}

// A row-major copy of a required 3-D tensor of the given dtype (the in-place helpers work on it).
Tensor copy_3d(py::handle obj, const char* what, DType dtype) {
  Tensor t = to_required_tensor(obj, what);
  MOECORE_CHECK_DTYPE(t.dtype() == dtype, what, ": expected ", dtype_name(dtype), ", got ",
                      t.describe());
  MOECORE_CHECK(t.ndim() == 3, what, ": expected a 3-D [E, N, K] array, got ", t.describe());
  return Tensor::copy_of(t.view());
}

void bind_ops(py::module_& m) {
  py::module_ ops = m.def_submodule(
      "fp8_int8_ops",
      "The exact 8-bit quantizers and permute math of moecore's triton and deep_gemm backends and "
      "FP8 quant methods (for bit-exact tests; each mirrors a named sglang kernel).");
  ops.def(
      "quantize_activation",
      [](py::object x, const std::string& rule, py::object scale, int64_t group_size,
         bool scale_ue8m0) {
        Tensor xt = to_required_tensor(x, "quantize_activation: x");
        const float s = scale.is_none() ? 0.0f : scale.cast<float>();
        ActQuantResult r;
        {
          py::gil_scoped_release release;
          r = quantize_activation(xt.view(), parse_act_quant(rule), s, group_size, scale_ue8m0);
        }
        return py::make_tuple(to_numpy(r.q), to_numpy(r.scale));
      },
      "x"_a, "rule"_a, "scale"_a = py::none(), "group_size"_a = 128, "scale_ue8m0"_a = false,
      "x [rows, K] f32/f16/bf16 → (codes, scales). rule: 'fp8_static' (scale given), "
      "'fp8_per_tensor', 'fp8_per_token', 'fp8_per_token_group', 'fp8_silu_post_group', "
      "'int8_per_token'.");
  ops.def(
      "deep_gemm_preprocess",
      [](py::object topk_ids, int64_t num_local_experts, py::object hidden_states, bool use_fp8,
         bool scale_ue8m0) {
        Tensor ids = to_required_tensor(topk_ids, "deep_gemm_preprocess: topk_ids");
        Tensor x = to_required_tensor(hidden_states, "deep_gemm_preprocess: hidden_states");
        DeepGemmPreprocessed p;
        {
          py::gil_scoped_release release;
          p = moe_ep_deepgemm_preprocess(ids, num_local_experts, x, use_fp8, scale_ue8m0);
        }
        py::dict d;
        d["masked_m"] = to_numpy(p.masked_m);
        d["expected_m"] = p.expected_m;
        d["src2dst"] = to_numpy(p.src2dst);
        d["hidden_states"] = to_numpy(p.hidden_states);
        d["hidden_states_scale"] = to_numpy(p.hidden_states_scale);
        d["m_max"] = p.m_max;
        return d;
      },
      "topk_ids"_a, "num_local_experts"_a, "hidden_states"_a, "use_fp8"_a = true,
      "scale_ue8m0"_a = false,
      "sglang's moe_ep_deepgemm_preprocess (the (standard, deep_gemm) "
      "pre-permute's math) → dict(masked_m, expected_m, src2dst, hidden_states, "
      "hidden_states_scale, m_max).");
  ops.def(
      "deep_gemm_post_reorder",
      [](py::object down, py::object src2dst, py::object ids, py::object weights,
         std::optional<float> rsf) {
        Tensor d = to_required_tensor(down, "deep_gemm_post_reorder: down_output");
        Tensor s = to_required_tensor(src2dst, "deep_gemm_post_reorder: src2dst");
        Tensor i = to_required_tensor(ids, "deep_gemm_post_reorder: topk_ids");
        Tensor w = to_required_tensor(weights, "deep_gemm_post_reorder: topk_weights");
        Tensor out;
        {
          py::gil_scoped_release release;
          out = deepgemm_post_reorder(d, s, i, w, rsf);
        }
        return to_numpy(out);
      },
      "down_output"_a, "src2dst"_a, "topk_ids"_a, "topk_weights"_a,
      "routed_scaling_factor"_a = py::none(),
      "sglang's post_reorder_triton_kernel then × routed_scaling_factor (bf16 accumulation).");
  // The deep_gemm runner core on either layout; config None → a default MoeRunnerConfig (silu).
  auto core_binding = [&](const char* name, auto fn, const char* index_arg, const char* doc) {
    ops.def(
        name,
        [fn, name](const DeepGemmMoeQuantInfo& info, py::object hidden_states,
                   py::object hidden_states_scale, py::object index,
                   std::optional<MoeRunnerConfig> config) {
          const std::string api = std::string(name) + ": ";
          Tensor x = to_required_tensor(hidden_states, (api + "hidden_states").c_str());
          Tensor s = to_tensor(hidden_states_scale, (api + "hidden_states_scale").c_str());
          Tensor i = to_required_tensor(index, (api + "index").c_str());
          const MoeRunnerConfig c = config.value_or(MoeRunnerConfig{});
          Tensor out;
          {
            py::gil_scoped_release release;
            out = fn(c, info, x, s, i);
          }
          return to_numpy(out);
        },
        "quant_info"_a, "hidden_states"_a, "hidden_states_scale"_a, py::arg(index_arg),
        py::kw_only(), "config"_a = py::none(), doc);
  };
  core_binding("deep_gemm_masked_core", &deep_gemm_masked_core, "masked_m",
               "The deep_gemm runner core on the masked layout: hidden_states [E, m_max, H] "
               "(e4m3 + f32 scales [E, m_max, H/128], or bf16 + None), masked_m int32 [E] → bf16 "
               "[E, m_max, H] (rows past masked_m zero).");
  core_binding("deep_gemm_contiguous_core", &deep_gemm_contiguous_core, "m_indices",
               "The deep_gemm runner core on the contiguous layout (sglang's ep_scatter): "
               "hidden_states [M, H] (e4m3 + f32 scales [M, H/128], or bf16 + None), m_indices "
               "int32 [M] (expert per row, -1 padding; runs 128-aligned) → bf16 [M, H] (padding "
               "rows zero).");
  ops.def(
      "requantize_w13_to_max_scale",
      [](py::object w13, py::object scales, int64_t inter, std::vector<int> shard_cols) {
        Tensor w = copy_3d(w13, "requantize_w13_to_max_scale: w13", DType::kF8E4M3);
        Tensor s = Tensor::copy_of(
            to_required_tensor(scales, "requantize_w13_to_max_scale: scales").view());
        MOECORE_CHECK(s.dtype() == DType::kF32 && s.ndim() == 2 && s.size(0) == w.size(0) &&
                          s.size(1) >= static_cast<int64_t>(shard_cols.size()) &&
                          inter * static_cast<int64_t>(shard_cols.size()) <= w.size(1),
                      "requantize_w13_to_max_scale: expected f32 scales [E, shards] and w13 rows "
                      "covering the shards");
        for (int c : shard_cols)
          MOECORE_CHECK(c >= 0 && c < s.size(1), "requantize_w13_to_max_scale: bad shard column ",
                        c);
        check_scale_values("requantize_w13_to_max_scale", "scales", s.view(), false);
        Tensor m = fp8_detail::requantize_w13_to_max_scale(w, s, inter, shard_cols);
        return py::make_tuple(to_numpy(w), to_numpy(m));
      },
      "w13"_a, "scales"_a, "intermediate_size"_a, "shard_cols"_a = std::vector<int>{0, 1},
      "sglang's per-expert max requant of w13 → (new w13 codes, max scales [E]).");
  ops.def(
      "quantize_weight_per_expert",
      [](py::object w) {
        Tensor t = to_required_tensor(w, "quantize_weight_per_expert: w");
        MOECORE_CHECK_DTYPE(is_activation_dtype(t.dtype()) && t.ndim() == 3,
                            "quantize_weight_per_expert: expected f32/f16/bf16 [E, N, K], got ",
                            t.describe());
        Tensor c = Tensor::copy_of(t.view()), s;
        Tensor q = fp8_detail::quantize_per_expert(c, &s);
        return py::make_tuple(to_numpy(q), to_numpy(s));
      },
      "w"_a, "bf16/f16/f32 experts → (e4m3 codes, per-expert scales [E]) (scaled_fp8_quant).");
  ops.def(
      "quantize_weight_per_channel",
      [](py::object w) {
        Tensor t = to_required_tensor(w, "quantize_weight_per_channel: w");
        MOECORE_CHECK_DTYPE(is_activation_dtype(t.dtype()) && t.ndim() == 3,
                            "quantize_weight_per_channel: expected f32/f16/bf16 [E, N, K], got ",
                            t.describe());
        Tensor c = Tensor::copy_of(t.view()), s;
        Tensor q = fp8_detail::quantize_per_channel(c, &s);
        return py::make_tuple(to_numpy(q), to_numpy(s));
      },
      "w"_a, "bf16/f16/f32 experts → (e4m3 codes, per-row scales [E, N, 1]).");
  ops.def(
      "requantize_block_ue8m0",
      [](py::object w, py::object scale) {
        Tensor q = copy_3d(w, "requantize_block_ue8m0: w", DType::kF8E4M3);
        Tensor s =
            Tensor::copy_of(to_required_tensor(scale, "requantize_block_ue8m0: scale").view());
        const std::vector<int64_t> want = {q.size(0), (q.size(1) + 127) / 128,
                                           (q.size(2) + 127) / 128};
        MOECORE_CHECK(s.dtype() == DType::kF32 && s.view().shape_vector() == want,
                      "requantize_block_ue8m0: expected f32 scale ", shape_string(want), ", got ",
                      s.describe());
        check_scale_values("requantize_block_ue8m0", "scale", s.view(), false);
        Tensor out = fp8_detail::requantize_block_ue8m0(q, s);
        return py::make_tuple(to_numpy(q), to_numpy(out));
      },
      "w"_a, "scale"_a,
      "DeepGEMM's UE8M0 requant of 128×128-block e4m3 weights → (codes, "
      "power-of-two scales).");
}

}  // namespace

void bind_quant_fp8(py::module_& m) {
  py::class_<Fp8MoEMethod, FusedMoEMethod, std::shared_ptr<Fp8MoEMethod>>(
      m, "Fp8MoEMethod",
      "sglang's Fp8MoEMethod: e4m3 experts with per-tensor, per-channel or block scales; static "
      "or dynamic activations; triton or deep_gemm runner.")
      .def(
          py::init([](const std::string& weight_scheme,
                      std::optional<std::vector<int64_t>> weight_block_size,
                      const std::string& activation_scheme, bool checkpoint_fp8, bool scale_ue8m0) {
            Fp8MoEOptions o;
            o.weight_scheme = parse_weight_scheme(weight_scheme);
            if (weight_block_size) o.block_shape = *weight_block_size;
            o.activation_scheme = parse_activation_scheme(activation_scheme);
            o.checkpoint_fp8 = checkpoint_fp8;
            o.scale_ue8m0 = scale_ue8m0;
            return std::make_shared<Fp8MoEMethod>(o);
          }),
          py::kw_only(), "weight_scheme"_a = "per_tensor", "weight_block_size"_a = py::none(),
          "activation_scheme"_a = "dynamic", "is_checkpoint_fp8_serialized"_a = true,
          "scale_ue8m0"_a = false)
      .def_property_readonly(
          "weight_scheme",
          [](const Fp8MoEMethod& q) { return to_string(q.options().weight_scheme); })
      .def_property_readonly("weight_block_size",
                             [](const Fp8MoEMethod& q) -> py::object {
                               if (q.options().weight_scheme != WeightScheme::kBlock)
                                 return py::none();
                               return py::cast(q.options().block_shape);
                             })
      .def_property_readonly(
          "activation_scheme",
          [](const Fp8MoEMethod& q) { return to_string(q.options().activation_scheme); })
      .def_property_readonly("is_checkpoint_fp8_serialized",
                             [](const Fp8MoEMethod& q) { return q.options().checkpoint_fp8; })
      .def_property_readonly("scale_ue8m0",
                             [](const Fp8MoEMethod& q) { return q.options().scale_ue8m0; })
      .def(
          "resolve_backend",
          [](const Fp8MoEMethod& q, const FusedMoE& layer) {
            return from_enum(q.resolve_backend(layer));
          },
          "layer"_a)
      .def("quant_info", &Fp8MoEMethod::quant_info, "layer"_a)
      .def("__repr__", [](const Fp8MoEMethod& q) {
        const Fp8MoEOptions& o = q.options();
        std::string s =
            std::string("Fp8MoEMethod(weight_scheme='") + to_string(o.weight_scheme) + "'";
        if (o.weight_scheme == WeightScheme::kBlock)
          s += ", weight_block_size=" + shape_string(o.block_shape);
        s += std::string(", activation_scheme='") + to_string(o.activation_scheme) +
             "', is_checkpoint_fp8_serialized=" + (o.checkpoint_fp8 ? "True" : "False") +
             ", scale_ue8m0=" + (o.scale_ue8m0 ? "True" : "False") + ")";
        return s;
      });

  py::class_<ModelOptFp8MoEMethod, FusedMoEMethod, std::shared_ptr<ModelOptFp8MoEMethod>>(
      m, "ModelOptFp8MoEMethod",
      "sglang's ModelOptFp8MoEMethod: per-tensor e4m3 experts with static input scales; triton or "
      "flashinfer_cutlass (I padded to a multiple of 16, R10).")
      .def(py::init<>())
      .def_property_readonly("backend",
                             [](const ModelOptFp8MoEMethod& q) { return from_enum(q.backend()); })
      .def(
          "quant_info",
          [](const ModelOptFp8MoEMethod& q, const FusedMoE& layer, py::object output_dtype) {
            return q.quant_info(layer, to_dtype(output_dtype));
          },
          "layer"_a, "output_dtype"_a = py::none())
      .def("__repr__",
           [](const ModelOptFp8MoEMethod&) { return std::string("ModelOptFp8MoEMethod()"); });

  py::class_<Int8MoEMethod, FusedMoEMethod, std::shared_ptr<Int8MoEMethod>>(
      m, "Int8MoEMethodBase", "INT8 per-channel experts through the triton runner.")
      .def("quant_info", &Int8MoEMethod::quant_info, "layer"_a);
  py::class_<W8A8Int8MoEMethod, Int8MoEMethod, std::shared_ptr<W8A8Int8MoEMethod>>(
      m, "W8A8Int8MoEMethod",
      "sglang's W8A8Int8MoEMethod: int8 per-channel weights, per-token dynamic int8 activations.")
      .def(py::init<>())
      .def("__repr__", [](const W8A8Int8MoEMethod&) { return std::string("W8A8Int8MoEMethod()"); });
  py::class_<W8A16Int8MoEMethod, Int8MoEMethod, std::shared_ptr<W8A16Int8MoEMethod>>(
      m, "W8A16Int8MoEMethod",
      "INT8 weight-only experts (the Triton kernel's use_int8_w8a16): per-channel int8 weights, "
      "unquantized activations.")
      .def(py::init<>())
      .def("__repr__",
           [](const W8A16Int8MoEMethod&) { return std::string("W8A16Int8MoEMethod()"); });

  bind_ops(m);
}

}  // namespace moecore::bindings
