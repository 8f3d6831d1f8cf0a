#include "treeattn/planner.hpp"

#include <algorithm>
#include <limits>
#include <optional>

#include "fail.hpp"
#include "greedy.hpp"
#include "plan_builder.hpp"
#include "plan_shape.hpp"
#include "topology.hpp"
#include "visibility.hpp"

namespace treeattn {
namespace {

constexpr double kNoBound = std::numeric_limits<double>::infinity();  // predicted_us: time it exactly

void check_options(const PlanOptions& o) {
  if (o.block_tokens != kAutoBlockTokens && (o.block_tokens < 1 || o.block_tokens > kMaxBlockTokens)) {
    fail(ErrorCategory::InvalidArgument, "block_tokens = {} is outside [1, {}] (or {}: the cost model chooses)",
         o.block_tokens, kMaxBlockTokens, kAutoBlockTokens);
  }
  if (o.block_tokens == kAutoBlockTokens &&
      (o.cost.auto_block_min < 1 || o.cost.auto_block_min > o.cost.auto_block_max ||
       o.cost.auto_block_max > kMaxBlockTokens)) {
    fail(ErrorCategory::InvalidArgument, "cost model: auto_block_min = {}, auto_block_max = {} is not a range in [1, {}]",
         o.cost.auto_block_min, o.cost.auto_block_max, kMaxBlockTokens);
  }
  if (o.query_tile < 1 || o.query_tile > kMaxQueryTile) {
    fail(ErrorCategory::InvalidArgument, "query_tile = {} is outside [1, {}]", o.query_tile,
         kMaxQueryTile);
  }
  if (o.kv_slots < 0) fail(ErrorCategory::InvalidArgument, "kv_slots = {} is negative", o.kv_slots);
}

// DeFT-Flatten: the whole forest is one run in depth-first order, cut evenly, so
// small nodes share a block with their neighbours and every block is full.
void plan_flatten(PlanBuilder& builder, const Visibility& vis) {
  builder.emit_run(vis.pieces.data(), vis.pieces.data() + vis.pieces.size(), Cut::even);
}

// DeFT-Node: each node is its own group, cut at block_tokens (a long node's tail
// block is short, a small node's block is small: the imbalance DeFT measured).
// DeFT-Node-Chunk: the same groups, each cut into even chunks.
void plan_per_node(PlanBuilder& builder, const Visibility& vis, const Topology& topo, Cut cut) {
  for (std::int32_t v : topo.preorder) {
    const Piece* first = vis.pieces.data() + vis.node_piece_begin[std::size_t(v)];
    const Piece* last = vis.pieces.data() + vis.node_piece_end[std::size_t(v)];
    builder.emit_run(first, last, cut);
  }
}

// Cascade: the nodes of one depth level form one run (depth-first order within
// the level), cut evenly; blocks never mix levels.
void plan_cascade(PlanBuilder& builder, const Visibility& vis, const Topology& topo) {
  std::vector<std::int32_t> depth(topo.parent.size(), 0);  // preorder: parents come first
  std::vector<std::int32_t> level_begin;
  for (std::int32_t v : topo.preorder) {
    const std::int32_t p = topo.parent[std::size_t(v)];
    if (p >= 0) depth[std::size_t(v)] = depth[std::size_t(p)] + 1;
    const std::size_t d = std::size_t(depth[std::size_t(v)]);
    if (level_begin.size() < d + 2) level_begin.resize(d + 2, 0);
    level_begin[d + 1] += vis.node_piece_end[std::size_t(v)] - vis.node_piece_begin[std::size_t(v)];
  }
  for (std::size_t d = 1; d < level_begin.size(); ++d) level_begin[d] += level_begin[d - 1];
  std::vector<Piece> by_level(vis.pieces.size());
  std::vector<std::int32_t> fill(level_begin.begin(), level_begin.end());
  for (std::int32_t v : topo.preorder) {
    const std::size_t d = std::size_t(depth[std::size_t(v)]);
    for (std::int32_t p = vis.node_piece_begin[std::size_t(v)]; p < vis.node_piece_end[std::size_t(v)]; ++p) {
      by_level[std::size_t(fill[d]++)] = vis.pieces[std::size_t(p)];
    }
  }
  for (std::size_t d = 0; d + 1 < level_begin.size(); ++d) {
    builder.emit_run(by_level.data() + level_begin[d], by_level.data() + level_begin[d + 1], Cut::even);
  }
}

// Q-guided baseline (Flash-Decoding with split KV): every query reads its own
// root-to-node path, cut evenly, alone in its tile. Shared prefixes are read
// once per query: this is what sequence-based serving kernels do.
void plan_sequence(PlanBuilder& builder, const Visibility& vis, const Topology& topo) {
  std::vector<std::int32_t> path;
  std::vector<Piece> run;
  for (std::size_t q = 0; q < topo.query_node.size(); ++q) {
    const std::int32_t position = vis.query_position[q];
    path.clear();
    for (std::int32_t v = topo.query_node[q]; v >= 0; v = topo.parent[std::size_t(v)]) path.push_back(v);
    run.clear();
    for (auto v = path.rbegin(); v != path.rend(); ++v) {
      for (std::int32_t p = vis.node_piece_begin[std::size_t(*v)]; p < vis.node_piece_end[std::size_t(*v)]; ++p) {
        Piece piece = vis.pieces[std::size_t(p)];
        if (position < piece.viewer_lo || position >= piece.viewer_hi) continue;
        piece.viewer_lo = position;
        piece.viewer_hi = position + 1;
        run.push_back(piece);
      }
    }
    builder.emit_run(run.data(), run.data() + run.size(), Cut::even);
  }
}


// Greedy's choice: the children order, the edge decisions and their layout.
struct GreedyChoice {
  Topology order;
  GreedyGroups groups;
  GreedyLayout layout;
};

// The plan's scalar fields: what it is planned for. `greedy` is greedy's
// choice, null for the other strategies.
Plan plan_header(const Tree& tree, const Visibility& vis, const PlanOptions& options, const GreedyChoice* greedy) {
  Plan result;
  result.heads = tree.heads;
  result.heads.scale = tree.heads.effective_scale();
  result.num_queries = std::int32_t(tree.query_count());
  result.strategy = options.strategy;
  // Greedy's blocks are as long as its cost model leaves them (block_tokens
  // bounds only its packing of small groups); the plan records the longest.
  result.block_tokens = greedy != nullptr ? kMaxBlockTokens : options.block_tokens;
  result.query_tile = options.query_tile;
  result.min_kv_slots = vis.max_slot + 1;
  return result;
}

void emit_strategy(PlanBuilder& builder, const Topology& topo, const Visibility& vis, Strategy strategy,
                   const GreedyChoice* greedy) {
  switch (strategy) {
    case Strategy::flatten: plan_flatten(builder, vis); break;
    case Strategy::node: plan_per_node(builder, vis, topo, Cut::fixed); break;
    case Strategy::node_chunk: plan_per_node(builder, vis, topo, Cut::even); break;
    case Strategy::cascade: plan_cascade(builder, vis, topo); break;
    case Strategy::sequence: plan_sequence(builder, vis, topo); break;
    case Strategy::greedy: emit_greedy(builder, vis, topo, greedy->groups, greedy->layout); break;
  }
  builder.finish();
}

// A strategy's plan from an analysed tree and its visibility; `greedy` is
// greedy's choice (and `topo` its order), null for the other strategies.
Plan assemble(const Tree& tree, const Topology& topo, Visibility vis, const PlanOptions& options,
              const GreedyChoice* greedy) {
  Plan result = plan_header(tree, vis, options, greedy);
  result.token_slot = std::move(vis.token_slot);
  PlanBuilder builder(result, vis, options.cost);
  emit_strategy(builder, topo, vis, options.strategy, greedy);
  if (greedy != nullptr) {
    result.block_tokens = 1;
    for (std::int32_t b = 0; b < result.num_blocks(); ++b) {
      result.block_tokens = std::max(result.block_tokens, result.block_token_count(b));
    }
  }
  return result;
}

// The model's time for the plan assemble() would build, from its shape alone
// (no segments, masks or reduction map): how candidates are compared.
// With `to_beat_us`, a plan no faster than that may get a bound above it instead.
double predicted_us(const Tree& tree, const Topology& topo, const Visibility& vis, const PlanOptions& options,
                    const GreedyChoice* greedy, double to_beat_us = kNoBound) {
  Plan header = plan_header(tree, vis, options, greedy);
  PlanShape shape;
  PlanBuilder builder(header, vis, options.cost, shape);
  emit_strategy(builder, topo, vis, options.strategy, greedy);
  return estimate_shape(shape, header.heads, options.cost, to_beat_us).time_us;
}

// The visibility of the last children order greedy asked for: the block-size
// candidates often reorder a tree the same way, and then it is not recomputed.
class VisibilityCache {
 public:
  const Visibility& get(const Tree& tree, const Topology& order) {
    if (!vis_ || order.children != children_) {
      vis_ = compute_visibility(tree, order);
      children_ = order.children;
    }
    return *vis_;
  }

