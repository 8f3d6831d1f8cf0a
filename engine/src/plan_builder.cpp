#include "plan_builder.hpp"

#include <algorithm>
#include <limits>
#include <numeric>

#include "fail.hpp"

namespace treeattn {

PlanBuilder::PlanBuilder(Plan& plan, const Visibility& vis, const CostModel& model)
    : plan_(plan), vis_(vis), model_(model) {
  plan_.block_segment_begin.assign(1, 0);
  plan_.item_query_begin.assign(1, 0);
}

PlanBuilder::PlanBuilder(Plan& plan, const Visibility& vis, const CostModel& model, PlanShape& shape)
    : plan_(plan), vis_(vis), model_(model), shape_(&shape) {
  shape.items.clear();
  shape.partials = 0;
  coverage_.assign(vis.query_at.size() + 1, 0);
}

void PlanBuilder::emit_run(const Piece* first, const Piece* last, Cut cut, std::int64_t min_blocks) {
  std::int64_t length = 0;
  for (const Piece* p = first; p != last; ++p) length += p->token_end - p->token_begin;
  if (length == 0) return;
  const std::int64_t blocks =
      std::min(length, std::max(min_blocks, (length + plan_.block_tokens - 1) / plan_.block_tokens));
  auto boundary = [&](std::int64_t b) {  // run offset where block b starts
    return cut == Cut::even ? b * length / blocks : std::min(b * plan_.block_tokens, length);
  };

  std::int64_t block = 0, block_end = boundary(1), run_offset = 0;
  for (const Piece* p = first; p != last; ++p) {
    std::int32_t begin = p->token_begin;
    while (begin < p->token_end) {
      const std::int32_t end =
          std::int32_t(std::min<std::int64_t>(p->token_end, begin + (block_end - run_offset)));
      if (shape_ == nullptr) {
        plan_.segment_token_begin.push_back(begin);
        plan_.segment_token_end.push_back(end);
        plan_.segment_node.push_back(p->node);
      }
      add_segment_viewers(*p);
      run_offset += end - begin;
      begin = end;
      if (run_offset == block_end) {
        block_tokens_ = std::int32_t(block_end - boundary(block));
        close_block();
        ++block;
        block_end = boundary(block + 1);
      }
    }
  }
}

// The open block's viewers: the union of its segments' position ranges, as
// disjoint intervals in ascending order, each with its offset in the list.
// Ranges come ordered by lo (every strategy emits its runs depth first), so
// each starts in the last interval or after it, and a segment's viewers are a
// range of indices into the list from the moment it is added.
void PlanBuilder::add_segment_viewers(const Piece& piece) {
  const std::int32_t lo = piece.viewer_lo, hi = piece.viewer_hi;
  if (!open_.empty() && lo < open_.back().lo) {
    fail(ErrorCategory::InvalidPlan, "PlanBuilder: a run's viewer ranges are not ordered ({} after {})", lo,
         open_.back().lo);
  }
  if (!intervals_.empty() && lo <= intervals_.back().end) {
    Interval& last = intervals_.back();
    if (hi > last.end) {
      viewers_ += hi - last.end;
      last.end = hi;
    }
  } else {
    intervals_.push_back(Interval{lo, hi, viewers_});
    viewers_ += hi - lo;
  }
  open_.push_back(OpenSegment{lo, hi, intervals_.back().offset + (lo - intervals_.back().begin),
                              piece.path_begin});
}

// With a window a segment's viewers are the positions of its range whose
// window reaches it: the block's viewers are those of its intervals that see
// one of its segments, so no tile holds a query that sees none of the block.
// They are found in the window starts' segment tree, beside which each
// block keeps the earliest window start among the positions it has not
// listed yet: a walk enters only subtrees holding a new viewer, so a chain's
// prefill, whose segments each have every later query in their range, costs
// the viewers listed (times the tree's depth), not the ranges.
void PlanBuilder::window_viewers() {
  window_positions_.clear();
  const std::size_t n = vis_.window_start.size();
  const std::int64_t* tree_min = vis_.window_start_min.data();
  if (unlisted_.empty()) unlisted_.assign(2 * n, Unlisted{});
  ++stamp_;
  auto unlisted_min = [&](std::size_t k) { return unlisted_[k].stamp == stamp_ ? unlisted_[k].min : tree_min[k]; };
  std::vector<std::size_t>& stack = walk_;
  for (const OpenSegment& s : open_) {
    const std::int64_t reach = s.path_begin;
    stack.clear();
    for (std::size_t l = std::size_t(s.lo) + n, r = std::size_t(s.hi) + n; l < r; l >>= 1, r >>= 1) {
      if ((l & 1) != 0) stack.push_back(l++);
      if ((r & 1) != 0) stack.push_back(--r);
    }
    while (!stack.empty()) {
      const std::size_t k = stack.back();
      stack.pop_back();
      if (unlisted_min(k) > reach) continue;
      if (k < n) {
        stack.push_back(2 * k);
        stack.push_back(2 * k + 1);
        continue;
      }
      window_positions_.push_back(std::int32_t(k - n));
      unlisted_[k] = Unlisted{stamp_, std::numeric_limits<std::int64_t>::max()};
      for (std::size_t j = k >> 1; j >= 1; j >>= 1) {
        unlisted_[j] = Unlisted{stamp_, std::min(unlisted_min(2 * j), unlisted_min(2 * j + 1))};
      }
    }
  }
  std::sort(window_positions_.begin(), window_positions_.end());
}

void PlanBuilder::close_block() {
  const bool windowed = vis_.window > 0;
  if (windowed) window_viewers();
  const std::int32_t viewers = windowed ? std::int32_t(window_positions_.size()) : viewers_;
  if (shape_ != nullptr) {
    close_block_shape(viewers);
    return;
  }
  const std::int32_t block = plan_.num_blocks();
  plan_.block_segment_begin.push_back(plan_.num_segments());

  // One work item per query tile; within a tile, a segment's viewers are a
  // contiguous run of its queries, hence a contiguous run of mask bits. With
  // a window the tiles walk the windowed viewers, and a segment's bit is set
  // where the tile query is of its range and sees it (bits need not be a run).
  const std::int32_t tile = plan_.query_tile;
  std::size_t interval = 0;
  for (std::int32_t t0 = 0; t0 < viewers; t0 += tile) {
    const std::int32_t t1 = std::min(viewers, t0 + tile);
    plan_.item_block.push_back(block);
    plan_.item_mask_begin.push_back(std::int32_t(plan_.segment_mask.size()));
    plan_.item_tile_rows.push_back(item_tile_rows(t1 - t0));
    for (std::int32_t t = t0; t < t1; ++t) {
      std::int32_t position = 0;
      if (windowed) {
        position = window_positions_[std::size_t(t)];
      } else {
        while (t >= intervals_[interval].offset + (intervals_[interval].end - intervals_[interval].begin)) ++interval;
        position = intervals_[interval].begin + (t - intervals_[interval].offset);
      }
      plan_.tile_query.push_back(vis_.query_at[std::size_t(position)]);
    }
    plan_.item_query_begin.push_back(std::int32_t(plan_.tile_query.size()));
    for (const OpenSegment& s : open_) {
      if (windowed) {
        std::uint64_t mask = 0;
        for (std::int32_t t = t0; t < t1; ++t) {
          const std::int32_t position = window_positions_[std::size_t(t)];
          if (position >= s.lo && position < s.hi && sees(vis_, position, s.path_begin)) mask |= std::uint64_t(1) << (t - t0);
        }
        plan_.segment_mask.push_back(mask);
        continue;
      }
      const std::int32_t a = std::clamp(s.first_viewer - t0, 0, t1 - t0);
      const std::int32_t b = std::clamp(s.first_viewer + (s.hi - s.lo) - t0, 0, t1 - t0);
      const std::uint64_t run = b - a == 64 ? ~std::uint64_t(0) : ((std::uint64_t(1) << (b - a)) - 1);
      plan_.segment_mask.push_back(b > a ? run << a : 0);
    }
  }
  open_next_block();
}

// The one place both modes choose an item's tile rows, so a shape is the plan's.
std::int32_t PlanBuilder::item_tile_rows(std::int32_t queries) const {
  return choose_tile(model_, std::int64_t(queries) * plan_.heads.group_size(), block_tokens_).rows;
}

// The items close_block() would emit, and which query positions the block reads.
void PlanBuilder::close_block_shape(std::int32_t viewers) {
  const std::int32_t tile = plan_.query_tile;
  for (std::int32_t t0 = 0; t0 < viewers; t0 += tile) {
    const std::int32_t queries = std::min(viewers, t0 + tile) - t0;
    shape_->items.push_back(ItemShape{queries, block_tokens_, item_tile_rows(queries), shape_blocks_});
  }
  ++shape_blocks_;
  if (vis_.window > 0) {
    for (std::int32_t position : window_positions_) {
      ++coverage_[std::size_t(position)];
      --coverage_[std::size_t(position) + 1];
    }
  } else {
    for (const Interval& i : intervals_) {
      ++coverage_[std::size_t(i.begin)];
      --coverage_[std::size_t(i.end)];
    }
  }
  open_next_block();
}

void PlanBuilder::open_next_block() {
  open_.clear();
  intervals_.clear();
  viewers_ = 0;
}

void PlanBuilder::finish() {
  if (shape_ != nullptr) {
    // A query read by one block is written directly; one read by n > 1 blocks has n partials.
    std::int32_t blocks = 0;
    for (std::size_t position = 0; position + 1 < coverage_.size(); ++position) {
      blocks += coverage_[position];
      if (blocks > 1) {
        shape_->partials += blocks;
        shape_->max_fanin = std::max(shape_->max_fanin, blocks);
      }
    }
    return;
  }
  const std::size_t nq = std::size_t(plan_.num_queries);
  std::vector<std::int32_t> contributions(nq, 0);
  for (std::int32_t q : plan_.tile_query) ++contributions[std::size_t(q)];

  plan_.merge_begin.assign(nq + 1, 0);
  for (std::size_t q = 0; q < nq; ++q) {
    plan_.merge_begin[q + 1] = plan_.merge_begin[q] + (contributions[q] > 1 ? contributions[q] : 0);
  }
  // Partial slots are numbered query by query, each query's in item order: a
  // query's partials are then adjacent and merge_partial is 0, 1, 2, ..., so a
  // merge can address them from merge_begin alone (one dependent load fewer).
  plan_.num_partials = plan_.merge_begin[nq];
  plan_.merge_partial.resize(std::size_t(plan_.num_partials));
  std::iota(plan_.merge_partial.begin(), plan_.merge_partial.end(), 0);
  std::vector<std::int32_t> fill(plan_.merge_begin.begin(), plan_.merge_begin.end() - 1);
  plan_.tile_partial.resize(plan_.tile_query.size());
  for (std::size_t k = 0; k < plan_.tile_query.size(); ++k) {
    const std::size_t q = std::size_t(plan_.tile_query[k]);
    plan_.tile_partial[k] = contributions[q] == 1 ? kDirect : fill[q]++;
  }
}

}  // namespace treeattn
