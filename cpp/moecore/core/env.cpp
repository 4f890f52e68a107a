// Environment knob parsing.
#include "moecore/core/env.h"

#include <cstdlib>

#include "moecore/core/error.h"

namespace moecore {

std::string env_string(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v == nullptr || *v == '\0') ? fallback : std::string(v);
}

int env_int(const char* name, int fallback, int lo, int hi) {
  std::string v = env_string(name, "");
  if (v.empty()) return fallback;
  char* end = nullptr;
  long parsed = std::strtol(v.c_str(), &end, 10);
  MOECORE_CHECK(end != v.c_str() && *end == '\0' && parsed >= lo && parsed <= hi, name,
                ": expected an integer in [", lo, ", ", hi, "], got '", v, "'");
  return static_cast<int>(parsed);
}

bool env_flag(const char* name, bool fallback) {
  std::string v = env_string(name, "");
  if (v.empty()) return fallback;
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  MOECORE_THROW(InvalidArgument, name, ": expected 0/1/true/false, got '", v, "'");
}

}  // namespace moecore
