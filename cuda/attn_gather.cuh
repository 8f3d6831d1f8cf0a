#pragma once
// Stage 1's gather (attn_kernel.cuh): KvGather, and the wait for a landed tile.

#include <cstdint>

#include "attn_pass_context.cuh"
#include "instructions.cuh"
#include "wgmma.cuh"

namespace treeattn::cuda {

// The pass's cp.async traffic: tile maps into their ring, and K and V rows
// through a landed map into a stage. A thread copies one chunk column of a
// tile: chunk `chunk` of rows row0, row0 + kGatherRowStep, ... Rows 8 apart
// share their swizzle, so a row costs a slot load, two 32 x 32 -> 64-bit
// address multiply-adds and two copies (29 instructions in the sm_90a SASS
// with a 64-bit slot stride and a swizzle per row). Rows past the item's end
// repeat its last slot (TileMap), so no row needs a zero-fill predicate (four
// more instructions).
template <typename Traits>
struct KvGather {
  using KvStore = typename Traits::KvStore;
  using Smem = SharedTiles<Traits>;
  static constexpr int kStep = Traits::kGatherRowStep;
  const PassContext& c;
  int tid, chunk, row0;
  const char* k_column;
  const char* v_column;
  std::uint32_t slot_bytes;    // one stride for K and V: one multiply a row
  std::uint32_t v_slot_bytes;  // V's own, where its rows are narrower than K's (kSplitDims)
  std::uint32_t column_bytes;  // the thread's first row's chunk in a stage

  __device__ __forceinline__ KvGather(const PassContext& ctx, int thread) : c(ctx), tid(thread) {
    constexpr int kChunkElements = 16 / int(sizeof(KvStore));
    const KvStore* k_head = static_cast<const KvStore*>(c.p.k) + std::int64_t(c.kv_head) * Traits::kHeadDim;
    const KvStore* v_head = static_cast<const KvStore*>(c.p.v) + std::int64_t(c.kv_head) * Traits::kHeadDimV;
    chunk = tid % Traits::kGatherChunksPerRow;
    row0 = tid / Traits::kGatherChunksPerRow;
    if constexpr (kIdleThreads) row0 = copies() ? row0 : 0;  // an idle thread's slot reads stay in the map
    k_column = reinterpret_cast<const char*>(k_head + chunk * kChunkElements);
    v_column = reinterpret_cast<const char*>(v_head + chunk * kChunkElements);
    slot_bytes = std::uint32_t(c.p.kv_row_stride) * std::uint32_t(sizeof(KvStore));
    if constexpr (Traits::kSplitDims) v_slot_bytes = std::uint32_t(c.p.v_row_stride) * std::uint32_t(sizeof(KvStore));
    column_bytes = Traits::gather_offset(row0, chunk);
  }
  // Whether the thread copies (kGatherThreads), and whether its chunk column is one of V's too.
  static constexpr bool kIdleThreads = Traits::kGatherThreads < Traits::kThreads;
  __device__ __forceinline__ bool copies() const { return tid < Traits::kGatherThreads; }
  __device__ __forceinline__ bool copies_v() const { return !Traits::kSplitDims || chunk < Traits::kGatherChunksPerRowV; }
  // Tile m's token map into its ring entry, a 16-byte piece per thread.
  __device__ __forceinline__ void load_map(int m) const {
    if (m < c.ntiles && tid < Traits::kMapChunks) {
      cp_async_16(smem_address(reinterpret_cast<uint4*>(Smem::map(m)) + tid), reinterpret_cast<const uint4*>(c.p.tile_map + c.tile0 + m) + tid);
    }
  }
  // The thread's i-th row of a tile (row0 + i * kStep) from KV-pool slot `slot` into `stage`.
  __device__ __forceinline__ void copy_row(int stage, int i, int slot) const {
    if constexpr (kIdleThreads) {
      if (!copies()) return;
    }
    const std::uint32_t k_tile = smem_address(Smem::k_gather() + stage * Traits::kKGatherBytes);
    const std::uint32_t v_tile = smem_address(Smem::v_gather() + stage * Traits::kVGatherBytes);
    const std::uint32_t at = kStep % Traits::kGatherSwizzleRows == 0 ? column_bytes + i * kStep * Traits::kGatherRowBytes
                                                                     : Traits::gather_offset(row0 + i * kStep, chunk);
    const std::uint64_t from = std::uint64_t(std::uint32_t(slot)) * slot_bytes;
    cp_async_16(k_tile + at, k_column + from);
    if constexpr (Traits::kSplitDims) {
      if (copies_v()) cp_async_16(v_tile + at, v_column + std::uint64_t(std::uint32_t(slot)) * v_slot_bytes);
    } else {
      cp_async_16(v_tile + at, v_column + from);
    }
  }
  // Tile t's K and V rows through its map (which has landed). A batch's slots
  // are all read before its copies: a slot read after the previous row's
  // cp.async (which writes shared memory) cannot be moved above it, so each
  // row would wait out a shared-load latency of its own (eight a tile: a
  // quarter of a speculative tree's stall samples).
  __device__ __forceinline__ void load_tile(int t, int stage) const {
    const std::int32_t* slots = Smem::map(t)->slot;
#pragma unroll 1
    for (int i0 = 0; i0 < Traits::kGatherRows; i0 += Traits::kGatherBatch) {
      int slot[Traits::kGatherBatch];
#pragma unroll
      for (int j = 0; j < Traits::kGatherBatch; ++j) slot[j] = slots[row0 + (i0 + j) * kStep];
#pragma unroll
      for (int j = 0; j < Traits::kGatherBatch; ++j) copy_row(stage, i0 + j, slot[j]);
    }
  }
  // Tile 0's slots, straight from its tile map in global memory: its gather
  // then waits neither for the map's copy nor for the prologue's barrier.
  __device__ __forceinline__ void read_first_slots(int (&slot)[Traits::kGatherRows]) const {
#pragma unroll
    for (int i = 0; i < Traits::kGatherRows; ++i) slot[i] = c.p.tile_map[c.tile0].slot[row0 + i * kStep];
  }
  __device__ __forceinline__ void load_first_tile(const int (&slot)[Traits::kGatherRows]) const {
#pragma unroll
    for (int i = 0; i < Traits::kGatherRows; ++i) copy_row(0, i, slot[i]);
  }
  // Ahead of tile t's math: tile t + kStages - 1's K/V (its map came with tile
  // t - 1, or before the loop; tile 0 left in the prologue) and the map of
  // tile t + 2 kStages - 1, one commit group per tile (empty past the end).
  __device__ __forceinline__ void prefetch_for(int t) const {
    const int ahead = t + Traits::kStages - 1;
    if (ahead > 0 && ahead < c.ntiles) load_tile(ahead, ahead % Traits::kStages);
    load_map(ahead + Traits::kStages);
    cp_async_commit();
  }
};

// Waits for tile t's K, V and map (all but the newest kStages - 1 commit
// groups), then the CTA's barrier.
template <typename Traits>
__device__ __forceinline__ void wait_for_tile() {
  cp_async_wait<Traits::kStages - 1>();
#if defined(TREEATTN_WGMMA)
  if constexpr (!Traits::kSplitKV) fence_shared_for_wgmma();  // the landed tile, for wgmma's async proxy
#endif
  __syncthreads();
}

}  // namespace treeattn::cuda
