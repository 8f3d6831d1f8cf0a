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
// Stage 2 merges each query's partials in the plan's order (deterministic).
// The attention variants (fp8 K and V, soft-cap, sinks: DESIGN.md §8) are
// instantiations of their own (AttnTraits' KvStore and Options, the merge's
// kSinks); the plain kernel compiles none of their code.

#include <cstdint>

#include "attn_params.hpp"
#include "attn_traits.cuh"
#include "fp8_fragments.cuh"
#include "fp8_widen.cuh"
#include "instructions.cuh"
#include "wgmma.cuh"

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

// The warp's 16 rows of Q as A fragments for the whole head dimension: per
// 16-column step, element pairs (row g, then g + 8) at columns 2 t4 and 2 t4 + 8.
template <typename Traits>
__device__ __forceinline__ void load_q_fragments(const PassContext& c, const PassLane<Traits>& lane, const ThreadRows& rows,
                                                 std::uint32_t (&qf)[Traits::kHeadDim / 16][4]) {
  using Element = typename Traits::Element;
  constexpr int D = Traits::kHeadDim;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int head = row_head(c, lane.row(c, h));
    const std::uint32_t* q_row = reinterpret_cast<const std::uint32_t*>(
        static_cast<const Element*>(c.p.q) + std::int64_t(max(rows.query[h], 0)) * c.p.q_row_stride + head * D);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      qf[kk][h] = rows.query[h] < 0 ? 0u : q_row[kk * 8 + lane.t4];
      qf[kk][2 + h] = rows.query[h] < 0 ? 0u : q_row[kk * 8 + 4 + lane.t4];
    }
  }
}

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

