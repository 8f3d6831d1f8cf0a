// The IncrementalPlanner: at every step of whole decode replays (few-shot,
// speculative with accepted tokens, tree-of-thought with forks and pruning)
// its plan is bitwise the from-scratch plan of the same tree at its block
// size and launch order, for flatten and greedy; random appends on random forests agree and
// cover exactly; where it holds a layout (flatten's blocks, greedy's edge
// decisions) every plan covers every query's tokens exactly, within the
// limits it holds them to; bad changes are refused naming the node or
// token, and nothing pending is lost.

#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <string>

#include "support/plan_check.hpp"
#include "support/workloads_dir.hpp"
#include "treeattn/error.hpp"
#include "treeattn/incremental_planner.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/scenarios.hpp"
#include "treeattn/sequence_tree.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;

namespace {

const std::string kWorkloads = test::workloads_dir();
const HeadConfig kHeads{32, 8, 128, 0.0f};

// Every update bitwise plan(tree(), held_options()): no layout held.
IncrementalOptions bitwise() {
  IncrementalOptions incremental;
  incremental.hold_flatten_blocks = false;
  incremental.hold_greedy_groups = false;
  return incremental;
}

// What a replay's updates did, for the checks that the fast path ran.
struct ReplayCounts {
  std::int64_t steps = 0, appends_only = 0, chosen = 0;
  std::int64_t replaced = 0;  // steps that replaced nodes by ones of the same shape (no reanalysis)
  std::int64_t held = 0;      // steps on a layout kept from an earlier step (PlanUpdate::held_layout)
};

// A held plan: valid, every query's tokens covered exactly, and flatten's
// blocks no longer than the planner holds them to.
std::string held_plan_error(const IncrementalPlanner& planner, const IncrementalOptions& incremental, const Tree& tree,
                            const Plan& held) {
  try {
    validate(held);
  } catch (const Error& e) {
    return e.what();
  }
  if (planner.held_options().strategy == Strategy::flatten) {
    const auto limit = std::int32_t(double(planner.block_tokens()) * (1.0 + incremental.redecide_drift));
    std::int32_t longest = planner.block_tokens();
    for (std::int32_t b = 0; b < held.num_blocks(); ++b) longest = std::max(longest, held.block_token_count(b));
    if (longest > limit) return "a held block of " + std::to_string(longest) + " tokens > " + std::to_string(limit);
    if (held.block_tokens != longest) return "block_tokens is not the longest held block";
  }
  return test::coverage_error(tree, held);
}

// Replays `scenario` to its end, syncing a SequenceTree into an
// IncrementalPlanner each step. Every plan must equal the from-scratch plan
// of the same tree with the planner's held options (and, where it made the
// cost model's choices, the plan of the options as given), except plans on a
// layout held from an earlier step (`incremental`'s holds): those must be
// valid and cover every query's tokens exactly. Greedy holds its edge
// decisions at every step between the ones that decide them.
ReplayCounts replay_and_compare(Scenario& scenario, const PlanOptions& options, std::int64_t max_steps = 0,
                                const IncrementalOptions& incremental = bitwise()) {
  PagedKvCache cache(16, 0);
  SequenceTree live(cache);
  IncrementalPlanner planner(kHeads, options, incremental);
  std::vector<TreeQuery> queries;
  ReplayCounts counts;
  bool decides = true;  // this step's greedy decides its edges (the first, or after a choice or a reshaping)
  const std::int64_t steps = max_steps > 0 ? std::min(max_steps, scenario.steps()) : scenario.steps();
  for (std::int64_t step = 1; step <= steps; ++step) {
    scenario.advance(live, queries);
    live.sync(planner, queries);
    const Plan& updated = planner.update();
    const PlanUpdate& did = planner.last_update();
    const Tree tree = live.to_tree(kHeads, queries);
    if (options.strategy == Strategy::greedy) {
      CHECK(did.held_layout == (incremental.hold_greedy_groups && options.window == 0 && !decides && !did.chosen &&
                                !did.reanalysed &&
                                planner.held_options().greedy_candidate == GreedyCandidate::own));
    }
    decides = did.chosen || did.reanalysed;
    if (did.held_layout) {
      ++counts.held;
      const std::string error = held_plan_error(planner, incremental, tree, updated);
      if (!error.empty()) {
        FAIL_CHECK(scenario.name(), " step ", step, " (held layout): ", error);
        return counts;
      }
    } else {
      const std::string difference = test::plan_difference(updated, plan(tree, planner.held_options()));
      if (!difference.empty()) {
        FAIL_CHECK(scenario.name(), " step ", step, ": ", difference);
        return counts;
      }
      if (options.window > 0) {  // the windows slid with the appends: still each query's last tokens exactly
        const std::string error = test::coverage_error(tree, updated, options.window);
        if (!error.empty()) {
          FAIL_CHECK(scenario.name(), " step ", step, " (window ", options.window, "): ", error);
          return counts;
        }
      }
    }
    if (did.chosen) {
      ++counts.chosen;
      CHECK(test::plan_difference(updated, plan(tree, options)) == "");
    }
    ++counts.steps;
    if (!did.reanalysed) ++counts.appends_only;
    if (!did.reanalysed && did.replaced_nodes > 0) ++counts.replaced;
  }
  return counts;
}

const Strategy kIncremental[] = {Strategy::flatten, Strategy::greedy};

// A seeded forest in three trees, up to 40 tokens a node.
Tree small_forest(std::uint64_t seed, std::int32_t nodes = 60, std::int32_t queries = 30) {
  RandomForestOptions forest;
  forest.seed = seed;
  forest.nodes = nodes;
  forest.roots = 3;
  forest.queries = queries;
  forest.max_tokens = 40;
  return random_forest(forest);
}

// Flatten on a device of four CTA slots: the test trees fill it, so its
// held blocks may grow past block_tokens (held_block_limit()).
PlanOptions on_small_device(std::int32_t block_tokens) {
  PlanOptions options{Strategy::flatten, block_tokens};
  options.cost.slots = 4.0;
  options.cost.sms = 1.0;
  return options;
}

}  // namespace

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

