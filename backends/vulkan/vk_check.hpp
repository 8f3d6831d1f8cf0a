#pragma once
// Vulkan results become treeattn::Error naming the call and the result
// (OutOfMemory for VK_ERROR_OUT_OF_DEVICE_MEMORY and _HOST_MEMORY, else
// Backend). A fault test's injected failure (fault_injection.hpp) is
// VK_ERROR_UNKNOWN, the call not made.

#include "fault_injection.hpp"
#include "treeattn/error.hpp"
#include "vk_api.hpp"

namespace treeattn::vulkan {

const char* result_name(VkResult result) noexcept;
[[noreturn]] void throw_vk_error(VkResult result, const char* call, const char* file, int line);

}  // namespace treeattn::vulkan

#define TREEATTN_VK_CHECK(call)                                                                   \
  do {                                                                                            \
    namespace treeattn_faults_ = ::treeattn::fault_injection;                                     \
    const VkResult treeattn_vk_result =                                                           \
        treeattn_faults_::fails(treeattn_faults_::driver_call) ? VK_ERROR_UNKNOWN : (call);       \
    if (treeattn_vk_result != VK_SUCCESS) {                                                       \
      ::treeattn::vulkan::throw_vk_error(treeattn_vk_result, #call, __FILE__, __LINE__);          \
    }                                                                                             \
  } while (0)
