// Python objects inside the C++ runner: harness-defined dispatch outputs, quant infos, runner
// inputs/outputs and combine inputs travel through C++ as these wrappers, and Python callables
// registered in the C++ registries are adapted here. C++-bound objects pass through unwrapped.
#pragma once

#include "convert.h"
#include "moecore/runner/registry.h"

namespace moecore::bindings {

struct PyDispatchOutput : DispatchOutput {
  PyHolder obj;
  DispatchOutputFormat fmt;
  DispatchOutputFormat format() const override { return fmt; }
};
struct PyCombineInput : CombineInput {
  PyHolder obj;
  CombineInputFormat fmt;
  CombineInputFormat format() const override { return fmt; }
};
struct PyQuantInfo : MoeQuantInfo {
  PyHolder obj;
  const char* name() const override { return "<Python quant info>"; }
  std::vector<Tensor> kernel_weights() const override { return {}; }  // read by Python only
};
struct PyRunnerInput : RunnerInput {
  PyHolder obj;
  MoeRunnerBackend backend;
  MoeRunnerBackend runner_backend() const override { return backend; }
};
struct PyRunnerOutput : RunnerOutput {
  PyHolder obj;
  MoeRunnerBackend backend;
  MoeRunnerBackend runner_backend() const override { return backend; }
};

/// StandardTopKOutput or BypassedTopKOutput from Python (DTypeError otherwise).
TopKOutput to_topk_output(py::handle obj);
py::object from_topk_output(const TopKOutput& topk);
DispatchOutputPtr to_dispatch_output(py::handle obj);
CombineInputPtr to_combine_input(py::handle obj);
QuantInfoPtr to_quant_info(py::handle obj);
py::object from_dispatch_output(const DispatchOutputPtr& p);
py::object from_combine_input(const CombineInputPtr& p);
py::object from_quant_info(const QuantInfoPtr& p);

FusedFunc wrap_fused_func(py::object fn);
PrePermuteFn wrap_pre_permute(py::object fn, MoeRunnerBackend backend);
PostPermuteFn wrap_post_permute(py::object fn);
CoreFactory wrap_core_factory(py::object factory, MoeRunnerBackend backend);
/// The Python dict a call's Python callables share (created on first use).
py::dict running_state_dict(RunningState& state);

}  // namespace moecore::bindings
