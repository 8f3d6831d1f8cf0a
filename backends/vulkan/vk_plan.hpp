#pragma once
// The Plan as the shaders read it: one array of 32-bit words holding one
// 32-byte record per row pass of its lowering (lowering.hpp; one work group
// each: its item's tokens and queries, its rows), then the item token map
// (item_token_map: each item's KV slots and, per 64-token tile and tile query,
// a word of the tokens it sees — what the CUDA kernels read) and the Plan's
// arrays the shaders read, the partials numbered in merge order.
// The arrays' offsets travel in the push constants, so no shader waits for a
// header load before its first lookup (the merge's chain of dependent loads is
// what a small tree's layer waits on after stage 1).

#include <cstdint>
#include <vector>

#include "treeattn/plan.hpp"

namespace treeattn {
struct Lowering;  // lowering.hpp
}

namespace treeattn::vulkan {

// The arrays after the pass records, in the order of attn_common.glsl's
// constants (PushConstants::offsets). A query's partials are merge_begin[q] ..
// merge_begin[q + 1] - 1 (the lowering numbers them so): no merge_partial.
enum Array : std::uint32_t { kItemTokenSlot, kTileVisible, kTileQuery, kTilePartial, kMergeBegin, kArrayCount };
// A record: the item's first token in kItemTokenSlot (a multiple of 64: its
// first tile of kTileVisible is that / 64) and its token count, its first tile
// query, the pass's row end and first row (rows: tile query x group head of
// the item), three spare words.
inline constexpr std::uint32_t kPassWords = 8;

// Mirrors the push-constant block of attn_common.glsl.
struct PushConstants {
  std::uint64_t plan, q, kv_chunks, o, lse, partial_o, partial_lse;
  std::uint32_t chunk_slots, num_chunks, heads_q, heads_kv, group, out_type;
  float scale_log2;
  std::uint32_t offsets[kArrayCount];  // of each Array in the plan's words
  std::uint32_t groups;                // stage 1: passes x heads_kv work groups; the merge: queries (each over
                                       // the query heads); the dispatch may hold more
  std::uint32_t run;                   // of those, the most in a run along x
  float softcap_log2;                  // the logit soft-cap times log2(e) (pipelines specialised for it)
};
static_assert(sizeof(PushConstants) <= 128, "beyond the push-constant space every Vulkan device has");
static_assert(kArrayCount == 5, "attn_common.glsl's push constants hold five offsets (uint offsets[5])");

struct EncodedPlan {
  std::vector<std::uint32_t> words;
  std::uint32_t offsets[kArrayCount] = {};
  std::uint32_t passes = 0;  // work groups per KV head of stage 1
};

// `plan` as lowered for a shader of rows_per_pass(variant) rows a pass (`lowered`).
EncodedPlan encode_plan(const Plan& plan, const Lowering& lowered);

}  // namespace treeattn::vulkan
