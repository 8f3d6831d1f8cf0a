#pragma once
// What a stage-1 pass (attn_kernel.cuh) knows of itself: its shared memory,
// its rows and KV head, each thread's place and rows in it, and the scales the
// call's options give its scores and rows.

#include <cstdint>

#include "attn_params.hpp"
#include "attn_traits.cuh"

namespace treeattn::cuda {

constexpr int kDirectWrite = -1;  // plan.hpp: kDirect

// 1024-byte aligned: the 128-byte swizzle of wgmma's operands is by address.
extern __shared__ __align__(1024) unsigned char smem[];

// Stage 1's shared memory (attn_traits.cuh has the layout), addressed from the
// shared symbol itself so the compiler keeps 32-bit shared addresses.
template <typename Traits>
struct SharedTiles {
  using Element = typename Traits::Element;
  __device__ __forceinline__ static Element* k() { return reinterpret_cast<Element*>(smem + Traits::kKOffset); }
  __device__ __forceinline__ static Element* v() { return reinterpret_cast<Element*>(smem + Traits::kVOffset); }
  // Where the gather lands K and V rows: the tiles, or fp8 bytes to widen.
  __device__ __forceinline__ static unsigned char* k_gather() { return smem + Traits::kKGatherOffset; }
  __device__ __forceinline__ static unsigned char* v_gather() { return smem + Traits::kVGatherOffset; }
  // The ring of kMapStages tile maps: tile m's in entry m % kMapStages.
  __device__ __forceinline__ static TileMap* map(int m) {
    return reinterpret_cast<TileMap*>(smem + Traits::kMapOffset) + m % Traits::kMapStages;
  }
};

// What one pass of stage 1 needs from the kernel's prologue.
struct PassContext {
  const KernelParams& p;
  int tile0, ntiles;               // the item's first tile map, its 64-token tiles
  int row_end, row0, q0, kv_head;  // the pass takes query rows [row0, row_end)
};

// Row r of the pass (r counted from the item's first row) is tile query
// r / group under query head kv_head * group + r % group.
__device__ __forceinline__ int row_head(const PassContext& c, int r) { return c.kv_head * c.p.group + r % c.p.group; }

// A thread's place in a pass (PassTraits says how the warps share it).
template <typename Traits>
struct PassLane {
  int tid, warp;
  int g, t4;     // the mma fragments' row group (lane / 4) and column pair (lane % 4)
  int warp_row;  // the warp's first row, counted from the pass's first
  // The thread's rows g and g + 8 of the warp (h = 0, 1), counted from the item's first row.
  __device__ __forceinline__ int row(const PassContext& c, int h) const { return c.row0 + warp_row + g + h * 8; }
};

// The thread's two rows: their tile queries, whose entries give each row's
// query and destination and whose words of each tile's visibility mask its
// scores; their queries (-1 past the pass's end: zero Q); and, in a 64-row
// pass, where they go — the item's partial, or -2 - query for a direct write,
// so the epilogue has no dependent lookup (the split-KV path looks its rows up
// over its merge's barrier). Rows past the pass's end take the last row's tile
// query: they compute harmlessly and are never written.
struct ThreadRows {
  int tile_query[2];
  int query[2];
  int target[2];
};

// Both rows' lookups leave before either is used: behind the first row's
// test, the second row's loads would take a round trip of their own.
template <typename Traits>
__device__ __forceinline__ ThreadRows locate_thread_rows(const PassContext& c, const PassLane<Traits>& lane) {
  const KernelParams& p = c.p;
  ThreadRows r{{0, 0}, {0, 0}, {0, 0}};
  int partial[2] = {0, 0};
#pragma unroll
  for (int h = 0; h < 2; ++h) r.tile_query[h] = min(lane.row(c, h), c.row_end - 1) / p.group;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (h >= Traits::kRowHalves) {  // rows g + 8 of a half-row pass: past its end
      r.query[h] = -1;
      continue;
    }
    r.query[h] = p.tile_query[c.q0 + r.tile_query[h]];
    if constexpr (!Traits::kSplitKV) partial[h] = p.tile_partial[c.q0 + r.tile_query[h]];
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (lane.row(c, h) >= c.row_end) {
      r.query[h] = -1;
    } else if constexpr (!Traits::kSplitKV) {
      r.target[h] = partial[h] == kDirectWrite ? -2 - r.query[h] : partial[h];
    }
  }
  return r;
}

// What the call's options make of a pass's scores and rows (the plain
// kernel's: the softmax scale alone). Scores stay raw Q K^T until the
// exponent, whose FFMA applies exp_scale; a soft-cap replaces them by base-2
// capped logits first (exp_scale 1).
struct PassScales {
  float exp_scale;  // base-2 logit of a raw score: softmax scale * log2(e) * the KV head's k scale
  float cap_in;     // soft-cap: raw score -> the base-2 logit over the base-2 cap, the tanh's argument
  float out_scale;  // the KV head's v scale, on every row of O and of the partials
};
template <typename Traits>
__device__ __forceinline__ PassScales pass_scales(const KernelParams& p, int kv_head) {
  if constexpr (!Traits::kOptions) {
    return {p.scale_log2, 0.0f, 1.0f};
  } else {
    const float k = p.k_scales != nullptr ? p.k_scales[kv_head] : p.k_scale;
    const float v = p.v_scales != nullptr ? p.v_scales[kv_head] : p.v_scale;
    const float logit = p.scale_log2 * k;
    if (p.softcap_log2 > 0.0f) return {1.0f, logit / p.softcap_log2, v};
    return {logit, 0.0f, v};
  }
}

}  // namespace treeattn::cuda
