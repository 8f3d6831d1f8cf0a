#pragma once
// The cost model of a Vulkan device without a fitted one, from the
// calibration plans (engine/src/calibration.hpp) timed on it.

#include <cstdint>
#include <string>

#include "treeattn/vulkan.hpp"

namespace treeattn::vulkan {

// Times each calibration plan on the context's own queue (a Workspace for f16,
// zero-filled tensors, four layers of their own KV in one command buffer
// between two timestamps, the fastest of three submissions after one
// untimed) and fits the model to the times over `compute_units`, from `base`;
// `source` names it. `log` (at verbose) gets each plan's time, the fit's and
// base's. Throws Error when the device cannot be timed (no queue of its own,
// no timestamps, buffers over its limits) or the fit fails.
CostModel calibrated_cost_model(const Context& context, std::uint32_t compute_units, const CostModel& base,
                                const std::string& source, const LogSink& log);

}  // namespace treeattn::vulkan
