#pragma once
// Tile shapes and shared-memory layout of the stage-1 kernel, one place for
// all of them (the kernel body reads only Traits:: members).

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "attn_launch.hpp"
#include "wgmma.cuh"  // TREEATTN_WGMMA: this compilation has wgmma

namespace treeattn::cuda {

// KvStore_ is how the KV pool holds K and V: Element_, or fp8
// (__nv_fp8_e4m3, __nv_fp8_e5m2) gathered as bytes and widened to Element_ in
// shared memory before the math. Options_ compiles in the call's attention
// variants (soft-cap, sinks, fp8 scales; KernelParams): the plain kernel has
// none of their code. HeadDim_ is Q's and K's width, HeadDimV_ V's and O's
// (192 / 128: DeepSeek-V3 without absorption).
template <int HeadDim_, typename Element_, typename KvStore_ = Element_, bool Options_ = false, int HeadDimV_ = HeadDim_>
struct AttnTraits {
  using Element = Element_;                  // __half or __nv_bfloat16
  using KvStore = KvStore_;
  static constexpr bool kWidened = !std::is_same_v<KvStore, Element>;
  static constexpr bool kOptions = Options_;
  static_assert(kOptions || !kWidened, "fp8 K and V take their scales from the options");
  static constexpr int kHeadDim = HeadDim_;    // Q fragments, K tiles, S = Q K^T
  static constexpr int kHeadDimV = HeadDimV_;  // V tiles, O's accumulators, partials, O
  static constexpr bool kSplitDims = kHeadDimV != kHeadDim;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRows = kWarps * 16;  // query rows (query x head) per pass: 16 per warp
  static constexpr int kTileTokens = treeattn::cuda::kTileTokens;  // KV tokens per shared-memory tile
  static_assert(kRows == kRowsPerPass, "a CTA takes the rows of one pass of a large tile");
  // Stages in flight: the next tile's gather overlaps this tile's math. Three
  // or four cost a CTA an SM each (H100: 0.955x, 0.81x; docs/performance.md).
  // At head_dim 256 one stage keeps the kernel inside the A100's 164 KB of
  // shared memory.
  static constexpr int kStages = HeadDim_ <= 128 ? 2 : 1;
  static_assert(kHeadDim % 32 == 0 && kHeadDimV % 32 == 0 && kHeadDimV <= kHeadDim,
                "rows of whole 16-byte chunks of fp8; V no wider than K (its gather rides on K's)");
  // cp.async chunks of a pool row of K and of V.
  static constexpr int kGatherChunksPerRow = kHeadDim * int(sizeof(KvStore)) / 16;
  static constexpr int kGatherChunksPerRowV = kHeadDimV * int(sizeof(KvStore)) / 16;

  // Element offset of 16-byte chunk `chunk` of row `row` in a 64-row K or V
  // tile: panels of [64 rows][64 elements] (chunk / 8 picks the panel), rows of
  // 128 bytes whose chunks are XOR-swizzled by the row's low three bits — the
  // 128-byte swizzle wgmma reads (wgmma.cuh), and the eight rows an ldmatrix
  // reads land in distinct banks. Rows are unpadded, so a gathered row's
  // cp.async chunks fill whole shared-memory lines (16-byte padded rows would
  // split every 128-byte piece across two lines: 1.5x the bytes asked of L2).
  // A head dim that is not a multiple of 64 (96) fills its last panel in part:
  // the tile is padded to whole panels (the swizzle spreads a row's chunks over
  // all eight slots), and chunks past the row are never written.
  static constexpr int kPanel = 64;                  // elements per panel row
  static constexpr int kPanelElements = 64 * kPanel;  // 8 KB, 1024-byte aligned
  static constexpr int kKTileDim = (kHeadDim + kPanel - 1) / kPanel * kPanel;    // K's columns padded to panels
  static constexpr int kVTileDim = (kHeadDimV + kPanel - 1) / kPanel * kPanel;  // V's
  static_assert(kRows == 64 && kTileTokens == 64, "tiles are 64 rows of panels");
  __device__ __forceinline__ static int swizzle(int row, int chunk) {
    return (chunk >> 3) * kPanelElements + row * kPanel + (((chunk & 7) ^ (row & 7)) << 3);
  }
  // A lane's row address for ldmatrix, whose chunks it reads in pairs (2p + hi):
  // the offsets of chunks hi, 2 + hi, 4 + hi and 6 + hi of its row. Chunk
  // 2p + hi is then off[p % 4] plus p / 4 panels, and a row 8k further is
  // 8k * kPanel elements further (same low bits): compile-time offsets, four
  // registers.
  struct LaneRow {
    int off[4];
    __device__ __forceinline__ int pair(int p) const { return off[p & 3] + (p >> 2) * kPanelElements; }
  };
  __device__ __forceinline__ static LaneRow lane_row(int row, int hi) {
    LaneRow r;
#pragma unroll
    for (int j = 0; j < 4; ++j) r.off[j] = swizzle(row, 2 * j + hi);
    return r;
  }