// fp8 K or V: gather stage `stage`'s bytes of one of them (rows of kRowPieces
// 16-byte pieces: K's or V's kGatherChunksPerRow) widened into the tile the
// math reads (kTileStages: one), each thread 16 bytes at a time. Where a
// row's pieces divide the threads into columns of at least 8, a thread takes
// one piece of rows kColumnThreads apart, which share both swizzles' low row
// bits: its addresses are one base and constant offsets. Else (6 and 12
// pieces: head_dim 96 and 192) step j's thread i takes item i + j threads,
// row-major by piece. Consecutive threads take one piece of consecutive rows:
// both swizzles put those in distinct banks. The caller's barrier (widened)
// publishes the tile.
template <typename Traits, int kRowPieces>
__device__ __forceinline__ void widen(const unsigned char* gathered, typename Traits::Element* tile, int stage, int tid) {
  constexpr int kTokens = Traits::kTileTokens, kThreads = Traits::kThreads;
  constexpr bool kColumns = kThreads % kRowPieces == 0 && (kThreads / kRowPieces) % 8 == 0;
  constexpr int kColumnThreads = kColumns ? kThreads / kRowPieces : kTokens;
  constexpr int kSteps = kTokens * kRowPieces / kThreads;
  static_assert(kSteps * kThreads == kTokens * kRowPieces, "whole steps of the CTA's threads");
  static_assert(Traits::kKGatherBytes == Traits::kVGatherBytes, "K's and V's fp8 stages have one layout");
  const unsigned char* from = gathered + stage * Traits::kKGatherBytes;
  const int piece = tid / kColumnThreads, row0 = tid % kColumnThreads;
  const int from0 = Traits::gather_offset(row0, piece);
  const int lo0 = Traits::swizzle(row0, 2 * piece), hi0 = Traits::swizzle(row0, 2 * piece + 1);
  // Two pieces in flight: V is widened beside S's live accumulators.
#pragma unroll 2
  for (int j = 0; j < kSteps; ++j) {
    int at, lo, hi;
    if constexpr (kColumns) {
      at = kColumnThreads % Traits::kGatherSwizzleRows == 0 ? from0 + j * kColumnThreads * Traits::kGatherRowBytes
                                                            : Traits::gather_offset(row0 + j * kColumnThreads, piece);
      lo = lo0 + j * kColumnThreads * Traits::kPanel;
      hi = hi0 + j * kColumnThreads * Traits::kPanel;
    } else {
      const int i = tid + j * kThreads, row = i % kTokens, piece_j = i / kTokens;
      at = Traits::gather_offset(row, piece_j);
      lo = Traits::swizzle(row, 2 * piece_j);
      hi = Traits::swizzle(row, 2 * piece_j + 1);
    }
    uint4 wide_lo, wide_hi;
    widen_fp8x16<typename Traits::KvStore, typename Traits::Element>(*reinterpret_cast<const uint4*>(from + at), wide_lo, wide_hi);
    *reinterpret_cast<uint4*>(tile + lo) = wide_lo;
    *reinterpret_cast<uint4*>(tile + hi) = wide_hi;
  }
}
// The widened tile for every thread of the CTA (and wgmma's async proxy).
template <typename Traits>
__device__ __forceinline__ void widened() {
#if defined(TREEATTN_WGMMA)
  if constexpr (!Traits::kSplitKV) fence_shared_for_wgmma();
#endif
  __syncthreads();
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

// Soft-capping: s = cap * tanh(s / cap) on base-2 logits (the same curve as
// on natural ones, with the cap in base 2), before the mask and the maximum.
template <typename Traits>
__device__ __forceinline__ void cap_scores(const KernelParams& p, const PassScales& scales, float (&s)[Traits::kNTiles][4]) {
  if constexpr (Traits::kOptions) {
    if (scales.cap_in == 0.0f) return;
#pragma unroll
    for (int n = 0; n < Traits::kNTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = p.softcap_log2 * tanhf(s[n][e] * scales.cap_in);
    }
  }
}

// S = Q K^T for the warp's 16 rows and its n-tiles of 8 tokens. `kv_row` is
// the lane's ldmatrix row of K (and V): matrices (tokens 0-7, chunk c),
// (tokens 8-15, c), (0-7, c + 1), (8-15, c + 1) of the warp's 16-token steps.
// `in_flight` runs while wgmma computes S (after the MMAs on mma.sync).
template <typename Traits, typename InFlight>
__device__ __forceinline__ void compute_scores(const std::uint32_t (&qf)[Traits::kHeadDim / 16][4],
                                               const typename Traits::Element* ks, const typename Traits::LaneRow& kv_row,
                                               float (&s)[Traits::kNTiles][4], const InFlight& in_flight) {
  using Element = typename Traits::Element;
  constexpr int D = Traits::kHeadDim;
#pragma unroll
  for (int n = 0; n < Traits::kNTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#if defined(TREEATTN_WGMMA)
  if constexpr (!Traits::kSplitKV) {
    // The warpgroup's 64 rows x 64 tokens, 16 dims a step: K-major B, the
    // step's 32 bytes inside its panel's 128-byte rows.
    const std::uint32_t k_base = smem_address(ks);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const std::uint32_t start = k_base + (kk >> 2) * Traits::kPanelElements * 2 + (kk & 3) * 32;
      Wgmma<Element>::template m64n64k16<0>(s, qf[kk], wgmma_descriptor(start, 16, 1024), kk > 0);
    }
    wgmma_commit();
    in_flight();
    wgmma_wait_all();
    wgmma_fence_operands(s);
  } else
#endif
  {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int n = 0; n < Traits::kNTiles; n += 2) {
        std::uint32_t b[4];  // n-tile n: b[0], b[2]; n + 1: b[1], b[3]
        ldmatrix_x4(b, ks + n * 8 * Traits::kPanel + kv_row.pair(kk));
        Mma<Element>::run(s[n], qf[kk], b[0], b[2]);
        Mma<Element>::run(s[n + 1], qf[kk], b[1], b[3]);
      }
    }
    in_flight();
  }
}

// -inf for the scores of tokens a row does not see. The row's word of the
// tile's visibility, shifted to the thread's first token (`first_bit`), holds
// every token it tests at a constant bit: one LOP3 per score.
template <typename Traits>
__device__ __forceinline__ void mask_invisible(const TileMap& map, const int (&tile_query)[2], int first_bit,
                                               float (&s)[Traits::kNTiles][4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const std::uint64_t seen = map.visible[tile_query[h]] >> first_bit;
#pragma unroll
    for (int n = 0; n < Traits::kNTiles; ++n) {
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        if (((seen >> (n * 8 + b)) & 1) == 0) s[n][2 * h + b] = TREEATTN_NEG_INF;
      }
    }
  }
}

