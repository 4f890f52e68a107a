// Maps moecore's C++ exceptions to the Python classes of moecore.errors, which also derive from
// the matching built-in (ValueError, TypeError, NotImplementedError, IndexError, AssertionError,
// RuntimeError), so callers can catch either.
#include "bind_all.h"

namespace moecore::bindings {

void bind_errors(py::module_& m) {
  py::module_ errors = py::module_::import("moecore.errors");
  // Leaked on purpose: the translator may run until interpreter exit.
  static py::object* classes = new py::object(py::dict(
      "InvalidArgumentError"_a = errors.attr("InvalidArgumentError"),
      "DTypeError"_a = errors.attr("DTypeError"), "UnsupportedError"_a = errors.attr("UnsupportedError"),
      "OutOfRangeError"_a = errors.attr("OutOfRangeError"),
      "ContractAssertionError"_a = errors.attr("ContractAssertionError"),
      "InternalError"_a = errors.attr("InternalError"), "MoecoreError"_a = errors.attr("MoecoreError")));
  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    auto raise = [](const char* cls, const std::exception& e) {
      py::object type = (*classes)[cls];
      PyErr_SetString(type.ptr(), e.what());
    };
    try {
      std::rethrow_exception(p);
    } catch (const InvalidArgument& e) {
      raise("InvalidArgumentError", e);
    } catch (const DTypeError& e) {
      raise("DTypeError", e);
    } catch (const Unsupported& e) {
      raise("UnsupportedError", e);
    } catch (const OutOfRange& e) {
      raise("OutOfRangeError", e);
    } catch (const ContractViolation& e) {
      raise("ContractAssertionError", e);
    } catch (const InternalError& e) {
      raise("InternalError", e);
    } catch (const Error& e) {
      raise("MoecoreError", e);
    }
  });
}

}  // namespace moecore::bindings
