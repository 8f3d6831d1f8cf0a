// The IncrementalPlanner's changes beyond appends: subtrees and pages
// replaced in place, a SequenceTree's token trees taking the removed ones'
// places, sliding windows moving as leaves grow, removals; every update is
// bitwise the from-scratch plan, and bad changes are refused naming the node
// or token, nothing pending lost.

#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <string>

#include "engine/incremental_replay.hpp"
#include "support/plan_check.hpp"
#include "treeattn/error.hpp"
#include "treeattn/incremental_planner.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/scenarios.hpp"
#include "treeattn/sequence_tree.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;
using namespace treeattn::incremental_test;

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
