#pragma once
// The Vulkan functions the demo's device runner calls on treeattn's own device.
// treeattn links no Vulkan loader (its backend opens one at run time), so
// neither does the CLI: the loader is opened here, the physical device's
// queries taken from it, and the device's own functions from vkGetDeviceProcAddr.

#include <vulkan/vulkan_core.h>

// The device's functions, named without their vk prefix.
#define TREEATTN_CLI_VK_DEVICE_FUNCTIONS(X)                                                                        \
  X(AllocateCommandBuffers) X(AllocateMemory) X(BeginCommandBuffer) X(BindBufferMemory) X(CmdCopyBuffer)          \
  X(CmdPipelineBarrier) X(CmdResetQueryPool) X(CmdWriteTimestamp) X(CreateBuffer) X(CreateCommandPool)            \
  X(CreateFence) X(CreateQueryPool) X(DestroyBuffer) X(DestroyCommandPool) X(DestroyFence) X(DestroyQueryPool)    \
  X(DeviceWaitIdle) X(EndCommandBuffer) X(FreeMemory) X(GetBufferMemoryRequirements) X(GetFenceStatus)           \
  X(GetQueryPoolResults) X(MapMemory) X(QueueSubmit) X(ResetCommandBuffer) X(ResetFences) X(WaitForFences)

namespace treeattn::cli {

class VulkanFunctions {
 public:
  // Throws Backend naming the loader or the function that is missing.
  explicit VulkanFunctions(VkDevice device);
  ~VulkanFunctions();
  VulkanFunctions(const VulkanFunctions&) = delete;
  VulkanFunctions& operator=(const VulkanFunctions&) = delete;

  PFN_vkGetPhysicalDeviceProperties GetPhysicalDeviceProperties = nullptr;
  PFN_vkGetPhysicalDeviceMemoryProperties GetPhysicalDeviceMemoryProperties = nullptr;
  PFN_vkGetPhysicalDeviceMemoryProperties2 GetPhysicalDeviceMemoryProperties2 = nullptr;
  PFN_vkEnumerateDeviceExtensionProperties EnumerateDeviceExtensionProperties = nullptr;
  PFN_vkGetPhysicalDeviceQueueFamilyProperties GetPhysicalDeviceQueueFamilyProperties = nullptr;
#define TREEATTN_CLI_VK_MEMBER(name) PFN_vk##name name = nullptr;
  TREEATTN_CLI_VK_DEVICE_FUNCTIONS(TREEATTN_CLI_VK_MEMBER)
#undef TREEATTN_CLI_VK_MEMBER

 private:
  void* loader_ = nullptr;  // the loader library, open while the functions are used
};

}  // namespace treeattn::cli