TEST_CASE("a subtree replaced by one of the same shape: only slots are redone, nodes that moved included") {
  for (Strategy s : kIncremental) {
    CAPTURE(to_string(s));
    PlanOptions options{s, 32};
    options.kv_slots = 1000;
    IncrementalPlanner planner(kHeads, options, bitwise());
    planner.add_node_range(0, kNoParent, 0, 40);
    planner.add_node(1, 0, {90, 91, 92, 99});  // holds the largest slot
    planner.add_node_pages(2, 0, {5}, 16, 4);
    planner.add_node_range(3, 1, 200, 3);
    planner.set_queries({{3}, {2}, {1, 2}});
    planner.update();
    CHECK(planner.plan().min_kv_slots == 203);

    // Node 1 goes with its child 3, node 4 comes: three nodes where there
    // were four, another shape.
    planner.remove_node(1);
    planner.add_node_pages(4, 0, {7}, 16, 4);
    planner.append_range(0, 40, 2);  // the shared root grows in the same step
    planner.set_queries({{2}, {4}, {2, 2}});
    const Plan& reshaped = planner.update();
    CHECK(planner.last_update().reanalysed);
    CHECK(test::plan_difference(reshaped, plan(planner.tree(), options)) == "");

    // Node 2 replaced by node 5 of its shape, added behind node 4: node 4
    // moves into node 2's place and node 5 into node 4's, in other pages;
    // by index the tree keeps its shape.
    planner.remove_node(2);
    planner.add_node_pages(5, 0, {9}, 16, 4);
    planner.append_range(0, 42, 1);
    planner.set_queries({{4}, {5}, {4, 2}});
    const Plan& replaced = planner.update();
    CHECK_FALSE(planner.last_update().reanalysed);
    CHECK(planner.last_update().replaced_nodes == 2);
    CHECK(test::plan_difference(replaced, plan(planner.tree(), options)) == "");
    CHECK(test::coverage_error(planner.tree(), replaced) == "");
    CHECK(replaced.min_kv_slots == 9 * 16 + 4);  // node 5's last slot; the pages of before are gone

    // A replacement with a slot past the pool is refused naming the node;
    // once that node is replaced again, the update goes through.
    planner.remove_node(5);
    planner.add_node(6, 0, {10, 11, 12, 5000});
    planner.set_queries({{4}, {6}, {4, 2}});
    CHECK_THROWS_WITH_AS(planner.update(), doctest::Contains("node 6 (nodes[2]): slot"), Error);
    planner.remove_node(6);
    planner.add_node(7, 0, {10, 11, 12, 13});
    planner.set_queries({{4}, {7}, {4, 2}});
    const Plan& recovered = planner.update();
    CHECK_FALSE(planner.last_update().reanalysed);
    CHECK(test::plan_difference(recovered, plan(planner.tree(), options)) == "");
  }
}

