#pragma once
// The CUDA backend (host side): device selection, the plan upload, tensor
// staging for the host-array API, and GPU timing of whole decode steps.

#include <cuda_runtime_api.h>

#include "device_buffer.hpp"
#include "device_plan.hpp"
#include "treeattn/backend.hpp"

namespace treeattn::cuda {

// Devices this process can use (0 when there is no driver or no GPU).
int device_count() noexcept;

class CudaBackend final : public Backend {
 public:
  // Throws Backend naming the reason when no CUDA device can be used.
  explicit CudaBackend(const BackendOptions& options);
  ~CudaBackend() override;

  const char* name() const noexcept override { return "cuda"; }
  void run(const Plan& plan, const AttentionArgs& args) override;
  std::vector<double> time_layers(const Plan& plan, const AttentionArgs& args, int layers, int repeats) override;
  double peak_gbps() override { return peak_gbps_; }
  CostModel cost_model() const override;

  // The device-resident API: enqueue one attention call on `stream`, with the
  // plan uploaded by DevicePlan::upload and tensors already on the device
  // (args' data pointers are device pointers). Graph-capturable.
  static void enqueue(const DevicePlan& plan, const AttentionArgs& device_args, cudaStream_t stream);

 private:
  void stage_inputs(const Plan& plan, const AttentionArgs& args);

  cudaStream_t stream_ = nullptr;
  double peak_gbps_ = 0.0;
  double sms_ = 0.0;    // the device's SMs
  double slots_ = 0.0;  // stage-1 CTAs in flight (head_dim 128): SMs x CTAs per SM
  DevicePlan plan_;
  DeviceBuffer q_, k_, v_, o_, lse_;
};

}  // namespace treeattn::cuda
