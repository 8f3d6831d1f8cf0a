#pragma once
// What a `treeattn demo` run will need, known before its first step from dry
// replays of its scenario: a fresh copy of the same seeded scenario, advanced
// the same number of steps, with no K/V written and no attention run.

#include <cstdint>

#include "demo_options.hpp"
#include "demo_runner.hpp"
#include "treeattn/treeattn.hpp"

namespace treeattn::cli {

// The peaks the KV cache (the pool holds the peak) and Q are sized for.
struct PeakSizes {
  std::int64_t pages = 0, queries = 1;
};
PeakSizes peak_sizes(const DemoOptions& o, std::int64_t steps);

// Every step of `steps` planned as the run plans (the same changes handed to
// an IncrementalPlanner of the same heads and options over a pool of the same
// `pool_pages`, so the same plans), handed to `runner`'s reserve() with the
// count of K/V rows the step writes.
void reserve_ahead(const DemoOptions& o, std::int64_t steps, const HeadConfig& heads, const PlanOptions& options,
                   std::int64_t pool_pages, StepRunner& runner);

}  // namespace treeattn::cli