TEST_CASE("replace_pages: a node takes other pages in place, its id and shape kept") {
  for (Strategy s : kIncremental) {
    CAPTURE(to_string(s));
    PlanOptions options{s, 32};
    options.kv_slots = 1000;
    IncrementalPlanner planner(kHeads, options, bitwise());
    planner.add_node_range(0, kNoParent, 0, 40);
    planner.add_node_pages(1, 0, {10, 11}, 16, 5);
    planner.add_node_pages(2, 1, {12}, 16, 3);
    planner.add_node_pages(3, 0, {13}, 16, 16);
    planner.set_queries({{2}, {3}, {1, 7}});
    planner.update();

    // A speculative step: nodes 1 and 2 take other pages at their lengths,
    // the root grows; only slots are redone.
    planner.replace_pages(1, {20, 21}, 16, 5);
    planner.replace_pages(2, {22}, 16, 3);
    planner.append_range(0, 40, 2);
    const Plan& replaced = planner.update();
    CHECK_FALSE(planner.last_update().reanalysed);
    CHECK(planner.last_update().replaced_nodes == 2);
    CHECK(test::plan_difference(replaced, plan(planner.tree(), planner.held_options())) == "");
    CHECK(test::coverage_error(planner.tree(), replaced) == "");
    CHECK(planner.tree().nodes()[1].id == 1);
    CHECK(planner.tree().slot(1, 0) == 20 * 16);

    // At another length the tree has another shape: it is analysed again.
    planner.replace_pages(2, {23, 24}, 16, 1);
    const Plan& longer = planner.update();
    CHECK(planner.last_update().reanalysed);
    CHECK(test::plan_difference(longer, plan(planner.tree(), planner.held_options())) == "");

    // Replaced and then removed with its parent in the same step: nothing of it is left.
    planner.replace_pages(2, {25, 26}, 16, 1);
    planner.remove_node(1);
    planner.set_queries({{3}, {0, 10}});
    const Plan& removed = planner.update();
    CHECK(planner.tree().node_count() == 2);
    CHECK(test::plan_difference(removed, plan(planner.tree(), planner.held_options())) == "");

    // Pages past the pool are refused at the update naming the node; the
    // replacement stays pending until replaced again.
    planner.replace_pages(3, {70}, 16, 16);
    CHECK_THROWS_WITH_AS(planner.update(), doctest::Contains("node 3 (nodes[1])"), Error);
    CHECK_THROWS_WITH_AS(planner.update(), doctest::Contains("out of range for a KV pool of 1000 slots"), Error);
    planner.replace_pages(3, {30}, 16, 16);
    const Plan& recovered = planner.update();
    CHECK_FALSE(planner.last_update().reanalysed);
    CHECK(test::plan_difference(recovered, plan(planner.tree(), planner.held_options())) == "");
    CHECK_THROWS_WITH_AS(planner.replace_pages(9, {1}, 16, 1), doctest::Contains("replace_pages: node 9 is not in the tree"),
                         Error);
  }
}

