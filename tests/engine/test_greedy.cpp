// The greedy (FastTree) strategy: its cost model on FastTree's worked cases,
// tile choice, concatenation, long-context splitting, the flatten fallback,
// the invariants of every strategy under extreme coefficients, and bad input.

#include <doctest/doctest.h>

#include <algorithm>

#include "support/plan_check.hpp"
#include "cost_model_internal.hpp"
#include "treeattn/error.hpp"
#include "treeattn/incremental_planner.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;

namespace {

// Greedy's own layout, never flatten's (switch_gain 0), with extra coefficients,
// packing small groups up to 256 tokens.
PlanOptions own_layout(const std::string& coefficients = "") {
  PlanOptions o;
  o.strategy = Strategy::greedy;
  o.block_tokens = 256;
  o.cost.set("switch_gain=0," + coefficients);
  return o;
}

// A long parent with two children holding `per_child` queries each (one per leaf).
Tree parent_with_two_children(std::int32_t per_child) {
  Tree tree({32, 32, 128});
  tree.add_node_range(0, kNoParent, 0, 4096);
  std::int64_t slot = 4096, id = 3;
  for (std::int64_t child : {1, 2}) {
    tree.add_node_range(child, 0, slot, 32);
    slot += 32;
    for (std::int32_t q = 0; q < per_child; ++q) {
      tree.add_node_range(id, child, slot++, 1);
      tree.add_query(id++);
    }
  }
  return tree;
}

}  // namespace

TEST_CASE("FastTree's worked cases: 8-query children stay apart, 128-query children take the parent's KV") {
  const CostModel model = cost_model_for("h100");
  // A 16-row tile (16 queries of one head each), two children under a 4096-token
  // parent held in one block, as FastTree's groups are (no long-context split).
  const auto decide = [&](std::int64_t per_child) {
    return prefer_concatenation(model, EdgeShape{4096, 2 * per_child, 32, per_child}, 32, 32, 8192, 16);
  };
  CHECK_FALSE(decide(8));   // one 16-row tile over the parent beats two half-empty ones
  CHECK(decide(128));       // the same tiles either way: concatenation only saves partials

  // The same decisions in whole plans: the parent's 4096 tokens are read once
  // (kept apart) or once per child (concatenated).
  for (const auto& [per_child, reads] : {std::pair{8, 1}, std::pair{128, 2}}) {
    CAPTURE(per_child);
    PlanOptions o = own_layout("split_solo_speedup=1");  // no long-context split
    o.query_tile = 16;
    o.block_tokens = 8192;
    const Tree tree = parent_with_two_children(per_child);
    const Plan p = plan(tree, o);
    std::int64_t parent_tokens_read = 0;  // node 0 is the parent (insertion order)
    for (std::int32_t s = 0; s < p.num_segments(); ++s) {
      if (p.segment_node[std::size_t(s)] == 0) {
        parent_tokens_read += p.segment_token_end[std::size_t(s)] - p.segment_token_begin[std::size_t(s)];
      }
    }
    CHECK(parent_tokens_read == reads * 4096);
    test::check_invariants(tree, o);
  }
}

TEST_CASE("each item gets the cheaper tile: small for a few rows, large for many") {
  const CostModel model = cost_model_for("h100");
  CHECK(choose_tile(model, 4, 256).rows == kSmallTileRows);
  CHECK(choose_tile(model, 64, 256).rows == kLargeTileRows);
  CHECK(choose_tile(model, 256, 256).passes == 4);
  CHECK(choose_tile(model, 8, 256).passes == 1);

  // A star under 32/32 heads: the leaves' items hold one row, the prefix's 64.
  const Tree tree = few_shot_tree({32, 32, 128}, 1024, 64, 300);
  const Plan p = plan(tree, PlanOptions{Strategy::node, 256, kMaxQueryTile, 0});
  for (std::int32_t i = 0; i < p.num_items(); ++i) {
    const std::int32_t queries = p.item_query_begin[std::size_t(i) + 1] - p.item_query_begin[std::size_t(i)];
    CHECK(p.item_tile_rows[std::size_t(i)] == (queries == 1 ? kSmallTileRows : kLargeTileRows));
  }
}

