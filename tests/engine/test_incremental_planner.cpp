// The IncrementalPlanner: at every step of whole decode replays (few-shot,
// speculative with accepted tokens, tree-of-thought with forks and pruning)
// its plan is bitwise the from-scratch plan of the same tree at its block
// size and launch order, for flatten and greedy; random appends on random forests agree and
// cover exactly; where it holds a layout (flatten's blocks, greedy's edge
// decisions) every plan covers every query's tokens exactly, within the
// limits it holds them to. test_incremental_changes.cpp has the other changes.

#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <string>

#include "engine/incremental_replay.hpp"
#include "support/plan_check.hpp"
#include "support/workloads_dir.hpp"
#include "treeattn/error.hpp"
#include "treeattn/incremental_planner.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/scenarios.hpp"
#include "treeattn/sequence_tree.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;
using namespace treeattn::incremental_test;



TEST_CASE("few-shot replays: every step is bitwise the from-scratch plan, by appends alone after the first") {
  for (Strategy s : kIncremental) {
    for (std::int32_t block : {64, 256, kAutoBlockTokens}) {
      CAPTURE(to_string(s));
      CAPTURE(block);
      auto scenario = few_shot_scenario(1000, 12, 60);
      const ReplayCounts c = replay_and_compare(*scenario, PlanOptions{s, block});
      CHECK(c.steps == 60);
      CHECK(c.appends_only == 59);  // the first step builds the tree; every later one appends a token per branch
      CHECK(c.chosen >= 1);
      CHECK(c.chosen < 10);  // made again only past the drift
    }
  }
}

TEST_CASE("speculative replays: fresh token trees on a prefix that grows by the accepted tokens, the topology kept") {
  const MedusaWorkload w = load_medusa(kWorkloads + "/speculative/APPS_tree_size64.json");
  for (Strategy s : kIncremental) {
    for (std::int32_t block : {128, kAutoBlockTokens}) {
      CAPTURE(to_string(s));
      CAPTURE(block);
      auto scenario = speculative_scenario(w, 0, 600);
      const ReplayCounts c = replay_and_compare(*scenario, PlanOptions{s, block});
      CHECK(c.steps == scenario->steps());
      CHECK(c.replaced == c.steps - 1);  // each later token tree has the first one's shape, in other pages
    }
  }
}

// The few-shot, speculative and (400 steps of) a tree-of-thought replay with
// `options`, layouts held (the IncrementalOptions defaults).
struct HeldReplays {
  ReplayCounts fewshot, speculative, reasoning;
};
HeldReplays replay_held(const PlanOptions& options, const std::string& reasoning_file) {
  const MedusaWorkload w = load_medusa(kWorkloads + "/speculative/APPS_tree_size64.json");
  const std::vector<ReasoningTree> trees = load_reasoning(kWorkloads + "/reasoning/" + reasoning_file);
  auto fewshot = few_shot_scenario(1000, 12, 60);
  auto speculative = speculative_scenario(w, 0, 600);
  auto reasoning = reasoning_scenario(trees.front());
  HeldReplays counts{replay_and_compare(*fewshot, options, 0, IncrementalOptions{}),
                     replay_and_compare(*speculative, options, 0, IncrementalOptions{}),
                     replay_and_compare(*reasoning, options, 400, IncrementalOptions{})};
  CHECK(counts.fewshot.steps == 60);
  CHECK(counts.speculative.steps == speculative->steps());
  CHECK(counts.reasoning.steps > 0);
  return counts;
}

TEST_CASE("greedy on held edge decisions: every replay step covers exactly, the deciding steps are bitwise") {
  for (std::int32_t block : {64, 128, kAutoBlockTokens}) {
    CAPTURE(block);
    PlanOptions options{Strategy::greedy, block};
    options.greedy_candidate = GreedyCandidate::own;  // the layout whose edges are held (the model may keep flatten's)
    const auto [f, s, r] = replay_held(options, "docmergeToT.json");
    // The decisions are held between choices and reshapings: most steps.
    CHECK(f.held > f.steps / 2);
    CHECK(s.held > s.steps / 2);
    CHECK(r.held > 0);
  }
}

TEST_CASE("held greedy edge decisions on random forests: appends keep coverage exact until the next choice") {
  std::int64_t differed = 0;  // steps whose held plan is not the from-scratch one: the decisions were held
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    const Tree start = small_forest(seed);
    std::int64_t next_slot = total_tokens(start);
    CAPTURE(seed);
    IncrementalOptions incremental;
    incremental.redecide_drift = 100.0;  // no choice made again: every later step on held decisions
    PlanOptions options{Strategy::greedy, 48};
    options.greedy_candidate = GreedyCandidate::own;
    IncrementalPlanner planner(start.heads, options, incremental);
    planner.add_tree(start);
    planner.update();
    std::mt19937_64 rng(seed);
    for (int step = 0; step < 30; ++step) {
      for (int k = 0; k < 8; ++k) {  // growth far past what the decisions were made for
        const TreeNode& n = start.nodes()[rng() % start.node_count()];
        const std::int64_t count = 1 + std::int64_t(rng() % 20);
        planner.append_range(n.id, next_slot, count);
        next_slot += count;
      }
      const Plan& updated = planner.update();
      REQUIRE_NOTHROW(validate(updated));
      REQUIRE(test::coverage_error(planner.tree(), updated) == "");
      if (test::plan_difference(updated, plan(planner.tree(), options)) != "") ++differed;
    }
  }
  CHECK(differed > 0);
}

