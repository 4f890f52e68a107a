// Routing bindings: TopKConfig, StandardTopKOutput (NamedTuple-like), BypassedTopKOutput,
// select_experts.
#include "bind_all.h"
#include "moecore/dispatch/types.h"
#include "moecore/routing/topk.h"

namespace moecore::bindings {
namespace {

CustomRoutingFunction wrap_routing_function(py::object fn) {
  if (fn.is_none()) return {};
  PyHolder holder = hold(std::move(fn));
  return [holder](const Tensor& hidden, const Tensor& logits, int top_k, bool renormalize) {
    py::gil_scoped_acquire gil;
    py::object result = (*holder)(to_numpy(hidden), to_numpy(logits), top_k, renormalize);
    py::tuple pair;
    try {
      pair = result.cast<py::tuple>();
    } catch (const py::cast_error&) {
      MOECORE_THROW(DTypeError, "custom_routing_function must return (topk_weights, topk_ids)");
    }
    MOECORE_CHECK(pair.size() == 2, "custom_routing_function must return (topk_weights, "
                  "topk_ids), got ", pair.size(), " values");
    return std::make_pair(to_required_tensor(pair[0], "custom_routing_function topk_weights"),
                          to_required_tensor(pair[1], "custom_routing_function topk_ids"));
  };
}

std::string topk_config_repr(const TopKConfig& c) {
  return str_cat("TopKConfig(top_k=", c.top_k, ", use_grouped_topk=", c.use_grouped_topk,
                 ", renormalize=", c.renormalize, ", scoring_func='", to_string(c.scoring_func),
                 "', num_fused_shared_experts=", c.num_fused_shared_experts, ")");
}

}  // namespace

void bind_routing(py::module_& m) {
  py::class_<TopKConfig>(m, "TopKConfig", "sglang's TopKConfig: how select_experts routes.")
      .def(py::init([](int top_k, bool use_grouped_topk, std::optional<int> topk_group,
                       std::optional<int> num_expert_group, bool renormalize,
                       int num_fused_shared_experts, py::object custom_routing_function,
                       py::object correction_bias, bool torch_native,
                       std::optional<float> routed_scaling_factor,
                       bool apply_routed_scaling_factor_on_output,
                       std::optional<float> fused_shared_experts_scaling_factor,
                       py::object output_format, py::object scoring_func) {
             TopKConfig c;
             c.top_k = top_k;
             c.use_grouped_topk = use_grouped_topk;
             c.topk_group = topk_group;
             c.num_expert_group = num_expert_group;
             c.renormalize = renormalize;
             c.num_fused_shared_experts = num_fused_shared_experts;
             c.custom_routing_function = wrap_routing_function(custom_routing_function);
             c.correction_bias = to_tensor(correction_bias, "TopKConfig.correction_bias");
             c.torch_native = torch_native;
             c.routed_scaling_factor = routed_scaling_factor;
             c.apply_routed_scaling_factor_on_output = apply_routed_scaling_factor_on_output;
             c.fused_shared_experts_scaling_factor = fused_shared_experts_scaling_factor;
             if (!output_format.is_none())
               c.output_format = static_cast<TopKOutputFormat>(output_format.cast<int>());
             c.scoring_func = scoring_func.is_none() ? ScoringFunc::SOFTMAX
                                                     : to_enum<ScoringFunc>(scoring_func);
             return c;
           }),
           py::kw_only(), "top_k"_a, "use_grouped_topk"_a = false, "topk_group"_a = py::none(),
           "num_expert_group"_a = py::none(), "renormalize"_a = true,
           "num_fused_shared_experts"_a = 0, "custom_routing_function"_a = py::none(),
           "correction_bias"_a = py::none(), "torch_native"_a = false,
           "routed_scaling_factor"_a = py::none(),
           "apply_routed_scaling_factor_on_output"_a = false,
           "fused_shared_experts_scaling_factor"_a = py::none(), "output_format"_a = py::none(),
           "scoring_func"_a = "softmax")
      .def_readwrite("top_k", &TopKConfig::top_k)
      .def_readwrite("use_grouped_topk", &TopKConfig::use_grouped_topk)
      .def_readwrite("topk_group", &TopKConfig::topk_group)
      .def_readwrite("num_expert_group", &TopKConfig::num_expert_group)
      .def_readwrite("renormalize", &TopKConfig::renormalize)
      .def_readwrite("num_fused_shared_experts", &TopKConfig::num_fused_shared_experts)
      .def_readwrite("torch_native", &TopKConfig::torch_native)
      .def_readwrite("routed_scaling_factor", &TopKConfig::routed_scaling_factor)
      .def_readwrite("apply_routed_scaling_factor_on_output",
                     &TopKConfig::apply_routed_scaling_factor_on_output)
      .def_readwrite("fused_shared_experts_scaling_factor",
                     &TopKConfig::fused_shared_experts_scaling_factor)
      .def_property_readonly("correction_bias",
                             [](const TopKConfig& c) { return to_numpy(c.correction_bias); })
      .def_property_readonly("scoring_func",
                             [](const TopKConfig& c) { return to_string(c.scoring_func); })
      .def("__repr__", &topk_config_repr);

  py::class_<StandardTopKOutput>(m, "StandardTopKOutput",
                                 "(topk_weights f32 [T, k], topk_ids i32 [T, k], router_logits)")
      .def(py::init([](py::object w, py::object ids, py::object logits) {
             return StandardTopKOutput{to_required_tensor(w, "topk_weights"),
                                       to_required_tensor(ids, "topk_ids"),
                                       to_tensor(logits, "router_logits")};
           }),
           "topk_weights"_a, "topk_ids"_a, "router_logits"_a = py::none())
      .def_property_readonly("topk_weights", [](const StandardTopKOutput& o) { return to_numpy(o.topk_weights); })
      .def_property_readonly("topk_ids", [](const StandardTopKOutput& o) { return to_numpy(o.topk_ids); })
      .def_property_readonly("router_logits", [](const StandardTopKOutput& o) { return to_numpy(o.router_logits); })
      .def_property_readonly("format", [](const StandardTopKOutput&) {
        return py::module_::import("moecore.enums").attr("TopKOutputFormat").attr("STANDARD");
      })
      .def("__len__", [](const StandardTopKOutput&) { return 3; })
      .def("__getitem__", [](const StandardTopKOutput& o, int i) {
        if (i < 0) i += 3;
        if (i == 0) return to_numpy(o.topk_weights);
        if (i == 1) return to_numpy(o.topk_ids);
        if (i == 2) return to_numpy(o.router_logits);
        throw py::index_error("StandardTopKOutput index out of range");
      })
      .def("__repr__", [](const StandardTopKOutput& o) {
        return "StandardTopKOutput(topk_weights=" + o.topk_weights.describe() +
               ", topk_ids=" + o.topk_ids.describe() + ")";
      });

  py::class_<BypassedTopKOutput>(m, "BypassedTopKOutput",
                                 "Routing deferred to the consumer; to_standard() runs it.")
      .def(py::init([](py::object hidden, py::object logits, const TopKConfig& config,
                       std::optional<int64_t> num_token_non_padded, py::object) {
             return BypassedTopKOutput{to_tensor(hidden, "hidden_states"),
                                       to_required_tensor(logits, "router_logits"), config,
                                       num_token_non_padded};
           }),
           "hidden_states"_a, "router_logits"_a, "topk_config"_a,
           "num_token_non_padded"_a = py::none(), "expert_location_dispatch_info"_a = py::none())
      .def_property_readonly("hidden_states", [](const BypassedTopKOutput& o) { return to_numpy(o.hidden_states); })
      .def_property_readonly("router_logits", [](const BypassedTopKOutput& o) { return to_numpy(o.router_logits); })
      .def_property_readonly("topk_config", [](const BypassedTopKOutput& o) { return o.topk_config; })
      .def_readonly("num_token_non_padded", &BypassedTopKOutput::num_token_non_padded)
      .def_property_readonly("format", [](const BypassedTopKOutput&) {
        return py::module_::import("moecore.enums").attr("TopKOutputFormat").attr("BYPASSED");
      })
      .def("to_standard", [](const BypassedTopKOutput& o, py::object) {
        py::gil_scoped_release release;
        return o.to_standard();
      }, "layer_id"_a = py::none());

  m.def("select_experts",
        [](py::object hidden_states, py::object router_logits, const TopKConfig& config,
           py::object layer_id, std::optional<int64_t> num_token_non_padded, py::object) {
          Tensor hidden = to_tensor(hidden_states, "select_experts: hidden_states");
          Tensor logits = to_required_tensor(router_logits, "select_experts: router_logits");
          py::gil_scoped_release release;
          return select_experts(hidden, logits, config, num_token_non_padded);
        },
        "hidden_states"_a, "router_logits"_a, "topk_config"_a, py::kw_only(),
        "layer_id"_a = py::none(), "num_token_non_padded"_a = py::none(),
        "expert_location_dispatch_info"_a = py::none(),
        "Routes tokens: router_logits [T, E] → StandardTopKOutput (spec §8).");
}

}  // namespace moecore::bindings
