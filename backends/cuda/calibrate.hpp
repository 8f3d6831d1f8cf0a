#pragma once
// The cost model of a CUDA device without a fitted one, from the calibration
// plans (engine/src/calibration.hpp) timed on it.

#include <string>

#include "treeattn/cuda.hpp"

namespace treeattn::cuda {

// Times each calibration plan on a stream of its own (a growing Workspace,
// zero-filled f16 tensors, four layers of their own KV back to back between
// two events, the fastest of three after one untimed) and fits the model to
// the times; `source` names it. `log` (at verbose) gets each plan's time, the
// fit's and the H100 fit's. Throws Error when a call or the fit fails.
CostModel calibrated_cost_model(const Context& context, const std::string& source, const LogSink& log);

}  // namespace treeattn::cuda
