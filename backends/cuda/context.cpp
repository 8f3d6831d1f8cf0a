// treeattn::cuda::Context: a device bound by index, its properties read once.

#include <fmt/format.h>

#include "../../cuda/attn_launch.hpp"
#include "calibrate.hpp"
#include "cuda_check.hpp"
#include "device_models.hpp"
#include "device_scope.hpp"
#include "treeattn/cuda.hpp"

namespace treeattn::cuda {

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  const ErrorCategory category = err == cudaErrorMemoryAllocation ? ErrorCategory::OutOfMemory : ErrorCategory::Backend;
  throw Error(category, fmt::format("CUDA: {} failed: {} ({}) at {}:{}", call, cudaGetErrorName(err),
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

bool uses_h100_fit(const DeviceInfo& info) {
  return info.sm_major == 9 && info.sm_minor == 0 &&
         (info.name.find("H100") != std::string::npos || info.name.find("H200") != std::string::npos);
}

}  // namespace

Context::Context(int device, const ContextOptions& options) : options_(options) {
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
  for (unsigned char byte : prop.uuid.bytes) info_.uuid += fmt::format("{:02x}", byte);
  TREEATTN_CUDA_CHECK(cudaDriverGetVersion(&info_.driver_version));
  info_.sm_major = prop.major;
  info_.sm_minor = prop.minor;
  info_.sms = prop.multiProcessorCount;
  info_.peak_gbps = device_peak_gbps(device);
  info_.stage1_ctas_per_sm = stage1_occupancy(128, 128).ctas_per_sm;
}

CostModel Context::cost_model() const {
  const double per_sm = info_.stage1_ctas_per_sm > 0 ? double(info_.stage1_ctas_per_sm) : CostModel{}.slots / CostModel{}.sms;
  const std::string driver = fmt::format("CUDA driver {}.{}", info_.driver_version / 1000, info_.driver_version % 1000 / 10);
  // The fit's device, an H100 SXM (132 SMs) or PCIe (114), and the H200, each
  // with its own slots: the H200 runs the DESIGN workloads' plans 1.02x faster
  // with the H100 fit than with its calibration (benchmarks/h200/device_model_cuda.json).
  if (uses_h100_fit(info_)) {
    return scaled_cost_model(cost_model_for("h100"), info_.sms, per_sm,
                             fmt::format("h100 (fitted on CUDA; {}, {} SMs)", info_.name, info_.sms));
  }
  const DeviceModelRequest request{fmt::format("cuda:{}:{}", info_.uuid, info_.driver_version), options_.model_cache_path,
                                   options_.log, options_.verbose};
  return device_model(
      request,
      [&] {
        return calibrated_cost_model(*this, fmt::format("calibrated on {} ({})", info_.name, driver),
                                           options_.verbose ? options_.log : LogSink{});
      },
      [&](const std::string& why) {
        return scaled_cost_model(cost_model_for("h100"), info_.sms, per_sm,
                                 fmt::format("h100 scaled to {} SMs (calibration failed: {})", info_.sms, why));
      });
}

}  // namespace treeattn::cuda
