#pragma once
// A device's cost model from timed plans: the plans a backend times on a
// device that has no fitted model, and the least-squares fit of their times to
// the model's coefficients. Host-only: each backend times the plans
// (backends/cuda/calibrate.cpp, backends/vulkan/calibrate.cpp).

#include <cstdint>
#include <string>
#include <vector>

#include "treeattn/cost_model.hpp"
#include "treeattn/plan.hpp"

namespace treeattn {

// Plans of uniform CTAs (every pass of a plan has the same rows and KV tiles)
// over forests of single-node requests, one KV head, head_dim 128: 64-row
// passes over 2 and 16 tiles, 16-row passes over 2 and 16 tiles, 2-tile passes
// whose queries merge 8 partials each, and one 8-tile pass for every
// 1, 2, 3, 4, 6 and 8 per compute unit (how many run at once). `compute_units`
// (> 0) sizes them: about 4 passes per unit, so the device is full.
std::vector<Plan> calibration_plans(std::int32_t compute_units);

// The KV rows the largest of those plans reads.
std::int64_t calibration_kv_slots(const std::vector<Plan>& plans);

struct CalibrationFit {
  CostModel model;          // `base` with pass_ns, tile_ns_large, tile_ns_small, partial_ns, slots and solo_speedup fitted
  double overhead_us = 0;   // per call, beside the model's terms (launches): fitted, not part of the model
  double rms_error = 0;     // root mean square of the relative errors of the fitted times
};

// Fits `call_us[i]`, the measured time of one call of `plans[i]`, to
//   estimate_cost(plans[i], model).time_us + overhead_us
// by least squares on relative errors, for every CTAs-per-unit count 1-8 and
// solo_speedup 1-2 in quarters (each choice makes the time linear in the
// four costs and the overhead), keeping the best; each cost is then clamped
// to [base / 10, base x 1000] (a cost the timings cannot separate from the
// others comes out at a bound). `compute_units` sets sms. Throws
// InvalidArgument when the sizes differ or a time is not positive.
CalibrationFit fit_cost_model(const std::vector<Plan>& plans, const std::vector<double>& call_us,
                              std::int32_t compute_units, const CostModel& base);

// One line per plan: its measured time, the fitted model's and `other`'s
// (each plus the fitted overhead), for a log that compares the two.
std::string describe_fit(const std::vector<Plan>& plans, const std::vector<double>& call_us, const CalibrationFit& fit,
                         const CostModel& other);

}  // namespace treeattn
