// Bindings of the nvfp4 quant methods: being written.
#include "bind_all.h"

namespace moecore::bindings {

void bind_quant_nvfp4(py::module_& m) {}

}  // namespace moecore::bindings
