// Bindings of the fp8 quant methods: being written.
#include "bind_all.h"

namespace moecore::bindings {

void bind_quant_fp8(py::module_& m) {}

}  // namespace moecore::bindings
