#pragma once
// The Plan as the shaders read it: one array of 32-bit words, a header of array
// offsets (attn_common.glsl names them), one 32-byte record per row pass (one
// work group each: its block's tokens, its item's queries and masks, its first
// row), then the Plan's arrays verbatim and the per-block token map.

#include <cstdint>
#include <vector>

#include "treeattn/plan.hpp"

namespace treeattn::vulkan {

// Mirrors the push-constant block of attn_common.glsl.
struct PushConstants {
  std::uint64_t plan, q, kv_chunks, o, lse, partial_o, partial_lse;
  std::uint32_t chunk_slots, num_chunks, heads_q, heads_kv, group, out_type;
  float scale_log2;
};

struct EncodedPlan {
  std::vector<std::uint32_t> words;
  std::uint32_t passes = 0;  // work groups per KV head of stage 1
};

// Each work item's rows (tile queries x query heads of a KV head) cut into
// passes of `rows_per_pass`; a pass of an item follows the item's previous pass.
EncodedPlan encode_plan(const Plan& plan, std::uint32_t rows_per_pass);

}  // namespace treeattn::vulkan