// The online softmax of the thread's two rows, in base 2:
// p = 2^(s * scale_log2 - max * scale_log2). row_max holds the maxima of the
// raw scores Q K^T (the softmax scale is positive, so it is applied inside the
// exponent's FFMA instead of to every score); row_sum the thread's share of
// the sums until softmax_finish. The pass keeps them as two arrays of its own:
// a struct of the four compiles to another register assignment.
//
// softmax_update takes a tile's masked scores: it rescales the rows' sums and
// O to the new maxima and turns the scores into P. kSkipUnchanged: a warp whose
// rows all keep their maxima leaves O as it is (the factors are exactly 1), a
// branch that saves the fp8 kernels head_dim / 2 multiplies a thread and tile.
template <bool kSkipUnchanged = false, int kNTiles, int kAccTiles>
__device__ __forceinline__ void softmax_update(float (&row_max)[2], float (&row_sum)[2], float (&s)[kNTiles][4],
                                               float (&acc)[kAccTiles][4], float exp_scale) {
  // The row maxima as trees: S -> max -> exponents -> P V is the tile's
  // critical path, and a chain of 2 * kNTiles dependent FMNMX would be its
  // longest link.
  float tile_max[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) tile_max[h] = tree_reduce<kNTiles>([&](int n) { return fmaxf(s[n][2 * h], s[n][2 * h + 1]); }, [](float a, float b) { return fmaxf(a, b); });
  float correction[2], neg_reference[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
    const float new_max = fmaxf(row_max[h], tile_max[h]);
    // A row that has seen nothing yet keeps -inf: shift by 0 instead (no NaN).
    neg_reference[h] = new_max == TREEATTN_NEG_INF ? 0.0f : -new_max * exp_scale;
    // Exactly 1 while the maximum holds: the FFMA would leave the product's
    // rounding error, and compounding it over a long block drifts the weights.
    correction[h] = new_max == row_max[h] ? 1.0f : exp2_ftz(fmaf(row_max[h], exp_scale, neg_reference[h]));
    row_max[h] = new_max;
    row_sum[h] *= correction[h];
  }
  if (!kSkipUnchanged || __any_sync(0xffffffffu, correction[0] != 1.0f || correction[1] != 1.0f)) {
#pragma unroll
    for (int n = 0; n < kAccTiles; ++n) {
      acc[n][0] *= correction[0];
      acc[n][1] *= correction[0];
      acc[n][2] *= correction[1];
      acc[n][3] *= correction[1];
    }
  }
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[n][e] = exp2_ftz(fmaf(s[n][e], exp_scale, neg_reference[e / 2]));
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) row_sum[h] += tree_reduce<kNTiles>([&](int n) { return s[n][2 * h] + s[n][2 * h + 1]; }, [](float a, float b) { return a + b; });
}

// After the last tile: the rows' sums over their quads, maxima in base-2 units.
__device__ __forceinline__ void softmax_finish(float (&row_max)[2], float (&row_sum)[2], float exp_scale) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 1);
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 2);
    row_max[h] *= exp_scale;  // -inf stays -inf
  }
}

// O += P V: P's accumulators become A fragments (16 tokens per k-step).
// `in_flight` runs while wgmma computes it (after the MMAs on mma.sync).
template <typename Traits, typename InFlight>
__device__ __forceinline__ void accumulate_pv(const float (&s)[Traits::kNTiles][4], const typename Traits::Element* vs,
                                              const typename Traits::LaneRow& kv_row, float (&acc)[Traits::kAccTiles][4],
                                              const InFlight& in_flight) {
  using Element = typename Traits::Element;
  constexpr int D = Traits::kHeadDimV;
  constexpr int kKSteps = Traits::kKSteps;
  std::uint32_t pf[kKSteps][4];
#pragma unroll
  for (int j = 0; j < kKSteps; ++j) {
    pf[j][0] = Mma<Element>::pack(s[2 * j][0], s[2 * j][1]);
    pf[j][1] = Mma<Element>::pack(s[2 * j][2], s[2 * j][3]);
    pf[j][2] = Mma<Element>::pack(s[2 * j + 1][0], s[2 * j + 1][1]);
    pf[j][3] = Mma<Element>::pack(s[2 * j + 1][2], s[2 * j + 1][3]);
  }
#if defined(TREEATTN_WGMMA)
  if constexpr (!Traits::kSplitKV) {
    // MN-major (transposed) B: a step's 16 tokens are two 8-row groups of
    // every panel; one instruction spans two panels (128 dims). Its columns
    // are the accumulator's: V's panels (kAccDim).
    constexpr int kAccDim = Traits::kAccDim;
    const std::uint32_t v_base = smem_address(vs);
    constexpr int kPanelBytes = Traits::kPanelElements * 2;
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < kKSteps; ++j) {
      const std::uint32_t start = v_base + j * 2048;
      if constexpr (kAccDim == 64) {
        Wgmma<Element>::template m64n64k16<1>(acc, pf[j], wgmma_descriptor(start, kPanelBytes, 1024), true);
      } else {
#pragma unroll
        for (int h = 0; h < kAccDim / 128; ++h) {
          auto& acc_half = *reinterpret_cast<float(*)[16][4]>(&acc[16 * h]);
          Wgmma<Element>::template m64n128k16<1>(acc_half, pf[j], wgmma_descriptor(start + 2 * h * kPanelBytes, kPanelBytes, 1024), true);
        }
      }
    }
    wgmma_commit();
    in_flight();
    wgmma_wait_all();
    wgmma_fence_operands(acc);
  } else
