#pragma once
// Draws a plan over its tree as SVG, so a person can see how a strategy split
// the KV cache: one row per tree depth, nodes laid out in the plan's token
// order (depth-first), every node's KV coloured by the KV block (work item)
// that reads it. Where several blocks read the same tokens (the sequence
// baseline), the node's row is shared among them in lanes.

#include <string>

#include "treeattn/plan.hpp"
#include "treeattn/tree.hpp"

namespace treeattn::cli {

std::string plan_svg(const Tree& tree, const Plan& plan, const std::string& title);

}  // namespace treeattn::cli
