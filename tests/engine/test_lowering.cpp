// The lowering every backend's kernels read (engine/src/lowering.hpp), checked
// on the host against the plan read the slow way: for every strategy on random
// forests and the few-shot and speculative shapes, each item's rows are cut
// into passes once, in launch order, none longer than its tile rows or the
// kernel's; each item's block is tiled exactly, every token found in the right
// segment with the right mask; partials numbered in another order come out in
// merge order, and the CPU backend's output does not change; flatten's held
// layouts (blocks longer than block_tokens) lower the same way; the cost
// model counts the same passes; and the Vulkan encoder's records are the
// lowering's.

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "lowering.hpp"
#include "support/conformance.hpp"
#include "support/plan_check.hpp"
#include "support/workloads_dir.hpp"
#include "backend.hpp"
#include "treeattn/cost_model.hpp"
#include "treeattn/error.hpp"
#include "treeattn/incremental_planner.hpp"
#include "treeattn/kv_cache.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/scenarios.hpp"
#include "treeattn/sequence_tree.hpp"
#include "treeattn/workloads.hpp"
#if TREEATTN_TEST_HAVE_VULKAN
#include "../backends/vulkan/vk_plan.hpp"
#endif

using namespace treeattn;

namespace {

constexpr std::int32_t kKernelRows[] = {kSmallTileRows, kLargeTileRows};  // a scalar-shader cap, and none

template <typename... Parts>
std::string say(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

std::int32_t item_rows(const Plan& plan, std::int32_t item) {
  const std::size_t i = std::size_t(item);
  return (plan.item_query_begin[i + 1] - plan.item_query_begin[i]) * plan.heads.group_size();
}

std::string pass_error(const Plan& plan, std::int32_t max_pass_rows, const Lowering& l) {
  // Launch order, each item's rows [0, rows) once in row order, every pass
  // but an item's last as long as its tile rows (or the kernel's) allow.
  std::size_t p = 0;
  for (std::int32_t k = 0; k < plan.num_items(); ++k) {
    const std::int32_t item = plan.launch_item(k);
    const std::int32_t rows = item_rows(plan, item);
    const std::int32_t most = std::min(plan.item_tile_rows[std::size_t(item)], max_pass_rows);
    for (std::int32_t row = 0; row < rows; ++p) {
      if (p >= l.passes.size()) return say("the passes end before item ", item, "'s row ", row);
      const LoweredPass& pass = l.passes[p];
      if (pass.item != item || pass.row_begin != row) {
        return say("pass ", p, " is item ", pass.item, "'s from row ", pass.row_begin, ", expected item ", item,
                   "'s (launched ", k, "th) from row ", row);
      }
      if (pass.query_begin != plan.item_query_begin[std::size_t(item)]) {
        return say("pass ", p, " has query_begin ", pass.query_begin, ", item ", item, "'s is ",
                   plan.item_query_begin[std::size_t(item)]);
      }
      const std::int32_t length = pass.row_end - pass.row_begin;
      if (length <= 0 || length > most || pass.row_end > rows || (length < most && pass.row_end != rows)) {
        return say("pass ", p, " takes rows [", pass.row_begin, ", ", pass.row_end, ") of item ", item, "'s ", rows,
                   " at up to ", most, " a pass");
      }
      row = pass.row_end;
    }
  }
  if (p != l.passes.size()) return say(l.passes.size() - p, " passes past the last item's");
  // What a backend sizes its pass records by (the CUDA WorkspaceLimits).
  std::size_t counted = 0;
  for (std::int32_t item = 0; item < plan.num_items(); ++item) counted += std::size_t(item_passes(plan, item, max_pass_rows));
  if (counted != l.passes.size()) return say("item_passes() counts ", counted, " passes, the lowering has ", l.passes.size());
  return {};
}

std::string tile_error(const Plan& plan, const Lowering& l) {
  for (std::int32_t b = 0; b < plan.num_blocks(); ++b) {
    std::int32_t offset = 0;
    for (std::int32_t g = plan.block_segment_begin[std::size_t(b)]; g < plan.block_segment_begin[std::size_t(b) + 1]; ++g) {
      if (l.segment_offset[std::size_t(g)] != offset) {
        return say("segment ", g, " starts at ", l.segment_offset[std::size_t(g)], " of block ", b, ", expected ", offset);
      }
      offset += plan.segment_token_end[std::size_t(g)] - plan.segment_token_begin[std::size_t(g)];
    }
  }
  if (l.item_tile.size() != std::size_t(plan.num_items()) + 1 || l.item_tile.front() != 0 ||
      l.item_tile.back() != std::int32_t(l.tiles.size())) {
    return say("item_tile is not a CSR of ", plan.num_items(), " items over ", l.tiles.size(), " tiles");
  }
  for (std::int32_t item = 0; item < plan.num_items(); ++item) {
    const std::int32_t block = plan.item_block[std::size_t(item)];
    const std::int32_t first = plan.block_segment_begin[std::size_t(block)];
    const std::int32_t end = plan.block_segment_begin[std::size_t(block) + 1];
    const std::vector<test::ItemToken> tokens = test::item_tokens(plan, item);
    const std::int32_t n = std::int32_t(tokens.size());
    const std::int32_t tiles = l.item_tile[std::size_t(item) + 1] - l.item_tile[std::size_t(item)];
    // Tile j starts at token 64 j and there are ceil(n / 64): every token in exactly one tile.
    if (tiles != (n + kKvTileTokens - 1) / kKvTileTokens) return say("item ", item, " has ", tiles, " tiles for ", n, " tokens");
    for (std::int32_t j = 0; j < tiles; ++j) {
      const LoweredTile& tile = l.tiles[std::size_t(l.item_tile[std::size_t(item)] + j)];
      if (tile.first_token != j * kKvTileTokens || tile.block_tokens != n || tile.segment_end != end ||
          tile.segment_first < first || tile.segment_first >= end ||
          tile.mask_first != plan.item_mask_begin[std::size_t(item)] + tile.segment_first - first) {
        return say("item ", item, " tile ", j, ": first token ", tile.first_token, ", block tokens ", tile.block_tokens,
                   ", segments [", tile.segment_first, ", ", tile.segment_end, "), mask ", tile.mask_first);
      }
      // The tile's first segment holds its first token, so a tile's tokens
      // are in at most 64 segments from it (what a kernel loads of them).
      const std::int32_t holds = tile.first_token - l.segment_offset[std::size_t(tile.segment_first)];
      if (holds < 0 || holds >= plan.segment_token_end[std::size_t(tile.segment_first)] -
                                    plan.segment_token_begin[std::size_t(tile.segment_first)]) {
        return say("item ", item, " tile ", j, " names segment ", tile.segment_first, ", which does not hold its first token");
      }
      // Each token as a kernel finds it: the last of the tile's segments that starts at or before it.
      for (std::int32_t t = tile.first_token; t < std::min(n, tile.first_token + kKvTileTokens); ++t) {
        std::int32_t g = tile.segment_first;
        while (g + 1 < tile.segment_end && l.segment_offset[std::size_t(g) + 1] <= t) ++g;
        const std::int32_t at = t - l.segment_offset[std::size_t(g)];
        const std::int32_t length = plan.segment_token_end[std::size_t(g)] - plan.segment_token_begin[std::size_t(g)];
        if (at < 0 || at >= length) return say("item ", item, " token ", t, " is not in segment ", g, " of its tile ", j);
        const std::int32_t slot = plan.token_slot[std::size_t(plan.segment_token_begin[std::size_t(g)] + at)];
        const std::uint64_t mask = plan.segment_mask[std::size_t(tile.mask_first + g - tile.segment_first)];
        if (slot != tokens[std::size_t(t)].slot || mask != tokens[std::size_t(t)].mask) {
          return say("item ", item, " token ", t, ": slot ", slot, " mask ", mask, ", expected slot ",
                     tokens[std::size_t(t)].slot, " mask ", tokens[std::size_t(t)].mask);
        }
      }
    }
  }
  return {};
}

std::string partial_error(const Plan& plan, const Lowering& l) {
  // Lowered partial p is the p-th of merge_partial: with each partial used
  // once (validate), the numbering is 0, 1, 2, ... in the merge's CSR order.
  if (l.tile_partial.size() != plan.tile_partial.size()) return "tile_partial has another size than the plan's";
  for (std::size_t k = 0; k < plan.tile_partial.size(); ++k) {
    const std::int32_t p = l.tile_partial[k], expected = plan.tile_partial[k];
    if (expected == kDirect ? p != kDirect : p < 0 || p >= plan.num_partials || plan.merge_partial[std::size_t(p)] != expected) {
      return say("tile entry ", k, " has lowered partial ", p, " for the plan's ", expected);
    }
  }
  return {};
}

// Empty when `plan`, lowered for kernels of `max_pass_rows` rows a pass, lowers right.
std::string lowering_error(const Plan& plan, std::int32_t max_pass_rows) {
  const Lowering l = lower(plan, max_pass_rows);
  for (const std::string& error : {pass_error(plan, max_pass_rows, l), tile_error(plan, l), partial_error(plan, l)}) {
    if (!error.empty()) return error;
  }
  return {};
}

// `plan` launching its blocks in reverse (each block's items together, in item order).
Plan reversed_launch(Plan plan) {
  plan.launch_order.clear();
  for (std::int32_t b = plan.num_blocks() - 1; b >= 0; --b) {
    for (std::int32_t i = 0; i < plan.num_items(); ++i) {
      if (plan.item_block[std::size_t(i)] == b) plan.launch_order.push_back(i);
    }
  }
  validate(plan);
  return plan;
}

// `plan` with its partials numbered query by query in `query_order` (a
// permutation of the queries), merge_partial and tile_partial alike.
Plan renumbered(Plan plan, const std::vector<std::int32_t>& query_order) {
  std::vector<std::int32_t> slot(std::size_t(plan.num_partials));
  std::int32_t next = 0;
  for (std::int32_t q : query_order) {
    for (std::int32_t m = plan.merge_begin[std::size_t(q)]; m < plan.merge_begin[std::size_t(q) + 1]; ++m) {
      slot[std::size_t(plan.merge_partial[std::size_t(m)])] = next++;
    }
  }
  for (std::int32_t& p : plan.merge_partial) p = slot[std::size_t(p)];
  for (std::int32_t& p : plan.tile_partial) {
    if (p != kDirect) p = slot[std::size_t(p)];
  }
  validate(plan);
  return plan;
}

std::vector<std::int32_t> shuffled_queries(const Plan& plan, std::uint64_t seed) {
  std::vector<std::int32_t> order(std::size_t(plan.num_queries));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
  return order;
}

// The CostModel's passes (all KV heads) agree with the lowering's for kernels
// that take either tile, small ones (16 rows or fewer) on the small path.
void check_cost_model_passes(const Plan& plan) {
  const Lowering l = lower(plan, kLargeTileRows);
  std::int64_t small = 0;
  for (const LoweredPass& p : l.passes) small += p.row_end - p.row_begin <= kSmallTileRows;
  const CostEstimate e = estimate_cost(plan, cost_model_for("h100"));
  CHECK(e.small_passes == small * plan.heads.heads_kv);
  CHECK(e.large_passes == (std::int64_t(l.passes.size()) - small) * plan.heads.heads_kv);
  CHECK(compute_stats(plan).passes == std::int64_t(l.passes.size()));
}

// What every plan of these tests is checked for: its lowering for both
// kernels, in its launch order and in reverse block order.
void check_lowering(const Plan& plan) {
  for (std::int32_t rows : kKernelRows) {
    CAPTURE(rows);
    REQUIRE(lowering_error(plan, rows) == "");
    if (plan.num_blocks() > 1) REQUIRE(lowering_error(reversed_launch(plan), rows) == "");
  }
}

}  // namespace

TEST_CASE("lowering: every strategy's plans of random forests") {
  std::int64_t small_split = 0, capped = 0, launch_ordered = 0;
  for (Strategy s : all_strategies()) {
    for (std::uint64_t seed = 1; seed <= 6; ++seed) {
      for (std::int32_t group : {1, 4}) {
        RandomForestOptions forest;
        forest.seed = seed;
        forest.heads = HeadConfig{2 * group, 2, 64, 0.0f};
        forest.nodes = 50;
        forest.roots = 1 + std::int32_t(seed % 3);
        forest.queries = seed % 2 == 0 ? 90 : 20;  // 90: blocks with more than 64 queries
        const Tree tree = random_forest(forest);
        for (std::int32_t block_tokens : {40, 100, 256}) {
          for (std::int32_t query_tile : {kMaxQueryTile, 5}) {
            for (bool small_tiles : {false, true}) {
              CAPTURE(to_string(s));
              CAPTURE(seed);
              CAPTURE(group);
              CAPTURE(block_tokens);
              CAPTURE(query_tile);
              CAPTURE(small_tiles);
              PlanOptions options{s, block_tokens, query_tile, 0};
              if (small_tiles) options.cost.tile_ns_small = 1.0;  // small tiles for items of any rows
              const Plan plan = treeattn::plan(tree, options);
              check_lowering(plan);
              check_cost_model_passes(plan);
              launch_ordered += !plan.launch_order.empty();
              for (std::int32_t i = 0; i < plan.num_items(); ++i) {
                const std::int32_t rows = item_rows(plan, i);
                small_split += plan.item_tile_rows[std::size_t(i)] == kSmallTileRows && rows > kSmallTileRows;
                capped += plan.item_tile_rows[std::size_t(i)] == kLargeTileRows && rows > kSmallTileRows;
              }
            }
          }
        }
      }
    }
  }
  CHECK(small_split > 100);  // small tiles of several passes
  CHECK(capped > 100);       // large tiles a 16-row kernel cuts into several passes
  CHECK(launch_ordered > 0);
}

TEST_CASE("lowering: the few-shot and speculative shapes") {
  const HeadConfig heads{32, 8, 128, 0.0f};
  std::vector<std::pair<std::string, Tree>> trees = {
      {"few-shot b=20", few_shot_tree(heads, 4000, 20, 400)},
      {"few-shot b=50", few_shot_tree(heads, 4000, 50, 400)},
      {"speculative 32-token tree on 1161 tokens", level_tree(heads, {1, 4, 8}, {1161, 4, 2})},
  };
  // A Medusa token tree as decoding runs it: draft tokens on an accepted prefix.
  const MedusaWorkload w = load_medusa(test::workloads_dir() + "/speculative/APPS_tree_size64.json");
  auto scenario = speculative_scenario(w, 0, 600);
  PagedKvCache cache(16, 0);
  SequenceTree live(cache);
  std::vector<TreeQuery> queries;
  for (int step = 0; step < 3; ++step) scenario->advance(live, queries);
  trees.emplace_back("Medusa tree of 64 tokens, step 3", live.to_tree(heads, queries));
  for (const auto& [name, tree] : trees) {
    for (Strategy s : all_strategies()) {
      for (std::int32_t block_tokens : {256, kAutoBlockTokens}) {
        CAPTURE(name);
        CAPTURE(to_string(s));
        CAPTURE(block_tokens);
        const Plan plan = treeattn::plan(tree, PlanOptions{s, block_tokens});
        check_lowering(plan);
        check_cost_model_passes(plan);
      }
    }
  }
}

TEST_CASE("lowering: partials numbered in another order come out in merge order; the CPU backend's output is the same") {
  const Tree tree = test::determinism_forest();
  const Plan planned = treeattn::plan(tree, PlanOptions{Strategy::flatten, 32, kMaxQueryTile, 0});
  REQUIRE(planned.merge_in_order());
  std::vector<std::int32_t> reverse(std::size_t(planned.num_queries));
  std::iota(reverse.rbegin(), reverse.rend(), 0);
  auto backend = make_backend(BackendKind::cpu);
  test::Inputs in = test::make_inputs(tree, DType::f16, 5);
  const test::Outputs expected = test::run_plan(*backend, tree, in, planned);
  for (const std::vector<std::int32_t>& order : {reverse, shuffled_queries(planned, 1), shuffled_queries(planned, 2)}) {
    const Plan other = renumbered(planned, order);
    REQUIRE_FALSE(other.merge_in_order());
    check_lowering(other);
    // The planner numbers partials in merge order, so the lowering gives back its numbering.
    CHECK(lower(other, kLargeTileRows).tile_partial == planned.tile_partial);
    const test::Outputs got = test::run_plan(*backend, tree, in, other);
    CHECK(got.o.bytes == expected.o.bytes);
    CHECK(got.lse.bytes == expected.lse.bytes);
  }
  CHECK(lower(planned, kLargeTileRows).tile_partial == planned.tile_partial);
}

TEST_CASE("lowering: flatten's held layouts, blocks longer than block_tokens") {
  // A device of four CTA slots: the forests fill it, so held blocks may grow
  // past block_tokens (IncrementalOptions::hold_flatten_blocks).
  PlanOptions options{Strategy::flatten, 100};
  options.cost.slots = 4.0;
  options.cost.sms = 1.0;
  std::int64_t held = 0, longer = 0;
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    CAPTURE(seed);
    RandomForestOptions forest;
    forest.seed = seed;
    forest.nodes = 60;
    forest.roots = 3;
    forest.queries = 30;
    forest.max_tokens = 40;
    const Tree start = random_forest(forest);
    std::int64_t next_slot = total_tokens(start);
    IncrementalPlanner planner(start.heads, options);
    planner.add_tree(start);
    planner.update();
    std::mt19937_64 rng(seed);
    for (int step = 0; step < 30; ++step) {
      CAPTURE(step);
      for (int k = 0; k < 4; ++k) {
        const TreeNode& n = start.nodes()[rng() % start.node_count()];
        const std::int64_t count = 1 + std::int64_t(rng() % 6);
        planner.append_range(n.id, next_slot, count);
        next_slot += count;
      }
      const Plan& plan = planner.update();
      if (!planner.last_update().held_layout) continue;
      ++held;
      for (std::int32_t b = 0; b < plan.num_blocks(); ++b) longer += plan.block_token_count(b) > planner.block_tokens();
      check_lowering(plan);
    }
  }
  CHECK(held > 40);
  CHECK(longer > 40);
}

