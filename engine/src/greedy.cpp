#include "greedy.hpp"

#include <algorithm>
#include <optional>
#include <queue>
#include <utility>

namespace treeattn {
namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

using Group = GreedyGroup;
using Unit = GreedyUnit;

// The model's cost of a unit over all KV heads, its partial rows included, and
// its longest pass: one evaluation gives both.
struct UnitPrice {
  double work_ns, max_pass_ns;
};
class UnitCost {
 public:
  UnitCost(const CostModel& model, const HeadConfig& heads, std::int32_t query_tile)
      : model_(model), heads_(heads), query_tile_(query_tile) {}

  UnitPrice price(std::int64_t tokens, std::int64_t blocks, std::int64_t viewers) const {
    const GroupCost g = group_cost(model_, tokens, blocks, viewers, heads_.group_size(), query_tile_);
    return {g.cost_ns * heads_.heads_kv + double(blocks * viewers) * heads_.heads_q * model_.partial_ns, g.max_pass_ns};
  }
  double work_ns(std::int64_t tokens, std::int64_t blocks, std::int64_t viewers) const {
    return price(tokens, blocks, viewers).work_ns;
  }
  const CostModel& model() const { return model_; }

 private:
  const CostModel& model_;
  const HeadConfig& heads_;
  std::int32_t query_tile_;
};

// The viewers of a pack: its groups' query-position ranges, which arrive in
// depth-first order, so each starts at or after the previous one and is either
// nested in the ranges so far or past them: the count and the furthest end suffice.
class Viewers {
 public:
  void reset(std::int32_t lo, std::int32_t hi) {
    end_ = hi;
    count_ = hi - lo;
  }
  // Distinct viewers once [lo, hi) joins.
  std::int64_t count_with(std::int32_t lo, std::int32_t hi) const {
    return count_ + (lo < end_ ? std::max(0, hi - end_) : hi - lo);
  }
  void add(std::int32_t lo, std::int32_t hi) {
    count_ = count_with(lo, hi);
    end_ = std::max(end_, hi);
  }

 private:
  std::int32_t end_ = 0;
  std::int64_t count_ = 0;
};

// DeFT-Flatten's packing, where it pays: a group shorter than block_tokens
// joins the open pack of its depth-first predecessors while one pass over both
// (the union of their queries, masked) costs less than a pass over each. Every
// unit starts as one block, as long as its group: a long group is one pass per
// query tile, its KV read once with no partials, until splitting cuts it.
std::vector<Unit> pack_groups(const std::vector<Group>& groups, const UnitCost& cost, std::int32_t block_tokens) {
  std::vector<Unit> units;
  Viewers pack_viewers;
  bool open = false;
  std::optional<double> pack_ns;  // the open pack's work, once priced (a join prices the pack it makes)
  for (std::size_t k = 0; k < groups.size(); ++k) {
    const Group& g = groups[k];
    const std::int64_t own_viewers = g.hi - g.lo;
    std::optional<double> own_ns;
    if (open && g.tokens < block_tokens && units.back().tokens + g.tokens <= block_tokens) {
      Unit& pack = units.back();
      const std::int64_t joined_viewers = pack_viewers.count_with(g.lo, g.hi);
      const double joined = cost.work_ns(pack.tokens + g.tokens, 1, joined_viewers);
      if (!pack_ns) pack_ns = cost.work_ns(pack.tokens, 1, pack.viewers);
      own_ns = cost.work_ns(g.tokens, 1, own_viewers);
      if (joined <= *pack_ns + *own_ns) {
        pack.last = k + 1;
        pack.tokens += g.tokens;
        pack.viewers = joined_viewers;
        pack_viewers.add(g.lo, g.hi);
        pack_ns = joined;
        continue;
      }
    }
    units.push_back(Unit{k, k + 1, g.tokens, own_viewers, 1});
    open = g.tokens < block_tokens;
    pack_viewers.reset(g.lo, g.hi);
    pack_ns = own_ns;
  }
  return units;
}

// Long-context splitting: while the step is bound by its longest passes (a
// device that few passes cannot fill, or a few long nodes that the rest wait
// on), cut the unit with the longest passes into enough blocks to drop one KV
// tile from each, as long as the model's step time falls and blocks keep
// min_split_tokens.
void split_long_units(std::vector<Unit>& units, const UnitCost& cost) {
  const CostModel& model = cost.model();
  struct Entry {
    double pass_ns;
    std::size_t unit;
    bool operator<(const Entry& o) const { return pass_ns < o.pass_ns || (pass_ns == o.pass_ns && unit > o.unit); }
  };
  std::priority_queue<Entry> longest;
  double work = 0.0;
  std::vector<double> unit_work(units.size());  // at the unit's current blocks
  for (std::size_t u = 0; u < units.size(); ++u) {
    const UnitPrice p = cost.price(units[u].tokens, units[u].blocks, units[u].viewers);
    unit_work[u] = p.work_ns;
    work += p.work_ns;
    longest.push({p.max_pass_ns, u});
  }
  // Many units often share the longest pass (a plateau): cutting one of them
  // leaves the step time as it was until the last is cut. So cuts that keep
  // the time are taken too, and the blocks return to the best point seen
  // (the cuts since then are undone).
  double best_us = step_time_us(model, work, longest.empty() ? 0.0 : longest.top().pass_ns);
  std::vector<std::pair<std::size_t, std::int64_t>> since_best;  // unit, its blocks before the cut
  while (!longest.empty()) {
    const Entry top = longest.top();
    Unit& u = units[top.unit];
    // The next cut that shortens its passes: one 64-token KV tile fewer per block.
    const std::int64_t tiles = ceil_div(ceil_div(u.tokens, u.blocks), kKvTileTokens);
    const std::int64_t blocks = tiles > 1 ? ceil_div(u.tokens, (tiles - 1) * kKvTileTokens) : u.blocks + 1;
    if (ceil_div(u.tokens, blocks) < model.min_split_tokens || blocks > u.tokens) break;  // the critical path stays
    longest.pop();
    const double next_longest = longest.empty() ? 0.0 : longest.top().pass_ns;
    const UnitPrice split = cost.price(u.tokens, blocks, u.viewers);
    const double split_work = work - unit_work[top.unit] + split.work_ns;
    const double split_pass = split.max_pass_ns;
    const double split_us = step_time_us(model, split_work, std::max(split_pass, next_longest));
    if (split_us > step_time_us(model, work, top.pass_ns)) break;
    since_best.emplace_back(top.unit, u.blocks);
    u.blocks = blocks;
    unit_work[top.unit] = split.work_ns;
    work = split_work;
    longest.push({split_pass, top.unit});
    if (split_us < best_us) {
      best_us = split_us;
      since_best.clear();
    }
  }
  for (auto it = since_best.rbegin(); it != since_best.rend(); ++it) units[it->first].blocks = it->second;
}

// Each node its own group: the queries below it, its own visible tokens.
void ungrouped_counts(std::size_t n, GreedyGroups& g, const GreedyEdges& edges) {
  g.queries.resize(n);
  g.tokens.resize(n);
  for (std::size_t v = 0; v < n; ++v) {
    g.queries[v] = edges.queries_below(std::int32_t(v));
    g.tokens[v] = edges.tokens(std::int32_t(v));
  }
}

}  // namespace

