#pragma once
// The flat parameter block of the CUDA kernels: device pointers to the Plan's
// arrays (uploaded verbatim) and to the tensors, plus sizes. Plain C++ so the
// host backend fills it and the kernels take it by value (__grid_constant__).

#include <cstdint>

namespace treeattn::cuda {

// The merge's lean variant takes a query's partials four at a time (half the
// registers in flight, more CTAs an SM): launched for plans whose queries
// merge at most that many (attn_merge.cuh, tree_attn_merge_kernel).
inline constexpr int kMergeLeanBatch = 4;

// The elements of Q, K and V and, separately, of O. K and V are Q's type, or
// fp8 beside f16 or bf16 Q (DESIGN.md §8).
enum class ElementType : std::int32_t { f16 = 0, bf16 = 1, f32 = 2, fp8_e4m3 = 3, fp8_e5m2 = 4 };

// The token map of one 64-token KV tile of a work item: each token's KV-pool
// slot, and for each of the item's tile queries the tokens it sees (bit k of
// visible[j] <=> tile query j sees token k) -- query-major, the transpose of
// the plan's per-token masks, so a thread's row needs one word per tile, not
// one per token. Tokens past the item's end are seen by none and repeat its
// last slot: their scores are masked and their P is exactly 0 against a V row
// the item reads anyway, where another slot of the pool could hold NaN.
// 768 bytes: a CTA copies it in 48 16-byte pieces.
inline constexpr int kTileTokens = 64;
struct TileMap {
  std::int32_t slot[kTileTokens];
  std::uint64_t visible[kTileTokens];
};
static_assert(sizeof(TileMap) % 16 == 0, "tile maps are copied in 16-byte pieces");

// Where one tile's TileMap comes from: Workspace::upload writes this small
// record per tile beside the plan's token and segment arrays, and the upload
// kernel (launch_upload_plan) builds the TileMaps from them on the device, so
// the host neither builds nor copies 768 bytes per tile each step.
struct alignas(16) TileSource {
  std::int32_t segment_first, segment_end;  // the block's segments from the first with a token of the tile
  std::int32_t mask_first;                  // the item's mask of segment_first (from Plan::item_mask_begin)
  std::int32_t first_token;                 // the tile's first token, counted in the block
  std::int32_t block_tokens;                // the block's tokens: past them, the last slot again, seen by none
  std::int32_t unused[3];
};
static_assert(sizeof(TileSource) == 32, "a tile source is two 16-byte loads");

// 16-byte words copied from the staging buffer into the workspace (both
// 16-byte aligned).
struct CopyRange {
  const void* from;
  void* to;
  std::int64_t words;
};
inline constexpr int kUploadCopies = 4;  // tile_query, tile_partial, merge_begin, passes

// One upload's device work, one kernel: the arrays the attention kernels read
// copied from the pinned staging buffer into the workspace, and the TileMaps
// built from the staged tokens, segments, masks and tile sources, read where
// the host wrote them (mapped pinned memory: no copy of their own). The last
// CTA to finish writes `ticket` to `done` (mapped pinned memory): the host
// then knows the staging buffer is read without asking the driver.
struct PlanUpload {
  CopyRange copies[kUploadCopies];
  const TileSource* sources;                // [tiles]              staging
  const std::int32_t* token_slot;           // Plan::token_slot      staging
  const std::int32_t* segment_token_begin;  // Plan::segment_token_begin, staging
  const std::int32_t* segment_offset;       // [segments] a segment's first token, counted in its block; staging
  const std::uint64_t* segment_mask;        // Plan::segment_mask    staging
  TileMap* tile_map;                        // [tiles] written, device
  std::uint32_t* finished_ctas;             // device, 0 between uploads
  std::uint64_t* done;                      // mapped host word
  std::uint64_t ticket;
  std::int32_t tiles;
  std::int32_t copy_ctas;
};

// One stage-1 pass (a CTA per KV head): up to an item's tile rows of its
// query rows, resolved at upload so the kernel's prologue is a single load
// instead of a chain through the item's arrays.
struct alignas(16) PassInfo {
  std::int32_t query_begin;           // the item's first entry of tile_query / tile_partial
  std::int32_t tile_begin, tile_end;  // the item's TileMap records
  std::int32_t row_begin, row_end;    // the pass's query rows (query x group head) of the item
  std::int32_t unused[3];
};
static_assert(sizeof(PassInfo) == 32, "a pass is two 16-byte loads");

struct KernelParams {
  // Tensors. Q and O rows (one per query) may be strided (docs/cuda.md, "The
  // device path"): row i starts at element i * row stride; heads and head_dim are dense.
  const void* q;      // [num_queries, heads_q, head_dim]  f16, bf16 or f32
  const void* k;      // [slots, heads_kv, head_dim]
  const void* v;      // [slots, heads_kv, head_dim_v]
  void* o;            // [num_queries, heads_q, head_dim_v]  out_type
  float* lse;         // [num_queries, heads_q] or null
  std::int64_t q_row_stride;  // elements between queries' rows of Q (heads_q * head_dim when dense)
  std::int64_t o_row_stride;  // and of O
  std::int64_t kv_row_stride;  // elements between slots' rows of K, and of V (heads_kv * head_dim when dense)
  float* partial_o;   // [num_partials, heads_q, head_dim_v]
  float* partial_lse; // [num_partials, heads_q]

  // The Plan's arrays the kernels read (plan.hpp documents them).
  const std::int32_t* tile_query;
  const std::int32_t* tile_partial;
  const std::int32_t* merge_begin;  // partial slots are numbered in CSR order (Workspace::upload renumbers a
                                    // plan that numbers them otherwise), so a query's are [begin, next begin)
  // Built on the device at upload (launch_upload_plan): each item's tokens as
  // KV-pool slots and masks (item_token_map in plan.hpp), one record per 64-token tile, so a CTA
  // fetches each tile's map beside the tiles before it, at any block length;
  // and every item's passes, item-major, so the grid is exactly the passes.
  const TileMap* tile_map;
  // [the workspace's passes]: the plan's, then empty records (no rows), so a
  // graph-stable grid's CTAs past the plan's return at once.
  const PassInfo* passes;

  // The workspace's queries: merge_begin holds max_queries + 1 offsets, the
  // plan's and then its last repeated (queries without partials), so merge
  // warps past the plan's queries return at once.
  std::int32_t max_queries;
  std::int32_t heads_q;
  std::int32_t heads_kv;
  std::int32_t group;       // heads_q / heads_kv
  ElementType out_type;
  float scale_log2;         // softmax scale * log2(e): logits in base 2

  // The call's attention variants (AttentionOptions), read only by the
  // kernels instantiated for them (attn_launch.cu, uses_options).
  float softcap_log2;        // logit_softcap * log2(e): the cap on base-2 logits; 0: off
  float k_scale, v_scale;    // fp8 dequantization, per tensor (1 otherwise)
  const float* k_scales;     // [heads_kv] per KV head in place of k_scale, or null
  const float* v_scales;     // [heads_kv] per KV head in place of v_scale, or null
  const float* sinks;        // [heads_q] natural-log sink logits, or null

  // Elements between slots' rows of V where its rows are narrower than K's
  // (head_dim_v < head_dim, heads_kv * head_dim_v when dense); read only by
  // those kernels, the others take kv_row_stride for both.
  std::int64_t v_row_stride;
};

}  // namespace treeattn::cuda