#endif
  {
#pragma unroll
    for (int j = 0; j < kKSteps; ++j) {
#pragma unroll
      for (int n = 0; n < D / 8; n += 2) {
        std::uint32_t b[4];
        ldmatrix_x4_trans(b, vs + j * 16 * Traits::kPanel + kv_row.pair(n / 2));
        Mma<Element>::run(acc[n], pf[j], b[0], b[1]);
        Mma<Element>::run(acc[n + 1], pf[j], b[2], b[3]);
      }
    }
    in_flight();
  }
}

// Where row `row` of the pass goes: the query's O and LSE when this item is its
// only one, else its partial slot (looked up once per row, not per element).
struct RowDest {
  std::int64_t out;    // the row's first element in O (strided rows) or in the partials
  std::int32_t index;  // (query or partial) * heads_q + head: its element of LSE or of the partial LSEs
  bool direct;
};
static_assert(sizeof(RowDest) == 16, "the split-KV path keeps 16 of them in shared memory (AttnTraits::kMergeBytes)");

template <typename Traits>
__device__ __forceinline__ RowDest make_dest(const KernelParams& p, std::int32_t target, int head, bool direct) {
  const std::int32_t index = target * p.heads_q + head;
  return RowDest{direct ? std::int64_t(target) * p.o_row_stride + head * Traits::kHeadDimV : std::int64_t(index) * Traits::kHeadDimV, index, direct};
}
template <typename Traits>
__device__ __forceinline__ RowDest row_dest(const PassContext& c, int row) {
  const int entry = c.q0 + (c.row0 + row) / c.p.group;
  const int partial = c.p.tile_partial[entry];
  const bool direct = partial == kDirectWrite;
  return make_dest<Traits>(c.p, direct ? c.p.tile_query[entry] : partial, row_head(c, c.row0 + row), direct);
}
__device__ __forceinline__ void write_lse(const KernelParams& p, const RowDest& d, float lse) {
  if (!d.direct) p.partial_lse[d.index] = lse;
  else if (p.lse != nullptr) p.lse[d.index] = lse;
}
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kLog2e = 1.4426950408889634f;

// A finished row's softmax, base 2: O = acc * rescale / denom, LSE = (max2 *
// max_scale + log2 denom) ln 2, from the row's maximum and its sum of
// 2^(logit - maximum). max_scale 0: max2 is a base-2 logit already. With
// options, a row written directly (the query's only item) takes its head's
// sink into the denominator and the LSE; a partial's sink joins in the merge.
//
// A 64-row pass's rows keep the raw maximum of their scores (max_scale: the
// softmax scale): the plain kernel scales it and adds the log, which ptxas
// fuses into one FMA, and the LSE of a call without sinks is then the plain
// kernel's bit for bit (a row with a sink uses the scaled maximum twice).
struct RowEnd {
  float rescale, max2, max_scale, denom;
  __device__ __forceinline__ float lse() const {
    return (max_scale == 0.0f ? max2 + __log2f(denom) : fmaf(max2, max_scale, __log2f(denom))) * kLn2;
  }
};
template <bool kOptions>
__device__ __forceinline__ RowEnd end_row(const KernelParams& p, bool direct, int head, float max2, float max_scale,
                                          float sum) {
  RowEnd e{1.0f, max2, max_scale, sum};
  if constexpr (kOptions) {
    if (direct && p.sinks != nullptr) {
      const float scaled = max_scale == 0.0f ? max2 : max2 * max_scale;
      const float sink2 = p.sinks[head] * kLog2e;
      e.max2 = fmaxf(scaled, sink2);
      e.max_scale = 0.0f;
      e.rescale = exp2f(scaled - e.max2);
      e.denom = sum * e.rescale + exp2f(sink2 - e.max2);
    }
  }
  return e;
}

