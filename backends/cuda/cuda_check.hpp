#pragma once
// Every CUDA runtime call goes through TREEATTN_CUDA_CHECK: a failure throws
// treeattn::Error(Backend) with the call, the error's name and message, and where.

#include <cuda_runtime_api.h>

#include <string>

#include "treeattn/error.hpp"

namespace treeattn::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);

}  // namespace treeattn::cuda

#define TREEATTN_CUDA_CHECK(call)                                                           \
  do {                                                                                      \
    const cudaError_t treeattn_cuda_err_ = (call);                                          \
    if (treeattn_cuda_err_ != cudaSuccess) {                                                \
      ::treeattn::cuda::throw_cuda_error(treeattn_cuda_err_, #call, __FILE__, __LINE__);     \
    }                                                                                       \
  } while (0)
