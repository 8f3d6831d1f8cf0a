#pragma once
// Internal: planning an analysed tree, shared by plan() and the
// IncrementalPlanner, and what greedy keeps between its passes over a tree
// (the block-size candidates of one plan, or the decode steps of an
// IncrementalPlanner).

#include <cstdint>
#include <optional>
#include <vector>

#include "greedy.hpp"
#include "topology.hpp"
#include "treeattn/planner.hpp"
#include "visibility.hpp"

namespace treeattn {

class ThreadPool;

// Greedy's choice: the children order, the edge decisions and their layout.
struct GreedyChoice {
  Topology order;
  GreedyGroups groups;
  GreedyLayout layout;
};

// The visibility of the last children order greedy asked for: the block-size
// candidates often reorder a tree the same way, and then it is not recomputed.
class VisibilityCache {
 public:
  Visibility& get(const Tree& tree, const Topology& order, std::int32_t window);
  // Tokens were appended to the nodes `grown` (`topo`: the tree's topology,
  // its query_upto updated): the cached visibility follows.
  void appended(const Tree& tree, const Topology& topo, const std::vector<std::int32_t>& grown);
  // The nodes listed took new slots, their lengths kept (replace_slots()).
  void replaced(const Tree& tree, const std::vector<std::int32_t>& nodes);
  // The visibility of the last order asked for, null before the first.
  Visibility* cached() noexcept { return vis_ ? &*vis_ : nullptr; }
  const Visibility* cached() const noexcept { return vis_ ? &*vis_ : nullptr; }

 private:
  std::optional<Topology> order_;
  std::optional<Visibility> vis_;
};

// What greedy keeps between its passes over one tree, and (appended()) over
// the decode steps that only grow its nodes.
class GreedyMemo {
 public:
  GreedyMemo(const Topology& topo, const Visibility& vis) : edges(topo, vis) {}
  GreedyEdges edges;
  VisibilityCache reordered;

  // The model's time for greedy's own plan. The block-size candidates often
  // arrive at the same layout (the same edges joined, the same units: the
  // same plan), which is then not timed again.
  const CostEstimate& own(const Tree& tree, const GreedyChoice& choice, const PlanOptions& options);
  // Tokens were appended to `grown` (`topo` updated, and `vis` when given):
  // the reordered visibility follows, the edges see the new counts (an edge
  // whose shape changed is priced again), the own plan is timed again. The
  // counts are read from the reordered visibility, or from `vis` before
  // there is one.
  void appended(const Tree& tree, const Topology& topo, const Visibility* vis, const std::vector<std::int32_t>& grown);
  // The nodes listed took new slots, their lengths kept: only the reordered
  // visibility's slots change (no edge or time depends on them).
  void replaced(const Tree& tree, const std::vector<std::int32_t>& nodes) { reordered.replaced(tree, nodes); }

  // Set by an IncrementalPlanner that keeps greedy's edge decisions between
  // its choices: the first plan through this memo decides them (its own
  // layout) and keeps them in `held`; later plans lay out the groups those
  // decisions give at the tree's new counts, no edge decided again.
  bool hold_groups = false;
  std::optional<GreedyChoice> held;

 private:
  bool timed_ = false;
  std::vector<std::uint8_t> joined_;
  std::vector<GreedyUnit> units_;
  CostEstimate estimate_;
};

// The cost model's choices a plan was made with.
struct PlanChoices {
  std::int32_t block_tokens = 0;  // auto's choice, or options.block_tokens
  GreedyCandidate greedy_candidate = GreedyCandidate::model;  // greedy's layout (greedy only)
};

// plan() after analyze() and compute_visibility(): `vis` is the visibility
// of `topo`. With `memo` (greedy at a fixed block size), greedy decides
// through it. `chosen`, when given, receives the choices the plan was made
// with. `reuse`, when given at a fixed block size, is a plan whose array
// memory the new one takes. `lender`, when given, receives the visibility
// (`vis`, or the memo's of greedy's held order) whose token slots the plan
// took instead of copying them, or null where it copied: until its caller
// swaps them back, that visibility holds the old plan's array instead.
Plan plan_analyzed(const Tree& tree, const Topology& topo, Visibility& vis, const PlanOptions& options, ThreadPool* pool,
                   GreedyMemo* memo, PlanChoices* chosen, Plan* reuse, Visibility** lender = nullptr);

// Throws InvalidArgument for options plan() refuses.
void check_plan_options(const PlanOptions& options);

// `options` with the cost model's terms for its kv_dtype in place
// (CostModel::for_kv) and kv_dtype f16, so that nothing applies them twice:
// what plan_analyzed() plans with, and an incremental planner's held options.
PlanOptions with_kv_terms(const PlanOptions& options);

}  // namespace treeattn
