#include "visibility.hpp"

#include <algorithm>
#include <limits>
#include <memory>
#include <utility>

#include "fail.hpp"

namespace treeattn {
namespace {

// The pieces of node v (vis.node_* set for it), its tokens starting at
// `offset` in the flattened order. Tokens [t, next) are seen by the own
// queries with upto > t (those from own index k on) and every descendant query.
void append_pieces(const Topology& topo, const Visibility& vis, std::int32_t v, std::int32_t offset,
                   std::vector<Piece>& out) {
  const std::size_t i = std::size_t(v);
  const std::int32_t first = vis.node_position[i], own_end = vis.node_own_end[i];
  std::int32_t k = first;
  for (std::int32_t t = 0; t < vis.node_visible[i];) {
    while (k < own_end && topo.query_upto[std::size_t(vis.query_at[std::size_t(k)])] <= t) ++k;
    const std::int32_t next = k < own_end ? topo.query_upto[std::size_t(vis.query_at[std::size_t(k)])] : vis.node_visible[i];
    out.push_back(Piece{v, offset + t, offset + next, k, vis.node_subtree_end[i], 0});
    t = next;
  }
}

// Where each query's window starts (query_upto's last token, W - 1 back),
// and what a node's windowed pieces need from below it.
struct WindowBounds {
  std::vector<std::int64_t> start;     // [queries] by query index
  std::vector<std::int64_t> desc_min;  // [nodes] the earliest start of a query below the node
  // Each window start strictly inside a node (node, offset in it), sorted:
  // the piece boundaries windows add. A start lies in one node of its
  // query's path, found by walking up at most the nodes the window spans.
  std::vector<std::pair<std::int32_t, std::int64_t>> cuts;
};

WindowBounds window_bounds(const Tree& tree, const Topology& topo, const std::vector<std::int64_t>& depth,
                           std::int32_t window) {
  constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max();
  const std::size_t n = tree.node_count(), nq = tree.query_count();
  WindowBounds b;
  b.start.resize(nq);
  std::vector<std::int64_t> own_min(n, kNever);
  for (std::size_t q = 0; q < nq; ++q) {
    const std::int32_t v = topo.query_node[q];
    b.start[q] = depth[std::size_t(v)] + topo.query_upto[q] - window;
    own_min[std::size_t(v)] = std::min(own_min[std::size_t(v)], b.start[q]);
    if (b.start[q] <= 0) continue;  // the window holds the whole path
    std::int32_t a = v;
    while (depth[std::size_t(a)] > b.start[q]) a = topo.parent[std::size_t(a)];  // a root's depth is 0
    if (depth[std::size_t(a)] < b.start[q]) b.cuts.emplace_back(a, b.start[q] - depth[std::size_t(a)]);
  }
  std::sort(b.cuts.begin(), b.cuts.end());
  b.desc_min.assign(n, kNever);
  for (auto it = topo.preorder.rbegin(); it != topo.preorder.rend(); ++it) {  // children before their parent
    const std::size_t i = std::size_t(*it);
    const std::int32_t p = topo.parent[i];
    if (p >= 0) b.desc_min[std::size_t(p)] = std::min({b.desc_min[std::size_t(p)], b.desc_min[i], own_min[i]});
  }
  return b;
}

// The windowed pieces of node v among its first `limit` tokens (those some
// query's path reaches), its visible tokens starting at `offset` in the
// flattened order: append_pieces' pieces cut at the window starts `cuts`
// (offsets in the node, ascending), each kept where the earliest window
// start of its viewers reaches it. The viewers [k, subtree end) are the own
// queries from k on, whose starts ascend with their upto, and every query
// below. Returns the tokens kept.
std::int32_t append_window_pieces(const Topology& topo, const Visibility& vis, std::int32_t v, std::int32_t limit,
                                  std::int32_t offset, const std::pair<std::int32_t, std::int64_t>* cut,
                                  const std::pair<std::int32_t, std::int64_t>* cuts_end, std::int64_t desc_min,
                                  std::vector<Piece>& out) {
  const std::size_t i = std::size_t(v);
  const std::int32_t own_end = vis.node_own_end[i], subtree_end = vis.node_subtree_end[i];
  const std::int64_t depth = vis.node_depth[i];
  std::int32_t k = vis.node_position[i], kept = 0;
  for (std::int32_t t = 0; t < limit;) {
    while (k < own_end && topo.query_upto[std::size_t(vis.query_at[std::size_t(k)])] <= t) ++k;
    while (cut != cuts_end && cut->second <= t) ++cut;
    std::int32_t end = k < own_end ? topo.query_upto[std::size_t(vis.query_at[std::size_t(k)])] : limit;
    if (cut != cuts_end && cut->second < end) end = std::int32_t(cut->second);
    const std::int64_t earliest = k < own_end ? std::min(vis.window_start[std::size_t(k)], desc_min) : desc_min;
    if (earliest <= depth + t) {
      out.push_back(Piece{v, offset + kept, offset + kept + (end - t), k, subtree_end, depth + t});
      kept += end - t;
    }
    t = end;
  }
  return kept;
}

// The KV-pool rows of tokens [from, to) of the node at `index`, written to
// out[0..to - from); returns the largest (-1 for none).
std::int64_t write_slots(const Tree& tree, std::size_t index, std::int32_t from, std::int32_t to, std::int32_t* out) {
  if (from >= to) return -1;
  const TreeNode& node = tree.nodes()[index];
  if (node.page_size > 0) {
    // Page by page: a page's slots are consecutive (one division, where the
    // tokens start inside the node).
    std::int64_t largest = -1;
    std::int64_t page = from == 0 ? 0 : from / node.page_size;
    std::int32_t offset_in_page = std::int32_t(from - page * node.page_size);
    for (std::int32_t t = from; t < to; ++page, offset_in_page = 0) {
      const std::int64_t base = tree.page(index, page) * node.page_size;
      const std::int32_t end = std::min(to, t + (node.page_size - offset_in_page));
      for (; t < end; ++t, ++offset_in_page) out[t - from] = std::int32_t(base + offset_in_page);
      largest = std::max<std::int64_t>(largest, out[end - 1 - from]);
    }
    return largest;
  }
  if (node.listed) {
    for (std::int32_t t = from; t < to; ++t) out[t - from] = std::int32_t(tree.slot(index, t));
    return *std::max_element(out, out + (to - from));
  }
  for (std::int32_t t = from; t < to; ++t) out[t - from] = std::int32_t(node.first + t);
  return node.first + to - 1;
}

// The KV-pool rows of the node at `index`'s visible tokens (vis.node_* and
// its pieces set), written to out[0..node_visible); returns the largest (-1
// for none). Without a window they are its first node_visible tokens; with
// one, its pieces' tokens, which may leave gaps in the node.
std::int64_t write_node_slots(const Tree& tree, const Visibility& vis, std::size_t index, std::int32_t* out) {
  if (vis.window == 0) return write_slots(tree, index, 0, vis.node_visible[index], out);
  std::int64_t largest = -1;
  const std::int32_t first = vis.node_piece_begin[index];
  if (first == vis.node_piece_end[index]) return largest;
  const std::int32_t base = vis.pieces[std::size_t(first)].token_begin;
  for (std::int32_t p = first; p < vis.node_piece_end[index]; ++p) {
    const Piece& piece = vis.pieces[std::size_t(p)];
    const std::int32_t from = std::int32_t(piece.path_begin - vis.node_depth[index]);
    const std::int32_t count = piece.token_end - piece.token_begin;
    largest = std::max(largest, write_slots(tree, index, from, from + count, out + (piece.token_begin - base)));
  }
  return largest;
}

// Whether a node's recomputed pieces are its old ones with only the last
// longer: the same viewers, and the same starts relative to its first token.
bool only_last_piece_longer(const Piece* old, const Piece* fresh, std::size_t count) {
  for (std::size_t k = 0; k < count; ++k) {
    if (fresh[k].viewer_lo != old[k].viewer_lo || fresh[k].viewer_hi != old[k].viewer_hi ||
        fresh[k].token_begin - fresh[0].token_begin != old[k].token_begin - old[0].token_begin) {
      return false;
    }
    if (k + 1 < count && fresh[k].token_end - fresh[0].token_begin != old[k].token_end - old[0].token_begin) return false;
  }
  return true;
}

void check_total(std::int64_t total_visible) {
  if (total_visible > std::numeric_limits<std::int32_t>::max()) {
    fail(ErrorCategory::InvalidTree, "the tree holds {} visible tokens, more than the limit of {}", total_visible,
         std::numeric_limits<std::int32_t>::max());
  }
}

}  // namespace

bool narrow_viewers(const Visibility& vis, Piece& piece, std::int32_t lo, std::int32_t hi) {
  piece.viewer_lo = std::max(piece.viewer_lo, lo);
  piece.viewer_hi = std::min(piece.viewer_hi, hi);
  if (vis.window == 0) return piece.viewer_lo < piece.viewer_hi;
  // The range's minimum window start, from the segment tree's cover of it.
  const std::size_t n = vis.window_start.size();
  for (std::size_t l = std::size_t(piece.viewer_lo) + n, r = std::size_t(std::max(piece.viewer_lo, piece.viewer_hi)) + n;
       l < r; l >>= 1, r >>= 1) {
    if ((l & 1) != 0 && vis.window_start_min[l++] <= piece.path_begin) return true;
    if ((r & 1) != 0 && vis.window_start_min[--r] <= piece.path_begin) return true;
  }
  return false;
}

Visibility compute_visibility(const Tree& tree, const Topology& topo, std::int32_t window) {
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
  check_total(total_visible);

  // With a window: each node's path position, and the window bounds.
  WindowBounds bounds;
  vis.window = window;
  if (window > 0) {
    vis.node_depth = node_path_depths(tree, topo);
    bounds = window_bounds(tree, topo, vis.node_depth, window);
    vis.window_start.resize(nq);
  }
  const auto* cut = bounds.cuts.data();
  const auto* cuts_end = cut + bounds.cuts.size();

  // One forward pass in preorder: query positions, pieces and token slots.
  vis.query_at.resize(nq);
  vis.query_position.resize(nq);
  vis.node_piece_begin.assign(n, 0);
  vis.node_piece_end.assign(n, 0);
  vis.node_position.assign(n, 0);
  vis.node_subtree_end.assign(n, 0);
  vis.node_own_end.assign(n, 0);
  vis.node_visible = visible;
  vis.node_max_slot.assign(n, -1);
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
      if (window > 0) vis.window_start[std::size_t(position)] = bounds.start[std::size_t(own_first[k])];
      ++position;
    }

