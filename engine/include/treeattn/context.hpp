#pragma once
// treeattn::Context: one backend on one device, and everything that runs plans
// there. It owns the device's cost model (plans made through it are planned
// for this device), one workspace (growing, or graph-stable with limits) and
// the record of which plan that workspace holds, so a plan is uploaded once
// however many layers run it. Every surface is a thin layer over it: the C API
// (treeattn.h), the Python package and the CLI.
//
//   treeattn::Context ctx;                                  // auto: CUDA, then a Vulkan GPU, then the CPU
//   treeattn::IncrementalPlanner planner = ctx.planner(heads);
//   each decode step:
//     hand the step's changes to planner (append_range, add_node, remove_node, set_queries, ...)
//     const treeattn::Plan& plan = planner.update();
//     for each layer: ctx.enqueue(plan, {q, k[l], v[l], o, lse}, stream);   // device memory, the caller's stream
//                 or  ctx.run(plan, {q, k[l], v[l], o, lse});               // host arrays
//
// The device path: CUDA runs on the caller's cudaStream_t (capturable in a
// CUDA graph once the workspace is graph-stable and the step's plan uploaded);
// Vulkan records into the caller's VkCommandBuffer on the application's
// device (Context(vulkan::ExternalDevice) in treeattn/vulkan.hpp, whose
// barrier and lifetime rules apply). Tensors then hold device pointers (CUDA)
// or buffer device addresses (Vulkan). Nothing on that path synchronises with
// the device or allocates, except the upload of a plan that outgrows a
// growing workspace. The cuda:: and vulkan:: Contexts and Workspaces beneath
// remain for callers that manage each step themselves.
//
// Threads: a Context serves one thread (and one stream) at a time; plans and
// trees may be shared read-only between threads and contexts. A host-array
// call after device calls waits for the device first (cudaDeviceSynchronize):
// it returns only once its outputs are written in any case.
//
// Logs: the first Vulkan context of a process (or its first Vulkan backend)
// opens treeattn's instance, whose validation messages go to that context's
// log sink for the rest of the process: give it a sink that lives as long.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "treeattn/cost_model.hpp"
#include "treeattn/cuda.hpp"
#include "treeattn/incremental_planner.hpp"
#include "treeattn/log.hpp"
#include "treeattn/plan.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/tensor.hpp"
#include "treeattn/tree.hpp"

struct VkCommandBuffer_T;  // VkCommandBuffer is VkCommandBuffer_T*

namespace treeattn {

class Backend;
namespace vulkan {
struct ExternalDevice;
}

enum class BackendKind { automatic, cpu, vulkan, cuda };

const char* to_string(BackendKind kind) noexcept;
// Parses "auto", "cpu", "vulkan", "cuda"; throws InvalidArgument naming the choices.
BackendKind parse_backend(const std::string& name);

struct CpuOptions {
  int threads = 0;  // worker threads; 0: one per hardware thread
};

struct VulkanOptions {
  // Stage-1 shaders: "auto" (cooperative matrices where the device and its
  // enabled features allow), "scalar", "coopmat", "coopmat-shared".
  std::string variant = "auto";
  // A file that keeps compiled pipelines between processes ("": none).
  std::string pipeline_cache_path;
  // The Khronos validation layer on treeattn's own instance (the process's
  // first Vulkan context decides); its messages go to the log.
  bool validation = false;
};

struct ContextOptions {
  BackendKind backend = BackendKind::automatic;  // automatic: CUDA, then a Vulkan GPU, then the CPU
  int device = -1;       // GPU index; -1: CUDA device 0, or the first discrete Vulkan GPU
  bool verbose = false;  // log which device and kernel variant run
  LogSink log;           // where messages go (none: dropped)
  // CUDA and Vulkan: a JSON file that keeps the cost models calibrated on devices
  // without a fitted one, keyed by device and driver ("": this process only).
  std::string model_cache_path;
  CpuOptions cpu;
  VulkanOptions vulkan;
};

class Context {
 public:
  // A backend on a device. Throws Backend naming the reason when the backend
  // asked for is not built in or has no usable device.
  explicit Context(const ContextOptions& options = {});
  // The application's Vulkan device (treeattn/vulkan.hpp): the device path only.
  Context(const vulkan::ExternalDevice& device, const ContextOptions& options = {});
  ~Context();
  Context(Context&&) noexcept;
  Context& operator=(Context&&) noexcept;

  BackendKind backend() const noexcept;
  // The planner's model of this device (PlanOptions::cost of every plan made
  // here), made when the context is: fitted, read from the model cache, or
  // calibrated then (docs/greedy.md, "Device models").
  const CostModel& cost_model() const noexcept { return cost_; }

  // plan() with options.cost set to this device's model.
  Plan plan(const Tree& tree, PlanOptions options = {}) const;
  // An IncrementalPlanner with this device's model, empty or starting from `initial`.
  IncrementalPlanner planner(const HeadConfig& heads, PlanOptions options = {},
                             const IncrementalOptions& incremental = {}) const;
  IncrementalPlanner planner(const Tree& initial, PlanOptions options = {},
                             const IncrementalOptions& incremental = {}) const;

  // Host arrays: returns when O (and LSE, unless its data is null) are written.
  // After device calls it first waits for them. Not on an application's Vulkan device.
  void run(const Plan& plan, const AttentionArgs& host_tensors);

  // CUDA: device pointers, ordered on `stream`, returning without waiting;
  // `plan` is uploaded first on the same stream unless the workspace holds it
  // (refused inside a graph capture: upload before capturing).
  void enqueue(const Plan& plan, const AttentionArgs& device_tensors, CUstream_st* stream);
  void upload(const Plan& plan, CUstream_st* stream);
  // Vulkan (the application's device): buffer device addresses, recorded into `commands`.
  void record(const Plan& plan, const AttentionArgs& device_addresses, VkCommandBuffer_T* commands);

  // CUDA: the workspace becomes graph-stable, its capacities fixed to `limits`
  // (or to the largest of `plans` times `headroom`): every enqueue then records
  // the same launches, so a captured graph replays each later plan that fits,
  // once upload() has put it there. A plan beyond them is refused naming the count.
  void graph_stable(const cuda::WorkspaceLimits& limits);
  void graph_stable(const std::vector<const Plan*>& plans, double headroom = 1.0);
  bool is_graph_stable() const noexcept;

 private:
  explicit Context(std::unique_ptr<Backend> backend);

  std::unique_ptr<Backend> backend_;
  BackendKind kind_ = BackendKind::cpu;
  CostModel cost_;
};

}  // namespace treeattn