TEST_CASE("a SequenceTree's new token tree takes the removed one's places only where those were the planner's last") {
  PagedKvCache cache(16, 0);
  SequenceTree live(cache);
  IncrementalPlanner planner(kHeads, PlanOptions{Strategy::flatten, 32}, bitwise());
  const std::int64_t root = live.add_node(kNoParent);
  live.append(root, 40);
  const std::int64_t a = live.add_node(root);
  live.append(a, 3);
  const std::int64_t a1 = live.add_node(a);
  live.append(a1, 1);
  const std::int64_t b = live.add_node(root);
  live.append(b, 2);
  std::vector<TreeQuery> queries = {{a1}, {b}};
  live.sync(planner, queries);
  planner.update();
  auto agrees = [&] {
    return test::plan_difference(planner.plan(), plan(live.to_tree(kHeads, queries), planner.held_options()));
  };
  CHECK(agrees() == "");

  // Node a's subtree goes and one of its shape comes, but node b came after
  // it: the new nodes would stand elsewhere in the planner than in
  // to_tree(), so they are added as nodes of their own.
  live.remove(a);
  const std::int64_t c = live.add_node(root);
  live.append(c, 3);
  const std::int64_t c1 = live.add_node(c);
  live.append(c1, 1);
  queries = {{c1}, {b}};
  std::vector<std::int64_t> handed;
  live.sync(planner, queries, &handed);
  planner.update();
  CHECK(planner.last_update().reanalysed);
  CHECK(planner.tree().nodes()[2].id == c);
  CHECK(agrees() == "");
  CHECK(handed.size() == 4);  // c's three tokens and c1's one

  // Now c's subtree is the planner's last: its successor takes its places
  // (and ids) in other pages, the root grown in the same step.
  live.remove(c);
  live.append(root, 2);
  const std::int64_t d = live.add_node(root);
  live.append(d, 3);
  const std::int64_t d1 = live.add_node(d);
  live.append(d1, 1);
  queries = {{d1}, {b}};
  handed.clear();
  live.sync(planner, queries, &handed);
  planner.update();
  CHECK_FALSE(planner.last_update().reanalysed);
  CHECK(planner.last_update().replaced_nodes == 2);
  CHECK(planner.tree().nodes()[2].id == c);
  CHECK(planner.tree().nodes()[3].id == c1);
  CHECK(agrees() == "");
  CHECK(handed.size() == 6);  // the root's two new tokens, d's three, d1's one
  CHECK(handed[2] == live.slot(d, 0));

  // Later changes reach the nodes by the ids the planner keeps.
  live.append(d1, 2);
  live.remove(b);
  queries = {{d1}};
  live.sync(planner, queries);
  planner.update();
  CHECK(planner.tree().node_count() == 3);
  CHECK(agrees() == "");

  // A query on a node not in the tree reaches the planner as it is, which names it.
  live.sync(planner, {{d1}, {999}});
  CHECK_THROWS_WITH_AS(planner.update(), doctest::Contains("queries[1]: node 999 is not a node id"), Error);
  live.sync(planner, queries);
  planner.update();
  CHECK(agrees() == "");
}

