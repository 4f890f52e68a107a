// Thread pool implementation: a call bumps the generation, which wakes all workers (spinning ones
// see it at once, sleeping ones through one condition variable); the caller and the workers then
// claim the call's fixed chunks one at a time, so the schedule is static and repeatable, and a
// worker that wakes late (a sleeping core takes up to a few hundred µs on a 16-core Xeon) leaves
// its chunk to a thread already done with its own.
#include "moecore/core/thread_pool.h"

#include <sched.h>

#include <chrono>

#include "moecore/core/env.h"
#include "moecore/core/error.h"

namespace moecore {
namespace {
thread_local bool t_inside_chunk = false;

struct ChunkScope {
  ChunkScope() { t_inside_chunk = true; }
  ~ChunkScope() { t_inside_chunk = false; }
};

// How long a waiting thread spins before it sleeps: longer than the gap between the calls of one
// forward, short enough to cost nothing noticeable when no call follows.
constexpr auto kSpin = std::chrono::microseconds(100);

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Spins until ready() or kSpin has passed, yielding the core now and then to any other thread
// that wants it; returns ready(). Only when `spin` (the pool has no more threads than CPUs:
// with more, spinners would hold the cores that the threads still working need).
template <typename Ready>
bool spin_until(bool spin, Ready ready) {
  if (!spin) return ready();
  const auto end = std::chrono::steady_clock::now() + kSpin;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() >= end) return ready();
    std::this_thread::yield();
  }
}
}  // namespace

int available_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(hw) : 1;
}

ThreadPool& ThreadPool::instance() {
  static ThreadPool pool(env_int("MOECORE_NUM_THREADS", available_cpus(), 1, 1024));
  return pool;
}

ThreadPool::ThreadPool(int n) { start(n); }
ThreadPool::~ThreadPool() { stop(); }

void ThreadPool::start(int n) {
  num_threads_ = n;
  spin_ = n <= available_cpus();
  stopping_.store(false, std::memory_order_relaxed);
  // Workers start from the current generation so they never replay an earlier call.
  const uint64_t generation = generation_.load(std::memory_order_relaxed);
  for (int i = 1; i < n; ++i)
    workers_.emplace_back([this, generation] { worker_loop(generation); });
}

void ThreadPool::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_.store(true, std::memory_order_release);
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
  workers_.clear();
}

void ThreadPool::set_num_threads(int n) {
  MOECORE_CHECK(n >= 1 && n <= 1024, "set_num_threads: expected 1..1024, got ", n);
  MOECORE_CHECK(!t_inside_chunk, "set_num_threads: cannot resize the pool from inside a task");
  std::lock_guard<std::mutex> call(call_mutex_);
  if (n == num_threads_) return;
  stop();
  start(n);
}

void ThreadPool::run_chunk(int64_t index) {
  const int64_t per = n_ / num_threads_, extra = n_ % num_threads_;
  const int64_t begin = index * per + std::min<int64_t>(index, extra);
  const int64_t end = begin + per + (index < extra ? 1 : 0);
  try {
    ChunkScope scope;
    (*fn_)(begin, end);
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_) error_ = std::current_exception();
  }
}

void ThreadPool::run_claimed_chunks(uint64_t generation) {
  constexpr uint64_t kIndexMask = 0xffff;
  uint64_t state = chunks_.load(std::memory_order_acquire);
  for (;;) {
    if (state >> 32 != (generation & 0xffffffff)) return;  // a call this thread came too late for
    const uint64_t next = state & kIndexMask, count = (state >> 16) & kIndexMask;
    if (next >= count) return;
    if (!chunks_.compare_exchange_weak(state, state + 1, std::memory_order_acq_rel,
                                       std::memory_order_acquire))
      continue;
    // Claimed: the call cannot finish (and n_, fn_ change) before this chunk is done.
    run_chunk(static_cast<int64_t>(next));
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mutex_);  // the caller may be about to sleep
      done_.notify_one();
    }
    state = chunks_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_loop(uint64_t seen) {
  const auto called = [&] {
    return stopping_.load(std::memory_order_acquire) ||
           generation_.load(std::memory_order_acquire) != seen;
  };
  for (;;) {
    if (!spin_until(spin_, called)) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, called);
    }
    if (stopping_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    run_claimed_chunks(seen);
  }
}

void ThreadPool::parallel_for(int64_t n, RangeFn fn) {
  if (n <= 0) return;
  if (t_inside_chunk || num_threads_ == 1 || n == 1) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call(call_mutex_);
  uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    n_ = n;
    fn_ = &fn;
    error_ = nullptr;
    const int64_t chunks = std::min<int64_t>(n, num_threads_);  // the non-empty ones: a prefix
    pending_.store(chunks, std::memory_order_relaxed);
    generation = generation_.load(std::memory_order_relaxed) + 1;
    chunks_.store((generation & 0xffffffff) << 32 | static_cast<uint64_t>(chunks) << 16,
                  std::memory_order_release);
    generation_.store(generation, std::memory_order_release);  // publishes the call
  }
  wake_.notify_all();
  run_claimed_chunks(generation);
  const auto finished = [&] { return pending_.load(std::memory_order_acquire) == 0; };
  std::exception_ptr error;
  {
    if (!spin_until(spin_, finished)) {
      std::unique_lock<std::mutex> lock(mutex_);
      done_.wait(lock, finished);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    fn_ = nullptr;
    error = error_;
    error_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace moecore
