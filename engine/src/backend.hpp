#pragma once
// Backends execute a Plan. One is chosen at run time: `automatic` picks CUDA,
// then Vulkan, then the CPU, among those this build contains and this machine runs.

#include <memory>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "treeattn/context.hpp"
#include "treeattn/cost_model.hpp"
#include "treeattn/cuda.hpp"
#include "treeattn/log.hpp"
#include "treeattn/plan.hpp"
#include "treeattn/tensor.hpp"

namespace treeattn {

struct BackendOptions {
  int threads = 0;                   // CPU worker threads; 0: one per hardware thread
  int device = -1;                   // CUDA device index (-1: 0); Vulkan device index (-1: vk_device)
  int vk_device = -1;                // Vulkan device index where `device` is -1 (-1: the first discrete GPU);
                                     // the CLI takes it from TREEATTN_VK_DEVICE
  std::string vk_variant = "auto";   // Vulkan stage-1 shaders: auto, scalar, coopmat or coopmat-shared
  std::size_t vk_max_chunk_bytes = 0;  // split Vulkan KV pools into buffers of at most this size (0: the device's limit)
  std::uint32_t vk_max_dispatch_run = 0;  // most Vulkan work groups in a run along a dispatch's x (0: the device's limit)
  bool verbose = false;              // log which device and kernel variant run (CUDA: its occupancy too)
  LogSink log;                       // where messages go (none: dropped); the CLI's writes to stderr
  // Vulkan: a file that keeps compiled pipelines between processes ("": none).
  std::string vk_pipeline_cache;
  // CUDA and Vulkan: a JSON file that keeps the cost models calibrated on
  // devices without a fitted one, per device and driver ("": this process only).
  std::string model_cache;
  // Vulkan: the Khronos validation layer on treeattn's instance, whose warnings
  // and errors go to `log` (the process's first Vulkan backend or context
  // decides both, and the instance keeps that sink for the process's life).
  bool vk_validation = false;
  // CUDA time_layers on a graph-stable Workspace whose limits are the plan's
  // times this factor (>= 1; 0: a growing workspace sized to the plan), so a
  // benchmark sees what fixed grids cost a serving engine's captured graph.
  double cuda_graph_headroom = 0.0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const noexcept = 0;
  // Computes O (and LSE when args.lse.data is set) for every query of the plan.
  // The tensors live in host memory. Throws InvalidArgument when a tensor's
  // shape or dtype does not match the plan.
  virtual void run(const Plan& plan, const AttentionArgs& args) = 0;

  // The device path, on memory of the backend's device: `stream` is a
  // cudaStream_t (CUDA) or the VkCommandBuffer being recorded (Vulkan).
  // enqueue() uploads `plan` first, on the same stream, unless it is the plan
  // (Plan::id) the workspace holds. The defaults throw InvalidArgument: the
  // CPU backend has host arrays only.
  virtual void upload(const Plan& plan, void* stream);
  virtual void enqueue(const Plan& plan, const AttentionArgs& device_tensors, void* stream);
  // CUDA: the workspace becomes graph-stable with these capacities
  // (cuda::Workspace); the default throws InvalidArgument.
  virtual void graph_stable(const cuda::WorkspaceLimits& limits);
  virtual bool graph_stable() const noexcept { return false; }

  // For benchmarks: `repeats` timings, in microseconds, of `layers` consecutive
  // attention calls of one decode step (the plan prepared once, as a model
  // shares it between layers). The default times run() on the host; a GPU
  // backend keeps the data on the device, gives each layer its own KV pool where
  // memory allows, replays the calls as one graph and times it on the GPU.
  virtual std::vector<double> time_layers(const Plan& plan, const AttentionArgs& args, int layers, int repeats);

  // For benchmarks: `repeats` host timings, in microseconds, of uploading a
  // decode step's plan to a device workspace (filling its staging memory and
  // queueing the copies: what the host spends per step beside planning).
  // Empty for a backend that has no device (the CPU's).
  virtual std::vector<double> time_uploads(const Plan& plan, int repeats);

