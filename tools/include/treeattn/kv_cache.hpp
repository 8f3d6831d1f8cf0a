#pragma once
// A paged KV cache's bookkeeping: a pool of pages of `page_size` token slots,
// handed out and taken back. A fixed pool models a preallocated GPU cache; an
// unbounded one (capacity 0) grows on demand, e.g. to find the peak a replay needs. Slot s of the K/V pool lives in page
// s / page_size. Misuse (exhaustion, double free, a page never handed out) is
// an error, not silent corruption.

#include <cstdint>
#include <vector>

namespace treeattn {

class PagedKvCache {
 public:
  // capacity_pages 0: unbounded.
  PagedKvCache(std::int32_t page_size, std::int64_t capacity_pages);

  std::int32_t page_size() const noexcept { return page_size_; }
  bool bounded() const noexcept { return bounded_; }
  // Pages that exist so far (all of them for a bounded cache).
  std::int64_t capacity_pages() const noexcept { return std::int64_t(in_use_.size()); }
  std::int64_t slots() const noexcept { return capacity_pages() * page_size_; }
  std::int64_t pages_in_use() const noexcept { return used_; }
  std::int64_t peak_pages_in_use() const noexcept { return peak_; }

  // Throws InvalidArgument naming the capacity when a bounded cache is full.
  std::int32_t allocate();
  // Throws InvalidArgument for a page that is not currently allocated.
  void release(std::int32_t page);

 private:
  std::int32_t page_size_;
  bool bounded_;
  std::vector<char> in_use_;
  std::vector<std::int32_t> free_;  // LIFO: a freed page is reused first (warm in cache)
  std::int64_t used_ = 0, peak_ = 0;
};

}  // namespace treeattn
