// treeattn::vulkan::Context: treeattn's own device or the application's, the
// pipeline cache, the pipelines (built once), the shader variant and the cost
// model of the Vulkan shaders.

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "calibrate.hpp"
#include "context_state.hpp"
#include "coopmat_layout.hpp"
#include "device_models.hpp"
#include "shaders.hpp"
#include "spirv_bf16.hpp"
#include "vk_check.hpp"
#include "vk_plan.hpp"

namespace treeattn::vulkan {

Context::State::State(const ContextOptions& o, std::shared_ptr<Instance> i, const DeviceCaps* caps)
    : options(o), instance(std::move(i)) {
  std::vector<DeviceCaps> devices;
  if (caps == nullptr) {
    devices = probe_devices(*instance);
    caps = &select_device(devices, options.device);
  }
  device = std::make_unique<Device>(instance, *caps);
  open_cache_and_probe();
}

Context::State::State(const ContextOptions& o, const ExternalDevice& e) : options(o) {
  if (e.device == VK_NULL_HANDLE || e.physical_device == VK_NULL_HANDLE) {
    throw Error(ErrorCategory::InvalidArgument, "Vulkan: ExternalDevice needs the application's VkDevice and VkPhysicalDevice");
  }
  instance = Instance::borrow(e.instance, e.get_instance_proc_addr);
  const DeviceCaps probed = probe_device(*instance, e.physical_device, 0);
  DeviceCaps caps = enabled_caps(probed, e.enabled_features, e.enabled_extensions, e.enabled_extension_count);
  if (e.enabled_core_features != nullptr && e.enabled_core_features->shaderInt64) caps.shader_int64 = probed.shader_int64;
  device = std::make_unique<Device>(instance, caps, e.device, e.queue_family, e.queue);
  open_cache_and_probe();
}

// The pipeline cache (options.pipeline_cache_path carries the driver's compiled
// pipelines from one process to the next: read here, written back on
// destruction; data another device or driver wrote is not handed over), and
// the cooperative matrices' element layout where the device can run them.
void Context::State::open_cache_and_probe() {
  const DeviceCaps& caps = device->caps();
  std::vector<char> cached;
  if (!options.pipeline_cache_path.empty()) {
    if (std::ifstream in{options.pipeline_cache_path, std::ios::binary}) cached.assign(std::istreambuf_iterator<char>(in), {});
    if (!cached.empty() && !caps.pipeline_cache_matches(cached)) {
      log_to(options.log, LogLevel::warning,
             fmt::format("treeattn: ignoring the pipeline cache {}: written by another device or driver",
                         options.pipeline_cache_path));
      cached.clear();
    }
  }
  // Probed with a dispatch, so only where a queue is at hand; without it the
  // shared-memory coopmat shader runs, correct on any layout.
  if (options.variant != "scalar" && caps.coopmat_unsupported(false).empty() && device->queue() != VK_NULL_HANDLE) {
    fragment_layout = coopmat_fragment_layout(*device);
  }
  if (options.verbose) {
    log_to(options.log, LogLevel::info,
           fmt::format("treeattn: Vulkan device {}: {} ({}, {}), subgroup {}, shared memory {} KiB{}{}", caps.index,
                       caps.name, caps.type_name(), caps.driver, caps.subgroup_size, caps.shared_memory_bytes / 1024,
                       instance->validation() ? ", validation layer on" : "",
                       device->owned() ? "" : ", the application's device"));
  }
  // Last of what may throw: a constructor that throws runs no destructor to destroy the cache.
  VkPipelineCacheCreateInfo cache_info{VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
  cache_info.initialDataSize = cached.size();
  cache_info.pInitialData = cached.data();
  TREEATTN_VK_CHECK(vkCreatePipelineCache(device->handle(), &cache_info, nullptr, &cache));
}

Context::State::~State() {
  stage1_.clear();
  merge_.clear();
  if (cache == VK_NULL_HANDLE) return;
  if (!options.pipeline_cache_path.empty()) {
    std::size_t bytes = 0;
    std::vector<char> data;
    if (vkGetPipelineCacheData(device->handle(), cache, &bytes, nullptr) == VK_SUCCESS) {
      data.resize(bytes);
      if (vkGetPipelineCacheData(device->handle(), cache, &bytes, data.data()) == VK_SUCCESS) {
        std::ofstream(options.pipeline_cache_path, std::ios::binary).write(data.data(), std::streamsize(bytes));
      }
    }
  }
  vkDestroyPipelineCache(device->handle(), cache, nullptr);
}

Variant Context::State::variant(DType inputs, int head_dim, int head_dim_v, std::string* reason) const {
  return choose_variant(device->caps(), options.variant, inputs, fragment_layout, head_dim, head_dim_v, reason);
}

void Context::State::log_variant(const std::string& reason) {
  if (!options.verbose) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (reason == logged_variant_) return;
  log_to(options.log, LogLevel::info, "treeattn: Vulkan shader variant: " + reason);
  logged_variant_ = reason;
}

// At verbose, what the driver's compiler made of a pipeline (registers,
// spills, shared memory, as far as the driver reports them): occupancy and
// spills decide these shaders' speed and are otherwise invisible.
void Context::State::log_statistics(const std::string& what, const ComputePipeline& pipeline) const {
  const std::vector<std::string> stats = pipeline.statistics();
  if (stats.empty()) return;
  std::string line;
  for (const auto& s : stats) line += (line.empty() ? "" : ", ") + s;
  log_to(options.log, LogLevel::info, fmt::format("treeattn: Vulkan pipeline {}: {}", what, line));
}

namespace {

// A pipeline's variants for --verbose: ", fp8_e4m3 K/V, soft-cap, sinks", or "".
std::string variants_said(const ShaderKey& key) {
  std::string said;
  if (key.kv_fp8 != 0) said += key.kv_fp8 == 1 ? ", fp8_e4m3 K/V" : ", fp8_e5m2 K/V";
  if (key.softcap) said += ", soft-cap";
  if (key.sinks) said += ", sinks";
  return said;
}

}  // namespace

const ComputePipeline& Context::State::stage1_pipeline(const ShaderKey& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& slot = stage1_[key];
  if (slot) return *slot;
  const bool capture = options.verbose && device->caps().pipeline_statistics;
  const std::string dims = key.head_dim_v == key.head_dim ? fmt::format("head_dim {}", key.head_dim)
                                                          : fmt::format("head_dim {}/{}", key.head_dim, key.head_dim_v);
  if (key.variant == Variant::scalar) {
    const std::uint32_t chunk = scalar_chunk_tokens(device->caps(), key.head_dim, key.head_dim_v);
    slot = std::make_unique<ComputePipeline>(
        *device, cache, SpirvModule{spirv::tree_attn_scalar, spirv::tree_attn_scalar_words},
        key.specialization(std::uint32_t(key.head_dim), chunk), std::uint32_t(sizeof(PushConstants)), 0, capture);
    log_statistics(fmt::format("tree_attn_scalar ({}, {}-token stages{})", dims, chunk, variants_said(key)), *slot);
    return *slot;
  }
#ifdef TREEATTN_HAVE_VK_COOPMAT
  const bool fragments = key.variant == Variant::coopmat_fragments;
  const SpirvModule f16 = fragments
                              ? SpirvModule{spirv::tree_attn_coopmat_fragments, spirv::tree_attn_coopmat_fragments_words}
                              : SpirvModule{spirv::tree_attn_coopmat, spirv::tree_attn_coopmat_words};
  // bf16 inputs: the same shader with its 16-bit float type declared bfloat16.
  const std::vector<std::uint32_t> bf16_words =
      key.bf16 ? retype_f16_as_bf16(f16.words, f16.word_count) : std::vector<std::uint32_t>{};
  const SpirvModule module = key.bf16 ? SpirvModule{bf16_words.data(), bf16_words.size()} : f16;
  const std::uint32_t chunk = coopmat_chunk_tokens(device->caps(), key.head_dim, key.head_dim_v, fragments);
  slot = std::make_unique<ComputePipeline>(*device, cache, module, key.specialization(std::uint32_t(key.head_dim), chunk),
                                           std::uint32_t(sizeof(PushConstants)), 32, capture);
  log_statistics(fmt::format("{} ({}, {}, {}-token stages{})",
                             fragments ? "tree_attn_coopmat_fragments" : "tree_attn_coopmat", key.bf16 ? "bf16" : "f16",
                             dims, chunk, variants_said(key)),
                 *slot);
  return *slot;
#else
  throw Error(ErrorCategory::Backend, "this build has no cooperative-matrix shaders");
#endif
}

const ComputePipeline& Context::State::merge_pipeline(const ShaderKey& key) {
  const ShaderKey merge = key.merge();
  std::lock_guard<std::mutex> lock(mutex_);
  auto& slot = merge_[merge];
  if (!slot) {
    slot = std::make_unique<ComputePipeline>(*device, cache, SpirvModule{spirv::tree_merge, spirv::tree_merge_words},
                                             merge.specialization(0, merge_threads(merge.head_dim_v)),
                                             std::uint32_t(sizeof(PushConstants)), 0,
                                             options.verbose && device->caps().pipeline_statistics);
    log_statistics(fmt::format("tree_merge (head_dim_v {}{})", merge.head_dim_v, variants_said(merge)), *slot);
  }
  return *slot;
}

// --- the public face ---------------------------------------------------------

Context::Context(const ContextOptions& options)
    : state_(std::make_unique<State>(options, Instance::get(options.validation, options.log), nullptr)) {}
Context::Context(const ExternalDevice& device, const ContextOptions& options)
    : state_(std::make_unique<State>(options, device)) {}
Context::Context(std::unique_ptr<State> state) : state_(std::move(state)) {}
Context::~Context() = default;

CostModel Context::cost_model() const {
  const DeviceCaps& caps = state_->device->caps();
  bool coopmat = false;  // the stage-1 shaders f16 inputs run (none at all: planned as the scalar ones)
  try {
    coopmat = state_->variant(DType::f16, 128, 128) != Variant::scalar;
  } catch (const Error&) {
  }
  // CPU devices (lavapipe) plan as the H100's coopmat shaders do, on every
  // machine alike: their timings say nothing of a GPU's, and the tests that
  // run on them compare results, not speeds.
  if (caps.type == VK_PHYSICAL_DEVICE_TYPE_CPU) {
    CostModel model = cost_model_for("h100-vulkan");
    model.source = "cpu device: h100-vulkan (fitted on Vulkan), not calibrated";
    return model;
  }
  // The fit's device and shaders: an NVIDIA H100 running the coopmat ones, and
  // the H200, whose plans under this fit ran 1.019x faster than under its own
  // calibration (benchmarks/h200/device_model_vulkan.json); each with its own SMs.
  const std::uint32_t sms = caps.compute_units;
  const bool hopper = caps.name.find("H100") != std::string::npos || caps.name.find("H200") != std::string::npos;
  if (coopmat && caps.vendor_id == 0x10de && hopper) {
    const CostModel h100 = cost_model_for("h100-vulkan");
    return sms == 0 ? h100 : scaled_cost_model(h100, sms, h100.slots / h100.sms, fmt::format("{}; {} SMs", h100.source, sms));
  }
  // Elsewhere the H100's model of the same shaders is the starting point and
  // the fallback; a device that does not say its compute units is timed as
  // if it had 32.
  const CostModel base = coopmat ? cost_model_for("h100-vulkan") : cost_model_for("h100");
  const std::uint32_t units = sms > 0 ? sms : 32;
  const std::string variant = coopmat ? "coopmat" : "scalar";
  std::string uuid;
  for (std::uint8_t byte : caps.device_uuid) uuid += fmt::format("{:02x}", byte);
  const ContextOptions& o = state_->options;
  // An application's device is never timed (its fallback is its own entry,
  // so a device treeattn opens itself is still calibrated).
  const DeviceModelRequest request{fmt::format("vulkan-{}:{}:{}{}", variant, uuid, caps.driver_version,
                                               state_->device->owned() ? "" : ":application"),
                                   o.model_cache_path, o.log, o.verbose};
  const std::string units_said = sms > 0 ? "" : ", compute units unknown: 32 assumed";
  CostModel model = device_model(
      request,
      [&] {
        return calibrated_cost_model(*this, units, base,
                                     fmt::format("calibrated on {} ({}, {} shaders{})", caps.name, caps.driver, variant, units_said),
                                     o.verbose ? o.log : LogSink{});
      },
      [&](const std::string& why) {
        return scaled_cost_model(base, units, base.slots / base.sms,
                                 fmt::format("{} scaled to {} compute units{} (calibration failed: {})",
                                             coopmat ? "h100-vulkan" : "h100", units, units_said, why));
      });
  // The shaders decode fp8 rows into the f16 tiles every pass reads, so fp8
  // plans with the f16 terms here too (the scalar shaders start from the CUDA
  // model, and a model cache may hold entries written without the terms).
  model.fp8_small_tile_factor = 1.0;
  model.fp8_solo_speedup = 0.0;
  return model;
}
std::string Context::variant(DType inputs, int head_dim) const {
  std::string reason;
  state_->variant(inputs, head_dim, head_dim, &reason);
  return reason;
}
VkDevice Context::device() const noexcept { return state_->device->handle(); }
VkPhysicalDevice Context::physical_device() const noexcept { return state_->device->caps().physical; }
std::uint32_t Context::queue_family() const noexcept { return state_->device->queue_family(); }
VkQueue Context::queue() const noexcept { return state_->device->owned() ? state_->device->queue() : VK_NULL_HANDLE; }

std::unique_ptr<DeviceRequirements> device_requirements(VkInstance instance, VkPhysicalDevice physical_device,
                                                        PFN_vkGetInstanceProcAddr get_instance_proc_addr) {
  const std::shared_ptr<Instance> borrowed = Instance::borrow(instance, get_instance_proc_addr);
  const DeviceCaps caps = probe_device(*borrowed, physical_device, 0);
  if (std::string why = caps.scalar_unsupported(); !why.empty()) {
    throw Error(ErrorCategory::Backend, fmt::format("Vulkan device {} cannot run treeattn's shaders: {}", caps.name, why));
  }
  const FeatureChain chain(caps);
  auto r = std::make_unique<DeviceRequirements>();
  r->features = chain.features;
  r->vulkan11 = chain.v11;
  r->vulkan12 = chain.v12;
  r->vulkan13 = chain.v13;
  r->extensions = chain.extensions;
  // The extensions' structs travel in one allocation, chained after vulkan13.
  struct Extensions {
    VkPhysicalDeviceCooperativeMatrixFeaturesKHR coopmat;
    VkPhysicalDeviceShaderBfloat16FeaturesKHR bfloat16;
  };
  auto extensions = std::make_shared<Extensions>(Extensions{chain.coopmat, chain.bfloat16});
  extensions->coopmat.pNext = nullptr;
  extensions->bfloat16.pNext = nullptr;
  r->features.pNext = &r->vulkan11;
  r->vulkan11.pNext = &r->vulkan12;
  r->vulkan12.pNext = caps.api_version >= VK_API_VERSION_1_3 ? &r->vulkan13 : nullptr;
  r->vulkan13.pNext = nullptr;
  void** end = caps.api_version >= VK_API_VERSION_1_3 ? &r->vulkan13.pNext : &r->vulkan12.pNext;
  for (const char* name : chain.extensions) {
    if (std::strcmp(name, VK_KHR_COOPERATIVE_MATRIX_EXTENSION_NAME) == 0) {
      *end = &extensions->coopmat;
      end = &extensions->coopmat.pNext;
    } else if (std::strcmp(name, VK_KHR_SHADER_BFLOAT16_EXTENSION_NAME) == 0) {
      *end = &extensions->bfloat16;
      end = &extensions->bfloat16.pNext;
    }
  }
  // Pipeline statistics are for treeattn's --verbose on its own device; an application need not enable them.
  r->extensions.erase(std::remove_if(r->extensions.begin(), r->extensions.end(),
                                     [](const char* name) {
                                       return std::strcmp(name, VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME) == 0;
                                     }),
                      r->extensions.end());
  r->extension_features = extensions;
  return r;
}

}  // namespace treeattn::vulkan
