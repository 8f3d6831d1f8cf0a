#pragma once
// What a test run asks of the backends through its environment, turned into
// options (the library reads no environment): TREEATTN_VK_DEVICE picks the
// Vulkan device, and TREEATTN_VK_VALIDATION=1 (ctest sets it for the Vulkan
// programs) turns the Khronos validation layer on. The library's messages go
// to stderr.

#include "backend.hpp"

namespace treeattn::test {

// Throws InvalidArgument naming TREEATTN_VK_DEVICE when it is not a device index.
BackendOptions harness_options();

}  // namespace treeattn::test
