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
    std::stable_sort(own.begin() + own_begin[i], own.begin() + own_begin[i + 1],
                     [&](std::int32_t a, std::int32_t b) {
                       return topo.query_upto[std::size_t(a)] < topo.query_upto[std::size_t(b)];
                     });
  }

  // Preorder walk with an explicit stack; a node is pushed twice, the second
  // time (marked by ~index) to close its subtree's position range.
  vis.query_at.resize(nq);
  vis.query_position.resize(nq);
  vis.dfs_nodes.reserve(n);
  vis.depth.assign(n, 0);
  std::vector<std::int32_t> first_position(n), subtree_end(n);
  std::vector<std::int32_t> stack;
  stack.reserve(2 * n);
  for (auto r = topo.roots.rbegin(); r != topo.roots.rend(); ++r) stack.push_back(*r);
  std::int32_t position = 0;
  while (!stack.empty()) {
    const std::int32_t top = stack.back();
    stack.pop_back();
    if (top < 0) {
      subtree_end[std::size_t(~top)] = position;
      continue;
    }
    const std::size_t v = std::size_t(top);
    vis.dfs_nodes.push_back(top);
    first_position[v] = position;
    for (std::int32_t k = own_begin[v]; k < own_begin[v + 1]; ++k) {
      vis.query_at[std::size_t(position)] = own[std::size_t(k)];
      vis.query_position[std::size_t(own[std::size_t(k)])] = position;
      ++position;
    }
    stack.push_back(~top);
    for (std::int32_t c = topo.child_begin[v + 1] - 1; c >= topo.child_begin[v]; --c) {
      const std::int32_t child = topo.children[std::size_t(c)];
      vis.depth[std::size_t(child)] = vis.depth[v] + 1;
      stack.push_back(child);
    }
  }

  // Visible tokens of each node and its pieces, in preorder.
  vis.node_piece_begin.assign(n, 0);
  vis.node_piece_end.assign(n, 0);
  vis.pieces.reserve(n + nq);
  std::int64_t offset = 0;
  for (std::int32_t v : vis.dfs_nodes) {
    const std::size_t i = std::size_t(v);
    const std::int32_t own_count = own_begin[i + 1] - own_begin[i];
    const bool has_descendant_viewers = subtree_end[i] > first_position[i] + own_count;
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
                                 first_position[i] + k, subtree_end[i]});
      t = next;
    }
    vis.node_piece_end[i] = std::int32_t(vis.pieces.size());
    offset += visible;
  }

  vis.token_slot.resize(std::size_t(offset));
  std::int32_t* out = vis.token_slot.data();
  for (std::int32_t v : vis.dfs_nodes) {
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
