#pragma once
// plan(): validates a tree and turns it into a Plan with one of the strategies.
// Host-only, deterministic (the same tree and options give the same Plan),
// and linear in nodes + queries + segments: no per-token work beyond writing
// token_slot and checking listed slots.

#include <cstdint>
#include <memory>
#include <mutex>

#include "treeattn/cost_model.hpp"
#include "treeattn/plan.hpp"
#include "treeattn/tree.hpp"

namespace treeattn {

// PlanOptions::block_tokens that lets the cost model choose the block size per
// tree (among its auto_block_min..auto_block_max): long shared prompts gain
// longer blocks (fewer partials to merge), small trees keep short ones (more
// CTAs in flight).
inline constexpr std::int32_t kAutoBlockTokens = 0;

// The layouts the `greedy` strategy chooses among (docs/greedy.md).
enum class GreedyCandidate {
  model,               // the cost model chooses per plan among the three below
  own,                 // its cost-model groups, packed and split
  flatten,             // DeFT-Flatten's layout
  one_item_per_query,  // every query one item over its whole path, where every path fits a block (else flatten's)
};

struct PlanOptions {
  Strategy strategy = Strategy::flatten;
  std::int32_t block_tokens = kAutoBlockTokens;  // max KV tokens per block, 1..65536, or kAutoBlockTokens
                                                 // (greedy: its packing size; the cost model cuts its long groups)
  std::int32_t query_tile = kMaxQueryTile;  // max queries per work item, 1..64
  // Rows of the KV pool when known (>0): slots are then range-checked against it
  // and the error names the node and token. 0: only checked for sign and width.
  std::int64_t kv_slots = 0;
  // The device's cost model: picks every item's tile rows, and the `greedy`
  // strategy's groups and splits.
  CostModel cost = cost_model_for("h100");
  // The items' launch order (no result depends on it); the cost model
  // predicts every candidate plan in this order.
  LaunchOrder launch_order = LaunchOrder::model;
  // `greedy` only: its layout, chosen by the model or given.
  GreedyCandidate greedy_candidate = GreedyCandidate::model;
  // Sliding window (0: none): a query sees the last `window` tokens of its
  // path, its own included (key visible iff q_pos - k_pos < window, as
  // transformers' sliding_window). Tokens outside every query's window are
  // in no segment (never read); masks hold each query to its window. A model
  // that alternates windowed and full layers plans twice per step.
  std::int32_t window = 0;
  // How the calls that run the plan hold K and V: fp8 plans with the cost
  // model's fp8 terms (CostModel::for_kv). The plan is valid for any KV
  // dtype; this only guides the model's choices.
  DType kv_dtype = DType::f16;
};

Plan plan(const Tree& tree, const PlanOptions& options = {});

class ThreadPool;

// plan() on a pool of threads that lives as long as the Planner: with
// block_tokens = kAutoBlockTokens, the block-size candidates are timed in
// parallel. The plans are plan()'s, bit for bit, on any number of threads.
// Keep one for a serving loop and call it every decode step (starting
// threads per call costs more than small trees take to plan). Calls from
// several threads are safe: they take turns.
class Planner {
 public:
  // Threads in all, the calling one included: 0 means one per hardware
  // thread, 1 plans on the calling thread alone. Throws InvalidArgument below 0.
  explicit Planner(int threads = 0);
  ~Planner();
  Planner(const Planner&) = delete;
  Planner& operator=(const Planner&) = delete;

  Plan plan(const Tree& tree, const PlanOptions& options = {});
  int threads() const noexcept;

 private:
  std::unique_ptr<ThreadPool> pool_;
  std::mutex busy_;  // the pool runs one parallel loop at a time
};

// Validates the tree alone (plan() does this first); throws InvalidTree.
void validate(const Tree& tree, std::int64_t kv_slots = 0);

}  // namespace treeattn
