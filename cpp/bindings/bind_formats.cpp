// Format bindings (codecs, quantizers, layout transforms): being written.
#include "bind_all.h"

namespace moecore::bindings {

void bind_formats(py::module_& m) {}

}  // namespace moecore::bindings
