// moecore's exception types and the CHECK macros that throw them. The bindings map each type to a
// Python class (python/moecore/errors.py). Nothing here aborts: every failure reachable from Python
// is an exception the caller can catch.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace moecore {

/// Base of every moecore exception. Never thrown directly.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};
/// A bad value: shape, stride, size, config value, unknown name. Python: ValueError.
class InvalidArgument : public Error { using Error::Error; };
/// A wrong or untagged dtype. Python: TypeError.
class DTypeError : public Error { using Error::Error; };
/// A combination that is not built, not registered or not available here. Python:
/// NotImplementedError.
class Unsupported : public Error { using Error::Error; };
/// An index out of range (expert ids, ranks). Python: IndexError.
class OutOfRange : public Error { using Error::Error; };
/// A failed contract check that sglang expresses as an assertion (e.g. an unregistered permute).
/// Python: AssertionError.
class ContractViolation : public Error { using Error::Error; };
/// A broken internal invariant: a bug in moecore. Python: RuntimeError.
class InternalError : public Error { using Error::Error; };

namespace detail {
inline void append(std::ostringstream&) {}
template <typename T, typename... Rest>
void append(std::ostringstream& os, const T& first, const Rest&... rest) {
  os << first;
  append(os, rest...);
}
}  // namespace detail

/// Concatenates its arguments with operator<< into one string.
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  detail::append(os, args...);
  return os.str();
}

}  // namespace moecore

#define MOECORE_THROW(ExType, ...) throw ::moecore::ExType(::moecore::str_cat(__VA_ARGS__))

/// Input validation; message should read "API(backend): expected ..., got ...".
#define MOECORE_CHECK(cond, ...) \
  do {                           \
    if (!(cond)) MOECORE_THROW(InvalidArgument, __VA_ARGS__); \
  } while (0)
#define MOECORE_CHECK_DTYPE(cond, ...) \
  do {                                 \
    if (!(cond)) MOECORE_THROW(DTypeError, __VA_ARGS__); \
  } while (0)
#define MOECORE_CHECK_INDEX(cond, ...) \
  do {                                 \
    if (!(cond)) MOECORE_THROW(OutOfRange, __VA_ARGS__); \
  } while (0)
#define MOECORE_ASSERT(cond, ...) \
  do {                            \
    if (!(cond)) MOECORE_THROW(ContractViolation, __VA_ARGS__); \
  } while (0)
#define MOECORE_UNSUPPORTED(...) MOECORE_THROW(Unsupported, __VA_ARGS__)
#define MOECORE_INTERNAL_CHECK(cond, ...)                                              \
  do {                                                                                 \
    if (!(cond))                                                                       \
      MOECORE_THROW(InternalError, "internal error (a moecore bug) at ", __FILE__, ":", \
                    __LINE__, ": ", __VA_ARGS__);                                      \
  } while (0)
