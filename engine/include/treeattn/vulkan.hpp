#pragma once
// The Vulkan device path: attention recorded into the application's command
// buffers, on its own VkDevice and VkBuffers (or on a device treeattn opens).
// Available when treeattn was built with the Vulkan backend
// (TREEATTN_HAS_VULKAN in treeattn/config.h).
//
//   treeattn::vulkan::ExternalDevice dev{instance, physical, device, family, queue,
//                                        vkGetInstanceProcAddr, &features2, exts, n_exts};
//   treeattn::vulkan::Context ctx(dev);                 // feature checks, pipelines
//   treeattn::vulkan::Workspace ws(ctx, treeattn::DType::f16);
//   each decode step:
//     ws.upload(plan, cmd);                              // host encode + a recorded copy
//     for each layer: ws.record(cmd, {q, k[l], v[l], o, lse});
//   then submit cmd on a queue of `family`.
//
// What treeattn records: upload() records a copy from its staging memory into
// the plan buffer and a barrier (transfer write -> compute shader read);
// record() records a barrier (compute shader write -> compute shader read and
// write: the previous record's merge against this one's stage 1, which reuse
// the partial buffers), stage 1's dispatches, a barrier, and the merge.
//
// What the caller owes (barriers in its command buffer):
//   before record(): its writes of Q, K and V made available to
//     VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT / VK_ACCESS_SHADER_READ_BIT;
//   after record(): treeattn's writes of O and LSE, from
//     VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT / VK_ACCESS_SHADER_WRITE_BIT, made
//     available to whatever reads them next.
// Commands a Workspace records must execute in recording order (one queue, or
// the application's semaphores between queues).
//
// Lifetimes: a step is an upload() and the record()s after it. When upload()
// is called for step N, the GPU must have finished step N-2's commands (a
// frame-in-flight discipline of two): the workspace reuses that step's staging
// buffer and K/V table half, and releases buffers a larger plan made it replace
// before. Commands recorded in a step may be submitted any number of times
// until the next upload on the same workspace.
//
// Tensors: VkBuffers created with VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT
// (the shaders reach every tensor by buffer device address), offsets 16-byte
// aligned; the shapes and dtypes of AttentionArgs (tensor.hpp), dense rows.
//
// Threads: a Context may be shared between threads once constructed (its
// pipelines are built by Workspace constructors and upload(), under a lock).
// A Workspace is used by one thread at a time. Vulkan's own rules hold: a
// command buffer is recorded by one thread, a queue is used by one at a time.

#include <vulkan/vulkan_core.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "treeattn/cost_model.hpp"
#include "treeattn/dtype.hpp"
#include "treeattn/log.hpp"
#include "treeattn/plan.hpp"

namespace treeattn::vulkan {

struct ContextOptions {
  // treeattn's own device: its index among the physical devices (-1: the first
  // discrete GPU, then integrated, virtual, CPU).
  int device = -1;
  // Stage-1 shaders: "auto" (cooperative matrices where the device and its
  // enabled features allow), "scalar", "coopmat", "coopmat-shared".
  std::string variant = "auto";
  bool verbose = false;      // log which device and shader variant run
  LogSink log;               // where messages go (none: dropped)
  // A file that keeps compiled pipelines between processes ("" none).
  std::string pipeline_cache_path;
  // A JSON file that keeps calibrated cost models between processes, keyed by
  // device UUID and driver version ("": this process only).
  std::string model_cache_path;
  // treeattn's own instance: the Khronos validation layer, whose warnings and
  // errors go to `log` (the process's first Vulkan context decides both, and
  // the instance keeps that sink for the process's life).
  bool validation = false;
};

// The application's device, as it created it. enabled_features is the pNext
// chain given to vkCreateDevice (VkPhysicalDeviceFeatures2 and/or the Vulkan
// 1.1/1.2/1.3 feature structs, the cooperative-matrix and bfloat16 ones), so
// treeattn uses only what was enabled; enabled_extensions likewise. `queue`
// (of queue_family) is used only while the Context is constructed, to probe
// the cooperative-matrix layout, and may be null (the layout is then not
// assumed); nothing else is submitted by treeattn.
struct ExternalDevice {
  VkInstance instance = VK_NULL_HANDLE;
  VkPhysicalDevice physical_device = VK_NULL_HANDLE;
  VkDevice device = VK_NULL_HANDLE;
  std::uint32_t queue_family = 0;
  VkQueue queue = VK_NULL_HANDLE;
  PFN_vkGetInstanceProcAddr get_instance_proc_addr = nullptr;
  const void* enabled_features = nullptr;
  const VkPhysicalDeviceFeatures* enabled_core_features = nullptr;  // VkDeviceCreateInfo::pEnabledFeatures, if used
  const char* const* enabled_extensions = nullptr;
  std::uint32_t enabled_extension_count = 0;
};

// What treeattn would enable on `physical_device`, as far as it has it: chain
// `features` into VkDeviceCreateInfo::pNext (after the application's own, whose
// duplicates it must merge) and add `extensions`.
struct DeviceRequirements {
  VkPhysicalDeviceFeatures2 features{};   // its pNext: vulkan11, vulkan12, vulkan13 (on 1.3), the extensions' structs
  VkPhysicalDeviceVulkan11Features vulkan11{};
  VkPhysicalDeviceVulkan12Features vulkan12{};
  VkPhysicalDeviceVulkan13Features vulkan13{};
  std::vector<const char*> extensions;
  std::shared_ptr<void> extension_features;  // the extensions' feature structs, chained after vulkan13

