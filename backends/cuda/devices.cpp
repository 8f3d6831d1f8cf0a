// cuda_devices(): what `treeattn devices` prints of the CUDA devices.

#include "backend.hpp"
#include "treeattn/cuda.hpp"
#include "treeattn/error.hpp"

namespace treeattn {

std::vector<CudaDeviceReport> cuda_devices(const BackendOptions& options) {
  std::vector<CudaDeviceReport> reports;
  for (int d = 0; d < cuda::device_count(); ++d) {
    CudaDeviceReport r;
    r.index = d;
    try {
      const cuda::Context context(d, cuda::ContextOptions{options.model_cache, options.verbose, options.log});
      const cuda::DeviceInfo& info = context.info();
      r.name = info.name;
      r.sm_major = info.sm_major;
      r.sm_minor = info.sm_minor;
      r.sms = info.sms;
      r.peak_gbps = info.peak_gbps;
      const CostModel model = context.cost_model();
      r.cost_model_source = model.source;
      r.cost_model = model.to_string();
    } catch (const Error& e) {
      r.error = e.what();
    }
    reports.push_back(std::move(r));
  }
  return reports;
}

}  // namespace treeattn
