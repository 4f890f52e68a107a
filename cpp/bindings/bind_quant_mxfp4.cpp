// Bindings of the mxfp4 quant methods: being written.
#include "bind_all.h"

namespace moecore::bindings {

void bind_quant_mxfp4(py::module_& m) {}

}  // namespace moecore::bindings
