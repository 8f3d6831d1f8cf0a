#include "visibility.hpp"

#include <algorithm>
#include <limits>

#include "fail.hpp"

namespace treeattn {

Visibility compute_visibility(const Tree& tree, const Topology& topo) {
  const std::size_t n = tree.node_count();
  const std::size_t nq = tree.query_count();
  const std::vector<TreeNode>& nodes = tree.nodes();
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

  // Reverse preorder visits every descendant before its node, so one pass
  // finishes each subtree's query count and, with it, the node's visible
  // tokens: all of them when a descendant has a query, else as many as its
  // farthest-seeing own query.
  std::vector<std::int32_t> subtree_queries(n), visible(n);
  for (std::size_t i = 0; i < n; ++i) subtree_queries[i] = own_begin[i + 1] - own_begin[i];
  std::int64_t total_visible = 0;
  for (auto it = topo.preorder.rbegin(); it != topo.preorder.rend(); ++it) {
    const std::size_t i = std::size_t(*it);
    const std::int32_t own_count = own_begin[i + 1] - own_begin[i];
    if (subtree_queries[i] > own_count) visible[i] = std::int32_t(nodes[i].length);
    else if (own_count > 0) visible[i] = topo.query_upto[std::size_t(own[std::size_t(own_begin[i + 1] - 1)])];
    total_visible += visible[i];
    const std::int32_t p = topo.parent[i];
    if (p >= 0) subtree_queries[std::size_t(p)] += subtree_queries[i];
  }
  if (total_visible > std::numeric_limits<std::int32_t>::max()) {
    fail(ErrorCategory::InvalidTree, "the tree holds {} visible tokens, more than the limit of {}", total_visible,
         std::numeric_limits<std::int32_t>::max());
  }

  // One forward pass in preorder: query positions, pieces and token slots.
  vis.query_at.resize(nq);
  vis.query_position.resize(nq);
  vis.node_piece_begin.assign(n, 0);
  vis.node_piece_end.assign(n, 0);
  vis.pieces.reserve(n + nq);
  vis.token_slot.resize(std::size_t(total_visible));
  std::int32_t* slot_out = vis.token_slot.data();
  std::int32_t position = 0;
  std::int32_t offset = 0;
  for (std::int32_t v : topo.preorder) {
    const std::size_t i = std::size_t(v);
    const std::int32_t first_position = position;
    const std::int32_t* own_first = own.data() + own_begin[i];
    const std::int32_t own_count = own_begin[i + 1] - own_begin[i];
    for (std::int32_t k = 0; k < own_count; ++k) {
      vis.query_at[std::size_t(position)] = own_first[k];
      vis.query_position[std::size_t(own_first[k])] = position;
      ++position;
    }

    // Tokens [t, next) are seen by the own queries with upto > t (those from
    // index k on) and by every descendant query.
    const std::int32_t subtree_end = first_position + subtree_queries[i];
    vis.node_piece_begin[i] = std::int32_t(vis.pieces.size());
    std::int32_t k = 0;
    for (std::int32_t t = 0; t < visible[i];) {
      while (k < own_count && topo.query_upto[std::size_t(own_first[k])] <= t) ++k;
      const std::int32_t next = k < own_count ? topo.query_upto[std::size_t(own_first[k])] : visible[i];
      vis.pieces.push_back(Piece{v, offset + t, offset + next, first_position + k, subtree_end});
      t = next;
    }
    vis.node_piece_end[i] = std::int32_t(vis.pieces.size());

    const TreeNode& node = nodes[i];
    if (node.page_size > 0) {
      // Page by page: a page's slots are consecutive.
      for (std::int32_t t = 0; t < visible[i];) {
        const std::int64_t base = tree.page(i, t / node.page_size) * node.page_size;
        const std::int32_t end = std::min(visible[i], (t / node.page_size + 1) * node.page_size);
        for (std::int32_t offset_in_page = t % node.page_size; t < end; ++t, ++offset_in_page) {
          slot_out[t] = std::int32_t(base + offset_in_page);
        }
        vis.max_slot = std::max<std::int64_t>(vis.max_slot, slot_out[end - 1]);
      }
    } else if (node.listed) {
      for (std::int32_t t = 0; t < visible[i]; ++t) slot_out[t] = std::int32_t(tree.slot(i, t));
      if (visible[i] > 0) vis.max_slot = std::max<std::int64_t>(vis.max_slot, *std::max_element(slot_out, slot_out + visible[i]));
    } else {
      for (std::int32_t t = 0; t < visible[i]; ++t) slot_out[t] = std::int32_t(node.first + t);
      if (visible[i] > 0) vis.max_slot = std::max(vis.max_slot, node.first + visible[i] - 1);
    }
    slot_out += visible[i];
    offset += visible[i];
  }
  return vis;
}

}  // namespace treeattn