// The epilogue of a 64-row pass: each of the thread's rows normalised into
// its partial (kept in L2 for the merge) or straight into O, and its LSE.
template <typename Traits>
__device__ __forceinline__ void write_thread_rows(const PassContext& c, const PassLane<Traits>& lane, const ThreadRows& rows,
                                                  const PassScales& scales, const float (&row_max)[2],
                                                  const float (&row_sum)[2], const float (&acc)[Traits::kAccTiles][4]) {
  constexpr int D = Traits::kHeadDimV;
  const KernelParams& p = c.p;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (lane.row(c, h) >= c.row_end) continue;
    const int head = row_head(c, lane.row(c, h));
    const bool direct = rows.target[h] < 0;
    const RowDest d = make_dest<Traits>(p, direct ? -2 - rows.target[h] : rows.target[h], head, direct);
    const RowEnd e = end_row<Traits::kOptions>(p, direct, head, row_max[h], Traits::kOptions ? scales.exp_scale : 0.0f, row_sum[h]);
    const float inv = e.rescale / e.denom * scales.out_scale;
    if (d.direct) {
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        store_out_pair(p.o, p.out_type, d.out + n * 8 + lane.t4 * 2, acc[n][2 * h] * inv, acc[n][2 * h + 1] * inv);
      }
    } else {
      float* out = p.partial_o + d.out;
      const std::uint64_t keep = l2_keep_policy();
#pragma unroll
      for (int n = 0; n < D / 8; ++n) store_partial2(out + n * 8 + lane.t4 * 2, acc[n][2 * h] * inv, acc[n][2 * h + 1] * inv, keep);
    }
    if (lane.t4 == 0) write_lse(p, d, e.lse());
  }
}

