#pragma once
// The Vulkan part of the library's backend options, for the backend, the
// CLI's device-path demo and the tests: one translation, so every Vulkan
// context a program opens picks the same device and model cache.

#include "backend.hpp"
#include "treeattn/vulkan.hpp"

namespace treeattn::vulkan {

// The device is `device`, or `vk_device` where that is -1.
ContextOptions context_options(const BackendOptions& o);

}  // namespace treeattn::vulkan
