// Environment knobs, read with validation. A malformed value is an InvalidArgument naming the
// variable, never a silent default.
#pragma once

#include <string>

namespace moecore {

/// The variable's value, or `fallback` when unset or empty.
std::string env_string(const char* name, const std::string& fallback);
/// Integer in [lo, hi]; throws InvalidArgument when set to anything else.
int env_int(const char* name, int fallback, int lo, int hi);
/// "1"/"true"/"yes"/"on" → true, "0"/"false"/"no"/"off" → false; throws otherwise.
bool env_flag(const char* name, bool fallback);

}  // namespace moecore
