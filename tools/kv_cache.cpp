#include "treeattn/kv_cache.hpp"

#include "fail.hpp"

namespace treeattn {

PagedKvCache::PagedKvCache(std::int32_t page_size, std::int64_t capacity_pages)
    : page_size_(page_size), bounded_(capacity_pages > 0) {
  if (page_size < 1) fail(ErrorCategory::InvalidArgument, "KV cache: page_size = {} must be positive", page_size);
  if (capacity_pages < 0 || capacity_pages * page_size > std::int64_t(1) << 31) {
    fail(ErrorCategory::InvalidArgument, "KV cache: {} pages of {} slots exceed 2^31 slots", capacity_pages, page_size);
  }
  in_use_.assign(std::size_t(capacity_pages), 0);
  free_.reserve(std::size_t(capacity_pages));
  for (std::int64_t p = capacity_pages - 1; p >= 0; --p) free_.push_back(std::int32_t(p));
}

std::int32_t PagedKvCache::allocate() {
  if (free_.empty() && !bounded_ && slots() + page_size_ <= std::int64_t(1) << 31) {
    free_.push_back(std::int32_t(in_use_.size()));
    in_use_.push_back(0);
  }
  if (free_.empty()) {
    fail(ErrorCategory::InvalidArgument, "KV cache: all {} pages ({} slots) are in use", capacity_pages(), slots());
  }
  const std::int32_t page = free_.back();
  free_.pop_back();
  in_use_[std::size_t(page)] = 1;
  peak_ = std::max(peak_, ++used_);
  return page;
}

void PagedKvCache::release(std::int32_t page) {
  if (page < 0 || page >= capacity_pages() || !in_use_[std::size_t(page)]) {
    fail(ErrorCategory::InvalidArgument, "KV cache: page {} released but not allocated (capacity {})", page,
         capacity_pages());
  }
  in_use_[std::size_t(page)] = 0;
  free_.push_back(page);
  --used_;
}

}  // namespace treeattn
