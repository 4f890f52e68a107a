// The test binary's global operator new/delete (plain and aligned, so tensor storage too): plain
// malloc/free that count while a test has switched counting on (support/counting_allocator.h),
// pool workers included.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "moecore/core/tensor.h"
#include "support/counting_allocator.h"

namespace {
std::atomic<bool> g_count_allocations{false};
std::atomic<int64_t> g_allocations{0};
}  // namespace

void* operator new(std::size_t n) {
  if (g_count_allocations.load(std::memory_order_relaxed)) g_allocations.fetch_add(1);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
// The nothrow pair too (std::stable_sort's temporary buffer uses it): sanitizers replace every
// form they are not given, and a block must be freed by the family that allocated it.
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return ::operator new(n);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
// Aligned forms (tensor storage): aligned_alloc wants a size that is a multiple of the alignment.
void* operator new(std::size_t n, std::align_val_t align) {
  if (g_count_allocations.load(std::memory_order_relaxed)) g_allocations.fetch_add(1);
  const auto a = static_cast<std::size_t>(align);
  if (void* p = std::aligned_alloc(a, (n + a - 1) / a * a + (n == 0 ? a : 0))) return p;
  throw std::bad_alloc();
}
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace moecore::testing {

int64_t count_allocations(const std::function<void()>& fn) {
  g_allocations = 0;
  g_count_allocations = true;
  fn();
  g_count_allocations = false;
  return g_allocations;
}

namespace {
TEST(CountingAllocatorTest, CountsAnAllocationAndNothingElse) {
  EXPECT_EQ(count_allocations([] {}), 0);
  EXPECT_EQ(count_allocations([] {
              int* volatile p = new int(1);
              delete p;
            }),
            1);
}

TEST(CountingAllocatorTest, CountsTensorStorage) {
  const std::vector<int64_t> shape{3, 5};
  EXPECT_EQ(count_allocations([&] { const Tensor t = Tensor::empty(shape, DType::kBF16); }), 2)
      << "the storage and its shared owner";
}
}  // namespace

}  // namespace moecore::testing
