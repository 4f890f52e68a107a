// Thread pool implementation: one condition variable wakes all workers per call; each worker runs
// its own fixed chunk, so the schedule is static and repeatable.
#include "moecore/core/thread_pool.h"

#include <sched.h>

#include "moecore/core/env.h"
#include "moecore/core/error.h"

namespace moecore {
namespace {
thread_local bool t_inside_chunk = false;

struct ChunkScope {
  ChunkScope() { t_inside_chunk = true; }
  ~ChunkScope() { t_inside_chunk = false; }
};
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
  stopping_ = false;
  // Workers start from the current generation so they never replay an earlier call.
  const uint64_t generation = generation_;
  for (int i = 1; i < n; ++i)
    workers_.emplace_back([this, i, generation] { worker_loop(i, generation); });
}

void ThreadPool::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
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

void ThreadPool::run_chunk(int index) {
  const int64_t per = n_ / num_threads_, extra = n_ % num_threads_;
  const int64_t begin = index * per + std::min<int64_t>(index, extra);
  const int64_t end = begin + per + (index < extra ? 1 : 0);
  if (begin >= end) return;
  try {
    ChunkScope scope;
    (*fn_)(begin, end);
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_) error_ = std::current_exception();
  }
}

void ThreadPool::worker_loop(int index, uint64_t seen) {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
    }
    run_chunk(index);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, RangeFn fn) {
  if (n <= 0) return;
  if (t_inside_chunk || num_threads_ == 1 || n == 1) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call(call_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    n_ = n;
    fn_ = &fn;
    error_ = nullptr;
    pending_ = num_threads_ - 1;
    ++generation_;
  }
  wake_.notify_all();
  run_chunk(0);
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    fn_ = nullptr;
    error = error_;
    error_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace moecore
