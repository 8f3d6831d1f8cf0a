// treeattn devices: every Vulkan device with the capabilities that choose the
// shader variant, and which one --backend vulkan would use.

#include <fmt/format.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "commands.hpp"
#include "treeattn/backend.hpp"

namespace treeattn::cli {
namespace {

struct DevicesOptions {
  bool json = false;
  BackendFlags backend_flags;
};

void print_table(const std::vector<VulkanDeviceReport>& devices) {
  for (const VulkanDeviceReport& d : devices) {
    fmt::print("{} {}: {} ({}, Vulkan {})\n", d.selected ? '*' : ' ', d.index, d.name, d.type, d.api_version);
    fmt::print("    driver            {}\n", d.driver);
    fmt::print("    subgroup size     {} (range {}-{})\n", d.subgroup_size, d.min_subgroup_size, d.max_subgroup_size);
    fmt::print("    shared memory     {} KiB\n", d.shared_memory_bytes / 1024);
    fmt::print("    storage binding   {} (max allocation {}, device-local {})\n", format_bytes(double(d.max_storage_buffer_range)),
               format_bytes(double(d.max_allocation_bytes)), format_bytes(double(d.device_local_bytes)));
    std::string shapes;
    for (const std::string& s : d.cooperative_matrix_shapes) shapes += (shapes.empty() ? "" : ", ") + s;
    fmt::print("    coopmat           {}\n", d.cooperative_matrix ? shapes : std::string("no"));
    fmt::print("    variant f16       {}\n", d.variant_f16);
    fmt::print("    variant bf16      {}\n", d.variant_bf16);
  }
  fmt::print("(* the device --backend vulkan uses; --device N or TREEATTN_VK_DEVICE=N picks another)\n");
}

void run(const DevicesOptions& o) {
  const std::vector<VulkanDeviceReport> devices = vulkan_devices(o.backend_flags.options);
  if (!o.json) {
    print_table(devices);
    return;
  }
  nlohmann::json list = nlohmann::json::array();
  for (const VulkanDeviceReport& d : devices) {
    list.push_back({{"index", d.index},
                    {"name", d.name},
                    {"type", d.type},
                    {"driver", d.driver},
                    {"api_version", d.api_version},
                    {"subgroup_size", d.subgroup_size},
                    {"min_subgroup_size", d.min_subgroup_size},
                    {"max_subgroup_size", d.max_subgroup_size},
                    {"shared_memory_bytes", d.shared_memory_bytes},
                    {"max_storage_buffer_range", d.max_storage_buffer_range},
                    {"max_allocation_bytes", d.max_allocation_bytes},
                    {"device_local_bytes", d.device_local_bytes},
                    {"cooperative_matrix", d.cooperative_matrix},
                    {"cooperative_matrix_shapes", d.cooperative_matrix_shapes},
                    {"variant_f16", d.variant_f16},
                    {"variant_bf16", d.variant_bf16},
                    {"selected", d.selected}});
  }
  std::cout << nlohmann::json{{"vulkan_devices", list}}.dump(2) << "\n";
}

}  // namespace

Command add_devices_command(CLI::App& app) {
  auto o = std::make_shared<DevicesOptions>();
  CLI::App* sub = app.add_subcommand(
      "devices",
      "List the Vulkan devices: subgroup sizes, shared memory, buffer limits, cooperative-matrix shapes, and the "
      "shader variant treeattn would run on each (--vk-variant forces one, to see why a device cannot)");
  sub->add_flag("--json", o->json, "Print JSON instead of the table");
  o->backend_flags.add_to(*sub);
  return {sub, [o] { run(*o); }};
}

}  // namespace treeattn::cli
