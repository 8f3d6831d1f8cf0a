#pragma once
// The Vulkan instance, what each physical device can do (probed once), and the
// logical device treeattn computes on: one compute queue, the features the
// chosen shader variant needs, and memory-type selection.

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "treeattn/log.hpp"
#include "vk_api.hpp"

namespace treeattn::vulkan {

// The process-wide instance. `validation` enables the Khronos validation layer
// when the instance is created; its warnings and errors are counted and go to
// the creator's log sink as warnings.
class Instance {
 public:
  // The process's instance, created on first use and never destroyed (the
  // .cpp says why): the first call's `validation` and `log` decide, and the
  // instance keeps that sink for the process's life (it may be called from any
  // thread that makes Vulkan calls). Throws Backend when no Vulkan loader or no
  // Vulkan 1.2 implementation exists; the next call then tries again.
  // Throws Backend when validation is asked of an instance made without it.
  static std::shared_ptr<Instance> get(bool validation = false, const LogSink& log = {});
  // The application's instance, used as it is (never destroyed here): volk
  // loads its functions through `get_instance_proc_addr`. Throws Backend when
  // it is older than Vulkan 1.2.
  static std::shared_ptr<Instance> borrow(VkInstance instance, PFN_vkGetInstanceProcAddr get_instance_proc_addr);
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  VkInstance handle() const noexcept { return instance_; }
  bool validation() const noexcept { return messenger_ != VK_NULL_HANDLE; }
  // Validation warnings and errors reported so far in this process.
  static int validation_messages() noexcept;

 private:
  Instance(bool validation, const LogSink& log);
  explicit Instance(VkInstance borrowed) : instance_(borrowed) {}
  LogSink log_;  // where validation messages go
  VkInstance instance_ = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
};

struct CoopmatShape {
  std::uint32_t m, n, k;
  VkComponentTypeKHR a, c;  // A/B element type and accumulator type
};

// What treeattn needs to know of a physical device.
struct DeviceCaps {
  std::uint32_t index = 0;
  VkPhysicalDevice physical = VK_NULL_HANDLE;
  std::string name, driver;
  std::uint32_t vendor_id = 0, device_id = 0;
  std::array<std::uint8_t, VK_UUID_SIZE> pipeline_cache_uuid{};  // which pipeline-cache data this driver accepts
  std::array<std::uint8_t, VK_UUID_SIZE> device_uuid{};  // the device (VkPhysicalDeviceIDProperties)
  std::uint32_t driver_version = 0;                       // VkPhysicalDeviceProperties::driverVersion, vendor-encoded
  // SMs (VK_NV_shader_sm_builtins) or compute units (VK_AMD_shader_core_properties:
  // engines x arrays x units an array); 0 where the device does not say.
  std::uint32_t compute_units = 0;
  VkPhysicalDeviceType type = VK_PHYSICAL_DEVICE_TYPE_OTHER;
  std::uint32_t api_version = 0;
  std::uint32_t subgroup_size = 0, min_subgroup_size = 0, max_subgroup_size = 0;
  bool subgroup_shuffle = false;      // subgroup shuffles in compute shaders
  bool subgroup_vote = false;         // subgroup votes in compute shaders
  bool subgroup_size_control = false, compute_full_subgroups = false;
  std::uint32_t shared_memory_bytes = 0;
  std::uint32_t max_work_groups[3] = {0, 0, 0};  // a dispatch's most work groups in x, y and z
  std::uint64_t max_storage_buffer_range = 0, max_allocation_bytes = 0, max_buffer_bytes = 0;
  std::uint64_t device_local_bytes = 0;
  bool buffer_device_address = false, shader_int64 = false, maintenance4 = false;
  bool shader_float16 = false, storage_16bit = false, vulkan_memory_model = false, memory_model_device_scope = false;
  bool timestamps = false;
  float timestamp_period_ns = 1.0f;
  bool coopmat = false;  // VK_KHR_cooperative_matrix with the cooperativeMatrix feature
  // VK_KHR_shader_bfloat16 with bfloat16 types and cooperative matrices (the bf16
  // build of the coopmat shader).
  bool bfloat16_coopmat = false;
  bool pipeline_statistics = false;  // VK_KHR_pipeline_executable_properties: the compiler's per-pipeline figures
  std::vector<CoopmatShape> coopmat_shapes;