  // Roofline bandwidth in GB/s that benchmarks compare against (0: unknown).
  virtual double peak_gbps() { return 0.0; }

  // The planner's cost model for this device (tile rows, the greedy strategy):
  // a fitted model, a calibrated one or the H100 fit scaled to the device
  // (CostModel::source says which).
  virtual CostModel cost_model() const { return cost_model_for("h100"); }
};

// Throws Backend when `kind` is not built into this library or has no device here.
std::unique_ptr<Backend> make_backend(BackendKind kind, const BackendOptions& options = {});

// What `automatic` is for Q of `q_dtype`: itself (CUDA, a Vulkan GPU, the CPU),
// except that f32 skips Vulkan, whose shaders take f16 and bf16: CUDA where a
// device is there, else the CPU.
BackendKind automatic_for(DType q_dtype);

// A Vulkan device as `treeattn devices` reports it: what it is and the
// capabilities that choose the shader variant.
struct VulkanDeviceReport {
  int index = 0;
  std::string name, type, driver, api_version;
  std::uint32_t subgroup_size = 0, min_subgroup_size = 0, max_subgroup_size = 0;
  std::uint32_t shared_memory_bytes = 0;
  std::uint64_t max_storage_buffer_range = 0, max_allocation_bytes = 0, device_local_bytes = 0;
  bool cooperative_matrix = false;
  std::vector<std::string> cooperative_matrix_shapes;  // "16x16x16 f16->f32", subgroup scope
  std::string variant_f16, variant_bf16;               // the stage-1 variant chosen, and why
  bool selected = false;                               // the device --backend vulkan would use
  std::uint32_t compute_units = 0;                     // SMs or CUs where the device says (0: it does not)
  // The planner's cost model on the device (CostModel::source, to_string());
  // empty where the device cannot run treeattn.
  std::string cost_model_source, cost_model;
};
// Throws Backend when this build has no Vulkan backend or there is no loader.
// Opens each device that can run treeattn for its cost model (which may
// calibrate it: options.model_cache keeps the result).
std::vector<VulkanDeviceReport> vulkan_devices(const BackendOptions& options = {});

// A CUDA device as `treeattn devices` reports it.
struct CudaDeviceReport {
  int index = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0, sms = 0;
  double peak_gbps = 0.0;
  std::string cost_model_source, cost_model;  // as VulkanDeviceReport's
  std::string error;                          // why the device cannot be used ("" when it can)
};
// Every CUDA device this process sees (none without the CUDA backend, a driver or a GPU).
std::vector<CudaDeviceReport> cuda_devices(const BackendOptions& options = {});

// What an attention call's tensors must match: a plan's heads, queries and
// the KV rows it reads (what a device workspace keeps of its uploaded plan).
struct CallShape {
  HeadConfig heads;
  std::int32_t num_queries = 0;
  std::int64_t min_kv_slots = 0;

  static CallShape of(const Plan& plan);
};

// Checks every tensor of `args` against the plan (shapes, dtypes, KV rows the
// plan reads, row strides: Q, K, V and O rows at least a row apart and
// 16-byte aligned, LSE dense), the attention options (their tensors' lengths
// and dtypes, the soft-cap's sign, scales only with fp8 K and V). Every
// backend runs every variant (DESIGN.md §8) at every head dim the planner
// takes. Backends call it first; throws InvalidArgument naming the tensor or
// the option.
void check_args(const CallShape& shape, const AttentionArgs& args);
inline void check_args(const Plan& plan, const AttentionArgs& args) { check_args(CallShape::of(plan), args); }
// The values of per-KV-head scales in host memory (k_scales, v_scales): each
// positive and finite, else InvalidArgument naming the tensor and the head. A
// backend calls it where the scales are host arrays (device memory is not read
// back to check it: no hidden synchronisation).
void check_host_scale_values(const AttentionOptions& options);

}  // namespace treeattn
