#pragma once
// The cost model of the `greedy` (FastTree) strategy: what one decode step's
// attention costs on a device, estimated from a plan's shape alone.
//
// A kernel runs one CTA (work group) per pass of a work item and KV head. A
// pass takes up to `tile rows` query rows (queries x the group's query heads),
// streams its KV block through 64-token tiles and writes one partial row per
// query head, which the merge reads back. So a plan costs
//   per pass          pass_ns + tiles * tile_ns(tile rows)   (KV tiles padded to 64 tokens)
//   per partial row   partial_ns                             (fp32 write + read + merge)
// in nanoseconds of one CTA slot; `slots` CTAs run at once, slots / sms on
// each SM. The greedy strategy weighs its cuts by
//   max(all passes' cost / slots, the longest pass / solo_speedup)
// the second term being the critical path of a device that is not full;
// estimate_cost() times a whole plan by placing its CTAs on the SMs in launch
// order (simulate_step_ns), plus the partials over the slots and fanin_ns per
// partial of the query with the most (the merge's latency). The H100 defaults
// were fitted to the CUDA backend's timings (docs/greedy.md and
// docs/performance.md).

#include <cstdint>
#include <string>
#include <vector>

namespace treeattn {

struct Plan;

inline constexpr std::int32_t kSmallTileRows = 16;  // one 16-row MMA fragment, KV split over the warps
inline constexpr std::int32_t kLargeTileRows = 64;  // four warps of 16 rows
inline constexpr std::int32_t kKvTileTokens = 64;   // tokens a pass computes at a time
inline constexpr std::int32_t kMaxBlockTokens = 65536;  // the longest block a plan may ask for

struct CostModel {
  double pass_ns = 1756.0;        // fixed cost of a pass: token map, Q load, epilogue
  double tile_ns_large = 3359.0;  // one 64-token KV tile in a 64-row pass
  double tile_ns_small = 3760.0;  // one 64-token KV tile in a 16-row pass
  double partial_ns = 169.0;      // one partial row (query x query head)
  double slots = 396.0;           // CTAs in flight: 132 SMs x 3
  double sms = 132.0;             // SMs (compute units) the slots are spread over
  // How much faster a pass runs alone on an SM than in a full one (two of
  // three CTAs: halfway), in the placement of a plan's CTAs (simulate_step_ns),
  // which times every plan that is compared whole (block sizes, layouts).
  // Few-shot blocks on the H100 ran a 64-token tile in 1.65 us alone, 2.19
  // with two CTAs on the SM and 2.72 with three, but a lone CTA of a tree at
  // the HBM limit streams about twice its full-SM pace, and 2 plans few-shot's
  // blocks better than 1.75 (docs/performance.md).
  double solo_speedup = 2.0;
  // The same speedup in greedy's analytic step time (step_time_us), which
  // decides its long-context splits: at 2 it split small trees' passes too
  // rarely, and two of the 57 peer shapes then lost to SGLang.
  double split_solo_speedup = 1.75;
  // Slots that free at the same moment (equal CTAs finish together): any
  // positive value refills them one CTA per SM a round, as at launch, which
  // the H100's CUDA timings bear out (a plan of 1.3 waves runs as 1.3, not 2;
  // docs/performance.md); 0 fills each such SM's slots before
  // the next SM's, the placement the Vulkan backend's plans were measured
  // better with.
  double refill_spread = 1.0;
  std::int32_t min_split_tokens = 64;  // long-context splitting never cuts blocks below this
  // PlanOptions::block_tokens = kAutoBlockTokens plans the tree at each of
  // auto_block_candidates() and keeps the plan this model predicts fastest.
  std::int32_t auto_block_min = 256;
  std::int32_t auto_block_max = 2048;
  // `greedy` keeps DeFT-Flatten's layout unless its own is predicted this many
  // times faster. Measured on the H100 over the 57 peer configurations with the
  // guard off: greedy's own layouts ran 0.98-3.3x flatten's, and every one
  // predicted >= 1.2x ran >= 1.03x; the model overstates the deepest trees' gains.
  // 0 always keeps greedy's own layout, neither flatten's nor one item per
  // query (tests, sweeps).
  double switch_gain = 1.2;
  // The merge kernel's cost beyond its partial rows: its launch and its chain
  // of dependent loads (H100: 2.0-3.2 us on the DESIGN trees, plus 0.8 us of
  // launch gap; docs/performance.md). The coefficients above
  // were fitted to plans that all had partials and carry it spread over their
  // terms, so it is charged only where a plan without partials competes with
  // one that has them: greedy's layout of one item per query, which skips the
  // merge.
  double merge_ns = 3000.0;
  // The merge's chain of dependent loads grows with the most partials any one
  // query merges (its warp folds them in batches, one round trip each), which
  // the per-row partial_ns, spread over the slots, does not see: per partial of
  // that query. Without it `auto` cut trees whose queries read many blocks too
  // fine (1x4000/10x400 into 256-token blocks, 19 partials a query: 19.2 us,
  // against 18.1 at 512). Swept on the H100 (0, 250, 500, 1000): 500 ran the
  // CUDA backend's DESIGN trees 1.013-1.015x (flatten) and 1.011x (greedy)
  // faster, the peer shapes 1.001x, the Vulkan backend's 1.002x and 1.000x;
  // 1000 cost the Vulkan backend 2 % (docs/performance.md).
  double fanin_ns = 500.0;
  // Launch order: the plan's KV blocks (each with its items) go out longest
  // pass first when the placement predicts that order this many times faster
  // than the depth-first one (0: never). With blocks of different lengths
  // (greedy's groups), the longest passes started last left a few SMs busy
  // after the others had run out of work.
  double reorder_gain = 1.03;

