#pragma once
// Internal: who sees what, computed per node (never per token).
//
// Queries are renumbered by a depth-first *position*: entering a node, its own
// queries take the next positions, sorted by how many of its tokens they see
// (ascending), then its children's subtrees follow. Two facts follow:
//   * the queries of a subtree occupy one contiguous range of positions;
//   * the queries that see token t of node n are exactly the own queries with
//     upto > t (a suffix of n's own queries) plus the whole descendant range,
//     which is again one contiguous range [lo, hi).
// A node's visible tokens are therefore cut into *pieces*, one per distinct
// upto boundary, each with a constant viewer range. Pieces partition the
// visible tokens; strategies only decide how to group them into KV blocks.
//
// With a sliding window W, query q at path position P sees the tokens at path
// positions P - W + 1 .. P (its window start). A piece is then cut further
// wherever a viewer's window starts inside it, and its viewers are the
// positions of [lo, hi) whose window starts at or before its first token
// (sees()): a subset of the range, the same for every token of the piece.
// Tokens no viewer's window reaches are in no piece, so a node's visible
// tokens need not be a prefix of it.

#include <cstdint>
#include <vector>

#include "topology.hpp"

namespace treeattn {

struct Piece {
  std::int32_t node;         // tree node index
  std::int32_t token_begin;  // in the plan's flattened token order
  std::int32_t token_end;
  std::int32_t viewer_lo;    // viewers: query positions [viewer_lo, viewer_hi)
  std::int32_t viewer_hi;
  std::int64_t path_begin;   // path position of its first token (windowed visibility only, else 0)
};

struct Visibility {
  std::vector<std::int32_t> query_at;        // [queries] position -> query index
  std::vector<std::int32_t> query_position;  // [queries] query index -> position
  std::vector<Piece> pieces;                 // in flattened token order
  std::vector<std::int32_t> node_piece_begin;  // [nodes] CSR into pieces, with
  std::vector<std::int32_t> node_piece_end;    // [nodes] a node's pieces contiguous
  std::vector<std::int32_t> token_slot;      // [visible tokens] KV-pool row
  std::int64_t max_slot = -1;
  std::vector<std::int64_t> node_max_slot;   // [nodes] the largest slot of a node's visible tokens, -1 for none
  // Per node: its first query position (its own queries, then its subtree's,
  // up to node_subtree_end), where its own queries end, its visible tokens.
  // What update_visibility() needs to redo one node.
  std::vector<std::int32_t> node_position;
  std::vector<std::int32_t> node_subtree_end;
  std::vector<std::int32_t> node_own_end;
  std::vector<std::int32_t> node_visible;
  // The sliding window (0: none), and where it is set each query position's
  // window start and each node's path position of its first token.
  std::int32_t window = 0;
  std::vector<std::int64_t> window_start;  // [queries] by position
  std::vector<std::int64_t> node_depth;    // [nodes]
  // window_start's minima over position ranges, a segment tree (leaves at
  // [queries, 2 * queries), entry k the minimum of 2k and 2k + 1): a range's
  // viewers are found in time of how many there are, not of the range (a
  // chain prefill's pieces each have every later query in their range).
  std::vector<std::int64_t> window_start_min;
};

Visibility compute_visibility(const Tree& tree, const Topology& topo, std::int32_t window = 0);

// Whether the query at `position`, one of a piece's viewer range, sees the
// piece (its window reaches the piece's first token, at `path_begin`; always
// without a window).
inline bool sees(const Visibility& vis, std::int32_t position, std::int64_t path_begin) {
  return vis.window == 0 || vis.window_start[std::size_t(position)] <= path_begin;
}
// `piece` narrowed to the viewer positions [lo, hi); false where none of
// them sees it (its tokens are then read by no one of that range).
bool narrow_viewers(const Visibility& vis, Piece& piece, std::int32_t lo, std::int32_t hi);

// After tokens were appended to the nodes `grown` (topo.query_upto already
// set for the queries that see whole nodes), brings `vis` to what
// compute_visibility() returns now, in time linear in the pieces and the
// grown nodes' own queries plus one move of the token slots. Returns false,
// leaving `vis` as it was, where an append changes more than token counts
// (the order of a node's own queries, or its number of pieces), or a window
// is set (an append slides the windows of every query below the node, so
// tokens leave nodes other than the grown ones): the caller then computes it
// again.
//
// `growth`, when given, receives what a plan laid out on the old pieces needs
// to follow them (flatten's held blocks).
struct VisibleGrowth {
  struct Tail {
    std::int32_t old_end;  // a grown node's visible tokens ended here, in the old flattened order
    std::int32_t added;    // visible tokens appended behind them
  };
  // Whether every grown node's new tokens only lengthen its last piece (its
  // other pieces and every viewer range as they were); then `tails` holds
  // each node whose visible tokens grew, in flattened order.
  bool tails_only = false;
  std::vector<Tail> tails;
};
bool update_visibility(const Tree& tree, const Topology& topo, Visibility& vis, const std::vector<std::int32_t>& grown,
                       VisibleGrowth* growth = nullptr);
// After the nodes listed took new slots at their lengths (replace_pages, or
// a subtree replaced by one of the same shape: the same parents, lengths and
// queries by node index), writes their slots where their tokens are and
// brings max_slot up to date; linear in their visible tokens (and in the
// nodes, when the largest slot was one they gave up).
void replace_slots(const Tree& tree, Visibility& vis, const std::vector<std::int32_t>& nodes);

}  // namespace treeattn
