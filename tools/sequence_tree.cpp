#include "treeattn/sequence_tree.hpp"

#include <algorithm>

#include "fail.hpp"

namespace treeattn {

SequenceTree::~SequenceTree() {
  for (auto& [id, node] : nodes_) {
    for (std::int32_t page : node.pages) cache_.release(page);
  }
}

const SequenceTree::Node& SequenceTree::at(std::int64_t node) const {
  auto it = nodes_.find(node);
  if (it == nodes_.end()) fail(ErrorCategory::InvalidArgument, "sequence tree: node {} does not exist", node);
  return it->second;
}

std::int64_t SequenceTree::add_node(std::int64_t parent) {
  if (parent != kNoParent) {
    (void)at(parent);
    nodes_[parent].children.push_back(next_id_);
  }
  Node& node = nodes_[next_id_];
  node.parent = parent;
  mark_changed(next_id_, node);
  return next_id_++;
}

void SequenceTree::append(std::int64_t node, std::int64_t count) {
  (void)at(node);
  if (count < 0) fail(ErrorCategory::InvalidArgument, "sequence tree: append of {} tokens to node {}", count, node);
  Node& n = nodes_[node];
  const std::int64_t page_size = cache_.page_size();
  const std::int64_t pages_needed = (n.length + count + page_size - 1) / page_size;
  while (std::int64_t(n.pages.size()) < pages_needed) n.pages.push_back(cache_.allocate());
  n.length += count;
  tokens_ += count;
  if (count > 0) mark_changed(node, n);
}

void SequenceTree::mark_changed(std::int64_t id, Node& node) {
  if (node.changed) return;
  node.changed = true;
  changed_.push_back(id);
}

std::int32_t SequenceTree::used_pages(std::int64_t length) const {
  return std::int32_t((length + cache_.page_size() - 1) / cache_.page_size());
}

void SequenceTree::remove(std::int64_t node) {
  const Node& victim = at(node);
  if (victim.synced_length >= 0) removed_.push_back(node);  // its subtree goes with it
  if (victim.parent != kNoParent) {
    auto& siblings = nodes_[victim.parent].children;
    siblings.erase(std::find(siblings.begin(), siblings.end(), node));
  }
  std::vector<std::int64_t> stack = {node};
  while (!stack.empty()) {
    const std::int64_t id = stack.back();
    stack.pop_back();
    auto it = nodes_.find(id);
    for (std::int32_t page : it->second.pages) cache_.release(page);
    tokens_ -= it->second.length;
    stack.insert(stack.end(), it->second.children.begin(), it->second.children.end());
    nodes_.erase(it);
  }
}

std::int64_t SequenceTree::length(std::int64_t node) const { return at(node).length; }
std::int64_t SequenceTree::parent(std::int64_t node) const { return at(node).parent; }
std::size_t SequenceTree::child_count(std::int64_t node) const { return at(node).children.size(); }

std::int64_t SequenceTree::slot(std::int64_t node, std::int64_t token) const {
  const Node& n = at(node);
  const std::int64_t page_size = cache_.page_size();
  return std::int64_t(n.pages[std::size_t(token / page_size)]) * page_size + token % page_size;
}

Tree SequenceTree::to_tree(const HeadConfig& heads, const std::vector<TreeQuery>& queries) const {
  // Each node's pages handed over as they are: a page never mixes nodes, and a node's tokens fill its pages in order.
  Tree tree(heads);
  std::size_t pages = 0;
  std::vector<std::int64_t> ids;
  ids.reserve(nodes_.size());
  for (const auto& [id, node] : nodes_) {
    pages += node.pages.size();
    ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());  // creation order: a parent before its children
  tree.reserve(nodes_.size(), queries.size(), pages);
  std::vector<std::int64_t> page_ids;
  const std::int32_t page_size = cache_.page_size();
  for (const std::int64_t id : ids) {
    const Node& node = nodes_.at(id);
    page_ids.assign(node.pages.begin(), node.pages.end());
    const std::int64_t used_pages = (node.length + page_size - 1) / page_size;
    page_ids.resize(std::size_t(used_pages));  // pages a node holds beyond its tokens are not its KV yet
    const std::int32_t last = node.length == 0 ? 0 : std::int32_t(node.length - (used_pages - 1) * page_size);
    tree.add_node_pages(id, node.parent, page_ids, page_size, last);
  }
  for (const TreeQuery& q : queries) tree.add_query(q.node, q.upto);
  return tree;
}

void SequenceTree::sync(IncrementalPlanner& planner, const std::vector<TreeQuery>& queries) {
  for (std::int64_t id : removed_) planner.remove_node(id);
  removed_.clear();
  // Ids count up as nodes are made: the new nodes go in in creation order,
  // as to_tree() lists them, so the plans agree to the node index.
  if (!std::is_sorted(changed_.begin(), changed_.end())) std::sort(changed_.begin(), changed_.end());
  const std::int32_t page_size = cache_.page_size();
  std::vector<std::int64_t> pages;
  for (std::int64_t id : changed_) {
    auto it = nodes_.find(id);
    if (it == nodes_.end()) continue;  // added and removed between two syncs
    Node& node = it->second;
    node.changed = false;
    const std::int32_t from = node.synced_length < 0 ? 0 : used_pages(node.synced_length);
    pages.assign(node.pages.begin() + from, node.pages.begin() + used_pages(node.length));
    if (node.synced_length < 0) {
      const std::int32_t last = node.length == 0 ? 0 : std::int32_t(node.length - (std::int64_t(pages.size()) - 1) * page_size);
      planner.add_node_pages(id, node.parent, pages, page_size, last);
    } else {
      planner.append_pages(id, node.length - node.synced_length, pages);
    }
    node.synced_length = node.length;
  }
  changed_.clear();
  planner.set_queries(queries);
}

}  // namespace treeattn
