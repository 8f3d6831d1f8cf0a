#pragma once
// The cost model's pieces the planners use (cost_model.hpp has the model and
// what callers see of it): tile choice, group and edge prices, the placement
// of a plan's CTAs on the SMs, launch order.

#include <cstdint>
#include <vector>

#include "treeattn/cost_model.hpp"

namespace treeattn {

struct Plan;

// The cheaper tile for an item of `rows` query rows over a block of
// `block_tokens` tokens: its passes and their cost, per KV head.
struct TileChoice {
  std::int32_t rows = kLargeTileRows;
  std::int64_t passes = 0;
  double cost_ns = 0.0;
  double max_pass_ns = 0.0;  // the longest pass
};
TileChoice choose_tile(const CostModel& model, std::int64_t rows, std::int64_t block_tokens);

// A group: `tokens` KV tokens cut evenly into `blocks` blocks, read by
// `queries` queries of `group` query heads each, each block's queries in items
// of at most `query_tile`. Its passes and their cost, per KV head.
struct GroupCost {
  std::int64_t passes = 0;
  double cost_ns = 0.0;
  double max_pass_ns = 0.0;
};
GroupCost group_cost(const CostModel& model, std::int64_t tokens, std::int64_t blocks, std::int64_t queries,
                     std::int32_t group, std::int32_t query_tile);

// The greedy rule for one parent -> child edge (FastTree): true when reading
// the parent's KV chain inside the child's group (the child's queries leave the
// parent's group and each saves one partial) costs less than keeping them apart.
struct EdgeShape {
  std::int64_t parent_tokens;   // KV of the parent's group (its chain)
  std::int64_t parent_queries;  // queries of the parent's group, the child's included
  std::int64_t child_tokens;    // the child's own KV
  std::int64_t child_queries;   // queries below (and on) the child
};
bool prefer_concatenation(const CostModel& model, const EdgeShape& edge, std::int32_t heads_q,
                          std::int32_t heads_kv, std::int32_t block_tokens, std::int32_t query_tile);

// The two sides of that rule: the KV work concatenating adds per KV head (ns;
// negative when one run over the chain is cheaper) and the partial rows per
// query head it saves. Neither depends on partial_ns, so greedy prices an edge
// once for all its partial weights.
struct EdgeTrade {
  double extra_work_ns = 0.0;
  std::int64_t partials_saved = 0;
  bool worth_it(const CostModel& model, std::int32_t heads_q, std::int32_t heads_kv) const {
    return double(heads_kv) * extra_work_ns < double(partials_saved) * double(heads_q) * model.partial_ns;
  }
};
EdgeTrade edge_trade(const CostModel& model, const EdgeShape& edge, std::int32_t group, std::int32_t block_tokens,
                     std::int32_t query_tile);

// Greedy's analytic step time for a total cost and a longest pass (which runs
// split_solo_speedup times its full-SM pace), in microseconds.
double step_time_us(const CostModel& model, double work_ns, double max_pass_ns);
// When the last of CTAs costing `cta_ns` each (in launch order) finishes, in
// nanoseconds: the hardware hands each SM one CTA per round until every SM has
// slots / sms of them, then gives each freed slot the next CTA (slots freed at
// the same moment, as equal CTAs' are, one CTA per SM a round unless
// refill_spread is 0); an SM's n
// resident CTAs each run at solo_speedup times their full-SM pace when n is 1,
// at that pace when the SM is full, linearly between.
double simulate_step_ns(const CostModel& model, const std::vector<double>& cta_ns);
// A time simulate_step_ns never beats: all the work at the busy SMs' best
// throughput, or the longest CTA at a resident's best pace. The planner skips
// placing candidates this already shows slower than the best so far.
double step_lower_bound_ns(const CostModel& model, const std::vector<double>& cta_ns);
// Item indices in the order that launches the KV blocks longest pass first:
// each block's items together and in item order, blocks by their longest pass
// (pass_ns + tiles * tile_ns of its tile rows), ties in block order.
// `item_block` is non-decreasing (a plan's items); `item_pass_ns` the longest
// pass of each item.
std::vector<std::int32_t> longest_first_order(const std::vector<std::int32_t>& item_block,
                                              const std::vector<double>& item_pass_ns);

// The plan's launch order as the planner sets it: empty for item order.
std::vector<std::int32_t> plan_launch_order(const Plan& plan, const CostModel& model,
                                            LaunchOrder order = LaunchOrder::model);

}  // namespace treeattn