// The epilogue of a split-KV pass: the four warps' states for its (at most)
// 16 rows merged in shared memory (the tiles are free now) — each warp's
// unnormalised O, row maxima and row sums — then written as a 64-row pass
// writes them.
template <typename Traits>
__device__ __forceinline__ void merge_warps_and_write(const PassContext& c, const PassLane<Traits>& lane,
                                                      const PassScales& scales, const float (&row_max)[2], const float (&row_sum)[2],
                                                      const float (&acc)[Traits::kAccTiles][4]) {
  constexpr int D = Traits::kHeadDimV;
  constexpr int kAccStride = Traits::kMergeAccStride;
  const KernelParams& p = c.p;
  const int tid = lane.tid, warp = lane.warp, g = lane.g, t4 = lane.t4;
  float* red_acc = reinterpret_cast<float*>(smem);              // [4][16][kAccStride]
  float* red_max = red_acc + Traits::kWarps * 16 * kAccStride;  // [4][16]
  float* red_sum = red_max + Traits::kWarps * 16;               // [4][16], then each warp's row weight
  if constexpr (Traits::kKvInRegisters) {
    // O's columns in dim order (Fp8Fragments::o_dim): the thread's dims of
    // n-tiles n and n + 1 are adjacent, stored at the dim XOR 2 t4 so that a
    // half-warp's stores fall in distinct banks (undone when read below).
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int dim = Fp8Fragments<Traits>::o_dim(n, 2 * t4 + e % 2) ^ (2 * t4);
        *reinterpret_cast<float2*>(red_acc + (warp * 16 + g + (e / 2) * 8) * kAccStride + dim) = make_float2(acc[n][e], acc[n + 1][e]);
      }
    }
  } else {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        *reinterpret_cast<float2*>(red_acc + (warp * 16 + g + h * 8) * kAccStride + n * 8 + t4 * 2) =
            make_float2(acc[n][2 * h], acc[n][2 * h + 1]);
      }
    }
  }
  if (t4 == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      red_max[warp * 16 + g + h * 8] = row_max[h];
      red_sum[warp * 16 + g + h * 8] = row_sum[h];
    }
  }
  RowDest* dests = reinterpret_cast<RowDest*>(red_sum + Traits::kWarps * 16);  // [16]
  const int rows_here = min(16, c.row_end - c.row0);
  const RowDest my_dest = tid < rows_here ? row_dest<Traits>(c, tid) : RowDest{0, 0, false};  // in flight over the barrier
  __syncthreads();
  // One thread per row: the row's log-sum-exp, its destination, and each
  // warp's weight exp2(max_w - max) / sum (in place of the warp's row sum).
  if (tid < rows_here) {
    float m = TREEATTN_NEG_INF;
#pragma unroll
    for (int w = 0; w < Traits::kWarps; ++w) m = fmaxf(m, red_max[w * 16 + tid]);
    const float ref = m == TREEATTN_NEG_INF ? 0.0f : m;
    float f[Traits::kWarps], sum = 0.0f;
#pragma unroll
    for (int w = 0; w < Traits::kWarps; ++w) {
      f[w] = exp2_ftz(red_max[w * 16 + tid] - ref);
      sum += red_sum[w * 16 + tid] * f[w];
    }
    const RowEnd e = end_row<Traits::kOptions>(p, my_dest.direct, row_head(c, c.row0 + tid), m, 0.0f, sum);
#pragma unroll
    for (int w = 0; w < Traits::kWarps; ++w) {
      red_sum[w * 16 + tid] = Traits::kOptions ? f[w] * e.rescale / e.denom * scales.out_scale : f[w] / sum;
    }
    dests[tid] = my_dest;
    write_lse(p, my_dest, e.lse());
  }
  __syncthreads();
  // Four adjacent channels per thread and step.
  const std::uint64_t keep = l2_keep_policy();
  for (int i = tid; i < rows_here * D / 4; i += Traits::kThreads) {
    const int row = i / (D / 4), col = i % (D / 4) * 4;
    // fp8 in registers: dims col .. col + 3 were stored XOR 2 t4, t4 = col / (D / 4).
    const int t4_of_col = Traits::kKvInRegisters ? col / (D / 4) : 0;
    const int at = Traits::kKvInRegisters ? col ^ ((t4_of_col & 2) << 1) : col;
    float4 value = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < Traits::kWarps; ++w) {
      const float f = red_sum[w * 16 + row];
      const float4 a = *reinterpret_cast<const float4*>(red_acc + (w * 16 + row) * kAccStride + at);
      value.x += a.x * f;
      value.y += a.y * f;
      value.z += a.z * f;
      value.w += a.w * f;
    }
    if (Traits::kKvInRegisters && (t4_of_col & 1) != 0) value = make_float4(value.z, value.w, value.x, value.y);
    const RowDest d = dests[row];
    if (d.direct) {
      store_out_pair(p.o, p.out_type, d.out + col, value.x, value.y);
      store_out_pair(p.o, p.out_type, d.out + col + 2, value.z, value.w);
    } else {
      store_partial4(p.partial_o + d.out + col, value, keep);
    }
  }
}

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
      softmax_update<Traits::kWidened>(row_max, row_sum, s, acc, exp_scale());
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
      softmax_update<Traits::kWidened>(row_max, row_sum, s, acc, exp_scale());
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
  softmax_finish(row_max, row_sum, Traits::kOptions && !Traits::kSplitKV ? 1.0f : exp_scale());
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
  // the KV tile among the warps instead of giving three of them padding rows.
  if (info.row_end - info.row_begin <= 16) attend_pass<PassTraits<Traits, true>>(ctx);
  else attend_pass<PassTraits<Traits, false>>(ctx);
}

// Stage 2: the log-sum-exp merge of a query's partials, in the plan's order.
// One warp per (query, query head), kMergeWarps to a CTA, each lane owning
// head_dim_v / 32 adjacent channels (one 16-byte load per partial at head_dim_v
// 128; three 4-byte loads at 96). The warp reads 32 partials' LSEs at a time (the query's slots are
// merge_begin's range itself: KernelParams), one per lane,
// takes their maximum with shuffles, and then every lane folds the partials in
// CSR order with a running max, so the merge is one pass and deterministic; the
// loads of kBatch partials are in flight together (the merge is latency-bound).
// Plans whose queries merge at most kMergeLeanBatch partials take that batch:
// half the registers in flight, so ten CTAs fit on an SM instead of eight (at
// head_dim <= 128), and no query needs a second round trip. The full batch is
// capped for eight CTAs (64 registers).
constexpr int kMergeWarps = 4;
constexpr int kMergeBatch = 8;
template <int HeadDimV, int kBatch>
constexpr int merge_min_blocks() {
  if (HeadDimV > 128) return 1;
  return kBatch <= kMergeLeanBatch ? 10 : 8;
}