TEST_CASE("lowering: a kernel must take at least a small tile's rows a pass") {
  const Plan plan = treeattn::plan(test::determinism_forest(), PlanOptions{});
  CHECK_THROWS_WITH_AS(lower(plan, 8), doctest::Contains("a kernel of 8 rows a pass (expected at least a small tile's 16)"),
                       Error);
}

#if TREEATTN_TEST_HAVE_VULKAN
TEST_CASE("lowering: the Vulkan encoder's records and arrays are the lowering's") {
  using namespace treeattn::vulkan;
  const Tree tree = test::determinism_forest();
  const Plan planned = treeattn::plan(tree, PlanOptions{Strategy::flatten, 100, kMaxQueryTile, 0});
  const Plan other = reversed_launch(renumbered(planned, shuffled_queries(planned, 3)));
  for (const Plan* plan : {&planned, &other}) {
    for (std::int32_t rows : kKernelRows) {
      CAPTURE(rows);
      const Lowering l = lower(*plan, rows);
      const EncodedPlan e = encode_plan(*plan, l);
      const ItemTokenMap map = item_token_map(*plan, kKvTileTokens);
      REQUIRE(e.passes == l.passes.size());
      for (std::size_t p = 0; p < l.passes.size(); ++p) {
        const LoweredPass& pass = l.passes[p];
        const std::size_t item = std::size_t(pass.item);
        CHECK(l.item_tile[item] * kKvTileTokens == map.begin[item]);
        const std::vector<std::uint32_t> expected = {std::uint32_t(map.begin[item]),
                                                     std::uint32_t(plan->block_token_count(plan->item_block[item])),
                                                     std::uint32_t(pass.query_begin), std::uint32_t(pass.row_end),
                                                     std::uint32_t(pass.row_begin), 0, 0, 0};
        const std::vector<std::uint32_t> record(e.words.begin() + std::ptrdiff_t(p * kPassWords),
                                                e.words.begin() + std::ptrdiff_t((p + 1) * kPassWords));
        REQUIRE(record == expected);
      }
      // Each array from its offset to the next one's (the last to the end).
      auto array = [&](Array a) {
        const std::size_t end = a + 1 < kArrayCount ? e.offsets[a + 1] : e.words.size();
        return std::vector<std::uint32_t>(e.words.begin() + e.offsets[a], e.words.begin() + std::ptrdiff_t(end));
      };
      auto words = [](const auto& values) {
        std::vector<std::uint32_t> w(values.size() * sizeof(values[0]) / 4);
        std::memcpy(w.data(), values.data(), w.size() * 4);
        return w;
      };
      CHECK(e.offsets[kItemTokenSlot] == l.passes.size() * kPassWords);
      CHECK(array(kItemTokenSlot) == words(map.slot));
      CHECK(array(kTileVisible) == words(map.visible));
      CHECK(array(kTileQuery) == words(plan->tile_query));
      CHECK(array(kTilePartial) == words(l.tile_partial));
      CHECK(array(kMergeBegin) == words(plan->merge_begin));
    }
  }
}
#endif
