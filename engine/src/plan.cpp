#include "treeattn/plan.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "fail.hpp"
#include "lowering.hpp"

namespace treeattn {

const char* to_string(Strategy s) noexcept {
  switch (s) {
    case Strategy::flatten: return "flatten";
    case Strategy::node: return "node";
    case Strategy::node_chunk: return "node_chunk";
    case Strategy::sequence: return "sequence";
    case Strategy::cascade: return "cascade";
    case Strategy::greedy: return "greedy";
  }
  return "?";
}

const std::vector<Strategy>& all_strategies() noexcept {
  static const std::vector<Strategy> strategies = {Strategy::flatten, Strategy::node,
                                                   Strategy::node_chunk, Strategy::sequence,
                                                   Strategy::cascade, Strategy::greedy};
  return strategies;
}

Strategy parse_strategy(const std::string& name) {
  for (Strategy s : all_strategies()) {
    if (name == to_string(s)) return s;
  }
  fail(ErrorCategory::InvalidArgument,
       "unknown strategy '{}' (choose flatten, node, node_chunk, sequence, cascade or greedy)", name);
}

std::uint64_t new_plan_id() noexcept {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

std::int32_t Plan::block_token_count(std::int32_t block) const noexcept {
  std::int32_t tokens = 0;
  for (std::int32_t s = block_segment_begin[std::size_t(block)];
       s < block_segment_begin[std::size_t(block) + 1]; ++s) {
    tokens += segment_token_end[std::size_t(s)] - segment_token_begin[std::size_t(s)];
  }
  return tokens;
}

std::int32_t Plan::max_merge_fanin() const noexcept {
  std::int32_t most = 0;
  for (std::size_t q = 0; q + 1 < merge_begin.size(); ++q) most = std::max(most, merge_begin[q + 1] - merge_begin[q]);
  return most;
}

bool Plan::merge_in_order() const noexcept {
  for (std::size_t i = 0; i < merge_partial.size(); ++i) {
    if (merge_partial[i] != std::int32_t(i)) return false;
  }
  return true;
}

namespace {

// Bit k of a[j] moves to bit j of a[k]: a 64 x 64 bit matrix transposed in
// six rounds of block swaps (32 x 32 blocks, then 16 x 16, ... 1 x 1), 192 word
// operations where a loop over the set bits takes up to 4096 per tile.
void transpose_bits(std::uint64_t (&a)[64]) {
  std::uint64_t low = 0x00000000FFFFFFFFull;  // the low half of each 2j-bit block
  for (int j = 32; j != 0; j >>= 1, low ^= low << j) {
    for (int k = 0; k < 64; k = ((k | j) + 1) & ~j) {  // rows k with bit j clear
      const std::uint64_t swap = ((a[k] >> j) ^ a[k | j]) & low;
      a[k] ^= swap << j;
      a[k | j] ^= swap;
    }
  }
}

}  // namespace

ItemTokenMap item_token_map(const Plan& plan, std::int32_t align) {
  if (align < 1 || align > 64) {
    fail(ErrorCategory::InvalidArgument, "item_token_map: tiles of {} tokens; a tile holds 1 to 64 (one mask bit each)", align);
  }
  ItemTokenMap map;
  std::size_t tiles = 0;
  for (std::int32_t i = 0; i < plan.num_items(); ++i) {
    tiles += std::size_t((plan.block_token_count(plan.item_block[std::size_t(i)]) + align - 1) / align);
  }
  map.slot.resize(tiles * std::size_t(align));
  map.mask.resize(tiles * std::size_t(align));
  map.visible.resize(tiles * 64);
  map.begin.assign(1, 0);
  map.begin.reserve(std::size_t(plan.num_items()) + 1);
  std::size_t tile = 0;
  std::int32_t filled = 0;       // tokens in the open tile
  std::uint64_t words[64] = {};  // the open tile's masks, token by token
  // The open tile's runs of one mask: most tiles are a few runs (a long
  // segment, a node's few pieces), whose visible words are each mask's set
  // bits times the run's token bits, cheaper than the transpose below `kSetBitsForTranspose`.
  constexpr int kSetBitsForTranspose = 192;
  struct Run {
    std::uint64_t mask, tokens;
  };
  Run runs[64];
  int run_count = 0, set_bits = 0;
  auto close_tile = [&] {
    std::fill(map.slot.begin() + std::ptrdiff_t(tile * std::size_t(align) + std::size_t(filled)),
              map.slot.begin() + std::ptrdiff_t((tile + 1) * std::size_t(align)), -1);
    std::fill(words + filled, words + 64, 0);
    std::copy_n(words, align, map.mask.begin() + std::ptrdiff_t(tile * std::size_t(align)));
    std::uint64_t* visible = map.visible.data() + tile * 64;
    if (set_bits < kSetBitsForTranspose) {
      for (int r = 0; r < run_count; ++r) {
        for (std::uint64_t m = runs[r].mask; m != 0; m &= m - 1) visible[__builtin_ctzll(m)] |= runs[r].tokens;
      }
    } else {
      transpose_bits(words);
      std::copy_n(words, 64, visible);
    }
    ++tile;
    filled = 0;
    run_count = set_bits = 0;
  };
  for (std::int32_t i = 0; i < plan.num_items(); ++i) {
    const std::int32_t b = plan.item_block[std::size_t(i)];
    const std::int32_t s0 = plan.block_segment_begin[std::size_t(b)];
    for (std::int32_t s = s0; s < plan.block_segment_begin[std::size_t(b) + 1]; ++s) {
      const std::uint64_t mask = plan.segment_mask[std::size_t(plan.item_mask_begin[std::size_t(i)] + s - s0)];
      // The segment's tokens in runs that fill the open tile.
      for (std::int32_t t = plan.segment_token_begin[std::size_t(s)]; t < plan.segment_token_end[std::size_t(s)];) {
        const std::int32_t run = std::min(plan.segment_token_end[std::size_t(s)] - t, align - filled);
        std::copy_n(plan.token_slot.begin() + t, run,
                    map.slot.begin() + std::ptrdiff_t(tile * std::size_t(align) + std::size_t(filled)));
        std::fill_n(words + filled, run, mask);
        const std::uint64_t bits = run == 64 ? ~std::uint64_t(0) : ((std::uint64_t(1) << run) - 1) << filled;
        if (run_count > 0 && runs[run_count - 1].mask == mask) {
          runs[run_count - 1].tokens |= bits;
        } else {
          runs[run_count++] = Run{mask, bits};
          set_bits += __builtin_popcountll(mask);
        }
        filled += run;
        t += run;
        if (filled == align) close_tile();
      }
    }
    if (filled > 0) close_tile();
    map.begin.push_back(std::int32_t(tile) * align);
  }
  return map;
}

namespace {

void expect_size(const char* name, std::size_t got, std::size_t expected) {
  if (got != expected) {
    fail(ErrorCategory::InvalidPlan, "plan: {} has {} entries, expected {}", name, got, expected);
  }
}

void expect_csr(const char* name, const std::vector<std::int32_t>& begin, std::size_t total) {
  if (begin.empty() || begin.front() != 0 || std::size_t(begin.back()) != total) {
    fail(ErrorCategory::InvalidPlan, "plan: {} must run from 0 to {}", name, total);
  }
  for (std::size_t i = 0; i + 1 < begin.size(); ++i) {
    if (begin[i] > begin[i + 1]) {
      fail(ErrorCategory::InvalidPlan, "plan: {}[{}] = {} > {}[{}] = {}", name, i, begin[i], name,
           i + 1, begin[i + 1]);
    }
  }
}

}  // namespace

void validate(const Plan& plan) {
  const std::size_t nq = std::size_t(plan.num_queries);
  if (plan.query_tile < 1 || plan.query_tile > kMaxQueryTile) {
    fail(ErrorCategory::InvalidPlan, "plan: query_tile = {} is outside [1, {}]", plan.query_tile, kMaxQueryTile);
  }
  if (plan.block_tokens < 1) fail(ErrorCategory::InvalidPlan, "plan: block_tokens = {} < 1", plan.block_tokens);
  if (plan.num_queries < 0 || plan.num_partials < 0) {
    fail(ErrorCategory::InvalidPlan, "plan: num_queries = {}, num_partials = {}: counts must not be negative",
         plan.num_queries, plan.num_partials);
  }
  for (std::size_t t = 0; t < plan.token_slot.size(); ++t) {
    if (plan.token_slot[t] < 0 || plan.token_slot[t] >= plan.min_kv_slots) {
      fail(ErrorCategory::InvalidPlan, "plan: token_slot[{}] = {} is outside [0, min_kv_slots = {})", t,
           plan.token_slot[t], plan.min_kv_slots);
    }
  }

  const std::size_t segments = plan.segment_token_begin.size();
  expect_size("segment_token_end", plan.segment_token_end.size(), segments);
  expect_size("segment_node", plan.segment_node.size(), segments);
  for (std::size_t s = 0; s < segments; ++s) {
    const std::int32_t b = plan.segment_token_begin[s], e = plan.segment_token_end[s];
    if (b < 0 || b >= e || e > plan.num_tokens()) {
      fail(ErrorCategory::InvalidPlan, "plan: segment {} covers tokens [{}, {}) outside [0, {}) or empty",
           s, b, e, plan.num_tokens());
    }
  }
  expect_csr("block_segment_begin", plan.block_segment_begin, segments);
  const std::int32_t blocks = plan.num_blocks();
  for (std::int32_t b = 0; b < blocks; ++b) {
    if (plan.block_segment_begin[std::size_t(b)] == plan.block_segment_begin[std::size_t(b) + 1]) {
      fail(ErrorCategory::InvalidPlan, "plan: block {} has no segment", b);
    }
    if (plan.block_token_count(b) > plan.block_tokens) {
      fail(ErrorCategory::InvalidPlan, "plan: block {} holds {} tokens > block_tokens = {}", b,
           plan.block_token_count(b), plan.block_tokens);
    }
  }

  const std::size_t items = plan.item_block.size();
  expect_size("item_mask_begin", plan.item_mask_begin.size(), items);
  expect_size("item_tile_rows", plan.item_tile_rows.size(), items);
  expect_size("item_query_begin", plan.item_query_begin.size(), items + 1);
  expect_csr("item_query_begin", plan.item_query_begin, plan.tile_query.size());
  expect_size("tile_partial", plan.tile_partial.size(), plan.tile_query.size());
  std::size_t masks = 0;
  for (std::size_t i = 0; i < items; ++i) {
    const std::int32_t block = plan.item_block[i];
    if (block < 0 || block >= blocks) {
      fail(ErrorCategory::InvalidPlan, "plan: item {} names block {} outside [0, {})", i, block, blocks);
    }
    if (i > 0 && block < plan.item_block[i - 1]) {
      fail(ErrorCategory::InvalidPlan, "plan: items of block {} are not adjacent (item {})", block, i);
    }
    const std::int32_t tile = plan.item_query_begin[i + 1] - plan.item_query_begin[i];
    if (tile < 1 || tile > plan.query_tile) {
      fail(ErrorCategory::InvalidPlan, "plan: item {} has {} queries, outside [1, query_tile = {}]", i,
           tile, plan.query_tile);
    }
    if (plan.item_tile_rows[i] != kLargeTileRows && plan.item_tile_rows[i] != kSmallTileRows) {
      fail(ErrorCategory::InvalidPlan, "plan: item {} has tile rows {} (expected {} or {})", i, plan.item_tile_rows[i],
           kLargeTileRows, kSmallTileRows);
    }
    if (std::size_t(plan.item_mask_begin[i]) != masks) {
      fail(ErrorCategory::InvalidPlan, "plan: item_mask_begin[{}] = {}, expected {}", i,
           plan.item_mask_begin[i], masks);
    }
    const std::uint64_t allowed = tile == 64 ? ~std::uint64_t(0) : (std::uint64_t(1) << tile) - 1;
    const std::int32_t segs = plan.block_segment_begin[std::size_t(block) + 1] -
                              plan.block_segment_begin[std::size_t(block)];
    if (masks + std::size_t(segs) > plan.segment_mask.size()) {
      fail(ErrorCategory::InvalidPlan, "plan: segment_mask ends inside item {}", i);
    }
    for (std::int32_t s = 0; s < segs; ++s) {
      if (plan.segment_mask[masks + std::size_t(s)] & ~allowed) {
        fail(ErrorCategory::InvalidPlan, "plan: item {} segment {} mask {:#x} sets bits beyond its {} queries",
             i, s, plan.segment_mask[masks + std::size_t(s)], tile);
      }
    }
    masks += std::size_t(segs);
    for (std::int32_t k = plan.item_query_begin[i]; k < plan.item_query_begin[i + 1]; ++k) {
      const std::int32_t q = plan.tile_query[std::size_t(k)];
      if (q < 0 || std::size_t(q) >= nq) {
        fail(ErrorCategory::InvalidPlan, "plan: item {} names query {} outside [0, {})", i, q, nq);
      }
    }
  }
  expect_size("segment_mask", plan.segment_mask.size(), masks);

  // Partials: each slot written by exactly one tile entry, and each query either
  // written directly by exactly one entry or merged from >= 2 partials listed
  // in ascending order.
  expect_size("merge_begin", plan.merge_begin.size(), nq + 1);
  expect_csr("merge_begin", plan.merge_begin, plan.merge_partial.size());
  expect_size("merge_partial", plan.merge_partial.size(), std::size_t(plan.num_partials));
  std::vector<std::int32_t> partial_query(plan.merge_partial.size(), -1);
  for (std::size_t q = 0; q < nq; ++q) {
    for (std::int32_t m = plan.merge_begin[q]; m < plan.merge_begin[q + 1]; ++m) {
      const std::int32_t p = plan.merge_partial[std::size_t(m)];
      if (p < 0 || p >= plan.num_partials || partial_query[std::size_t(p)] >= 0) {
        fail(ErrorCategory::InvalidPlan, "plan: query {} merges partial {} (outside [0, {}) or listed twice)",
             q, p, plan.num_partials);
      }
      if (m > plan.merge_begin[q] && p <= plan.merge_partial[std::size_t(m) - 1]) {
        fail(ErrorCategory::InvalidPlan, "plan: query {} merges its partials out of order", q);
      }
      partial_query[std::size_t(p)] = std::int32_t(q);
    }
  }
  std::vector<std::int32_t> direct(nq, 0);
  for (std::size_t k = 0; k < plan.tile_query.size(); ++k) {
    const std::int32_t q = plan.tile_query[k], p = plan.tile_partial[k];
    if (p == kDirect) {
      ++direct[std::size_t(q)];
    } else if (p < 0 || p >= plan.num_partials || partial_query[std::size_t(p)] != q) {
      fail(ErrorCategory::InvalidPlan, "plan: tile entry {} (query {}) writes partial {}, which query {} does not merge",
           k, q, p, q);
    } else {
      partial_query[std::size_t(p)] = -2;  // written
    }
  }
  for (std::size_t p = 0; p < partial_query.size(); ++p) {
    if (partial_query[p] != -2) fail(ErrorCategory::InvalidPlan, "plan: partial {} is never written", p);
  }
  for (std::size_t q = 0; q < nq; ++q) {
    const std::int32_t merged = plan.merge_begin[q + 1] - plan.merge_begin[q];
    if (!((direct[q] == 1 && merged == 0) || (direct[q] == 0 && merged >= 2))) {
      fail(ErrorCategory::InvalidPlan,
           "plan: query {} has {} direct writes and {} partials (expected 1 and 0, or 0 and >= 2)", q,
           direct[q], merged);
    }
  }

  // Launch order: every item once, a block's items together and in item order
  // (so an item after a block's first is the one after the previous entry).
  if (!plan.launch_order.empty()) {
    expect_size("launch_order", plan.launch_order.size(), items);
    std::vector<char> launched(items, 0);
    for (std::size_t k = 0; k < items; ++k) {
      const std::int32_t i = plan.launch_order[k];
      if (i < 0 || std::size_t(i) >= items || launched[std::size_t(i)]) {
        fail(ErrorCategory::InvalidPlan, "plan: launch_order[{}] = {} (outside [0, {}) or launched twice)", k, i, items);
      }
      launched[std::size_t(i)] = 1;
      const bool block_start = i == 0 || plan.item_block[std::size_t(i)] != plan.item_block[std::size_t(i) - 1];
      if (!block_start && (k == 0 || plan.launch_order[k - 1] != i - 1)) {
        fail(ErrorCategory::InvalidPlan,
             "plan: launch_order[{}] = {} does not follow item {} of its block {} (a block's items launch together, in order)",
             k, i, i - 1, plan.item_block[std::size_t(i)]);
      }
    }
  }
}

std::int64_t PlanStats::kv_bytes(std::int64_t token_count, std::size_t elem_bytes) const noexcept {
  return token_count * heads_kv * (head_dim + head_dim_v) * std::int64_t(elem_bytes);
}

PlanStats compute_stats(const Plan& plan) {
  PlanStats st;
  st.heads_kv = plan.heads.heads_kv;
  st.head_dim = plan.heads.head_dim;
  st.head_dim_v = plan.heads.value_dim();
  st.tokens = plan.num_tokens();
  st.segments = plan.num_segments();
  st.blocks = plan.num_blocks();
  st.items = plan.num_items();
  st.partials = plan.num_partials;
  for (std::size_t q = 0; q < std::size_t(plan.num_queries); ++q) {
    st.direct_queries += plan.merge_begin[q + 1] == plan.merge_begin[q];
  }
  for (std::int32_t b = 0; b < plan.num_blocks(); ++b) st.plan_read_tokens += plan.block_token_count(b);
  if (st.items == 0) return st;

  st.block_tokens_min = plan.block_tokens;
  st.item_queries_min = kMaxQueryTile;
  std::int64_t token_sum = 0, query_sum = 0;
  for (std::int32_t i = 0; i < plan.num_items(); ++i) {
    const std::int32_t block = plan.item_block[std::size_t(i)];
    const std::int32_t tokens = plan.block_token_count(block);
    const std::int32_t queries = plan.item_query_begin[std::size_t(i) + 1] - plan.item_query_begin[std::size_t(i)];
    st.block_tokens_min = std::min(st.block_tokens_min, tokens);
    st.block_tokens_max = std::max(st.block_tokens_max, tokens);
    st.item_queries_min = std::min(st.item_queries_min, queries);
    st.item_queries_max = std::max(st.item_queries_max, queries);
    token_sum += tokens;
    query_sum += queries;
    const std::int32_t tile_rows = plan.item_tile_rows[std::size_t(i)];
    st.passes += row_passes(std::int64_t(queries) * plan.heads.group_size(), tile_rows);
    st.small_tile_items += tile_rows == kSmallTileRows;
    // Every (query, token) pair a mask grants is one a Q-guided kernel reads: with
    // exact coverage their total is the sum of the queries' path lengths.
    const std::int32_t seg0 = plan.block_segment_begin[std::size_t(block)];
    const std::int32_t segs = plan.block_segment_begin[std::size_t(block) + 1] - seg0;
    for (std::int32_t s = 0; s < segs; ++s) {
      const std::int32_t len = plan.segment_token_end[std::size_t(seg0 + s)] - plan.segment_token_begin[std::size_t(seg0 + s)];
      st.sequence_read_tokens +=
          std::int64_t(__builtin_popcountll(plan.segment_mask[std::size_t(plan.item_mask_begin[std::size_t(i)] + s)])) * len;
    }
  }
  st.block_tokens_mean = double(token_sum) / double(st.items);
  st.item_queries_mean = double(query_sum) / double(st.items);
  return st;
}

}  // namespace treeattn
