// The TileMaps of an uploaded plan, built on the device from the plan's token
// slots, segments and masks (TileExpansion): what the host would otherwise
// build and copy at 768 bytes a tile every decode step.

#include "attn_launch.hpp"

namespace treeattn::cuda {
namespace {

// One CTA per tile, one thread per token of it: the token's slot and mask
// from its segment (the last whose first token is at or before it), then
// the tile's 64 visible words, word j the ballot of mask bit j over the tokens.
__global__ void __launch_bounds__(kTileTokens) expand_tile_maps_kernel(const __grid_constant__ TileExpansion e) {
  const TileSource src = e.sources[blockIdx.x];
  const int token = int(threadIdx.x);
  const std::int32_t at = src.first_token + token;
  std::int32_t slot;
  std::uint64_t mask = 0;
  if (at < src.block_tokens) {
    std::int32_t lo = src.segment_begin, hi = src.segment_end - 1;
    while (lo < hi) {
      const std::int32_t mid = (lo + hi + 1) / 2;
      if (e.segment_offset[mid] <= at) lo = mid;
      else hi = mid - 1;
    }
    slot = e.token_slot[e.segment_token_begin[lo] + at - e.segment_offset[lo]];
    mask = e.segment_mask[src.mask_begin + lo - src.segment_begin];
  } else {  // past the item's tokens: its last slot, seen by no query (TileMap says why)
    const std::int32_t last = src.segment_end - 1;
    slot = e.token_slot[e.segment_token_begin[last] + src.block_tokens - 1 - e.segment_offset[last]];
  }
  TileMap& out = e.tile_map[blockIdx.x];
  out.slot[token] = slot;
  __shared__ std::uint32_t halves[2][kTileTokens];  // [warp][query]: its 32 tokens' bits
  for (int query = 0; query < kTileTokens; ++query) {
    const std::uint32_t bits = __ballot_sync(0xffffffffu, (mask >> query) & 1);
    if (token % 32 == 0) halves[token / 32][query] = bits;
  }
  __syncthreads();
  out.visible[token] = std::uint64_t(halves[1][token]) << 32 | halves[0][token];
}

}  // namespace

cudaError_t launch_expand_tile_maps(const TileExpansion& expansion, cudaStream_t stream) {
  if (expansion.tiles == 0) return cudaSuccess;
  expand_tile_maps_kernel<<<unsigned(expansion.tiles), kTileTokens, 0, stream>>>(expansion);
  return cudaGetLastError();
}

}  // namespace treeattn::cuda
