#include "device_plan.hpp"

#include "../../cuda/attn_launch.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace treeattn::cuda {

static_assert(kRowsPerPass == kLargeTileRows && kSmallTileRows <= 16,
              "a stage-1 CTA takes a large tile's 64 rows; small tiles run its 16-row split-KV path");
static_assert(kTileTokens == kKvTileTokens, "the kernels' KV tile is the one the cost model prices");

void DevicePlan::upload(const Plan& plan, cudaStream_t stream) {
  // Each item's token map as one record per 64-token tile.
  const ItemTokenMap map = item_token_map(plan, kTileTokens);
  std::vector<TileMap> tile_map(map.slot.size() / kTileTokens);
  for (std::size_t t = 0; t < tile_map.size(); ++t) {
    std::copy_n(map.slot.begin() + std::ptrdiff_t(t * kTileTokens), kTileTokens, tile_map[t].slot);
    // Past the item's end (slot -1, only in its last tile, after a real one):
    // the last real slot again (TileMap says why).
    for (int k = 1; k < kTileTokens; ++k) {
      if (tile_map[t].slot[k] < 0) tile_map[t].slot[k] = tile_map[t].slot[k - 1];
    }
    std::copy_n(map.visible.begin() + std::ptrdiff_t(t * kTileTokens), kTileTokens, tile_map[t].visible);
  }
  // Each item's passes: ceil(query rows / tile rows) of them, item-major in
  // the plan's launch order.
  std::vector<PassInfo> passes;
  const std::int32_t group = plan.heads.group_size();
  for (std::int32_t k = 0; k < plan.num_items(); ++k) {
    const std::size_t item = std::size_t(plan.launch_item(k));
    const std::int32_t query_begin = plan.item_query_begin[item];
    const std::int32_t rows = (plan.item_query_begin[item + 1] - query_begin) * group;
    const std::int32_t tile_rows = plan.item_tile_rows[item];
    for (std::int32_t row = 0; row < rows; row += tile_rows) {
      passes.push_back(PassInfo{query_begin, map.begin[item] / kTileTokens, map.begin[item + 1] / kTileTokens, row,
                                std::min(rows, row + tile_rows), {}});
    }
  }

  // Pack every array at a 16-byte aligned offset of one staging buffer.
  struct Field {
    const void* data;
    std::size_t bytes;
    const void** target;
  };
  KernelParams& p = params_;
  p = KernelParams{};
  const Field fields[] = {
      {plan.tile_query.data(), plan.tile_query.size() * 4, reinterpret_cast<const void**>(&p.tile_query)},
      {plan.tile_partial.data(), plan.tile_partial.size() * 4, reinterpret_cast<const void**>(&p.tile_partial)},
      {plan.merge_begin.data(), plan.merge_begin.size() * 4, reinterpret_cast<const void**>(&p.merge_begin)},
      {plan.merge_partial.data(), plan.merge_partial.size() * 4, reinterpret_cast<const void**>(&p.merge_partial)},
      {tile_map.data(), tile_map.size() * sizeof(TileMap), reinterpret_cast<const void**>(&p.tile_map)},
      {passes.data(), passes.size() * sizeof(PassInfo), reinterpret_cast<const void**>(&p.passes)},
  };
  std::size_t total = 0;
  for (const Field& f : fields) total += (f.bytes + 15) / 16 * 16;
  staging_.resize(std::max<std::size_t>(total, 16));
  workspace_.reserve(staging_.size());
  std::size_t offset = 0;
  for (const Field& f : fields) {
    if (f.bytes) std::memcpy(staging_.data() + offset, f.data, f.bytes);
    *f.target = workspace_.as<unsigned char>() + offset;
    offset += (f.bytes + 15) / 16 * 16;
  }
  TREEATTN_CUDA_CHECK(cudaMemcpyAsync(workspace_.data(), staging_.data(), total, cudaMemcpyHostToDevice, stream));

  const std::size_t partial_rows = std::size_t(plan.num_partials) * std::size_t(plan.heads.heads_q);
  partials_.reserve(std::max<std::size_t>(partial_rows * std::size_t(plan.heads.head_dim + 1) * 4, 16));
  p.partial_o = partials_.as<float>();
  p.partial_lse = partials_.as<float>() + partial_rows * std::size_t(plan.heads.head_dim);
  p.num_queries = plan.num_queries;
  p.num_partials = plan.num_partials;
  p.heads_q = plan.heads.heads_q;
  p.heads_kv = plan.heads.heads_kv;
  p.group = plan.heads.group_size();
  p.num_passes = std::int32_t(passes.size());
  p.scale_log2 = plan.heads.scale * 1.4426950408889634f;
  p.merge_in_order = plan.merge_in_order();
  p.merge_fanin = plan.max_merge_fanin();
  head_dim_ = plan.heads.head_dim;
}

}  // namespace treeattn::cuda
