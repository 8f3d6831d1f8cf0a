#pragma once
// The Plan as the shaders read it: one array of 32-bit words, a header of array
// offsets (attn_common.glsl names them), one 32-byte record per row pass (one
// work group each: its item's tokens and queries, its first row), then the
// item token map (item_token_map: each item's KV slots and, per 64-token tile
// and tile query, a word of the tokens it sees — what the CUDA kernels read)
// and the Plan's arrays the shaders read.

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

// Header slots: word i of the header is the offset (in words) of array i, in
// the order of attn_common.glsl's constants.
enum Array : std::uint32_t {
  kItemTokenSlot, kTileVisible, kTileQuery, kTilePartial, kMergeBegin, kMergePartial, kArrayCount
};
// The header is padded to kHeaderWords so the pass records after it start
// 16-byte aligned at a fixed offset (attn_common.glsl: kHeaderWords, load_pass).
// A record: the item's first token in kItemTokenSlot (a multiple of 64: its
// first tile of kTileVisible is that / 64) and its token count, its first tile
// query and its rows, the pass's first row, three spare words.
inline constexpr std::uint32_t kHeaderWords = 16, kPassWords = 8;
static_assert(kArrayCount <= kHeaderWords, "the header outgrew its padding");

struct EncodedPlan {
  std::vector<std::uint32_t> words;
  std::uint32_t passes = 0;  // work groups per KV head of stage 1
};

// Each work item's rows (tile queries x query heads of a KV head) cut into
// passes of `rows_per_pass`; a pass of an item follows the item's previous pass.
EncodedPlan encode_plan(const Plan& plan, std::uint32_t rows_per_pass);

}  // namespace treeattn::vulkan