  DeviceRequirements() = default;
  DeviceRequirements(const DeviceRequirements&) = delete;  // the chain points into the object
  DeviceRequirements& operator=(const DeviceRequirements&) = delete;
};
// Throws Backend when the device cannot run treeattn at all (naming why).
std::unique_ptr<DeviceRequirements> device_requirements(VkInstance instance, VkPhysicalDevice physical_device,
                                                        PFN_vkGetInstanceProcAddr get_instance_proc_addr);

class Context {
 public:
  // treeattn's own instance and device.
  explicit Context(const ContextOptions& options = {});
  // The application's device. Throws Backend naming the missing feature when
  // the enabled features cannot run even the scalar shaders (bufferDeviceAddress,
  // shaderInt64, 16-bit storage, ...); cooperative matrices are used only where
  // enabled, else the scalar variant runs (`variant()` says why).
  Context(const ExternalDevice& device, const ContextOptions& options = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // The planner's cost model for this device's shaders (PlanOptions::cost):
  // the H100 fit of the coopmat shaders on an NVIDIA H100 that runs them;
  // on a CPU device (lavapipe) the same fit, never calibrated; elsewhere
  // calibrated at the first call (a few timed plans on treeattn's own queue,
  // kept per device, driver and shader variant in this process and in
  // options.model_cache_path), or, where that fails (an application's device,
  // whose queues treeattn does not submit to), the H100 fit on this device's
  // compute units. CostModel::source says which.
  CostModel cost_model() const;
  // The stage-1 shader variant for these inputs and head_dim, and why.
  std::string variant(DType inputs, int head_dim) const;

  VkDevice device() const noexcept;
  VkPhysicalDevice physical_device() const noexcept;
  std::uint32_t queue_family() const noexcept;
  // treeattn's own device's queue (null on an application's device).
  VkQueue queue() const noexcept;

  struct State;  // the library's (backends/vulkan/context_state.hpp)
  explicit Context(std::unique_ptr<State> state);  // around state prepared inside the library

 private:
  friend State& state_of(const Context& context) noexcept;
  std::unique_ptr<State> state_;
};

// A tensor in a VkBuffer: shape and dtype as in AttentionArgs; buffer null
// means absent (LSE).
struct Tensor {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceSize offset = 0;
  DType dtype = DType::f16;
  std::vector<std::int64_t> shape;
};
// The attention variants of one recorded call (treeattn::AttentionOptions,
// DESIGN.md §8) with their tensors in buffers: sinks [heads_q] f32, k_scales
// and v_scales [heads_kv] f32, each 4-byte aligned; a null buffer is none.
struct AttentionOptions {
  float logit_softcap = 0.0f;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  Tensor sinks, k_scales, v_scales;
};
struct Tensors {
  Tensor q, k, v, o, lse;
  AttentionOptions options{};
};

// A plan on the device, the partial-result buffers and the staging of the
// uploads, for inputs of one dtype (f16 or bf16).
class Workspace {
 public:
  Workspace(const Context& context, DType inputs);
  ~Workspace();
  Workspace(Workspace&&) noexcept;
  Workspace& operator=(Workspace&&) noexcept;

  // Encodes `plan` on the host into the next staging buffer and records its
  // copy into `commands` (grows the workspace first where the plan needs more;
  // builds the pipelines of its head_dim the first time). Where it throws
  // (OutOfMemory when an allocation fails, Backend for another driver error),
  // the buffers that commands recorded earlier read stay, and the workspace
  // holds no plan: record() refuses until an upload succeeds.
  void upload(const Plan& plan, VkCommandBuffer commands);
  // Records one attention call of the last uploaded plan. Allocates no device
  // memory (a K/V pair seen for the first time in a step takes an entry of a
  // host-written table of 2 048 addresses a step). Throws InvalidArgument
  // naming a tensor that does not match the plan.
  void record(VkCommandBuffer commands, const Tensors& tensors);

  struct State;  // the library's (backends/vulkan/workspace_state.hpp)

 private:
  friend State& state_of(const Workspace& workspace) noexcept;
  std::unique_ptr<State> state_;
};

}  // namespace treeattn::vulkan
