#pragma once
// Calibrated cost models, kept per device and driver: in this process (a
// second context on the same device does not calibrate again) and, where the
// caller names one, in a JSON file that the next process reads:
//   {"version": 1, "models": {"<key>": {"source": "...", "coefficients": "pass_ns=...,..."}}}

#include <functional>
#include <string>

#include "treeattn/cost_model.hpp"
#include "treeattn/log.hpp"

namespace treeattn {

struct DeviceModelRequest {
  // What a model is valid for: the backend (and its shader variant), the
  // device's UUID and the driver's version.
  std::string key;
  std::string cache_path;  // the JSON file ("": none)
  LogSink log;             // at verbose: where the model came from; a cache file that cannot be read or written
  bool verbose = false;
};

// The model kept for `request.key` in this process, else in the file, else
// `calibrate()`'s, which is then kept in both. When `calibrate` throws Error,
// `fallback(its message)` is kept in this process alone (the next process
// tries again).
CostModel device_model(const DeviceModelRequest& request, const std::function<CostModel()>& calibrate,
                       const std::function<CostModel(const std::string& why)>& fallback);

}  // namespace treeattn
