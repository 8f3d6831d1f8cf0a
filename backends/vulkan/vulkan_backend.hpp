#pragma once
// The Vulkan backend behind make_backend(): host arrays copied to the device
// and back, and the benchmarks' timed layers, both a thin layer over the
// device path of treeattn/vulkan.hpp (a Context on treeattn's own device and
// one Workspace per input dtype).

#include <memory>

#include "treeattn/backend.hpp"
#include "treeattn/vulkan.hpp"
#include "variant.hpp"
#include "workspace_state.hpp"

namespace treeattn::vulkan {

// The Vulkan part of `o`: the device is `device`, or `vk_device` where that is -1.
ContextOptions context_options(const BackendOptions& o);

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

  Context context_;
  std::unique_ptr<Workspace> workspaces_[2];  // f16 and bf16 inputs
  std::unique_ptr<Staged> staged_;
};

}  // namespace treeattn::vulkan
