// cuda::WorkspaceLimits: the counts a plan needs of a device workspace, host
// code (a graph-stable workspace is sized from plans before any device is
// touched); the device bytes they take are the CUDA backend's
// (backends/cuda/workspace.cpp).

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "fail.hpp"
#include "lowering.hpp"
#include "treeattn/cuda.hpp"

namespace treeattn::cuda {
namespace {

std::int32_t ceil_div(std::int32_t a, std::int32_t b) { return (a + b - 1) / b; }

}  // namespace

WorkspaceLimits WorkspaceLimits::of(const Plan& plan) {
  WorkspaceLimits l;
  l.heads = plan.heads;
  l.queries = plan.num_queries;
  l.tile_entries = std::int32_t(plan.tile_query.size());
  l.partials = plan.num_partials;
  l.merge_fanin = plan.max_merge_fanin();
  for (std::int32_t item = 0; item < plan.num_items(); ++item) {
    l.passes += item_passes(plan, item, kLargeTileRows);  // a CUDA pass takes up to a large tile's rows
    l.kv_tiles += ceil_div(plan.block_token_count(plan.item_block[std::size_t(item)]), kKvTileTokens);
  }
  l.tokens = plan.num_tokens();
  l.segments = plan.num_segments();
  l.masks = std::int32_t(plan.segment_mask.size());
  return l;
}

WorkspaceLimits& WorkspaceLimits::include(const WorkspaceLimits& o) {
  if (heads.heads_q == 0) heads = o.heads;
  if (!heads.same_as(o.heads)) {
    throw Error(ErrorCategory::InvalidArgument, fmt::format("workspace limits: heads {} and {} differ",
                                                            describe(heads), describe(o.heads)));
  }
  queries = std::max(queries, o.queries);
  tile_entries = std::max(tile_entries, o.tile_entries);
  partials = std::max(partials, o.partials);
  passes = std::max(passes, o.passes);
  kv_tiles = std::max(kv_tiles, o.kv_tiles);
  tokens = std::max(tokens, o.tokens);
  segments = std::max(segments, o.segments);
  masks = std::max(masks, o.masks);
  merge_fanin = std::max(merge_fanin, o.merge_fanin);
  return *this;
}

WorkspaceLimits WorkspaceLimits::with_headroom(double factor) const {
  auto scale = [&](std::int32_t n) { return std::int32_t(std::ceil(double(n) * factor)); };
  WorkspaceLimits l = *this;
  l.queries = scale(queries);
  l.tile_entries = scale(tile_entries);
  l.partials = scale(partials);
  l.passes = scale(passes);
  l.kv_tiles = scale(kv_tiles);
  l.tokens = scale(tokens);
  l.segments = scale(segments);
  l.masks = scale(masks);
  l.merge_fanin = scale(merge_fanin);
  return l;
}

std::string WorkspaceLimits::first_excess(const WorkspaceLimits& need) const {
  const struct {
    const char* what;
    std::int32_t need, have;
  } counts[] = {{"queries", need.queries, queries},
                {"tile entries (work item x query)", need.tile_entries, tile_entries},
                {"partial results", need.partials, partials},
                {"stage-1 passes", need.passes, passes},
                {"64-token KV tiles", need.kv_tiles, kv_tiles},
                {"tokens", need.tokens, tokens},
                {"segments", need.segments, segments},
                {"segment masks (work item x segment)", need.masks, masks}};
  for (const auto& c : counts) {
    if (c.need > c.have) return fmt::format("plan has {} {}, the workspace holds {}", c.need, c.what, c.have);
  }
  return {};
}

}  // namespace treeattn::cuda
