#pragma once
// Vulkan results become treeattn::Error(Backend) naming the call and the result.

#include "treeattn/error.hpp"
#include "vk_api.hpp"

namespace treeattn::vulkan {

const char* result_name(VkResult result) noexcept;
[[noreturn]] void throw_vk_error(VkResult result, const char* call, const char* file, int line);

}  // namespace treeattn::vulkan

#define TREEATTN_VK_CHECK(call)                                                             \
  do {                                                                                      \
    const VkResult treeattn_vk_result = (call);                                             \
    if (treeattn_vk_result != VK_SUCCESS) {                                                 \
      ::treeattn::vulkan::throw_vk_error(treeattn_vk_result, #call, __FILE__, __LINE__);    \
    }                                                                                       \
  } while (0)
