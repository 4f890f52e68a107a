// Counts heap allocations (global operator new, any thread) while a test measures them; the
// replacement operators live in test_counting_allocator.cpp, once for the whole test binary.
#pragma once

#include <cstdint>
#include <functional>

namespace moecore::testing {

/// Heap allocations made (by any thread) while fn runs.
int64_t count_allocations(const std::function<void()>& fn);

}  // namespace moecore::testing
