#pragma once
// Planner invariants, checked the slow way: expand a plan into (query, slot)
// pairs and compare them with each query's visible slots from the tree.

#include <string>

#include "treeattn/plan.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/tree.hpp"

namespace treeattn::test {

// Empty when every (query, visible token) pair is covered exactly once and no
// other pair is unmasked; else a description of the first difference.
// Requires a tree whose slots are distinct (random_forest guarantees it).
std::string coverage_error(const Tree& tree, const Plan& plan);

// Plans `tree` with `options` and checks (doctest CHECKs) what every strategy
// promises: a valid plan, exact coverage, block and tile limits, determinism.
void check_invariants(const Tree& tree, const PlanOptions& options);

// Empty when the two plans are identical field by field.
std::string plan_difference(const Plan& a, const Plan& b);

}  // namespace treeattn::test
