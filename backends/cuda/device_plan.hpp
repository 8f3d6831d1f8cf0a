#pragma once
// A Plan on the device: the arrays the kernels read, uploaded into one
// workspace (one copy per decode step, shared by every layer), each item's
// token map and the pass list derived from them, and the partial buffers.

#include <cuda_runtime_api.h>

#include "../../cuda/attn_params.hpp"
#include "device_buffer.hpp"
#include "treeattn/plan.hpp"

namespace treeattn::cuda {

class DevicePlan {
 public:
  // Uploads `plan`, ordered on `stream`. The staging copy is pageable host memory,
  // which the runtime has copied from by the time cudaMemcpyAsync returns, so a
  // later upload may reuse it at once.
  void upload(const Plan& plan, cudaStream_t stream);

  // Kernel parameters with the plan's pointers and sizes filled in; the caller
  // adds the tensors.
  KernelParams params() const { return params_; }
  int head_dim() const noexcept { return head_dim_; }

 private:
  DeviceBuffer workspace_;
  DeviceBuffer partials_;
  std::vector<unsigned char> staging_;
  KernelParams params_{};
  int head_dim_ = 0;
};

}  // namespace treeattn::cuda
