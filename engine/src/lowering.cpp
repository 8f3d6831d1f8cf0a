#include "lowering.hpp"

#include <algorithm>

#include "fail.hpp"

namespace treeattn {

std::int32_t item_passes(const Plan& plan, std::int32_t item, std::int32_t max_pass_rows) {
  const std::size_t i = std::size_t(item);
  const std::int64_t rows = std::int64_t(plan.item_query_begin[i + 1] - plan.item_query_begin[i]) * plan.heads.group_size();
  return std::int32_t(row_passes(rows, pass_rows(plan.item_tile_rows[i], max_pass_rows)));
}

void lower(const Plan& plan, std::int32_t max_pass_rows, Lowering& out) {
  if (max_pass_rows < kSmallTileRows) {
    fail(ErrorCategory::InvalidArgument, "lowering: a kernel of {} rows a pass (expected at least a small tile's {})",
         max_pass_rows, kSmallTileRows);
  }
  const std::int32_t items = plan.num_items();

  out.segment_offset.resize(std::size_t(plan.num_segments()));
  for (std::int32_t block = 0; block < plan.num_blocks(); ++block) {
    std::int32_t offset = 0;
    for (std::int32_t g = plan.block_segment_begin[std::size_t(block)]; g < plan.block_segment_begin[std::size_t(block) + 1]; ++g) {
      out.segment_offset[std::size_t(g)] = offset;
      offset += plan.segment_token_end[std::size_t(g)] - plan.segment_token_begin[std::size_t(g)];
    }
  }

  // A tile names the segment of its first token: the last of the block's
  // segments that starts at or before it.
  out.item_tile.resize(std::size_t(items) + 1);
  out.tiles.clear();
  for (std::int32_t item = 0; item < items; ++item) {
    out.item_tile[std::size_t(item)] = std::int32_t(out.tiles.size());
    const std::int32_t block = plan.item_block[std::size_t(item)];
    const std::int32_t first = plan.block_segment_begin[std::size_t(block)];
    const std::int32_t end = plan.block_segment_begin[std::size_t(block) + 1];
    const std::int32_t block_tokens = out.segment_offset[std::size_t(end - 1)] + plan.segment_token_end[std::size_t(end - 1)] -
                                      plan.segment_token_begin[std::size_t(end - 1)];
    std::int32_t g = first;
    for (std::int32_t token = 0; token < block_tokens; token += kKvTileTokens) {
      while (g + 1 < end && out.segment_offset[std::size_t(g) + 1] <= token) ++g;
      out.tiles.push_back(LoweredTile{g, end, plan.item_mask_begin[std::size_t(item)] + (g - first), token, block_tokens});
    }
  }
  out.item_tile.back() = std::int32_t(out.tiles.size());

  out.passes.clear();
  const std::int32_t group = plan.heads.group_size();
  for (std::int32_t k = 0; k < items; ++k) {
    const std::int32_t item = plan.launch_item(k);
    const std::int32_t query_begin = plan.item_query_begin[std::size_t(item)];
    const std::int32_t rows = (plan.item_query_begin[std::size_t(item) + 1] - query_begin) * group;
    const std::int32_t step = pass_rows(plan.item_tile_rows[std::size_t(item)], max_pass_rows);
    const std::int32_t passes = std::int32_t(row_passes(rows, step));
    for (std::int32_t p = 0; p < passes; ++p) {
      out.passes.push_back(LoweredPass{item, query_begin, p * step, std::min(rows, (p + 1) * step)});
    }
  }

  out.tile_partial.assign(plan.tile_partial.begin(), plan.tile_partial.end());
  if (!plan.merge_in_order()) {
    out.merge_position.resize(std::size_t(plan.num_partials));
    for (std::size_t m = 0; m < plan.merge_partial.size(); ++m) {
      out.merge_position[std::size_t(plan.merge_partial[m])] = std::int32_t(m);
    }
    for (std::int32_t& partial : out.tile_partial) {
      if (partial != kDirect) partial = out.merge_position[std::size_t(partial)];
    }
  }
}

Lowering lower(const Plan& plan, std::int32_t max_pass_rows) {
  Lowering out;
  lower(plan, max_pass_rows, out);
  return out;
}

}  // namespace treeattn