TEST_CASE("deep trees of short nodes: greedy concatenates and saves partials over flatten") {
  const Tree tree = level_tree({16, 1, 128}, {1, 2, 4, 8, 16, 32, 64, 128, 1024}, {16, 16, 16, 16, 16, 16, 16, 16, 16});
  PlanOptions flat;
  const Plan f = plan(tree, flat);
  PlanOptions greedy;
  greedy.strategy = Strategy::greedy;
  const Plan g = plan(tree, greedy);
  const PlanStats fs = compute_stats(f), gs = compute_stats(g);
  CHECK(gs.plan_read_tokens > gs.tokens);  // some ancestor KV is read by several groups
  CHECK(gs.partials < fs.partials);
  CHECK(estimate_cost(g, greedy.cost).time_us * greedy.cost.switch_gain <= estimate_cost(f, greedy.cost).time_us);
  test::check_invariants(tree, greedy);
}

TEST_CASE("a tree where the model sees no clear gain keeps flatten's layout") {
  const Tree tree = few_shot_tree({32, 8, 128}, 4000, 20, 200);
  PlanOptions flat;
  flat.block_tokens = 256;
  PlanOptions greedy = flat;
  greedy.strategy = Strategy::greedy;
  Plan g = plan(tree, greedy);
  CHECK(g.strategy == Strategy::greedy);
  g.strategy = Strategy::flatten;
  CHECK(test::plan_difference(g, plan(tree, flat)) == "");
}

TEST_CASE("long-context splitting fills the device, and only while it pays") {
  // Ten 400-token branches under a 4000-token prompt, one KV head: 16 blocks
  // of 250 prompt tokens cannot fill 396 CTA slots.
  const Tree tree = few_shot_tree({16, 1, 128}, 4000, 10, 400);
  const Plan split = plan(tree, own_layout());
  const PlanStats st = compute_stats(split);
  CHECK(st.blocks > 16 + 10 * 2);
  CHECK(st.block_tokens_min >= 64);

  // A device that one pass fills (one slot, no solo speedup) gains nothing from
  // it: every group stays one block, however long (the prompt's 4000 tokens).
  const Plan unsplit = plan(tree, own_layout("slots=1,solo_speedup=1,split_solo_speedup=1"));
  CHECK(compute_stats(unsplit).blocks == 1 + 10);
  CHECK(unsplit.block_tokens == 4000);

  // Never below min_split_tokens.
  const Plan floor = plan(tree, own_layout("min_split_tokens=200"));
  CHECK(compute_stats(floor).block_tokens_min >= 200);
}

TEST_CASE("one item per query, without partials, where the merge it saves decides") {
  // A peer shape with one KV head: 256 leaves of 32 tokens under four 256-token
  // nodes and an 8-token root. Its KV is 150 KB; on the H100 one item per
  // query (no merge kernel) ran 10.2 us a layer where greedy's own layout, with
  // 764 partials, ran 14.4. The model puts that layout 1.1 us ahead before the
  // merge it saves (merge_ns) is counted.
  const Tree tree = level_tree({16, 1, 128}, {1, 4, 256}, {8, 256, 32});
  PlanOptions greedy;
  greedy.strategy = Strategy::greedy;
  const Plan chosen = plan(tree, greedy);
  CHECK(chosen.strategy == Strategy::greedy);
  CHECK(chosen.num_partials == 0);
  CHECK(chosen.num_items() == 256);
  // Exactly the sequence layout in blocks as long as the longest path (296 tokens).
  PlanOptions sequence;
  sequence.strategy = Strategy::sequence;
  sequence.block_tokens = 8 + 256 + 32;
  Plan expected = plan(tree, sequence);
  expected.strategy = Strategy::greedy;
  CHECK(test::plan_difference(chosen, expected) == "");
  for (std::int32_t block_tokens : {256, 512}) {  // a fixed block size decides the same
    PlanOptions fixed = greedy;
    fixed.block_tokens = block_tokens;
    CHECK(test::plan_difference(plan(tree, fixed), expected) == "");
  }

  // Without the merge's costs the layout with partials stays; with switch_gain 0
  // greedy's own layout always does.
  for (const char* coefficients : {"merge_ns=0,fanin_ns=0", "switch_gain=0"}) {
    CAPTURE(coefficients);
    PlanOptions o = greedy;
    o.cost.set(coefficients);
    CHECK(plan(tree, o).num_partials > 0);
  }
  // A tree whose KV is large keeps its partials: few-shot's prompt is read once.
  CHECK(plan(few_shot_tree({32, 8, 128}, 4000, 50, 200), greedy).num_partials > 0);
}

