#pragma once
// Internal: what the cost model reads of a plan, without the plan. Choosing
// among candidate plans (block sizes, greedy's layout or flatten's) needs only
// each work item's size and the partial count; PlanBuilder records them in its
// shape mode, so only the chosen candidate is built in full.

#include <cstdint>
#include <limits>
#include <vector>

#include "cost_model_internal.hpp"
#include "treeattn/tree.hpp"

namespace treeattn {

struct ItemShape {
  std::int32_t queries;       // the item's queries (rows: queries x the group's query heads)
  std::int32_t block_tokens;  // tokens of the KV block it reads
  std::int32_t tile_rows;     // kLargeTileRows or kSmallTileRows
  std::int32_t block;         // the block's index (a block's items are adjacent)
};

struct PlanShape {
  std::vector<ItemShape> items;  // in the plan's item order, or in its launch order when `reorder` is false
  std::int64_t partials = 0;
  std::int32_t max_fanin = 0;  // the most partials one query has
  // The launch order: `model` is still to be chosen (the items are placed in
  // both orders, longest first kept where it wins by reorder_gain); `items`
  // places them as listed; `longest_first` longest pass first.
  LaunchOrder order = LaunchOrder::model;
};

// estimate_cost() of any plan with this shape: the same arithmetic, the same
// result (for a shape with `reorder`, of the plan with the launch order
// plan_launch_order() gives it). A plan that cannot run faster than
// `to_beat_us` (step_lower_bound_ns) is not placed on the SMs: its time_us is
// then that bound, above to_beat_us.
CostEstimate estimate_shape(const PlanShape& shape, const HeadConfig& heads, const CostModel& model,
                            double to_beat_us = std::numeric_limits<double>::infinity());

}  // namespace treeattn
