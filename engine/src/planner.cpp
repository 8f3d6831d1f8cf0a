#include "treeattn/planner.hpp"

#include <algorithm>
#include <limits>
#include <optional>

#include "fail.hpp"
#include "greedy.hpp"
#include "plan_builder.hpp"
#include "plan_shape.hpp"
#include "plan_steps.hpp"
#include "thread_pool.hpp"
#include "topology.hpp"
#include "visibility.hpp"

namespace treeattn {

void check_plan_options(const PlanOptions& o) {
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
  if (o.window < 0) fail(ErrorCategory::InvalidArgument, "window = {} is negative (0: no window)", o.window);
}

namespace {

constexpr double kNoBound = std::numeric_limits<double>::infinity();  // predict(): time it exactly

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

// The pieces of query q's root-to-node path that it sees, root first, each
// narrowed to that query alone. `path` is scratch.
void query_run(const Topology& topo, const Visibility& vis, std::size_t q, std::vector<std::int32_t>& path,
               std::vector<Piece>& run) {
  const std::int32_t position = vis.query_position[q];
  path.clear();
  for (std::int32_t v = topo.query_node[q]; v >= 0; v = topo.parent[std::size_t(v)]) path.push_back(v);
  run.clear();
  for (auto v = path.rbegin(); v != path.rend(); ++v) {
    for (std::int32_t p = vis.node_piece_begin[std::size_t(*v)]; p < vis.node_piece_end[std::size_t(*v)]; ++p) {
      Piece piece = vis.pieces[std::size_t(p)];
      if (narrow_viewers(vis, piece, position, position + 1)) run.push_back(piece);
    }
  }
}

// Q-guided baseline (Flash-Decoding with split KV): every query reads its own
// root-to-node path, cut evenly, alone in its tile. Shared prefixes are read
// once per query: this is what sequence-based serving kernels do.
void plan_sequence(PlanBuilder& builder, const Visibility& vis, const Topology& topo) {
  std::vector<std::int32_t> path;
  std::vector<Piece> run;
  for (std::size_t q = 0; q < topo.query_node.size(); ++q) {
    query_run(topo, vis, q, path, run);
    builder.emit_run(run.data(), run.data() + run.size(), Cut::even);
  }
}

// The plan's scalar fields: what it is planned for. `greedy` is greedy's
// choice, null for the other strategies. The arrays of `reuse`, when given,
// are emptied and filled again: their memory serves the next plan.
Plan plan_header(const Tree& tree, const Visibility& vis, const PlanOptions& options, const GreedyChoice* greedy,
                 Plan* reuse = nullptr) {
  Plan result;
  if (reuse != nullptr) {
    result = std::move(*reuse);
    for (auto* a : {&result.token_slot, &result.segment_token_begin, &result.segment_token_end, &result.segment_node,
                    &result.block_segment_begin, &result.item_block, &result.item_query_begin, &result.item_mask_begin,
                    &result.item_tile_rows, &result.tile_query, &result.tile_partial, &result.merge_begin,
                    &result.merge_partial, &result.launch_order}) {
      a->clear();
    }
    result.segment_mask.clear();
    result.num_partials = 0;
  }
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

// `vis` as the lender of its token slots where plan_analyzed() was asked to
// borrow them (`lender` given, and told so), else null: copy them.
Visibility* lend(Visibility& vis, Visibility** lender) {
  if (lender == nullptr) return nullptr;
  *lender = &vis;
  return &vis;
}

// A strategy's plan from an analysed tree and its visibility; `greedy` is
// greedy's choice (and `topo` its order), null for the other strategies.
// With `lender` (`vis` itself), the plan takes the visibility's token slots
// instead of copying them (plan_analyzed()).
Plan assemble(const Tree& tree, const Topology& topo, const Visibility& vis, const PlanOptions& options,
              const GreedyChoice* greedy, Plan* reuse = nullptr, Visibility* lender = nullptr) {
  Plan result = plan_header(tree, vis, options, greedy, reuse);
  if (lender != nullptr) {
    result.token_slot.swap(lender->token_slot);
  } else {
    // A reused plan's tree grows every decode step: with room to spare the
    // copy does not allocate (and fault in fresh pages) at each one.
    if (result.token_slot.capacity() < vis.token_slot.size()) result.token_slot.reserve(vis.token_slot.size() * 5 / 4);
    result.token_slot.assign(vis.token_slot.begin(), vis.token_slot.end());
  }
  PlanBuilder builder(result, vis, options.cost);
  emit_strategy(builder, topo, vis, options.strategy, greedy);
  if (greedy != nullptr) {
    result.block_tokens = 1;
    for (std::int32_t b = 0; b < result.num_blocks(); ++b) {
      result.block_tokens = std::max(result.block_tokens, result.block_token_count(b));
    }
  }
  result.launch_order = plan_launch_order(result, options.cost, options.launch_order);
  return result;
}

// The model's estimate of the plan assemble() would build, from its shape
// alone (no segments, masks or reduction map): how candidates are compared.
// With `to_beat_us`, a plan no faster than that may get a bound above it as its time.
CostEstimate predict(const Tree& tree, const Topology& topo, const Visibility& vis, const PlanOptions& options,
                     const GreedyChoice* greedy, double to_beat_us = kNoBound) {
  Plan header = plan_header(tree, vis, options, greedy);
  PlanShape shape;
  shape.order = options.launch_order;
  PlanBuilder builder(header, vis, options.cost, shape);
  emit_strategy(builder, topo, vis, options.strategy, greedy);
  return estimate_shape(shape, header.heads, options.cost, to_beat_us);
}

// Greedy's layout: its own, flatten's (own empty), or one item per query
// (one_item_block > 0: the sequence layout in blocks that long), and the
// model's time for it.
struct GreedyDecision {
  std::optional<GreedyChoice> own;
  double time_us = 0.0;
  bool partials = true;  // whether the layout has partials (a merge runs)
  std::int32_t one_item_block = 0;
};

GreedyCandidate candidate_of(const GreedyDecision& d) {
  return d.own ? GreedyCandidate::own : d.one_item_block > 0 ? GreedyCandidate::one_item_per_query : GreedyCandidate::flatten;
}

// The KV tokens each query sees, in query order: its sequence run's length,
// which is its path up to its last token (every ancestor's tokens and `upto`
// of its own node's), the last `window` of them with a window.
std::vector<std::int64_t> query_path_tokens(const Tree& tree, const Topology& topo, const Visibility& vis) {
  const std::vector<std::int64_t> depth = node_path_depths(tree, topo);
  std::vector<std::int64_t> tokens(topo.query_node.size(), 0);
  for (std::size_t q = 0; q < tokens.size(); ++q) {
    tokens[q] = depth[std::size_t(topo.query_node[q])] + topo.query_upto[q];
    if (vis.window > 0) tokens[q] = std::min<std::int64_t>(tokens[q], vis.window);
  }
  return tokens;
}

// Greedy's last, whole-tree candidate: every query one item over its whole
// path (the sequence layout, unsplit). It has no partials, so no merge kernel
// runs, which the model's coefficients charge every plan a share of: it
// replaces a layout with partials when predicted faster than that layout's
// time plus merge_ns. It wins where a tree's KV is small and the merge is a
// large part of the step (the one-KV-head peer shapes; docs/greedy.md).
void consider_one_item_per_query(const Tree& tree, const Topology& topo, const Visibility& vis,
                                 const PlanOptions& options, GreedyDecision& decision) {
  const bool given = options.greedy_candidate == GreedyCandidate::one_item_per_query;
  if (!given && (options.greedy_candidate != GreedyCandidate::model || !decision.partials ||
                 options.cost.switch_gain == 0.0)) {
    return;  // switch_gain 0: greedy's own layout, always
  }
  const std::vector<std::int64_t> paths = query_path_tokens(tree, topo, vis);
  const std::int64_t longest = paths.empty() ? 0 : *std::max_element(paths.begin(), paths.end());
  if (given) {  // its block as long as the longest path, or flatten's layout where none holds it
    decision.one_item_block = longest > 0 && longest <= kMaxBlockTokens ? std::int32_t(longest) : 0;
    return;
  }
  if (paths.empty()) return;
  if (longest > kMaxBlockTokens) return;
  const double to_beat_us = decision.time_us + options.cost.merge_ns * 1e-3;
  // Its CTAs are known without building it (each query's passes, on every KV
  // head): a layout their lower bound already shows slower is not built.
  std::vector<double> ctas;
  for (std::int64_t tokens : paths) {
    const TileChoice tile = choose_tile(options.cost, tree.heads.group_size(), tokens);
    for (std::int64_t p = 0; p < tile.passes * tree.heads.heads_kv; ++p) ctas.push_back(tile.cost_ns / double(tile.passes));
  }
  if (step_lower_bound_ns(options.cost, ctas) * 1e-3 >= to_beat_us) return;
  PlanOptions one = options;
  one.strategy = Strategy::sequence;
  one.block_tokens = std::int32_t(longest);
  const CostEstimate estimate = predict(tree, topo, vis, one, nullptr, to_beat_us);
  if (estimate.partial_rows == 0 && estimate.time_us < to_beat_us) {
    decision = {std::nullopt, estimate.time_us, false, one.block_tokens};
  }
}

// The greedy strategy. Its groups are decided edge by edge, each edge seeing
// only its own partials: a tree of many short levels gains from concatenating
// all the way down only once most edges do, so a second pass weighs partials
// 4x, and the model keeps the cheaper layout (compared before either is built). DeFT-Flatten's single run is a
// whole-tree layout the local decisions can also miss (tiny groups under shared
// ancestors, read once with masks): flatten's is kept unless the model
// predicts a clear gain (switch_gain covers its error).
// `best_us`: the fastest candidate so far (auto), whose rivals need not be timed exactly.
// With a given candidate the model times only what a block-size search
// compares (`timed`); a plan at a fixed block size is built untimed.
GreedyDecision decide_greedy(const Tree& tree, const Topology& topo, const Visibility& vis, const PlanOptions& options,
                             GreedyMemo& memo, double best_us = kNoBound, bool timed = true) {
  PlanOptions flat = options;
  flat.strategy = Strategy::flatten;
  if (options.greedy_candidate == GreedyCandidate::flatten) {
    return {std::nullopt, timed ? predict(tree, topo, vis, flat, nullptr, best_us).time_us : 0.0, true, 0};
  }
  if (options.greedy_candidate == GreedyCandidate::one_item_per_query) {
    GreedyDecision one{std::nullopt, 0.0, false, 0};
    consider_one_item_per_query(tree, topo, vis, options, one);
    PlanOptions layout = one.one_item_block > 0 ? options : flat;
    layout.strategy = one.one_item_block > 0 ? Strategy::sequence : Strategy::flatten;
    if (one.one_item_block > 0) layout.block_tokens = one.one_item_block;
    if (timed) one.time_us = predict(tree, topo, vis, layout, nullptr, best_us).time_us;
    return one;
  }
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
  if (options.greedy_candidate == GreedyCandidate::own) {
    const double own_us = timed ? memo.own(tree, *best, options).time_us : 0.0;
    return {std::move(best), own_us, true, 0};
  }
  const CostEstimate& own = memo.own(tree, *best, options);
  const double greedy_us = own.time_us;
  // Flatten's time matters below greedy_us * switch_gain (it is then kept)
  // and, unless greedy's own layout beats best_us, below best_us too: a bound
  // above that still makes the decision below, and the candidate lose.
  const double switch_us = greedy_us * options.cost.switch_gain;
  const CostEstimate flatten =
      predict(tree, topo, vis, flat, nullptr, greedy_us < best_us ? switch_us : std::min(switch_us, best_us));
  if (flatten.time_us < switch_us) return {std::nullopt, flatten.time_us, flatten.partial_rows > 0, 0};
  return {std::move(best), greedy_us, own.partial_rows > 0, 0};
}

// Greedy's plan: the decision's layout, unless one item per query (last
// candidate, whatever the block size) beats it.
Plan build_greedy(const Tree& tree, const Topology& topo, const Visibility& vis, const PlanOptions& options,
                  GreedyDecision decision, VisibilityCache& reordered, Plan* reuse = nullptr,
                  PlanChoices* chosen = nullptr) {
  consider_one_item_per_query(tree, topo, vis, options, decision);
  if (chosen != nullptr) chosen->greedy_candidate = candidate_of(decision);
  if (decision.own) {
    return assemble(tree, decision.own->order, reordered.get(tree, decision.own->order, options.window), options,
                    &*decision.own, reuse);
  }
  PlanOptions layout = options;  // flatten's, or one item per query
  layout.strategy = decision.one_item_block > 0 ? Strategy::sequence : Strategy::flatten;
  if (decision.one_item_block > 0) layout.block_tokens = decision.one_item_block;
  Plan plan = assemble(tree, topo, vis, layout, nullptr, reuse);
  plan.strategy = Strategy::greedy;
  return plan;
}

// The fastest of the block-size candidates one thread has timed, and what it
// keeps between them (greedy's memo; its best so far bounds the next ones).
class CandidateSearch {
 public:
  struct Best {
    std::size_t index = 0;  // in auto_block_candidates(): ties go to the shorter blocks
    PlanOptions options;
    GreedyDecision decision;
  };

  void consider(const Tree& tree, const Topology& topo, const Visibility& vis, const PlanOptions& options,
                std::int32_t block_tokens, std::size_t index) {
    PlanOptions fixed = options;
    fixed.block_tokens = block_tokens;
    const double best_us = best_ ? best_->decision.time_us : kNoBound;
    GreedyDecision decision;
    if (options.strategy == Strategy::greedy) {
      if (!memo_) memo_.emplace(topo, vis);
      decision = decide_greedy(tree, topo, vis, fixed, *memo_, best_us);
    } else {
      decision.time_us = predict(tree, topo, vis, fixed, nullptr, best_us).time_us;
    }
    if (!best_ || better(decision.time_us, index, *best_)) best_ = Best{index, fixed, std::move(decision)};
  }
  std::optional<Best>& best() { return best_; }
  static bool better(double time_us, std::size_t index, const Best& than) {
    return time_us < than.decision.time_us || (time_us == than.decision.time_us && index < than.index);
  }

 private:
  std::optional<GreedyMemo> memo_;
  std::optional<Best> best_;
};

// kAutoBlockTokens: the plan at each candidate block size, the one the model
// predicts fastest kept (on a tie the shorter blocks: more CTAs for the same
// predicted time). Every candidate is timed as the complete plan it would be
// (its shape), so the choice sees everything the block size changes: passes,
// tiles, partials and how the CTAs fill the SMs; only the kept one is built.
// On a pool, each worker searches the candidates it is handed; a candidate a
// worker skips as slower than its own best is slower than the overall best
// too, so the choice is the one a single thread makes.
Plan plan_auto_block_size(const Tree& tree, const Topology& topo, const Visibility& vis, const PlanOptions& options,
                          ThreadPool* pool, PlanChoices* chosen) {
  const std::vector<std::int32_t> sizes = auto_block_candidates(options.cost);
  std::vector<CandidateSearch> searches(pool != nullptr ? std::size_t(pool->size()) : 1);
  if (searches.size() == 1) {
    for (std::size_t i = 0; i < sizes.size(); ++i) searches[0].consider(tree, topo, vis, options, sizes[i], i);
  } else {
    pool->parallel_for(std::int64_t(sizes.size()), [&](std::int64_t i, int worker) {
      searches[std::size_t(worker)].consider(tree, topo, vis, options, sizes[std::size_t(i)], std::size_t(i));
    });
  }
  CandidateSearch::Best* best = nullptr;
  for (CandidateSearch& search : searches) {
    auto& b = search.best();
    if (b && (best == nullptr || CandidateSearch::better(b->decision.time_us, b->index, *best))) best = &*b;
  }
  if (chosen != nullptr) chosen->block_tokens = best->options.block_tokens;
  if (options.strategy == Strategy::greedy) {
    VisibilityCache reordered;
    return build_greedy(tree, topo, vis, best->options, std::move(best->decision), reordered, nullptr,
                        chosen);  // the searches end here
  }
  return assemble(tree, topo, vis, best->options, nullptr);
}

Plan plan_on(const Tree& tree, const PlanOptions& options, ThreadPool* pool) {
  check_plan_options(options);
  const Topology topo = analyze(tree, options.kv_slots);
  Visibility vis = compute_visibility(tree, topo, options.window);
  Plan plan = plan_analyzed(tree, topo, vis, options, pool, nullptr, nullptr, nullptr);
  plan.id = new_plan_id();
  return plan;
}

}  // namespace

// --- what greedy keeps between its passes (plan_steps.hpp) -------------------

Visibility& VisibilityCache::get(const Tree& tree, const Topology& order, std::int32_t window) {
  if (!vis_ || order.children != order_->children || vis_->window != window) {
    vis_ = compute_visibility(tree, order, window);
    order_ = order;
  }
  return *vis_;
}

void VisibilityCache::appended(const Tree& tree, const Topology& topo, const std::vector<std::int32_t>& grown) {
  if (!vis_) return;
  order_->query_upto = topo.query_upto;
  if (!update_visibility(tree, *order_, *vis_, grown)) vis_ = compute_visibility(tree, *order_, vis_->window);
}

void VisibilityCache::replaced(const Tree& tree, const std::vector<std::int32_t>& nodes) {
  if (vis_) replace_slots(tree, *vis_, nodes);
}

const CostEstimate& GreedyMemo::own(const Tree& tree, const GreedyChoice& choice, const PlanOptions& options) {
  if (!timed_ || choice.groups.joined != joined_ || choice.layout.units != units_) {
    estimate_ = predict(tree, choice.order, reordered.get(tree, choice.order, options.window), options, &choice);
    joined_ = choice.groups.joined;
    units_ = choice.layout.units;
    timed_ = true;
  }
  return estimate_;
}

void GreedyMemo::appended(const Tree& tree, const Topology& topo, const Visibility* vis,
                          const std::vector<std::int32_t>& grown) {
  reordered.appended(tree, topo, grown);
  const Visibility* counts = reordered.cached() != nullptr ? reordered.cached() : vis;  // a node's count is the same in any order
  for (std::int32_t v : grown) edges.set_tokens(v, counts->node_visible[std::size_t(v)]);
  timed_ = false;
}

Plan plan_analyzed(const Tree& tree, const Topology& topo, Visibility& vis, const PlanOptions& options, ThreadPool* pool,
                   GreedyMemo* memo, PlanChoices* chosen, Plan* reuse, Visibility** lender) {
  if (is_fp8(options.kv_dtype)) {
    return plan_analyzed(tree, topo, vis, with_kv_terms(options), pool, memo, chosen, reuse, lender);
  }
  if (lender != nullptr) *lender = nullptr;
  if (options.block_tokens == kAutoBlockTokens) return plan_auto_block_size(tree, topo, vis, options, pool, chosen);
  if (chosen != nullptr) chosen->block_tokens = options.block_tokens;
  if (options.strategy == Strategy::greedy) {
    std::optional<GreedyMemo> local;
    GreedyMemo& m = memo != nullptr ? *memo : local.emplace(topo, vis);
    if (m.held && options.greedy_candidate == GreedyCandidate::own) {  // the edges as decided before
      GreedyChoice& held = *m.held;
      held.order.query_upto = topo.query_upto;
      regroup(held.order, held.groups, m.edges);
      held.layout = layout_greedy(held.order, held.groups, options, tree.heads);
      if (chosen != nullptr) chosen->greedy_candidate = GreedyCandidate::own;
      Visibility& reordered = m.reordered.get(tree, held.order, options.window);
      return assemble(tree, held.order, reordered, options, &held, reuse, lend(reordered, lender));
    }
    GreedyDecision decision = decide_greedy(tree, topo, vis, options, m, kNoBound, /*timed=*/false);
    if (m.hold_groups && decision.own) m.held = *decision.own;
    return build_greedy(tree, topo, vis, options, std::move(decision), m.reordered, reuse, chosen);
  }
  return assemble(tree, topo, vis, options, nullptr, reuse, lend(vis, lender));
}


PlanOptions with_kv_terms(const PlanOptions& options) {
  PlanOptions terms = options;
  terms.cost = options.cost.for_kv(options.kv_dtype);
  terms.kv_dtype = DType::f16;
  return terms;
}

Plan plan(const Tree& tree, const PlanOptions& options) { return plan_on(tree, options, nullptr); }

Planner::Planner(int threads) {
  if (threads < 0) fail(ErrorCategory::InvalidArgument, "Planner: threads = {} is negative (0: one per hardware thread)", threads);
  if (threads != 1) pool_ = std::make_unique<ThreadPool>(threads);
}

Planner::~Planner() = default;

int Planner::threads() const noexcept { return pool_ ? pool_->size() : 1; }

Plan Planner::plan(const Tree& tree, const PlanOptions& options) {
  const std::lock_guard<std::mutex> lock(busy_);
  return plan_on(tree, options, pool_.get());
}

}  // namespace treeattn
