#include "support/plan_check.hpp"

#include <algorithm>
#include <sstream>
#include <vector>

#include <doctest/doctest.h>

#include "support/oracle.hpp"

namespace treeattn::test {

RandomForestOptions invariant_forest(std::uint64_t seed) {
  RandomForestOptions o;
  o.seed = seed;
  o.nodes = std::int32_t(1 + seed % 40);
  o.roots = std::min<std::int32_t>(o.nodes, std::int32_t(1 + seed % 3));
  o.queries = std::int32_t(seed % 7 == 0 ? 150 : 1 + seed % 30);
  o.max_tokens = std::int32_t(seed % 5 == 0 ? 300 : 40);
  o.min_tokens = seed % 4 == 0 ? 0 : 1;
  o.upto_fraction = 0.35;
  o.sparse_ids = seed % 2 == 0;
  return o;
}

std::string coverage_error(const Tree& tree, const Plan& plan, std::int32_t window) {
  const std::size_t nq = tree.query_count();
  if (std::size_t(plan.num_queries) != nq) return "num_queries differs from the tree";
  std::vector<std::vector<std::int64_t>> seen(nq);
  std::vector<std::uint8_t> token_read(std::size_t(plan.num_tokens()), 0);  // unmasked for some query
  for (std::int32_t i = 0; i < plan.num_items(); ++i) {
    const std::int32_t block = plan.item_block[std::size_t(i)];
    const std::int32_t s0 = plan.block_segment_begin[std::size_t(block)];
    const std::int32_t s1 = plan.block_segment_begin[std::size_t(block) + 1];
    const std::int32_t q0 = plan.item_query_begin[std::size_t(i)];
    const std::int32_t tile = plan.item_query_begin[std::size_t(i) + 1] - q0;
    for (std::int32_t s = s0; s < s1; ++s) {
      const std::uint64_t mask = plan.segment_mask[std::size_t(plan.item_mask_begin[std::size_t(i)] + s - s0)];
      for (std::int32_t j = 0; j < tile; ++j) {
        if (!(mask >> j & 1)) continue;
        const std::size_t q = std::size_t(plan.tile_query[std::size_t(q0 + j)]);
        for (std::int32_t t = plan.segment_token_begin[std::size_t(s)]; t < plan.segment_token_end[std::size_t(s)]; ++t) {
          seen[q].push_back(plan.token_slot[std::size_t(t)]);
          token_read[std::size_t(t)] = 1;
        }
      }
    }
  }
  for (std::int32_t s = 0; s < plan.num_segments(); ++s) {
    for (std::int32_t t = plan.segment_token_begin[std::size_t(s)]; t < plan.segment_token_end[std::size_t(s)]; ++t) {
      if (!token_read[std::size_t(t)]) {
        return "segment " + std::to_string(s) + " (node " + std::to_string(plan.segment_node[std::size_t(s)]) +
               ") holds token " + std::to_string(t) + " (slot " + std::to_string(plan.token_slot[std::size_t(t)]) +
               "), which no query sees";
      }
    }
  }
  for (std::size_t q = 0; q < nq; ++q) {
    std::vector<std::int64_t> expected = visible_slots(tree, q, window);
    std::sort(expected.begin(), expected.end());
    std::sort(seen[q].begin(), seen[q].end());
    if (seen[q] == expected) continue;
    std::ostringstream out;
    out << "query " << q << " (node " << tree.queries()[q].node << "): covers " << seen[q].size()
        << " (query, token) pairs, expected " << expected.size();
    const auto dup = std::adjacent_find(seen[q].begin(), seen[q].end());
    if (dup != seen[q].end()) out << "; slot " << *dup << " covered twice";
    std::vector<std::int64_t> missing, extra;
    std::set_difference(expected.begin(), expected.end(), seen[q].begin(), seen[q].end(), std::back_inserter(missing));
    std::set_difference(seen[q].begin(), seen[q].end(), expected.begin(), expected.end(), std::back_inserter(extra));
    if (!missing.empty()) out << "; slot " << missing.front() << " missing";
    if (!extra.empty()) out << "; slot " << extra.front() << " unmasked but invisible";
    return out.str();
  }
  return {};
}

void check_invariants(const Tree& tree, const PlanOptions& options) {
  const Plan plan = treeattn::plan(tree, options);
  INFO("strategy ", std::string(to_string(options.strategy)), ", block_tokens ", options.block_tokens, ", query_tile ",
       options.query_tile, ", window ", options.window, ", cost ", options.cost.to_string());
  CHECK_NOTHROW(validate(plan));
  CHECK(coverage_error(tree, plan, options.window) == "");
  // Greedy's blocks are as long as its model leaves them; the plan records the longest.
  std::int32_t longest = 0;
  for (std::int32_t b = 0; b < plan.num_blocks(); ++b) longest = std::max(longest, plan.block_token_count(b));
  // auto: one of the model's candidates, from auto_block_min to auto_block_max.
  const bool automatic = options.block_tokens == kAutoBlockTokens;
  const std::int32_t limit = automatic ? options.cost.auto_block_max : options.block_tokens;
  if (options.strategy != Strategy::greedy) {
    CHECK(longest <= limit);
    if (automatic) CHECK(plan.block_tokens >= options.cost.auto_block_min);
  } else if (longest > limit) {
    CHECK(plan.block_tokens == longest);
  }
  for (std::int32_t i = 0; i < plan.num_items(); ++i) {
    CHECK(plan.item_query_begin[std::size_t(i) + 1] - plan.item_query_begin[std::size_t(i)] <= options.query_tile);
  }
  CHECK(plan_difference(plan, treeattn::plan(tree, options)) == "");
}

std::vector<ItemToken> item_tokens(const Plan& plan, std::int32_t item) {
  const std::int32_t block = plan.item_block[std::size_t(item)], s0 = plan.block_segment_begin[std::size_t(block)];
  std::vector<ItemToken> tokens;
  for (std::int32_t s = s0; s < plan.block_segment_begin[std::size_t(block) + 1]; ++s) {
    const std::uint64_t mask = plan.segment_mask[std::size_t(plan.item_mask_begin[std::size_t(item)] + s - s0)];
    for (std::int32_t t = plan.segment_token_begin[std::size_t(s)]; t < plan.segment_token_end[std::size_t(s)]; ++t) {
      tokens.push_back({plan.token_slot[std::size_t(t)], mask});
    }
  }
  return tokens;
}

std::string plan_difference(const Plan& a, const Plan& b) {
#define TREEATTN_COMPARE(field) \
  if (!(a.field == b.field)) return #field;
  TREEATTN_COMPARE(num_queries)
  TREEATTN_COMPARE(strategy)
  TREEATTN_COMPARE(block_tokens)
  TREEATTN_COMPARE(query_tile)
  TREEATTN_COMPARE(min_kv_slots)
  TREEATTN_COMPARE(heads.scale)
  TREEATTN_COMPARE(token_slot)
  TREEATTN_COMPARE(segment_token_begin)
  TREEATTN_COMPARE(segment_token_end)
  TREEATTN_COMPARE(segment_node)
  TREEATTN_COMPARE(block_segment_begin)
  TREEATTN_COMPARE(item_block)
  TREEATTN_COMPARE(item_query_begin)
  TREEATTN_COMPARE(item_mask_begin)
  TREEATTN_COMPARE(item_tile_rows)
  TREEATTN_COMPARE(segment_mask)
  TREEATTN_COMPARE(tile_query)
  TREEATTN_COMPARE(tile_partial)
  TREEATTN_COMPARE(num_partials)
  TREEATTN_COMPARE(merge_begin)
  TREEATTN_COMPARE(merge_partial)
  TREEATTN_COMPARE(launch_order)
#undef TREEATTN_COMPARE
  return {};
}

}  // namespace treeattn::test
