// Dispatch bindings: DispatchOutput/CombineInput bases, the standard forms, StandardDispatcher.
#include "bind_all.h"
#include "moecore/dispatch/deepep.h"
#include "moecore/dispatch/dispatcher.h"
#include "moecore/dispatch/flashinfer.h"
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

/// BaseDispatcher's interface on a dispatcher class: dispatch / combine (the GIL released while
/// the ranks exchange data), the quant config and the overlap args.
template <typename D>
py::class_<D, std::shared_ptr<D>> def_dispatcher_interface(py::class_<D, std::shared_ptr<D>> cls) {
  const std::string what = std::string(py::str(cls.attr("__name__"))) + ".dispatch: hidden_states";
  cls.def("dispatch", [what](D& d, py::object hidden, py::object topk) {
        Tensor h = to_required_tensor(hidden, what.c_str());
        TopKOutput t = to_topk_output(topk);
        DispatchOutputPtr out;
        {
          py::gil_scoped_release release;
          out = d.dispatch(h, t);
        }
        return from_dispatch_output(out);
      }, "hidden_states"_a, "topk_output"_a)
      .def("combine", [](D& d, py::object combine_input) {
        CombineInputPtr c = to_combine_input(combine_input);
        Tensor out;
        {
          py::gil_scoped_release release;
          out = d.combine(c);
        }
        return to_numpy(out);
      }, "combine_input"_a)
      .def("set_quant_config", [](D& d, py::dict c) { d.set_quant_config(to_quant_config(c)); }, "quant_config"_a)
      .def_property_readonly("quant_config", [](const D& d) { return from_quant_config(d.quant_config()); })
      .def("set_overlap_args", [](D& d, py::object combine, py::object meta) {
        d.set_overlap_args(hold(combine), hold(meta));
      }, "combine_overlap_args"_a, "meta_overlap_args"_a)
      .def("clear_overlap_args", &D::clear_overlap_args);
  return cls;
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

  def_dispatcher_interface(py::class_<StandardDispatcher, std::shared_ptr<StandardDispatcher>>(
      m, "StandardDispatcher",
      "Dispatcher for a2a 'none'. With ep_size > 1 it maps global expert ids to this rank's "
      "local ids (others → -1; -1 stays -1)."))
      .def(py::init([](int64_t num_experts, int64_t ep_size, int64_t ep_rank,
                       int64_t num_fused_shared_experts, py::object runner_backend) {
             return std::make_shared<StandardDispatcher>(
                 num_experts, ep_size, ep_rank, num_fused_shared_experts,
                 runner_backend.is_none() ? MoeRunnerBackend::TRITON
                                          : to_enum<MoeRunnerBackend>(runner_backend));
           }),
           "num_experts"_a, py::kw_only(), "ep_size"_a = 1, "ep_rank"_a = 0,
           "num_fused_shared_experts"_a = 0, "runner_backend"_a = py::none())
      .def_property_readonly("local_expert_mapping", [](const StandardDispatcher& d) { return to_numpy(d.local_expert_mapping()); })
      .def_property_readonly("num_local_experts", &StandardDispatcher::num_local_experts)
      .def_property_readonly("ep_size", &StandardDispatcher::ep_size)
      .def_property_readonly("ep_rank", &StandardDispatcher::ep_rank)
;
}

}  // namespace moecore::bindings

// ---------------------------------------------------------------------------------------------
// ep-paths block: Python construction and fields of the DeepEP / FlashInfer dispatch outputs
// and combine inputs (dispatch/types.h), so harnesses can hand-build them for the runner paths.

