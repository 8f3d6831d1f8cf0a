// make_backend(): the one place that knows which backends this build contains.

#include "treeattn/backend.hpp"

#include "fail.hpp"
#include "cpu/cpu_backend.hpp"

namespace treeattn {

std::unique_ptr<Backend> make_backend(BackendKind kind, const BackendOptions& options) {
  switch (kind) {
    case BackendKind::automatic:  // CUDA, then Vulkan, then the CPU: only the CPU is built so far
    case BackendKind::cpu: return std::make_unique<cpu::CpuBackend>(options);
    case BackendKind::vulkan:
    case BackendKind::cuda:
      fail(ErrorCategory::Backend, "treeattn was built without the {} backend (available: cpu)", to_string(kind));
  }
  fail(ErrorCategory::Backend, "unknown backend kind {}", int(kind));
}

}  // namespace treeattn
