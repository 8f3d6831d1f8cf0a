#pragma once
// Internal: a validated tree in index form. analyze() is the one place that
// checks a Tree; everything downstream may assume what it guarantees.

#include <cstdint>
#include <limits>
#include <vector>

#include "treeattn/tree.hpp"

namespace treeattn {

// The limit on a tree's nodes, its queries and one node's tokens (plans index them with int32).
inline constexpr std::int64_t kMaxCount = std::numeric_limits<std::int32_t>::max();

struct Topology {
  std::vector<std::int32_t> parent;       // [nodes] parent node index, or -1
  std::vector<std::int32_t> child_begin;  // [nodes + 1] CSR into children
  std::vector<std::int32_t> children;     // child node indices, in input order
  std::vector<std::int32_t> roots;        // in input order
  std::vector<std::int32_t> preorder;     // depth-first, roots and children in input order
  std::vector<std::int32_t> query_node;   // [queries] node index
  std::vector<std::int32_t> query_upto;   // [queries] tokens of its own node it sees
};

// Validates heads, ids, parents (unknown, cycles), slots (sign, width, kv_slots
// when > 0) and queries (node, upto, at least one visible token). Throws
// InvalidTree naming the node or query. The slots of nodes [0, checked_nodes)
// are taken as checked already (an IncrementalPlanner checked them when they came).
Topology analyze(const Tree& tree, std::int64_t kv_slots, std::size_t checked_nodes = 0);

// Checks the slots (or pages) of the node at `index` from token `from_token`
// on: the tokens appended since they were last checked.
void check_slots(const Tree& tree, std::int32_t index, std::int64_t kv_slots, std::int64_t from_token);

// Each node's path position: the tokens of its ancestors ([nodes]; a root's is 0).
std::vector<std::int64_t> node_path_depths(const Tree& tree, const Topology& topo);

// Moves the children flagged in `last` ([nodes], by child) behind their
// siblings (order otherwise kept) and recomputes the preorder, so strategies
// can choose which subtrees' queries take the higher positions.
void move_children_last(Topology& topo, const std::vector<std::uint8_t>& last);

}  // namespace treeattn
