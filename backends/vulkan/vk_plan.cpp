#include "vk_plan.hpp"

#include <cstring>

#include "lowering.hpp"

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

EncodedPlan encode_plan(const Plan& plan, const Lowering& lowered) {
  EncodedPlan e;
  const ItemTokenMap map = item_token_map(plan, kKvTileTokens);
  // One record per pass, everything its work group needs before the gather,
  // so a work group starts with one 32-byte load instead of a chain of lookups.
  // The item's tiles are its tiles of the token map (both 64 tokens each).
  e.words.reserve(lowered.passes.size() * kPassWords);
  for (const LoweredPass& pass : lowered.passes) {
    const std::size_t item = std::size_t(pass.item);
    const LoweredTile& first = lowered.tiles[std::size_t(lowered.item_tile[item])];
    const std::int32_t fields[kPassWords] = {lowered.item_tile[item] * kKvTileTokens, first.block_tokens, pass.query_begin,
                                             pass.row_end, pass.row_begin, 0, 0, 0};
    for (std::int32_t field : fields) e.words.push_back(std::uint32_t(field));
  }
  e.passes = std::uint32_t(lowered.passes.size());
  append(e, kItemTokenSlot, map.slot);
  append(e, kTileVisible, map.visible);
  append(e, kTileQuery, plan.tile_query);
  append(e, kTilePartial, lowered.tile_partial);
  append(e, kMergeBegin, plan.merge_begin);
  return e;
}

}  // namespace treeattn::vulkan