TEST_CASE("random SequenceTree steps (growth, forks, pruning, token trees replaced) plan bitwise what to_tree() plans") {
  for (Strategy s : kIncremental) {
    CAPTURE(to_string(s));
    std::mt19937_64 rng(7);
    auto pick = [&](std::size_t n) { return std::size_t(rng() % n); };
    PagedKvCache cache(4, 0);
    SequenceTree live(cache);
    IncrementalPlanner planner(kHeads, PlanOptions{s, 16}, bitwise());
    std::vector<std::int64_t> nodes = {live.add_node(kNoParent)};
    live.append(nodes[0], 9);
    // The last token tree: its root and its nodes' parents (as indices into it) and lengths.
    std::int64_t draft_root = -1;
    std::vector<std::pair<std::int64_t, std::int64_t>> draft_shape;
    std::int64_t replaced_steps = 0;
    for (int step = 0; step < 120; ++step) {
      CAPTURE(step);
      const std::size_t op = pick(5);
      if (op == 0 && draft_root >= 0 && live.contains(draft_root)) {  // the token tree again, in other pages
        const std::int64_t parent = live.parent(draft_root);
        live.remove(draft_root);
        std::vector<std::int64_t> made;
        for (const auto& [p, length] : draft_shape) {
          made.push_back(live.add_node(p < 0 ? parent : made[std::size_t(p)]));
          live.append(made.back(), length);
        }
        draft_root = made[0];
      } else if (op == 1 || op == 4) {  // a new token tree under a random node, or (4) one as large in the last's place
        const bool instead = op == 4 && draft_root >= 0 && live.contains(draft_root);
        const std::int64_t parent = instead ? live.parent(draft_root) : nodes[pick(nodes.size())];
        const std::size_t size = instead ? draft_shape.size() : 1 + pick(6);
        if (instead) live.remove(draft_root);
        draft_shape.clear();
        std::vector<std::int64_t> made;
        for (std::size_t k = 0, n = size; k < n; ++k) {
          const std::int64_t p = k == 0 ? -1 : std::int64_t(pick(k));
          made.push_back(live.add_node(p < 0 ? parent : made[std::size_t(p)]));
          draft_shape.emplace_back(p, 1 + std::int64_t(pick(3)));
          live.append(made.back(), draft_shape.back().second);
        }
        draft_root = made[0];
        nodes.insert(nodes.end(), made.begin(), made.end());
      } else if (op == 2 && nodes.size() > 1) {  // a branch pruned
        live.remove(nodes[1 + pick(nodes.size() - 1)]);
      } else {  // growth
        for (std::size_t k = 0; k < 3; ++k) live.append(nodes[pick(nodes.size())], 1 + std::int64_t(pick(5)));
      }
      std::vector<std::int64_t> alive;
      for (std::int64_t id : nodes) {
        if (live.contains(id)) alive.push_back(id);
      }
      nodes = alive;
      if (draft_root >= 0 && live.contains(draft_root)) {  // the token tree's nodes join the list once
        for (std::int64_t id = draft_root; id < draft_root + std::int64_t(draft_shape.size()); ++id) {
          if (live.contains(id) && std::find(nodes.begin(), nodes.end(), id) == nodes.end()) nodes.push_back(id);
        }
      }
      std::vector<TreeQuery> queries;  // every node: a token tree taken again keeps the planner's queries
      for (std::int64_t id : nodes) queries.push_back({id});
      live.sync(planner, queries);
      const Plan& updated = planner.update();
      if (!planner.last_update().reanalysed && planner.last_update().replaced_nodes > 0) ++replaced_steps;
      const std::string difference =
          test::plan_difference(updated, plan(live.to_tree(kHeads, queries), planner.held_options()));
      if (!difference.empty()) {
        FAIL_CHECK(difference);
        break;
      }
    }
    CHECK(replaced_steps > 5);
  }
}

TEST_CASE("windows slide as leaves grow: few-shot, speculative and tree-of-thought replays plan bitwise, layouts held or not") {
  const MedusaWorkload medusa = load_medusa(kWorkloads + "/speculative/APPS_tree_size64.json");
  const std::vector<ReasoningTree> reasoning = load_reasoning(kWorkloads + "/reasoning/keywordToT.json");
  for (Strategy s : {Strategy::flatten, Strategy::greedy, Strategy::node, Strategy::sequence}) {
    for (std::int32_t window : {1, 24, 700}) {
      for (const IncrementalOptions& incremental : {IncrementalOptions{}, bitwise()}) {
        CAPTURE(to_string(s));
        CAPTURE(window);
        PlanOptions options{s, window == 24 ? kAutoBlockTokens : 64};
        options.window = window;
        auto fewshot = few_shot_scenario(1000, 12, 40);  // windows leave the prompt token by token
        const ReplayCounts f = replay_and_compare(*fewshot, options, 0, incremental);
        CHECK(f.steps == 40);
        CHECK(f.held == 0);  // no layout is held under a window
        auto speculative = speculative_scenario(medusa, 0, 600);
        CHECK(replay_and_compare(*speculative, options, 30, incremental).held == 0);
        auto thought = reasoning_scenario(reasoning.front());
        CHECK(replay_and_compare(*thought, options, 60, incremental).held == 0);
      }
    }
  }
}

