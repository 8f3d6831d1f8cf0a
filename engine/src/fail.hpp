#pragma once
// Internal: throw a treeattn::Error with an fmt-formatted message.

#include <fmt/format.h>

#include <utility>

#include "treeattn/error.hpp"

namespace treeattn {

template <typename... Args>
[[noreturn]] void fail(ErrorCategory category, fmt::format_string<Args...> format,
                       Args&&... args) {
  throw Error(category, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace treeattn