TEST_CASE("greedy keeps every invariant under extreme coefficients") {
  const char* extremes[] = {
      "partial_ns=0",                        // never concatenate
      "partial_ns=1e9",                      // always concatenate
      "pass_ns=0,tile_ns_small=1e6",         // large tiles only
      "tile_ns_large=1e6",                   // small tiles only
      "slots=1e6,split_solo_speedup=1e3",    // split down to min_split_tokens
  };
  for (std::uint64_t seed = 1; seed <= 25; ++seed) {
    RandomForestOptions r;
    r.seed = seed;
    r.nodes = std::int32_t(1 + seed * 3 % 50);
    r.roots = std::min<std::int32_t>(r.nodes, std::int32_t(1 + seed % 3));
    r.queries = std::int32_t(seed % 5 == 0 ? 150 : 1 + seed % 30);
    r.max_tokens = std::int32_t(seed % 4 == 0 ? 600 : 40);
    r.min_tokens = seed % 3 == 0 ? 0 : 1;
    r.upto_fraction = 0.35;
    r.heads = {seed % 2 ? 32 : 16, seed % 2 ? 8 : 1, 128, 0.0f};
    const Tree tree = random_forest(r);
    CAPTURE(seed);
    for (const char* extreme : extremes) {
      for (std::int32_t block_tokens : {7, 64, 256}) {
        PlanOptions o = own_layout(extreme);
        o.block_tokens = block_tokens;
        o.query_tile = seed % 4 == 0 ? 5 : kMaxQueryTile;
        test::check_invariants(tree, o);
      }
    }
  }
}

TEST_CASE("cost-model coefficients: set, print, and precise errors") {
  CostModel m = cost_model_for("h100");
  m.set("pass_ns=100, tile_ns_small=7");
  CHECK(m.pass_ns == 100.0);
  CHECK(m.tile_ns_small == 7.0);
  CostModel copy = cost_model_for("h100");
  copy.set(m.to_string());
  CHECK(copy.to_string() == m.to_string());
  CHECK_THROWS_WITH_AS(m.set("pass=1"), doctest::Contains("unknown coefficient 'pass'"), Error);
  CHECK_THROWS_WITH_AS(m.set("partial_ns=-1"), doctest::Contains("partial_ns = '-1'"), Error);
  CHECK_THROWS_WITH_AS(m.set("slots=0"), doctest::Contains("slots must be positive"), Error);
  CHECK_THROWS_WITH_AS(m.set("sms=0"), doctest::Contains("sms must be positive"), Error);
  CHECK_THROWS_WITH_AS(m.set("split_solo_speedup=0"), doctest::Contains("split_solo_speedup must be positive"), Error);
  CHECK_THROWS_WITH_AS(m.set("tile_ns_large"), doctest::Contains("not KEY=VALUE"), Error);
  CHECK_THROWS_WITH_AS(m.set("min_split_tokens=0.5"), doctest::Contains("is not an integer in [1, 65536]"), Error);
}

