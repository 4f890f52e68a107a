// The bind_<area> functions module.cpp calls, in order.
#pragma once

#include "convert.h"

namespace moecore::bindings {

using namespace pybind11::literals;

void bind_errors(py::module_& m);
void bind_core(py::module_& m);
void bind_formats(py::module_& m);
void bind_routing(py::module_& m);
void bind_dispatch(py::module_& m);
void bind_dispatch_ep_outputs(py::module_& m);
void bind_ep_dispatchers(py::module_& m);
void bind_quant(py::module_& m);
void bind_quant_fp8(py::module_& m);
void bind_quant_nvfp4(py::module_& m);
void bind_quant_mxfp4(py::module_& m);
void bind_runner(py::module_& m);
void bind_layer(py::module_& m);
void bind_capture(py::module_& m);
void bind_bench(py::module_& m);

}  // namespace moecore::bindings
