#pragma once
// The Plan as the shaders read it: one array of 32-bit words, a header of array
// offsets (attn_common.glsl names them), one 32-byte record per row pass (one
// work group each: its block's tokens, its item's queries and visibility, its
// first row), then the Plan's arrays the shaders read, the per-block token map
// and the visibility in the form the shader wants.

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

// Header slots: word i of the header is the offset (in words) of array i, or 0
// when the encoding leaves it out. In the order of attn_common.glsl's constants.
enum Array : std::uint32_t {
  kBlockTokenSlot, kBlockTokenSegment, kSegmentMask, kTileQuery, kTilePartial, kMergeBegin, kMergePartial, kTileVisible,
  kArrayCount
};
// The header is padded to kHeaderWords so the pass records after it start
// 16-byte aligned at a fixed offset (attn_common.glsl: kHeaderWords, load_pass).
// A record: the block's first token in the block token map and its token count,
// the item's first tile query and its rows, the item's first segment mask, the
// pass's first row, the item's first 64-token tile of kTileVisible, one spare.
inline constexpr std::uint32_t kHeaderWords = 16, kPassWords = 8;
static_assert(kArrayCount <= kHeaderWords, "the header outgrew its padding");

struct EncodedPlan {
  std::vector<std::uint32_t> words;
  std::uint32_t passes = 0;  // work groups per KV head of stage 1
};

// How a stage-1 shader learns which tokens a row sees.
enum class Visibility {
  segment_masks,  // each block token's segment and each item's segment masks (tree_attn_scalar.comp
                  // stages a chunk's masks in shared memory, one per token)
  tile_words,     // item_token_map's words: per item, 64-token tile and tile query, the tokens it
                  // sees (tree_attn_coopmat.comp loads one per row and chunk)
};

// Each work item's rows (tile queries x query heads of a KV head) cut into
// passes of `rows_per_pass`; a pass of an item follows the item's previous pass.
EncodedPlan encode_plan(const Plan& plan, std::uint32_t rows_per_pass, Visibility visibility);

}  // namespace treeattn::vulkan
