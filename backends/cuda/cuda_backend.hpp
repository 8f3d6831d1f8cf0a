#pragma once
// The CUDA backend behind make_backend(): the host-array API and the
// benchmarks' timed layers, both a thin layer over the device path of
// treeattn/cuda.hpp (a Context and a growing Workspace).

#include <cuda_runtime_api.h>

#include "device_buffer.hpp"
#include "treeattn/backend.hpp"
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
  std::vector<double> time_layers(const Plan& plan, const AttentionArgs& args, int layers, int repeats) override;
  std::vector<double> time_uploads(const Plan& plan, int repeats) override;
  double peak_gbps() override { return context_.info().peak_gbps; }
  CostModel cost_model() const override { return context_.cost_model(); }

 private:
  // Uploads the plan and copies Q, K and V to the device; returns the device tensors.
  AttentionArgs stage_inputs(const Plan& plan, const AttentionArgs& args);

  BackendOptions options_;
  Context context_;
  cudaStream_t stream_ = nullptr;
  Workspace workspace_;
  DeviceBuffer q_, k_, v_, o_, lse_;
};

}  // namespace treeattn::cuda
