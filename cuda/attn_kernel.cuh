#pragma once
// Tree attention on tensor cores: mma.sync m16n8k16 (sm_80 and later), and on
// sm_90a wgmma for the 64-row passes (wgmma.cuh; same fragments, so the masks
// and the softmax are shared).
//
// Stage 1: one CTA per (pass, KV head); a pass is up to the item's tile rows
// (64 or 16) of its query rows, which are the tile's queries x the group's
// query heads packed query-major. The passes of one item are adjacent in the
// grid so they share the block in L2.
// The CTA streams the item's block through 64-token tiles: each tile's token
// map (each token's KV-pool slot, each query's visible tokens) arrives with
// cp.async ahead of the tile, whose K and V rows it gathers (two stages), so a
// block may be any length. It computes S = Q K^T, applies the masks, runs the
// online softmax, accumulates O = P V, and writes the normalised partial and
// its log-sum-exp, or O and LSE directly when the item is the query's only one.
// Stage 2 (attn_merge.cuh) merges each query's partials in the plan's order
// (deterministic).
// The attention variants (fp8 K and V, soft-cap, sinks: DESIGN.md §8) are
// instantiations of their own (AttnTraits' KvStore and Options, the merge's
// kSinks); the plain kernel compiles none of their code.

#include "attn_epilogue.cuh"
#include "attn_gather.cuh"
#include "attn_pass_context.cuh"
#include "attn_pass_math.cuh"
#include "attn_traits.cuh"
#include "fp8_fragments.cuh"
#include "fp8_widen_shared.cuh"
#include "instructions.cuh"

