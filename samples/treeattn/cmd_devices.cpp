// treeattn devices: every Vulkan device with the capabilities that choose the
// shader variant and which one --backend vulkan would use, every CUDA device,
// and the cost model the planner uses on each.

#include <fmt/format.h>

#include <exception>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "commands.hpp"
#include "backend.hpp"
#include "treeattn/error.hpp"

namespace treeattn::cli {
namespace {

struct DevicesOptions {
  bool json = false;
  BackendFlags backend_flags;
};

void print_model(const std::string& source, const std::string& coefficients) {
  if (source.empty()) return;
  fmt::print("    cost model        {}\n", source);
  if (!coefficients.empty()) fmt::print("                      {}\n", coefficients);
}

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
    if (d.compute_units > 0) fmt::print("    compute units     {}\n", d.compute_units);
    print_model(d.cost_model_source, d.cost_model);
  }
  fmt::print("(* the device --backend vulkan uses; --device N or TREEATTN_VK_DEVICE=N picks another)\n");
}

void print_table(const std::vector<CudaDeviceReport>& devices) {
  fmt::print("CUDA devices: {}\n", devices.size());
  for (const CudaDeviceReport& d : devices) {
    if (!d.error.empty()) {
      fmt::print("  {}: {}\n", d.index, d.error);
      continue;
    }
    fmt::print("  {}: {} (sm_{}{}, {} SMs, {:.0f} GB/s)\n", d.index, d.name, d.sm_major, d.sm_minor, d.sms, d.peak_gbps);
    print_model(d.cost_model_source, d.cost_model);
  }
}

void run(const DevicesOptions& o) {
  // Without Vulkan (no loader, no driver) the CUDA devices are still listed;
  // the error stands when there are none.
  std::vector<VulkanDeviceReport> devices;
  std::exception_ptr vulkan_failed;
  std::string vulkan_error;
  try {
    devices = vulkan_devices(o.backend_flags.options);
  } catch (const Error& e) {
    vulkan_failed = std::current_exception();
    vulkan_error = e.what();
  }
  const std::vector<CudaDeviceReport> cuda = cuda_devices(o.backend_flags.options);
  if (vulkan_failed && cuda.empty()) std::rethrow_exception(vulkan_failed);
  if (!o.json) {
    if (vulkan_failed) {
      fmt::print("Vulkan: {}\n", vulkan_error);
    } else {
      print_table(devices);
    }
    print_table(cuda);
    return;
  }
  nlohmann::json cuda_list = nlohmann::json::array();
  for (const CudaDeviceReport& d : cuda) {
    cuda_list.push_back({{"index", d.index},
                         {"name", d.name},
                         {"sm", fmt::format("{}{}", d.sm_major, d.sm_minor)},
                         {"sms", d.sms},
                         {"peak_gbps", d.peak_gbps},
                         {"cost_model_source", d.cost_model_source},
                         {"cost_model", d.cost_model},
                         {"error", d.error}});
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
                    {"selected", d.selected},
                    {"compute_units", d.compute_units},
                    {"cost_model_source", d.cost_model_source},
                    {"cost_model", d.cost_model}});
  }
  nlohmann::json doc{{"vulkan_devices", list}, {"cuda_devices", cuda_list}};
  if (vulkan_failed) doc["vulkan_error"] = vulkan_error;
  std::cout << doc.dump(2) << "\n";
}

}  // namespace

Command add_devices_command(CLI::App& app) {
  auto o = std::make_shared<DevicesOptions>();
  CLI::App* sub = app.add_subcommand(
      "devices",
      "List the Vulkan devices (subgroup sizes, shared memory, buffer limits, cooperative-matrix shapes, the "
      "shader variant treeattn would run on each: --vk-variant forces one, to see why a device cannot) and the CUDA "
      "devices, with the cost model the planner uses on each (a fitted one, or calibrated on first use)");
  sub->add_flag("--json", o->json, "Print JSON instead of the table");
  sub->add_flag("--verbose", o->backend_flags.options.verbose,
                "Log each device's shader variant, and a calibration's timed plans against the fit and the H100 "
                "model (stderr)");
  o->backend_flags.add_to(*sub);
  return {sub, [o] { run(*o); }};
}

}  // namespace treeattn::cli
