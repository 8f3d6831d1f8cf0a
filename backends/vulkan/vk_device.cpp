#include "vk_device.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iterator>
#include <mutex>

#include "vk_check.hpp"

namespace treeattn::vulkan {
namespace {

std::atomic<int> g_validation_messages{0};

// `user` is the LogSink the instance keeps (the instance is never destroyed).
VKAPI_ATTR VkBool32 VKAPI_CALL on_validation_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                     VkDebugUtilsMessageTypeFlagsEXT,
                                                     const VkDebugUtilsMessengerCallbackDataEXT* data, void* user) {
  if (severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) {
    ++g_validation_messages;
    log_to(*static_cast<const LogSink*>(user), LogLevel::warning,
           fmt::format("treeattn: Vulkan validation: {}", data->pMessage));
  }
  return VK_FALSE;
}

bool has_layer(const char* name) {
  std::uint32_t count = 0;
  vkEnumerateInstanceLayerProperties(&count, nullptr);
  std::vector<VkLayerProperties> layers(count);
  vkEnumerateInstanceLayerProperties(&count, layers.data());
  return std::any_of(layers.begin(), layers.end(), [&](const VkLayerProperties& l) { return std::strcmp(l.layerName, name) == 0; });
}

std::vector<std::string> device_extensions(VkPhysicalDevice physical) {
  std::uint32_t count = 0;
  vkEnumerateDeviceExtensionProperties(physical, nullptr, &count, nullptr);
  std::vector<VkExtensionProperties> props(count);
  vkEnumerateDeviceExtensionProperties(physical, nullptr, &count, props.data());
  std::vector<std::string> names;
  for (const auto& p : props) names.emplace_back(p.extensionName);
  return names;
}

constexpr const char* kValidationLayer = "VK_LAYER_KHRONOS_validation";

}  // namespace

std::shared_ptr<Instance> Instance::get(bool validation, const LogSink& log) {
  // One instance per process, created on first use and never destroyed:
  //  * destroying the last instance makes the loader unload the driver, and
  //    loading NVIDIA's again takes static TLS that glibc does not give back:
  //    on the H100 a process built without CUDA (which keeps the driver loaded)
  //    finds "no driver" at about its 26th backend;
  //  * destroying it at exit crashes: NVIDIA's driver has torn itself down by
  //    then.
  // Devices, buffers and pipelines still go with their backends.
  static std::mutex mutex;
  static std::shared_ptr<Instance> shared;
  std::lock_guard<std::mutex> lock(mutex);
  if (!shared) shared = std::shared_ptr<Instance>(new Instance(validation, log), [](Instance*) {});
  if (validation && !shared->validation()) {
    throw Error(ErrorCategory::Backend,
                "Vulkan validation was asked for, but this process's instance was created without it: ask for it "
                "in the process's first Vulkan context");
  }
  return shared;
}