TEST_CASE("flatten's held blocks: replay steps cover exactly, and the blocks are cut again past the drift") {
  std::int64_t cut = 0;  // few-shot steps whose blocks were cut again
  for (std::int32_t block : {64, 256, kAutoBlockTokens}) {
    CAPTURE(block);
    const auto [f, s, r] = replay_held(on_small_device(block), "keywordToT.json");
    // Held at most steps; each of the others (cut again, bitwise) was one
    // where a block would have passed the drift, the tree changed shape or
    // the cost model chose again.
    CHECK(f.held > f.steps / 2);
    CHECK(s.held > s.steps / 2);
    CHECK(r.held > r.steps / 4);
    cut += f.steps - f.held - f.chosen;
  }
  CHECK(cut > 0);
}

TEST_CASE("flatten's held blocks: new tokens join the block of their node's last token, items and masks kept") {
  IncrementalPlanner planner(kHeads, on_small_device(32));
  planner.add_node_range(0, kNoParent, 0, 70);  // blocks of 26, 27 and 27 tokens
  planner.add_node_range(1, 0, 70, 6);
  planner.add_node_range(2, 0, 76, 4);
  planner.set_queries({{1}, {2}});
  const Plan first = planner.update();
  REQUIRE(first.num_blocks() == 3);
  REQUIRE(first.block_token_count(2) == 27);  // the root's last 17 tokens and both leaves

  // Both leaves grow; the last block takes their tokens, node 2's behind node 1's.
  planner.append_range(1, 80, 2);
  planner.append_range(2, 82, 1);
  const Plan& held = planner.update();
  CHECK(planner.last_update().held_layout);
  CHECK(held.num_blocks() == 3);
  CHECK(held.block_token_count(2) == 30);
  CHECK(held.block_tokens == 32);
  CHECK(held.segment_token_end.back() == 83);
  CHECK(held.item_query_begin == first.item_query_begin);
  CHECK(held.tile_query == first.tile_query);
  CHECK(held.segment_mask == first.segment_mask);
  CHECK(held.tile_partial == first.tile_partial);
  CHECK(held.merge_begin == first.merge_begin);
  CHECK(test::coverage_error(planner.tree(), held) == "");
  CHECK(test::plan_difference(held, plan(planner.tree(), planner.held_options())) != "");  // plan() cuts 27/28/28

  // The block may grow to 32 * 1.25 = 40 tokens; 41 cut every block again, as plan() does.
  planner.append_range(1, 83, 10);
  CHECK(planner.update().block_tokens == 40);
  CHECK(planner.last_update().held_layout);
  planner.append_range(2, 93, 1);
  const Plan& cut = planner.update();
  CHECK_FALSE(planner.last_update().held_layout);
  CHECK(test::plan_difference(cut, plan(planner.tree(), planner.held_options())) == "");

  // A query that sees node 2 up to its present length (6): node 2's next token
  // has fewer viewers than its last, a piece of its own, and the blocks are
  // cut again.
  planner.set_queries({{1}, {2}, {2, 6}});
  planner.update();
  planner.append_range(1, 94, 1);
  planner.update();
  CHECK(planner.last_update().held_layout);
  planner.append_range(2, 95, 1);
  const Plan& pieced = planner.update();
  CHECK_FALSE(planner.last_update().held_layout);
  CHECK(test::plan_difference(pieced, plan(planner.tree(), planner.held_options())) == "");
}

