// moecore's exception types and the CHECK macros that throw them. The bindings map each type to a
// Python class (python/moecore/errors.py). Nothing here aborts: every failure reachable from Python
// is an exception the caller can catch.
#pragma once

#include <charconv>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

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

/// A str_cat argument written in hexadecimal (lower case, no prefix).
struct Hex {
  unsigned long long value;
};

namespace detail {
// Formats without iostreams, which consult the process-wide C++ locale: inside a Python that had
// loaded another libstdc++ (PyTorch's, on the lent machines) building a message there crashed.
inline void append(std::string& s, std::string_view v) { s.append(v); }
inline void append(std::string& s, const char* v) { s.append(v ? v : "(null)"); }
inline void append(std::string& s, char v) { s.push_back(v); }
inline void append(std::string& s, bool v) { s.push_back(v ? '1' : '0'); }  // as operator<<
inline void append(std::string& s, Hex v) {
  char buf[32];
  s.append(buf, std::to_chars(buf, buf + sizeof buf, v.value, 16).ptr);
}
/// Integers in decimal; floats in their shortest round-trip form.
template <typename T>
std::enable_if_t<std::is_arithmetic_v<T>> append(std::string& s, T v) {
  char buf[64];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof buf, v);
  s.append(buf, r.ptr);
}
}  // namespace detail

/// Concatenates its arguments (strings, characters, numbers) into one string.
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::string s;
  (detail::append(s, args), ...);
  return s;
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
