#pragma once
// The CUDA backend behind treeattn::Context: one cuda::Context and one
// Workspace (growing, or graph-stable once given limits) that the device path
// on the caller's streams, the host-array calls and the benchmarks' timed
// layers all use, and which plan that workspace holds.

#include <cuda_runtime_api.h>

#include "device_buffer.hpp"
#include "backend.hpp"
#include "treeattn/cuda.hpp"

namespace treeattn::cuda {

class CudaBackend final : public Backend {
 public:
  // The device of options.device (0 when it is -1). Throws Backend naming the
  // reason when no CUDA device can be used.
  explicit CudaBackend(const BackendOptions& options);
  ~CudaBackend() override;

  const char* name() const noexcept override { return "cuda"; }
  void run(const Plan& plan, const AttentionArgs& args) override;
  void upload(const Plan& plan, void* stream) override;
  void enqueue(const Plan& plan, const AttentionArgs& device_tensors, void* stream) override;
  void graph_stable(const WorkspaceLimits& limits) override;
  bool graph_stable() const noexcept override { return workspace_.graph_stable(); }
  std::vector<double> time_layers(const Plan& plan, const AttentionArgs& args, int layers, int repeats) override;
  std::vector<double> time_uploads(const Plan& plan, int repeats) override;
  double peak_gbps() override { return context_.info().peak_gbps; }
  CostModel cost_model() const override { return context_.cost_model(); }

 private:
  // Uploads `plan` on `stream` and records it as the one the workspace holds;
  // upload_if_new() does so unless it holds it already.
  void put(const Plan& plan, cudaStream_t stream);
  void upload_if_new(const Plan& plan, cudaStream_t stream);
  // Waits for the device calls on the caller's streams (the host-array path
  // then takes the workspace over on its own stream).
  void settle_device_calls();
  // Uploads the plan and copies Q, K, V and the options' tensors to the
  // device; returns the device tensors.
  AttentionArgs stage_inputs(const Plan& plan, const AttentionArgs& args);

  BackendOptions options_;
  Context context_;
  cudaStream_t stream_ = nullptr;
  Workspace workspace_;
  std::uint64_t uploaded_ = 0;     // Plan::id of the plan in workspace_ (0: none, or one to upload again)
  bool device_calls_ = false;      // calls on the caller's streams since the last host-array call
  DeviceBuffer q_, k_, v_, o_, lse_, sinks_, k_scales_, v_scales_;
};

}  // namespace treeattn::cuda
