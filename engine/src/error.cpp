#include "treeattn/error.hpp"

namespace treeattn {

const char* to_string(ErrorCategory category) noexcept {
  switch (category) {
    case ErrorCategory::InvalidTree: return "invalid tree";
    case ErrorCategory::InvalidArgument: return "invalid argument";
    case ErrorCategory::InvalidPlan: return "invalid plan";
    case ErrorCategory::Io: return "I/O";
    case ErrorCategory::Backend: return "backend";
    case ErrorCategory::OutOfMemory: return "out of memory";
  }
  return "unknown";
}

Error::Error(ErrorCategory category, const std::string& message)
    : std::runtime_error(message), category_(category) {}

}  // namespace treeattn
