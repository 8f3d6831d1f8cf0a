#include "treeattn/tensor.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace treeattn {

namespace {
// The product of the dimensions from `first` on (no allocation: called per work item).
std::int64_t product(const std::vector<std::int64_t>& shape, std::size_t first = 0) noexcept {
  std::int64_t n = 1;
  for (std::size_t d = first; d < shape.size(); ++d) n *= shape[d];
  return n;
}
}  // namespace

std::int64_t TensorRef::numel() const noexcept { return product(shape); }

std::int64_t TensorRef::row_elements() const noexcept { return product(shape, 1); }

HostArray::HostArray(DType dtype_, std::vector<std::int64_t> shape_)
    : dtype(dtype_), shape(std::move(shape_)) {
  bytes.assign(std::size_t(numel()) * dtype_size(dtype), 0);
}

std::int64_t HostArray::numel() const noexcept { return product(shape); }

std::string describe(const TensorRef& t) {
  if (t.dense()) return fmt::format("[{}] {}", fmt::join(t.shape, ", "), to_string(t.dtype));
  return fmt::format("[{}] {} row stride {}", fmt::join(t.shape, ", "), to_string(t.dtype), t.row_stride);
}

}  // namespace treeattn