TEST_CASE("flatten's held blocks stay within block_tokens where the longest pass sets the step's time") {
  // Three blocks on an H100 leave it mostly idle: a longer block would
  // lengthen the step, so the blocks grow only into the room block_tokens leaves.
  IncrementalPlanner planner(kHeads, PlanOptions{Strategy::flatten, 32});
  planner.add_node_range(0, kNoParent, 0, 70);  // blocks of 26, 27 and 27 tokens
  planner.add_node_range(1, 0, 70, 6);
  planner.add_node_range(2, 0, 76, 4);
  planner.set_queries({{1}, {2}});
  planner.update();
  planner.append_range(1, 80, 5);  // the last block: 32 tokens
  CHECK(planner.update().block_token_count(2) == 32);
  CHECK(planner.last_update().held_layout);
  planner.append_range(2, 85, 1);
  const Plan& cut = planner.update();
  CHECK_FALSE(planner.last_update().held_layout);
  CHECK(test::plan_difference(cut, plan(planner.tree(), planner.held_options())) == "");

  // The 10 000-node forest fills it: its blocks may grow by the drift.
  RandomForestOptions forest;
  forest.nodes = 10000;
  forest.roots = 100;
  forest.queries = 2000;
  const Tree big = random_forest(forest);
  IncrementalPlanner filled(big.heads, PlanOptions{Strategy::flatten, 256});
  filled.add_tree(big);
  filled.update();
  std::int64_t next_slot = total_tokens(big);
  for (int step = 0; step < 4; ++step) {
    for (const TreeQuery& q : big.queries()) filled.append_range(q.node, next_slot++, 1);
    filled.update();
    // The first step cuts again: some queries see their node up to its
    // present length, and its next token is a piece of its own.
    CHECK(filled.last_update().held_layout == (step > 0));
  }
  CHECK(filled.plan().block_tokens > 256);
  CHECK(filled.plan().block_tokens <= 320);
}

TEST_CASE("flatten's held blocks on random forests: appends cover exactly, held or cut again") {
  std::int64_t held = 0, cut = 0;
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    const Tree start = small_forest(seed);
    std::int64_t next_slot = total_tokens(start);
    CAPTURE(seed);
    const IncrementalOptions incremental;
    IncrementalPlanner planner(start.heads, on_small_device(48), incremental);
    planner.add_tree(start);
    planner.update();
    std::mt19937_64 rng(seed);
    for (int step = 0; step < 30; ++step) {
      CAPTURE(step);
      for (int k = 0; k < 4; ++k) {  // nodes seen whole or in part, seen by no one, and leaves
        const TreeNode& n = start.nodes()[rng() % start.node_count()];
        const std::int64_t count = 1 + std::int64_t(rng() % 6);
        planner.append_range(n.id, next_slot, count);
        next_slot += count;
      }
      const Plan& updated = planner.update();
      const PlanUpdate& did = planner.last_update();
      REQUIRE_FALSE(did.reanalysed);
      if (did.held_layout) {
        ++held;
        REQUIRE(held_plan_error(planner, incremental, planner.tree(), updated) == "");
      } else {
        ++cut;
        REQUIRE(test::plan_difference(updated, plan(planner.tree(), planner.held_options())) == "");
      }
    }
  }
  CHECK(held > 60);
  CHECK(cut > 10);
}

TEST_CASE("tree-of-thought replays: forks and pruning between steps of appends") {
  for (const char* file : {"keywordToT.json", "docmergeToT.json"}) {
    const std::vector<ReasoningTree> trees = load_reasoning(kWorkloads + "/reasoning/" + file);
    for (Strategy s : kIncremental) {
      for (std::int32_t block : {64, kAutoBlockTokens}) {
        CAPTURE(file);
        CAPTURE(to_string(s));
        CAPTURE(block);
        auto scenario = reasoning_scenario(trees.front());
        const ReplayCounts c = replay_and_compare(*scenario, PlanOptions{s, block}, 400);
        CHECK(c.steps > 0);
        CHECK(c.appends_only > c.steps / 2);  // most steps only decode
      }
    }
  }
}

TEST_CASE("random appends to listed, ranged and partly seen nodes agree with from-scratch plans and cover exactly") {
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    const Tree start = small_forest(seed, 40, 24);
    std::int64_t next_slot = total_tokens(start);  // fresh slots keep every slot distinct
    for (Strategy s : kIncremental) {
      CAPTURE(seed);
      CAPTURE(to_string(s));
      IncrementalPlanner planner(start.heads, PlanOptions{s, 48}, bitwise());
      planner.add_tree(start);  // its nodes listed and ranged
      REQUIRE(test::plan_difference(planner.update(), plan(start, PlanOptions{s, 48})) == "");
      std::mt19937_64 rng(seed);
      for (int step = 0; step < 25; ++step) {
        // A few nodes grow by 1 to 3 tokens, as slot lists or ranges.
        for (int k = 0; k < 5; ++k) {
          const TreeNode& n = start.nodes()[rng() % start.node_count()];
          const std::int64_t count = 1 + std::int64_t(rng() % 3);
          if (rng() % 2 == 0) {
            planner.append_range(n.id, next_slot, count);
          } else {
            std::vector<std::int64_t> slots;
            for (std::int64_t t = 0; t < count; ++t) slots.push_back(next_slot + count - 1 - t);
            planner.append(n.id, slots);
          }
          next_slot += count;
        }
        const Plan& updated = planner.update();
        CHECK_FALSE(planner.last_update().reanalysed);
        REQUIRE(test::plan_difference(updated, plan(planner.tree(), PlanOptions{s, 48})) == "");
        REQUIRE(test::coverage_error(planner.tree(), updated) == "");
      }
    }
  }
}
