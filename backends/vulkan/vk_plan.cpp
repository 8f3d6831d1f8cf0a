#include "vk_plan.hpp"

#include <cstring>

namespace treeattn::vulkan {
namespace {

template <typename T>
void append(EncodedPlan& e, Array array, const std::vector<T>& values) {
  e.offsets[array] = std::uint32_t(e.words.size());
  const std::size_t bytes = values.size() * sizeof(T);
  const std::size_t at = e.words.size();
  e.words.resize(at + (bytes + 3) / 4);
  if (bytes) std::memcpy(e.words.data() + at, values.data(), bytes);
}

}  // namespace

EncodedPlan encode_plan(const Plan& plan, std::uint32_t rows_per_pass) {
  EncodedPlan e;
  const ItemTokenMap map = item_token_map(plan, kKvTileTokens);
  // One record per pass, everything its work group needs before the gather,
  // so a work group starts with one 32-byte load instead of a chain of lookups.
  // In the plan's launch order.
  const std::int32_t group = plan.heads.group_size();
  for (std::int32_t k = 0; k < plan.num_items(); ++k) {
    const std::size_t item = std::size_t(plan.launch_item(k));
    const std::int32_t tokens = plan.block_token_count(plan.item_block[item]);
    const std::int32_t tile_begin = plan.item_query_begin[item];
    const std::int32_t rows = (plan.item_query_begin[item + 1] - tile_begin) * group;
    for (std::int32_t row = 0; row < rows; row += std::int32_t(rows_per_pass)) {
      const std::int32_t fields[kPassWords] = {map.begin[item], tokens, tile_begin, rows, row, 0, 0, 0};
      for (std::int32_t field : fields) e.words.push_back(std::uint32_t(field));
      ++e.passes;
    }
  }
  append(e, kItemTokenSlot, map.slot);
  append(e, kTileVisible, map.visible);
  append(e, kTileQuery, plan.tile_query);
  append(e, kTilePartial, plan.tile_partial);
  append(e, kMergeBegin, plan.merge_begin);
  append(e, kMergePartial, plan.merge_partial);
  e.merge_in_order = plan.merge_in_order();
  return e;
}

}  // namespace treeattn::vulkan
