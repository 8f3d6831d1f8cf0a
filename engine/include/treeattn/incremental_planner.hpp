#pragma once
// IncrementalPlanner: the plan of a tree that changes a little every decode
// step. It keeps the tree and what plan() derives from it (the validated
// topology, who sees what, greedy's priced edges) and takes the step's
// changes: tokens appended to nodes, nodes added or removed, new queries.
// update() then brings the plan up to date:
//
//   * appends only (the common decode step): the appended slots are checked,
//     the grown nodes' visibility redone and every later token shifted;
//     flatten keeps its blocks, the new tokens joining the block of their
//     node's last token (hold_flatten_blocks), and greedy lays out the
//     groups of its held edge decisions at the new counts (with
//     hold_greedy_groups off, it re-prices only the edges whose token counts
//     changed); no candidate plan is timed and nothing else in the tree is
//     looked at again. Linear in the pieces (about one per node and query)
//     plus one move of the token slots, not in the tree's tokens.
//   * nodes given other pages at the same length (replace_pages), or
//     removed and others added in their place with the same shape (a
//     speculative step's new token tree: the same parents, lengths and
//     queries by node index, new slots): the topology and visibility are
//     kept, only the new slots checked and written, as with appends.
//   * other changes to nodes or queries: the topology is rebuilt, the slots
//     of the nodes added are checked, no other node's again.
//
// The cost model's per-plan choices, the block size (kAutoBlockTokens), the
// launch order (LaunchOrder::model) and greedy's layout
// (GreedyCandidate::model), are made by a from-scratch plan at
// the first update and kept while the tree stays near the size they were made
// for (IncrementalOptions::redecide_drift); the first update past it makes
// them again. The plan is bitwise plan(tree(), held_options()): the options
// with those choices filled in; by default, except where it keeps an
// earlier update's layout (PlanUpdate::held_layout): flatten's blocks over
// the updates that only lengthen nodes, until a block grows past the drift,
// and greedy's edge decisions after the update that decides them (the
// first after a choice or a change of shape). Those plans cover every
// query's tokens exactly (IncrementalOptions::hold_flatten_blocks and
// hold_greedy_groups say what they keep); with both off every plan is
// bitwise. With a sliding window (PlanOptions::window) every append slides
// the windows of the queries below it, so tokens leave nodes that did not
// grow: the visibility is computed again at each update that appends, no
// layout is held, and every plan is bitwise plan(tree(), held_options()).
//
//   treeattn::IncrementalPlanner planner(heads, options);
//   planner.add_node_range(0, treeattn::kNoParent, 0, 4000);  // step 1: the whole tree
//   planner.add_node_range(1, 0, 4000, 1);
//   planner.set_queries({{1}});
//   upload(planner.update());
//   planner.append_range(1, 4001, 1);                          // each later step: its changes
//   upload(planner.update());
//
// Changes name nodes by id; an unknown or removed id is refused at once.
// Slots are checked by update(), which names the node and token; after an
// error the changes stay pending, so a caller may remove the offending node
// and update again. Not thread-safe: one planner per decode loop.

#include <cstdint>
#include <memory>
#include <vector>

#include "treeattn/plan.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/tree.hpp"

