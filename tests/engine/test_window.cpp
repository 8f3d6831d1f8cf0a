// Sliding windows in the planner (PlanOptions::window): every strategy covers
// exactly the last `window` tokens of each query's path, no segment holds a
// token outside every window, and a window longer than every path plans
// what no window plans, bit for bit.

#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <string>

#include "support/oracle.hpp"
#include "support/plan_check.hpp"
#include "treeattn/error.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;

namespace {

// The planner's invariant forests, deeper: windows end inside ancestors, and
// own queries on part of a node leave gaps between their windows.
Tree seeded_forest(std::uint64_t seed) {
  RandomForestOptions o = test::invariant_forest(seed);
  o.chain_bias = 0.6;
  return random_forest(o);
}

// `tree` planned with strategy `s` under `window`, other options their defaults.
Plan windowed_plan(const Tree& tree, Strategy s, std::int32_t window) {
  PlanOptions options;
  options.strategy = s;
  options.window = window;
  return plan(tree, options);
}

// The distinct KV slots some query's window holds.
std::int64_t window_tokens(const Tree& tree, std::int32_t window) {
  std::set<std::int64_t> slots;
  for (std::size_t q = 0; q < tree.query_count(); ++q) {
    for (std::int64_t s : test::visible_slots(tree, q, window)) slots.insert(s);
  }
  return std::int64_t(slots.size());
}

}  // namespace

TEST_CASE("windowed plans of every strategy cover each query's last `window` tokens exactly, nothing else read") {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    const Tree tree = seeded_forest(seed);
    CAPTURE(seed);
    for (std::int32_t window : {1, 2, 5, 37, 300}) {
      for (Strategy s : all_strategies()) {
        for (std::int32_t block_tokens : {7, 64, kAutoBlockTokens}) {
          PlanOptions options;
          options.strategy = s;
          options.block_tokens = block_tokens;
          options.query_tile = seed % 3 == 0 ? 5 : kMaxQueryTile;
          options.window = window;
          test::check_invariants(tree, options);  // coverage_error: exact pairs, and every segment token seen
        }
      }
    }
  }
}

TEST_CASE("a window longer than every path plans bit for bit what no window plans") {
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    const Tree tree = seeded_forest(seed);
    CAPTURE(seed);
    for (Strategy s : all_strategies()) {
      CAPTURE(to_string(s));
      PlanOptions whole;
      whole.strategy = s;
      PlanOptions windowed = whole;
      windowed.window = std::int32_t(total_tokens(tree) + 1);
      CHECK(test::plan_difference(plan(tree, windowed), plan(tree, whole)) == "");
    }
  }
}

TEST_CASE("tokens between two own queries' windows in one node are in no segment") {
  Tree tree({8, 2, 64});
  tree.add_node_range(0, kNoParent, 0, 100);
  tree.add_query(0, 10);  // sees slots 5..9
  tree.add_query(0);      // sees slots 95..99
  for (Strategy s : all_strategies()) {
    CAPTURE(to_string(s));
    const Plan p = windowed_plan(tree, s, 5);
    std::vector<std::int32_t> expected;
    for (std::int32_t slot = 5; slot < 10; ++slot) expected.push_back(slot);
    for (std::int32_t slot = 95; slot < 100; ++slot) expected.push_back(slot);
    CHECK(p.token_slot == expected);
    CHECK(p.min_kv_slots == 100);
    CHECK(test::coverage_error(tree, p, 5) == "");
  }
}

TEST_CASE("a 4000-token prompt under 32 branches with a window of 1024 reads at most 1.1x the tokens its windows cover") {
  const Tree tree = few_shot_tree({32, 8, 128}, 4000, 32, 200);
  const std::int32_t window = 1024;
  const std::int64_t covered = window_tokens(tree, window);
  CHECK(covered == 32 * 200 + (window - 200));  // each branch whole, and the prompt's last 824 tokens
  for (Strategy s : all_strategies()) {
    CAPTURE(to_string(s));
    const Plan p = windowed_plan(tree, s, window);
    const PlanStats stats = compute_stats(p);
    CHECK(stats.tokens == covered);                           // the plan's tokens: those of some window
    CHECK(stats.sequence_read_tokens == 32 * std::int64_t(window));  // every query its window, once
    // Read from the KV pool: each block once. A Q-guided plan reads each query's window.
    const std::int64_t bound = s == Strategy::sequence ? 32 * std::int64_t(window) : covered;
    CHECK(stats.plan_read_tokens <= bound * 11 / 10);
    CHECK(stats.kv_bytes(stats.plan_read_tokens, 2) <= stats.kv_bytes(bound, 2) * 11 / 10);
    CHECK(test::coverage_error(tree, p, window) == "");
  }
}

TEST_CASE("a windowed causal prefill lists in each tile only queries that see a token of its block") {
  // One chain of 3 001 tokens, each its own query (a prefill chunk planned as a
  // tree): every piece's viewer range holds every later query, of which the
  // window's 97 see it. Exact coverage says no viewer is missing; this says none
  // is listed in a tile that reads nothing of its block for it.
  const std::int32_t tokens = 3001, window = 97;
  Tree tree({8, 2, 64});
  tree.add_node_range(0, kNoParent, 0, tokens);
  for (std::int32_t t = 1; t <= tokens; ++t) tree.add_query(0, t == tokens ? kWholeNode : t);
  for (Strategy s : all_strategies()) {
    CAPTURE(to_string(s));
    const Plan p = windowed_plan(tree, s, window);
    CHECK(test::coverage_error(tree, p, window) == "");
    std::int64_t idle_rows = 0;
    for (std::int32_t item = 0; item < p.num_items(); ++item) {
      const std::int32_t block = p.item_block[std::size_t(item)];
      const std::int32_t segments =
          p.block_segment_begin[std::size_t(block) + 1] - p.block_segment_begin[std::size_t(block)];
      const std::int32_t first_mask = p.item_mask_begin[std::size_t(item)];
      std::uint64_t seen = 0;  // the tile rows some segment of the block is read for
      for (std::int32_t k = 0; k < segments; ++k) seen |= p.segment_mask[std::size_t(first_mask + k)];
      const std::int32_t rows = p.item_query_begin[std::size_t(item) + 1] - p.item_query_begin[std::size_t(item)];
      for (std::int32_t t = 0; t < rows; ++t) idle_rows += (seen >> t & 1) == 0;
    }
    CHECK(idle_rows == 0);
  }
}

TEST_CASE("a negative window is refused, naming it") {
  PlanOptions options;
  options.window = -3;
  CHECK_THROWS_WITH_AS(plan(few_shot_tree({8, 2, 64}, 100, 2, 4), options),
                       doctest::Contains("window = -3 is negative"), Error);
}
