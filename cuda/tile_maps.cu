// An uploaded plan's device work (PlanUpload), one kernel: the arrays the
// attention kernels read copied from the pinned staging buffer, and the
// TileMaps built from the plan's slots, segments and masks where the host
// staged them: the host neither builds nor copies 768 bytes a tile each
// decode step, and an upload is one launch.

#include "attn_launch.hpp"

namespace treeattn::cuda {
namespace {

// CTAs [0, tiles): one per tile, one thread per token of it. The tile's
// segments (at most one per token) come over in one round of reads; each
// token finds its own among them (the last whose first token is at or before
// it), then reads its slot; the tile's 64 visible words follow, word j the
// ballot of mask bit j over the tokens. Three dependent reads of staged
// memory a tile, each a round trip over the bus, so none of them is a search.
__device__ void build_tile_map(const PlanUpload& u, int tile) {
  __shared__ std::int32_t offset[kTileTokens], token_begin[kTileTokens];
  __shared__ std::uint64_t masks[kTileTokens];
  __shared__ std::uint32_t halves[2][kTileTokens];  // [warp][query]: its 32 tokens' bits
  const TileSource src = u.sources[tile];
  const int token = int(threadIdx.x);
  const int segments = min(kTileTokens, src.segment_end - src.segment_first);
  if (token < segments) {
    offset[token] = u.segment_offset[src.segment_first + token];
    token_begin[token] = u.segment_token_begin[src.segment_first + token];
    masks[token] = u.segment_mask[src.mask_first + token];
  }
  __syncthreads();
  const std::int32_t at = src.first_token + token;
  std::int32_t slot;
  std::uint64_t mask = 0;
  if (at < src.block_tokens) {
    int lo = 0, hi = segments - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (offset[mid] <= at) lo = mid;
      else hi = mid - 1;
    }
    slot = u.token_slot[token_begin[lo] + at - offset[lo]];
    mask = masks[lo];
  } else {  // past the item's tokens (its last tile, which holds its last segment): its last slot, seen by no query
    const int last = segments - 1;
    slot = u.token_slot[token_begin[last] + src.block_tokens - 1 - offset[last]];
  }
  TileMap& out = u.tile_map[tile];
  out.slot[token] = slot;
  for (int query = 0; query < kTileTokens; ++query) {
    const std::uint32_t bits = __ballot_sync(0xffffffffu, (mask >> query) & 1);
    if (token % 32 == 0) halves[token / 32][query] = bits;
  }
  __syncthreads();
  out.visible[token] = std::uint64_t(halves[1][token]) << 32 | halves[0][token];
}

// CTAs [tiles, tiles + copy_ctas): the copies, 16 bytes a thread and step.
__device__ void copy_arrays(const PlanUpload& u, int cta) {
  const std::int64_t stride = std::int64_t(u.copy_ctas) * kTileTokens;
  for (const CopyRange& r : u.copies) {
    const uint4* from = static_cast<const uint4*>(r.from);
    uint4* to = static_cast<uint4*>(r.to);
    for (std::int64_t w = std::int64_t(cta) * kTileTokens + threadIdx.x; w < r.words; w += stride) to[w] = from[w];
  }
}

__global__ void __launch_bounds__(kTileTokens) upload_plan_kernel(const __grid_constant__ PlanUpload u) {
  const int cta = int(blockIdx.x);
  if (cta < u.tiles) build_tile_map(u, cta);
  else copy_arrays(u, cta - u.tiles);
  // Every thread's reads of the staging buffer have been used by its writes
  // above; the last CTA past this point tells the host the buffer is free.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(u.finished_ctas, 1u) == gridDim.x - 1) {
      *u.finished_ctas = 0;  // for the next upload, which this stream runs after this one
      __threadfence_system();
      *static_cast<volatile std::uint64_t*>(u.done) = u.ticket;
    }
  }
}

}  // namespace

cudaError_t launch_upload_plan(const PlanUpload& upload, cudaStream_t stream) {
  upload_plan_kernel<<<unsigned(upload.tiles + upload.copy_ctas), kTileTokens, 0, stream>>>(upload);
  return cudaGetLastError();
}

}  // namespace treeattn::cuda
