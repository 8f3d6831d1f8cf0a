#pragma once
// What a `treeattn demo` run will need, known before its first step from dry
// replays of its scenario: a fresh copy of the same seeded scenario, advanced
// the same number of steps, with no K/V written and no attention run.

#include <cstdint>

#include "demo_options.hpp"
#include "treeattn/treeattn.hpp"

namespace treeattn::cli {

// The peaks the KV cache (the pool holds the peak) and Q are sized for.
struct PeakSizes {
  std::int64_t pages = 0, queries = 1;
};
PeakSizes peak_sizes(const DemoOptions& o, std::int64_t steps);

// The counts of the largest plan of `steps` steps, planned as the run plans:
// the same changes handed to an IncrementalPlanner of the same heads and
// options over a pool of the same `pool_pages`, so the same plans.
cuda::WorkspaceLimits largest_plan(const DemoOptions& o, std::int64_t steps, const HeadConfig& heads,
                                   const PlanOptions& options, std::int64_t pool_pages);

}  // namespace treeattn::cli