  // "pass_ns=800,tile_ns_large=650": sets the named coefficients, leaves the
  // rest; throws InvalidArgument naming an unknown key or a bad value (also
  // when auto_block_min > auto_block_max).
  void set(const std::string& assignments);
  std::string to_string() const;  // every coefficient, in set()'s syntax
};

// Measured coefficients for a device by name. Only "h100" has been measured;
// any other name gets the H100's, which a backend adjusts to its device's slots.
CostModel cost_model_for(const std::string& device);

// The block sizes PlanOptions::block_tokens = kAutoBlockTokens tries, in
// increasing order: auto_block_min, the sizes of one fixed ladder between it
// and auto_block_max, and auto_block_max. The ladder is 256 tokens x 2^(k/4)
// for every integer k (quarter octaves), each rounded to whole 64-token KV
// tiles (to whole tokens below one tile): 128, 192, 256, 320, 384, 448, 512,
// 640, 704, 832, 1024, 1216, ... The steps between the powers of two matter
// where a tree's CTAs come close to filling the SMs: a few more CTAs than the
// SMs hold two each leave most SMs idle at the end. Fixed, so that moving
// either end of the range adds or removes sizes and never moves the ones in
// between (counted from auto_block_min, a range from 192 had 768 and 896
// where one from 256 has 704 and 832, and a sweep of the range compared
// different sizes as well as different ranges).
std::vector<std::int32_t> auto_block_candidates(const CostModel& model);

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

// What the model predicts for a whole plan, with the counts it predicts from
// (bench reports them, so the coefficients can be fitted to measured times).
struct CostEstimate {
  std::int64_t large_passes = 0, small_passes = 0;  // CTAs, all KV heads
  std::int64_t large_tiles = 0, small_tiles = 0;    // 64-token KV tiles those CTAs compute
  std::int64_t partial_rows = 0;                    // partials x query heads
  std::int32_t max_fanin = 0;                       // the most partials one query merges
  double max_pass_ns = 0.0;
  std::int64_t longest_pass_tiles = 0;  // the longest pass: its KV tiles and whether it has 64 rows
  bool longest_pass_large = false;
  double time_us = 0.0;  // the CTAs placed on the SMs (simulate_step_ns), plus the partials over `slots`
  // The plan launches its blocks longest pass first (Plan::launch_order), and
  // what it would take in item order (equal to time_us when it does not).
  bool longest_first = false;
  double item_order_us = 0.0;
};
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
// Times the plan in its own launch order (Plan::launch_order, if any).
CostEstimate estimate_cost(const Plan& plan, const CostModel& model);

// Item indices in the order that launches the KV blocks longest pass first:
// each block's items together and in item order, blocks by their longest pass
// (pass_ns + tiles * tile_ns of its tile rows), ties in block order.
// `item_block` is non-decreasing (a plan's items); `item_pass_ns` the longest
// pass of each item.
std::vector<std::int32_t> longest_first_order(const std::vector<std::int32_t>& item_block,
                                              const std::vector<double>& item_pass_ns);

// How a plan orders its items' launch (PlanOptions::launch_order).
enum class LaunchOrder {
  model,          // longest first where the cost model predicts it reorder_gain times faster, else item order
  items,          // item order
  longest_first,  // longest_first_order() always
};
// The plan's launch order as the planner sets it: empty for item order.
std::vector<std::int32_t> plan_launch_order(const Plan& plan, const CostModel& model,
                                            LaunchOrder order = LaunchOrder::model);

}  // namespace treeattn