 private:
  std::vector<std::int32_t> children_;
  std::optional<Visibility> vis_;
};

// What greedy keeps between its passes over one tree.
class GreedyMemo {
 public:
  GreedyMemo(const Topology& topo, const Visibility& vis) : edges(topo, vis) {}
  GreedyEdges edges;

  // The model's time for greedy's own plan. The block-size candidates often
  // arrive at the same layout (the same edges joined, the same units: the
  // same plan), which is then not timed again.
  double own_us(const Tree& tree, const GreedyChoice& choice, const PlanOptions& options) {
    if (!timed_ || choice.groups.joined != joined_ || choice.layout.units != units_) {
      us_ = predicted_us(tree, choice.order, reordered_.get(tree, choice.order), options, &choice);
      joined_ = choice.groups.joined;
      units_ = choice.layout.units;
      timed_ = true;
    }
    return us_;
  }

 private:
  VisibilityCache reordered_;
  bool timed_ = false;
  std::vector<std::uint8_t> joined_;
  std::vector<GreedyUnit> units_;
  double us_ = 0.0;
};

// Greedy at one block size: its own layout, or flatten's where that is kept
// (own is then empty), and the model's time for the one kept.
struct GreedyDecision {
  std::optional<GreedyChoice> own;
  double time_us = 0.0;
};

// The greedy strategy. Its groups are decided edge by edge, each edge seeing
// only its own partials: a tree of many short levels gains from concatenating
// all the way down only once most edges do, so a second pass weighs partials
// 4x, and the model keeps the cheaper layout (compared before either is built). DeFT-Flatten's single run is a
// whole-tree layout the local decisions can also miss (tiny groups under shared
// ancestors, read once with masks): flatten's is kept unless the model
// predicts a clear gain (switch_gain covers its error).
// `best_us`: the fastest candidate so far (auto), whose rivals need not be timed exactly.
GreedyDecision decide_greedy(const Tree& tree, const Topology& topo, const Visibility& vis, const PlanOptions& options,
                             GreedyMemo& memo, double best_us = kNoBound) {
  std::optional<GreedyChoice> best;
  constexpr double kWeights[] = {1.0, 4.0};
  for (double partial_weight : kWeights) {
    if (best && best->groups.probe_agrees) break;  // the second weight decides every edge alike
    PlanOptions decide = options;
    decide.cost.partial_ns *= partial_weight;
    GreedyChoice choice{topo, {}, {}};
    choice.groups = choose_greedy_groups(choice.order, decide, tree.heads, memo.edges,  // reorders the children
                                         best ? 0.0 : kWeights[1] / kWeights[0]);
    if (best && choice.groups.joined == best->groups.joined) continue;  // the same layout again
    choice.layout = layout_greedy(choice.order, choice.groups, options, tree.heads);
    if (!best || choice.layout.time_us < best->layout.time_us) best = std::move(choice);
  }
  const double greedy_us = memo.own_us(tree, *best, options);
  PlanOptions flat = options;
  flat.strategy = Strategy::flatten;
  // Flatten's time matters below greedy_us * switch_gain (it is then kept)
  // and, unless greedy's own layout beats best_us, below best_us too: a bound
  // above that still makes the decision below, and the candidate lose.
  const double switch_us = greedy_us * options.cost.switch_gain;
  const double flatten_us =
      predicted_us(tree, topo, vis, flat, nullptr, greedy_us < best_us ? switch_us : std::min(switch_us, best_us));
  if (flatten_us < switch_us) return {std::nullopt, flatten_us};
  return {std::move(best), greedy_us};
}

Plan build_greedy(const Tree& tree, const Topology& topo, Visibility vis, const PlanOptions& options,
                  const GreedyDecision& decision) {
  if (decision.own) {
    return assemble(tree, decision.own->order, compute_visibility(tree, decision.own->order), options, &*decision.own);
  }
  PlanOptions flat = options;
  flat.strategy = Strategy::flatten;
  Plan flatten = assemble(tree, topo, std::move(vis), flat, nullptr);
  flatten.strategy = Strategy::greedy;
  return flatten;
}

// kAutoBlockTokens: the plan at each candidate block size, the one the model
// predicts fastest kept (on a tie the shorter blocks: more CTAs for the same
// predicted time). Every candidate is timed as the complete plan it would be
// (its shape), so the choice sees everything the block size changes: passes,
// tiles, partials and how the CTAs fill the SMs; only the kept one is built.
Plan plan_auto_block_size(const Tree& tree, const Topology& topo, Visibility vis, const PlanOptions& options) {
  PlanOptions best = options;
  GreedyDecision best_decision;
  bool first = true;
  GreedyMemo memo(topo, vis);
  for (std::int32_t block_tokens : auto_block_candidates(options.cost)) {
    PlanOptions fixed = options;
    fixed.block_tokens = block_tokens;
    GreedyDecision decision;
    const double best_us = first ? kNoBound : best_decision.time_us;
    if (options.strategy == Strategy::greedy) decision = decide_greedy(tree, topo, vis, fixed, memo, best_us);
    else decision.time_us = predicted_us(tree, topo, vis, fixed, nullptr, best_us);
    if (first || decision.time_us < best_decision.time_us) {
      best = fixed;
      best_decision = std::move(decision);
      first = false;
    }
  }
  if (options.strategy == Strategy::greedy) return build_greedy(tree, topo, std::move(vis), best, best_decision);
  return assemble(tree, topo, std::move(vis), best, nullptr);
}

}  // namespace

Plan plan(const Tree& tree, const PlanOptions& options) {
  check_options(options);
  const Topology topo = analyze(tree, options.kv_slots);
  Visibility vis = compute_visibility(tree, topo);
  if (options.block_tokens == kAutoBlockTokens) return plan_auto_block_size(tree, topo, std::move(vis), options);
  if (options.strategy == Strategy::greedy) {
    GreedyMemo memo(topo, vis);
    const GreedyDecision decision = decide_greedy(tree, topo, vis, options, memo);
    return build_greedy(tree, topo, std::move(vis), options, decision);
  }
  return assemble(tree, topo, std::move(vis), options, nullptr);
}

}  // namespace treeattn
