// treeattn inside a Vulkan application: the application creates its own
// instance and device (with the features treeattn asks for), allocates and
// fills its Q, K and V buffers, and records treeattn's attention into its own
// command buffer between its own commands; then it checks O against treeattn's
// CPU backend. Two decode steps: the second tree has grown and forked.
//
//   vulkan_embed              the first GPU (else lavapipe)
//   TREEATTN_VK_VALIDATION=1  with the Khronos validation layer; any message fails
//
// Exit status: 0 when O matches, 1 on a mismatch or error, 77 without a Vulkan device.

#include <vulkan/vulkan.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "treeattn/tools.hpp"
#include "treeattn/treeattn.hpp"
#include "treeattn/vulkan.hpp"

namespace {

int g_validation_messages = 0;

VKAPI_ATTR VkBool32 VKAPI_CALL on_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity, VkDebugUtilsMessageTypeFlagsEXT,
                                          const VkDebugUtilsMessengerCallbackDataEXT* data, void*) {
  if (severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) {
    ++g_validation_messages;
    std::fprintf(stderr, "validation: %s\n", data->pMessage);
  }
  return VK_FALSE;
}

void check(VkResult result, const char* what) {
  if (result != VK_SUCCESS) throw std::runtime_error(std::string(what) + " failed: VkResult " + std::to_string(result));
}

// The application's side: a buffer of its own with device-address usage.
struct AppBuffer {
  VkDevice device = VK_NULL_HANDLE;
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  void* mapped = nullptr;