    const std::int32_t subtree_end = first_position + subtree_queries[i];
    vis.node_position[i] = first_position;
    vis.node_own_end[i] = position;
    vis.node_subtree_end[i] = subtree_end;
    vis.node_piece_begin[i] = std::int32_t(vis.pieces.size());
    if (window > 0) {
      const auto* node_cuts = std::lower_bound(cut, cuts_end, std::make_pair(v, std::int64_t(0)));
      vis.node_visible[i] = append_window_pieces(topo, vis, v, visible[i], offset, node_cuts, cuts_end,
                                                 bounds.desc_min[i], vis.pieces);
    } else {
      append_pieces(topo, vis, v, offset, vis.pieces);
    }
    vis.node_piece_end[i] = std::int32_t(vis.pieces.size());

    vis.node_max_slot[i] = write_node_slots(tree, vis, i, slot_out);
    vis.max_slot = std::max(vis.max_slot, vis.node_max_slot[i]);
    slot_out += vis.node_visible[i];
    offset += vis.node_visible[i];
  }
  vis.token_slot.resize(std::size_t(offset));  // a window leaves tokens out
  if (window > 0) {
    vis.window_start_min.assign(2 * nq, 0);
    std::copy(vis.window_start.begin(), vis.window_start.end(), vis.window_start_min.begin() + std::ptrdiff_t(nq));
    for (std::size_t k = nq; k-- > 1;) {
      vis.window_start_min[k] = std::min(vis.window_start_min[2 * k], vis.window_start_min[2 * k + 1]);
    }
  }
  return vis;
}

