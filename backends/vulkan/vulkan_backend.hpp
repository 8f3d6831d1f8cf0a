#pragma once
// The Vulkan backend behind treeattn::Context: a vulkan::Context (treeattn's
// own device, or the application's) with one Workspace per input dtype and
// which plan each holds. The device path records into the caller's command
// buffers; host arrays (treeattn's own device only) are copied to the device
// and back around the same recording, as are the benchmarks' timed layers.

#include <memory>

#include "backend.hpp"
#include "context_options.hpp"
#include "treeattn/vulkan.hpp"
#include "variant.hpp"
#include "workspace_state.hpp"

namespace treeattn::vulkan {

class VulkanBackend final : public Backend {
 public:
  // Throws Backend naming the reason when no usable Vulkan device exists.
  explicit VulkanBackend(const BackendOptions& options);
  // On the application's device: the device path only.
  VulkanBackend(const ExternalDevice& device, const BackendOptions& options);
  ~VulkanBackend() override;
  // For --backend auto: a backend on the selected device when it is a GPU that
  // runs the shaders; null when there is no loader, no device, or only a CPU one.
  static std::unique_ptr<Backend> make_for_gpu(const BackendOptions& options);

  const char* name() const noexcept override { return "vulkan"; }
  void run(const Plan& plan, const AttentionArgs& args) override;
  // `stream` is the VkCommandBuffer being recorded; tensors are buffer device addresses
  // (the plan's upload is recorded there too, when the workspace does not hold it).
  void enqueue(const Plan& plan, const AttentionArgs& device_tensors, void* stream) override;
  std::vector<double> time_layers(const Plan& plan, const AttentionArgs& args, int layers, int repeats) override;
  std::vector<double> time_uploads(const Plan& plan, int repeats) override;
  // peak_gbps() stays unknown (0): Vulkan does not report the memory clock.
  CostModel cost_model() const override { return context_.cost_model(); }

 private:
  explicit VulkanBackend(std::unique_ptr<Context::State> state);
  struct Staged;  // the device buffers of one call's tensors
  // Copies Q, K and V to the device (K and V `kv_pools` times) and uploads the plan.
  void stage(const Plan& plan, const AttentionArgs& args, int kv_pools);
  LayerTensors layer(const AttentionArgs& args, int pool) const;
  Workspace& workspace(DType inputs);
  // Records the upload of `plan` into the workspace of `inputs` unless it holds it.
  void upload_if_new(const Plan& plan, DType inputs, VkCommandBuffer commands);

  Context context_;
  bool own_device_ = true;
  std::unique_ptr<Workspace> workspaces_[2];  // f16 and bf16 inputs
  std::uint64_t uploaded_[2] = {0, 0};        // Plan::id each holds (0: none)
  std::unique_ptr<Staged> staged_;
};

}  // namespace treeattn::vulkan
