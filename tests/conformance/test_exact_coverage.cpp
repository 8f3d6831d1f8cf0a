// Exact coverage on the backend under test (support/exact_coverage.hpp): every
// strategy on the trees that matter, each query head's LSE and O against what
// the tree alone says (Q = 0, V bits), so one token too many, too few or
// foreign fails. Compiled into every backend's program, as test_conformance.cpp.

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "support/conformance.hpp"
#include "support/exact_coverage.hpp"
#include "treeattn/incremental_planner.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;
using namespace treeattn::test;

namespace {

// Every strategy at each block size and input dtype, planned with the
// backend's cost model (the auto block size and greedy read it).
// `window`: the plans' sliding window (0: none), each query then expected to
// see exactly the last `window` tokens of its path.
void check_exact_coverage(Backend& backend, const Tree& tree, const std::vector<std::int32_t>& blocks,
                          const std::vector<DType>& dtypes, std::int32_t window = 0) {
  for (DType dtype : dtypes) {
    CAPTURE(to_string(dtype));
    CAPTURE(window);
    CoverageCheck check(tree, dtype, window);
    for (Strategy s : all_strategies()) {
      for (std::int32_t block : blocks) {
        CAPTURE(to_string(s));
        CAPTURE(block);
        PlanOptions options{s, block};
        options.cost = backend.cost_model();
        options.window = window;
        CHECK(check.error(backend, treeattn::plan(tree, options)) == "");
      }
    }
  }
}

// A Medusa-style speculative step on a `prefix`-token context: the last
// accepted token, then draft paths (a path is a node; some hang below
// others), a query at every draft token (upto: causal inside its node).
Tree speculative_tree(const HeadConfig& heads, std::int64_t prefix) {
  Tree tree(heads);
  tree.add_node_range(0, kNoParent, 0, prefix);
  tree.add_node_range(1, 0, prefix, 1);
  tree.add_query(1);
  std::int64_t slot = prefix + 1;
  const std::int64_t parents[] = {1, 1, 1, 2, 2, 3, 5, 1, 8, 9};
  for (std::int64_t i = 0; i < 10; ++i) {
    const std::int64_t length = 1 + (i * 3) % 5;  // 1 to 5 draft tokens
    tree.add_node_range(i + 2, parents[i], slot, length);
    slot += length;
    for (std::int64_t upto = 1; upto <= length; ++upto) tree.add_query(i + 2, upto);
  }
  return tree;
}

// A chain of `nodes` short nodes (1 to 9 tokens), queried at every 25th
// node (up to its middle where it has more than two tokens) and at its end.
Tree deep_chain(const HeadConfig& heads, std::int64_t nodes) {
  Tree tree(heads);
  std::int64_t slot = 0;
  for (std::int64_t i = 0; i < nodes; ++i) {
    const std::int64_t length = 1 + (i * 7) % 9;
    tree.add_node_range(i, i == 0 ? kNoParent : i - 1, slot, length);
    slot += length;
    if (i % 25 == 24) tree.add_query(i, length > 2 ? length / 2 : kWholeNode);
  }
  tree.add_query(nodes - 1);
  return tree;
}

// A forest of four requests, some queries on part of their node (GQA 8/2, head_dim 256).
Tree four_requests() {
  RandomForestOptions o;
  o.seed = 41;
  o.nodes = 40;
  o.roots = 4;
  o.queries = 24;
  o.max_tokens = 60;
  o.upto_fraction = 0.3;
  o.heads = {8, 2, 256, 0.0f};
  return random_forest(o);
}

}  // namespace

// Sized for lavapipe in CI (2 cores): the few-shot tree at head_dim 64 and
// bf16 on the smaller trees keep the suite's Vulkan time within seconds.
TEST_CASE("exact coverage: few-shot, a 4 000-token prompt and 20 branches of 30 tokens (GQA 32/8, head_dim 64)") {
  auto backend = make_test_backend();
  Tree tree = few_shot_tree({32, 8, 64, 0.0f}, 4000, 20, 30);
  tree.add_query(0, 2500);  // a query inside the prompt
  check_exact_coverage(*backend, tree, {256, 1320}, {DType::f16});
}

TEST_CASE("exact coverage: a speculative token tree, causal inside its nodes (MHA 8/8, head_dim 128)") {
  auto backend = make_test_backend();
  check_exact_coverage(*backend, speculative_tree({8, 8, 128, 0.0f}, 700), {64, kAutoBlockTokens},
                       {DType::f16, DType::bf16});
}