namespace moecore::bindings {
namespace {

/// A combine input that carries expert outputs with the routing combine needs.
template <typename C>
void bind_routed_combine(py::module_& m, const char* name, const char* doc) {
  py::class_<C, CombineInput, std::shared_ptr<C>>(m, name, doc)
      .def(py::init([name](py::object hidden, py::object ids, py::object weights) {
             auto c = std::make_shared<C>();
             c->hidden_states = to_required_tensor(hidden, name);
             c->topk_ids = to_required_tensor(ids, name);
             c->topk_weights = to_required_tensor(weights, name);
             return c;
           }),
           "hidden_states"_a, "topk_ids"_a, "topk_weights"_a)
      .def_property_readonly("hidden_states", [](const C& c) { return to_numpy(c.hidden_states); })
      .def_property_readonly("topk_ids", [](const C& c) { return to_numpy(c.topk_ids); })
      .def_property_readonly("topk_weights", [](const C& c) { return to_numpy(c.topk_weights); });
}

}  // namespace

void bind_dispatch_ep_outputs(py::module_& m) {
  auto tensor = [](py::object o, const char* what) { return to_tensor(o, what); };
  auto required = [](py::object o, const char* what) { return to_required_tensor(o, what); };

  py::class_<DeepEPNormalDispatchOutput, DispatchOutput, std::shared_ptr<DeepEPNormalDispatchOutput>>(
      m, "DeepEPNormalDispatchOutput",
      "DeepEPNormalDispatchOutput(hidden_states [N_recv, H] bf16 or e4m3, hidden_states_scale "
      "(f32 [N_recv, H/128] or int32-packed UE8M0 [N_recv, H/512]) or None, topk_ids [N_recv, k] "
      "local ids (-1: not on this rank), topk_weights f32 [N_recv, k], "
      "num_recv_tokens_per_expert list[int]).")
      .def(py::init([=](py::object hidden, py::object scale, py::object ids, py::object weights,
                        std::vector<int64_t> num_recv) {
             auto d = std::make_shared<DeepEPNormalDispatchOutput>();
             d->hidden_states = required(hidden, "DeepEPNormalDispatchOutput.hidden_states");
             d->hidden_states_scale = tensor(scale, "DeepEPNormalDispatchOutput.hidden_states_scale");
             d->topk_ids = required(ids, "DeepEPNormalDispatchOutput.topk_ids");
             d->topk_weights = required(weights, "DeepEPNormalDispatchOutput.topk_weights");
             d->num_recv_tokens_per_expert = std::move(num_recv);
             return d;
           }),
           "hidden_states"_a, "hidden_states_scale"_a, "topk_ids"_a, "topk_weights"_a,
           "num_recv_tokens_per_expert"_a)
      .def_property_readonly("hidden_states", [](const DeepEPNormalDispatchOutput& d) { return to_numpy(d.hidden_states); })
      .def_property_readonly("hidden_states_scale", [](const DeepEPNormalDispatchOutput& d) { return to_numpy(d.hidden_states_scale); })
      .def_property_readonly("topk_ids", [](const DeepEPNormalDispatchOutput& d) { return to_numpy(d.topk_ids); })
      .def_property_readonly("topk_weights", [](const DeepEPNormalDispatchOutput& d) { return to_numpy(d.topk_weights); })
      .def_readonly("num_recv_tokens_per_expert", &DeepEPNormalDispatchOutput::num_recv_tokens_per_expert);

  py::class_<DeepEPLLDispatchOutput, DispatchOutput, std::shared_ptr<DeepEPLLDispatchOutput>>(
      m, "DeepEPLLDispatchOutput",
      "DeepEPLLDispatchOutput(hidden_states [E_local, M_cap, H] (bf16; e4m3 with f32 or "
      "int32-packed UE8M0 scales; packed NVFP4 u8 [.., H/2] with e4m3 scales [.., H/16]), "
      "hidden_states_scale or None, topk_ids, topk_weights (the rank's own [T, k] routing), "
      "masked_m int32 [E_local], expected_m). Only the first masked_m[e] rows of expert e count.")
      .def(py::init([=](py::object hidden, py::object scale, py::object ids, py::object weights,
                        py::object masked_m, int64_t expected_m) {
             auto d = std::make_shared<DeepEPLLDispatchOutput>();
             d->hidden_states = required(hidden, "DeepEPLLDispatchOutput.hidden_states");
             d->hidden_states_scale = tensor(scale, "DeepEPLLDispatchOutput.hidden_states_scale");
             d->topk_ids = required(ids, "DeepEPLLDispatchOutput.topk_ids");
             d->topk_weights = required(weights, "DeepEPLLDispatchOutput.topk_weights");
             d->masked_m = required(masked_m, "DeepEPLLDispatchOutput.masked_m");
             d->expected_m = expected_m;
             return d;
           }),
           "hidden_states"_a, "hidden_states_scale"_a, "topk_ids"_a, "topk_weights"_a,
           "masked_m"_a, "expected_m"_a)
      .def_property_readonly("hidden_states", [](const DeepEPLLDispatchOutput& d) { return to_numpy(d.hidden_states); })
      .def_property_readonly("hidden_states_scale", [](const DeepEPLLDispatchOutput& d) { return to_numpy(d.hidden_states_scale); })
      .def_property_readonly("topk_ids", [](const DeepEPLLDispatchOutput& d) { return to_numpy(d.topk_ids); })
      .def_property_readonly("topk_weights", [](const DeepEPLLDispatchOutput& d) { return to_numpy(d.topk_weights); })
      .def_property_readonly("masked_m", [](const DeepEPLLDispatchOutput& d) { return to_numpy(d.masked_m); })
      .def_readonly("expected_m", &DeepEPLLDispatchOutput::expected_m);

  py::class_<FlashinferDispatchOutput, DispatchOutput, std::shared_ptr<FlashinferDispatchOutput>>(
      m, "FlashinferDispatchOutput",
      "FlashinferDispatchOutput(hidden_states [T, H] bf16 or packed NVFP4 u8 [T, H/2], "
      "hidden_states_scale (linear e4m3 [T, H/16]) or None, topk_output, moe_output=None "
      "([T, H] buffer the fused func writes), output_dtype=None).")
      .def(py::init([=](py::object hidden, py::object scale, py::object topk, py::object moe_output,
                        py::object output_dtype) {
             auto d = std::make_shared<FlashinferDispatchOutput>();
             d->hidden_states = required(hidden, "FlashinferDispatchOutput.hidden_states");
             d->hidden_states_scale = tensor(scale, "FlashinferDispatchOutput.hidden_states_scale");
             d->topk_output = to_topk_output(topk);
             d->moe_output = tensor(moe_output, "FlashinferDispatchOutput.moe_output");
             d->output_dtype = to_dtype(output_dtype);
             return d;
           }),
           "hidden_states"_a, "hidden_states_scale"_a, "topk_output"_a,
           "moe_output"_a = py::none(), "output_dtype"_a = py::none())
      .def_property_readonly("hidden_states", [](const FlashinferDispatchOutput& d) { return to_numpy(d.hidden_states); })
      .def_property_readonly("hidden_states_scale", [](const FlashinferDispatchOutput& d) { return to_numpy(d.hidden_states_scale); })
      .def_property_readonly("topk_output", [](const FlashinferDispatchOutput& d) { return from_topk_output(d.topk_output); })
      .def_property_readonly("moe_output", [](const FlashinferDispatchOutput& d) { return to_numpy(d.moe_output); });

  bind_routed_combine<DeepEPNormalCombineInput>(
      m, "DeepEPNormalCombineInput",
      "DeepEPNormalCombineInput(hidden_states [N_recv, k, H] unweighted per-slot expert outputs, "
      "topk_ids, topk_weights).");
  bind_routed_combine<DeepEPLLCombineInput>(
      m, "DeepEPLLCombineInput",
      "DeepEPLLCombineInput(hidden_states [E_local, M_cap, H] unweighted, topk_ids, "
      "topk_weights).");

  py::class_<FlashinferCombineInput, CombineInput, std::shared_ptr<FlashinferCombineInput>>(
      m, "FlashinferCombineInput", "FlashinferCombineInput(hidden_states [T, H])")
      .def(py::init([=](py::object hidden) {
             return std::make_shared<FlashinferCombineInput>(
                 required(hidden, "FlashinferCombineInput.hidden_states"));
           }),
           "hidden_states"_a)
      .def_property_readonly("hidden_states", [](const FlashinferCombineInput& c) { return to_numpy(c.hidden_states); });
}

void bind_ep_dispatchers(py::module_& m) {
  py::class_<Transport, TransportPtr>(
      m, "Transport", "One rank's view of an expert-parallel group (used by the dispatchers).")
      .def_property_readonly("rank", &Transport::rank)
      .def_property_readonly("size", &Transport::size);
  py::class_<LoopbackGroup, std::shared_ptr<LoopbackGroup>>(
      m, "LoopbackGroup",
      "R in-process ranks sharing one rendezvous. Call each rank's collectives from its own "
      "thread; a rank that fails poisons the group so the others raise instead of waiting.")
      .def(py::init(&LoopbackGroup::create), "size"_a)
      .def_property_readonly("size", &LoopbackGroup::size)
      .def("transport", &LoopbackGroup::transport, "rank"_a)
      .def("poison", &LoopbackGroup::poison, "failed_rank"_a, "what"_a);

  auto dispatch_b = [](DeepEPDispatcher& d) {
    DispatchOutputPtr out;
    {
      py::gil_scoped_release release;
      out = d.dispatch_b();
    }
    return from_dispatch_output(out);
  };
  def_dispatcher_interface(py::class_<DeepEPDispatcher, std::shared_ptr<DeepEPDispatcher>>(
      m, "DeepEPDispatcher",
      "DeepEP's normal / low-latency dispatcher over a Transport (a2a 'deepep'). Calls follow "
      "dispatch_a → dispatch_b → combine_a → combine_b; all ranks must call them together "
      "(each from its own thread). See README 'Expert parallelism'."))
      .def(py::init([](TransportPtr transport, int64_t num_experts, int64_t num_local_experts,
                       int64_t hidden_size, int64_t top_k, py::object mode,
                       int64_t num_max_dispatch_tokens_per_rank, py::object runner_backend,
                       bool round_scale, bool use_ue8m0, int64_t expert_alignment,
                       std::optional<float> routed_scaling_factor) {
             DeepEPConfig c;
             c.num_experts = num_experts;
             c.num_local_experts = num_local_experts;
             c.hidden_size = hidden_size;
             c.top_k = top_k;
             c.mode = to_optional_enum<DeepEPMode>(mode).value_or(DeepEPMode::AUTO);
             c.num_max_dispatch_tokens_per_rank = num_max_dispatch_tokens_per_rank;
             c.runner_backend = to_optional_enum<MoeRunnerBackend>(runner_backend)
                                    .value_or(MoeRunnerBackend::DEEP_GEMM);
             c.round_scale = round_scale;
             c.use_ue8m0 = use_ue8m0;
             c.expert_alignment = expert_alignment;
             c.routed_scaling_factor = routed_scaling_factor;
             return std::make_shared<DeepEPDispatcher>(std::move(transport), c);
           }),
           "transport"_a, py::kw_only(), "num_experts"_a, "num_local_experts"_a, "hidden_size"_a,
           "top_k"_a, "mode"_a = "auto", "num_max_dispatch_tokens_per_rank"_a = 128,
           "runner_backend"_a = "deep_gemm", "round_scale"_a = false, "use_ue8m0"_a = false,
           "expert_alignment"_a = 1, "routed_scaling_factor"_a = py::none())
      .def("dispatch_a", [](DeepEPDispatcher& d, py::object hidden, py::object topk) {
        Tensor h = to_required_tensor(hidden, "DeepEPDispatcher.dispatch_a: hidden_states");
        TopKOutput t = to_topk_output(topk);
        py::gil_scoped_release release;
        d.dispatch_a(h, t);
      }, "hidden_states"_a, "topk_output"_a)
      .def("dispatch_b", dispatch_b)
      .def("combine_a", [](DeepEPDispatcher& d, py::object combine_input) {
        CombineInputPtr c = to_combine_input(combine_input);
        py::gil_scoped_release release;
        d.combine_a(c);
      }, "combine_input"_a)
      .def("combine_b", [](DeepEPDispatcher& d) {
        Tensor out;
        {
          py::gil_scoped_release release;
          out = d.combine_b();
        }
        return to_numpy(out);
      })
      .def("set_is_extend_in_batch", &DeepEPDispatcher::set_is_extend_in_batch, "is_extend"_a)
      .def("resolve_payload", [](const DeepEPDispatcher& d) { return payload_name(d.resolve_payload()); },
           "The payload dtype the next dispatch sends: 'bf16', 'fp8' or 'nvfp4'.")
      .def_property_readonly("stage", [](const DeepEPDispatcher& d) { return deepep_stage_name(d.stage()); })
      .def_property_readonly("use_ue8m0", [](const DeepEPDispatcher& d) { return d.config().use_ue8m0; },
                             "FP8 payload scales as packed UE8M0 (int32, four E8M0 bytes a word).")
      .def_property_readonly("num_local_experts", &DeepEPDispatcher::num_local_experts)
      .def_property_readonly("max_rows_per_expert", &DeepEPDispatcher::max_rows_per_expert);

  def_dispatcher_interface(py::class_<FlashinferDispatcher, std::shared_ptr<FlashinferDispatcher>>(
      m, "FlashinferDispatcher",
      "FlashInfer's all-to-all dispatcher over a Transport (a2a 'flashinfer'); see README."))
      .def(py::init([](TransportPtr transport, int64_t num_experts, int64_t num_local_experts,
                       int64_t hidden_size, int64_t top_k, py::object runner_backend) {
             FlashinferDispatchConfig c{num_experts, num_local_experts, hidden_size, top_k,
                                        to_optional_enum<MoeRunnerBackend>(runner_backend)
                                            .value_or(MoeRunnerBackend::FLASHINFER_CUTLASS)};
             return std::make_shared<FlashinferDispatcher>(std::move(transport), c);
           }),
           "transport"_a, py::kw_only(), "num_experts"_a, "num_local_experts"_a, "hidden_size"_a,
           "top_k"_a, "runner_backend"_a = "flashinfer_cutlass")
      .def("resolve_payload", [](const FlashinferDispatcher& d) { return payload_name(d.resolve_payload()); })
      .def_property_readonly("invalid_expert_id", &FlashinferDispatcher::invalid_expert_id);
}

}  // namespace moecore::bindings
