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

}  // namespace treeattn
