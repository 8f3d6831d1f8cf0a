#include "demo_dry_replay.hpp"

#include <algorithm>
#include <vector>

#include "treeattn/tools.hpp"

namespace treeattn::cli {
namespace {

NamedScenario fresh_scenario(const DemoOptions& o) { return std::move(make_scenarios(o.kind, o.workloads).front()); }

}  // namespace

PeakSizes peak_sizes(const DemoOptions& o, std::int64_t steps) {
  NamedScenario dry = fresh_scenario(o);
  PagedKvCache counter(o.page_size, 0);
  SequenceTree tree(counter);
  std::vector<TreeQuery> queries;
  PeakSizes peak;
  for (std::int64_t s = 0; s < steps; ++s) {
    dry.scenario->advance(tree, queries);
    peak.queries = std::max(peak.queries, std::int64_t(queries.size()));
  }
  peak.pages = counter.peak_pages_in_use();
  return peak;
}

void reserve_ahead(const DemoOptions& o, std::int64_t steps, const HeadConfig& heads, const PlanOptions& options,
                   std::int64_t pool_pages, StepRunner& runner) {
  NamedScenario dry = fresh_scenario(o);
  PagedKvCache cache(o.page_size, pool_pages);
  SequenceTree tree(cache);
  IncrementalPlanner planner(heads, options, incremental_options(o.bitwise_updates, o.plan.plan_threads));
  std::vector<TreeQuery> queries;
  std::vector<std::int64_t> written;
  for (std::int64_t step = 1; step <= steps; ++step) {
    dry.scenario->advance(tree, queries);
    written.clear();
    tree.sync(planner, queries, &written);
    runner.reserve(planner.update(), written.size());
  }
}

}  // namespace treeattn::cli