  // Byte offset of gathered chunk `chunk` of row `row` in a gather stage: the
  // tile itself, or fp8 rows of bytes in their own stage, their chunks
  // XOR-swizzled by the row's low bits so that widen's reads of one
  // chunk of consecutive rows fall in distinct banks. The XOR stays inside
  // groups of kFp8SwizzleGroup chunks (the largest power of two dividing a row's
  // chunk count: all of them, or 2 at head_dim 96 and 4 at 192), so every
  // chunk stays in its row. V's fp8 stage has K's rows (V's chunks are a
  // multiple of K's groups: 8 beside 12 at 192 / 128), so one offset serves both.
  static constexpr int kFp8SwizzleGroup = kGatherChunksPerRow & -kGatherChunksPerRow;
  static_assert(!kWidened || kGatherChunksPerRowV % kFp8SwizzleGroup == 0, "V's chunks fill K's swizzle groups");
  __device__ __forceinline__ static int gather_offset(int row, int chunk) {
    if constexpr (kWidened) return row * kHeadDim + ((chunk ^ (row & (kFp8SwizzleGroup - 1))) << 4);
    else return 2 * swizzle(row, chunk);
  }
  // Rows this many apart share their swizzle, and are kGatherRowBytes apart per row.
  static constexpr int kGatherSwizzleRows = kWidened ? kFp8SwizzleGroup : 8;
  static constexpr int kGatherRowBytes = kWidened ? kHeadDim : kPanel * 2;

  // The cp.async gather: each thread copies one 16-byte chunk column of a
  // tile (chunk tid % kGatherChunksPerRow) from rows kGatherRowStep apart, in
  // batches of kGatherBatch rows whose slots are all read before their copies.
  // Eight rows a batch is a whole tile at head_dim 128 (sixteen at 256 would
  // spill); two run 0.97x in the mma.sync build (benchmarks/h100/mma_sync_build.json).
  // The row step is a power of two (it divides the tile): where a row's chunks
  // do not divide the threads (head_dim 96 and 192), the first kGatherThreads
  // threads copy and the others idle. V's chunk columns are the first
  // kGatherChunksPerRowV of K's, through the same rows.
  static constexpr int kGatherRowStep = [] {
    int step = 1;
    while (2 * step * kGatherChunksPerRow <= kThreads) step *= 2;
    return step;
  }();
  static constexpr int kGatherThreads = kGatherRowStep * kGatherChunksPerRow;
  static constexpr int kGatherRows = kTileTokens / kGatherRowStep;  // rows a thread copies per tile
  static constexpr int kGatherBatch = std::min(8, kGatherRows);
  static_assert(kGatherRows % kGatherBatch == 0, "whole batches of rows");
  static constexpr int kMapChunks = int(sizeof(TileMap)) / 16;  // 16-byte pieces of a tile map
  static_assert(kMapChunks <= kThreads, "one map piece per thread");

