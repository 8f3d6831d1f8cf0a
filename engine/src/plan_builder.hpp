#pragma once
// Internal: turns runs of pieces into KV blocks, query tiles, masks and the
// reduction map. Strategies only choose which pieces form a run and where a run
// is cut; everything that makes a Plan consistent lives here, once.

#include <cstdint>
#include <vector>

#include "plan_shape.hpp"
#include "treeattn/plan.hpp"
#include "visibility.hpp"

namespace treeattn {

enum class Cut {
  even,   // ceil(L / block_tokens) blocks of near-equal size (load balance)
  fixed,  // blocks of exactly block_tokens, the last one shorter
};

class PlanBuilder {
 public:
  // `plan` has its shape fields set and token_slot filled; `model` picks each
  // item's tile rows.
  PlanBuilder(Plan& plan, const Visibility& vis, const CostModel& model);
  // Shape mode: records only `shape` (items and partial count) of the plan
  // that `plan`'s shape fields describe; `plan`'s arrays are left untouched.
  PlanBuilder(Plan& plan, const Visibility& vis, const CostModel& model, PlanShape& shape);

  // Cuts the pieces [first, last), taken as one run of tokens, into KV blocks
  // (ceil(length / block_tokens) of them, or `min_blocks` when that is larger) and
  // emits them with their work items. Within a block the pieces' viewer
  // ranges must come ordered by viewer_lo, as a depth-first walk gives them
  // (InvalidPlan otherwise).
  void emit_run(const Piece* first, const Piece* last, Cut cut, std::int64_t min_blocks = 0);

  // Assigns partial slots (kDirect for a query's only contribution) and builds
  // the reduction CSR. Call once, after the last emit_run.
  void finish();

 private:
  void add_segment_viewers(const Piece& piece);
  void close_block();
  void window_viewers();
  void close_block_shape(std::int32_t viewers);
  void open_next_block();
  std::int32_t item_tile_rows(std::int32_t queries) const;  // of an item of the open block

  Plan& plan_;
  const Visibility& vis_;
  const CostModel& model_;
  PlanShape* shape_ = nullptr;
  // Shape mode: at each query position, +1 where a block's viewer interval
  // starts and -1 where it ends (a position's prefix sum: the blocks it reads).
  std::vector<std::int32_t> coverage_;
  std::int32_t shape_blocks_ = 0;  // blocks recorded so far
  std::int32_t block_tokens_ = 0;  // of the open block
  struct Interval {
    std::int32_t begin, end;  // query positions [begin, end)
    std::int32_t offset;      // viewers of the block before this interval
  };
  // The open block's segments: each one's viewer range and its first viewer
  // in the block's list (an index into the union of the ranges, kept as
  // disjoint intervals by add_segment_viewers()).
  struct OpenSegment {
    std::int32_t lo, hi, first_viewer;
    std::int64_t path_begin;  // its piece's (the window's viewers)
  };
  std::vector<OpenSegment> open_;
  std::vector<Interval> intervals_;
  std::int32_t viewers_ = 0;  // of intervals_
  // With a window, the open block's viewers are those of intervals_ that see
  // one of its segments (window_viewers()): their positions, ascending.
  std::vector<std::int32_t> window_positions_;
  // window_viewers()' scratch: per entry of the window starts' segment tree,
  // the earliest window start of its positions not yet listed for the block
  // stamp_ (an entry of an earlier block: none listed, the tree's own minimum).
  struct Unlisted {
    std::uint32_t stamp = 0;
    std::int64_t min = 0;
  };
  std::vector<Unlisted> unlisted_;
  std::uint32_t stamp_ = 0;
  std::vector<std::size_t> walk_;
};

}  // namespace treeattn
