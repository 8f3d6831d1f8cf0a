// validate(Plan) must notice each kind of inconsistency a kernel would trip on.

#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "treeattn/error.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;

namespace {

Plan sample_plan() {
  RandomForestOptions o;
  o.seed = 3;
  o.nodes = 12;
  o.queries = 10;
  return plan(random_forest(o), PlanOptions{Strategy::flatten, 16, kMaxQueryTile, 0});
}

void expect_invalid(const Plan& p, const std::string& fragment) {
  try {
    validate(p);
    FAIL("validate accepted a broken plan; expected: ", fragment);
  } catch (const Error& e) {
    CHECK(e.category() == ErrorCategory::InvalidPlan);
    CHECK_MESSAGE(std::string(e.what()).find(fragment) != std::string::npos, e.what());
  }
}

}  // namespace

TEST_CASE("validate rejects corrupted plans with the field at fault") {
  const Plan good = sample_plan();
  REQUIRE_NOTHROW(validate(good));
  REQUIRE(good.num_partials > 0);
  {
    Plan p = good;
    p.token_slot[0] = -1;
    expect_invalid(p, "token_slot[0]");
  }
  {
    Plan p = good;
    p.segment_token_end[0] = p.segment_token_begin[0];
    expect_invalid(p, "segment 0");
  }
  {
    Plan p = good;
    p.block_tokens = 1;
    expect_invalid(p, "block_tokens");
  }
  {
    Plan p = good;
    p.segment_mask[0] |= std::uint64_t(1) << 63;
    expect_invalid(p, "beyond its");
  }
  {
    Plan p = good;
    p.tile_query[0] = p.num_queries;
    expect_invalid(p, "names query");
  }
  {
    Plan p = good;
    p.merge_partial[0] = p.merge_partial[1];
    expect_invalid(p, "listed twice");
  }
  {
    Plan p = good;
    const auto it = std::find_if(p.tile_partial.begin(), p.tile_partial.end(), [](std::int32_t v) { return v >= 0; });
    *it = kDirect;
    expect_invalid(p, "never written");
  }
  {
    Plan p = good;
    p.item_query_begin.back() += 1;
    expect_invalid(p, "item_query_begin");
  }
}

TEST_CASE("validate refuses negative counts, which the arrays' sizes alone would let through") {
  // One query on one short node: no partials, so merge_partial is empty whatever num_partials says.
  Tree tree({4, 2, 64});
  tree.add_node_range(0, kNoParent, 0, 4);
  tree.add_query(0);
  const Plan good = plan(tree, PlanOptions{Strategy::flatten, 16, kMaxQueryTile, 0});
  REQUIRE(good.num_partials == 0);
  REQUIRE_NOTHROW(validate(good));
  {
    Plan p = good;
    p.num_partials = -1;  // the CPU backend sized its partial buffers from it
    expect_invalid(p, "num_partials = -1");
  }
  {
    Plan p = good;
    p.num_queries = -1;
    expect_invalid(p, "num_queries = -1");
  }
}

TEST_CASE("validate takes a launch order that keeps each block's items together, and no other") {
  // Two queries a work item, so blocks have several items.
  RandomForestOptions o;
  o.seed = 3;
  o.nodes = 12;
  o.queries = 10;
  const Plan good = plan(random_forest(o), PlanOptions{Strategy::flatten, 16, 2, 0});
  REQUIRE(good.launch_order.empty());
  const std::int32_t items = good.num_items();
  std::int32_t shared = -1;  // an item that is not its block's first
  for (std::int32_t i = 1; i < items && shared < 0; ++i) {
    if (good.item_block[std::size_t(i)] == good.item_block[std::size_t(i) - 1]) shared = i;
  }
  REQUIRE(shared > 0);
  // The blocks in reverse, each block's items in item order: valid.
  Plan reversed = good;
  for (std::int32_t b = good.num_blocks() - 1; b >= 0; --b) {
    for (std::int32_t i = 0; i < items; ++i) {
      if (good.item_block[std::size_t(i)] == b) reversed.launch_order.push_back(i);
    }
  }
  REQUIRE(std::int32_t(reversed.launch_order.size()) == items);
  CHECK_NOTHROW(validate(reversed));
  CHECK(reversed.launch_item(0) == reversed.launch_order[0]);
  CHECK(good.launch_item(3) == 3);
  {
    Plan p = good;
    p.launch_order = {0};
    expect_invalid(p, "launch_order");
  }
  {
    Plan p = reversed;
    p.launch_order[1] = p.launch_order[0];
    expect_invalid(p, "launched twice");
  }
  {
    Plan p = reversed;
    p.launch_order[0] = items;
    expect_invalid(p, "outside [0, " + std::to_string(items));
  }
  {
    // Every item in reverse: a block's second item launches before its first.
    Plan p = good;
    for (std::int32_t i = items - 1; i >= 0; --i) p.launch_order.push_back(i);
    expect_invalid(p, "does not follow item");
  }
  {
    // Item `shared` moved to the front: valid numbers, its block split.
    Plan p = good;
    p.launch_order.push_back(shared);
    for (std::int32_t i = 0; i < items; ++i) {
      if (i != shared) p.launch_order.push_back(i);
    }
    expect_invalid(p, "launch_order[0] = " + std::to_string(shared) + " does not follow item");
  }
}