namespace treeattn::cuda {

// One pass of up to 64 query rows over the whole KV block (PassTraits says how
// the warps share it).
template <typename Traits>
__device__ __forceinline__ void attend_pass(const PassContext& c) {
  using Smem = SharedTiles<Traits>;
  constexpr int D = Traits::kHeadDim;
  constexpr int kAccTiles = Traits::kAccTiles;
  constexpr int kStages = Traits::kStages;
  // The thread's coordinates are the pass's own locals, and the mask's first
  // bit and the ldmatrix row are computed from them here. Built in a PassLane
  // constructor instead, they compile to another prologue schedule of the
  // split-KV passes: 0.97x on two 16/1/128 peer shapes
  // (benchmarks/h200/kernel_steps_ab.json).
  const int tid = threadIdx.x, warp = tid / 32, lane_id = tid % 32;
  const int g = lane_id / 4, t4 = lane_id % 4;
  const int warp_row = Traits::kSplitKV ? 0 : warp * 16;
  const int n_base = Traits::kSplitKV ? warp * Traits::kNTiles : 0;  // the warp's first 8-token n-tile of a tile
  const PassLane<Traits> lane{tid, warp, g, t4, warp_row};
  const KvGather<Traits> gather(c, lane.tid);
  const PassScales scales = pass_scales<Traits>(c.p, c.kv_head);
  // The plain kernel reads the scale where it uses it, as a constant operand:
  // kept in a register across the loop, its code would differ.
  const auto exp_scale = [&] {
    if constexpr (Traits::kOptions) return scales.exp_scale;
    else return c.p.scale_log2;
  };

  // The prologue in two round trips: the first kStages maps, tile 0's slots
  // and the tile queries of the thread's two Q rows; then tile 0's K/V rows
  // and the thread's Q elements. So tile 0 does not wait for the barrier
  // below, which Q's loads hold up (read from the map's shared copy, its slots
  // leave 1.6 us into a speculative tree's 8.3-us CTAs), and Q needs neither
  // shared memory nor barriers of its own. Every pass has a tile (a validated
  // plan's blocks hold at least one token).
  for (int m = 0; m < kStages; ++m) gather.load_map(m);
  cp_async_commit();
  int slot0[Traits::kGatherRows];
  gather.read_first_slots(slot0);
  const ThreadRows rows = locate_thread_rows(c, lane);
  // Tile 0 and the map of tile kStages: the group the loop's first look-ahead
  // step would have committed.
  gather.load_first_tile(slot0);
  if constexpr (kStages > 1) gather.load_map(kStages);
  cp_async_commit();
  std::uint32_t qf[D / 16][4];
  load_q_fragments(c, lane, rows, qf);
  cp_async_wait<1>();  // the maps; tile 0 may still travel
  __syncthreads();
  // The other look-ahead groups before the loop: tile j's K/V and the map of
  // tile j + kStages. The loop commits one group per tile (empty past the
  // end), so waiting for all but the newest kStages - 1 means tile t has landed.
  for (int j = 1; j + 1 < kStages; ++j) {
    if (j < c.ntiles) gather.load_tile(j, j);
    gather.load_map(j + kStages);
    cp_async_commit();
  }

  // ldmatrix rows of this lane: matrix lane / 8 of each x4 load, row lane % 8;
  // both x4 loads (K for S, V for P V) take the same matrices of a 16-token step.
  const int mat = lane_id / 8;
  const auto kv_row = Traits::lane_row(n_base * 8 + (mat & 1) * 8 + lane_id % 8, mat >> 1);

  float acc[kAccTiles][4];
#pragma unroll
  for (int n = 0; n < kAccTiles; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  float row_max[2] = {TREEATTN_NEG_INF, TREEATTN_NEG_INF}, row_sum[2] = {0.0f, 0.0f};

  if constexpr (Traits::kWidenInShared && kStages == 2) {
    // fp8 widened in shared memory, two barriers a tile: the first publishes
    // K(t) (widened while tile t - 1's P V ran), the second V(t) (widened
    // while S ran) and tile t + 1's bytes. By the second every warp is done
    // with S(t), so K(t + 1) is widened while P V(t) runs, and with tile t's
    // bytes, so tile t + 2's gather refills its stage; by the first, of the
    // next tile, with P V(t), so V(t + 1) may be widened.
    gather.prefetch_for(0);
    wait_for_tile<Traits>();
    widen<Traits, Traits::kGatherChunksPerRow>(Smem::k_gather(), Smem::k(), 0, tid);
    for (int t = 0; t < c.ntiles; ++t) {
      const int stage = t % kStages;
      widened<Traits>();
      float s[Traits::kNTiles][4];
      compute_scores<Traits>(qf, Smem::k(), kv_row, s, [&] {
        widen<Traits, Traits::kGatherChunksPerRowV>(Smem::v_gather(), Smem::v(), stage, tid);
      });
      cap_scores<Traits>(c.p, scales, s);
      mask_invisible<Traits>(*Smem::map(t), rows.tile_query, n_base * 8 + t4 * 2, s);
      softmax_update<Traits::kWidened, Traits::kRowHalves>(row_max, row_sum, s, acc, exp_scale());
      cp_async_wait<0>();  // tile t + 1 (and its successor's map)
      widened<Traits>();
      gather.prefetch_for(t + 1);
      accumulate_pv<Traits>(s, Smem::v(), kv_row, acc, [&] {
        if (t + 1 < c.ntiles) widen<Traits, Traits::kGatherChunksPerRow>(Smem::k_gather(), Smem::k(), stage ^ 1, tid);
      });
    }
  } else {
    for (int t = 0; t < c.ntiles; ++t) {
      const int stage = t % kStages;
      gather.prefetch_for(t);
      wait_for_tile<Traits>();
      // One offset where K's and V's tiles are alike: two compile to another
      // schedule of the equal-width kernels' address arithmetic.
      const int k_tile = Traits::k_tile(stage);
      const int v_tile = Traits::kKTileBytes == Traits::kVTileBytes ? k_tile : Traits::v_tile(stage);
      // fp8 in shared memory: K widened before S, V while S is computed and
      // published after the softmax (the previous tile's P V is done with both:
      // the loop's barrier). fp8 in registers: read from the gathered bytes.
      if constexpr (Traits::kWidenInShared) {
        widen<Traits, Traits::kGatherChunksPerRow>(Smem::k_gather(), Smem::k(), stage, tid);
        widened<Traits>();
      }
      float s[Traits::kNTiles][4];
      if constexpr (Traits::kKvInRegisters) {
        Fp8Fragments<Traits>::scores(qf, Smem::k_gather() + stage * Traits::kKGatherBytes, n_base * 8, g, t4, s);
      } else {
        compute_scores<Traits>(qf, Smem::k() + k_tile, kv_row, s, [&] {
          if constexpr (Traits::kWidenInShared) widen<Traits, Traits::kGatherChunksPerRowV>(Smem::v_gather(), Smem::v(), stage, tid);
        });
      }
      cap_scores<Traits>(c.p, scales, s);
      mask_invisible<Traits>(*Smem::map(t), rows.tile_query, n_base * 8 + t4 * 2, s);
      softmax_update<Traits::kWidened, Traits::kRowHalves>(row_max, row_sum, s, acc, exp_scale());
      if constexpr (Traits::kWidenInShared) widened<Traits>();
      if constexpr (Traits::kKvInRegisters) {
        Fp8Fragments<Traits>::accumulate_pv(s, Smem::v_gather() + stage * Traits::kVGatherBytes, n_base * 8, g, t4, acc);
      } else {
        accumulate_pv<Traits>(s, Smem::v() + v_tile, kv_row, acc, [] {});
      }
      __syncthreads();  // the stage and this tile's map are refilled next
    }
  }

  // A 64-row pass with options keeps its raw maxima (RowEnd).
  softmax_finish<Traits::kRowHalves>(row_max, row_sum, Traits::kOptions && !Traits::kSplitKV ? 1.0f : exp_scale());
  if constexpr (!Traits::kSplitKV) write_thread_rows(c, lane, rows, scales, row_max, row_sum, acc);
  else merge_warps_and_write(c, lane, scales, row_max, row_sum, acc);
}

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kMinBlocksPerSM) tree_attn_partial_kernel(const __grid_constant__ KernelParams p) {
#if defined(TREEATTN_WGMMA)
  // wgmma applies the 128-byte swizzle by shared address: a misplaced window
  // would give a wrong answer, so the kernel traps instead.
  if ((smem_address(smem) & 1023u) != 0) __trap();
#endif
  const int pass = int(blockIdx.x / unsigned(p.heads_kv));
  const int kv_head = int(blockIdx.x % unsigned(p.heads_kv));
  const PassInfo info = p.passes[pass];
  if (info.row_end <= info.row_begin) return;  // past the plan's passes (a graph-stable grid holds more)
  const PassContext ctx{p, info.tile_begin, info.tile_end - info.tile_begin, info.row_end, info.row_begin, info.query_begin, kv_head};
  // A pass of at most 16 rows (a small tile, or a large tile's last rows) splits
  // the KV tile among the warps instead of giving three of them padding rows;
  // with fp8 K and V, one of at most 8 skips its fragments' padding half (up
  // to head_dim 128: at 192 and 256 a third pass body spills the kernel's
  // registers further).
  const int rows = info.row_end - info.row_begin;
  if constexpr (Traits::kWidened && Traits::kHeadDim <= 128) {
    if (rows <= 8) return attend_pass<PassTraits<Traits, true, true>>(ctx);
  }
  if (rows <= 16) attend_pass<PassTraits<Traits, true>>(ctx);
  else attend_pass<PassTraits<Traits, false>>(ctx);
}

}  // namespace treeattn::cuda
