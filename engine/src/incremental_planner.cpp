#include "treeattn/incremental_planner.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>

#include "cost_model_internal.hpp"
#include "fail.hpp"
#include "held_blocks.hpp"
#include "id_map.hpp"
#include "plan_steps.hpp"
#include "thread_pool.hpp"
#include "topology.hpp"
#include "visibility.hpp"

namespace treeattn {

struct IncrementalPlanner::State {
  PlanOptions options;
  IncrementalOptions incremental;
  std::unique_ptr<ThreadPool> pool;  // for choosing block sizes, when threads != 1
  Tree tree;
  IdMap index;  // live node id -> index in tree

  // Pending changes.
  bool reanalyse = true;                 // nodes added or removed, queries changed
  bool reshaped = false;                 // a node replaced at another length: the topology is rebuilt
  std::size_t checked_nodes = 0;         // nodes [0, checked_nodes) were checked at an update
  std::vector<std::int32_t> grown;       // nodes with appended tokens, in the order of their first append
  std::vector<std::int64_t> grown_from;  // [nodes] length at the last update, or -1 if not grown
  std::vector<std::int32_t> replaced;    // nodes that took other slots at their length (replace_pages, or a
                                         // same-shape replacement), checked before their slots are written
  std::vector<std::uint8_t> removed;     // [nodes] removal asked for (the subtree follows at update)
  bool removals = false;
  std::size_t first_moved = SIZE_MAX;    // nodes from this index on are not at their index of the last update

  // What the last update derived.
  std::optional<Topology> topo;
  std::optional<Visibility> vis;
  // While greedy lays out its held edge decisions, its plans read only the
  // visibility of its own children order (the memo's): this one, in the
  // tree's order, is left behind and computed again when next read.
  bool vis_behind = false;
  // The visibility whose token slots the plan holds (plan_analyzed()'s
  // lender), given back before the next update changes or reads it.
  Visibility* lender = nullptr;
  std::vector<std::int32_t> whole_begin, whole_queries;  // CSR: node -> queries that see the whole node
  std::vector<std::int64_t> analysed_length;  // [nodes] each node's length as the visibility has it
  struct Removal {  // apply_removals()' buffers
    std::vector<std::int32_t> parent, child_begin, children, fill, stack, new_index;
  } removal;
  std::optional<GreedyMemo> memo;
  // Whether `plan` is flatten's layout of the pieces `vis` had after the
  // last update (built or held) and hold_flatten_blocks is on: the blocks a
  // step that only lengthens nodes may keep. `growth` is this step's record
  // of those lengthenings (none before update_visibility() records any).
  bool flatten_layout = false;
  std::int32_t held_block_limit = 0;  // how long its blocks may grow held (held_block_limit())
  VisibleGrowth growth;
  std::vector<HeldBlock> held_blocks;  // grow_held_blocks()' buffer
  std::optional<PlanOptions> held;  // the options with the cost model's choices made
  struct Size {
    std::int64_t tokens = 0, queries = 0, nodes = 0;
  } chosen_at;  // the tree when the block size was chosen
  Plan plan;
  PlanUpdate last;

  // Whether a layout may be held over appends at all: a window slides as
  // nodes grow, so tokens leave nodes that did not grow and a held layout
  // would still read them; windowed plans are built again every update.
  bool holds_layouts() const { return options.window == 0; }

  // Whether the next plan lays out greedy's held edge decisions (and reads
  // no visibility but the memo's).
  bool greedy_holds() const {
    return held && held->strategy == Strategy::greedy && held->greedy_candidate == GreedyCandidate::own && memo &&
           memo->hold_groups && memo->held && memo->reordered.cached() != nullptr;
  }

  Visibility& visibility() {
    if (vis_behind) {
      vis = compute_visibility(tree, *topo, options.window);
      vis_behind = false;
    }
    return *vis;
  }