bool update_visibility(const Tree& tree, const Topology& topo, Visibility& vis, const std::vector<std::int32_t>& grown,
                       VisibleGrowth* growth) {
  struct Change {
    std::int32_t node, old_visible, new_visible;
    std::int32_t begin;  // its first token in the flattened order, as it was
    std::size_t pieces;  // its recomputed pieces start here in `fresh`
  };
  std::vector<Change> changes;
  std::vector<Piece> fresh;  // a grown node has a piece or two, rarely more
  changes.reserve(grown.size());
  fresh.reserve(2 * grown.size());
  std::int64_t total = std::int64_t(vis.token_slot.size());
  bool tails_only = growth != nullptr;  // only checked where asked for
  if (growth != nullptr) {
    growth->tails_only = false;
    growth->tails.clear();
  }
  if (vis.window > 0) return false;
  for (std::int32_t v : grown) {
    const std::size_t i = std::size_t(v);
    const std::int32_t first = vis.node_position[i], own_end = vis.node_own_end[i];
    auto upto = [&](std::int32_t position) { return topo.query_upto[std::size_t(vis.query_at[std::size_t(position)])]; };
    for (std::int32_t k = first + 1; k < own_end; ++k) {  // still sorted by visible tokens, then index?
      const std::int32_t a = upto(k - 1), b = upto(k);
      if (a > b || (a == b && vis.query_at[std::size_t(k - 1)] > vis.query_at[std::size_t(k)])) return false;
    }
    const std::int32_t old_visible = vis.node_visible[i];
    const std::int32_t new_visible = vis.node_subtree_end[i] > own_end ? std::int32_t(tree.nodes()[i].length)
                                     : own_end > first                  ? upto(own_end - 1)
                                                                        : 0;
    if (new_visible == old_visible) continue;
    if (old_visible == 0) return false;  // a node coming into sight gets its first pieces
    const std::int32_t begin = vis.pieces[std::size_t(vis.node_piece_begin[i])].token_begin;
    const std::size_t at = fresh.size();
    vis.node_visible[i] = new_visible;  // append_pieces reads it; put back below
    append_pieces(topo, vis, v, begin, fresh);
    vis.node_visible[i] = old_visible;
    if (std::int32_t(fresh.size() - at) != vis.node_piece_end[i] - vis.node_piece_begin[i]) return false;
    tails_only = tails_only && only_last_piece_longer(vis.pieces.data() + vis.node_piece_begin[i], fresh.data() + at,
                                                      fresh.size() - at);
    changes.push_back(Change{v, old_visible, new_visible, begin, at});
    total += new_visible - old_visible;
  }
  if (growth != nullptr) growth->tails_only = tails_only;
  if (changes.empty()) return true;
  check_total(total);
  // In flattened order (visible nodes have distinct first tokens), which the
  // grown nodes often arrive in already. Otherwise each change marks its
  // node's first piece, and the marks are read in piece order, which is the
  // flattened order: no comparison sort over thousands of grown nodes.
  const auto flattened = [](const Change& a, const Change& b) { return a.begin < b.begin; };
  if (!std::is_sorted(changes.begin(), changes.end(), flattened)) {
    std::vector<std::uint64_t> marked((vis.pieces.size() + 63) / 64, 0);
    const std::unique_ptr<std::uint32_t[]> change_at(new std::uint32_t[vis.pieces.size()]);  // read only where marked
    for (std::size_t k = 0; k < changes.size(); ++k) {
      const std::size_t piece = std::size_t(vis.node_piece_begin[std::size_t(changes[k].node)]);
      marked[piece / 64] |= std::uint64_t(1) << (piece % 64);
      change_at[piece] = std::uint32_t(k);
    }
    std::vector<Change> ordered;
    ordered.reserve(changes.size());
    for (std::size_t w = 0; w < marked.size(); ++w) {
      for (std::uint64_t bits = marked[w]; bits != 0; bits &= bits - 1) {
        ordered.push_back(changes[change_at[w * 64 + std::size_t(__builtin_ctzll(bits))]]);
      }
    }
    changes = std::move(ordered);
  }

  // Token slots, in place from the back: the tokens between two grown nodes'
  // ends move right by the tokens appended before them (a grown node's old
  // tokens with the stretch before it), and the appended tokens are written
  // into the gap behind their node's (no allocation once capacity suffices).
  const std::size_t old_total = vis.token_slot.size();
  vis.token_slot.resize(std::size_t(total));
  std::int32_t* slots = vis.token_slot.data();
  std::int64_t shift = total - std::int64_t(old_total), end = std::int64_t(old_total);
  for (auto c = changes.rbegin(); c != changes.rend(); ++c) {
    const std::int64_t old_end = c->begin + c->old_visible;
    std::copy_backward(slots + old_end, slots + end, slots + end + shift);
    shift -= c->new_visible - c->old_visible;
    // The node's slots will start at begin + shift; its new tokens follow its old ones.
    std::int32_t* node_slots = slots + c->begin + shift;
    std::int64_t& node_max = vis.node_max_slot[std::size_t(c->node)];
    node_max = std::max(node_max, write_slots(tree, std::size_t(c->node), c->old_visible, c->new_visible,
                                                   node_slots + c->old_visible));
    vis.max_slot = std::max(vis.max_slot, node_max);
    end = old_end;
  }

  // Pieces: between grown nodes shifted by the tokens appended before them,
  // a grown node's own recomputed.
  std::int32_t by = 0;
  std::size_t next = 0;
  auto shift_to = [&](std::size_t stop) {
    for (; next < stop; ++next) {
      vis.pieces[next].token_begin += by;
      vis.pieces[next].token_end += by;
    }
  };
  for (const Change& c : changes) {
    const std::size_t i = std::size_t(c.node);
    shift_to(std::size_t(vis.node_piece_begin[i]));
    for (std::int32_t p = vis.node_piece_begin[i]; p < vis.node_piece_end[i]; ++p) {
      Piece piece = fresh[c.pieces + std::size_t(p - vis.node_piece_begin[i])];
      piece.token_begin += by;
      piece.token_end += by;
      vis.pieces[std::size_t(p)] = piece;
    }
    next = std::size_t(vis.node_piece_end[i]);
    by += c.new_visible - c.old_visible;
    vis.node_visible[i] = c.new_visible;
  }
  shift_to(vis.pieces.size());
  if (growth != nullptr && tails_only) {
    for (const Change& c : changes) growth->tails.push_back({c.begin + c.old_visible, c.new_visible - c.old_visible});
  }
  return true;
}

void replace_slots(const Tree& tree, Visibility& vis, const std::vector<std::int32_t>& nodes) {
  bool gave_up_largest = false;
  std::int64_t largest = -1;
  for (std::int32_t v : nodes) {
    const std::size_t i = std::size_t(v);
    if (vis.node_visible[i] == 0) continue;
    gave_up_largest = gave_up_largest || vis.node_max_slot[i] == vis.max_slot;
    std::int32_t* slots = vis.token_slot.data() + vis.pieces[std::size_t(vis.node_piece_begin[i])].token_begin;
    vis.node_max_slot[i] = write_node_slots(tree, vis, i, slots);
    largest = std::max(largest, vis.node_max_slot[i]);
  }
  vis.max_slot = gave_up_largest ? *std::max_element(vis.node_max_slot.begin(), vis.node_max_slot.end())
                                 : std::max(vis.max_slot, largest);
}

}  // namespace treeattn
