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
  // (all of them at the first) and `queries`; its tree is then to_tree()'s.
  // One planner per SequenceTree: the changes are handed over once. Costs
  // the changed nodes' new pages, not the tree's.
  void sync(IncrementalPlanner& planner, const std::vector<TreeQuery>& queries);

 private:
  struct Node {
    std::int64_t parent = kNoParent;
    std::int64_t length = 0;
    std::vector<std::int32_t> pages;
    std::vector<std::int64_t> children;
    std::int64_t synced_length = -1;  // tokens at the last sync, -1: not synced yet
    bool changed = false;             // in changed_
  };
  const Node& at(std::int64_t node) const;
  void mark_changed(std::int64_t id, Node& node);
  std::int32_t used_pages(std::int64_t length) const;

  PagedKvCache& cache_;
  std::unordered_map<std::int64_t, Node> nodes_;  // by id: a decode step looks up each node it changes
  std::int64_t next_id_ = 0;
  std::vector<std::int64_t> changed_;  // nodes added or grown since the last sync
  std::vector<std::int64_t> removed_;  // synced nodes removed since (subtree roots)
  std::int64_t tokens_ = 0;
};

}  // namespace treeattn
