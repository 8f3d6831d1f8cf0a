#include "thread_pool.hpp"

namespace treeattn {

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  try {
    workers_.reserve(std::size_t(threads - 1));
    for (int w = 1; w < threads; ++w) workers_.emplace_back([this, w] { work(w); });
  } catch (...) {
    stop();  // a thread that cannot be started: the ones that were are joined, not abandoned
    throw;
  }
}

ThreadPool::~ThreadPool() { stop(); }

void ThreadPool::stop() noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::drain(int worker) {
  for (std::int64_t task = next_++; task < count_; task = next_++) {
    try {
      (*body_)(task, worker);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
      next_ = count_;  // stop handing out tasks
    }
  }
}

void ThreadPool::work(int worker) {
  std::uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
    }
    drain(worker);
    std::lock_guard<std::mutex> lock(mutex_);
    if (--busy_ == 0) done_.notify_one();
  }
}

void ThreadPool::parallel_for(std::int64_t count, const std::function<void(std::int64_t, int)>& body) {
  if (count <= 0) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    body_ = &body;
    count_ = count;
    next_ = 0;
    error_ = nullptr;
    busy_ = int(workers_.size());
    ++generation_;
  }
  wake_.notify_all();
  drain(0);
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return busy_ == 0; });
  body_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

}  // namespace treeattn
