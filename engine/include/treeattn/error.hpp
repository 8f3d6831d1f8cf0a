#pragma once
// Every failure in treeattn is a treeattn::Error: a category a caller can branch
// on, and a message that names the object, the value it got and what was expected.

#include <stdexcept>
#include <string>

namespace treeattn {

enum class ErrorCategory {
  InvalidTree,      // the tree, its queries or its head configuration
  InvalidArgument,  // tensors, options or flags that do not match the tree or plan
  InvalidPlan,      // a Plan whose arrays are inconsistent (a bug, or a hand-edited plan)
  Io,               // files: JSON, .npy, output paths
  Backend,          // a backend that is missing, unavailable or failed
  OutOfMemory,      // the device's memory or its pinned host memory ran out (host allocations throw std::bad_alloc)
};

const char* to_string(ErrorCategory category) noexcept;

class Error : public std::runtime_error {
 public:
  Error(ErrorCategory category, const std::string& message);
  ErrorCategory category() const noexcept { return category_; }

 private:
  ErrorCategory category_;
};

}  // namespace treeattn
