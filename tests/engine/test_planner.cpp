// Planner invariants for every strategy: exact coverage of each visible
// (query, token) pair, nothing invisible unmasked, block and tile limits, a
// self-consistent plan, determinism; plus the shape each strategy promises.

#include <doctest/doctest.h>

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "support/plan_check.hpp"
#include "treeattn/error.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;

using test::check_invariants;
using test::coverage_error;
using test::item_tokens;
using test::ItemToken;

namespace {

Tree star(std::int32_t leaves, std::int64_t prefix, std::int64_t leaf_tokens) {
  Tree tree({32, 8, 128});
  tree.add_node_range(0, kNoParent, 0, prefix);
  for (std::int32_t i = 0; i < leaves; ++i) {
    tree.add_node_range(i + 1, 0, prefix + i * leaf_tokens, leaf_tokens);
    tree.add_query(i + 1);
  }
  return tree;
}

}  // namespace

TEST_CASE("every strategy covers seeded random forests exactly") {
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    const Tree tree = random_forest(test::invariant_forest(seed));
    CAPTURE(seed);
    for (Strategy s : all_strategies()) {
      for (std::int32_t block_tokens : {1, 7, 64, 256, kAutoBlockTokens}) {
        PlanOptions options;
        options.strategy = s;
        options.block_tokens = block_tokens;
        options.query_tile = seed % 3 == 0 ? 5 : kMaxQueryTile;
        check_invariants(tree, options);
      }
    }
  }
}

