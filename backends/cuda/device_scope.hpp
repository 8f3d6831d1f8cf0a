#pragma once
// Makes a device current for one call and gives the caller's thread its own
// current device back: the library never leaves the thread's CUDA state changed.

#include <cuda_runtime_api.h>

#include "cuda_check.hpp"

namespace treeattn::cuda {

class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    TREEATTN_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) TREEATTN_CUDA_CHECK(cudaSetDevice(device));
    changed_ = previous_ != device;
  }
  ~DeviceScope() {
    if (changed_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

}  // namespace treeattn::cuda
