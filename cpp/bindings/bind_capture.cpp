// Capture and replay: MoeRunner.prepare's PreparedRun and the layer's CapturedForward.
#include "bind_all.h"
#include "moecore/layer/capture.h"
#include "py_objects.h"

namespace moecore::bindings {

void bind_capture(py::module_& m) {
  py::class_<PreparedRun>(m, "PreparedRun",
                          "A runner path prepared once for a dispatch output's shapes (the CUDA-graph "
                          "analogue; MoeRunner.prepare). run() re-reads the dispatch output's arrays in "
                          "place and rewrites combine_input's arrays, with no allocation.")
      .def("run", [](PreparedRun& p) {
        py::gil_scoped_release release;
        p.run();
      })
      .def_property_readonly("combine_input", [](const PreparedRun& p) {
        return from_combine_input(p.combine_input());
      });

  py::class_<CapturedForward, std::shared_ptr<CapturedForward>>(
      m, "CapturedForward",
      "One FusedMoE forward captured for up to `capacity` tokens: fill the static input arrays' "
      "first num_tokens rows, call replay(num_tokens), read `output`.")
      .def(py::init([](std::shared_ptr<FusedMoE> layer, int64_t capacity, const std::string& input,
                       py::object dtype) {
             CaptureInput kind;
             if (input == "router_logits")
               kind = CaptureInput::kRouterLogits;
             else if (input == "topk")
               kind = CaptureInput::kTopK;
             else
               MOECORE_THROW(InvalidArgument, "CapturedForward: input must be 'router_logits' or "
                             "'topk', got '", input, "'");
             const DType d = to_dtype(dtype).value_or(layer ? layer->options().params_dtype
                                                            : DType::kBF16);
             py::gil_scoped_release release;
             return std::make_shared<CapturedForward>(std::move(layer), capacity, kind, d);
           }),
           "layer"_a, "capacity"_a, py::kw_only(), "input"_a = "router_logits",
           "dtype"_a = py::none())
      .def_property_readonly("capacity", &CapturedForward::capacity)
      .def_property_readonly("input", [](const CapturedForward& c) {
        return c.input() == CaptureInput::kRouterLogits ? "router_logits" : "topk";
      })
      .def_property_readonly("hidden_states",
                             [](const CapturedForward& c) { return to_numpy(c.hidden_states()); })
      .def_property_readonly("router_logits",
                             [](const CapturedForward& c) { return to_numpy(c.router_logits()); })
      .def_property_readonly("topk_ids",
                             [](const CapturedForward& c) { return to_numpy(c.topk_ids()); })
      .def_property_readonly("topk_weights",
                             [](const CapturedForward& c) { return to_numpy(c.topk_weights()); })
      .def_property_readonly("output", [](const CapturedForward& c) { return to_numpy(c.output()); })
      .def("replay", [](CapturedForward& c, int64_t num_tokens) {
        py::gil_scoped_release release;
        c.replay(num_tokens);
      }, "num_tokens"_a);
}

}  // namespace moecore::bindings
