#pragma once
// The Vulkan backend: picks a device and a shader variant from queried
// features, uploads the plan and tensors, and runs stage 1 and the merge as
// compute dispatches; time_layers replays a recorded multi-layer command
// buffer and reads GPU timestamps.

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include "treeattn/backend.hpp"
#include "vk_buffer.hpp"
#include "vk_device.hpp"
#include "vk_pipeline.hpp"
#include "vk_plan.hpp"

namespace treeattn::vulkan {

class CommandSequence;

// scalar: tree_attn_scalar.comp (any device); coopmat_shared:
// tree_attn_coopmat.comp (cooperative matrices, softmax through shared memory,
// any layout); coopmat_fragments: tree_attn_coopmat_fragments.comp (softmax in
// registers, where the matrices keep mma.sync's fragment layout).
enum class Variant { scalar, coopmat_shared, coopmat_fragments };

// The stage-1 shader variant for inputs of this dtype on this device: `forced`
// is "auto" (coopmat where the device and this build can, else scalar),
// "scalar", "coopmat" (throws Backend saying why the device cannot) or
// "coopmat-shared" (the shared-memory softmax even where the fragments one
// runs). The coopmat variants take the fragments shader when
// `fragment_layout` (coopmat_fragment_layout() of the device) and its two K/V
// stages of `head_dim` fit the shared memory (0: any head_dim, as `treeattn
// devices` lists them). `reason` receives the choice and why, for --verbose
// and `treeattn devices`.
Variant choose_variant(const DeviceCaps& caps, const std::string& forced, DType inputs, bool fragment_layout, int head_dim,
                       std::string* reason = nullptr);

// Tokens per shared-memory stage of a coopmat stage-1 shader at `head_dim`
// (`fragments`: tree_attn_coopmat_fragments.comp, else tree_attn_coopmat.comp):
// 32 (one 32-bit visibility word per query and stage) or 16, the most that fit
// the device's shared memory; 0 when neither does (the backend then runs the
// shared-memory shader in place of the fragments one).
std::uint32_t coopmat_chunk_tokens(const DeviceCaps& caps, int head_dim, bool fragments);

class VulkanBackend final : public Backend {
 public:
  // Throws Backend naming the reason when no usable Vulkan device exists.
  explicit VulkanBackend(const BackendOptions& options);
  ~VulkanBackend() override;
  // For --backend auto: a backend on the selected device when it is a GPU that
  // runs the shaders; null when there is no loader, no device, or only a CPU one.
  static std::unique_ptr<Backend> make_for_gpu(const BackendOptions& options);

  const char* name() const noexcept override { return "vulkan"; }
  void run(const Plan& plan, const AttentionArgs& args) override;
  std::vector<double> time_layers(const Plan& plan, const AttentionArgs& args, int layers, int repeats) override;
  // peak_gbps() stays unknown (0): Vulkan does not report the memory clock.
  // The H100 model with one block size for --block-tokens auto (see the .cpp).
  CostModel cost_model() const override;


 private:
  // Opens `caps` (probing and selecting when null) on `instance`.
  VulkanBackend(const BackendOptions& options, std::shared_ptr<Instance> instance, const DeviceCaps* caps);
  struct Staged;  // the device buffers of one call's tensors and plan
  void stage(const Plan& plan, const AttentionArgs& args, int kv_pools);
  // Stage 1 and the merge of one layer, with the barrier between them; the caller
  // orders layers against each other and against copies.
  void record_layer(CommandSequence& sequence, const Plan& plan, const AttentionArgs& args, int pool);
  const ComputePipeline& stage1_pipeline(Variant variant, int head_dim, bool bf16);
  const ComputePipeline& merge_pipeline(int head_dim);
  void log_statistics(const std::string& what, const ComputePipeline& pipeline) const;

  BackendOptions options_;
  std::shared_ptr<Instance> instance_;
  std::unique_ptr<Device> device_;
  VkPipelineCache cache_ = VK_NULL_HANDLE;
  std::string cache_path_;  // TREEATTN_VK_PIPELINE_CACHE, empty when unset
  std::map<std::tuple<Variant, int, bool>, std::unique_ptr<ComputePipeline>> stage1_;
  std::map<int, std::unique_ptr<ComputePipeline>> merge_;
  std::unique_ptr<Staged> staged_;
  std::string logged_variant_;
  std::optional<bool> fragment_layout_;  // coopmat_fragment_layout() of the device, once probed
};

}  // namespace treeattn::vulkan
