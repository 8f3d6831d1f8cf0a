#pragma once
// Every CUDA runtime call goes through TREEATTN_CUDA_CHECK: a failure throws
// treeattn::Error with the call, the error's name and message, and where
// (OutOfMemory for cudaErrorMemoryAllocation, else Backend). A fault test's
// injected failure (fault_injection.hpp) is cudaErrorUnknown, the call not made.

#include <cuda_runtime_api.h>

#include <string>

#include "fault_injection.hpp"
#include "treeattn/error.hpp"

namespace treeattn::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);

}  // namespace treeattn::cuda

#define TREEATTN_CUDA_CHECK(call)                                                                 \
  do {                                                                                            \
    namespace treeattn_faults_ = ::treeattn::fault_injection;                                     \
    const cudaError_t treeattn_cuda_err_ =                                                        \
        treeattn_faults_::fails(treeattn_faults_::driver_call) ? cudaErrorUnknown : (call);       \
    if (treeattn_cuda_err_ != cudaSuccess) {                                                      \
      ::treeattn::cuda::throw_cuda_error(treeattn_cuda_err_, #call, __FILE__, __LINE__);           \
    }                                                                                             \
  } while (0)