GreedyEdges::GreedyEdges(const Topology& topo, const Visibility& vis)
    : tokens_(topo.parent.size(), 0), subtree_queries_(topo.parent.size(), 0), entries_(topo.parent.size()) {
  for (std::size_t v = 0; v < tokens_.size(); ++v) {
    for (std::int32_t p = vis.node_piece_begin[v]; p < vis.node_piece_end[v]; ++p) {
      tokens_[v] += vis.pieces[std::size_t(p)].token_end - vis.pieces[std::size_t(p)].token_begin;
    }
  }
  for (std::int32_t v : topo.query_node) ++subtree_queries_[std::size_t(v)];
  for (auto it = topo.preorder.rbegin(); it != topo.preorder.rend(); ++it) {
    const std::int32_t p = topo.parent[std::size_t(*it)];
    if (p >= 0) subtree_queries_[std::size_t(p)] += subtree_queries_[std::size_t(*it)];
  }
}

EdgeTrade GreedyEdges::trade(std::int32_t child, const EdgeShape& edge, const CostModel& model, std::int32_t group,
                             std::int32_t block_tokens, std::int32_t query_tile) {
  const std::int64_t blocks[3] = {ceil_div(edge.parent_tokens, block_tokens), ceil_div(edge.child_tokens, block_tokens),
                                  ceil_div(edge.parent_tokens + edge.child_tokens, block_tokens)};
  Entry& e = entries_[std::size_t(child)];
  if (!e.valid || e.edge.parent_tokens != edge.parent_tokens || e.edge.parent_queries != edge.parent_queries ||
      e.edge.child_tokens != edge.child_tokens || e.edge.child_queries != edge.child_queries ||
      !std::equal(blocks, blocks + 3, e.blocks)) {
    e.edge = edge;
    std::copy(blocks, blocks + 3, e.blocks);
    e.trade = edge_trade(model, edge, group, block_tokens, query_tile);
    e.valid = true;
  }
  return e.trade;
}

