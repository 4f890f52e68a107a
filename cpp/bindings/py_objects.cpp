// Adapters between Python objects/callables and the C++ runner interfaces.
#include "py_objects.h"

namespace moecore::bindings {
namespace {

template <typename Enum>
Enum format_attr(py::handle obj, const char* what) {
  MOECORE_CHECK_DTYPE(py::hasattr(obj, "format"), what, ": a Python object needs a 'format' "
                      "attribute naming its ", EnumInfo<Enum>::class_name());
  return to_enum<Enum>(obj.attr("format"));
}

py::object any_to_py(const std::any& a) {
  if (!a.has_value()) return py::none();
  if (auto* h = std::any_cast<PyHolder>(&a)) return **h;
  return py::none();
}

}  // namespace

TopKOutput to_topk_output(py::handle obj) {
  if (py::isinstance<StandardTopKOutput>(obj)) return obj.cast<StandardTopKOutput>();
  if (py::isinstance<BypassedTopKOutput>(obj)) return obj.cast<BypassedTopKOutput>();
  MOECORE_THROW(DTypeError, "topk_output: expected a StandardTopKOutput or BypassedTopKOutput, got ",
                type_name(obj));
}

py::object from_topk_output(const TopKOutput& t) {
  if (auto* s = std::get_if<StandardTopKOutput>(&t)) return py::cast(*s);
  return py::cast(std::get<BypassedTopKOutput>(t));
}

DispatchOutputPtr to_dispatch_output(py::handle obj) {
  MOECORE_CHECK(!obj.is_none(), "dispatch_output: expected a dispatch output, got None");
  if (py::isinstance<DispatchOutput>(obj)) return obj.cast<DispatchOutputPtr>();
  auto p = std::make_shared<PyDispatchOutput>();
  p->fmt = format_attr<DispatchOutputFormat>(obj, "dispatch_output");
  p->obj = hold(py::reinterpret_borrow<py::object>(obj));
  return p;
}

CombineInputPtr to_combine_input(py::handle obj) {
  if (py::isinstance<CombineInput>(obj)) return obj.cast<CombineInputPtr>();
  auto p = std::make_shared<PyCombineInput>();
  p->fmt = format_attr<DispatchOutputFormat>(obj, "combine_input");
  p->obj = hold(py::reinterpret_borrow<py::object>(obj));
  return p;
}

QuantInfoPtr to_quant_info(py::handle obj) {
  if (py::isinstance<MoeQuantInfo>(obj)) return obj.cast<QuantInfoPtr>();
  MOECORE_CHECK(!obj.is_none(), "quant_info: expected a QuantInfo, got None");
  auto p = std::make_shared<PyQuantInfo>();
  p->obj = hold(py::reinterpret_borrow<py::object>(obj));
  return p;
}

py::object from_dispatch_output(const DispatchOutputPtr& p) {
  if (auto* w = dynamic_cast<PyDispatchOutput*>(p.get())) return *w->obj;
  return py::cast(p);
}
py::object from_combine_input(const CombineInputPtr& p) {
  if (auto* w = dynamic_cast<PyCombineInput*>(p.get())) return *w->obj;
  return py::cast(p);
}
py::object from_quant_info(const QuantInfoPtr& p) {
  if (auto* w = dynamic_cast<PyQuantInfo*>(p.get())) return *w->obj;
  return py::cast(p);
}

py::dict running_state_dict(RunningState& state) {
  if (auto* h = std::any_cast<PyHolder>(&state.binding)) return py::reinterpret_borrow<py::dict>(**h);
  py::dict d;
  if (state.down_gemm_overlap_args.has_value())
    d["down_gemm_overlap_args"] = any_to_py(state.down_gemm_overlap_args);
  if (state.meta_overlap_args.has_value())
    d["meta_overlap_args"] = any_to_py(state.meta_overlap_args);
  state.binding = hold(d);
  return d;
}

FusedFunc wrap_fused_func(py::object fn) {
  PyHolder f = hold(std::move(fn));
  return [f](const DispatchOutputPtr& d, const QuantInfoPtr& q,
             const MoeRunnerConfig& config) -> CombineInputPtr {
    py::gil_scoped_acquire gil;
    py::object out = (*f)(from_dispatch_output(d), from_quant_info(q), config);
    return to_combine_input(out);
  };
}

PrePermuteFn wrap_pre_permute(py::object fn, MoeRunnerBackend backend) {
  PyHolder f = hold(std::move(fn));
  return [f, backend](const DispatchOutputPtr& d, const QuantInfoPtr& q,
                      const MoeRunnerConfig& config, RunningState& state) -> RunnerInputPtr {
    py::gil_scoped_acquire gil;
    py::object out = (*f)(from_dispatch_output(d), from_quant_info(q), config,
                          running_state_dict(state));
    auto p = std::make_shared<PyRunnerInput>();
    p->obj = hold(out);
    p->backend = backend;
    return p;
  };
}

PostPermuteFn wrap_post_permute(py::object fn) {
  PyHolder f = hold(std::move(fn));
  return [f](const RunnerOutputPtr& o, const QuantInfoPtr& q, const MoeRunnerConfig& config,
             RunningState& state) -> CombineInputPtr {
    py::gil_scoped_acquire gil;
    auto* w = dynamic_cast<PyRunnerOutput*>(o.get());
    MOECORE_CHECK_DTYPE(w != nullptr, "a Python post-permute needs a Python runner core's output");
    py::object out = (*f)(*w->obj, from_quant_info(q), config, running_state_dict(state));
    return to_combine_input(out);
  };
}

namespace {
class PyRunnerCore : public RunnerCore {
 public:
  PyRunnerCore(const MoeRunnerConfig& config, PyHolder core, MoeRunnerBackend backend)
      : RunnerCore(config), core_(std::move(core)), backend_(backend) {}
  MoeRunnerBackend runner_backend() const override { return backend_; }
  RunnerOutputPtr run(const RunnerInputPtr& in, const QuantInfoPtr& q,
                      RunningState& state) override {
    py::gil_scoped_acquire gil;
    auto* w = dynamic_cast<PyRunnerInput*>(in.get());
    MOECORE_CHECK_DTYPE(w != nullptr, "a Python runner core needs a Python pre-permute's input");
    py::object out = core_->attr("run")(*w->obj, from_quant_info(q), running_state_dict(state));
    auto p = std::make_shared<PyRunnerOutput>();
    p->obj = hold(out);
    p->backend = backend_;
    return p;
  }

 private:
  PyHolder core_;
  MoeRunnerBackend backend_;
};
}  // namespace

CoreFactory wrap_core_factory(py::object factory, MoeRunnerBackend backend) {
  PyHolder f = hold(std::move(factory));
  return [f, backend](const MoeRunnerConfig& config) -> std::unique_ptr<RunnerCore> {
    py::gil_scoped_acquire gil;
    py::object core = (*f)(config);
    MOECORE_CHECK_DTYPE(py::hasattr(core, "run"),
                        "a runner core factory must return an object with run(runner_input, "
                        "quant_info, running_state)");
    return std::make_unique<PyRunnerCore>(config, hold(core), backend);
  };
}

}  // namespace moecore::bindings
