#include "topology.hpp"

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include <fmt/ranges.h>

#include "fail.hpp"
#include "id_map.hpp"

namespace treeattn {
namespace {

constexpr std::int64_t kMaxSlot = std::numeric_limits<std::int32_t>::max() - 1;

std::string node_name(const Tree& tree, std::int32_t index) {
  return fmt::format("node {} (nodes[{}])", tree.nodes()[std::size_t(index)].id, index);
}

// "head_dim 192 with head_dim_v 128", the QK/V pairs other than equal dims.
std::string split_head_dims_text() {
  std::vector<std::string> pairs;
  for (SplitHeadDims s : kSupportedSplitHeadDims) {
    pairs.push_back(fmt::format("head_dim {} with head_dim_v {}", s.head_dim, s.head_dim_v));
  }
  return fmt::format("{}", fmt::join(pairs, ", "));
}

}  // namespace

void check_heads(const HeadConfig& h) {
  if (h.heads_q <= 0) fail(ErrorCategory::InvalidTree, "heads_q = {} must be positive", h.heads_q);
  if (h.heads_kv <= 0) fail(ErrorCategory::InvalidTree, "heads_kv = {} must be positive", h.heads_kv);
  if (h.heads_q % h.heads_kv != 0) {
    fail(ErrorCategory::InvalidTree, "heads_q = {} is not a multiple of heads_kv = {}", h.heads_q,
         h.heads_kv);
  }
  if (h.head_dim_v < 0) fail(ErrorCategory::InvalidTree, "head_dim_v = {} must be positive (0: head_dim)", h.head_dim_v);
  if (h.value_dim() == h.head_dim) {
    if (std::find(std::begin(kSupportedHeadDims), std::end(kSupportedHeadDims), h.head_dim) == std::end(kSupportedHeadDims)) {
      fail(ErrorCategory::InvalidTree, "head_dim = {} is not supported (supported: {}; or {})", h.head_dim,
           fmt::join(kSupportedHeadDims, ", "), split_head_dims_text());
    }
  } else if (std::none_of(std::begin(kSupportedSplitHeadDims), std::end(kSupportedSplitHeadDims),
                          [&](SplitHeadDims s) { return s.head_dim == h.head_dim && s.head_dim_v == h.head_dim_v; })) {
    fail(ErrorCategory::InvalidTree, "head_dim = {} with head_dim_v = {} is not supported (supported: {})", h.head_dim,
         h.head_dim_v, split_head_dims_text());
  }
  if (!(h.scale >= 0.0f) || h.scale == std::numeric_limits<float>::infinity()) {
    fail(ErrorCategory::InvalidTree, "scale = {} must be positive and finite (0 selects 1/sqrt(head_dim))",
         h.scale);
  }
}

namespace {

// Maps node ids to indices (one flat table); throws on a duplicate id and on
// kNoParent as an id (no child could name that node as its parent).
IdMap index_ids(const Tree& tree) {
  IdMap ids;
  ids.reset(tree.node_count());
  for (std::int32_t i = 0; i < std::int32_t(tree.node_count()); ++i) {
    const std::int64_t id = tree.nodes()[std::size_t(i)].id;
    if (id == kNoParent) {
      fail(ErrorCategory::InvalidTree, "nodes[{}]: id {} is the parent of a root (kNoParent), not a node id", i, id);
    }
    const std::int32_t previous = ids.insert(id, i);
    if (previous >= 0) fail(ErrorCategory::InvalidTree, "duplicate node id {} (nodes[{}] and nodes[{}])", id, previous, i);
  }
  return ids;
}

}  // namespace

void check_slots(const Tree& tree, std::int32_t index, std::int64_t kv_slots, std::int64_t from_token) {
  const TreeNode& node = tree.nodes()[std::size_t(index)];
  if (node.length < 0) {
    fail(ErrorCategory::InvalidTree, "{}: slot_range count {} is negative", node_name(tree, index),
         node.length);
  }
  if (node.length > kMaxCount) {
    fail(ErrorCategory::InvalidTree, "{}: {} tokens exceed the limit of {} per node",
         node_name(tree, index), node.length, kMaxCount);
  }
  const std::int64_t limit = kv_slots > 0 ? kv_slots - 1 : kMaxSlot;
  auto check = [&](std::int64_t slot, std::int64_t token, const char* field) {
    if (slot < 0) {
      fail(ErrorCategory::InvalidTree, "{}: {}[{}] = {} is negative", node_name(tree, index), field,
           token, slot);
    }
    if (slot > limit) {
      if (kv_slots > 0) {
        fail(ErrorCategory::InvalidTree,
             "{}: {}[{}] = {} is out of range for a KV pool of {} slots", node_name(tree, index),
             field, token, slot, kv_slots);
      }
      fail(ErrorCategory::InvalidTree, "{}: {}[{}] = {} exceeds the slot limit {}",
           node_name(tree, index), field, token, slot, kMaxSlot);
    }
  };
  if (node.page_size != 0 || node.pages > 0) {
    // Paged: the length must fit the pages, and each page is checked whole (its last used slot).
    if (node.page_size <= 0) {
      fail(ErrorCategory::InvalidTree, "{}: page_size {} must be positive", node_name(tree, index), node.page_size);
    }
    const std::int64_t full = (node.pages - 1) * std::int64_t(node.page_size);
    if (node.pages == 0 ? node.length != 0 : (node.length <= full || node.length > full + node.page_size)) {
      fail(ErrorCategory::InvalidTree, "{}: {} pages of {} tokens with {} in the last: last_page_tokens must be 1 to {}",
           node_name(tree, index), node.pages, node.page_size, node.length - std::max<std::int64_t>(full, 0),
           node.page_size);
    }
    for (std::int64_t p = from_token == 0 ? 0 : from_token / node.page_size; p < node.pages; ++p) {
      const std::int64_t page = tree.page(std::size_t(index), p);
      if (page < 0) fail(ErrorCategory::InvalidTree, "{}: pages[{}] = {} is negative", node_name(tree, index), p, page);
      if (page > kMaxSlot / node.page_size) {  // its slots may not fit int64
        fail(ErrorCategory::InvalidTree, "{}: pages[{}] = {} of {} tokens starts past the slot limit {}",
             node_name(tree, index), p, page, node.page_size, kMaxSlot);
      }
      const std::int64_t used = p + 1 < node.pages ? node.page_size : node.length - full;
      check(page * node.page_size + used - 1, p * node.page_size + used - 1, "tokens");
    }
  } else if (node.listed) {
    for (std::int64_t t = from_token; t < node.length; ++t) check(tree.slot(std::size_t(index), t), t, "slots");
  } else {
    if (node.first < 0) {
      fail(ErrorCategory::InvalidTree, "{}: slot_range start {} is negative", node_name(tree, index),
           node.first);
    }
    // The last slot of the range decides, reported as an offset in the range;
    // a start past the limit is reported itself (its end may not fit int64).
    if (node.length > 0 && node.first > limit) check(node.first, 0, "slot_range");
    if (node.length > 0) check(node.first + node.length - 1, node.length - 1, "slot_range");
  }
}

namespace {

// Walks the forest depth-first from its roots, recording the preorder. A node the walk never reaches sits on (or hangs below) a cycle
// of parent links: that cycle is reported by node id.
void fill_preorder(Topology& topo) {
  topo.preorder.clear();
  topo.preorder.reserve(topo.parent.size());
  std::vector<std::int32_t> stack(topo.roots.rbegin(), topo.roots.rend());
  while (!stack.empty()) {
    const std::size_t v = std::size_t(stack.back());
    stack.pop_back();
    topo.preorder.push_back(std::int32_t(v));
    for (std::int32_t c = topo.child_begin[v + 1] - 1; c >= topo.child_begin[v]; --c) {
      stack.push_back(topo.children[std::size_t(c)]);
    }
  }
}

void walk_preorder(const Tree& tree, Topology& topo) {
  const std::size_t n = tree.node_count();
  fill_preorder(topo);
  if (topo.preorder.size() == n) return;

  std::vector<char> reached(n, 0);
  for (std::int32_t v : topo.preorder) reached[std::size_t(v)] = 1;
  std::int32_t v = 0;
  while (reached[std::size_t(v)]) ++v;
  // Follow parents from an unreached node until one repeats: that is the cycle.
  std::vector<std::int32_t> seen_at(n, -1);
  std::vector<std::int32_t> walk;
  while (seen_at[std::size_t(v)] < 0) {
    seen_at[std::size_t(v)] = std::int32_t(walk.size());
    walk.push_back(v);
    v = topo.parent[std::size_t(v)];
  }
  std::string cycle;
  for (std::size_t i = std::size_t(seen_at[std::size_t(v)]); i < walk.size(); ++i) {
    cycle += fmt::format("{} -> ", tree.nodes()[std::size_t(walk[i])].id);
  }
  cycle += fmt::format("{}", tree.nodes()[std::size_t(v)].id);
  fail(ErrorCategory::InvalidTree, "cycle in the parent links: {} (by node id)", cycle);
}

}  // namespace

Topology analyze(const Tree& tree, std::int64_t kv_slots, std::size_t checked_nodes) {
  check_heads(tree.heads);
  const auto& nodes = tree.nodes();
  if (nodes.size() > std::size_t(kMaxCount)) {
    fail(ErrorCategory::InvalidTree, "{} nodes exceed the limit of {}", nodes.size(), kMaxCount);
  }
  if (tree.query_count() > std::size_t(kMaxCount)) {
    fail(ErrorCategory::InvalidTree, "{} queries exceed the limit of {}", tree.query_count(), kMaxCount);
  }
  const std::int32_t n = std::int32_t(nodes.size());
  const IdMap ids = index_ids(tree);

  Topology topo;
  topo.parent.resize(std::size_t(n));
  topo.child_begin.assign(std::size_t(n) + 1, 0);
  for (std::int32_t i = 0; i < n; ++i) {
    const TreeNode& node = nodes[std::size_t(i)];
    std::int32_t p = -1;
    if (node.parent != kNoParent) {
      p = ids.find(node.parent);
      if (p < 0) {
        fail(ErrorCategory::InvalidTree, "{}: parent {} is not a node id", node_name(tree, i),
             node.parent);
      }
      if (p == i) fail(ErrorCategory::InvalidTree, "{} is its own parent", node_name(tree, i));
      ++topo.child_begin[std::size_t(p) + 1];
    } else {
      topo.roots.push_back(i);
    }
    topo.parent[std::size_t(i)] = p;
    if (std::size_t(i) >= checked_nodes) check_slots(tree, i, kv_slots, 0);
  }
  for (std::int32_t i = 0; i < n; ++i) topo.child_begin[std::size_t(i) + 1] += topo.child_begin[std::size_t(i)];
  topo.children.resize(std::size_t(topo.child_begin[std::size_t(n)]));
  {
    std::vector<std::int32_t> fill(topo.child_begin.begin(), topo.child_begin.end() - 1);
    for (std::int32_t i = 0; i < n; ++i) {
      const std::int32_t p = topo.parent[std::size_t(i)];
      if (p >= 0) topo.children[std::size_t(fill[std::size_t(p)]++)] = i;
    }
  }
  walk_preorder(tree, topo);

  const auto& queries = tree.queries();
  topo.query_node.resize(queries.size());
  topo.query_upto.resize(queries.size());
  for (std::size_t q = 0; q < queries.size(); ++q) {
    const TreeQuery& query = queries[q];
    const std::int32_t v = ids.find(query.node);
    if (v < 0) fail(ErrorCategory::InvalidTree, "queries[{}]: node {} is not a node id", q, query.node);
    const std::int64_t length = nodes[std::size_t(v)].length;
    std::int64_t upto = query.upto;
    if (upto == kWholeNode) {
      upto = length;
    } else if (upto < 0) {
      fail(ErrorCategory::InvalidTree, "queries[{}]: upto {} is negative", q, upto);
    } else if (upto > length) {
      fail(ErrorCategory::InvalidTree, "queries[{}]: upto {} exceeds the {} tokens of {}", q, upto,
           length, node_name(tree, v));
    }
    if (upto == 0) {  // rare (upto 0 or an empty node): walk up for any visible token
      bool sees_any = false;
      for (std::int32_t a = topo.parent[std::size_t(v)]; a >= 0 && !sees_any; a = topo.parent[std::size_t(a)]) {
        sees_any = nodes[std::size_t(a)].length > 0;
      }
      if (!sees_any) {
        fail(ErrorCategory::InvalidTree,
             "queries[{}] on {} sees no token (upto {} of {} tokens, and no ancestor holds any)", q,
             node_name(tree, v), upto, length);
      }
    }
    topo.query_node[q] = v;
    topo.query_upto[q] = std::int32_t(upto);
  }
  return topo;
}

std::vector<std::int64_t> node_path_depths(const Tree& tree, const Topology& topo) {
  std::vector<std::int64_t> depth(tree.node_count(), 0);
  for (std::int32_t v : topo.preorder) {  // parents first
    const std::int32_t p = topo.parent[std::size_t(v)];
    if (p >= 0) depth[std::size_t(v)] = depth[std::size_t(p)] + tree.nodes()[std::size_t(p)].length;
  }
  return depth;
}

void move_children_last(Topology& topo, const std::vector<std::uint8_t>& last) {
  // A stable partition of each child list, written out so the planner's
  // repeated calls allocate nothing (std::stable_partition takes a buffer per call).
  std::vector<std::int32_t> moved;
  for (std::size_t v = 0; v + 1 < topo.child_begin.size(); ++v) {
    const auto first = topo.children.begin() + topo.child_begin[v], end = topo.children.begin() + topo.child_begin[v + 1];
    auto kept = first;
    moved.clear();
    for (auto c = first; c != end; ++c) {
      if (last[std::size_t(*c)]) moved.push_back(*c);
      else *kept++ = *c;
    }
    std::copy(moved.begin(), moved.end(), kept);
  }
  fill_preorder(topo);
}

void validate(const Tree& tree, std::int64_t kv_slots) { (void)analyze(tree, kv_slots); }

}  // namespace treeattn