GreedyGroups choose_greedy_groups(Topology& topo, const PlanOptions& options, const HeadConfig& heads,
                                  GreedyEdges& edges, double probe_weight) {
  const std::size_t n = topo.parent.size();
  CostModel probe = options.cost;
  probe.partial_ns *= probe_weight;

  // Edges in breadth-first order, parents decided before their children: an
  // edge compares the parent's group as it stands (its chain, its queries so
  // far) with the child's subtree.
  GreedyGroups g;
  g.joined.assign(n, 0);
  ungrouped_counts(n, g, edges);
  g.probe_agrees = probe_weight > 0.0;
  std::vector<std::int32_t> order(topo.roots);
  for (std::size_t i = 0; i < order.size(); ++i) {
    const std::size_t p = std::size_t(order[i]);
    for (std::int32_t k = topo.child_begin[p]; k < topo.child_begin[p + 1]; ++k) {
      const std::int32_t c = topo.children[std::size_t(k)];
      order.push_back(c);
      const std::int32_t below = edges.queries_below(c);
      if (below == 0 || g.tokens[p] == 0) continue;
      const EdgeShape edge{g.tokens[p], g.queries[p], edges.tokens(c), below};
      const EdgeTrade trade = edges.trade(c, edge, options.cost, heads.group_size(), options.block_tokens, options.query_tile);
      const bool join = trade.worth_it(options.cost, heads.heads_q, heads.heads_kv);
      if (g.probe_agrees && trade.worth_it(probe, heads.heads_q, heads.heads_kv) != join) g.probe_agrees = false;
      if (join) {
        g.joined[std::size_t(c)] = 1;
        g.queries[p] -= below;
        g.tokens[std::size_t(c)] += g.tokens[p];
      }
    }
  }
  move_children_last(topo, g.joined);
  return g;
}

void regroup(const Topology& topo, GreedyGroups& g, const GreedyEdges& edges) {
  ungrouped_counts(topo.parent.size(), g, edges);
  for (std::int32_t v : topo.preorder) {  // a parent's chain is complete before its children join it
    const std::int32_t p = topo.parent[std::size_t(v)];
    if (p < 0 || !g.joined[std::size_t(v)]) continue;
    g.queries[std::size_t(p)] -= edges.queries_below(v);
    g.tokens[std::size_t(v)] += g.tokens[std::size_t(p)];
  }
}

GreedyLayout layout_greedy(const Topology& topo, const GreedyGroups& g, const PlanOptions& options,
                           const HeadConfig& heads) {
  // First query position of each node: its own queries come first, then its
  // children's subtrees in (reordered) preorder, as compute_visibility numbers
  // them. A group's queries are the own queries and the subtrees of the
  // children that were not joined: the first g.queries[v] positions.
  std::vector<std::int32_t> own(topo.parent.size(), 0);
  for (std::int32_t v : topo.query_node) ++own[std::size_t(v)];
  GreedyLayout layout;
  std::int32_t position = 0;
  for (std::int32_t v : topo.preorder) {
    const std::size_t i = std::size_t(v);
    if (g.queries[i] > 0 && g.tokens[i] > 0) {
      layout.groups.push_back(Group{v, position, position + g.queries[i], g.tokens[i]});
    }
    position += own[i];
  }
  const UnitCost cost(options.cost, heads, options.query_tile);
  layout.units = pack_groups(layout.groups, cost, options.block_tokens);
  split_long_units(layout.units, cost);
  double work = 0.0, longest = 0.0;
  for (const Unit& u : layout.units) {
    const UnitPrice p = cost.price(u.tokens, u.blocks, u.viewers);
    work += p.work_ns;
    longest = std::max(longest, p.max_pass_ns);
  }
  layout.time_us = step_time_us(options.cost, work, longest);
  return layout;
}

namespace {

// The pieces [p0, p1) limited to the group's queries, where one of them sees them.
void append_narrowed(const Visibility& vis, std::int32_t p0, std::int32_t p1, const GreedyGroup& group,
                     std::vector<Piece>& run) {
  for (std::int32_t p = p0; p < p1; ++p) {
    Piece piece = vis.pieces[std::size_t(p)];
    if (narrow_viewers(vis, piece, group.lo, group.hi)) run.push_back(piece);
  }
}

}  // namespace

void emit_greedy(PlanBuilder& builder, const Visibility& vis, const Topology& topo, const GreedyGroups& g,
                 const GreedyLayout& layout) {
  std::vector<std::int32_t> chain;
  std::vector<Piece> run;
  for (const Unit& unit : layout.units) {
    run.clear();
    for (std::size_t k = unit.first; k < unit.last; ++k) {
      const Group& group = layout.groups[k];
      chain.clear();
      for (std::int32_t a = group.node; g.joined[std::size_t(a)];) chain.push_back(a = topo.parent[std::size_t(a)]);
      // Ancestors' KV, root side first: every query of the group sees all of
      // it, in one piece; with a window, piece by piece, each where a query
      // of the group sees it.
      for (auto a = chain.rbegin(); a != chain.rend(); ++a) {
        const std::int32_t p0 = vis.node_piece_begin[std::size_t(*a)], p1 = vis.node_piece_end[std::size_t(*a)];
        if (p0 == p1) continue;
        if (vis.window > 0) {
          append_narrowed(vis, p0, p1, group, run);
        } else {
          run.push_back(Piece{*a, vis.pieces[std::size_t(p0)].token_begin, vis.pieces[std::size_t(p1) - 1].token_end,
                              group.lo, group.hi, 0});
        }
      }
      // The node's own pieces, limited to the group's queries.
      append_narrowed(vis, vis.node_piece_begin[std::size_t(group.node)], vis.node_piece_end[std::size_t(group.node)],
                      group, run);
    }
    builder.emit_run(run.data(), run.data() + run.size(), Cut::even, unit.blocks);
  }
}

}  // namespace treeattn