namespace treeattn {

struct IncrementalOptions {
  // The cost model's choices (block size, launch order) stay while the tree's
  // visible tokens, queries and nodes each differ by at most this fraction
  // from their counts when they were made; the first update past it makes
  // them again. 0: at every update (a from-scratch plan each time).
  double redecide_drift = 0.25;
  // Greedy keeps its edge decisions (which parents' KV is read together with
  // which children's) from the first update after a choice until the next
  // choice or a change of the tree's shape: later updates lay out the groups
  // those decisions give at the new token counts (packed and split again)
  // without deciding any edge, so their plans cover every query's tokens
  // exactly but may differ from a from-scratch plan where that would now
  // decide an edge otherwise. false: every update is bitwise plan(tree(),
  // held_options()), greedy's included.
  bool hold_greedy_groups = true;
  // Flatten keeps its blocks over the updates that only lengthen nodes or
  // give them other slots at their lengths (replace_pages, a token tree of
  // the same shape): a node's new tokens join the block that holds its last
  // token, later tokens shift, and every item, mask and partial stays, so
  // the plan is not emitted again. The blocks are cut evenly again, bitwise
  // plan(), at the first update where a block would pass block_tokens *
  // (1 + redecide_drift) tokens (kMaxBlockTokens at most) if the plan fills
  // the device (in the cost model its passes' work over the slots outweighs
  // its longest pass with room to spare), else block_tokens, so a held block
  // never lengthens a step its longest pass sets; or at the first update
  // that changes more than that. Such plans cover every query's tokens exactly and differ
  // from a from-scratch plan in where blocks end (so in rounding); their
  // block_tokens is their longest block. false: every update is bitwise
  // plan(tree(), held_options()).
  bool hold_flatten_blocks = true;
  // Threads for choosing a block size (Planner's meaning: 0 one per hardware
  // thread); updates between choices run on the calling thread.
  int threads = 1;
};

// What the last update() did.
struct PlanUpdate {
  bool reanalysed = false;       // the topology was rebuilt: the tree's shape or its queries changed
  std::int64_t replaced_nodes = 0;  // nodes given other pages at their length (replace_pages), or come in place
                                    // of removed ones of the same shape (parents, lengths and queries by node
                                    // index): only their slots were redone
  bool chosen = false;           // the cost model's choices were made (a from-scratch plan)
  // The plan keeps an earlier update's layout (hold_flatten_blocks,
  // hold_greedy_groups) where a from-scratch plan may lay the tree out otherwise.
  bool held_layout = false;
  std::int64_t grown_nodes = 0;  // nodes with appended tokens
  std::int64_t appended_tokens = 0;
};

class IncrementalPlanner {
 public:
  // Throws InvalidArgument for options plan() refuses.
  explicit IncrementalPlanner(const HeadConfig& heads, const PlanOptions& options = {},
                              const IncrementalOptions& incremental = {});
  ~IncrementalPlanner();
  IncrementalPlanner(IncrementalPlanner&&) noexcept;
  IncrementalPlanner& operator=(IncrementalPlanner&&) noexcept;

  // Every node of `tree`, after those there are, and its queries (a first
  // step taken from a whole Tree). Its heads must be the planner's.
  void add_tree(const Tree& tree);
  // New nodes, as Tree's (an id in use is refused).
  void add_node(std::int64_t id, std::int64_t parent, const std::vector<std::int64_t>& slots);
  void add_node_range(std::int64_t id, std::int64_t parent, std::int64_t first_slot, std::int64_t count);
  void add_node_pages(std::int64_t id, std::int64_t parent, const std::vector<std::int64_t>& pages,
                      std::int32_t page_size, std::int32_t last_page_tokens);
  // Tokens appended to a node, in order: their slots, a slot range, or (a
  // paged node) `count` tokens that fill its last page and then `new_pages`.
  void append(std::int64_t id, const std::vector<std::int64_t>& slots);
  void append_range(std::int64_t id, std::int64_t first_slot, std::int64_t count);
  void append_pages(std::int64_t id, std::int64_t count, const std::vector<std::int64_t>& new_pages);
  // A node's tokens are now in other pages, as add_node_pages' (its id,
  // parent, children and queries kept): a token tree verified every step
  // keeps its nodes and takes each step's draft tokens in place, where
  // removing it and adding a new one of the same shape would change every
  // id. With its length kept only its slots are redone at the update;
  // another length makes it a change of shape.
  void replace_pages(std::int64_t id, const std::vector<std::int64_t>& pages, std::int32_t page_size,
                     std::int32_t last_page_tokens);
  // Removes a node and its whole subtree.
  void remove_node(std::int64_t id);
  // This step's queries (row i of Q is queries[i]); the same list as the
  // last step's is no change.
  void set_queries(const std::vector<TreeQuery>& queries);

  // Applies the pending changes and returns the plan (valid until the next update()).
  const Plan& update();

  const Plan& plan() const noexcept;
  // The tree as of the last update(), with the changes since applied.
  const Tree& tree() const noexcept;
  // The block size the plan was made with (auto's choice, or the option's).
  std::int32_t block_tokens() const noexcept;
  // The options as given, and with the cost model's choices filled in (what
  // the plan is bitwise plan() of), its terms for kv_dtype in place
  // (CostModel::for_kv; kv_dtype then f16).
  const PlanOptions& options() const noexcept;
  const PlanOptions& held_options() const noexcept;
  const PlanUpdate& last_update() const noexcept;

 private:
  std::int32_t index_of(std::int64_t id, const char* change) const;
  void check_new(std::int64_t id) const;
  void added(std::int64_t id);
  void grew(std::int32_t index, std::int64_t count);
  void apply_removals();
  bool hold_flatten_blocks();

  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace treeattn