  std::int64_t visible_tokens() const {
    return std::int64_t((vis_behind ? *memo->reordered.cached() : *vis).token_slot.size());
  }

  bool drifted() const {
    const Size now{visible_tokens(), std::int64_t(tree.query_count()), std::int64_t(tree.node_count())};
    auto off = [&](std::int64_t at, std::int64_t is) {
      return std::abs(double(is - at)) > incremental.redecide_drift * double(std::max<std::int64_t>(at, 1));
    };
    return off(chosen_at.tokens, now.tokens) || off(chosen_at.queries, now.queries) || off(chosen_at.nodes, now.nodes);
  }

  // Whether the tree, before this step's appends, has the last update's
  // shape by node index: the same parents, lengths and queries (only nodes
  // that replaced others, or moved into their place, differ: in their slots).
  bool same_shape() const {
    const std::size_t n = tree.node_count();
    if (topo->parent.size() != n || topo->query_node.size() != tree.query_count()) return false;
    auto length_before = [&](std::size_t i) {
      return grown_from[i] >= 0 ? grown_from[i] : tree.nodes()[i].length;
    };
    for (std::size_t i = 0; i < n; ++i) {
      const TreeNode& node = tree.nodes()[i];
      const std::int32_t parent = node.parent == kNoParent ? -1 : index.find(node.parent);
      if ((node.parent != kNoParent && parent < 0) || parent != topo->parent[i]) return false;
      if (length_before(i) != analysed_length[i]) return false;
    }
    for (std::size_t q = 0; q < tree.query_count(); ++q) {
      const TreeQuery& query = tree.queries()[q];
      const std::int32_t node = index.find(query.node);
      if (node < 0 || node != topo->query_node[q]) return false;
      if ((query.upto == kWholeNode ? length_before(std::size_t(node)) : query.upto) != topo->query_upto[q]) return false;
    }
    return true;
  }

