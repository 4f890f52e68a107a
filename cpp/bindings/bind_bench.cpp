// moecore._moecore.bench: the machine probes of kernels/probe.h for the benchmark harness
// (python/moecore/_bench). Each releases the GIL while it runs on moecore's pool.
#include "bind_all.h"
#include "moecore/kernels/probe.h"

namespace moecore::bindings {

namespace {

py::dict to_dict(const ProbeResult& r, const char* rate_key) {
  py::dict d;
  d[rate_key] = r.rate;
  d["seconds"] = r.seconds;
  d["threads"] = r.threads;
  return d;
}

}  // namespace

void bind_bench(py::module_& m) {
  py::module_ bench = m.def_submodule("bench", "Machine probes for python -m moecore bench.");
  bench.def("peak_kinds", [] {
    py::list out;
    for (PeakKind k : available_peak_kinds()) out.append(peak_kind_name(k));
    return out;
  }, "Peak probes this machine and build can run, weakest first.");
  bench.def("read_bandwidth", [](int64_t bytes, int streams, int repeats) {
    ProbeResult r;
    {
      py::gil_scoped_release release;
      r = probe_read_bandwidth(bytes, streams, repeats);
    }
    return to_dict(r, "gb_per_s");
  }, "bytes"_a, "streams"_a = 4, "repeats"_a = 5,
     "Best-of-repeats read bandwidth (GB/s) of `bytes` over the pool's threads, `streams` read "
     "streams per thread: {'gb_per_s', 'seconds', 'threads'}.");
  bench.def("peak", [](const std::string& kind, int64_t iterations, int repeats) {
    const PeakKind k = parse_peak_kind(kind);
    ProbeResult r;
    {
      py::gil_scoped_release release;
      r = probe_peak(k, iterations, repeats);
    }
    return to_dict(r, "gflop_per_s");
  }, "kind"_a, "iterations"_a, "repeats"_a = 3,
     "Best-of-repeats GFLOP/s of a peak loop (see peak_kinds) run `iterations` times per thread: "
     "{'gflop_per_s', 'seconds', 'threads'}.");
}

}  // namespace moecore::bindings