  // Shared memory: K and V tiles first (each a multiple of 8 KB from the
  // 1024-byte aligned start, as the swizzle needs), then a ring of token maps.
  // Q has none: each thread loads its A fragments straight into registers.
  // fp8 K and V land in kStages gather stages of bytes after the tiles, and
  // are widened into one tile of each for a tile's math (widen): the
  // same shared memory as two stages of f16 tiles.
  static constexpr int kKTileBytes = kTileTokens * kKTileDim * 2;
  static constexpr int kVTileBytes = kTileTokens * kVTileDim * 2;
  static constexpr int kTileStages = kWidened ? 1 : kStages;
  // One gather stage of K and of V: the tile, or fp8 rows of K's width.
  static constexpr int kKGatherBytes = kWidened ? kTileTokens * kHeadDim : kKTileBytes;
  static constexpr int kVGatherBytes = kWidened ? kTileTokens * kHeadDim : kVTileBytes;
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKOffset + kTileStages * kKTileBytes;
  static constexpr int kKGatherOffset = kWidened ? kVOffset + kVTileBytes : kKOffset;
  static constexpr int kVGatherOffset = kWidened ? kKGatherOffset + kStages * kKGatherBytes : kVOffset;
  // The tiles' elements of gather stage `stage` that the math reads.
  __device__ __forceinline__ static int k_tile(int stage) { return (kWidened ? 0 : stage) * (kKTileBytes / 2); }
  __device__ __forceinline__ static int v_tile(int stage) { return (kWidened ? 0 : stage) * (kVTileBytes / 2); }
  // Each tile's token map (slot and mask per token) arrives kStages tiles ahead
  // of its K/V gather, which needs the slots: 2 * kStages maps are live at once
  // (the one being masked, kStages - 1 whose gathers are queued, kStages arriving).
  static constexpr int kMapStages = 2 * kStages;
  static constexpr int kMapOffset = kVGatherOffset + kStages * kVGatherBytes;  // TileMap ring
  // A split-KV pass over fp8 K and V reads them from the gathered bytes
  // (PassTraits::kKvInRegisters) and no tile: its gather stages take all of
  // the tiles' and stages' shared memory, K's then V's, and its map ring
  // follows. Four stages at head_dim <= 128, so as many bytes are in flight
  // as in two f16 stages: a split-KV pass does little math per tile and waits
  // on its gathers.
  static constexpr int kSplitStages = (kMapOffset - kKOffset) / (kKGatherBytes + kVGatherBytes);
  static constexpr int kSplitMapOffset = kSplitStages * (kKGatherBytes + kVGatherBytes);
  // The split-KV merge reuses the tiles and maps for every warp's 16 x
  // head_dim_v accumulators (rows padded by 8 floats, so a half-warp's float2
  // stores of 4 rows x 4 lanes fall in distinct banks), their row maxima and
  // sums, and 16 row destinations: at head_dim 256 (one stage) a little more
  // than they hold.
  static constexpr int kMergeAccStride = kHeadDimV + 8;
  static constexpr int kMergeBytes = kWarps * 16 * (kMergeAccStride + 2) * 4 + 16 * 16;
  static constexpr int kSmemBytes = std::max({kMapOffset + kMapStages * int(sizeof(TileMap)),
                                              kSplitMapOffset + 2 * kSplitStages * int(sizeof(TileMap)), kMergeBytes});
  // CTAs per SM the registers are capped for. With wgmma three: 170
  // registers, of which the kernel takes 165 (capped for two it takes 183 and
  // runs 0.97-0.99x). The mma.sync build's fragments need more: capped for
  // three it spills at head_dim 128, capped for two it takes 209 registers
  // without spills and runs 1.19x faster even on the H100, where three CTAs
  // fit (benchmarks/h100/mma_sync_build.json); the A100's 164 KB of shared
  // memory holds only two of these 67 KB CTAs anyway.
#if defined(TREEATTN_WGMMA)
  static constexpr int kMinBlocksPerSM = kStages == 2 ? 3 : kStages == 3 ? 2 : 1;
#else
  static constexpr int kMinBlocksPerSM = kStages >= 2 ? 2 : 1;
#endif
};

// One stage-1 pass's shapes: AttnTraits plus how the four warps share a tile.
// A 64-row pass (SplitKV_ false): warp w owns rows 16w..16w+15 and every
// token of a tile. A pass of at most 16 rows (true): every warp owns rows
// 0..15 and tokens 16w..16w+15 of each tile, and the warps' softmax states are
// merged in shared memory at the end.
// fp8 K and V: a 64-row pass widens each tile into shared memory once for the
// four warps (wgmma reads B there); a split-KV pass, whose warps read disjoint
// tokens, widens its fragments in registers (fp8_fragments.cuh).
template <typename Base, bool SplitKV_, bool HalfRows_ = false>
struct PassTraits : Base {
  static constexpr bool kSplitKV = SplitKV_;
  static constexpr bool kWidenInShared = Base::kWidened && !kSplitKV;
  static constexpr bool kKvInRegisters = Base::kWidened && kSplitKV;
  // A split-KV pass of at most 8 rows (a decode step's one or two queries of
  // a GQA group of 4, or one of 8): every fragment's rows g + 8 are padding,
  // so the pass neither masks nor exponentiates them, nor rescales their O,
  // nor merges them. fp8 only: there the pass is bound by its instructions,
  // while the f16 split-KV passes wait on HBM.
  static constexpr bool kHalfRows = HalfRows_;
  static_assert(!kHalfRows || kKvInRegisters, "half-row passes are fp8 split-KV passes");
  static constexpr int kRowHalves = kHalfRows ? 1 : 2;  // the fragments' row halves a thread computes: rows g, g + 8
  // Gather stages and the shared-memory layout (AttnTraits: kSplitStages).
  static constexpr int kStages = kKvInRegisters ? Base::kSplitStages : Base::kStages;
  static constexpr int kMapStages = 2 * kStages;
  static constexpr int kKGatherOffset = kKvInRegisters ? 0 : Base::kKGatherOffset;
  static constexpr int kVGatherOffset = kKvInRegisters ? kStages * Base::kKGatherBytes : Base::kVGatherOffset;
  static constexpr int kMapOffset = kKvInRegisters ? Base::kSplitMapOffset : Base::kMapOffset;
  static constexpr int kWarpTokens = kSplitKV ? Base::kTileTokens / Base::kWarps : Base::kTileTokens;
  static constexpr int kNTiles = kWarpTokens / 8;   // 8-token n-tiles of S per warp and tile
  static constexpr int kKSteps = kWarpTokens / 16;  // 16-token k-steps of P V per warp and tile
  // O's accumulator columns: head_dim_v, or with wgmma whole panels of V (96:
  // 128, one m64n128k16 whose last 32 columns, from the tile's padding, are
  // never written out), since its 128-byte swizzle spans whole panels.
#if defined(TREEATTN_WGMMA)
  static constexpr int kAccDim = kSplitKV ? Base::kHeadDimV : Base::kVTileDim;
#else
  static constexpr int kAccDim = Base::kHeadDimV;
#endif
  static constexpr int kAccTiles = kAccDim / 8;  // 8-column n-tiles of O
};

}  // namespace treeattn::cuda
