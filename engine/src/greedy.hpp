#pragma once
// Internal: the `greedy` strategy (FastTree). Each node's KV forms a group read
// by the queries below it, except where the cost model prefers to concatenate
// a parent's group into a child's: the child's queries then read the parent's
// KV chain together with the child's own, in one run, and leave the parent's
// group. Then, in depth-first order, small groups share a block where the model
// says one pass over both costs less than two (DeFT-Flatten's packing, masks
// keeping their queries apart); every other group starts as one block of any
// length, and groups of long KV are cut into more blocks while that shortens
// the step (a device not full, or waiting on a few long blocks).

#include <cstdint>
#include <vector>

#include "plan_builder.hpp"
#include "topology.hpp"
#include "treeattn/planner.hpp"
#include "visibility.hpp"

namespace treeattn {

struct GreedyGroups {
  std::vector<std::uint8_t> joined;   // [nodes] the edge parent -> node is concatenated
  std::vector<std::int32_t> queries;  // [nodes] queries of the node's group
  std::vector<std::int64_t> tokens;   // [nodes] KV tokens of the node's group (its chain)
  bool probe_agrees = false;          // choose_greedy_groups' probe_weight decided every edge alike
};

// What greedy's passes over one tree share (two partial weights at every
// candidate block size): each node's visible tokens and the queries below it,
// and each edge's last trade (cost_model.hpp). Most edges price the same
// shape at the same block counts again (a short child under the same parent
// group), so a hit is a comparison instead of four group prices.
class GreedyEdges {
 public:
  GreedyEdges(const Topology& topo, const Visibility& vis);
  std::int64_t tokens(std::int32_t node) const { return tokens_[std::size_t(node)]; }
  std::int32_t queries_below(std::int32_t node) const { return subtree_queries_[std::size_t(node)]; }
  // A node's visible tokens changed (tokens appended): its edges are priced again when their shape changed.
  void set_tokens(std::int32_t node, std::int64_t tokens) { tokens_[std::size_t(node)] = tokens; }
  // The trade of the edge into `child` for this shape, priced for `model` (its
  // partial_ns aside: the trade does not read it).
  EdgeTrade trade(std::int32_t child, const EdgeShape& edge, const CostModel& model, std::int32_t group,
                  std::int32_t block_tokens, std::int32_t query_tile);

 private:
  std::vector<std::int64_t> tokens_;
  std::vector<std::int32_t> subtree_queries_;
  struct Entry {
    EdgeShape edge{};
    std::int64_t blocks[3] = {0, 0, 0};  // of the parent's chain, the child's KV and both: all edge_trade reads of block_tokens
    EdgeTrade trade;
    bool valid = false;
  };
  std::vector<Entry> entries_;
};

// Decides the groups from token and query counts, then moves each node's
// joined children behind the others in `topo`, so that every group's queries
// take consecutive positions in the next visibility pass. `probe_weight` > 0
// also asks whether partial_ns x probe_weight would have decided every edge
// the same way (GreedyGroups::probe_agrees): that pass would then give these
// very groups, and need not run.
GreedyGroups choose_greedy_groups(Topology& topo, const PlanOptions& options, const HeadConfig& heads,
                                  GreedyEdges& edges, double probe_weight = 0.0);

// The groups' query and token counts at the edges' current counts with
// g.joined kept: what choose_greedy_groups gives when it decides every edge
// as before. `topo` is the reordered topology those decisions made.
void regroup(const Topology& topo, GreedyGroups& g, const GreedyEdges& edges);

// A group: the queries at positions [lo, hi) read the KV chain ending at `node`.
struct GreedyGroup {
  std::int32_t node, lo, hi;
  std::int64_t tokens;
};
// Consecutive groups [first, last) emitted as one run, cut into `blocks`.
struct GreedyUnit {
  std::size_t first, last;
  std::int64_t tokens;
  std::int64_t viewers;  // distinct queries of its groups
  std::int64_t blocks;
  bool operator==(const GreedyUnit& o) const {
    return first == o.first && last == o.last && tokens == o.tokens && viewers == o.viewers && blocks == o.blocks;
  }
};
// The groups packed and split, and the model's step time for them: known from
// the reordered topology alone, so candidates are compared before any is built.
struct GreedyLayout {
  std::vector<GreedyGroup> groups;
  std::vector<GreedyUnit> units;
  double time_us = 0.0;
};
GreedyLayout layout_greedy(const Topology& topo, const GreedyGroups& groups, const PlanOptions& options,
                           const HeadConfig& heads);

// Emits a layout, given the visibility computed over the reordered topology.
void emit_greedy(PlanBuilder& builder, const Visibility& vis, const Topology& topo, const GreedyGroups& groups,
                 const GreedyLayout& layout);

}  // namespace treeattn
