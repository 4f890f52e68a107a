// Dispatch bindings: DispatchOutput/CombineInput bases, the standard forms, StandardDispatcher.
#include "bind_all.h"
#include "moecore/dispatch/dispatcher.h"
#include "py_objects.h"

namespace moecore::bindings {
namespace {

QuantConfig to_quant_config(py::dict d) {
  QuantConfig out;
  for (auto [key, value] : d) {
    const std::string k = py::str(key).cast<std::string>();
    if (value.is_none()) out[k] = std::monostate{};
    else if (py::isinstance<py::bool_>(value)) out[k] = value.cast<bool>();
    else if (py::isinstance<py::int_>(value)) out[k] = value.cast<int64_t>();
    else if (py::isinstance<py::float_>(value)) out[k] = value.cast<double>();
    else if (py::isinstance<py::str>(value)) out[k] = value.cast<std::string>();
    else if (py::isinstance<py::array>(value)) out[k] = to_tensor(value, k.c_str());
    else if (py::hasattr(value, "value") && py::isinstance<py::str>(value.attr("value")))
      out[k] = value.attr("value").cast<std::string>();  // an Enum member: its wire value
    else
      MOECORE_THROW(DTypeError, "set_quant_config: unsupported value for '", k, "': ",
                    type_name(value));
  }
  return out;
}

py::dict from_quant_config(const QuantConfig& c) {
  py::dict d;
  for (const auto& [k, v] : c) {
    std::visit([&](const auto& x) {
      using T = std::decay_t<decltype(x)>;
      if constexpr (std::is_same_v<T, std::monostate>) d[k.c_str()] = py::none();
      else if constexpr (std::is_same_v<T, Tensor>) d[k.c_str()] = to_numpy(x);
      else d[k.c_str()] = x;
    }, v);
  }
  return d;
}

}  // namespace

void bind_dispatch(py::module_& m) {
  py::class_<DispatchOutput, DispatchOutputPtr>(m, "DispatchOutput")
      .def_property_readonly("format", [](const DispatchOutput& d) { return from_enum(d.format()); });
  py::class_<CombineInput, CombineInputPtr>(m, "CombineInput")
      .def_property_readonly("format", [](const CombineInput& c) {
        return py::module_::import("moecore.enums").attr("CombineInputFormat")(to_string(c.format()));
      });

  py::class_<StandardDispatchOutput, DispatchOutput, std::shared_ptr<StandardDispatchOutput>>(
      m, "StandardDispatchOutput",
      "StandardDispatchOutput(hidden_states [T, H], hidden_states_scale=None, topk_output, "
      "hidden_states_pre_quant=None). The older form (hidden_states, topk_output) works too.")
      .def(py::init([](py::object hidden, py::object scale, py::object topk, py::object pre_quant) {
             if (topk.is_none() && (py::isinstance<StandardTopKOutput>(scale) ||
                                    py::isinstance<BypassedTopKOutput>(scale)))
               std::swap(scale, topk);  // sglang's older (hidden_states, topk_output) order
             MOECORE_CHECK(!topk.is_none(), "StandardDispatchOutput: topk_output is required");
             auto out = std::make_shared<StandardDispatchOutput>();
             out->hidden_states = to_required_tensor(hidden, "StandardDispatchOutput.hidden_states");
             out->hidden_states_scale = to_tensor(scale, "StandardDispatchOutput.hidden_states_scale");
             out->topk_output = to_topk_output(topk);
             out->hidden_states_pre_quant =
                 to_tensor(pre_quant, "StandardDispatchOutput.hidden_states_pre_quant");
             return out;
           }),
           "hidden_states"_a, "hidden_states_scale"_a = py::none(), "topk_output"_a = py::none(),
           "hidden_states_pre_quant"_a = py::none())
      .def_property_readonly("hidden_states", [](const StandardDispatchOutput& d) { return to_numpy(d.hidden_states); })
      .def_property_readonly("hidden_states_scale", [](const StandardDispatchOutput& d) { return to_numpy(d.hidden_states_scale); })
      .def_property_readonly("hidden_states_pre_quant", [](const StandardDispatchOutput& d) { return to_numpy(d.hidden_states_pre_quant); })
      .def_property_readonly("topk_output", [](const StandardDispatchOutput& d) { return from_topk_output(d.topk_output); });

  py::class_<StandardCombineInput, CombineInput, std::shared_ptr<StandardCombineInput>>(
      m, "StandardCombineInput", "StandardCombineInput(hidden_states [T, H] or [T, k, H])")
      .def(py::init([](py::object hidden) {
             return std::make_shared<StandardCombineInput>(
                 to_required_tensor(hidden, "StandardCombineInput.hidden_states"));
           }),
           "hidden_states"_a)
      .def_property_readonly("hidden_states", [](const StandardCombineInput& c) { return to_numpy(c.hidden_states); });

  py::class_<StandardDispatcher, std::shared_ptr<StandardDispatcher>>(
      m, "StandardDispatcher",
      "Dispatcher for a2a 'none'. With ep_size > 1 it maps global expert ids to this rank's "
      "local ids (others → -1; -1 stays -1).")
      .def(py::init([](int64_t num_experts, int64_t ep_size, int64_t ep_rank,
                       int64_t num_fused_shared_experts, py::object runner_backend) {
             return std::make_shared<StandardDispatcher>(
                 num_experts, ep_size, ep_rank, num_fused_shared_experts,
                 runner_backend.is_none() ? MoeRunnerBackend::TRITON
                                          : to_enum<MoeRunnerBackend>(runner_backend));
           }),
           "num_experts"_a, py::kw_only(), "ep_size"_a = 1, "ep_rank"_a = 0,
           "num_fused_shared_experts"_a = 0, "runner_backend"_a = py::none())
      .def("dispatch", [](StandardDispatcher& d, py::object hidden, py::object topk) {
        Tensor h = to_required_tensor(hidden, "StandardDispatcher.dispatch: hidden_states");
        TopKOutput t = to_topk_output(topk);
        DispatchOutputPtr out;
        {
          py::gil_scoped_release release;
          out = d.dispatch(h, t);
        }
        return from_dispatch_output(out);
      }, "hidden_states"_a, "topk_output"_a)
      .def("combine", [](StandardDispatcher& d, py::object combine_input) {
        return to_numpy(d.combine(to_combine_input(combine_input)));
      }, "combine_input"_a)
      .def("set_quant_config", [](StandardDispatcher& d, py::dict c) { d.set_quant_config(to_quant_config(c)); }, "quant_config"_a)
      .def_property_readonly("quant_config", [](const StandardDispatcher& d) { return from_quant_config(d.quant_config()); })
      .def_property_readonly("local_expert_mapping", [](const StandardDispatcher& d) { return to_numpy(d.local_expert_mapping()); })
      .def_property_readonly("num_local_experts", &StandardDispatcher::num_local_experts)
      .def_property_readonly("ep_size", &StandardDispatcher::ep_size)
      .def_property_readonly("ep_rank", &StandardDispatcher::ep_rank)
      .def("set_overlap_args", [](StandardDispatcher& d, py::object combine, py::object meta) {
        d.set_overlap_args(hold(combine), hold(meta));
      }, "combine_overlap_args"_a, "meta_overlap_args"_a)
      .def("clear_overlap_args", &StandardDispatcher::clear_overlap_args);
}

}  // namespace moecore::bindings
