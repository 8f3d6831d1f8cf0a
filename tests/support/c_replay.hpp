#pragma once
// A decode replay driven through the C API's planner (treeattn_planner_*):
// leaves grow a token a step (ranged and paged nodes), leaves fork and are
// pruned, paged nodes join, and one query sees only part of its node. Every
// step the planner's plan runs on the context under test and is compared with
// a from-scratch plan of the same tree (bit for bit when the planner's updates
// are bitwise, but for greedy's layout choice, which the planner keeps between
// choices) and with the fp64 oracle.

#include <functional>

#include "support/conformance.hpp"
#include "treeattn/treeattn.h"

namespace treeattn::test {

// One attention call of `plan` on host arrays: treeattn_run, or a copy to the
// device around treeattn_enqueue.
using CallPlan = std::function<void(treeattn_context*, const treeattn_plan*, Inputs&, Outputs&)>;

struct CReplayOptions {
  treeattn_strategy strategy = TREEATTN_STRATEGY_FLATTEN;
  bool bitwise_updates = true;
  int steps = 24;
  std::int32_t window = 0;  // treeattn_plan_options.window (the oracle's too)
};

// Returns how many steps kept an earlier step's layout (treeattn_planner_held_layout).
int check_c_planner_replay(treeattn_context* context, const CallPlan& call, const CReplayOptions& options);

// treeattn_run on host arrays.
void call_on_host(treeattn_context* context, const treeattn_plan* plan, Inputs& in, Outputs& out);

}  // namespace treeattn::test
