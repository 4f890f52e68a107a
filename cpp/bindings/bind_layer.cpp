// FusedMoE: the layer that owns weights and runs routing → dispatch → quant method → combine.
#include "bind_all.h"
#include "moecore/layer/ep_group.h"
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
                       py::object quant_method, py::object runner_backend, py::object a2a_backend,
                       TransportPtr transport, py::object deepep_mode,
                       int64_t num_max_dispatch_tokens_per_rank) {
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
             o.transport = std::move(transport);
             o.deepep_mode = to_optional_enum<DeepEPMode>(deepep_mode).value_or(DeepEPMode::AUTO);
             o.num_max_dispatch_tokens_per_rank = num_max_dispatch_tokens_per_rank;
             std::shared_ptr<FusedMoEMethod> method;
             if (!quant_method.is_none()) method = quant_method.cast<std::shared_ptr<FusedMoEMethod>>();
             return std::make_shared<FusedMoE>(o, method);
           }),
           py::kw_only(), "num_experts"_a, "hidden_size"_a, "intermediate_size"_a, "topk_config"_a,
           "layer_id"_a = py::none(), "params_dtype"_a = "bf16", "with_bias"_a = false,
           "tp_size"_a = 1, "tp_rank"_a = 0, "ep_size"_a = 1, "ep_rank"_a = 0,
           "runner_config"_a = py::none(), "quant_method"_a = py::none(),
           "runner_backend"_a = py::none(), "a2a_backend"_a = py::none(),
           "transport"_a = py::none(), "deepep_mode"_a = "auto",
           "num_max_dispatch_tokens_per_rank"_a = 128)
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
      .def_property_readonly("num_experts", [](const FusedMoE& l) { return l.options().num_experts; })
      .def_property_readonly("hidden_size", [](const FusedMoE& l) { return l.options().hidden_size; })
      .def_property_readonly("top_k", [](const FusedMoE& l) { return l.options().topk_config.top_k; })
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
      .def("clear_overlap_args", &FusedMoE::clear_overlap_args)
      .def_property_readonly("deprecate_flag", &FusedMoE::deprecate_flag);

  py::class_<ExpertParallelGroup, std::shared_ptr<ExpertParallelGroup>>(
      m, "ExpertParallelGroup",
      "R rank-local FusedMoE layers over one in-process LoopbackGroup (a2a 'deepep' or "
      "'flashinfer'). Load global experts with weight_loader (each rank keeps its slice), call "
      "process_weights_after_loading(), then forward() one batch per rank; the ranks run on "
      "their own threads with the GIL released.")
      .def(py::init([](int ranks, int64_t num_experts, int64_t hidden_size,
                       int64_t intermediate_size, const TopKConfig& topk_config,
                       py::object a2a_backend, py::object runner_backend, py::object params_dtype,
                       std::optional<MoeRunnerConfig> runner_config, py::object quant_method,
                       py::object deepep_mode, int64_t num_max_dispatch_tokens_per_rank,
                       bool with_bias) {
             FusedMoEOptions o;
             o.num_experts = num_experts;
             o.hidden_size = hidden_size;
             o.intermediate_size = intermediate_size;
             o.topk_config = topk_config;
             o.params_dtype = to_dtype(params_dtype).value_or(DType::kBF16);
             o.with_bias = with_bias;
             if (runner_config) {
               o.runner_config = *runner_config;
             } else {
               o.runner_config.inplace = false;
             }
             o.runner_backend = to_optional_enum<MoeRunnerBackend>(runner_backend);
             o.a2a_backend = to_enum<MoeA2ABackend>(a2a_backend);
             o.deepep_mode = to_optional_enum<DeepEPMode>(deepep_mode).value_or(DeepEPMode::AUTO);
             o.num_max_dispatch_tokens_per_rank = num_max_dispatch_tokens_per_rank;
             ExpertParallelGroup::MethodFactory factory;
             if (!quant_method.is_none()) {
               MOECORE_CHECK_DTYPE(PyCallable_Check(quant_method.ptr()),
                                   "ExpertParallelGroup: quant_method must be a callable that "
                                   "returns a new quant method per rank, got ",
                                   type_name(quant_method));
               factory = [quant_method] {
                 return quant_method().cast<std::shared_ptr<FusedMoEMethod>>();
               };
             }
             return std::make_shared<ExpertParallelGroup>(ranks, o, factory);
           }),
           "ranks"_a, py::kw_only(), "num_experts"_a, "hidden_size"_a, "intermediate_size"_a,
           "topk_config"_a, "a2a_backend"_a = "deepep", "runner_backend"_a = py::none(),
           "params_dtype"_a = "bf16", "runner_config"_a = py::none(), "quant_method"_a = py::none(),
           "deepep_mode"_a = "auto", "num_max_dispatch_tokens_per_rank"_a = 128,
           "with_bias"_a = false)
      .def_property_readonly("size", &ExpertParallelGroup::size)
      .def_property_readonly("layers", [](const ExpertParallelGroup& g) {
        py::list layers;
        for (int r = 0; r < g.size(); ++r) layers.append(g.layer_ptr(r));
        return layers;
      })
      .def("weight_loader", [](ExpertParallelGroup& g, const std::string& param, py::object loaded,
                               const std::string& shard_id, int64_t expert_id) {
        return g.weight_loader(param, to_required_tensor(loaded, "weight_loader: loaded_weight"),
                               shard_id, expert_id);
      }, "param_name"_a, "loaded_weight"_a, "shard_id"_a, "expert_id"_a,
         "Loads one global expert's checkpoint tensor into every rank; the owner keeps it.")
      .def("process_weights_after_loading", [](ExpertParallelGroup& g) {
        py::gil_scoped_release release;
        g.process_weights_after_loading();
      })
      .def("forward", [](ExpertParallelGroup& g, py::list hidden, py::list logits,
                         bool is_extend_in_batch) {
        std::vector<Tensor> h, r;
        for (size_t i = 0; i < hidden.size(); ++i)
          h.push_back(to_required_tensor(hidden[i], "ExpertParallelGroup.forward: hidden_states"));
        for (size_t i = 0; i < logits.size(); ++i)
          r.push_back(to_required_tensor(logits[i], "ExpertParallelGroup.forward: router_logits"));
        std::vector<Tensor> out;
        {
          py::gil_scoped_release release;
          out = g.forward(h, r, is_extend_in_batch);
        }
        py::list result;
        for (const Tensor& t : out) result.append(to_numpy(t));
        return result;
      }, "hidden_states"_a, "router_logits"_a, py::kw_only(), "is_extend_in_batch"_a,
         "Per-rank hidden_states [T_r, H] and router_logits [T_r, E] → per-rank outputs.")
      .def("forward_topk", [](ExpertParallelGroup& g, py::list hidden, py::list topk,
                              bool is_extend_in_batch) {
        std::vector<Tensor> h;
        std::vector<TopKOutput> t;
        for (size_t i = 0; i < hidden.size(); ++i)
          h.push_back(to_required_tensor(hidden[i], "ExpertParallelGroup.forward_topk: hidden_states"));
        for (size_t i = 0; i < topk.size(); ++i) t.push_back(to_topk_output(topk[i]));
        std::vector<Tensor> out;
        {
          py::gil_scoped_release release;
          out = g.forward_topk(h, t, is_extend_in_batch);
        }
        py::list result;
        for (const Tensor& x : out) result.append(to_numpy(x));
        return result;
      }, "hidden_states"_a, "topk_outputs"_a, py::kw_only(), "is_extend_in_batch"_a);
}

}  // namespace moecore::bindings
