#include "vk_plan.hpp"

#include <cstring>

namespace treeattn::vulkan {
namespace {

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
  const ItemTokenMap map = item_token_map(plan, kKvTileTokens);
  e.words.assign(kHeaderWords, 0);
  // One record per pass, everything its work group needs before the gather,
  // so a work group starts with one 32-byte load instead of a chain of lookups.
  const std::int32_t group = plan.heads.group_size();
  for (std::size_t item = 0; item < std::size_t(plan.num_items()); ++item) {
    const std::int32_t tokens = plan.block_token_count(plan.item_block[item]);
    const std::int32_t tile_begin = plan.item_query_begin[item];
    const std::int32_t rows = (plan.item_query_begin[item + 1] - tile_begin) * group;
    for (std::int32_t row = 0; row < rows; row += std::int32_t(rows_per_pass)) {
      const std::int32_t fields[kPassWords] = {map.begin[item], tokens, tile_begin, rows, row, 0, 0, 0};
      for (std::int32_t field : fields) e.words.push_back(std::uint32_t(field));
      ++e.passes;
    }
  }
  append(e.words, kItemTokenSlot, map.slot);
  append(e.words, kTileVisible, map.visible);
  append(e.words, kTileQuery, plan.tile_query);
  append(e.words, kTilePartial, plan.tile_partial);
  append(e.words, kMergeBegin, plan.merge_begin);
  append(e.words, kMergePartial, plan.merge_partial);
  return e;
}

}  // namespace treeattn::vulkan