  bool has_coopmat_shape(std::uint32_t m, std::uint32_t n, std::uint32_t k, VkComponentTypeKHR a,
                         VkComponentTypeKHR c) const noexcept;
  const char* type_name() const noexcept;
  // Why the scalar/subgroup variant cannot run here ("" when it can).
  std::string scalar_unsupported() const;
  // Why the cooperative-matrix variant cannot run here for these inputs ("" when it can).
  std::string coopmat_unsupported(bool bf16_inputs) const;
  // Whether pipeline-cache data (from vkGetPipelineCacheData) was written by this
  // device and driver: its header names the vendor, the device and the cache UUID.
  bool pipeline_cache_matches(const std::vector<char>& data) const noexcept;
};

// Every physical device, in the loader's order.
std::vector<DeviceCaps> probe_devices(const Instance& instance);
// One physical device (`index`: its place in the loader's order, for messages).
DeviceCaps probe_device(const Instance& instance, VkPhysicalDevice physical, std::uint32_t index);

// What a device's creator enabled, read from the pNext chain it gave
// vkCreateDevice (VkPhysicalDeviceFeatures2, the Vulkan 1.1/1.2/1.3 feature
// structs and their per-extension equivalents, the cooperative-matrix and
// bfloat16 ones) and its extension names: `caps` with every feature it did not
// enable turned off.
DeviceCaps enabled_caps(DeviceCaps caps, const void* enabled_features, const char* const* extensions,
                        std::uint32_t extension_count);

// The features and extensions treeattn enables on a device it creates (as far
// as `caps` has them), as a pNext chain for VkDeviceCreateInfo.
struct FeatureChain {
  VkPhysicalDeviceFeatures2 features{};
  VkPhysicalDeviceVulkan11Features v11{};
  VkPhysicalDeviceVulkan12Features v12{};
  VkPhysicalDeviceVulkan13Features v13{};
  VkPhysicalDeviceCooperativeMatrixFeaturesKHR coopmat{};
  VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR executables{};
  VkPhysicalDeviceShaderBfloat16FeaturesKHR bfloat16{};
  std::vector<const char*> extensions;

  explicit FeatureChain(const DeviceCaps& caps);
  FeatureChain(const FeatureChain&) = delete;  // the chain points into the object
  FeatureChain& operator=(const FeatureChain&) = delete;
};

// `requested` >= 0 picks that index; otherwise the first discrete GPU, then
// integrated, virtual, CPU. Throws Backend naming the valid range when the
// index does not exist.
const DeviceCaps& select_device(const std::vector<DeviceCaps>& devices, int requested);

class Device {
 public:
  // Creates the logical device with what both shader variants need, as far as
  // the physical device offers it (coopmat features only when it has them).
  Device(std::shared_ptr<Instance> instance, const DeviceCaps& caps);
  // The application's device (not destroyed here), with `caps` as enabled on
  // it (enabled_caps); `queue` may be null (then nothing can be submitted).
  Device(std::shared_ptr<Instance> instance, const DeviceCaps& caps, VkDevice borrowed, std::uint32_t queue_family,
         VkQueue queue);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  VkDevice handle() const noexcept { return device_; }
  bool owned() const noexcept { return owned_; }
  VkQueue queue() const noexcept { return queue_; }
  std::uint32_t queue_family() const noexcept { return queue_family_; }
  const DeviceCaps& caps() const noexcept { return caps_; }
  // A memory type with `required` flags among `type_bits`, preferring `preferred` too.
  std::uint32_t memory_type(std::uint32_t type_bits, VkMemoryPropertyFlags required,
                            VkMemoryPropertyFlags preferred = 0) const;

 private:
  std::shared_ptr<Instance> instance_;
  DeviceCaps caps_;
  VkDevice device_ = VK_NULL_HANDLE;
  bool owned_ = true;
  VkQueue queue_ = VK_NULL_HANDLE;
  std::uint32_t queue_family_ = 0;
  VkPhysicalDeviceMemoryProperties memory_{};
};

}  // namespace treeattn::vulkan
