#pragma once
// Planner invariants, checked the slow way: expand a plan into (query, slot)
// pairs and compare them with each query's visible slots from the tree.

#include <cstdint>
#include <string>
#include <vector>

#include "treeattn/plan.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/tree.hpp"
#include "treeattn/workloads.hpp"

namespace treeattn::test {

// The seeded random forests the planner's invariants are checked on: 1 to 40
// nodes in up to three trees, empty nodes, queries on part of their node,
// every seventh seed more than 64 queries (tiles beyond one), sparse ids.
RandomForestOptions invariant_forest(std::uint64_t seed);

// Empty when every (query, visible token) pair is covered exactly once, no
// other pair is unmasked and every token of every segment is unmasked for
// some query (nothing is read that no query sees); else a description of the
// first difference. `window`: the plan's sliding window (0: none), each
// query's visible tokens the last `window` of its path.
// Requires a tree whose slots are distinct (random_forest guarantees it).
std::string coverage_error(const Tree& tree, const Plan& plan, std::int32_t window = 0);

// Plans `tree` with `options` and checks (doctest CHECKs) what every strategy
// promises: a valid plan, exact coverage, block and tile limits, determinism.
void check_invariants(const Tree& tree, const PlanOptions& options);

// Item `item`'s block token by token, read from its segments the slow way: each
// token's KV-pool slot and the item's segment mask over it (bit j: tile query
// j sees the token). What item_token_map and the Vulkan plan encoding must match.
struct ItemToken {
  std::int32_t slot;
  std::uint64_t mask;
};
std::vector<ItemToken> item_tokens(const Plan& plan, std::int32_t item);

// Empty when the two plans are identical field by field.
std::string plan_difference(const Plan& a, const Plan& b);

}  // namespace treeattn::test
