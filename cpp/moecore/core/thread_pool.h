// moecore's thread pool: persistent workers and a static, deterministic schedule. parallel_for
// splits [0, n) into one contiguous chunk per thread, always the same chunks for the same n, so
// which thread computes an item never changes the item's result. Threads claim the chunks, so
// one that is free takes the chunk of a worker still waking up. Exceptions thrown by any chunk
// reach the caller; none is swallowed.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace moecore {

/// A non-owning reference to a callable `void(int64_t begin, int64_t end)`: no allocation.
class RangeFn {
 public:
  template <typename F>
  RangeFn(F& f)  // NOLINT: implicit on purpose, like std::function_ref
      : object_(static_cast<void*>(&f)), call_([](void* o, int64_t b, int64_t e) {
          (*static_cast<F*>(o))(b, e);
        }) {}
  void operator()(int64_t begin, int64_t end) const { call_(object_, begin, end); }

 private:
  void* object_;
  void (*call_)(void*, int64_t, int64_t);
};

class ThreadPool {
 public:
  /// The process-wide pool; sized from MOECORE_NUM_THREADS or the CPUs this process may use.
  static ThreadPool& instance();
  ~ThreadPool();

  int num_threads() const { return num_threads_; }
  /// Resizes the pool (n >= 1). Waits for a running parallel_for to finish.
  void set_num_threads(int n);

  /// Runs fn(begin, end) over [0, n) in num_threads contiguous chunks of near-equal size, each
  /// on whichever thread claims it first (the caller among them). Called from inside a chunk, it
  /// runs serially on that thread. Callers from several threads take turns. Rethrows the first
  /// exception any chunk threw.
  void parallel_for(int64_t n, RangeFn fn);

 private:
  explicit ThreadPool(int n);
  void start(int n);
  void stop();
  void worker_loop(uint64_t seen);
  void run_claimed_chunks(uint64_t generation);
  void run_chunk(int64_t index);

  int num_threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // one parallel_for at a time
  // Workers and the caller first spin on the atomics for a short while (the calls of one forward
  // come back to back, and a futex wake-up of every worker costs more than a decode GEMM's
  // share), then sleep on the condition variables. A new call and a stop are published under
  // mutex_, and the last worker signals done_ under it, so a sleeper cannot miss either.
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::atomic<uint64_t> generation_{0};
  // The current call's chunks: its generation (low 32 bits) in bits 32-63, the number of
  // non-empty chunks in bits 16-31 and the next one to claim in bits 0-15 (num_threads ≤ 1024).
  // Published before generation_, and a claim checks the generation, so a thread that reaches
  // a call late never claims a chunk of the next one as its own.
  std::atomic<uint64_t> chunks_{0};
  std::atomic<int64_t> pending_{0};  // chunks not finished yet
  std::atomic<bool> stopping_{false};
  bool spin_ = false;  // no more threads than CPUs (set by start)
  int64_t n_ = 0;
  RangeFn* fn_ = nullptr;
  std::exception_ptr error_;
};

/// Shorthand for ThreadPool::instance().parallel_for with any callable.
template <typename F>
void parallel_for(int64_t n, F&& f) {
  std::remove_reference_t<F>& ref = f;
  ThreadPool::instance().parallel_for(n, RangeFn(ref));
}

/// Cuts items [0, count) into `parts` contiguous runs of near-equal total cost(i) (an int64_t,
/// ≥ 0): run p is [begin[p], begin[p + 1]), begin[parts] = count. For work items of unequal cost
/// run one run per thread (parallel_for over parts); which thread runs an item never changes its
/// result, so the split balances the threads without touching a bit.
template <typename Cost>
void split_by_cost(int64_t count, int64_t parts, const Cost& cost, int64_t* begin) {
  int64_t total = 0;
  for (int64_t i = 0; i < count; ++i) total += cost(i);
  for (int64_t p = 0; p <= parts; ++p) begin[p] = count;
  int64_t done = 0, p = 0;
  for (int64_t i = 0; i < count; ++i) {
    while (p < parts && done * parts >= p * total) begin[p++] = i;
    done += cost(i);
  }
}

/// Number of CPUs this process may run on (sched_getaffinity), at least 1.
int available_cpus();

}  // namespace moecore