// kSinks: the call's sinks (KernelParams::sinks) join each query's
// denominator and LSE once, after its partials.
template <int HeadDimV, int kBatch, bool kSinks>
__global__ void __launch_bounds__(kMergeWarps * 32, merge_min_blocks<HeadDimV, kBatch>()) tree_attn_merge_kernel(const __grid_constant__ KernelParams p) {
  constexpr int kChannels = HeadDimV / 32;  // per lane: 2, 3, 4 or 8
  const int lane = threadIdx.x % 32;
  const std::int64_t pair = std::int64_t(blockIdx.x) * kMergeWarps + threadIdx.x / 32;
  if (pair >= std::int64_t(p.max_queries) * p.heads_q) return;
  const int query = int(pair / p.heads_q), head = int(pair % p.heads_q);
  const int m0 = p.merge_begin[query], m1 = p.merge_begin[query + 1];
  if (m0 == m1) return;  // written directly by stage 1, or past the plan's queries

  float max_lse = TREEATTN_NEG_INF, sum = 0.0f, acc[kChannels];
#pragma unroll
  for (int c = 0; c < kChannels; ++c) acc[c] = 0.0f;
  for (int c0 = m0; c0 < m1; c0 += 32) {
    const int n = min(32, m1 - c0);
    int my_slot = 0;
    float my_lse = TREEATTN_NEG_INF;
    if (lane < n) {
      my_slot = c0 + lane;
      my_lse = p.partial_lse[std::int64_t(my_slot) * p.heads_q + head];
    }
    // kBatch partials' loads go out before any of them is summed: one
    // dependent round trip per batch instead of one per partial. The first
    // batch leaves beside the LSEs, before their maximum is known.
    float v[kBatch][kChannels];
    auto load_batch = [&](int i0) {
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int slot = __shfl_sync(0xffffffffu, my_slot, (i0 + j) % 32);
        const float* src = p.partial_o + (std::int64_t(slot) * p.heads_q + head) * HeadDimV + lane * kChannels;
        if constexpr (kChannels % 2 == 0) {
#pragma unroll
          for (int c = 0; c < kChannels; c += 2) {
            const float2 two = i0 + j < n ? *reinterpret_cast<const float2*>(src + c) : make_float2(0.0f, 0.0f);
            v[j][c] = two.x;
            v[j][c + 1] = two.y;
          }
        } else {
#pragma unroll
          for (int c = 0; c < kChannels; ++c) v[j][c] = i0 + j < n ? src[c] : 0.0f;
        }
      }
    };
    load_batch(0);
    float chunk_max = my_lse;
#pragma unroll
    for (int o = 16; o > 0; o /= 2) chunk_max = fmaxf(chunk_max, __shfl_xor_sync(0xffffffffu, chunk_max, o));
    const float new_max = fmaxf(max_lse, chunk_max);
    const float rescale = __expf(max_lse - new_max);  // 0 on the first chunk
    sum *= rescale;
#pragma unroll
    for (int c = 0; c < kChannels; ++c) acc[c] *= rescale;
    max_lse = new_max;
    const float my_weight = __expf(my_lse - max_lse);
    for (int i0 = 0; i0 < n; i0 += kBatch) {
      if (i0 > 0) load_batch(i0);
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const float w = __shfl_sync(0xffffffffu, my_weight, (i0 + j) % 32);
        if (i0 + j >= n) break;
        sum += w;
#pragma unroll
        for (int c = 0; c < kChannels; ++c) acc[c] += w * v[j][c];
      }
    }
  }
  if constexpr (kSinks) {
    const float sink = p.sinks[head];
    const float m = fmaxf(max_lse, sink);
    const float rescale = __expf(max_lse - m);
    sum = sum * rescale + __expf(sink - m);
#pragma unroll
    for (int c = 0; c < kChannels; ++c) acc[c] *= rescale;
    max_lse = m;
  }
  const std::int64_t out = std::int64_t(query) * p.o_row_stride + head * HeadDimV + lane * kChannels;
  store_out_channels<kChannels>(p.o, p.out_type, out, [&](int c) { return acc[c] / sum; });
  if (p.lse != nullptr && lane == 0) p.lse[std::int64_t(query) * p.heads_q + head] = max_lse + __logf(sum);
}

}  // namespace treeattn::cuda
