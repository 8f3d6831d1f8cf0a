// make_backend(): the one place that knows which backends this build contains.

#include "treeattn/backend.hpp"

#include "fail.hpp"
#include "cpu/cpu_backend.hpp"
#ifdef TREEATTN_HAVE_CUDA
#include "cuda/cuda_backend.hpp"
#endif

namespace treeattn {

std::unique_ptr<Backend> make_backend(BackendKind kind, const BackendOptions& options) {
  switch (kind) {
    case BackendKind::automatic:  // CUDA when a device is there, else the CPU (Vulkan is not built yet)
#ifdef TREEATTN_HAVE_CUDA
      if (cuda::device_count() > 0) return std::make_unique<cuda::CudaBackend>(options);
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
      fail(ErrorCategory::Backend, "treeattn was built without the vulkan backend (this version has none; use cpu or cuda)");
  }
  fail(ErrorCategory::Backend, "unknown backend kind {}", int(kind));
}

}  // namespace treeattn