TEST_CASE("one Planner called from several threads at once gives plan()'s plans") {
  Planner shared(3);
  std::vector<Tree> trees;
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    RandomForestOptions o;
    o.seed = seed;
    o.nodes = 150;
    o.queries = 60;
    o.max_tokens = 300;
    trees.push_back(random_forest(o));
  }
  std::vector<std::string> differences(trees.size() * 2);
  std::vector<std::thread> callers;
  for (std::size_t c = 0; c < 4; ++c) {
    callers.emplace_back([&, c] {
      for (std::size_t i = c; i < differences.size(); i += 4) {
        PlanOptions options;
        options.strategy = i % 2 == 0 ? Strategy::flatten : Strategy::greedy;
        const Tree& tree = trees[i / 2];
        differences[i] = test::plan_difference(shared.plan(tree, options), plan(tree, options));
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (const std::string& d : differences) CHECK(d == "");
}

TEST_CASE("block_tokens auto keeps the candidate plan the cost model predicts fastest") {
  // The planner times each candidate from its shape (PlanBuilder's shape mode)
  // and builds only the one it keeps; this re-plans every candidate in full.
  std::vector<std::pair<std::string, Tree>> trees = {
      {"few-shot b=50", few_shot_tree({32, 8, 128}, 4000, 50, 200)},
      {"speculative 32-token tree on 1161 tokens", level_tree({32, 8, 128}, {1, 4, 8}, {1161, 4, 2})},
      {"deep levels", level_tree({16, 1, 128}, {1, 4, 16, 64}, {256, 64, 32, 16})},
      {"star", star(40, 3000, 20)},
  };
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    RandomForestOptions o;
    o.seed = seed;
    o.nodes = 200;
    o.roots = int(seed % 3) + 1;
    o.queries = 100;
    o.max_tokens = 400;
    o.heads = {8, 2, 64};
    trees.emplace_back("random forest " + std::to_string(seed), random_forest(o));
  }
  CostModel one_sm;  // a device the SM placement matters most on
  one_sm.set("sms=1,slots=2");
  // Planners reused across trees, as a serving loop keeps one: the candidates
  // timed in parallel (each worker its own memo and bound) choose the same plan.
  Planner three(3), all(0), single(1);
  CHECK(three.threads() == 3);
  CHECK(single.threads() == 1);
  // Under a sliding window too: the shapes the candidates are timed from
  // hold only the tokens and queries the windows leave.
  for (const auto& [name, tree] : trees) {
    for (const auto& [model_name, model] : {std::pair{"defaults", CostModel{}}, std::pair{"one SM", one_sm}}) {
    for (Strategy s : {Strategy::flatten, Strategy::greedy, Strategy::node, Strategy::sequence}) {
    for (std::int32_t window : {0, 300}) {
      CAPTURE(name);
      CAPTURE(model_name);
      CAPTURE(to_string(s));
      CAPTURE(window);
      PlanOptions options;
      options.strategy = s;
      options.cost = model;
      options.window = window;
      REQUIRE(options.block_tokens == kAutoBlockTokens);  // the default
      const Plan chosen = plan(tree, options);
      // The fastest prediction among the candidates, the shortest on a tie.
      std::optional<Plan> expected;
      double expected_us = 0.0;
      for (std::int32_t block_tokens : auto_block_candidates(options.cost)) {
        PlanOptions fixed = options;
        fixed.block_tokens = block_tokens;
        Plan candidate = plan(tree, fixed);
        const double us = estimate_cost(candidate, options.cost).time_us;
        if (!expected || us < expected_us) {
          expected = std::move(candidate);
          expected_us = us;
        }
      }
      CHECK(test::plan_difference(chosen, *expected) == "");
      for (Planner* planner : {&three, &all, &single}) CHECK(test::plan_difference(planner->plan(tree, options), chosen) == "");
      check_invariants(tree, options);
    }
    }
    }
  }
  // What the choice is for: a long prompt under many branches merges fewer
  // partials in longer blocks; a small tree keeps short blocks, more CTAs.
  CHECK(plan(trees[0].second).block_tokens > 256);
  CHECK(plan(trees[1].second).block_tokens == 256);

  // The merge's fan-in (fanin_ns): a 4 000-token prompt under ten 400-token
  // branches in 256-token blocks gives a query 19 partials, which the H100
  // merged slower than 512-token blocks' 10 gained back in stage 1 (the
  // per-row partial_ns alone keeps 256).
  {
    const Tree prompt = level_tree({32, 8, 128}, {1, 10}, {4000, 400});
    PlanOptions no_fanin;
    no_fanin.cost.set("fanin_ns=0");
    const Plan fine = plan(prompt, no_fanin), chosen = plan(prompt);
    CHECK(fine.block_tokens == 256);
    CHECK(chosen.block_tokens > 256);
    auto fanin = [](const Plan& p) {
      std::int32_t most = 0;
      for (std::size_t q = 0; q + 1 < p.merge_begin.size(); ++q) most = std::max(most, p.merge_begin[q + 1] - p.merge_begin[q]);
      return most;
    };
    CHECK(fanin(fine) == 19);
    CHECK(estimate_cost(fine, CostModel{}).max_fanin == 19);
    CHECK(estimate_cost(chosen, CostModel{}).max_fanin == fanin(chosen));
    CHECK(fanin(chosen) < 19);
  }

  // The candidates: the range's ends and the fixed ladder of quarter octaves
  // from 256 (whole KV tiles; whole tokens below one) between them.
  const CostModel defaults;
  CHECK(auto_block_candidates(defaults) ==
        std::vector<std::int32_t>{256, 320, 384, 448, 512, 640, 704, 832, 1024, 1216, 1472, 1728, 2048});
  CostModel narrow;
  narrow.set("auto_block_min=100,auto_block_max=300");
  CHECK(auto_block_candidates(narrow) == std::vector<std::int32_t>{100, 128, 192, 256, 300});
  narrow.set("auto_block_min=40,auto_block_max=64");
  CHECK(auto_block_candidates(narrow) == std::vector<std::int32_t>{40, 45, 54, 64});
  // Moving an end of the range adds or removes sizes; the ones in between stay.
  CostModel wider;
  wider.set("auto_block_min=192,auto_block_max=4096");
  CHECK(auto_block_candidates(wider) == std::vector<std::int32_t>{192, 256, 320, 384, 448, 512, 640, 704, 832, 1024,
                                                                   1216, 1472, 1728, 2048, 2432, 2880, 3456, 4096});
  wider.set("auto_block_max=1024");
  CHECK(auto_block_candidates(wider) == std::vector<std::int32_t>{192, 256, 320, 384, 448, 512, 640, 704, 832, 1024});
  wider.set("auto_block_min=300,auto_block_max=1000");
  CHECK(auto_block_candidates(wider) == std::vector<std::int32_t>{300, 320, 384, 448, 512, 640, 704, 832, 1000});

  // A range of one candidate is that fixed size.
  PlanOptions one;
  one.cost.set("auto_block_min=512,auto_block_max=512");
  PlanOptions fixed;
  fixed.block_tokens = 512;
  CHECK(test::plan_difference(plan(trees[0].second, one), plan(trees[0].second, fixed)) == "");

  PlanOptions inverted;
  inverted.cost.auto_block_min = 1024;
  inverted.cost.auto_block_max = 256;
  CHECK_THROWS_WITH_AS(plan(trees[0].second, inverted), doctest::Contains("auto_block_min = 1024, auto_block_max = 256"),
                       Error);
  CHECK_THROWS_WITH_AS(one.cost.set("auto_block_min=2048"), doctest::Contains("auto_block_min = 2048 is above auto_block_max = 512"),
                       Error);
  CHECK_THROWS_WITH_AS(one.cost.set("auto_block_max=100000"), doctest::Contains("auto_block_max = '100000' is not an integer"),
                       Error);
}

TEST_CASE("the planner launches the blocks with the longest passes first where its model predicts a gain") {
  // Greedy's groups of a FastTree shape are blocks of very different lengths:
  // launched depth-first, the 1 024-token prefix's passes start last and run
  // on a few SMs after the others have emptied (H100: 29.8 -> 26.3 us a layer
  // launched longest first; benchmarks/h100/launch_order.json).
  const Tree tree = level_tree({16, 1, 128}, {1, 4, 16, 512}, {1024, 256, 128, 32});
  PlanOptions options;
  options.strategy = Strategy::greedy;
  const Plan reordered = plan(tree, options);
  REQUIRE_FALSE(reordered.launch_order.empty());
  CHECK_NOTHROW(validate(reordered));
  const CostEstimate est = estimate_cost(reordered, options.cost);
  CHECK(est.longest_first);
  CHECK(est.time_us * options.cost.reorder_gain <= est.item_order_us);
  // Blocks by their longest pass, longest first (an oracle of the pass cost
  // from the plan itself: 64-row passes while over 16 rows remain, then one
  // of at most 16).
  const CostModel& m = options.cost;
  const std::int32_t group = reordered.heads.group_size();
  double previous = 1e300;
  for (std::int32_t k = 0; k < reordered.num_items();) {
    const std::int32_t block = reordered.item_block[std::size_t(reordered.launch_item(k))];
    const double tiles = double((reordered.block_token_count(block) + 63) / 64);
    double longest = 0.0;
    for (; k < reordered.num_items() && reordered.item_block[std::size_t(reordered.launch_item(k))] == block; ++k) {
      const std::size_t i = std::size_t(reordered.launch_item(k));
      const std::int32_t rows = (reordered.item_query_begin[i + 1] - reordered.item_query_begin[i]) * group;
      const bool large = reordered.item_tile_rows[i] == kLargeTileRows && rows > kSmallTileRows;
      const std::int32_t last_rows = rows % kLargeTileRows;
      const bool small = reordered.item_tile_rows[i] == kSmallTileRows || (last_rows != 0 && last_rows <= kSmallTileRows);
      if (large) longest = std::max(longest, m.pass_ns + tiles * m.tile_ns_large);
      if (small) longest = std::max(longest, m.pass_ns + tiles * m.tile_ns_small);
    }
    CHECK(longest <= previous);
    previous = longest;
  }
  // reorder_gain 0 keeps item order; the same block size launched in item
  // order is the plan without its launch order.
  PlanOptions never = options;
  never.cost.set("reorder_gain=0");
  CHECK(plan(tree, never).launch_order.empty());
  PlanOptions fixed = never;
  fixed.block_tokens = reordered.block_tokens;
  Plan same_blocks = reordered;
  same_blocks.launch_order.clear();
  PlanOptions fixed_reordered = options;
  fixed_reordered.block_tokens = reordered.block_tokens;
  CHECK(test::plan_difference(plan(tree, fixed), same_blocks) == "");
  CHECK(test::plan_difference(plan(tree, fixed_reordered), reordered) == "");
  // Even blocks gain nothing from another order: few-shot's plan keeps item order.
  CHECK(plan(few_shot_tree({32, 8, 128}, 4000, 50, 200)).launch_order.empty());
}

TEST_CASE("edge cases: single token, deep chain, wide star, upto inside a block, forests") {
  std::vector<std::pair<const char*, Tree>> cases;
  {
    Tree tree({4, 4, 64});
    tree.add_node(5, kNoParent, {3});
    tree.add_query(5);
    cases.emplace_back("single token", tree);
  }
  {
    Tree tree({8, 2, 64});
    for (std::int64_t i = 0; i < 1000; ++i) tree.add_node_range(i, i == 0 ? kNoParent : i - 1, i, 1);
    for (std::int64_t i : {0, 1, 63, 64, 65, 255, 256, 499, 500, 501, 998, 999}) tree.add_query(i);
    tree.add_query(500, 0);  // sees its ancestors only
    cases.emplace_back("1000-deep chain", tree);
  }
  cases.emplace_back("star of 300 leaves under a 4000-token prefix", star(300, 4000, 5));
  {
    // A speculative token tree: one node of 40 draft tokens with causal queries.
    Tree tree({16, 1, 128});
    tree.add_node_range(0, kNoParent, 0, 700);
    tree.add_node_range(1, 0, 700, 40);
    for (std::int64_t u = 1; u <= 40; ++u) tree.add_query(1, u);
    tree.add_query(0, 350);  // a boundary in the middle of the prefix
    cases.emplace_back("upto boundaries inside blocks", tree);
  }
  {
    RandomForestOptions o;
    o.nodes = 200;
    o.roots = 20;
    o.queries = 120;
    o.seed = 99;
    cases.emplace_back("forest of 20 requests", random_forest(o));
  }
  for (const auto& [name, tree] : cases) {
    CAPTURE(name);
    for (Strategy s : all_strategies()) {
      for (std::int32_t block_tokens : {1, 64, 256, 4096}) {
        check_invariants(tree, PlanOptions{s, block_tokens, kMaxQueryTile, 0});
      }
    }
  }
}

TEST_CASE("GQA head configurations plan identically apart from the heads") {
  RandomForestOptions o;
  o.seed = 7;
  o.nodes = 30;
  o.queries = 20;
  const Plan reference = plan(random_forest(o));
  for (int group : {1, 4, 8, 16}) {
    o.heads = {2 * group, 2, 128, 0.0f};
    const Plan p = plan(random_forest(o));
    CHECK(p.heads.group_size() == group);
    CHECK(p.tile_query == reference.tile_query);
    CHECK(p.segment_mask == reference.segment_mask);
  }
}

TEST_CASE("more than 64 queries on one KV block become adjacent work items over the same block") {
  const Tree tree = star(150, 200, 1);  // one 256-token block holds the prefix and 56 leaves
  const Plan p = plan(tree, PlanOptions{Strategy::flatten, 256, kMaxQueryTile, 0});
  REQUIRE(p.num_items() > p.num_blocks());
  std::set<std::int32_t> seen_blocks;
  for (std::int32_t i = 0; i < p.num_items(); ++i) {
    const std::int32_t b = p.item_block[std::size_t(i)];
    if (i > 0 && b != p.item_block[std::size_t(i) - 1]) CHECK(seen_blocks.count(b) == 0);  // adjacency
    seen_blocks.insert(b);
    CHECK(p.item_query_begin[std::size_t(i) + 1] - p.item_query_begin[std::size_t(i)] <= 64);
  }
  // The first block is read by all 150 queries: ceil(150 / 64) = 3 tiles.
  CHECK(std::count(p.item_block.begin(), p.item_block.end(), 0) == 3);
}

TEST_CASE("flatten cuts the depth-first token order into even blocks, each token once") {
  RandomForestOptions o;
  o.seed = 11;
  o.nodes = 500;
  o.queries = 300;
  o.max_tokens = 30;
  const Tree tree = random_forest(o);
  const Plan p = plan(tree, PlanOptions{Strategy::flatten, 100, kMaxQueryTile, 0});
  const PlanStats st = compute_stats(p);
  CHECK(st.plan_read_tokens == st.tokens);
  CHECK(st.block_tokens_max - st.block_tokens_min <= 1);
  CHECK(st.blocks == (st.tokens + 99) / 100);
}

TEST_CASE("node keeps blocks inside one node; cascade keeps blocks inside one level") {
  RandomForestOptions o;
  o.seed = 5;
  o.nodes = 120;
  o.queries = 80;
  const Tree tree = random_forest(o);
  const Plan node = plan(tree, PlanOptions{Strategy::node, 16, kMaxQueryTile, 0});
  for (std::int32_t b = 0; b < node.num_blocks(); ++b) {
    std::set<std::int32_t> nodes;
    for (std::int32_t s = node.block_segment_begin[std::size_t(b)]; s < node.block_segment_begin[std::size_t(b) + 1]; ++s) {
      nodes.insert(node.segment_node[std::size_t(s)]);
    }
    CHECK(nodes.size() == 1);
  }
  // Depth by node index, from the tree itself.
  std::vector<int> depth(tree.node_count(), 0);
  for (std::size_t i = 0; i < tree.node_count(); ++i) {
    const std::int64_t parent = tree.nodes()[i].parent;
    if (parent != kNoParent) depth[i] = depth[std::size_t(parent)] + 1;  // random_forest: id == index, parent < i
  }
  const Plan cascade = plan(tree, PlanOptions{Strategy::cascade, 64, kMaxQueryTile, 0});
  for (std::int32_t b = 0; b < cascade.num_blocks(); ++b) {
    std::set<int> levels;
    for (std::int32_t s = cascade.block_segment_begin[std::size_t(b)]; s < cascade.block_segment_begin[std::size_t(b) + 1]; ++s) {
      levels.insert(depth[std::size_t(cascade.segment_node[std::size_t(s)])]);
    }
    CHECK(levels.size() == 1);
  }
}

TEST_CASE("sequence reads every query's whole path alone; flatten reads the tree once") {
  const Tree tree = star(20, 4000, 400);  // few-shot: 20 branches under a 4000-token prompt
  const PlanStats seq = compute_stats(plan(tree, PlanOptions{Strategy::sequence, 256, kMaxQueryTile, 0}));
  const PlanStats flat = compute_stats(plan(tree));
  CHECK(seq.item_queries_max == 1);
  CHECK(seq.plan_read_tokens == 20 * 4400);
  CHECK(seq.sequence_read_tokens == 20 * 4400);
  CHECK(flat.plan_read_tokens == 4000 + 20 * 400);
  CHECK(flat.sequence_read_tokens == 20 * 4400);
}

TEST_CASE("a query's only contribution is written directly, never through a partial") {
  Tree tree({4, 2, 64});
  tree.add_node_range(0, kNoParent, 0, 10);
  tree.add_node_range(1, kNoParent, 10, 300);
  tree.add_query(0);  // 10 tokens: one work item
  tree.add_query(1);  // 300 tokens: 310 in all, cut into two blocks of 155
  const Plan p = plan(tree);
  CHECK(p.merge_begin == std::vector<std::int32_t>{0, 0, 2});
  CHECK(p.num_partials == 2);
  CHECK(std::count(p.tile_partial.begin(), p.tile_partial.end(), kDirect) == 1);
}

TEST_CASE("partials are numbered query by query, each query's in item order") {
  // merge_partial is then 0, 1, 2, ...: the CUDA merge addresses a query's
  // partials from merge_begin alone. The merge order (item order) is unchanged.
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    RandomForestOptions o;
    o.seed = seed;
    o.nodes = std::int32_t(5 + seed * 3);
    o.queries = std::int32_t(seed % 4 == 0 ? 90 : 12);
    const Tree tree = random_forest(o);
    for (Strategy strategy : all_strategies()) {
      CAPTURE(seed);
      CAPTURE(to_string(strategy));
      PlanOptions options;
      options.strategy = strategy;
      options.block_tokens = 64;
      const Plan p = plan(tree, options);
      REQUIRE(p.num_partials == std::int32_t(p.merge_partial.size()));
      for (std::size_t m = 0; m < p.merge_partial.size(); ++m) CHECK(p.merge_partial[m] == std::int32_t(m));
      // Each query's partial slots, walked in tile-entry (item) order, count up
      // from its merge_begin.
      std::vector<std::int32_t> next(p.merge_begin.begin(), p.merge_begin.end() - 1);
      for (std::size_t k = 0; k < p.tile_partial.size(); ++k) {
        if (p.tile_partial[k] == kDirect) continue;
        CHECK(p.tile_partial[k] == next[std::size_t(p.tile_query[k])]++);
      }
    }
  }
}

TEST_CASE("tokens no query can see are left out of the plan") {
  Tree tree({4, 2, 64});
  tree.add_node_range(0, kNoParent, 0, 8);
  tree.add_node_range(1, 0, 8, 8);   // a pruned branch: no query below it
  tree.add_node_range(2, 0, 16, 8);
  tree.add_query(2, 3);
  const Plan p = plan(tree);
  CHECK(p.num_tokens() == 11);
  CHECK(p.min_kv_slots == 19);
}

TEST_CASE("an empty query set gives an empty, valid plan") {
  Tree tree({4, 2, 64});
  tree.add_node_range(0, kNoParent, 0, 8);
  const Plan p = plan(tree);
  CHECK(p.num_items() == 0);
  CHECK_NOTHROW(validate(p));
}

TEST_CASE("item token maps give each item's tokens their slot and mask, padded to whole tiles") {
  RandomForestOptions o;
  o.seed = 17;
  o.nodes = 120;
  o.queries = 90;
  o.max_tokens = 150;
  o.upto_fraction = 0.3;
  const Tree tree = random_forest(o);
  for (Strategy s : {Strategy::flatten, Strategy::node, Strategy::greedy}) {
    CAPTURE(to_string(s));
    const Plan p = plan(tree, PlanOptions{s, 300, 5, 0});  // many items per block, blocks of several tiles
    const ItemTokenMap map = item_token_map(p, 64);
    REQUIRE(map.begin.size() == std::size_t(p.num_items()) + 1);
    REQUIRE(map.slot.size() == std::size_t(map.begin.back()));
    REQUIRE(map.mask.size() == map.slot.size());
    CHECK_THROWS_WITH_AS(item_token_map(p, 65), doctest::Contains("1 to 64"), Error);
    // The per-query words are the masks transposed tile by tile.
    REQUIRE(map.visible.size() == map.slot.size());
    for (std::size_t e = 0; e < map.slot.size(); ++e) {
      const std::size_t tile = e / 64, token = e % 64;
      for (std::size_t j = 0; j < 64; ++j) {
        if (((map.mask[e] >> j) & 1) != ((map.visible[tile * 64 + j] >> token) & 1)) {
          FAIL("visible word " << j << " of tile " << tile << " disagrees with token " << token << "'s mask");
        }
      }
    }
    for (std::int32_t i = 0; i < p.num_items(); ++i) {
      CAPTURE(i);
      const std::vector<ItemToken> expected = item_tokens(p, i);
      const std::int32_t ntok = std::int32_t(expected.size());
      CHECK(ntok == p.block_token_count(p.item_block[std::size_t(i)]));
      const std::int32_t m0 = map.begin[std::size_t(i)];
      CHECK(m0 % 64 == 0);
      CHECK(map.begin[std::size_t(i) + 1] - m0 == (ntok + 63) / 64 * 64);
      for (std::int32_t t = 0; t < map.begin[std::size_t(i) + 1] - m0; ++t) {
        const std::size_t e = std::size_t(m0 + t);
        if (t < ntok) {
          REQUIRE(map.slot[e] == expected[std::size_t(t)].slot);
          REQUIRE(map.mask[e] == expected[std::size_t(t)].mask);
        } else {
          REQUIRE(map.slot[e] == -1);
          REQUIRE(map.mask[e] == 0);
        }
      }
    }
  }
}

TEST_CASE("a tree of paged nodes plans exactly as the same tree with every slot listed") {
  // Nodes on pages of 16 tokens, some pages out of order and partly filled; the
  // same nodes as listed slots must give the very same plan, for every strategy.
  const std::int32_t page = 16;
  std::vector<std::vector<std::int64_t>> pages = {{7, 2, 11}, {4}, {9, 0}, {5}, {12, 3, 6}};
  std::vector<std::int32_t> last = {16, 5, 9, 1, 13};
  std::vector<std::int64_t> parent = {kNoParent, 0, 0, 2, 2};
  Tree paged({16, 4, 64}), listed({16, 4, 64});
  for (std::size_t n = 0; n < pages.size(); ++n) {
    paged.add_node_pages(std::int64_t(n), parent[n], pages[n], page, last[n]);
    std::vector<std::int64_t> slots;
    for (std::size_t p = 0; p < pages[n].size(); ++p) {
      const std::int32_t used = p + 1 < pages[n].size() ? page : last[n];
      for (std::int32_t t = 0; t < used; ++t) slots.push_back(pages[n][p] * page + t);
    }
    listed.add_node(std::int64_t(n), parent[n], slots);
  }
  for (Tree* t : {&paged, &listed}) {
    t->add_query(1);
    t->add_query(3);
    t->add_query(4, 20);
    t->add_query(2, 3);
  }
  for (Strategy s : all_strategies()) {
    for (std::int32_t block : {16, 48, kAutoBlockTokens}) {
      CAPTURE(to_string(s));
      CAPTURE(block);
      const PlanOptions options{s, block, kMaxQueryTile, 208};
      const Plan a = plan(paged, options), b = plan(listed, options);
      CHECK(a.token_slot == b.token_slot);
      CHECK(a.segment_token_begin == b.segment_token_begin);
      CHECK(a.block_segment_begin == b.block_segment_begin);
      CHECK(a.segment_mask == b.segment_mask);
      CHECK(a.tile_query == b.tile_query);
      CHECK(a.tile_partial == b.tile_partial);
      CHECK(a.merge_begin == b.merge_begin);
      CHECK(a.min_kv_slots == b.min_kv_slots);
    }
  }
}
