// validate(Plan) must notice each kind of inconsistency a kernel would trip on.

#include <doctest/doctest.h>

#include <algorithm>

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

void expect_invalid(const Plan& p, const char* fragment) {
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
