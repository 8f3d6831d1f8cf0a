#pragma once
// The flat parameter block of the CUDA kernels: device pointers to the Plan's
// arrays (uploaded verbatim) and to the tensors, plus sizes. Plain C++ so the
// host backend fills it and the kernels take it by value (__grid_constant__).

#include <cstdint>

namespace treeattn::cuda {

enum class OutType : std::int32_t { f16 = 0, bf16 = 1, f32 = 2 };

struct KernelParams {
  // Tensors (DESIGN §2 layouts).
  const void* q;      // [num_queries, heads_q, head_dim]  f16 or bf16
  const void* k;      // [slots, heads_kv, head_dim]
  const void* v;
  void* o;            // [num_queries, heads_q, head_dim]  out_type
  float* lse;         // [num_queries, heads_q] or null
  float* partial_o;   // [num_partials, heads_q, head_dim]
  float* partial_lse; // [num_partials, heads_q]

  // The Plan (plan.hpp documents every array).
  const std::int32_t* token_slot;
  const std::int32_t* segment_token_begin;
  const std::int32_t* segment_token_end;
  const std::int32_t* block_segment_begin;
  const std::int32_t* item_block;
  const std::int32_t* item_query_begin;
  const std::int32_t* item_mask_begin;
  const std::uint64_t* segment_mask;
  const std::int32_t* tile_query;
  const std::int32_t* tile_partial;
  const std::int32_t* merge_begin;
  const std::int32_t* merge_partial;
  // Derived at upload (DevicePlan): each KV block's tokens as KV-pool slots and
  // as segment indices local to the block, so a CTA maps its block in one load.
  const std::int32_t* block_token_begin;     // [num_blocks + 1]
  const std::int32_t* block_token_slot;      // [sum of block tokens]
  const std::uint16_t* block_token_segment;  // [sum of block tokens]
  // Derived at upload: every item's passes of item_tile_rows rows, item-major,
  // so the grid is exactly the passes (no CTA of a small tile sized for a large one).
  const std::int32_t* pass_item;       // [num_passes]
  const std::int32_t* pass_row_begin;  // [num_passes] first query row of the pass
  const std::int32_t* item_tile_rows;  // [num_items]

  std::int32_t num_items;
  std::int32_t num_passes;
  std::int32_t num_queries;
  std::int32_t heads_q;
  std::int32_t heads_kv;
  std::int32_t group;       // heads_q / heads_kv
  OutType out_type;
  float scale_log2;         // softmax scale * log2(e): logits in base 2
};

}  // namespace treeattn::cuda
