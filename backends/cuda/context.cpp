// treeattn::cuda::Context: a device bound by index, its properties read once.

#include <fmt/format.h>

#include "../../cuda/attn_launch.hpp"
#include "cuda_check.hpp"
#include "device_scope.hpp"
#include "treeattn/cuda.hpp"

namespace treeattn::cuda {

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  throw Error(ErrorCategory::Backend, fmt::format("CUDA: {} failed: {} ({}) at {}:{}", call, cudaGetErrorName(err),
                                                  cudaGetErrorString(err), file, line));
}

int device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

namespace {

// HBM peak from the memory clock and bus width (double data rate).
double device_peak_gbps(int device) {
  int clock_khz = 0, bus_bits = 0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess) {
    cudaGetLastError();
    return 0.0;
  }
  return 2.0 * double(clock_khz) * 1e3 * double(bus_bits) / 8.0 / 1e9;
}

}  // namespace

Context::Context(int device) {
  const int count = device_count();
  if (count == 0) {
    int runtime = 0, driver = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);
    cudaGetLastError();
    throw Error(ErrorCategory::Backend,
                fmt::format("no CUDA device (runtime {}, driver {}): use the cpu or vulkan backend", runtime, driver));
  }
  if (device < 0 || device >= count) {
    throw Error(ErrorCategory::InvalidArgument,
                fmt::format("CUDA device {} does not exist: this process sees {} (0 to {})", device, count, count - 1));
  }
  DeviceScope scope(device);
  cudaDeviceProp prop{};
  TREEATTN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  if (prop.major < 8) {
    throw Error(ErrorCategory::Backend, fmt::format("CUDA device {} ({}) is sm_{}{}: the kernels need sm_80 or newer",
                                                    device, prop.name, prop.major, prop.minor));
  }
  // Once per device, here rather than before each launch: a graph capture must hold kernels only.
  TREEATTN_CUDA_CHECK(prepare_kernels());
  info_.index = device;
  info_.name = prop.name;
  info_.sm_major = prop.major;
  info_.sm_minor = prop.minor;
  info_.sms = prop.multiProcessorCount;
  info_.peak_gbps = device_peak_gbps(device);
  info_.stage1_ctas_per_sm = stage1_occupancy(128).ctas_per_sm;
}

CostModel Context::cost_model() const {
  CostModel model = cost_model_for("h100");  // fitted on the H100 (docs/greedy.md); other GPUs scale by their slots
  if (info_.stage1_ctas_per_sm > 0) {
    model.slots = double(info_.sms) * double(info_.stage1_ctas_per_sm);
    model.sms = double(info_.sms);
  }
  return model;
}

}  // namespace treeattn::cuda
