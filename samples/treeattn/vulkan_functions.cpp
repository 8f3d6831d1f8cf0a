#include "vulkan_functions.hpp"

#ifdef _WIN32
#include <windows.h>
#else
#include <dlfcn.h>
#endif

#include <fmt/format.h>

#include "treeattn/error.hpp"

namespace treeattn::cli {
namespace {

#ifdef _WIN32
constexpr const char* kLoaderNames[] = {"vulkan-1.dll"};
void* open_library(const char* name) { return reinterpret_cast<void*>(LoadLibraryA(name)); }
void* symbol(void* library, const char* name) {
  return reinterpret_cast<void*>(GetProcAddress(static_cast<HMODULE>(library), name));
}
void close_library(void* library) { FreeLibrary(static_cast<HMODULE>(library)); }
#else
constexpr const char* kLoaderNames[] = {"libvulkan.so.1", "libvulkan.so"};
void* open_library(const char* name) { return dlopen(name, RTLD_NOW | RTLD_LOCAL); }
void* symbol(void* library, const char* name) { return dlsym(library, name); }
void close_library(void* library) { dlclose(library); }
#endif

template <typename Pfn>
Pfn loader_function(void* loader, const char* name) {
  void* f = symbol(loader, name);
  if (f == nullptr) throw Error(ErrorCategory::Backend, fmt::format("demo: the Vulkan loader exports no {}", name));
  return reinterpret_cast<Pfn>(f);
}

}  // namespace

VulkanFunctions::VulkanFunctions(VkDevice device) {
  for (const char* name : kLoaderNames) {
    if ((loader_ = open_library(name)) != nullptr) break;
  }
  if (loader_ == nullptr) {
    throw Error(ErrorCategory::Backend, fmt::format("demo: cannot open the Vulkan loader ({})", kLoaderNames[0]));
  }
  try {
    GetPhysicalDeviceProperties = loader_function<PFN_vkGetPhysicalDeviceProperties>(loader_, "vkGetPhysicalDeviceProperties");
    GetPhysicalDeviceMemoryProperties =
        loader_function<PFN_vkGetPhysicalDeviceMemoryProperties>(loader_, "vkGetPhysicalDeviceMemoryProperties");
    GetPhysicalDeviceMemoryProperties2 =
        loader_function<PFN_vkGetPhysicalDeviceMemoryProperties2>(loader_, "vkGetPhysicalDeviceMemoryProperties2");
    EnumerateDeviceExtensionProperties =
        loader_function<PFN_vkEnumerateDeviceExtensionProperties>(loader_, "vkEnumerateDeviceExtensionProperties");
    GetPhysicalDeviceQueueFamilyProperties =
        loader_function<PFN_vkGetPhysicalDeviceQueueFamilyProperties>(loader_, "vkGetPhysicalDeviceQueueFamilyProperties");
    const auto get_device_proc_addr = loader_function<PFN_vkGetDeviceProcAddr>(loader_, "vkGetDeviceProcAddr");
    auto device_function = [&](const char* name) {
      const PFN_vkVoidFunction f = get_device_proc_addr(device, name);
      if (f == nullptr) throw Error(ErrorCategory::Backend, fmt::format("demo: the Vulkan device has no {}", name));
      return f;
    };
#define TREEATTN_CLI_VK_LOAD(name) name = reinterpret_cast<PFN_vk##name>(device_function("vk" #name));
    TREEATTN_CLI_VK_DEVICE_FUNCTIONS(TREEATTN_CLI_VK_LOAD)
#undef TREEATTN_CLI_VK_LOAD
  } catch (...) {
    close_library(loader_);
    throw;
  }
}

VulkanFunctions::~VulkanFunctions() { close_library(loader_); }

}  // namespace treeattn::cli
