// MoeRunnerConfig, MoeRunner and the registries, including Python callables registered as fused
// funcs, permutes and runner cores (sglang's register_fused_func decorator and friends).
#include "bind_all.h"
#include "moecore/runner/prepared.h"
#include "moecore/isa/isa.h"
#include "moecore/runner/runner.h"
#include "py_objects.h"

namespace moecore::bindings {
namespace {

std::string origin_of(py::handle fn) {
  std::string module = py::hasattr(fn, "__module__") ? py::str(fn.attr("__module__")).cast<std::string>() : "?";
  std::string name = py::hasattr(fn, "__qualname__") ? py::str(fn.attr("__qualname__")).cast<std::string>()
                                                     : py::str(fn).cast<std::string>();
  return "python:" + module + "." + name;
}

// register_x(key..., fn=None): registers now, or returns a decorator when fn is None.
template <typename Register>
py::object register_or_decorate(py::object fn, Register reg) {
  auto checked = [reg](py::object f) {
    MOECORE_CHECK_DTYPE(PyCallable_Check(f.ptr()), "register: expected a callable, got ",
                        type_name(f));
    reg(f);
  };
  if (!fn.is_none()) {
    checked(fn);
    return fn;
  }
  return py::cpp_function([checked](py::object f) {
    checked(f);
    return f;
  });
}

std::string config_repr(const MoeRunnerConfig& c) {
  auto opt = [](const auto& o) { return o ? str_cat(*o) : std::string("None"); };
  return str_cat("MoeRunnerConfig(num_experts=", opt(c.num_experts), ", num_local_experts=",
                 opt(c.num_local_experts), ", hidden_size=", opt(c.hidden_size),
                 ", intermediate_size_per_partition=", opt(c.intermediate_size_per_partition),
                 ", top_k=", opt(c.top_k), ", activation='", c.activation, "', is_gated=",
                 c.is_gated ? "True" : "False", ", inplace=", c.inplace ? "True" : "False",
                 ", no_combine=", c.no_combine ? "True" : "False", ", routed_scaling_factor=",
                 opt(c.routed_scaling_factor), ")");
}

}  // namespace

void bind_runner(py::module_& m) {
  py::class_<MoeRunnerConfig>(m, "MoeRunnerConfig",
                              "sglang's MoeRunnerConfig (moe_runner/base.py).")
      .def(py::init([](std::optional<int64_t> num_experts, std::optional<int64_t> num_local_experts,
                       std::optional<int64_t> hidden_size,
                       std::optional<int64_t> intermediate_size_per_partition,
                       std::optional<int64_t> layer_id, std::optional<int64_t> top_k,
                       std::optional<int64_t> num_fused_shared_experts, py::object params_dtype,
                       std::string activation, bool is_gated, bool apply_router_weight_on_input,
                       bool inplace, bool no_combine, std::optional<float> routed_scaling_factor,
                       std::optional<float> gemm1_alpha, std::optional<float> gemm1_clamp_limit,
                       std::optional<float> gemm1_beta, std::optional<float> swiglu_limit,
                       bool gate_up_interleaved, bool force_unfused, py::object isa_level,
                       py::object custom_act_fn, std::optional<int64_t> routing_method_type,
                       bool use_tp_all_gather_activation, std::optional<bool> amx_float_tiles,
                       bool prepack_weight_tiles) {
             if (!custom_act_fn.is_none())
               MOECORE_UNSUPPORTED("MoeRunnerConfig: custom_act_fn (a Python activation) cannot "
                                   "run inside moecore's C++ runners; use a named activation");
             MoeRunnerConfig c;
             c.num_experts = num_experts;
             c.num_local_experts = num_local_experts;
             c.hidden_size = hidden_size;
             c.intermediate_size_per_partition = intermediate_size_per_partition;
             c.layer_id = layer_id;
             c.top_k = top_k;
             c.num_fused_shared_experts = num_fused_shared_experts;
             c.params_dtype = to_dtype(params_dtype);
             c.activation = std::move(activation);
             c.is_gated = is_gated;
             c.apply_router_weight_on_input = apply_router_weight_on_input;
             c.inplace = inplace;
             c.no_combine = no_combine;
             c.routed_scaling_factor = routed_scaling_factor;
             c.gemm1_alpha = gemm1_alpha;
             c.gemm1_clamp_limit = gemm1_clamp_limit;
             c.gemm1_beta = gemm1_beta;
             c.swiglu_limit = swiglu_limit;
             c.gate_up_interleaved = gate_up_interleaved;
             c.force_unfused = force_unfused;
             c.routing_method_type = routing_method_type;
             c.use_tp_all_gather_activation = use_tp_all_gather_activation;
             c.amx_float_tiles = amx_float_tiles;
             c.prepack_weight_tiles = prepack_weight_tiles;
             if (!isa_level.is_none()) {
               MOECORE_CHECK_DTYPE(py::isinstance<py::str>(isa_level),
                                   "MoeRunnerConfig: isa_level must be a string like 'avx512', got ",
                                   type_name(isa_level));
               c.isa_level = parse_isa_level(isa_level.cast<std::string>());
             }
             return c;
           }),
           py::kw_only(), "num_experts"_a = py::none(), "num_local_experts"_a = py::none(),
           "hidden_size"_a = py::none(), "intermediate_size_per_partition"_a = py::none(),
           "layer_id"_a = py::none(), "top_k"_a = py::none(),
           "num_fused_shared_experts"_a = py::none(), "params_dtype"_a = py::none(),
           "activation"_a = "silu", "is_gated"_a = true, "apply_router_weight_on_input"_a = false,
           "inplace"_a = true, "no_combine"_a = false, "routed_scaling_factor"_a = py::none(),
           "gemm1_alpha"_a = py::none(), "gemm1_clamp_limit"_a = py::none(),
           "gemm1_beta"_a = py::none(), "swiglu_limit"_a = py::none(),
           "gate_up_interleaved"_a = false, "force_unfused"_a = false, "isa_level"_a = py::none(),
           "custom_act_fn"_a = py::none(), "routing_method_type"_a = py::none(),
           "use_tp_all_gather_activation"_a = false, "amx_float_tiles"_a = py::none(),
           "prepack_weight_tiles"_a = true)
      .def_readwrite("num_experts", &MoeRunnerConfig::num_experts)
      .def_readwrite("num_local_experts", &MoeRunnerConfig::num_local_experts)
      .def_readwrite("hidden_size", &MoeRunnerConfig::hidden_size)
      .def_readwrite("intermediate_size_per_partition",
                     &MoeRunnerConfig::intermediate_size_per_partition)
      .def_readwrite("layer_id", &MoeRunnerConfig::layer_id)
      .def_readwrite("top_k", &MoeRunnerConfig::top_k)
      .def_readwrite("num_fused_shared_experts", &MoeRunnerConfig::num_fused_shared_experts)
      .def_property(
          "params_dtype",
          [](const MoeRunnerConfig& c) -> py::object {
            if (!c.params_dtype) return py::none();
            return py::str(dtype_name(*c.params_dtype));
          },
          [](MoeRunnerConfig& c, py::object d) { c.params_dtype = to_dtype(d); })
      .def_readwrite("activation", &MoeRunnerConfig::activation)
      .def_readwrite("is_gated", &MoeRunnerConfig::is_gated)
      .def_readwrite("apply_router_weight_on_input", &MoeRunnerConfig::apply_router_weight_on_input)
      .def_readwrite("inplace", &MoeRunnerConfig::inplace)
      .def_readwrite("no_combine", &MoeRunnerConfig::no_combine)
      .def_readwrite("routed_scaling_factor", &MoeRunnerConfig::routed_scaling_factor)
      .def_readwrite("gemm1_alpha", &MoeRunnerConfig::gemm1_alpha)
      .def_readwrite("gemm1_clamp_limit", &MoeRunnerConfig::gemm1_clamp_limit)
      .def_readwrite("gemm1_beta", &MoeRunnerConfig::gemm1_beta)
      .def_readwrite("swiglu_limit", &MoeRunnerConfig::swiglu_limit)
      .def_readwrite("gate_up_interleaved", &MoeRunnerConfig::gate_up_interleaved)
      .def_readwrite("force_unfused", &MoeRunnerConfig::force_unfused)
      .def_readwrite("routing_method_type", &MoeRunnerConfig::routing_method_type)
      .def_readwrite("use_tp_all_gather_activation", &MoeRunnerConfig::use_tp_all_gather_activation)
      .def_readwrite("amx_float_tiles", &MoeRunnerConfig::amx_float_tiles,
                     "moecore: AMX tiles for bf16-exact float operands at the amx level (None: "
                     "MOECORE_AMX_FLOAT_TILES, resolved when a MoeRunner is built)")
      .def_readwrite("prepack_weight_tiles", &MoeRunnerConfig::prepack_weight_tiles,
                     "moecore: process_weights_after_loading prepacks the weights in weight tiles "
                     "when the kernel row streams them (doubles the weights' memory)")
      .def_property_readonly(
          "gemm_kernel",
          [](const MoeRunnerConfig& c) {
            return std::string(scaled_gemm_kernel_name(c.gemm_kernel()));
          },
          "moecore: the scaled-GEMM kernel row backends build with under this config")
      .def_property_readonly("custom_act_fn", [](const MoeRunnerConfig&) { return py::none(); })
      .def_property_readonly("isa_level",
                             [](const MoeRunnerConfig& c) -> py::object {
                               if (!c.isa_level) return py::none();
                               return py::str(isa_level_name(*c.isa_level));
                             })
      .def("__repr__", &config_repr);

  py::class_<MoeRunner, std::shared_ptr<MoeRunner>>(
      m, "MoeRunner",
      "MoeRunner(runner_backend, config): resolves the fused func or the permute path now; "
      "run(dispatch_output, quant_info) returns a CombineInput.")
      .def(py::init([](py::object backend, const MoeRunnerConfig& config, py::object a2a,
                       bool lora_enabled) {
             std::optional<MoeA2ABackend> a2a_backend;
             if (!a2a.is_none()) a2a_backend = to_enum<MoeA2ABackend>(a2a);
             return std::make_shared<MoeRunner>(to_enum<MoeRunnerBackend>(backend), config,
                                                a2a_backend, lora_enabled);
           }),
           "runner_backend"_a, "config"_a, py::kw_only(), "a2a_backend"_a = py::none(),
           "lora_enabled"_a = false)
      .def("run", [](MoeRunner& r, py::object dispatch_output, py::object quant_info,
                     py::object lora_info) {
        MOECORE_CHECK(lora_info.is_none(), "MoeRunner.run: lora_info is not supported");
        DispatchOutputPtr d = to_dispatch_output(dispatch_output);
        QuantInfoPtr q = to_quant_info(quant_info);
        CombineInputPtr out;
        {
          py::gil_scoped_release release;
          out = r.run(d, q);
        }
        return from_combine_input(out);
      }, "dispatch_output"_a, "quant_info"_a, "lora_info"_a = py::none())
      .def("prepare", [](const MoeRunner& r, py::object dispatch_output, py::object quant_info) {
        DispatchOutputPtr d = to_dispatch_output(dispatch_output);
        QuantInfoPtr q = to_quant_info(quant_info);
        py::gil_scoped_release release;
        return r.prepare(d, q);
      }, "dispatch_output"_a, "quant_info"_a,
      "Captures this runner's path for the dispatch output's shapes: the returned PreparedRun's "
      "run() reads the dispatch output's arrays in place and rewrites its combine_input's arrays "
      "— what run() would return for the arrays' contents then, bit for bit — with no "
      "allocation. Raises Unsupported for a path that cannot be captured.")
      .def("set_overlap_args", [](MoeRunner& r, py::object down, py::object meta) {
        r.set_overlap_args(down.is_none() ? std::any() : std::any(hold(down)),
                           meta.is_none() ? std::any() : std::any(hold(meta)));
      }, "down_gemm_overlap_args"_a, "meta_overlap_args"_a)
      .def("clear_overlap_args", &MoeRunner::clear_overlap_args)
      .def_property_readonly("down_gemm_overlap_args", [](const MoeRunner& r) -> py::object {
        auto* h = std::any_cast<PyHolder>(&r.down_gemm_overlap_args());
        return h ? **h : py::none();
      })
      .def_property_readonly("meta_overlap_args", [](const MoeRunner& r) -> py::object {
        auto* h = std::any_cast<PyHolder>(&r.meta_overlap_args());
        return h ? **h : py::none();
      })
      .def_property_readonly("runner_backend", [](const MoeRunner& r) { return from_enum(r.runner_backend()); })
      .def_property_readonly("a2a_backend", [](const MoeRunner& r) { return from_enum(r.a2a_backend()); })
      .def_property_readonly("config", &MoeRunner::config)
      .def_property_readonly("uses_fused_func", &MoeRunner::uses_fused_func)
      .def_property_readonly("has_runner_core", [](const MoeRunner& r) { return r.runner_core() != nullptr; });

  m.def("register_fused_func", [](py::object a2a, py::object runner, py::object fn) {
    const auto a = to_enum<MoeA2ABackend>(a2a);
    const auto r = to_enum<MoeRunnerBackend>(runner);
    return register_or_decorate(fn, [a, r](py::object f) {
      register_fused_func(a, r, wrap_fused_func(f), origin_of(f));
    });
  }, "a2a_backend_name"_a, "runner_backend_name"_a, "fn"_a = py::none(),
     "Registers fn(dispatch_output, quant_info, runner_config) -> CombineInput for (a2a, "
     "runner); without fn it returns a decorator.");
  m.def("register_pre_permute", [](py::object fmt, py::object runner, py::object fn) {
    const auto d = to_enum<DispatchOutputFormat>(fmt);
    const auto r = to_enum<MoeRunnerBackend>(runner);
    return register_or_decorate(fn, [d, r](py::object f) {
      register_pre_permute(d, r, wrap_pre_permute(f, r), origin_of(f));
    });
  }, "dispatch_output_name"_a, "runner_backend_name"_a, "fn"_a = py::none());
  m.def("register_post_permute", [](py::object runner, py::object fmt, py::object fn) {
    const auto r = to_enum<MoeRunnerBackend>(runner);
    const auto c = to_enum<DispatchOutputFormat>(fmt);
    return register_or_decorate(fn, [r, c](py::object f) {
      register_post_permute(r, c, wrap_post_permute(f), origin_of(f));
    });
  }, "runner_backend_name"_a, "combine_input_name"_a, "fn"_a = py::none());
  m.def("register_runner_core", [](py::object runner, py::object factory) {
    const auto r = to_enum<MoeRunnerBackend>(runner);
    return register_or_decorate(factory, [r](py::object f) {
      register_runner_core(r, wrap_core_factory(f, r), origin_of(f));
    });
  }, "runner_backend_name"_a, "factory"_a = py::none(),
     "Registers factory(config) -> core with run(runner_input, quant_info, running_state).");
  m.def("unregister_fused_func", [](py::object a2a, py::object runner) {
    return unregister_fused_func(to_enum<MoeA2ABackend>(a2a), to_enum<MoeRunnerBackend>(runner));
  });
  m.def("unregister_pre_permute", [](py::object fmt, py::object runner) {
    return unregister_pre_permute(to_enum<DispatchOutputFormat>(fmt), to_enum<MoeRunnerBackend>(runner));
  });
  m.def("unregister_post_permute", [](py::object runner, py::object fmt) {
    return unregister_post_permute(to_enum<MoeRunnerBackend>(runner), to_enum<DispatchOutputFormat>(fmt));
  });
  m.def("unregister_runner_core", [](py::object runner) {
    return unregister_runner_core(to_enum<MoeRunnerBackend>(runner));
  });
  m.def("get_fused_func", [](py::object a2a, py::object runner) -> py::object {
    auto fn = find_fused_func(to_enum<MoeA2ABackend>(a2a), to_enum<MoeRunnerBackend>(runner));
    if (!fn) return py::none();
    // Callable like sglang's: fn(dispatch_output, quant_info, runner_config) -> CombineInput.
    return py::cpp_function([f = *fn](py::object d, py::object q, const MoeRunnerConfig& c) {
      DispatchOutputPtr dp = to_dispatch_output(d);
      QuantInfoPtr qp = to_quant_info(q);
      CombineInputPtr out;
      {
        py::gil_scoped_release release;
        out = f(dp, qp, c);
      }
      return from_combine_input(out);
    });
  }, "a2a_backend_name"_a, "runner_backend_name"_a,
     "The fused func registered for (a2a, runner) as a callable, or None.");

  m.def("registered_fused_funcs", [] {
    py::list out;
    for (const auto& [k, origin] : registered_fused_funcs())
      out.append(py::make_tuple(to_string(k.first), to_string(k.second), origin));
    return out;
  }, "[(a2a, runner, origin)] for every registered fused func.");
  m.def("registered_pre_permutes", [] {
    py::list out;
    for (const auto& [k, origin] : registered_pre_permutes())
      out.append(py::make_tuple(to_string(k.first), to_string(k.second), origin));
    return out;
  }, "[(dispatch_format, runner, origin)].");
  m.def("registered_post_permutes", [] {
    py::list out;
    for (const auto& [k, origin] : registered_post_permutes())
      out.append(py::make_tuple(to_string(k.first), to_string(k.second), origin));
    return out;
  }, "[(runner, combine_format, origin)].");
  m.def("registered_runner_cores", [] {
    py::list out;
    for (const auto& [k, origin] : registered_runner_cores())
      out.append(py::make_tuple(to_string(k), origin));
    return out;
  }, "[(runner, origin)].");
  m.def("registration_errors", [] { return registration_errors(); });
}

}  // namespace moecore::bindings