  AppBuffer(VkPhysicalDevice physical, VkDevice d, VkDeviceSize bytes, bool host_visible) : device(d) {
    VkBufferCreateInfo info{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    info.size = bytes;
    info.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT |
                 VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    check(vkCreateBuffer(device, &info, nullptr, &buffer), "vkCreateBuffer");
    VkMemoryRequirements needs{};
    vkGetBufferMemoryRequirements(device, buffer, &needs);
    VkPhysicalDeviceMemoryProperties props{};
    vkGetPhysicalDeviceMemoryProperties(physical, &props);
    const VkMemoryPropertyFlags want = host_visible
                                           ? VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
                                           : VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
    std::uint32_t type = 0;
    while (type < props.memoryTypeCount &&
           (!(needs.memoryTypeBits & (1u << type)) || (props.memoryTypes[type].propertyFlags & want) != want)) {
      ++type;
    }
    if (type == props.memoryTypeCount) throw std::runtime_error("no suitable memory type");
    VkMemoryAllocateFlagsInfo flags{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO};
    flags.flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT;
    VkMemoryAllocateInfo allocate{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    allocate.pNext = &flags;
    allocate.allocationSize = needs.size;
    allocate.memoryTypeIndex = type;
    check(vkAllocateMemory(device, &allocate, nullptr, &memory), "vkAllocateMemory");
    check(vkBindBufferMemory(device, buffer, memory, 0), "vkBindBufferMemory");
    if (host_visible) check(vkMapMemory(device, memory, 0, VK_WHOLE_SIZE, 0, &mapped), "vkMapMemory");
  }
  ~AppBuffer() {
    vkDestroyBuffer(device, buffer, nullptr);
    vkFreeMemory(device, memory, nullptr);
  }
  AppBuffer(const AppBuffer&) = delete;
  AppBuffer& operator=(const AppBuffer&) = delete;
};

void barrier(VkCommandBuffer commands, VkPipelineStageFlags from, VkAccessFlags from_access, VkPipelineStageFlags to,
             VkAccessFlags to_access) {
  VkMemoryBarrier memory{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  memory.srcAccessMask = from_access;
  memory.dstAccessMask = to_access;
  vkCmdPipelineBarrier(commands, from, to, 0, 1, &memory, 0, nullptr, 0, nullptr);
}

// One decode step's tree: a shared prompt, `branches` continuations, and a
// causal draft query on the last branch.
treeattn::Tree step_tree(const treeattn::HeadConfig& heads, int branches, int generated) {
  treeattn::Tree tree(heads);
  tree.add_node_range(0, treeattn::kNoParent, 0, 700);
  for (int b = 0; b < branches; ++b) {
    tree.add_node_range(1 + b, 0, 700 + b * 64, generated);
    tree.add_query(1 + b);
  }
  tree.add_query(branches, generated / 2);
  return tree;
}

}  // namespace

int main() {
  const bool validation = [] {
    const char* v = std::getenv("TREEATTN_VK_VALIDATION");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  VkInstance instance = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger = VK_NULL_HANDLE;
  VkDevice device = VK_NULL_HANDLE;
  VkCommandPool pool = VK_NULL_HANDLE;
  VkFence fence = VK_NULL_HANDLE;
  int status = 1;
  try {
    // --- the application's instance and device ---------------------------
    VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
    app.pApplicationName = "vulkan_embed";
    app.apiVersion = VK_API_VERSION_1_3;
    VkDebugUtilsMessengerCreateInfoEXT messages{VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
    messages.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
    messages.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT;
    messages.pfnUserCallback = on_message;
    const char* layer = "VK_LAYER_KHRONOS_validation";
    const char* debug_utils = VK_EXT_DEBUG_UTILS_EXTENSION_NAME;
    VkInstanceCreateInfo instance_info{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
    instance_info.pApplicationInfo = &app;
    if (validation) {
      instance_info.enabledLayerCount = 1;
      instance_info.ppEnabledLayerNames = &layer;
      instance_info.enabledExtensionCount = 1;
      instance_info.ppEnabledExtensionNames = &debug_utils;
      instance_info.pNext = &messages;
    }
    if (vkCreateInstance(&instance_info, nullptr, &instance) != VK_SUCCESS) {
      std::printf("vulkan_embed: no Vulkan instance here: skipping\n");
      return 77;
    }
    if (validation) {
      auto create = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
          vkGetInstanceProcAddr(instance, "vkCreateDebugUtilsMessengerEXT"));
      check(create(instance, &messages, nullptr, &messenger), "vkCreateDebugUtilsMessengerEXT");
    }
    std::uint32_t count = 0;
    vkEnumeratePhysicalDevices(instance, &count, nullptr);
    std::vector<VkPhysicalDevice> physicals(count);
    vkEnumeratePhysicalDevices(instance, &count, physicals.data());
    VkPhysicalDevice physical = VK_NULL_HANDLE;
    for (VkPhysicalDevice p : physicals) {  // a GPU first, else whatever there is (lavapipe)
      VkPhysicalDeviceProperties props{};
      vkGetPhysicalDeviceProperties(p, &props);
      if (physical == VK_NULL_HANDLE || props.deviceType == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU) physical = p;
    }
    if (physical == VK_NULL_HANDLE) {
      std::printf("vulkan_embed: no Vulkan device here: skipping\n");
      vkDestroyInstance(instance, nullptr);
      return 77;
    }
    VkPhysicalDeviceProperties props{};
    vkGetPhysicalDeviceProperties(physical, &props);

    // What treeattn asks of the device, enabled with the application's own needs.
    const auto wanted = treeattn::vulkan::device_requirements(instance, physical, vkGetInstanceProcAddr);
    std::uint32_t families = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(physical, &families, nullptr);
    std::vector<VkQueueFamilyProperties> family_props(families);
    vkGetPhysicalDeviceQueueFamilyProperties(physical, &families, family_props.data());
    std::uint32_t family = 0;
    while (family < families && !(family_props[family].queueFlags & VK_QUEUE_COMPUTE_BIT)) ++family;
    const float priority = 1.0f;
    VkDeviceQueueCreateInfo queue_info{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
    queue_info.queueFamilyIndex = family;
    queue_info.queueCount = 1;
    queue_info.pQueuePriorities = &priority;
    VkDeviceCreateInfo device_info{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
    device_info.pNext = &wanted->features;
    device_info.queueCreateInfoCount = 1;
    device_info.pQueueCreateInfos = &queue_info;
    device_info.enabledExtensionCount = std::uint32_t(wanted->extensions.size());
    device_info.ppEnabledExtensionNames = wanted->extensions.data();
    check(vkCreateDevice(physical, &device_info, nullptr, &device), "vkCreateDevice");
    VkQueue queue = VK_NULL_HANDLE;
    vkGetDeviceQueue(device, family, 0, &queue);

    // --- treeattn on that device -----------------------------------------
    treeattn::vulkan::ExternalDevice external;
    external.instance = instance;
    external.physical_device = physical;
    external.device = device;
    external.queue_family = family;
    external.queue = queue;
    external.get_instance_proc_addr = vkGetInstanceProcAddr;
    external.enabled_features = &wanted->features;
    external.enabled_extensions = wanted->extensions.data();
    external.enabled_extension_count = std::uint32_t(wanted->extensions.size());
    const treeattn::vulkan::Context context(external);
    treeattn::vulkan::Workspace workspace(context, treeattn::DType::f16);
    const treeattn::HeadConfig heads{16, 4, 128, 0.0f};
    std::printf("vulkan_embed: %s, %s\n", props.deviceName, context.variant(treeattn::DType::f16, heads.head_dim).c_str());

    // The application's buffers, sized for the larger step.
    const std::int64_t max_queries = 9, slots = 700 + 8 * 64, row = heads.heads_q * heads.head_dim;
    const std::int64_t kv_row = heads.heads_kv * heads.head_dim;
    AppBuffer q(physical, device, max_queries * row * 2, false), k(physical, device, slots * kv_row * 2, false),
        v(physical, device, slots * kv_row * 2, false), o(physical, device, max_queries * row * 4, false),
        lse(physical, device, max_queries * heads.heads_q * 4, false),
        upload(physical, device, (max_queries * row + 2 * slots * kv_row) * 2, true),
        readback(physical, device, max_queries * row * 4 + max_queries * heads.heads_q * 4, true);
    VkCommandPoolCreateInfo pool_info{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pool_info.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    pool_info.queueFamilyIndex = family;
    check(vkCreateCommandPool(device, &pool_info, nullptr, &pool), "vkCreateCommandPool");
    VkCommandBuffer commands = VK_NULL_HANDLE;
    VkCommandBufferAllocateInfo allocate{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    allocate.commandPool = pool;
    allocate.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    allocate.commandBufferCount = 1;
    check(vkAllocateCommandBuffers(device, &allocate, &commands), "vkAllocateCommandBuffers");
    VkFenceCreateInfo fence_info{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    check(vkCreateFence(device, &fence_info, nullptr, &fence), "vkCreateFence");

    treeattn::PlanOptions options;
    options.cost = context.cost_model();
    treeattn::ContextOptions on_cpu;
    on_cpu.backend = treeattn::BackendKind::cpu;
    treeattn::Context cpu(on_cpu);  // the reference
    double worst = 0.0;
    for (int step = 0; step < 2; ++step) {
      const treeattn::Tree tree = step_tree(heads, step == 0 ? 5 : 8, step == 0 ? 20 : 40);
      const treeattn::Plan plan = treeattn::plan(tree, options);
      const std::int64_t nq = plan.num_queries;
      // The application's data: Q, K and V in its upload buffer.
      treeattn::HostArray hq = treeattn::random_array(treeattn::DType::f16, {nq, heads.heads_q, heads.head_dim}, 10 + step);
      treeattn::HostArray hk = treeattn::random_array(treeattn::DType::f16, {slots, heads.heads_kv, heads.head_dim}, 20 + step);
      treeattn::HostArray hv = treeattn::random_array(treeattn::DType::f16, {slots, heads.heads_kv, heads.head_dim}, 30 + step);
      auto* up = static_cast<unsigned char*>(upload.mapped);
      std::memcpy(up, hq.bytes.data(), hq.bytes.size());
      std::memcpy(up + max_queries * row * 2, hk.bytes.data(), hk.bytes.size());
      std::memcpy(up + max_queries * row * 2 + slots * kv_row * 2, hv.bytes.data(), hv.bytes.size());

      VkCommandBufferBeginInfo begin{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
      check(vkBeginCommandBuffer(commands, &begin), "vkBeginCommandBuffer");
      // Its own work before: copy Q, K and V up, fill O with a pattern.
      const VkBufferCopy copy_q{0, 0, VkDeviceSize(hq.bytes.size())};
      const VkBufferCopy copy_k{VkDeviceSize(max_queries * row * 2), 0, VkDeviceSize(hk.bytes.size())};
      const VkBufferCopy copy_v{VkDeviceSize(max_queries * row * 2 + slots * kv_row * 2), 0, VkDeviceSize(hv.bytes.size())};
      vkCmdCopyBuffer(commands, upload.buffer, q.buffer, 1, &copy_q);
      vkCmdCopyBuffer(commands, upload.buffer, k.buffer, 1, &copy_k);
      vkCmdCopyBuffer(commands, upload.buffer, v.buffer, 1, &copy_v);
      vkCmdFillBuffer(commands, o.buffer, 0, VK_WHOLE_SIZE, 0x7fc00000u);
      // The barrier the caller owes: its writes visible to treeattn's shaders.
      barrier(commands, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
              VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
      // treeattn: the plan's upload, then one attention call.
      workspace.upload(plan, commands);
      using treeattn::vulkan::Tensor;
      workspace.record(commands, {Tensor{q.buffer, 0, treeattn::DType::f16, {nq, heads.heads_q, heads.head_dim}},
                                  Tensor{k.buffer, 0, treeattn::DType::f16, {slots, heads.heads_kv, heads.head_dim}},
                                  Tensor{v.buffer, 0, treeattn::DType::f16, {slots, heads.heads_kv, heads.head_dim}},
                                  Tensor{o.buffer, 0, treeattn::DType::f32, {nq, heads.heads_q, heads.head_dim}},
                                  Tensor{lse.buffer, 0, treeattn::DType::f32, {nq, heads.heads_q}}});
      // The barrier the caller owes after: treeattn's O and LSE visible to its own work (a copy back).
      barrier(commands, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
              VK_ACCESS_TRANSFER_READ_BIT);
      const VkBufferCopy copy_o{0, 0, VkDeviceSize(nq * row * 4)};
      const VkBufferCopy copy_lse{0, VkDeviceSize(max_queries * row * 4), VkDeviceSize(nq * heads.heads_q * 4)};
      vkCmdCopyBuffer(commands, o.buffer, readback.buffer, 1, &copy_o);
      vkCmdCopyBuffer(commands, lse.buffer, readback.buffer, 1, &copy_lse);
      check(vkEndCommandBuffer(commands), "vkEndCommandBuffer");
      VkSubmitInfo submit{VK_STRUCTURE_TYPE_SUBMIT_INFO};
      submit.commandBufferCount = 1;
      submit.pCommandBuffers = &commands;
      check(vkQueueSubmit(queue, 1, &submit, fence), "vkQueueSubmit");
      check(vkWaitForFences(device, 1, &fence, VK_TRUE, UINT64_MAX), "vkWaitForFences");
      check(vkResetFences(device, 1, &fence), "vkResetFences");

      // The same call on the CPU backend.
      treeattn::HostArray want_o(treeattn::DType::f32, {nq, heads.heads_q, heads.head_dim});
      treeattn::HostArray want_lse(treeattn::DType::f32, {nq, heads.heads_q});
      cpu.run(plan, {hq.view(), hk.view(), hv.view(), want_o.view(), want_lse.view()});
      const auto* got = static_cast<const float*>(readback.mapped);
      const auto* got_lse = got + max_queries * row;
      const auto* w = reinterpret_cast<const float*>(want_o.bytes.data());
      const auto* wl = reinterpret_cast<const float*>(want_lse.bytes.data());
      for (std::int64_t i = 0; i < nq * row; ++i) worst = std::max(worst, double(std::fabs(got[i] - w[i])));
      for (std::int64_t i = 0; i < nq * heads.heads_q; ++i) worst = std::max(worst, double(std::fabs(got_lse[i] - wl[i])));
      if (std::isnan(worst)) worst = INFINITY;
    }
    std::printf("vulkan_embed: 2 steps, max abs error against the CPU backend %.2e (tolerance 2e-3)\n", worst);
    if (validation) std::printf("vulkan_embed: %d validation messages\n", g_validation_messages);
    status = worst <= 2e-3 && g_validation_messages == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vulkan_embed: error: %s\n", e.what());
    status = 1;
  }
  // treeattn's objects went with the context and workspace above; the device and instance are the application's.
  if (device != VK_NULL_HANDLE) {
    vkDeviceWaitIdle(device);
    if (fence != VK_NULL_HANDLE) vkDestroyFence(device, fence, nullptr);
    if (pool != VK_NULL_HANDLE) vkDestroyCommandPool(device, pool, nullptr);
    vkDestroyDevice(device, nullptr);
  }
  if (messenger != VK_NULL_HANDLE) {
    auto destroy = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance, "vkDestroyDebugUtilsMessengerEXT"));
    destroy(instance, messenger, nullptr);
  }
  if (instance != VK_NULL_HANDLE) vkDestroyInstance(instance, nullptr);
  if (validation && g_validation_messages > 0) status = 1;
  return status;
}
