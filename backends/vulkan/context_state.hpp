#pragma once
// What a treeattn::vulkan::Context holds: the device (treeattn's own or the
// application's), the pipeline cache, the pipelines built so far, and the
// choice of shader variant. Workspaces record with it.

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "treeattn/vulkan.hpp"
#include "variant.hpp"
#include "vk_device.hpp"
#include "vk_pipeline.hpp"

namespace treeattn::vulkan {

struct Context::State {
  // `caps` null: probe the instance's devices and select options.device.
  State(const ContextOptions& options, std::shared_ptr<Instance> instance, const DeviceCaps* caps);
  // The application's device.
  State(const ContextOptions& options, const ExternalDevice& external);
  ~State();
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  // The stage-1 variant for these inputs (and why, for `reason`).
  Variant variant(DType inputs, int head_dim, int head_dim_v, std::string* reason = nullptr) const;
  // Built on first use, then shared; safe to call from several threads.
  const ComputePipeline& stage1_pipeline(const ShaderKey& key);
  const ComputePipeline& merge_pipeline(const ShaderKey& key);  // of key.merge()
  // At verbose, says which variant runs and why, when it differs from the last said.
  void log_variant(const std::string& reason);

  ContextOptions options;
  std::uint64_t max_chunk_bytes = 0;     // the host-array path's KV chunks (0: the device's limit)
  std::uint32_t max_dispatch_run = 0;    // most work groups in a run along x (0: the device's limit)
  std::shared_ptr<Instance> instance;
  std::unique_ptr<Device> device;
  VkPipelineCache cache = VK_NULL_HANDLE;
  bool fragment_layout = false;          // coopmat_fragment_layout() of the device, probed when it can run coopmat

 private:
  void open_cache_and_probe();
  void log_statistics(const std::string& what, const ComputePipeline& pipeline) const;

  std::mutex mutex_;  // the pipeline maps and the variant log
  std::map<ShaderKey, std::unique_ptr<ComputePipeline>> stage1_;
  std::map<ShaderKey, std::unique_ptr<ComputePipeline>> merge_;
  std::string logged_variant_;
};

// The state behind a public Context, for the library and its tests.
inline Context::State& state_of(const Context& context) noexcept { return *context.state_; }

}  // namespace treeattn::vulkan
