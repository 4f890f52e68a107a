// The private extension module moecore._moecore. The public API is python/moecore/__init__.py.
#include "bind_all.h"

PYBIND11_MODULE(_moecore, m) {
  using namespace moecore::bindings;
  m.doc() = "moecore's C++ core (private; import moecore instead)";
  bind_errors(m);
  bind_core(m);
  bind_formats(m);
  bind_routing(m);
  bind_dispatch(m);
  bind_dispatch_ep_outputs(m);
  bind_ep_dispatchers(m);
  bind_quant(m);
  bind_quant_fp8(m);
  bind_quant_nvfp4(m);
  bind_quant_mxfp4(m);
  bind_runner(m);
  bind_layer(m);
  bind_capture(m);
  bind_bench(m);
}