TEST_CASE("random appends under a window: each update bitwise the from-scratch plan, windows covered exactly") {
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    const Tree start = small_forest(seed, 40, 24);
    std::int64_t next_slot = total_tokens(start);
    for (Strategy s : kIncremental) {
      CAPTURE(seed);
      CAPTURE(to_string(s));
      PlanOptions options{s, 48};
      options.window = std::int32_t(3 + seed * 7);
      IncrementalPlanner planner(start.heads, options);  // holds on: a window turns them off
      planner.add_tree(start);
      REQUIRE(test::plan_difference(planner.update(), plan(start, options)) == "");
      std::mt19937_64 rng(seed);
      for (int step = 0; step < 20; ++step) {
        for (int k = 0; k < 4; ++k) {
          const TreeNode& n = start.nodes()[rng() % start.node_count()];
          const std::int64_t count = 1 + std::int64_t(rng() % 3);
          planner.append_range(n.id, next_slot, count);
          next_slot += count;
        }
        const Plan& updated = planner.update();
        CHECK_FALSE(planner.last_update().held_layout);
        REQUIRE(test::plan_difference(updated, plan(planner.tree(), options)) == "");
        REQUIRE(test::coverage_error(planner.tree(), updated, options.window) == "");
      }
    }
  }
}

TEST_CASE("removing a node takes its subtree; a query left on it is reported by update") {
  IncrementalPlanner planner(kHeads, PlanOptions{Strategy::flatten, 64});
  planner.add_node_range(10, kNoParent, 0, 100);
  planner.add_node_range(11, 10, 100, 20);
  planner.add_node_range(12, 11, 120, 5);
  planner.add_node_range(13, 10, 125, 7);
  planner.set_queries({{12}, {13}});
  planner.update();
  planner.remove_node(11);
  planner.set_queries({{13}});
  const Plan& after = planner.update();
  CHECK(planner.tree().node_count() == 2);
  CHECK(after.num_tokens() == 107);
  Tree expected(kHeads);
  expected.add_node_range(10, kNoParent, 0, 100);
  expected.add_node_range(13, 10, 125, 7);
  expected.add_query(13);
  CHECK(test::plan_difference(after, plan(expected, PlanOptions{Strategy::flatten, 64})) == "");

  planner.remove_node(13);
  CHECK_THROWS_WITH_AS(planner.update(), doctest::Contains("queries[0]: node 13 is not a node id"), Error);
  planner.set_queries({{10}});
  CHECK(planner.update().num_tokens() == 100);  // the pending removal was kept

  // Children listed before their parents: the subtree still goes with it.
  IncrementalPlanner late(kHeads, PlanOptions{Strategy::flatten, 64});
  late.add_node_range(22, 21, 110, 3);
  late.add_node_range(21, 20, 100, 5);
  late.add_node_range(20, kNoParent, 0, 100);
  late.add_node_range(30, kNoParent, 200, 10);
  late.set_queries({{22}, {30}});
  CHECK(late.update().num_tokens() == 118);
  late.remove_node(21);
  late.set_queries({{30}});
  CHECK(late.update().num_tokens() == 10);
  CHECK(late.tree().node_count() == 2);
}

TEST_CASE("bad changes are refused naming the node, and a failed update loses nothing") {
  PlanOptions options{Strategy::greedy, 32};
  options.kv_slots = 200;
  IncrementalPlanner planner(kHeads, options);
  planner.add_node_range(0, kNoParent, 0, 50);
  planner.add_node_pages(1, 0, {4, 5}, 16, 3);
  planner.add_node_range(2, 0, 150, 10);
  planner.set_queries({{1}, {2}});
  planner.update();

  CHECK_THROWS_WITH_AS(planner.append(7, {1}), doctest::Contains("append: node 7 is not in the tree"), Error);
  CHECK_THROWS_WITH_AS(planner.add_node_range(2, 0, 0, 1), doctest::Contains("node id 2 is in the tree already"), Error);
  CHECK_THROWS_WITH_AS(planner.append(1, {1}), doctest::Contains("node 1 is paged"), Error);
  CHECK_THROWS_WITH_AS(planner.append_pages(1, 20, {}), doctest::Contains("append_pages: node 1"), Error);
  CHECK_THROWS_WITH_AS(planner.append_pages(2, 1, {}), doctest::Contains("node 2 is not paged"), Error);

  planner.append_pages(1, 14, {9});  // fills page 5 (13 more) and one token of page 9
  planner.append_range(2, 199, 2);   // slots 199 and 200: past the pool
  CHECK_THROWS_WITH_AS(planner.update(), doctest::Contains("node 2 (nodes[2]): slot"), Error);
  CHECK_THROWS_WITH_AS(planner.update(), doctest::Contains("out of range for a KV pool of 200 slots"), Error);
  planner.remove_node(2);
  planner.set_queries({{1}});
  const Plan& fixed = planner.update();
  Tree expected(kHeads);
  expected.add_node_range(0, kNoParent, 0, 50);
  expected.add_node_pages(1, 0, {4, 5, 9}, 16, 1);
  expected.add_query(1);
  CHECK(test::plan_difference(fixed, plan(expected, options)) == "");
  CHECK_THROWS_WITH_AS(planner.remove_node(2), doctest::Contains("remove_node: node 2 is not in the tree"), Error);
}

