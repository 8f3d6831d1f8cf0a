#pragma once
// Internal: a fixed set of worker threads that run one parallel loop at a
// time (the CPU backend's stages, the Planner's block-size candidates). Which
// worker runs which task never changes a result: callers give every task its
// own output and a fixed order of arithmetic.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace treeattn {

class ThreadPool {
 public:
  // `threads` workers in all, the calling thread included; 0 means one per hardware thread.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const noexcept { return int(workers_.size()) + 1; }

  // Calls body(task, worker) for every task in [0, count), worker in [0, size()),
  // and returns when all are done; rethrows the first exception a task threw.
  void parallel_for(std::int64_t count, const std::function<void(std::int64_t, int)>& body);

 private:
  void work(int worker);
  void drain(int worker);
  void stop() noexcept;  // wakes the workers to leave and joins them

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::uint64_t generation_ = 0;
  bool stopping_ = false;
  int busy_ = 0;
  const std::function<void(std::int64_t, int)>* body_ = nullptr;
  std::int64_t count_ = 0;
  std::atomic<std::int64_t> next_{0};
  std::exception_ptr error_;
};

}  // namespace treeattn
