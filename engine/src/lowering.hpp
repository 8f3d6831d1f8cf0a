#pragma once
// Backend-facing (engine/src: the backends' objects have it on their include
// path; no public header): a Plan lowered to what every stage-1 kernel reads,
// once, on the host, for the CUDA upload and the Vulkan encoder alike.
//
//   passes          each item's query rows cut into passes (row_passes()), the
//                   items in the plan's launch order, an item's passes adjacent
//                   in row order: one work group (CTA) per pass and KV head
//   tiles           each item's block in 64-token KV tiles (kKvTileTokens), item
//                   after item: where the tile's first token lies, so a kernel
//                   reads the tile's segments at once instead of searching them
//   segment_offset  each segment's first token counted in its block
//   tile_partial    Plan::tile_partial with the partials numbered in merge
//                   order: a query's partials are merge_begin[q] .. merge_begin[q + 1]
//                   - 1, so no merge looks them up in merge_partial (a plan that
//                   numbers them otherwise is renumbered, the CSR order kept:
//                   the same sums in the same order, bitwise the same output)
//
// lower() is O(passes + tiles + segments + tile entries) and reuses the
// Lowering's vectors, so an upload of a plan no larger than an earlier one
// allocates nothing.

#include <cstdint>
#include <vector>

#include "treeattn/plan.hpp"

namespace treeattn {

// Passes of an item of `rows` query rows taking up to `pass_rows` rows each:
// ceil(rows / pass_rows), the one place the rule is written.
constexpr std::int64_t row_passes(std::int64_t rows, std::int32_t pass_rows) noexcept {
  return (rows + pass_rows - 1) / pass_rows;
}

// Rows a pass of an item of `tile_rows` takes on a backend whose kernel takes
// up to `max_pass_rows` rows a pass (plan.hpp: "tile rows").
constexpr std::int32_t pass_rows(std::int32_t tile_rows, std::int32_t max_pass_rows) noexcept {
  return tile_rows < max_pass_rows ? tile_rows : max_pass_rows;
}

// Item `item`'s passes on such a backend.
std::int32_t item_passes(const Plan& plan, std::int32_t item, std::int32_t max_pass_rows);

struct LoweredPass {
  std::int32_t item;
  std::int32_t query_begin;         // the item's first tile entry (item_query_begin)
  std::int32_t row_begin, row_end;  // the pass's query rows (tile query x group head) of the item
};

struct LoweredTile {
  std::int32_t segment_first;  // the block's segment holding the tile's first token
  std::int32_t segment_end;    // the block's segment end
  std::int32_t mask_first;     // the item's mask of segment_first (Plan::segment_mask)
  std::int32_t first_token;    // the tile's first token, counted in the block
  std::int32_t block_tokens;   // the block's tokens (the last tile may hold fewer than 64)
};

struct Lowering {
  std::vector<LoweredPass> passes;           // in launch order
  std::vector<std::int32_t> item_tile;       // [num_items + 1] CSR into tiles
  std::vector<LoweredTile> tiles;            // item by item
  std::vector<std::int32_t> segment_offset;  // [num_segments]
  std::vector<std::int32_t> tile_partial;    // [tile entries] partial in merge order, or kDirect
  std::vector<std::int32_t> merge_position;  // [num_partials] each partial's place in merge_partial:
                                             // filled only for a plan that numbers partials otherwise
};

// Lowers a valid `plan` for a backend whose kernel takes up to `max_pass_rows`
// query rows a pass (kSmallTileRows or more; throws InvalidArgument otherwise).
void lower(const Plan& plan, std::int32_t max_pass_rows, Lowering& out);
Lowering lower(const Plan& plan, std::int32_t max_pass_rows);

}  // namespace treeattn
