// Capture and replay: MoeRunner.prepare's PreparedRun, a layer's CapturedForward and an
// expert-parallel group's CapturedGroupForward.
#include "bind_all.h"
#include "moecore/layer/capture.h"
#include "moecore/layer/ep_group.h"
#include "py_objects.h"

namespace moecore::bindings {
namespace {
CaptureInput parse_capture_input(const std::string& input, const char* api) {
  if (input == "router_logits") return CaptureInput::kRouterLogits;
  if (input == "topk") return CaptureInput::kTopK;
  MOECORE_THROW(InvalidArgument, api, ": input must be 'router_logits' or 'topk', got '", input,
                "'");
}
}  // namespace

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
             const CaptureInput kind = parse_capture_input(input, "CapturedForward");
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

  py::class_<CapturedGroupForward, std::shared_ptr<CapturedGroupForward>>(
      m, "CapturedGroupForward",
      "An expert-parallel group's forward captured for up to `capacity` tokens per rank "
      "(ExpertParallelGroup.capture): fill each rank's static arrays (ranks[r].hidden_states, "
      "...), call replay(num_tokens) with one count per rank, read ranks[r].output.")
      .def_property_readonly("size", &CapturedGroupForward::size)
      .def_property_readonly("capacity", &CapturedGroupForward::capacity)
      .def_property_readonly("ranks", [](const CapturedGroupForward& g) {
        py::list ranks;
        for (int r = 0; r < g.size(); ++r) ranks.append(g.rank(r));
        return ranks;
      })
      .def("replay", [](CapturedGroupForward& g, py::object num_tokens) {
        std::vector<int64_t> counts;
        if (py::isinstance<py::int_>(num_tokens))
          counts.assign(static_cast<size_t>(g.size()), num_tokens.cast<int64_t>());
        else
          counts = num_tokens.cast<std::vector<int64_t>>();
        py::gil_scoped_release release;
        g.replay(counts);
      }, "num_tokens"_a,
         "num_tokens: one count per rank, or one int for every rank.");

  py::object group_class = m.attr("ExpertParallelGroup");
  group_class.attr("capture") = py::cpp_function(
      [](ExpertParallelGroup& g, int64_t capacity, const std::string& input) {
        const CaptureInput kind = parse_capture_input(input, "ExpertParallelGroup.capture");
        py::gil_scoped_release release;
        return std::shared_ptr<CapturedGroupForward>(g.capture(capacity, kind));
      },
      py::name("capture"), py::is_method(group_class),
      py::sibling(py::getattr(group_class, "capture", py::none())), "capacity"_a, py::kw_only(),
      "input"_a = "router_logits",
      "Captures the group's forward for up to `capacity` tokens per rank (bf16). DeepEP runs "
      "low-latency (deepep_mode auto or low_latency; normal cannot be captured), FlashInfer its "
      "fixed-size all-to-all.");
}

}  // namespace moecore::bindings
