// make_backend(): the one place that knows which backends this build contains.

#include "backend.hpp"

#include "fail.hpp"
#include "cpu/cpu_backend.hpp"
#ifdef TREEATTN_HAVE_CUDA
#include "cuda/cuda_backend.hpp"
#endif
#ifdef TREEATTN_HAVE_VULKAN
#include "vulkan/vulkan_backend.hpp"
#endif

namespace treeattn {

std::unique_ptr<Backend> make_backend(BackendKind kind, const BackendOptions& options) {
  switch (kind) {
    case BackendKind::automatic:  // CUDA when a device is there, then a Vulkan GPU, else the CPU
#ifdef TREEATTN_HAVE_CUDA
      if (cuda::device_count() > 0) return std::make_unique<cuda::CudaBackend>(options);
#endif
#ifdef TREEATTN_HAVE_VULKAN
      if (std::unique_ptr<Backend> gpu = vulkan::VulkanBackend::make_for_gpu(options)) return gpu;
#endif
      return std::make_unique<cpu::CpuBackend>(options);
    case BackendKind::cpu: return std::make_unique<cpu::CpuBackend>(options);
    case BackendKind::cuda:
#ifdef TREEATTN_HAVE_CUDA
      return std::make_unique<cuda::CudaBackend>(options);
#else
      fail(ErrorCategory::Backend, "treeattn was built without the cuda backend (no CUDA toolkit at configure time)");
#endif
    case BackendKind::vulkan:
#ifdef TREEATTN_HAVE_VULKAN
      return std::make_unique<vulkan::VulkanBackend>(options);
#else
      fail(ErrorCategory::Backend,
           "treeattn was built without the vulkan backend (configure found no Vulkan headers, volk or glslang)");
#endif
  }
  fail(ErrorCategory::Backend, "unknown backend kind {}", int(kind));
}

BackendKind automatic_for(DType q_dtype) {
  if (q_dtype != DType::f32) return BackendKind::automatic;
#ifdef TREEATTN_HAVE_CUDA
  if (cuda::device_count() > 0) return BackendKind::cuda;
#endif
  return BackendKind::cpu;
}

}  // namespace treeattn

#ifndef TREEATTN_HAVE_VULKAN
namespace treeattn {
std::vector<VulkanDeviceReport> vulkan_devices(const BackendOptions&) {
  fail(ErrorCategory::Backend,
       "treeattn was built without the vulkan backend (configure found no Vulkan headers, volk or glslang)");
}
}  // namespace treeattn
#endif

#ifndef TREEATTN_HAVE_CUDA
namespace treeattn {
std::vector<CudaDeviceReport> cuda_devices(const BackendOptions&) { return {}; }
}  // namespace treeattn
#endif
