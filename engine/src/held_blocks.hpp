#pragma once
// Internal: flatten's blocks held over decode steps that only lengthen nodes
// (IncrementalOptions::hold_flatten_blocks). A from-scratch flatten plan cuts
// the whole token run evenly, so one token appended anywhere moves every
// later block boundary and every block is emitted again. Held, the blocks
// keep their segments: a node's new tokens join the block that holds its
// last token, later segments shift, and the items, masks and reduction stay
// as they are (the new tokens have the viewers of the piece they lengthen).

#include <cstdint>
#include <vector>

#include "treeattn/plan.hpp"
#include "visibility.hpp"

namespace treeattn {

struct HeldBlock {
  std::int32_t block;
  std::int32_t tokens;  // its length after the step
};

// `plan`, flatten's layout of the pieces before a step (plan_analyzed()'s, or
// one held so), follows update_visibility()'s `tails` (every grown node's new
// tokens lengthening its last piece): segment offsets, the blocks' lengths,
// their items' tile rows (chosen by `model` as a new plan's are) and
// block_tokens (the longest block). Token slots, min_kv_slots and the launch
// order are the caller's. `grown` receives the blocks that took tokens.
// Returns false where a block would pass `limit` tokens, or the segments are
// not a layout of those pieces: `plan`'s arrays are then partly moved, to be
// built again.
bool grow_held_blocks(Plan& plan, const std::vector<VisibleGrowth::Tail>& tails, std::int32_t limit,
                      const CostModel& model, std::vector<HeldBlock>& grown);

// How long the blocks of `plan`, a flatten plan cut evenly at `block_tokens`,
// may grow while held. In the cost model a step takes max(all passes' cost /
// slots, the longest pass / solo_speedup): where the first term exceeds the
// second with room for the longest pass to grow by `drift`, the device is
// full and a longer block only moves work between CTAs, so blocks may grow
// to block_tokens * (1 + drift) (kMaxBlockTokens at most); otherwise the
// longest pass sets the step's time, and no block may pass block_tokens.
std::int32_t held_block_limit(const Plan& plan, const CostModel& model, std::int32_t block_tokens, double drift);

}  // namespace treeattn
