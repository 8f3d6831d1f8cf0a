#include "visibility.hpp"

#include <algorithm>
#include <limits>

#include "fail.hpp"

namespace treeattn {

Visibility compute_visibility(const Tree& tree, const Topology& topo) {
  const std::size_t n = tree.node_count();
  const std::size_t nq = tree.query_count();
  Visibility vis;

  // Own queries of each node (CSR), sorted by visible tokens, then by index.
  std::vector<std::int32_t> own_begin(n + 1, 0);
  for (std::size_t q = 0; q < nq; ++q) ++own_begin[std::size_t(topo.query_node[q]) + 1];
  for (std::size_t i = 0; i < n; ++i) own_begin[i + 1] += own_begin[i];
  std::vector<std::int32_t> own(nq);
  {
    std::vector<std::int32_t> fill(own_begin.begin(), own_begin.end() - 1);
    for (std::size_t q = 0; q < nq; ++q) own[std::size_t(fill[std::size_t(topo.query_node[q])]++)] = std::int32_t(q);
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (own_begin[i + 1] - own_begin[i] < 2) continue;
    std::sort(own.begin() + own_begin[i], own.begin() + own_begin[i + 1], [&](std::int32_t a, std::int32_t b) {
      const std::int32_t ua = topo.query_upto[std::size_t(a)], ub = topo.query_upto[std::size_t(b)];
      return ua < ub || (ua == ub && a < b);
    });
  }

  // Positions: a node's own queries, then its subtree, in preorder. A subtree's
  // query count comes from one reverse pass; positions from one forward pass.
  std::vector<std::int32_t> subtree_queries(n);
  for (std::size_t i = 0; i < n; ++i) subtree_queries[i] = own_begin[i + 1] - own_begin[i];
  for (auto v = topo.preorder.rbegin(); v != topo.preorder.rend(); ++v) {
    const std::int32_t p = topo.parent[std::size_t(*v)];
    if (p >= 0) subtree_queries[std::size_t(p)] += subtree_queries[std::size_t(*v)];
  }
  vis.query_at.resize(nq);
  vis.query_position.resize(nq);
  std::vector<std::int32_t> first_position(n);
  std::int32_t position = 0;
  for (std::int32_t v : topo.preorder) {
    first_position[std::size_t(v)] = position;
    for (std::int32_t k = own_begin[std::size_t(v)]; k < own_begin[std::size_t(v) + 1]; ++k) {
      vis.query_at[std::size_t(position)] = own[std::size_t(k)];
      vis.query_position[std::size_t(own[std::size_t(k)])] = position;
      ++position;
    }
  }

  // Visible tokens of each node and its pieces, in preorder.
  vis.node_piece_begin.assign(n, 0);
  vis.node_piece_end.assign(n, 0);
  vis.pieces.reserve(n + nq);
  std::int64_t offset = 0;
  for (std::int32_t v : topo.preorder) {
    const std::size_t i = std::size_t(v);
    const std::int32_t own_count = own_begin[i + 1] - own_begin[i];
    const std::int32_t subtree_end = first_position[i] + subtree_queries[i];
    const bool has_descendant_viewers = subtree_queries[i] > own_count;
    const std::int32_t length = std::int32_t(tree.nodes()[i].length);
    std::int32_t visible = 0;
    if (has_descendant_viewers) visible = length;
    else if (own_count > 0) visible = topo.query_upto[std::size_t(own[std::size_t(own_begin[i + 1] - 1)])];
    if (offset + visible > std::numeric_limits<std::int32_t>::max()) {
      fail(ErrorCategory::InvalidTree, "the tree holds more than {} visible tokens",
           std::numeric_limits<std::int32_t>::max());
    }
    vis.node_piece_begin[i] = std::int32_t(vis.pieces.size());
    // Walk the upto boundaries: tokens [t, next) are seen by the own queries with
    // upto > t (those from index k on) and by every descendant query.
    std::int32_t k = 0;
    for (std::int32_t t = 0; t < visible;) {
      while (k < own_count && topo.query_upto[std::size_t(own[std::size_t(own_begin[i] + k)])] <= t) ++k;
      const std::int32_t next =
          k < own_count ? topo.query_upto[std::size_t(own[std::size_t(own_begin[i] + k)])] : visible;
      vis.pieces.push_back(Piece{v, std::int32_t(offset + t), std::int32_t(offset + next),
                                 first_position[i] + k, subtree_end});
      t = next;
    }
    vis.node_piece_end[i] = std::int32_t(vis.pieces.size());
    offset += visible;
  }

  vis.token_slot.resize(std::size_t(offset));
  std::int32_t* out = vis.token_slot.data();
  for (std::int32_t v : topo.preorder) {
    const std::size_t i = std::size_t(v);
    if (vis.node_piece_begin[i] == vis.node_piece_end[i]) continue;
    const std::int32_t visible = vis.pieces[std::size_t(vis.node_piece_end[i] - 1)].token_end -
                                 vis.pieces[std::size_t(vis.node_piece_begin[i])].token_begin;
    const TreeNode& node = tree.nodes()[i];
    if (node.listed) {
      for (std::int32_t t = 0; t < visible; ++t) *out++ = std::int32_t(tree.slot(i, t));
    } else {
      for (std::int32_t t = 0; t < visible; ++t) *out++ = std::int32_t(node.first + t);
    }
    vis.max_slot = std::max(vis.max_slot, node.listed ? *std::max_element(out - visible, out)
                                                      : node.first + visible - 1);
  }
  return vis;
}

}  // namespace treeattn