// fp8 K and V (PlanOptions::kv_dtype) plan with the model's fp8 terms: the
// plan is the f16 one under CostModel::for_kv's coefficients, bit for bit,
// from scratch and from an IncrementalPlanner. On decode-only trees the terms
// move auto's block size: an fp8 split-KV pass, bound by its instructions,
// gains less from an SM of its own, so fp8 fills the SMs with shorter blocks.
TEST_CASE("fp8 K and V plan with the cost model's fp8 terms") {
  CostModel m = cost_model_for("h100");
  const CostModel fp8 = m.for_kv(DType::fp8_e4m3);
  CHECK(fp8.tile_ns_small == m.tile_ns_small * m.fp8_small_tile_factor);
  CHECK(fp8.solo_speedup == m.fp8_solo_speedup);
  CHECK(fp8.tile_ns_large == m.tile_ns_large);
  CHECK(fp8.to_string() != m.to_string());
  CHECK(m.for_kv(DType::fp8_e5m2).to_string() == fp8.to_string());
  for (const DType plain : {DType::f16, DType::bf16, DType::f32}) CHECK(m.for_kv(plain).to_string() == m.to_string());
  const CostModel vulkan = cost_model_for("h100-vulkan");
  CHECK(vulkan.for_kv(DType::fp8_e4m3).to_string() == vulkan.to_string());  // the shaders plan fp8 as f16
  CostModel keep_solo = m;
  keep_solo.set("fp8_solo_speedup=0");
  CHECK(keep_solo.for_kv(DType::fp8_e4m3).solo_speedup == m.solo_speedup);
  CHECK_THROWS_WITH_AS(keep_solo.set("fp8_small_tile_factor=0"), doctest::Contains("fp8_small_tile_factor must be positive"),
                       Error);

  // 50 requests decoding 1000 tokens each off a 16-token root, Llama 3 8B's heads.
  Tree tree({32, 8, 128});
  tree.add_node_range(0, kNoParent, 0, 16);
  for (std::int64_t b = 1; b <= 50; ++b) {
    tree.add_node_range(b, 0, 16 + (b - 1) * 1000, 1000);
    tree.add_query(b);
  }
  for (const Strategy strategy : {Strategy::flatten, Strategy::greedy}) {
    const std::string strategy_name = to_string(strategy);
    CAPTURE(strategy_name);
    PlanOptions f16;
    f16.strategy = strategy;
    PlanOptions as_fp8 = f16, by_terms = f16;
    as_fp8.kv_dtype = DType::fp8_e4m3;
    by_terms.cost = f16.cost.for_kv(DType::fp8_e4m3);
    const Plan planned = plan(tree, as_fp8);
    CHECK(test::plan_difference(planned, plan(tree, by_terms)) == "");
    CHECK(planned.block_tokens < plan(tree, f16).block_tokens);
    // Decode steps: an fp8 planner's updates, those that hold the last layout
    // included, are the updates of one planning with the terms in place.
    IncrementalPlanner planner(tree.heads, as_fp8), with_terms(tree.heads, by_terms);
    std::vector<TreeQuery> queries;
    for (IncrementalPlanner* p : {&planner, &with_terms}) {
      p->add_node_range(0, kNoParent, 0, 16);
      for (std::int64_t b = 1; b <= 50; ++b) {
        p->add_node_range(b, 0, 16 + (b - 1) * 1000, 1000);
        if (p == &planner) queries.push_back({b});
      }
      p->set_queries(queries);
    }
    CHECK(test::plan_difference(planner.update(), planned) == "");
    CHECK(test::plan_difference(with_terms.update(), planned) == "");
    // What the held paths plan with: the fp8 terms, once.
    CHECK(planner.held_options().cost.to_string() == by_terms.cost.to_string());
    CHECK(planner.held_options().kv_dtype == DType::f16);
    std::int32_t held = 0;
    for (std::int64_t step = 0; step < 300; ++step) {
      for (IncrementalPlanner* p : {&planner, &with_terms}) {
        for (std::int64_t b = 1; b <= 50; ++b) p->append_range(b, 50016 + step * 50 + b, 1);
      }
      const Plan& got = planner.update();
      CHECK(test::plan_difference(got, with_terms.update()) == "");
      held += planner.last_update().held_layout ? 1 : 0;
    }
    if (strategy == Strategy::flatten) CHECK(held > 0);  // flatten's blocks held over appends
  }
}

TEST_CASE("the step time places CTAs on the SMs in launch order, as the hardware does") {
  CostModel m;
  m.set("sms=4,slots=12,solo_speedup=2");  // three CTAs an SM; alone 2x, two 1.5x, three 1x their full-SM pace
  auto step = [&](std::vector<double> ctas) { return simulate_step_ns(m, ctas); };
  CHECK(step({}) == 0.0);
  CHECK(step({100}) == doctest::Approx(50));                     // alone on its SM
  CHECK(step(std::vector<double>(4, 100)) == doctest::Approx(50));  // one on every SM
  CHECK(step(std::vector<double>(8, 100)) == doctest::Approx(100 / 1.5));
  // One CTA more than two an SM: that SM runs three at the full-SM pace while
  // the others are done, the imbalance the simulation exists to see.
  CHECK(step(std::vector<double>(9, 100)) == doctest::Approx(100));
  CHECK(step(std::vector<double>(12, 100)) == doctest::Approx(100));
  CHECK(step(std::vector<double>(24, 100)) == doctest::Approx(200));  // two full waves
  // Slots freed together are refilled one CTA per SM a round, as at launch:
  // after a full wave of equal CTAs the last four run alone, one on every SM,
  // not three together on SM 0 (which would take 100 more).
  CHECK(step(std::vector<double>(16, 100)) == doctest::Approx(100 + 100 / 2.0));
  m.set("refill_spread=0");  // each freed SM's slots in turn: three of the four on SM 0
  CHECK(step(std::vector<double>(16, 100)) == doctest::Approx(200));
  m.set("refill_spread=1");
  // Round-robin placement: SM 0 gets CTAs 0 and 4 (100 and 50). The 50 is done
  // at 50 / 1.5; the 100's last 50 then runs alone at twice the pace.
  CHECK(step({100, 10, 10, 10, 50}) == doctest::Approx(50 / 1.5 + 50 / 2.0));
  // A freed slot takes the next CTA: with one slot an SM, eight CTAs on four SMs run in two rounds.
  m.set("slots=4");
  CHECK(step(std::vector<double>(8, 100)) == doctest::Approx(2 * 100 / 2.0));
  // The plan-level estimate is the simulation over the plan's CTAs plus the partials.
  const Tree tree = few_shot_tree({32, 8, 128}, 4000, 50, 200);
  PlanOptions o;
  o.block_tokens = 1024;
  const Plan p = plan(tree, o);
  const CostEstimate e = estimate_cost(p, o.cost);
  CHECK(e.large_passes + e.small_passes > 0);
  const double partials_us = double(e.partial_rows) * o.cost.partial_ns / o.cost.slots / 1000.0;
  CHECK(e.time_us > partials_us);
  CHECK(e.time_us >= (e.max_pass_ns / o.cost.solo_speedup) / 1000.0 + partials_us - 1e-9);
}

