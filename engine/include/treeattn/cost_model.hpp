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
// partial of the query with the most (the merge's latency). The member
// defaults are the CUDA kernels' on an H100, a least-squares fit of 594 timed
// plans (benchmarks/h100/greedy_fit_*.json, docs/greedy.md); a device
// without a fit of its own is calibrated by its backend (docs/greedy.md, "Device models").

#include <cstdint>
#include <string>
#include <vector>

#include "treeattn/dtype.hpp"

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
  // How much faster a pass runs alone on an SM than on a full one (two of
  // three CTAs: halfway), in the placement of a plan's CTAs, which times every
  // plan compared whole (block sizes, layouts). A lone CTA of a tree at the
  // HBM limit streams about twice its full-SM pace; 2 plans few-shot's blocks
  // better than 1.75 (H100: a 64-token tile 1.65 us alone, 2.72 three to an SM).
  double solo_speedup = 2.0;
  // The same speedup in greedy's analytic step time, which decides its
  // long-context splits: 1.75 splits small trees' passes where they gain
  // (at 2, two of the 57 peer shapes lose to SGLang; docs/performance.md).
  double split_solo_speedup = 1.75;
  // Slots that free at the same moment (equal CTAs finish together): any
  // positive value refills them one CTA per SM a round, as at launch (H100
  // CUDA: a plan of 1.3 waves runs in 1.3 waves' time, not 2;
  // docs/performance.md); 0 fills each such SM's slots before the next SM's,
  // the placement of the Vulkan shaders.
  double refill_spread = 1.0;
  std::int32_t min_split_tokens = 64;  // long-context splitting never cuts blocks below this
  // PlanOptions::block_tokens = kAutoBlockTokens plans the tree at each of
  // auto_block_candidates() and keeps the plan this model predicts fastest.
  std::int32_t auto_block_min = 256;
  std::int32_t auto_block_max = 2048;
  // `greedy` keeps DeFT-Flatten's layout unless its own is predicted this many
  // times faster: the model overstates the deepest trees' gains, and every own
  // layout predicted >= 1.2x runs >= 1.03x flatten's on the 57 peer shapes
  // (docs/performance.md). 0 always keeps greedy's own layout,
  // neither flatten's nor one item per query (tests, sweeps).
  double switch_gain = 1.2;
  // The merge kernel's cost beyond its partial rows: its launch and its chain
  // of dependent loads (H100: 2.0-3.2 us on the DESIGN trees, plus 0.8 us of
  // launch gap; docs/greedy.md). The coefficients above carry it spread over
  // their terms (their fit's plans all have partials), so it is charged only
  // where a plan without partials competes with one that has them: greedy's
  // layout of one item per query, which skips the merge.
  double merge_ns = 3000.0;
  // The merge's chain of dependent loads grows with the most partials any one
  // query merges (its warp folds them in batches, one round trip each), which
  // the per-row partial_ns, spread over the slots, does not see: per partial of
  // that query. It keeps `auto` from cutting trees whose queries read many
  // blocks too fine (1x4000/10x400: 512-token blocks, 18.1 us, not 256 at
  // 19.2); 500 runs the DESIGN trees 1.011-1.015x faster than 0 (docs/performance.md).
  double fanin_ns = 500.0;
  // Launch order: the plan's KV blocks (each with its items) go out longest
  // pass first when the placement predicts that order this many times faster
  // than the depth-first one (0: never). With blocks of different lengths
  // (greedy's groups), the longest passes started last keep a few SMs busy
  // after the others run out of work (1.03-1.20x on the five plans it changes;
  // benchmarks/h100/launch_order.json).
  double reorder_gain = 1.03;
  // K and V in fp8 (PlanOptions::kv_dtype, for_kv): a split-KV tile reads
  // half the bytes and widens them in registers, bound by its instructions
  // where the f16 one waits on HBM, so it costs tile_ns_small times
  // fp8_small_tile_factor, and a pass alone on an SM runs fp8_solo_speedup
  // times its full-SM pace, not solo_speedup (0: solo_speedup). On the H200,
  // fp8 e4m3 plans with these against the f16 terms: the DESIGN workloads
  // 1.025x, decode-only trees 1.11x (to 1.30x), the 57 peer shapes 1.022x
  // (benchmarks/h200/cuda_fp8_planning.json; docs/greedy.md, "Device models").
  double fp8_small_tile_factor = 0.8;
  double fp8_solo_speedup = 1.25;

  // Where the coefficients come from: "h100 (fitted on CUDA)", "calibrated on
  // NVIDIA H200 (CUDA driver 13.0)", "h100 scaled to 80 SMs (calibration
  // failed: ...)". Not a coefficient: set() and to_string() leave it out.
  std::string source = "h100 (fitted on CUDA)";

  // "pass_ns=800,tile_ns_large=650": sets the named coefficients, leaves the
  // rest; throws InvalidArgument naming an unknown key or a bad value (also
  // when auto_block_min > auto_block_max).
  void set(const std::string& assignments);
  std::string to_string() const;  // every coefficient, in set()'s syntax

  // The model a plan for K and V of `kv` uses: this one, with the fp8 terms
  // in place of the f16 ones where `kv` is fp8.
  CostModel for_kv(DType kv) const;
};

// A fitted model by name: "h100" (the CUDA kernels on an H100, the member
// defaults) or "h100-vulkan" (the Vulkan coopmat shaders on an H100). Throws
// InvalidArgument naming the known ones for any other name. A device without
// a fitted model is calibrated by its backend (cuda::Context,
// vulkan::Context).
CostModel cost_model_for(const std::string& device);

// `base` on a device of `sms` compute units running `per_sm` CTAs each (its
// slots), with `source` saying so: what a device without its own fit plans
// with when it is not calibrated.
CostModel scaled_cost_model(const CostModel& base, double sms, double per_sm, const std::string& source);

// The block sizes PlanOptions::block_tokens = kAutoBlockTokens tries, in
// increasing order: auto_block_min, the sizes of one fixed ladder between it
// and auto_block_max, and auto_block_max. The ladder is 256 tokens x 2^(k/4)
// for every integer k (quarter octaves), each rounded to whole 64-token KV
// tiles (to whole tokens below one tile): 128, 192, 256, 320, 384, 448, 512,
// 640, 704, 832, 1024, 1216, ... The steps between the powers of two matter
// where a tree's CTAs come close to filling the SMs: a few more CTAs than the
// SMs hold two each leave most SMs idle at the end. Fixed, so that moving
// either end of the range adds or removes sizes and never moves the ones in
// between: a sweep of the range compares ranges, not different sizes.
std::vector<std::int32_t> auto_block_candidates(const CostModel& model);

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
// Times the plan in its own launch order (Plan::launch_order, if any).
CostEstimate estimate_cost(const Plan& plan, const CostModel& model);

// How a plan orders its items' launch (PlanOptions::launch_order).
enum class LaunchOrder {
  model,          // longest first where the cost model predicts it reorder_gain times faster, else item order
  items,          // item order
  longest_first,  // longest_first_order() always
};

}  // namespace treeattn