  // Each node's queries without `upto`: their visible tokens follow its length.
  void index_whole_queries() {
    const std::size_t n = tree.node_count();
    whole_begin.assign(n + 1, 0);
    for (std::size_t q = 0; q < tree.query_count(); ++q) {
      if (tree.queries()[q].upto == kWholeNode) ++whole_begin[std::size_t(topo->query_node[q]) + 1];
    }
    for (std::size_t i = 0; i < n; ++i) whole_begin[i + 1] += whole_begin[i];
    whole_queries.resize(std::size_t(whole_begin[n]));
    std::vector<std::int32_t> fill(whole_begin.begin(), whole_begin.end() - 1);
    for (std::size_t q = 0; q < tree.query_count(); ++q) {
      if (tree.queries()[q].upto == kWholeNode) {
        whole_queries[std::size_t(fill[std::size_t(topo->query_node[q])]++)] = std::int32_t(q);
      }
    }
  }
};

IncrementalPlanner::IncrementalPlanner(const HeadConfig& heads, const PlanOptions& options,
                                       const IncrementalOptions& incremental)
    : state_(std::make_unique<State>()) {
  check_plan_options(options);
  if (!(incremental.redecide_drift >= 0.0)) {
    fail(ErrorCategory::InvalidArgument, "redecide_drift = {} must be 0 or positive", incremental.redecide_drift);
  }
  if (incremental.threads < 0) {
    fail(ErrorCategory::InvalidArgument, "IncrementalPlanner: threads = {} is negative (0: one per hardware thread)",
         incremental.threads);
  }
  State& s = *state_;
  s.options = options;
  s.incremental = incremental;
  if (incremental.threads != 1) s.pool = std::make_unique<ThreadPool>(incremental.threads);
  s.tree = Tree(heads);
}

IncrementalPlanner::~IncrementalPlanner() = default;
IncrementalPlanner::IncrementalPlanner(IncrementalPlanner&&) noexcept = default;
IncrementalPlanner& IncrementalPlanner::operator=(IncrementalPlanner&&) noexcept = default;

const Plan& IncrementalPlanner::plan() const noexcept { return state_->plan; }
const Tree& IncrementalPlanner::tree() const noexcept { return state_->tree; }
std::int32_t IncrementalPlanner::block_tokens() const noexcept {
  return state_->held ? state_->held->block_tokens : state_->options.block_tokens;
}
const PlanOptions& IncrementalPlanner::held_options() const noexcept {
  return state_->held ? *state_->held : state_->options;
}
const PlanOptions& IncrementalPlanner::options() const noexcept { return state_->options; }
const PlanUpdate& IncrementalPlanner::last_update() const noexcept { return state_->last; }

std::int32_t IncrementalPlanner::index_of(std::int64_t id, const char* change) const {
  const std::int32_t index = state_->index.find(id);
  if (index < 0) fail(ErrorCategory::InvalidTree, "{}: node {} is not in the tree", change, id);
  if (state_->removed[std::size_t(index)]) fail(ErrorCategory::InvalidTree, "{}: node {} is being removed", change, id);
  return index;
}

void IncrementalPlanner::check_new(std::int64_t id) const {
  if (id == kNoParent) fail(ErrorCategory::InvalidTree, "add_node: id {} is the parent of a root (kNoParent), not a node id", id);
  if (state_->index.find(id) >= 0) fail(ErrorCategory::InvalidTree, "add_node: node id {} is in the tree already", id);
}

void IncrementalPlanner::added(std::int64_t id) {
  State& s = *state_;
  s.index.insert(id, std::int32_t(s.tree.node_count() - 1));
  s.grown_from.push_back(-1);
  s.removed.push_back(0);
  s.reanalyse = true;
}

void IncrementalPlanner::add_node(std::int64_t id, std::int64_t parent, const std::vector<std::int64_t>& slots) {
  check_new(id);
  state_->tree.add_node(id, parent, slots);
  added(id);
}

void IncrementalPlanner::add_node_range(std::int64_t id, std::int64_t parent, std::int64_t first_slot,
                                        std::int64_t count) {
  check_new(id);
  state_->tree.add_node_range(id, parent, first_slot, count);
  added(id);
}

void IncrementalPlanner::add_node_pages(std::int64_t id, std::int64_t parent, const std::vector<std::int64_t>& pages,
                                        std::int32_t page_size, std::int32_t last_page_tokens) {
  check_new(id);
  state_->tree.add_node_pages(id, parent, pages, page_size, last_page_tokens);
  added(id);
}

void IncrementalPlanner::add_tree(const Tree& tree) {
  const HeadConfig& a = state_->tree.heads;
  const HeadConfig& b = tree.heads;
  if (!a.same_as(b)) {
    fail(ErrorCategory::InvalidArgument, "add_tree: the tree's heads {} are not the planner's {}", describe(b), describe(a));
  }
  std::vector<std::int64_t> entries;
  for (std::size_t i = 0; i < tree.node_count(); ++i) {
    const TreeNode& n = tree.nodes()[i];
    if (n.page_size > 0) {
      entries.resize(std::size_t(n.pages));
      for (std::int64_t p = 0; p < n.pages; ++p) entries[std::size_t(p)] = tree.page(i, p);
      const std::int64_t last = n.pages == 0 ? 0 : n.length - (n.pages - 1) * n.page_size;
      add_node_pages(n.id, n.parent, entries, n.page_size, std::int32_t(last));
    } else if (n.listed) {
      entries.resize(std::size_t(n.length));
      for (std::int64_t t = 0; t < n.length; ++t) entries[std::size_t(t)] = tree.slot(i, t);
      add_node(n.id, n.parent, entries);
    } else {
      add_node_range(n.id, n.parent, n.first, n.length);
    }
  }
  set_queries(tree.queries());
}

namespace {

// `count` tokens appended to `node`: refused before the node's slots are made
// room for (a negative length, from a range not yet validated, would be
// refused at the update), so that its new length is an int32 count.
void check_append(const TreeNode& node, std::int64_t count) {
  if (count < 0) fail(ErrorCategory::InvalidArgument, "append: node {}: {} tokens", node.id, count);
  if (node.length < 0 || count > kMaxCount || node.length > kMaxCount - count) {
    fail(ErrorCategory::InvalidTree, "append: node {}: {} tokens more than its {} leave 0 to {} per node", node.id,
         count, node.length, kMaxCount);
  }
}

}  // namespace

void IncrementalPlanner::grew(std::int32_t index, std::int64_t count) {
  State& s = *state_;
  check_append(s.tree.nodes()[std::size_t(index)], count);
  std::int64_t& from = s.grown_from[std::size_t(index)];
  if (from < 0 && std::size_t(index) < s.checked_nodes) {  // a node added since the last update is checked whole
    from = s.tree.nodes()[std::size_t(index)].length;
    s.grown.push_back(index);
  }
}

void IncrementalPlanner::append(std::int64_t id, const std::vector<std::int64_t>& slots) {
  const std::int32_t index = index_of(id, "append");
  if (state_->tree.nodes()[std::size_t(index)].page_size > 0) {
    fail(ErrorCategory::InvalidArgument, "append: node {} is paged (append_pages adds its tokens)", id);
  }
  grew(index, std::int64_t(slots.size()));
  state_->tree.append_slots(std::size_t(index), slots.data(), std::int64_t(slots.size()));
}

void IncrementalPlanner::append_range(std::int64_t id, std::int64_t first_slot, std::int64_t count) {
  const std::int32_t index = index_of(id, "append_range");
  if (state_->tree.nodes()[std::size_t(index)].page_size > 0) {
    fail(ErrorCategory::InvalidArgument, "append_range: node {} is paged (append_pages adds its tokens)", id);
  }
  grew(index, count);
  state_->tree.append_range(std::size_t(index), first_slot, count);
}

void IncrementalPlanner::append_pages(std::int64_t id, std::int64_t count, const std::vector<std::int64_t>& new_pages) {
  const std::int32_t index = index_of(id, "append_pages");
  const TreeNode& node = state_->tree.nodes()[std::size_t(index)];
  if (node.page_size <= 0) fail(ErrorCategory::InvalidArgument, "append_pages: node {} is not paged", id);
  // The pages must hold the tokens exactly as add_node_pages' would: checked
  // here, where the call that broke it is known.
  check_append(node, count);
  const std::int64_t length = node.length + count;
  const std::int64_t pages = node.pages + std::int64_t(new_pages.size());
  if (length > pages * node.page_size || length <= (pages - 1) * node.page_size) {
    fail(ErrorCategory::InvalidTree,
         "append_pages: node {}: {} tokens on {} pages of {} (it had {} tokens on {} pages, {} new pages for {} tokens)",
         id, length, pages, node.page_size, node.length, node.pages, new_pages.size(), count);
  }
  grew(index, count);
  state_->tree.append_pages(std::size_t(index), count, new_pages);
}

void IncrementalPlanner::replace_pages(std::int64_t id, const std::vector<std::int64_t>& pages, std::int32_t page_size,
                                       std::int32_t last_page_tokens) {
  State& s = *state_;
  const std::int32_t index = index_of(id, "replace_pages");
  const std::int64_t length = s.tree.nodes()[std::size_t(index)].length;
  s.tree.replace_pages(std::size_t(index), pages, page_size, last_page_tokens);
  if (s.tree.nodes()[std::size_t(index)].length != length) s.reanalyse = s.reshaped = true;
  if (std::size_t(index) < s.checked_nodes) s.replaced.push_back(index);  // a node added since is checked whole
}

void IncrementalPlanner::remove_node(std::int64_t id) {
  State& s = *state_;
  s.removed[std::size_t(index_of(id, "remove_node"))] = 1;
  s.removals = true;
}

void IncrementalPlanner::set_queries(const std::vector<TreeQuery>& queries) {
  State& s = *state_;
  const std::vector<TreeQuery>& now = s.tree.queries();
  const bool same = now.size() == queries.size() &&
                    std::equal(now.begin(), now.end(), queries.begin(), [](const TreeQuery& a, const TreeQuery& b) {
                      return a.node == b.node && a.upto == b.upto;
                    });
  if (same) return;
  s.tree.queries_ = queries;
  s.reanalyse = true;
}

// The removed nodes' subtrees go with them; the kept nodes close up, the index
// is rebuilt. Its buffers are kept for the next step's removals.
void IncrementalPlanner::apply_removals() {
  State& s = *state_;
  State::Removal& r = s.removal;
  const std::vector<TreeNode>& nodes = s.tree.nodes();
  const std::size_t n = nodes.size();
  r.parent.resize(n);
  bool parents_first = true;  // as nodes are usually added: then one pass in order finds every subtree
  for (std::size_t i = 0; i < n; ++i) {
    r.parent[i] = nodes[i].parent == kNoParent ? -1 : s.index.find(nodes[i].parent);
    parents_first = parents_first && r.parent[i] < std::int32_t(i);
  }
  if (parents_first) {
    for (std::size_t i = 0; i < n; ++i) {
      if (r.parent[i] >= 0 && s.removed[std::size_t(r.parent[i])]) s.removed[i] = 1;
    }
  } else {  // the children lists, walked from each removed node
    r.child_begin.assign(n + 1, 0);
    for (std::size_t i = 0; i < n; ++i) {
      if (r.parent[i] >= 0) ++r.child_begin[std::size_t(r.parent[i]) + 1];
    }
    for (std::size_t i = 0; i < n; ++i) r.child_begin[i + 1] += r.child_begin[i];
    r.children.resize(std::size_t(r.child_begin[n]));
    r.fill.assign(r.child_begin.begin(), r.child_begin.end() - 1);
    for (std::size_t i = 0; i < n; ++i) {
      if (r.parent[i] >= 0) r.children[std::size_t(r.fill[std::size_t(r.parent[i])]++)] = std::int32_t(i);
    }
    r.stack.clear();
    for (std::size_t i = 0; i < n; ++i) {
      if (s.removed[i]) r.stack.push_back(std::int32_t(i));
    }
    while (!r.stack.empty()) {  // a parent cycle is met at most once per node
      const std::size_t v = std::size_t(r.stack.back());
      r.stack.pop_back();
      for (std::int32_t k = r.child_begin[v]; k < r.child_begin[v + 1]; ++k) {
        const std::size_t c = std::size_t(r.children[std::size_t(k)]);
        if (!s.removed[c]) {
          s.removed[c] = 1;
          r.stack.push_back(std::int32_t(c));
        }
      }
    }
  }
  // Kept nodes keep their order: those checked before stay in front, those
  // behind the first removed one move.
  const std::size_t first_removed = std::size_t(std::find(s.removed.begin(), s.removed.end(), 1) - s.removed.begin());
  s.first_moved = std::min(s.first_moved, first_removed);
  std::size_t checked = 0, kept = 0;
  r.new_index.assign(n, -1);
  for (std::size_t i = 0; i < n; ++i) {
    if (s.removed[i]) continue;
    r.new_index[i] = std::int32_t(kept);
    if (i < s.checked_nodes) ++checked;
    s.grown_from[kept++] = s.grown_from[i];
  }
  s.grown_from.resize(kept);
  std::size_t grown = 0;
  for (std::int32_t g : s.grown) {
    if (r.new_index[std::size_t(g)] >= 0) s.grown[grown++] = r.new_index[std::size_t(g)];
  }
  s.grown.resize(grown);
  std::size_t replaced = 0;
  for (std::int32_t v : s.replaced) {
    if (r.new_index[std::size_t(v)] >= 0) s.replaced[replaced++] = r.new_index[std::size_t(v)];
  }
  s.replaced.resize(replaced);
  s.tree.remove_nodes(s.removed);
  s.index.reset(n);  // room for as many ids as before: removed nodes are often replaced
  for (std::size_t i = 0; i < s.tree.node_count(); ++i) s.index.insert(s.tree.nodes()[i].id, std::int32_t(i));
  s.checked_nodes = checked;
  s.removed.assign(s.tree.node_count(), 0);
  s.removals = false;
  s.reanalyse = true;
}

// The last plan's blocks kept (held_blocks.hpp) while every block stays
// within the limit set when they were cut (held_block_limit()); false where
// one would pass it, or a node changed otherwise than by lengthening its
// last piece: the plan is then built again.
bool IncrementalPlanner::hold_flatten_blocks() {
  State& s = *state_;
  if (!grow_held_blocks(s.plan, s.growth.tails, s.held_block_limit, s.held->cost, s.held_blocks)) return false;
  s.plan.token_slot.swap(s.vis->token_slot);
  s.lender = &*s.vis;
  s.plan.min_kv_slots = s.vis->max_slot + 1;
  s.plan.launch_order = plan_launch_order(s.plan, s.held->cost, s.held->launch_order);
  return true;
}

const Plan& IncrementalPlanner::update() {
  State& s = *state_;
  // The appended tokens first: an error leaves every change pending.
  for (std::int32_t g : s.grown) {
    if (!s.removed[std::size_t(g)]) check_slots(s.tree, g, s.options.kv_slots, s.grown_from[std::size_t(g)]);
  }
  for (std::int32_t v : s.replaced) {
    if (!s.removed[std::size_t(v)]) check_slots(s.tree, v, s.options.kv_slots, 0);
  }
  s.plan.id = 0;  // from here on the last plan is not valid (update()'s contract): a device uploads it again
  if (s.lender != nullptr) {
    s.lender->token_slot.swap(s.plan.token_slot);
    s.lender = nullptr;
  }
  if (s.removals) apply_removals();
  s.growth.tails.clear();  // a step without appends holds its blocks as they are

  PlanUpdate info;
  info.grown_nodes = std::int64_t(s.grown.size());
  for (std::int32_t g : s.grown) info.appended_tokens += s.tree.nodes()[std::size_t(g)].length - s.grown_from[std::size_t(g)];
  const std::size_t n = s.tree.node_count();
  if (!s.topo || s.reshaped || (s.reanalyse && !s.same_shape())) {
    s.topo = analyze(s.tree, s.options.kv_slots, s.checked_nodes);
    s.vis = compute_visibility(s.tree, *s.topo, s.options.window);
    s.vis_behind = false;
    s.index_whole_queries();
    s.memo.reset();
    s.flatten_layout = false;
    s.analysed_length.resize(n);
    for (std::size_t i = 0; i < n; ++i) s.analysed_length[i] = s.tree.nodes()[i].length;
    info.reanalysed = true;
  } else {
    if (s.reanalyse) {  // the same shape: the nodes from `first` on hold other tokens, taken below
      for (std::size_t i = s.checked_nodes; i < n; ++i) check_slots(s.tree, std::int32_t(i), s.options.kv_slots, 0);
      for (std::size_t i = std::min(s.first_moved, s.checked_nodes); i < n; ++i) s.replaced.push_back(std::int32_t(i));
      s.index_whole_queries();
    }
    if (!s.grown.empty()) {
      for (std::int32_t g : s.grown) {
        const std::int64_t length = s.tree.nodes()[std::size_t(g)].length;
        for (std::int32_t k = s.whole_begin[std::size_t(g)]; k < s.whole_begin[std::size_t(g) + 1]; ++k) {
          s.topo->query_upto[std::size_t(s.whole_queries[std::size_t(k)])] = std::int32_t(length);
        }
        s.analysed_length[std::size_t(g)] = length;
      }
      if (s.greedy_holds()) {
        s.vis_behind = true;
      } else if (!s.vis_behind &&
                 !update_visibility(s.tree, *s.topo, *s.vis, s.grown, s.flatten_layout ? &s.growth : nullptr)) {
        s.vis = compute_visibility(s.tree, *s.topo, s.options.window);
      }
      s.flatten_layout = s.flatten_layout && s.growth.tails_only;
      // A window slides out of nodes that did not grow: greedy's edges are priced afresh.
      if (s.memo && s.options.window > 0) s.memo.reset();
      if (s.memo) s.memo->appended(s.tree, *s.topo, s.vis_behind ? nullptr : &*s.vis, s.grown);
    }
    if (!s.replaced.empty()) {  // after the appends: a node both grew and was replaced takes its new slots whole
      if (s.greedy_holds()) {
        s.vis_behind = true;
      } else if (!s.vis_behind) {
        replace_slots(s.tree, *s.vis, s.replaced);
      }
      if (s.memo) s.memo->replaced(s.tree, s.replaced);
      info.replaced_nodes = std::int64_t(s.replaced.size());
    }
  }

  const bool chooses = s.options.block_tokens == kAutoBlockTokens || s.options.launch_order == LaunchOrder::model ||
                       (s.options.strategy == Strategy::greedy && s.options.greedy_candidate == GreedyCandidate::model);
  if (!s.held || (chooses && s.drifted())) {
    PlanChoices chosen;
    s.plan = plan_analyzed(s.tree, *s.topo, s.visibility(), s.options, s.pool.get(), nullptr, &chosen, nullptr);
    s.held = with_kv_terms(s.options);  // the held paths read its cost model directly
    s.held->block_tokens = chosen.block_tokens;
    if (s.options.launch_order == LaunchOrder::model) {
      s.held->launch_order = s.plan.launch_order.empty() ? LaunchOrder::items : LaunchOrder::longest_first;
    }
    if (s.options.strategy == Strategy::greedy && s.options.greedy_candidate == GreedyCandidate::model) {
      s.held->greedy_candidate = chosen.greedy_candidate;
    }
    s.chosen_at = {s.visible_tokens(), std::int64_t(s.tree.query_count()),
                   std::int64_t(s.tree.node_count())};
    s.memo.reset();  // the next update prices greedy's edges with the held options
    info.chosen = true;
  } else if (s.flatten_layout && hold_flatten_blocks()) {
    info.held_layout = true;
  } else {
    if (s.held->strategy == Strategy::greedy && !s.memo) {
      s.memo.emplace(*s.topo, s.visibility());
      s.memo->hold_groups = s.holds_layouts() && s.incremental.hold_greedy_groups;
    }
    // Greedy's held layout reads the memo's visibility only; any other plan this one.
    Visibility& vis = s.greedy_holds() ? *s.memo->reordered.cached() : s.visibility();
    info.held_layout = s.memo && s.memo->held && s.held->greedy_candidate == GreedyCandidate::own;
    s.plan = plan_analyzed(s.tree, *s.topo, vis, *s.held, nullptr, s.memo ? &*s.memo : nullptr, nullptr, &s.plan,
                           &s.lender);
  }
  if (!info.held_layout) {  // a plan built now: the layout the next updates may hold
    s.flatten_layout = s.holds_layouts() && s.incremental.hold_flatten_blocks && s.held->strategy == Strategy::flatten;
    if (s.flatten_layout) {
      s.held_block_limit =
          held_block_limit(s.plan, s.held->cost, s.held->block_tokens, s.incremental.redecide_drift);
    }
  }

  for (std::int32_t g : s.grown) s.grown_from[std::size_t(g)] = -1;
  s.grown.clear();
  s.replaced.clear();
  s.reshaped = false;
  s.checked_nodes = s.tree.node_count();
  s.first_moved = SIZE_MAX;
  s.reanalyse = false;
  s.last = info;
  s.plan.id = new_plan_id();
  return s.plan;
}

}  // namespace treeattn
