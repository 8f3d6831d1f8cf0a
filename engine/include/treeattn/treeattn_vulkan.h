/* treeattn's C API on the application's Vulkan device: a context whose
 * treeattn_enqueue records into the application's command buffers
 * (treeattn/vulkan.hpp documents the barriers and lifetimes). Needs the Vulkan
 * headers. */
#ifndef TREEATTN_TREEATTN_VULKAN_H
#define TREEATTN_TREEATTN_VULKAN_H

#include <vulkan/vulkan_core.h>

#include "treeattn/treeattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The application's device, as it created it: enabled_features is the pNext
 * chain it gave vkCreateDevice and enabled_extensions its extension names, so
 * treeattn uses only what was enabled. `queue` (of queue_family) is used only
 * while the context is created, and may be NULL. */
typedef struct treeattn_vulkan_device {
  size_t struct_size; /* sizeof(treeattn_vulkan_device) */
  VkInstance instance;
  VkPhysicalDevice physical_device;
  VkDevice device;
  uint32_t queue_family;
  VkQueue queue;
  PFN_vkGetInstanceProcAddr get_instance_proc_addr;
  const void* enabled_features;
  const VkPhysicalDeviceFeatures* enabled_core_features; /* VkDeviceCreateInfo::pEnabledFeatures, or NULL */
  const char* const* enabled_extensions;
  uint32_t enabled_extension_count;
} treeattn_vulkan_device;

/* A context on that device (options: the variant, verbose and the log; its
 * backend and device fields are ignored). treeattn_enqueue then takes buffer
 * device addresses and the VkCommandBuffer being recorded. */
TREEATTN_C_API treeattn_status treeattn_context_create_vulkan(const treeattn_vulkan_device* device,
                                                              const treeattn_context_options* options,
                                                              treeattn_context** out);

#ifdef __cplusplus
}
#endif

#endif /* TREEATTN_TREEATTN_VULKAN_H */