TEST_CASE("options plan() refuses are refused by the constructor") {
  CHECK_THROWS_AS(IncrementalPlanner(kHeads, PlanOptions{Strategy::flatten, -3}), Error);
  IncrementalOptions bad;
  bad.redecide_drift = -1.0;
  CHECK_THROWS_WITH_AS(IncrementalPlanner(kHeads, PlanOptions{}, bad), doctest::Contains("redecide_drift"), Error);
}

TEST_CASE("changes refused at once: a node id of -1, appends past the limit of a node") {
  IncrementalPlanner planner(kHeads, PlanOptions{Strategy::flatten, 16});
  CHECK_THROWS_WITH_AS(planner.add_node_range(kNoParent, kNoParent, 0, 4),
                       doctest::Contains("id -1 is the parent of a root"), Error);
  planner.add_node(0, kNoParent, {0, 1, 2});
  planner.set_queries({{0}});
  planner.update();
  // A count past INT32_MAX tokens a node is refused before room is made for its slots.
  CHECK_THROWS_WITH_AS(planner.append_range(0, 3, std::int64_t(1) << 40),
                       doctest::Contains("append: node 0: 1099511627776 tokens more than its 3 leave 0 to 2147483647 per node"), Error);
  CHECK_THROWS_WITH_AS(planner.append_range(0, 3, std::numeric_limits<std::int64_t>::max()),
                       doctest::Contains("leave 0 to 2147483647 per node"), Error);
  // A range of a negative count (refused at the update) takes no append: room for it would be negative.
  planner.add_node_range(2, 0, 10, -std::numeric_limits<std::int64_t>::max());
  CHECK_THROWS_WITH_AS(planner.append_range(2, 50, 8), doctest::Contains("append: node 2: 8 tokens more than its"), Error);
  planner.remove_node(2);
  // append_pages checks the count before adding it to the node's length.
  planner.add_node_pages(3, 0, {9}, 16, 3);
  CHECK_THROWS_WITH_AS(planner.append_pages(3, std::numeric_limits<std::int64_t>::max(), {}),
                       doctest::Contains("append: node 3: 9223372036854775807 tokens more than its 3"), Error);
  planner.remove_node(3);
  // Slots appended past INT64_MAX wrap to negative ones, which the update refuses naming the node.
  planner.add_node(1, 0, {7});
  planner.append_range(1, std::numeric_limits<std::int64_t>::max(), 3);
  // So do those of a range ending past INT64_MAX that becomes a list as a slot joins it elsewhere.
  planner.add_node_range(4, 0, std::numeric_limits<std::int64_t>::max(), 2);
  planner.append_range(4, 20, 1);
  CHECK_THROWS_WITH_AS(planner.update(), doctest::Contains("node 1"), Error);
  planner.remove_node(1);
  CHECK_THROWS_WITH_AS(planner.update(), doctest::Contains("node 4"), Error);
  planner.remove_node(4);
  CHECK(planner.update().num_tokens() == 3);
}

TEST_CASE("add_tree refuses a tree of other heads, head_dim_v among them, naming both") {
  IncrementalPlanner planner(HeadConfig{8, 2, 192, 0.0f, 128});
  Tree other({8, 2, 192});
  other.add_node_range(0, kNoParent, 0, 4);
  CHECK_THROWS_WITH_AS(planner.add_tree(other),
                       doctest::Contains("the tree's heads 8/2/192 scale 0.07216878 are not the planner's 8/2/192 v 128"),
                       Error);
  Tree same({8, 2, 192, 0.0f, 128});
  same.add_node_range(0, kNoParent, 0, 4);
  same.add_query(0);
  planner.add_tree(same);
  CHECK(planner.update().heads.value_dim() == 128);
}
