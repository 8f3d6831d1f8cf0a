#include "held_blocks.hpp"

#include <algorithm>
#include <cmath>

#include "cost_model_internal.hpp"

namespace treeattn {

bool grow_held_blocks(Plan& plan, const std::vector<VisibleGrowth::Tail>& tails, std::int32_t limit,
                      const CostModel& model, std::vector<HeldBlock>& grown) {
  grown.clear();
  std::int32_t* const begin = plan.segment_token_begin.data();
  std::int32_t* const end = plan.segment_token_end.data();
  const std::int32_t* const block_begin = plan.block_segment_begin.data();
  const std::int32_t segments = plan.num_segments();
  // One pass in token order: a segment moves by the tokens appended before
  // it, and the one that ends where a grown node's tokens ended (its last
  // piece's last segment) takes the new ones.
  std::int32_t by = 0, s = 0, block = 0;
  for (const VisibleGrowth::Tail& tail : tails) {
    for (; s < segments && end[s] < tail.old_end; ++s) {
      begin[s] += by;
      end[s] += by;
    }
    if (s == segments || end[s] != tail.old_end) return false;  // not a layout of these pieces
    begin[s] += by;
    by += tail.added;
    end[s] += by;
    while (block_begin[block + 1] <= s) ++block;
    if (grown.empty() || grown.back().block != block) grown.push_back(HeldBlock{block, 0});
    ++s;
  }
  for (; s < segments; ++s) {
    begin[s] += by;
    end[s] += by;
  }

  std::int32_t longest = plan.block_tokens;
  for (HeldBlock& b : grown) {
    b.tokens = plan.block_token_count(b.block);
    if (b.tokens > limit) return false;
    longest = std::max(longest, b.tokens);
  }
  plan.block_tokens = longest;
  // A grown block's items choose their tile rows again, as PlanBuilder does.
  std::size_t g = 0;
  for (std::int32_t i = 0; i < plan.num_items() && g < grown.size(); ++i) {
    const std::int32_t b = plan.item_block[std::size_t(i)];
    while (g < grown.size() && grown[g].block < b) ++g;
    if (g == grown.size() || grown[g].block != b) continue;
    const std::int32_t queries = plan.item_query_begin[std::size_t(i) + 1] - plan.item_query_begin[std::size_t(i)];
    plan.item_tile_rows[std::size_t(i)] =
        choose_tile(model, std::int64_t(queries) * plan.heads.group_size(), grown[g].tokens).rows;
  }
  return true;
}

std::int32_t held_block_limit(const Plan& plan, const CostModel& model, std::int32_t block_tokens, double drift) {
  double total_ns = 0.0, longest_ns = 0.0;
  for (std::int32_t i = 0; i < plan.num_items(); ++i) {
    const std::int32_t queries = plan.item_query_begin[std::size_t(i) + 1] - plan.item_query_begin[std::size_t(i)];
    const TileChoice tile = choose_tile(model, std::int64_t(queries) * plan.heads.group_size(),
                                        plan.block_token_count(plan.item_block[std::size_t(i)]));
    total_ns += tile.cost_ns * plan.heads.heads_kv;
    longest_ns = std::max(longest_ns, tile.max_pass_ns);
  }
  if (total_ns / model.slots < (1.0 + drift) * longest_ns / model.solo_speedup) return block_tokens;
  return std::int32_t(std::min<double>(kMaxBlockTokens, std::floor(double(block_tokens) * (1.0 + drift))));
}

}  // namespace treeattn