TEST_CASE("exact coverage: a forest of four requests (GQA 8/2, head_dim 256)") {
  auto backend = make_test_backend();
  check_exact_coverage(*backend, four_requests(), {48}, {DType::f16, DType::bf16});
}

TEST_CASE("exact coverage: a 300-node chain (MHA 4/4, head_dim 64)") {
  auto backend = make_test_backend();
  check_exact_coverage(*backend, deep_chain({4, 4, 64, 0.0f}, 300), {32, 700}, {DType::f16});
}

// Sliding windows: each query sees exactly the last `window` tokens of its
// path, through the plan's segments and masks alone.
TEST_CASE("exact coverage with sliding windows: few-shot, a window ending inside the prompt or the branch") {
  auto backend = make_test_backend();
  Tree tree = few_shot_tree({32, 8, 64, 0.0f}, 4000, 20, 30);
  tree.add_query(0, 2500);  // a query inside the prompt
  for (std::int32_t window : {1024, 17}) check_exact_coverage(*backend, tree, {256, kAutoBlockTokens}, {DType::f16}, window);
}

TEST_CASE("exact coverage with sliding windows: a speculative token tree, causal inside its nodes") {
  auto backend = make_test_backend();
  const Tree tree = speculative_tree({8, 8, 128, 0.0f}, 700);
  for (std::int32_t window : {1, 4, 300}) check_exact_coverage(*backend, tree, {64, kAutoBlockTokens}, {DType::f16}, window);
  check_exact_coverage(*backend, tree, {64}, {DType::bf16}, 6);
}

TEST_CASE("exact coverage with sliding windows: a forest of four requests and a 300-node chain") {
  auto backend = make_test_backend();
  for (std::int32_t window : {2, 50}) check_exact_coverage(*backend, four_requests(), {48}, {DType::f16}, window);
  check_exact_coverage(*backend, deep_chain({4, 4, 64, 0.0f}, 300), {32, 700}, {DType::f16}, 40);
}

TEST_CASE("exact coverage with sliding windows: IncrementalPlanner updates as branches grow past the window") {
  auto backend = make_test_backend();
  const HeadConfig heads{32, 8, 128, 0.0f};
  const Tree start = few_shot_tree(heads, 600, 8, 20);
  for (Strategy s : {Strategy::flatten, Strategy::greedy}) {
    CAPTURE(to_string(s));
    PlanOptions options{s, 128};
    options.cost = backend->cost_model();
    options.window = 32;  // the windows leave the prompt as the branches pass 32 tokens
    IncrementalPlanner planner(heads, options);
    planner.add_tree(start);
    planner.update();
    std::int64_t next_slot = total_tokens(start);
    for (int step = 0; step < 16; ++step) {
      CAPTURE(step);
      for (const TreeQuery& q : start.queries()) planner.append_range(q.node, next_slot++, 1);
      const Plan& plan = planner.update();
      CoverageCheck check(planner.tree(), DType::f16, options.window);
      CHECK(check.error(*backend, plan) == "");
    }
  }
}

TEST_CASE("exact coverage: IncrementalPlanner plans on held flatten blocks longer than block_tokens") {
  // Branches grow a token a step on a device the plan fills (one SM of four
  // slots), so flatten holds its blocks and they pass block_tokens.
  auto backend = make_test_backend();
  const HeadConfig heads{32, 8, 128, 0.0f};
  const Tree start = few_shot_tree(heads, 1500, 8, 20);
  PlanOptions options{Strategy::flatten, 128};
  options.cost = backend->cost_model();
  options.cost.slots = 4.0;
  options.cost.sms = 1.0;
  IncrementalPlanner planner(heads, options);
  planner.add_tree(start);
  planner.update();
  std::int64_t next_slot = total_tokens(start), held = 0;
  for (int step = 0; step < 6; ++step) {
    CAPTURE(step);
    for (const TreeQuery& q : start.queries()) planner.append_range(q.node, next_slot++, 1);
    const Plan& plan = planner.update();
    if (!planner.last_update().held_layout) continue;
    std::int32_t longest = 0;
    for (std::int32_t b = 0; b < plan.num_blocks(); ++b) longest = std::max(longest, plan.block_token_count(b));
    held += longest > 128;
    CoverageCheck check(planner.tree(), DType::f16);
    CHECK(check.error(*backend, plan) == "");
  }
  CHECK(held > 0);  // the case the test is about was reached
}
