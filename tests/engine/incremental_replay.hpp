#pragma once
// What the IncrementalPlanner's tests share: decode replays synced into a
// planner and compared step by step with from-scratch plans, the checks of a
// plan on a held layout, and the seeded forests of the random cases.

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "support/plan_check.hpp"
#include "support/workloads_dir.hpp"
#include "treeattn/error.hpp"
#include "treeattn/incremental_planner.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/scenarios.hpp"
#include "treeattn/sequence_tree.hpp"
#include "treeattn/workloads.hpp"

namespace treeattn::incremental_test {

inline const std::string kWorkloads = test::workloads_dir();
inline const HeadConfig kHeads{32, 8, 128, 0.0f};

// Every update bitwise plan(tree(), held_options()): no layout held.
inline IncrementalOptions bitwise() {
  IncrementalOptions incremental;
  incremental.hold_flatten_blocks = false;
  incremental.hold_greedy_groups = false;
  return incremental;
}

// What a replay's updates did, for the checks that the fast path ran.
struct ReplayCounts {
  std::int64_t steps = 0, appends_only = 0, chosen = 0;
  std::int64_t replaced = 0;  // steps that replaced nodes by ones of the same shape (no reanalysis)
  std::int64_t held = 0;      // steps on a layout kept from an earlier step (PlanUpdate::held_layout)
};

// A held plan: valid, every query's tokens covered exactly, and each of
// flatten's blocks within the length the planner allows a held block.
inline std::string held_plan_error(const IncrementalPlanner& planner, const IncrementalOptions& incremental, const Tree& tree,
                            const Plan& held) {
  try {
    validate(held);
  } catch (const Error& e) {
    return e.what();
  }
  if (planner.held_options().strategy == Strategy::flatten) {
    const auto limit = std::int32_t(double(planner.block_tokens()) * (1.0 + incremental.redecide_drift));
    std::int32_t longest = planner.block_tokens();
    for (std::int32_t b = 0; b < held.num_blocks(); ++b) longest = std::max(longest, held.block_token_count(b));
    if (longest > limit) return "a held block of " + std::to_string(longest) + " tokens > " + std::to_string(limit);
    if (held.block_tokens != longest) return "block_tokens is not the longest held block";
  }
  return test::coverage_error(tree, held);
}

// Replays `scenario` to its end, syncing a SequenceTree into an
// IncrementalPlanner each step. Every plan must equal the from-scratch plan
// of the same tree with the planner's held options (and, where it made the
// cost model's choices, the plan of the options as given), except plans on a
// layout held from an earlier step (`incremental`'s holds): those must be
// valid and cover every query's tokens exactly. Greedy holds its edge
// decisions at every step between the ones that decide them.
inline ReplayCounts replay_and_compare(Scenario& scenario, const PlanOptions& options, std::int64_t max_steps = 0,
                                const IncrementalOptions& incremental = bitwise()) {
  PagedKvCache cache(16, 0);
  SequenceTree live(cache);
  IncrementalPlanner planner(kHeads, options, incremental);
  std::vector<TreeQuery> queries;
  ReplayCounts counts;
  bool decides = true;  // this step's greedy decides its edges (the first, or after a choice or a reshaping)
  const std::int64_t steps = max_steps > 0 ? std::min(max_steps, scenario.steps()) : scenario.steps();
  for (std::int64_t step = 1; step <= steps; ++step) {
    scenario.advance(live, queries);
    live.sync(planner, queries);
    const Plan& updated = planner.update();
    const PlanUpdate& did = planner.last_update();
    const Tree tree = live.to_tree(kHeads, queries);
    if (options.strategy == Strategy::greedy) {
      CHECK(did.held_layout == (incremental.hold_greedy_groups && options.window == 0 && !decides && !did.chosen &&
                                !did.reanalysed &&
                                planner.held_options().greedy_candidate == GreedyCandidate::own));
    }
    decides = did.chosen || did.reanalysed;
    if (did.held_layout) {
      ++counts.held;
      const std::string error = held_plan_error(planner, incremental, tree, updated);
      if (!error.empty()) {
        FAIL_CHECK(scenario.name(), " step ", step, " (held layout): ", error);
        return counts;
      }
    } else {
      const std::string difference = test::plan_difference(updated, plan(tree, planner.held_options()));
      if (!difference.empty()) {
        FAIL_CHECK(scenario.name(), " step ", step, ": ", difference);
        return counts;
      }
      if (options.window > 0) {  // the windows slid with the appends: still each query's last tokens exactly
        const std::string error = test::coverage_error(tree, updated, options.window);
        if (!error.empty()) {
          FAIL_CHECK(scenario.name(), " step ", step, " (window ", options.window, "): ", error);
          return counts;
        }
      }
    }
    if (did.chosen) {
      ++counts.chosen;
      CHECK(test::plan_difference(updated, plan(tree, options)) == "");
    }
    ++counts.steps;
    if (!did.reanalysed) ++counts.appends_only;
    if (!did.reanalysed && did.replaced_nodes > 0) ++counts.replaced;
  }
  return counts;
}

inline constexpr Strategy kIncremental[] = {Strategy::flatten, Strategy::greedy};

// A seeded forest in three trees, up to 40 tokens a node.
inline Tree small_forest(std::uint64_t seed, std::int32_t nodes = 60, std::int32_t queries = 30) {
  RandomForestOptions forest;
  forest.seed = seed;
  forest.nodes = nodes;
  forest.roots = 3;
  forest.queries = queries;
  forest.max_tokens = 40;
  return random_forest(forest);
}

// Flatten on a device of four CTA slots: the test trees fill it, so its
// held blocks may grow past block_tokens (held_block_limit()).
inline PlanOptions on_small_device(std::int32_t block_tokens) {
  PlanOptions options{Strategy::flatten, block_tokens};
  options.cost.slots = 4.0;
  options.cost.sms = 1.0;
  return options;
}

}  // namespace treeattn::incremental_test
