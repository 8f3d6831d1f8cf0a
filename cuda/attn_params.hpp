#pragma once
// The flat parameter block of the CUDA kernels: device pointers to the Plan's
// arrays (uploaded verbatim) and to the tensors, plus sizes. Plain C++ so the
// host backend fills it and the kernels take it by value (__grid_constant__).

#include <cstdint>

namespace treeattn::cuda {

enum class OutType : std::int32_t { f16 = 0, bf16 = 1, f32 = 2 };

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
  // Tensors (DESIGN §2 layouts).
  const void* q;      // [num_queries, heads_q, head_dim]  f16 or bf16
  const void* k;      // [slots, heads_kv, head_dim]
  const void* v;
  void* o;            // [num_queries, heads_q, head_dim]  out_type
  float* lse;         // [num_queries, heads_q] or null
  float* partial_o;   // [num_partials, heads_q, head_dim]
  float* partial_lse; // [num_partials, heads_q]

  // The Plan's arrays the kernels read (plan.hpp documents them).
  const std::int32_t* tile_query;
  const std::int32_t* tile_partial;
  const std::int32_t* merge_begin;
  const std::int32_t* merge_partial;
  // Derived at upload (DevicePlan): each item's tokens as KV-pool slots and
  // masks (item_token_map in plan.hpp), one record per 64-token tile, so a CTA
  // fetches each tile's map beside the tiles before it, at any block length;
  // and every item's passes, item-major, so the grid is exactly the passes.
  const TileMap* tile_map;
  const PassInfo* passes;  // [num_passes]

  std::int32_t num_passes;
  std::int32_t num_queries;
  std::int32_t num_partials;  // 0: every query is written by stage 1, and no merge runs
  std::int32_t heads_q;
  std::int32_t heads_kv;
  std::int32_t group;       // heads_q / heads_kv
  OutType out_type;
  float scale_log2;         // softmax scale * log2(e): logits in base 2
  // merge_partial is 0, 1, 2, ... (as the planner numbers partials): the merge
  // takes a query's slots from merge_begin alone, one dependent load fewer.
  std::int32_t merge_in_order;
  std::int32_t merge_fanin;  // the most partials one query merges (picks the merge's variant)
};

}  // namespace treeattn::cuda
