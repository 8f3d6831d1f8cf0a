#include "vk_plan.hpp"

#include <cstring>

namespace treeattn::vulkan {
namespace {

// Header slots, in the order of attn_common.glsl's constants.
enum Array : std::uint32_t {
  kBlockTokenBegin, kBlockTokenSlot, kBlockTokenSegment, kItemBlock, kItemQueryBegin, kItemMaskBegin,
  kSegmentMask, kTileQuery, kTilePartial, kMergeBegin, kMergePartial, kPassItem, kPassRow, kArrayCount
};

template <typename T>
void append(std::vector<std::uint32_t>& words, Array slot, const std::vector<T>& values) {
  words[slot] = std::uint32_t(words.size());
  const std::size_t bytes = values.size() * sizeof(T);
  const std::size_t at = words.size();
  words.resize(at + (bytes + 3) / 4);
  if (bytes) std::memcpy(words.data() + at, values.data(), bytes);
}

}  // namespace

EncodedPlan encode_plan(const Plan& plan, std::uint32_t rows_per_pass) {
  EncodedPlan e;
  std::vector<std::int32_t> pass_item, pass_row;
  const std::int32_t group = plan.heads.group_size();
  for (std::int32_t item = 0; item < plan.num_items(); ++item) {
    const std::int32_t rows = (plan.item_query_begin[std::size_t(item) + 1] - plan.item_query_begin[std::size_t(item)]) * group;
    for (std::int32_t row = 0; row < rows; row += std::int32_t(rows_per_pass)) {
      pass_item.push_back(item);
      pass_row.push_back(row);
    }
  }
  e.passes = std::uint32_t(pass_item.size());

  const BlockTokenMap map = block_token_map(plan);
  e.words.assign(kArrayCount, 0);
  append(e.words, kBlockTokenBegin, map.begin);
  append(e.words, kBlockTokenSlot, map.slot);
  append(e.words, kBlockTokenSegment, map.segment);
  append(e.words, kItemBlock, plan.item_block);
  append(e.words, kItemQueryBegin, plan.item_query_begin);
  append(e.words, kItemMaskBegin, plan.item_mask_begin);
  append(e.words, kSegmentMask, plan.segment_mask);
  append(e.words, kTileQuery, plan.tile_query);
  append(e.words, kTilePartial, plan.tile_partial);
  append(e.words, kMergeBegin, plan.merge_begin);
  append(e.words, kMergePartial, plan.merge_partial);
  append(e.words, kPassItem, pass_item);
  append(e.words, kPassRow, pass_row);
  return e;
}

}  // namespace treeattn::vulkan