TEST_CASE("no placement beats the step's lower bound, and the bound is tight where it should be") {
  // The planner skips placing candidates whose bound already loses, so the
  // bound must hold for every CTA list: random lists under several devices.
  Rng rng(7);
  for (const char* device : {"sms=132,slots=396,solo_speedup=1.75", "sms=4,slots=12,solo_speedup=2",
                             "sms=4,slots=12,solo_speedup=3", "sms=1,slots=2,solo_speedup=1.5",
                             "sms=8,slots=8,solo_speedup=1.2", "sms=3,slots=9,solo_speedup=0.8"}) {
    CostModel m;
    m.set(device);
    CAPTURE(device);
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<double> ctas(std::size_t(rng.uniform(1, 900)));
      const bool equal = trial % 4 == 0;
      for (double& ns : ctas) ns = equal ? 3000.0 : double(rng.uniform(100, 20000));
      CHECK(step_lower_bound_ns(m, ctas) <= simulate_step_ns(m, ctas) * (1.0 + 1e-12));
    }
  }
  CostModel m;
  m.set("sms=4,slots=12,solo_speedup=2");
  CHECK(step_lower_bound_ns(m, {}) == 0.0);
  CHECK(step_lower_bound_ns(m, {100}) == doctest::Approx(simulate_step_ns(m, {100})));  // alone: its best pace
  CHECK(step_lower_bound_ns(m, std::vector<double>(24, 100)) == doctest::Approx(200));  // full waves: the SMs' throughput
}

TEST_CASE("a given candidate is greedy's layout; the model's choice is one of the three, bit for bit") {
  const HeadConfig heads{32, 8, 128, 0.0f};
  std::vector<Tree> trees = {few_shot_tree(heads, 2000, 20, 40), level_tree(heads, {1, 4, 16}, {512, 64, 16})};
  RandomForestOptions r;
  r.heads = heads;
  r.nodes = 60;
  r.queries = 30;
  trees.push_back(random_forest(r));
  for (const Tree& tree : trees) {
    for (std::int32_t block : {64, 256}) {
      CAPTURE(block);
      PlanOptions options{Strategy::greedy, block};
      std::vector<Plan> given;
      for (GreedyCandidate c : {GreedyCandidate::own, GreedyCandidate::flatten, GreedyCandidate::one_item_per_query}) {
        options.greedy_candidate = c;
        given.push_back(plan(tree, options));
        CHECK(test::coverage_error(tree, given.back()) == "");
      }
      // Flatten's layout as the flatten strategy builds it.
      Plan flat = plan(tree, PlanOptions{Strategy::flatten, block});
      flat.strategy = Strategy::greedy;
      CHECK(test::plan_difference(given[1], flat) == "");
      // One item per query: no partials, every query written by one item.
      CHECK(given[2].num_partials == 0);
      CHECK(given[2].num_items() == std::int32_t(tree.query_count()));
      options.greedy_candidate = GreedyCandidate::model;
      const Plan chosen = plan(tree, options);
      CHECK(std::any_of(given.begin(), given.end(), [&](const Plan& p) { return test::plan_difference(chosen, p).empty(); }));
    }
  }
}
