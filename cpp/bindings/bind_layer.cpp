// FusedMoE: the layer that owns weights and runs routing → dispatch → quant method → combine.
#include "bind_all.h"
#include "moecore/layer/fused_moe.h"
#include "py_objects.h"

namespace moecore::bindings {

void bind_layer(py::module_& m) {
  py::class_<FusedMoE, std::shared_ptr<FusedMoE>>(
      m, "FusedMoE",
      "One rank's MoE layer. Parameters are created zero-filled; load them with weight_loader "
      "(per-expert w1/w3/w2 checkpoint shards, TP-narrowed) or write into the arrays that "
      "parameter() returns, then call process_weights_after_loading() once.")
      .def(py::init([](int64_t num_experts, int64_t hidden_size, int64_t intermediate_size,
                       const TopKConfig& topk_config, std::optional<int64_t> layer_id,
                       py::object params_dtype, bool with_bias, int64_t tp_size, int64_t tp_rank,
                       int64_t ep_size, int64_t ep_rank, std::optional<MoeRunnerConfig> runner_config,
                       py::object quant_method, py::object runner_backend, py::object a2a_backend) {
             FusedMoEOptions o;
             o.num_experts = num_experts;
             o.hidden_size = hidden_size;
             o.intermediate_size = intermediate_size;
             o.topk_config = topk_config;
             o.layer_id = layer_id;
             o.params_dtype = to_dtype(params_dtype).value_or(DType::kBF16);
             o.with_bias = with_bias;
             o.tp_size = tp_size;
             o.tp_rank = tp_rank;
             o.ep_size = ep_size;
             o.ep_rank = ep_rank;
             if (runner_config) {
               o.runner_config = *runner_config;
             } else {
               o.runner_config.inplace = false;  // a layer call never overwrites its input
             }
             o.runner_backend = to_optional_enum<MoeRunnerBackend>(runner_backend);
             if (!a2a_backend.is_none()) o.a2a_backend = to_enum<MoeA2ABackend>(a2a_backend);
             std::shared_ptr<FusedMoEMethod> method;
             if (!quant_method.is_none()) method = quant_method.cast<std::shared_ptr<FusedMoEMethod>>();
             return std::make_shared<FusedMoE>(o, method);
           }),
           py::kw_only(), "num_experts"_a, "hidden_size"_a, "intermediate_size"_a, "topk_config"_a,
           "layer_id"_a = py::none(), "params_dtype"_a = "bf16", "with_bias"_a = false,
           "tp_size"_a = 1, "tp_rank"_a = 0, "ep_size"_a = 1, "ep_rank"_a = 0,
           "runner_config"_a = py::none(), "quant_method"_a = py::none(),
           "runner_backend"_a = py::none(), "a2a_backend"_a = py::none())
      .def("weight_loader", [](FusedMoE& l, const std::string& param, py::object loaded,
                               const std::string& weight_name, const std::string& shard_id,
                               int64_t expert_id) {
        return l.weight_loader(param, to_required_tensor(loaded, "weight_loader: loaded_weight"),
                               shard_id, expert_id);
      }, "param_name"_a, "loaded_weight"_a, "weight_name"_a, "shard_id"_a, "expert_id"_a,
         "Copies one checkpoint tensor into a parameter (see the class doc); returns False for "
         "experts of other EP ranks.")
      .def("process_weights_after_loading", [](FusedMoE& l) {
        py::gil_scoped_release release;
        l.process_weights_after_loading();
      })
      .def("forward", [](FusedMoE& l, py::object hidden, py::object logits,
                         std::optional<int64_t> num_token_non_padded) {
        Tensor h = to_required_tensor(hidden, "FusedMoE.forward: hidden_states");
        Tensor r = to_required_tensor(logits, "FusedMoE.forward: router_logits");
        Tensor out;
        {
          py::gil_scoped_release release;
          out = l.forward(h, r, num_token_non_padded);
        }
        return to_numpy(out);
      }, "hidden_states"_a, "router_logits"_a, py::kw_only(), "num_token_non_padded"_a = py::none())
      .def("forward_topk", [](FusedMoE& l, py::object hidden, py::object topk) {
        Tensor h = to_required_tensor(hidden, "FusedMoE.forward_topk: hidden_states");
        TopKOutput t = to_topk_output(topk);
        Tensor out;
        {
          py::gil_scoped_release release;
          out = l.forward_topk(h, t);
        }
        return to_numpy(out);
      }, "hidden_states"_a, "topk_output"_a)
      .def("parameter", [](const FusedMoE& l, const std::string& n) { return to_numpy(l.parameter(n)); },
           "name"_a, "The parameter's array (a view: writing into it changes the layer).")
      .def("named_parameters", [](const FusedMoE& l) {
        py::dict d;
        for (const auto& n : l.parameter_names()) d[n.c_str()] = to_numpy(l.parameter(n));
        return d;
      })
      .def_property_readonly("moe_runner_config", &FusedMoE::config)
      .def_property_readonly("num_local_experts", &FusedMoE::num_local_experts)
      .def_property_readonly("intermediate_size_per_partition", &FusedMoE::intermediate_size_per_partition)
      .def_property_readonly("runner_backend", [](const FusedMoE& l) { return from_enum(l.runner_backend()); })
      .def_property_readonly("quant_method", &FusedMoE::quant_method)
      .def_property_readonly("dispatcher", &FusedMoE::dispatcher)
      .def_property_readonly("runner", &FusedMoE::runner)
      .def("set_overlap_args", [](FusedMoE& l, py::object down, py::object meta) {
        l.set_overlap_args(down.is_none() ? std::any() : std::any(hold(down)),
                           meta.is_none() ? std::any() : std::any(hold(meta)));
      })
      .def("clear_overlap_args", &FusedMoE::clear_overlap_args);
}

}  // namespace moecore::bindings
