// System-level bindings: enum tables (moecore.enums builds its Enum classes from them), ISA
// level, threads, the process-wide backends, and test hooks in _moecore.testing.
#include <stdexcept>

#include "bind_all.h"
#include "moecore/core/thread_pool.h"
#include "moecore/isa/isa.h"
#include "moecore/runner/config.h"

namespace moecore::bindings {
namespace {

template <typename E>
py::list enum_table() {
  py::list out;
  for (const auto& e : EnumInfo<E>::entries()) out.append(py::make_tuple(e.name, e.value));
  return out;
}

}  // namespace

void bind_core(py::module_& m) {
  m.def("_enum_table", [](const std::string& name) -> py::list {
    if (name == "MoeRunnerBackend") return enum_table<MoeRunnerBackend>();
    if (name == "MoeA2ABackend") return enum_table<MoeA2ABackend>();
    if (name == "DeepEPMode") return enum_table<DeepEPMode>();
    if (name == "DispatchOutputFormat") return enum_table<DispatchOutputFormat>();
    if (name == "ScoringFunc") return enum_table<ScoringFunc>();
    if (name == "Activation") return enum_table<Activation>();
    if (name == "TopKOutputFormat") {
      py::list out;
      for (auto f : {TopKOutputFormat::STANDARD, TopKOutputFormat::TRITON_KERNEL,
                     TopKOutputFormat::BYPASSED})
        out.append(py::make_tuple(topk_output_format_name(f), static_cast<int>(f)));
      return out;
    }
    MOECORE_THROW(InvalidArgument, "_enum_table: unknown enum '", name, "'");
  });
  m.def("_fused_only_backends", [] {
    py::list out;
    for (const auto& e : EnumInfo<MoeRunnerBackend>::entries())
      if (is_fused_only(e.member)) out.append(e.value);
    return out;
  });
  m.def("dtype_names", [] {
    int n = 0;
    const DTypeTraits* t = all_dtypes(&n);
    py::list out;
    for (int i = 0; i < n; ++i) out.append(t[i].name);
    return out;
  }, "Names of the storage dtypes moecore understands.");

  // ISA level.
  m.def("detected_isa_level", [] { return std::string(isa_level_name(detected_isa_level())); },
        "Highest ISA level this CPU, OS and build support.");
  m.def("get_isa_level", [] { return std::string(isa_level_name(current_isa_level())); },
        "The ISA level new runners pick their kernels for (MOECORE_ISA or set_isa_level()).");
  m.def("set_isa_level", [](const std::string& level) { set_isa_level(parse_isa_level(level)); },
        "level"_a, "Forces an ISA level for runners built from now on; raises "
        "UnsupportedError if this machine or build lacks it.");
  m.def("available_isa_levels", [] {
    py::list out;
    for (IsaLevel l : available_isa_levels()) out.append(isa_level_name(l));
    return out;
  });
  m.def("cpu_features", [] {
    const CpuFeatures& f = cpu_features();
    return py::dict("avx2"_a = f.avx2, "fma"_a = f.fma, "f16c"_a = f.f16c,
                    "avx512f"_a = f.avx512f, "avx512bw"_a = f.avx512bw,
                    "avx512vl"_a = f.avx512vl, "avx512dq"_a = f.avx512dq,
                    "avx512_bf16"_a = f.avx512_bf16, "avx512_vnni"_a = f.avx512_vnni,
                    "avx512_vbmi"_a = f.avx512_vbmi,
                    "amx_tile"_a = f.amx_tile, "amx_bf16"_a = f.amx_bf16,
                    "amx_int8"_a = f.amx_int8, "os_saves_avx512"_a = f.os_saves_avx512,
                    "os_saves_amx"_a = f.os_saves_amx, "amx_permission"_a = f.amx_permission,
                    "vendor_amd"_a = f.vendor_amd);
  });

  // Threads.
  m.def("set_num_threads", [](int n) { ThreadPool::instance().set_num_threads(n); }, "n"_a,
        "Sets the number of threads moecore's kernels use (default: MOECORE_NUM_THREADS or "
        "the CPUs this process may run on).");
  m.def("get_num_threads", [] { return ThreadPool::instance().num_threads(); });

  // Process-wide backends (sglang's get_moe_a2a_backend() and friends).
  m.def("get_moe_a2a_backend", [] { return from_enum(get_moe_a2a_backend()); });
  m.def("get_moe_runner_backend", [] { return from_enum(get_moe_runner_backend()); });
  m.def("get_deepep_mode", [] { return from_enum(get_deepep_mode()); });
  m.def("set_moe_a2a_backend", [](py::object b) { set_moe_a2a_backend(to_enum<MoeA2ABackend>(b)); },
        "backend"_a);
  m.def("set_moe_runner_backend",
        [](py::object b) { set_moe_runner_backend(to_enum<MoeRunnerBackend>(b)); }, "backend"_a);
  m.def("set_deepep_mode", [](py::object b) { set_deepep_mode(to_enum<DeepEPMode>(b)); },
        "mode"_a);

  // Test hooks: exercise the thread pool's exception path from Python.
  py::module_ testing = m.def_submodule("testing", "Hooks for moecore's own tests.");
  testing.def("parallel_raise", [](int64_t n, int64_t failing_item) {
    py::gil_scoped_release release;
    parallel_for(n, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        if (i == failing_item) MOECORE_THROW(InvalidArgument, "item ", i, " failed on purpose");
    });
  }, "n"_a, "failing_item"_a);
  testing.def("raise_error", [](const std::string& kind) {
    // kind: the Python class the error must arrive as.
    if (kind == "InvalidArgumentError") MOECORE_THROW(InvalidArgument, "raised on purpose");
    if (kind == "DTypeError") MOECORE_THROW(DTypeError, "raised on purpose");
    if (kind == "UnsupportedError") MOECORE_THROW(Unsupported, "raised on purpose");
    if (kind == "OutOfRangeError") MOECORE_THROW(OutOfRange, "raised on purpose");
    if (kind == "ContractAssertionError") MOECORE_THROW(ContractViolation, "raised on purpose");
    if (kind == "InternalError") MOECORE_INTERNAL_CHECK(false, "raised on purpose");
    MOECORE_THROW(InvalidArgument, "raise_error: unknown kind '", kind, "'");
  }, "kind"_a, "Raises the C++ error of that kind, to test the exception translation.");
  testing.def("parallel_sum", [](int64_t n) {
    std::vector<int64_t> partial(n, 0);
    {
      py::gil_scoped_release release;
      parallel_for(n, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) partial[i] = i;
      });
    }
    int64_t total = 0;
    for (int64_t v : partial) total += v;
    return total;
  }, "n"_a);
}

}  // namespace moecore::bindings