Instance::Instance(bool validation, const LogSink& log) : log_(log) {
  if (volkInitialize() != VK_SUCCESS) {
    throw Error(ErrorCategory::Backend,
                "no Vulkan loader (libvulkan.so.1) on this machine: install the Vulkan loader and a driver "
                "(Debian: libvulkan1 and mesa-vulkan-drivers), or use --backend cpu");
  }
  if (volkGetInstanceVersion() < VK_API_VERSION_1_2) {
    throw Error(ErrorCategory::Backend, "the Vulkan loader is older than 1.2: treeattn's shaders need Vulkan 1.2");
  }
  if (validation && !has_layer(kValidationLayer)) {
    throw Error(ErrorCategory::Backend,
                "Vulkan validation was asked for, but the Khronos validation layer is not installed "
                "(Debian: vulkan-validationlayers)");
  }
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "treeattn";
  app.apiVersion = VK_API_VERSION_1_3;
  VkInstanceCreateInfo info{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  info.pApplicationInfo = &app;
  const char* layers[] = {kValidationLayer};
  const char* extensions[] = {VK_EXT_DEBUG_UTILS_EXTENSION_NAME};
  VkDebugUtilsMessengerCreateInfoEXT messenger{VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
  messenger.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
  messenger.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                          VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
  messenger.pfnUserCallback = on_validation_message;
  messenger.pUserData = &log_;
  if (validation) {
    info.enabledLayerCount = 1;
    info.ppEnabledLayerNames = layers;
    info.enabledExtensionCount = 1;
    info.ppEnabledExtensionNames = extensions;
    info.pNext = &messenger;  // also reports on instance creation and destruction
  }
  const VkResult created = vkCreateInstance(&info, nullptr, &instance_);
  if (created == VK_ERROR_INCOMPATIBLE_DRIVER) {
    throw Error(ErrorCategory::Backend,
                "the Vulkan loader found no driver (no ICD, or its library did not load): install one (Debian: "
                "mesa-vulkan-drivers gives the lavapipe CPU device) or point VK_DRIVER_FILES at a driver's ICD json");
  }
  TREEATTN_VK_CHECK(created);
  volkLoadInstanceOnly(instance_);
  if (!validation) return;
  try {
    TREEATTN_VK_CHECK(vkCreateDebugUtilsMessengerEXT(instance_, &messenger, nullptr, &messenger_));
  } catch (const Error&) {
    vkDestroyInstance(instance_, nullptr);  // nothing else holds it: the next get() starts again
    throw;
  }
}

std::shared_ptr<Instance> Instance::borrow(VkInstance instance, PFN_vkGetInstanceProcAddr get_instance_proc_addr) {
  if (instance == VK_NULL_HANDLE || get_instance_proc_addr == nullptr) {
    throw Error(ErrorCategory::InvalidArgument, "Vulkan: the application's instance and vkGetInstanceProcAddr are required");
  }
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  volkInitializeCustom(get_instance_proc_addr);
  if (volkGetInstanceVersion() < VK_API_VERSION_1_2) {
    throw Error(ErrorCategory::Backend, "the application's Vulkan loader is older than 1.2: treeattn's shaders need Vulkan 1.2");
  }
  volkLoadInstanceOnly(instance);
  // Not destroyed here: the application owns it.
  return std::shared_ptr<Instance>(new Instance(instance), [](Instance* i) { delete i; });
}

int Instance::validation_messages() noexcept { return g_validation_messages.load(); }

bool DeviceCaps::has_coopmat_shape(std::uint32_t m, std::uint32_t n, std::uint32_t k, VkComponentTypeKHR a,
                                   VkComponentTypeKHR c) const noexcept {
  return std::any_of(coopmat_shapes.begin(), coopmat_shapes.end(), [&](const CoopmatShape& s) {
    return s.m == m && s.n == n && s.k == k && s.a == a && s.c == c;
  });
}

const char* DeviceCaps::type_name() const noexcept {
  switch (type) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete GPU";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated GPU";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual GPU";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "CPU";
    default: return "other";
  }
}

std::string DeviceCaps::scalar_unsupported() const {
  if (api_version < VK_API_VERSION_1_2) return "needs Vulkan 1.2";
  if (!buffer_device_address) return "needs the bufferDeviceAddress feature";
  if (!shader_int64) return "needs the shaderInt64 feature";
  if (!subgroup_shuffle || min_subgroup_size < 8) return "needs subgroup shuffles in compute shaders with subgroups of 8 or more";
  if (shared_memory_bytes < 16384) return "needs 16 KiB of shared memory";
  return "";
}

std::string DeviceCaps::coopmat_unsupported(bool bf16_inputs) const {
  if (std::string scalar = scalar_unsupported(); !scalar.empty()) return scalar;
  if (!coopmat) return "no VK_KHR_cooperative_matrix";
  const VkComponentTypeKHR a = bf16_inputs ? VK_COMPONENT_TYPE_BFLOAT16_KHR : VK_COMPONENT_TYPE_FLOAT16_KHR;
  if (!has_coopmat_shape(16, 16, 16, a, VK_COMPONENT_TYPE_FLOAT32_KHR)) {
    return bf16_inputs ? "no 16x16x16 bf16 x bf16 -> f32 cooperative matrix" : "no 16x16x16 f16 x f16 -> f32 cooperative matrix";
  }
  if (bf16_inputs && !bfloat16_coopmat) return "no VK_KHR_shader_bfloat16 with bfloat16 cooperative matrices";
  if (!shader_float16 || !storage_16bit) return "needs shaderFloat16 and storageBuffer16BitAccess";
  if (!vulkan_memory_model || !memory_model_device_scope) return "needs the Vulkan memory model (device scope)";
  if (!subgroup_size_control || !compute_full_subgroups || min_subgroup_size > 32 || max_subgroup_size < 32) {
    return "needs subgroup size control with full subgroups of 32";
  }
  if (!maintenance4) return "needs maintenance4";
  if (!subgroup_vote) return "needs subgroup votes in compute shaders";
  if (shared_memory_bytes < 32768) return "needs 32 KiB of shared memory";
  return "";
}

bool DeviceCaps::pipeline_cache_matches(const std::vector<char>& data) const noexcept {
  VkPipelineCacheHeaderVersionOne header{};
  if (data.size() < sizeof(header)) return false;
  std::memcpy(&header, data.data(), sizeof(header));
  return header.headerSize >= sizeof(header) && header.headerVersion == VK_PIPELINE_CACHE_HEADER_VERSION_ONE &&
         header.vendorID == vendor_id && header.deviceID == device_id &&
         std::equal(pipeline_cache_uuid.begin(), pipeline_cache_uuid.end(), header.pipelineCacheUUID);
}

std::vector<DeviceCaps> probe_devices(const Instance& instance) {
  std::uint32_t count = 0;
  TREEATTN_VK_CHECK(vkEnumeratePhysicalDevices(instance.handle(), &count, nullptr));
  std::vector<VkPhysicalDevice> physicals(count);
  TREEATTN_VK_CHECK(vkEnumeratePhysicalDevices(instance.handle(), &count, physicals.data()));

  std::vector<DeviceCaps> devices;
  for (std::uint32_t i = 0; i < count; ++i) devices.push_back(probe_device(instance, physicals[i], i));
  return devices;
}

DeviceCaps probe_device(const Instance& instance, VkPhysicalDevice physical, std::uint32_t index) {
  DeviceCaps c;
  c.index = index;
  c.physical = physical;
  const std::vector<std::string> extensions = device_extensions(c.physical);
  auto has_extension = [&](const char* name) { return std::find(extensions.begin(), extensions.end(), name) != extensions.end(); };

  VkPhysicalDeviceProperties basic{};
  vkGetPhysicalDeviceProperties(c.physical, &basic);
  c.api_version = basic.apiVersion;
  if (c.api_version < VK_API_VERSION_1_2) {  // the chained 1.1+ queries below need 1.2
    c.name = basic.deviceName;
    c.type = basic.deviceType;
    return c;
  }
  VkPhysicalDeviceProperties2 props{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  VkPhysicalDeviceSubgroupProperties subgroup{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceSubgroupSizeControlProperties size_control{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES};
  VkPhysicalDeviceMaintenance3Properties maintenance3{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
  VkPhysicalDeviceMaintenance4Properties maintenance4{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_4_PROPERTIES};
  VkPhysicalDeviceDriverProperties driver{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
  VkPhysicalDeviceIDProperties id{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES};
  VkPhysicalDeviceShaderSMBuiltinsPropertiesNV sm_builtins{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_SM_BUILTINS_PROPERTIES_NV};
  VkPhysicalDeviceShaderCorePropertiesAMD amd_cores{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CORE_PROPERTIES_AMD};
  props.pNext = &subgroup;
  subgroup.pNext = &maintenance3;
  maintenance3.pNext = &driver;
  driver.pNext = &id;
  void** props_end = &id.pNext;
  const bool v13 = c.api_version >= VK_API_VERSION_1_3;
  if (v13) {
    *props_end = &size_control;
    size_control.pNext = &maintenance4;
    props_end = &maintenance4.pNext;
  }
  const bool sm_count = has_extension(VK_NV_SHADER_SM_BUILTINS_EXTENSION_NAME);
  const bool amd_count = has_extension(VK_AMD_SHADER_CORE_PROPERTIES_EXTENSION_NAME);
  if (sm_count) {
    *props_end = &sm_builtins;
    props_end = &sm_builtins.pNext;
  }
  if (amd_count) *props_end = &amd_cores;
  vkGetPhysicalDeviceProperties2(c.physical, &props);
  std::copy(std::begin(id.deviceUUID), std::end(id.deviceUUID), c.device_uuid.begin());
  c.driver_version = props.properties.driverVersion;
  if (sm_count) {
    c.compute_units = sm_builtins.shaderSMCount;
  } else if (amd_count) {
    c.compute_units = amd_cores.shaderEngineCount * amd_cores.shaderArraysPerEngineCount * amd_cores.computeUnitsPerShaderArray;
  }
  c.name = props.properties.deviceName;
  c.vendor_id = props.properties.vendorID;
  c.device_id = props.properties.deviceID;
  std::copy(std::begin(props.properties.pipelineCacheUUID), std::end(props.properties.pipelineCacheUUID),
            c.pipeline_cache_uuid.begin());
  c.driver = fmt::format("{} {}", driver.driverName, driver.driverInfo);
  c.type = props.properties.deviceType;
  c.subgroup_size = subgroup.subgroupSize;
  c.min_subgroup_size = v13 ? size_control.minSubgroupSize : subgroup.subgroupSize;
  c.max_subgroup_size = v13 ? size_control.maxSubgroupSize : subgroup.subgroupSize;
  c.subgroup_shuffle = (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                       (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_SHUFFLE_BIT);
  c.subgroup_vote = (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                    (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_VOTE_BIT);
  c.shared_memory_bytes = props.properties.limits.maxComputeSharedMemorySize;
  c.max_storage_buffer_range = props.properties.limits.maxStorageBufferRange;
  c.max_work_groups[0] = props.properties.limits.maxComputeWorkGroupCount[0];
  c.max_work_groups[1] = props.properties.limits.maxComputeWorkGroupCount[1];
  c.max_work_groups[2] = props.properties.limits.maxComputeWorkGroupCount[2];
  c.max_allocation_bytes = maintenance3.maxMemoryAllocationSize;
  c.max_buffer_bytes = v13 ? maintenance4.maxBufferSize : maintenance3.maxMemoryAllocationSize;
  c.timestamp_period_ns = props.properties.limits.timestampPeriod;
  c.timestamps = props.properties.limits.timestampComputeAndGraphics;

  VkPhysicalDeviceFeatures2 features{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDeviceVulkan13Features f13{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES};
  VkPhysicalDeviceCooperativeMatrixFeaturesKHR fcm{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR};
  VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR fexec{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR};
  VkPhysicalDeviceShaderBfloat16FeaturesKHR fbf16{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_BFLOAT16_FEATURES_KHR};
  features.pNext = &f11;
  f11.pNext = &f12;
  if (v13) f12.pNext = &f13;
  void** chain_end = v13 ? &f13.pNext : &f12.pNext;
  const bool coopmat_extension = has_extension(VK_KHR_COOPERATIVE_MATRIX_EXTENSION_NAME);
  if (coopmat_extension) {
    *chain_end = &fcm;
    chain_end = &fcm.pNext;
  }
  const bool executable_extension = has_extension(VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
  if (executable_extension) {
    *chain_end = &fexec;
    chain_end = &fexec.pNext;
  }
  const bool bfloat16_extension = has_extension(VK_KHR_SHADER_BFLOAT16_EXTENSION_NAME);
  if (bfloat16_extension) *chain_end = &fbf16;
  vkGetPhysicalDeviceFeatures2(c.physical, &features);
  c.shader_int64 = features.features.shaderInt64;
  c.storage_16bit = f11.storageBuffer16BitAccess;
  c.buffer_device_address = f12.bufferDeviceAddress;
  c.shader_float16 = f12.shaderFloat16;
  c.vulkan_memory_model = f12.vulkanMemoryModel;
  c.memory_model_device_scope = f12.vulkanMemoryModelDeviceScope;
  c.subgroup_size_control = v13 && f13.subgroupSizeControl;
  c.compute_full_subgroups = v13 && f13.computeFullSubgroups;
  c.maintenance4 = v13 && f13.maintenance4;
  c.coopmat = coopmat_extension && fcm.cooperativeMatrix;
  c.bfloat16_coopmat = bfloat16_extension && fbf16.shaderBFloat16Type && fbf16.shaderBFloat16CooperativeMatrix;
  c.pipeline_statistics = executable_extension && fexec.pipelineExecutableInfo;

  if (c.coopmat) {
    auto get_shapes = reinterpret_cast<PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR>(
        vkGetInstanceProcAddr(instance.handle(), "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR"));
    std::uint32_t shape_count = 0;
    if (get_shapes && get_shapes(c.physical, &shape_count, nullptr) == VK_SUCCESS) {
      std::vector<VkCooperativeMatrixPropertiesKHR> shapes(shape_count, {VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR});
      get_shapes(c.physical, &shape_count, shapes.data());
      for (const auto& s : shapes) {
        if (s.scope == VK_SCOPE_SUBGROUP_KHR && s.AType == s.BType && s.CType == s.ResultType) {
          c.coopmat_shapes.push_back({s.MSize, s.NSize, s.KSize, s.AType, s.CType});
        }
      }
    }
  }

  VkPhysicalDeviceMemoryProperties memory{};
  vkGetPhysicalDeviceMemoryProperties(c.physical, &memory);
  for (std::uint32_t h = 0; h < memory.memoryHeapCount; ++h) {
    if (memory.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) c.device_local_bytes += memory.memoryHeaps[h].size;
  }
  return c;
}

const DeviceCaps& select_device(const std::vector<DeviceCaps>& devices, int requested) {
  if (devices.empty()) {
    throw Error(ErrorCategory::Backend,
                "no Vulkan device: the loader found no driver (Debian: mesa-vulkan-drivers gives the lavapipe CPU "
                "device; set VK_DRIVER_FILES to a driver's ICD json), or use --backend cpu");
  }
  if (requested >= 0) {
    if (std::size_t(requested) >= devices.size()) {
      throw Error(ErrorCategory::InvalidArgument,
                  fmt::format("Vulkan device {} does not exist: this machine has {} (0 to {}; `treeattn devices` lists them)",
                              requested, devices.size(), devices.size() - 1));
    }
    return devices[std::size_t(requested)];
  }
  for (VkPhysicalDeviceType type : {VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU, VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU,
                                    VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU, VK_PHYSICAL_DEVICE_TYPE_CPU}) {
    for (const DeviceCaps& d : devices) {
      if (d.type == type && d.scalar_unsupported().empty()) return d;
    }
  }
  return devices.front();
}

DeviceCaps enabled_caps(DeviceCaps caps, const void* enabled_features, const char* const* extensions,
                        std::uint32_t extension_count) {
  auto enabled_extension = [&](const char* name) {
    for (std::uint32_t e = 0; e < extension_count; ++e) {
      if (std::strcmp(extensions[e], name) == 0) return true;
    }
    return false;
  };
  bool int64 = false, storage16 = false, bda = false, float16 = false, memory_model = false, device_scope = false,
       size_control = false, full_subgroups = false, maintenance4 = false, coopmat = false, bf16_type = false,
       bf16_coopmat = false, executables = false;
  // Each struct of the chain, by its type: the core 1.1/1.2/1.3 ones and the
  // per-extension ones they absorbed (an application may give either).
  // (switch on the integer: older headers' enum lacks the newer structs' values)
  for (auto* s = static_cast<const VkBaseInStructure*>(enabled_features); s != nullptr; s = s->pNext) {
    switch (std::uint32_t(s->sType)) {
      case std::uint32_t(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2):
        int64 |= reinterpret_cast<const VkPhysicalDeviceFeatures2*>(s)->features.shaderInt64 != 0;
        break;
      case std::uint32_t(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES):
        storage16 |= reinterpret_cast<const VkPhysicalDeviceVulkan11Features*>(s)->storageBuffer16BitAccess != 0;
        break;
      case std::uint32_t(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES):
        storage16 |= reinterpret_cast<const VkPhysicalDevice16BitStorageFeatures*>(s)->storageBuffer16BitAccess != 0;
        break;
      case std::uint32_t(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES): {
        const auto* f = reinterpret_cast<const VkPhysicalDeviceVulkan12Features*>(s);
        bda |= f->bufferDeviceAddress != 0;
        float16 |= f->shaderFloat16 != 0;
        memory_model |= f->vulkanMemoryModel != 0;
        device_scope |= f->vulkanMemoryModelDeviceScope != 0;
        break;
      }
      case std::uint32_t(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_BUFFER_DEVICE_ADDRESS_FEATURES):
        bda |= reinterpret_cast<const VkPhysicalDeviceBufferDeviceAddressFeatures*>(s)->bufferDeviceAddress != 0;
        break;
      case std::uint32_t(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES):
        float16 |= reinterpret_cast<const VkPhysicalDeviceShaderFloat16Int8Features*>(s)->shaderFloat16 != 0;
        break;
      case std::uint32_t(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES): {
        const auto* f = reinterpret_cast<const VkPhysicalDeviceVulkanMemoryModelFeatures*>(s);
        memory_model |= f->vulkanMemoryModel != 0;
        device_scope |= f->vulkanMemoryModelDeviceScope != 0;
        break;
      }
      case std::uint32_t(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES): {
        const auto* f = reinterpret_cast<const VkPhysicalDeviceVulkan13Features*>(s);
        size_control |= f->subgroupSizeControl != 0;
        full_subgroups |= f->computeFullSubgroups != 0;
        maintenance4 |= f->maintenance4 != 0;
        break;
      }
      case std::uint32_t(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES): {
        const auto* f = reinterpret_cast<const VkPhysicalDeviceSubgroupSizeControlFeatures*>(s);
        size_control |= f->subgroupSizeControl != 0;
        full_subgroups |= f->computeFullSubgroups != 0;
        break;
      }
      case std::uint32_t(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_4_FEATURES):
        maintenance4 |= reinterpret_cast<const VkPhysicalDeviceMaintenance4Features*>(s)->maintenance4 != 0;
        break;
      case std::uint32_t(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR):
        coopmat |= reinterpret_cast<const VkPhysicalDeviceCooperativeMatrixFeaturesKHR*>(s)->cooperativeMatrix != 0;
        break;
      case std::uint32_t(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_BFLOAT16_FEATURES_KHR): {
        const auto* f = reinterpret_cast<const VkPhysicalDeviceShaderBfloat16FeaturesKHR*>(s);
        bf16_type |= f->shaderBFloat16Type != 0;
        bf16_coopmat |= f->shaderBFloat16CooperativeMatrix != 0;
        break;
      }
      case std::uint32_t(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR):
        executables |= reinterpret_cast<const VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR*>(s)->pipelineExecutableInfo != 0;
        break;
      default:
        break;
    }
  }
  caps.shader_int64 = caps.shader_int64 && int64;
  caps.storage_16bit = caps.storage_16bit && storage16;
  caps.buffer_device_address = caps.buffer_device_address && bda;
  caps.shader_float16 = caps.shader_float16 && float16;
  caps.vulkan_memory_model = caps.vulkan_memory_model && memory_model;
  caps.memory_model_device_scope = caps.memory_model_device_scope && device_scope;
  caps.subgroup_size_control = caps.subgroup_size_control && size_control;
  caps.compute_full_subgroups = caps.compute_full_subgroups && full_subgroups;
  caps.maintenance4 = caps.maintenance4 && maintenance4;
  caps.coopmat = caps.coopmat && coopmat && enabled_extension(VK_KHR_COOPERATIVE_MATRIX_EXTENSION_NAME);
  caps.bfloat16_coopmat = caps.bfloat16_coopmat && bf16_type && bf16_coopmat &&
                          enabled_extension(VK_KHR_SHADER_BFLOAT16_EXTENSION_NAME);
  caps.pipeline_statistics = caps.pipeline_statistics && executables &&
                             enabled_extension(VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
  return caps;
}

FeatureChain::FeatureChain(const DeviceCaps& caps) {
  features.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2;
  v11.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES;
  v12.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES;
  v13.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES;
  coopmat.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR;
  executables.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR;
  bfloat16.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_BFLOAT16_FEATURES_KHR;
  const bool with_coopmat = caps.coopmat_unsupported(false).empty();
  features.features.shaderInt64 = caps.shader_int64;
  v11.storageBuffer16BitAccess = caps.storage_16bit;
  v12.bufferDeviceAddress = caps.buffer_device_address;
  v12.shaderFloat16 = caps.shader_float16;
  v12.vulkanMemoryModel = caps.vulkan_memory_model;
  v12.vulkanMemoryModelDeviceScope = caps.memory_model_device_scope;
  v13.subgroupSizeControl = caps.subgroup_size_control;
  v13.computeFullSubgroups = caps.compute_full_subgroups;
  v13.maintenance4 = caps.maintenance4;
  coopmat.cooperativeMatrix = VK_TRUE;
  executables.pipelineExecutableInfo = VK_TRUE;
  bfloat16.shaderBFloat16Type = VK_TRUE;
  bfloat16.shaderBFloat16CooperativeMatrix = VK_TRUE;
  features.pNext = &v11;
  v11.pNext = &v12;
  if (caps.api_version >= VK_API_VERSION_1_3) v12.pNext = &v13;
  void** chain_end = caps.api_version >= VK_API_VERSION_1_3 ? &v13.pNext : &v12.pNext;
  if (with_coopmat) {
    *chain_end = &coopmat;
    chain_end = &coopmat.pNext;
    extensions.push_back(VK_KHR_COOPERATIVE_MATRIX_EXTENSION_NAME);
  }
  if (caps.pipeline_statistics) {
    *chain_end = &executables;
    chain_end = &executables.pNext;
    extensions.push_back(VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
  }
  if (with_coopmat && caps.coopmat_unsupported(true).empty()) {
    *chain_end = &bfloat16;
    extensions.push_back(VK_KHR_SHADER_BFLOAT16_EXTENSION_NAME);
  }
}

namespace {

// A compute family with timestamps, preferring one without graphics (a dedicated compute engine).
std::uint32_t compute_family(const DeviceCaps& caps) {
  std::uint32_t family_count = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(caps.physical, &family_count, nullptr);
  std::vector<VkQueueFamilyProperties> families(family_count);
  vkGetPhysicalDeviceQueueFamilyProperties(caps.physical, &family_count, families.data());
  int chosen = -1;
  for (std::uint32_t f = 0; f < family_count; ++f) {
    if (!(families[f].queueFlags & VK_QUEUE_COMPUTE_BIT) || families[f].timestampValidBits == 0) continue;
    if (chosen < 0 || !(families[f].queueFlags & VK_QUEUE_GRAPHICS_BIT)) chosen = int(f);
    if (!(families[f].queueFlags & VK_QUEUE_GRAPHICS_BIT)) break;
  }
  if (chosen < 0) throw Error(ErrorCategory::Backend, fmt::format("Vulkan device {} has no compute queue with timestamps", caps.name));
  return std::uint32_t(chosen);
}

void require_scalar(const DeviceCaps& caps, const char* whose) {
  if (std::string why = caps.scalar_unsupported(); !why.empty()) {
    throw Error(ErrorCategory::Backend, fmt::format("Vulkan device {} ({}{}) cannot run treeattn's shaders: {}", caps.index,
                                                    caps.name, whose, why));
  }
}

}  // namespace

Device::Device(std::shared_ptr<Instance> instance, const DeviceCaps& caps) : instance_(std::move(instance)), caps_(caps) {
  require_scalar(caps, "");
  queue_family_ = compute_family(caps);
  const FeatureChain chain(caps);
  const float priority = 1.0f;
  VkDeviceQueueCreateInfo queue_info{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  queue_info.queueFamilyIndex = queue_family_;
  queue_info.queueCount = 1;
  queue_info.pQueuePriorities = &priority;
  VkDeviceCreateInfo info{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  info.pNext = &chain.features;
  info.queueCreateInfoCount = 1;
  info.pQueueCreateInfos = &queue_info;
  info.enabledExtensionCount = std::uint32_t(chain.extensions.size());
  info.ppEnabledExtensionNames = chain.extensions.data();
  TREEATTN_VK_CHECK(vkCreateDevice(caps.physical, &info, nullptr, &device_));
  volkLoadDevice(device_);
  vkGetDeviceQueue(device_, queue_family_, 0, &queue_);
  vkGetPhysicalDeviceMemoryProperties(caps.physical, &memory_);
}

Device::Device(std::shared_ptr<Instance> instance, const DeviceCaps& caps, VkDevice borrowed, std::uint32_t queue_family,
               VkQueue queue)
    : instance_(std::move(instance)), caps_(caps), device_(borrowed), owned_(false), queue_(queue),
      queue_family_(queue_family) {
  require_scalar(caps, ", as the application enabled it");
  volkLoadDevice(device_);
  vkGetPhysicalDeviceMemoryProperties(caps.physical, &memory_);
}

Device::~Device() {
  if (owned_ && device_ != VK_NULL_HANDLE) vkDestroyDevice(device_, nullptr);
}

std::uint32_t Device::memory_type(std::uint32_t type_bits, VkMemoryPropertyFlags required, VkMemoryPropertyFlags preferred) const {
  for (VkMemoryPropertyFlags want : {required | preferred, required}) {
    for (std::uint32_t t = 0; t < memory_.memoryTypeCount; ++t) {
      if ((type_bits & (1u << t)) && (memory_.memoryTypes[t].propertyFlags & want) == want) return t;
    }
  }
  throw Error(ErrorCategory::Backend, fmt::format("Vulkan device {} has no memory type with flags {:#x}", caps_.name, required));
}

}  // namespace treeattn::vulkan
