#pragma once
// The live tree of sequences during tree decoding: nodes that grow token by
// token, fork into children and are pruned with their subtrees. Each node owns
// whole pages of a PagedKvCache (a page never mixes nodes), so pruning a branch
// returns exactly its pages. to_tree() takes a snapshot for plan();
// sync() hands an IncrementalPlanner the changes since the last sync.

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "treeattn/incremental_planner.hpp"
#include "treeattn/kv_cache.hpp"
#include "treeattn/tree.hpp"

namespace treeattn {

class SequenceTree {
 public:
  explicit SequenceTree(PagedKvCache& cache) : cache_(cache) {}
  ~SequenceTree();
  SequenceTree(const SequenceTree&) = delete;
  SequenceTree& operator=(const SequenceTree&) = delete;

  // A new empty node under `parent` (kNoParent for a root); ids count up from 0.
  std::int64_t add_node(std::int64_t parent);
  // Appends `count` tokens to a node, taking pages from the cache as needed.
  void append(std::int64_t node, std::int64_t count);
  // Removes a node and its whole subtree, returning their pages.
  void remove(std::int64_t node);

  bool contains(std::int64_t node) const { return nodes_.count(node) != 0; }
  std::int64_t length(std::int64_t node) const;
  std::int64_t parent(std::int64_t node) const;
  std::size_t child_count(std::int64_t node) const;
  std::size_t size() const noexcept { return nodes_.size(); }
  std::int64_t tokens() const noexcept { return tokens_; }

  // KV-pool slot of token `token` of `node`.
  std::int64_t slot(std::int64_t node, std::int64_t token) const;

  // The live nodes (in creation order) with their slots, and `queries`.
  Tree to_tree(const HeadConfig& heads, const std::vector<TreeQuery>& queries) const;

  // Gives `planner` the nodes added, grown and removed since the last sync
  // (all of them at the first) and `queries`; its tree is then to_tree()'s,
  // node for node. Where the nodes added have the shape of the ones removed
  // (a speculative step's new token tree: the same parents and lengths in
  // creation order) and those were the planner's last, they take the removed
  // ones' places and ids in the planner with their own pages
  // (IncrementalPlanner::replace_pages), so the planner's tree keeps the
  // first ids of such nodes. One planner per SequenceTree: the changes are
  // handed over once. Costs the changed nodes' new pages, not the tree's.
  // With `handed_slots`, the slots of the tokens handed over (the new nodes'
  // and the appended ones) are appended to it, node by node.
  void sync(IncrementalPlanner& planner, const std::vector<TreeQuery>& queries,
            std::vector<std::int64_t>* handed_slots = nullptr);

 private:
  struct Node {
    std::int64_t parent = kNoParent;
    std::int64_t length = 0;
    std::vector<std::int32_t> pages;
    std::vector<std::int64_t> children;
    std::int64_t synced_length = -1;  // tokens at the last sync, -1: not synced yet
    std::size_t synced_pages = 0;     // pages at the last sync
    std::int64_t planner_id = -1;     // its id in the planner: its own, or the one of the node whose place it took
    bool changed = false;             // in changed_
  };
  struct Gone {  // a removed node the planner has
    std::int64_t id, planner_id, parent_planner_id, synced_length;
  };
  const Node& at(std::int64_t node) const;
  void mark_changed(std::int64_t id, Node& node);
  // Whether the nodes in fresh_ take the places of those gone (in creation
  // order); if so each has the planner id it takes.
  bool take_places();
  // The id the planner knows a live node by (sync()'s new nodes included);
  // an id not in the tree as it is, for the planner to refuse.
  std::int64_t planner_id(std::int64_t id) const;

  PagedKvCache& cache_;
  std::unordered_map<std::int64_t, Node> nodes_;  // by id: a decode step looks up each node it changes
  std::int64_t next_id_ = 0;
  std::vector<std::int64_t> changed_;  // nodes added or grown since the last sync
  std::vector<std::int64_t> removed_;  // planner ids of the synced nodes removed since (subtree roots)
  std::vector<Gone> gone_;             // every synced node removed since, its subtree's included
  std::vector<std::int64_t> handed_;   // the live synced nodes, in the planner's order (ascending ids)
  std::int64_t mapped_ = 0;            // live nodes whose planner id is not their own
  std::vector<TreeQuery> planner_queries_;  // sync()'s queries by planner id
  // sync()'s changed nodes, and those of them not handed over before, by id.
  std::vector<std::pair<std::int64_t, Node*>> changed_nodes_, fresh_;
  std::int64_t tokens_ = 0;
};

}  // namespace treeattn
