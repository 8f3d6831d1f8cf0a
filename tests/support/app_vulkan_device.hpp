#pragma once
// A treeattn_vulkan_device for a device treeattn opened, standing in for the
// application's in the tests of the Vulkan device path (Vulkan builds only).

#include <cstdint>

#include "backends/vulkan/context_state.hpp"
#include "treeattn/treeattn_vulkan.h"

namespace treeattn::test {

struct AppDevice {
  explicit AppDevice(const vulkan::Context& own) : enabled(state_of(own).device->caps()) {
    app.struct_size = sizeof app;
    app.instance = state_of(own).instance->handle();
    app.physical_device = own.physical_device();
    app.device = own.device();
    app.queue_family = own.queue_family();
    app.queue = own.queue();
    app.get_instance_proc_addr = vkGetInstanceProcAddr;
    app.enabled_features = &enabled.features;
    app.enabled_extensions = enabled.extensions.data();
    app.enabled_extension_count = std::uint32_t(enabled.extensions.size());
  }
  vulkan::FeatureChain enabled;
  treeattn_vulkan_device app{};
};

}  // namespace treeattn::test
