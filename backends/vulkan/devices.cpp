// vulkan_devices(): what `treeattn devices` prints.

#include <fmt/format.h>

#include "backend.hpp"
#include "treeattn/error.hpp"
#include "context_state.hpp"
#include "coopmat_layout.hpp"
#include "vulkan_backend.hpp"

namespace treeattn {
namespace {

const char* component_name(VkComponentTypeKHR type) {
  switch (type) {
    case VK_COMPONENT_TYPE_FLOAT16_KHR: return "f16";
    case VK_COMPONENT_TYPE_FLOAT32_KHR: return "f32";
    case VK_COMPONENT_TYPE_BFLOAT16_KHR: return "bf16";
    default: break;
  }
  switch (int(type)) {  // the integer types, named as the registry does
    case 3: return "s8";
    case 7: return "u8";
    case 4: return "s16";
    case 5: return "s32";
    case 8: return "u16";
    case 9: return "u32";
    default: return "other";
  }
}

}  // namespace

std::vector<VulkanDeviceReport> vulkan_devices(const BackendOptions& options) {
  using namespace vulkan;
  const std::shared_ptr<Instance> instance = Instance::get(options.vk_validation, options.log);
  const std::vector<DeviceCaps> devices = probe_devices(*instance);
  const DeviceCaps* selected = devices.empty() ? nullptr : &select_device(devices, context_options(options).device);
  std::vector<VulkanDeviceReport> reports;
  for (const DeviceCaps& c : devices) {
    VulkanDeviceReport r;
    r.index = int(c.index);
    r.name = c.name;
    r.type = c.type_name();
    r.driver = c.driver;
    r.api_version = fmt::format("{}.{}.{}", VK_API_VERSION_MAJOR(c.api_version), VK_API_VERSION_MINOR(c.api_version),
                                VK_API_VERSION_PATCH(c.api_version));
    r.subgroup_size = c.subgroup_size;
    r.min_subgroup_size = c.min_subgroup_size;
    r.max_subgroup_size = c.max_subgroup_size;
    r.shared_memory_bytes = c.shared_memory_bytes;
    r.max_storage_buffer_range = c.max_storage_buffer_range;
    r.max_allocation_bytes = c.max_allocation_bytes;
    r.device_local_bytes = c.device_local_bytes;
    r.cooperative_matrix = c.coopmat;
    for (const CoopmatShape& s : c.coopmat_shapes) {
      r.cooperative_matrix_shapes.push_back(fmt::format("{}x{}x{} {}->{}", s.m, s.n, s.k, component_name(s.a), component_name(s.c)));
    }
    // Which coopmat shader a device runs depends on its elements' layout, which
    // only a dispatch shows: probed on a device opened for it.
    bool fragment_layout = false;
    if (options.vk_variant != "scalar" && c.coopmat_unsupported(false).empty()) {
      try {
        fragment_layout = coopmat_fragment_layout(Device(instance, c));
      } catch (const Error&) {
        // A device that cannot run the probe runs the shared-memory shader.
      }
    }
    for (auto [dtype, out] : {std::pair{DType::f16, &r.variant_f16}, std::pair{DType::bf16, &r.variant_bf16}}) {
      if (std::string why = c.scalar_unsupported(); !why.empty()) {
        *out = "none (" + why + ")";
      } else {
        try {
          choose_variant(c, options.vk_variant, dtype, fragment_layout, 0, 0, out);
        } catch (const Error& e) {
          *out = std::string("none (") + e.what() + ")";
        }
      }
    }
    r.selected = selected == &c;
    r.compute_units = c.compute_units;
    if (c.scalar_unsupported().empty()) {
      vulkan::ContextOptions o;
      o.variant = options.vk_variant;
      o.model_cache_path = options.model_cache;
      o.verbose = options.verbose;
      o.log = options.log;
      try {
        const CostModel model =
            vulkan::Context(std::make_unique<vulkan::Context::State>(o, instance, &c)).cost_model();
        r.cost_model_source = model.source;
        r.cost_model = model.to_string();
      } catch (const Error& e) {
        r.cost_model_source = std::string("none (") + e.what() + ")";
      }
    }
    reports.push_back(std::move(r));
  }
  return reports;
}

}  // namespace treeattn
