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

void SequenceTree::remove(std::int64_t node) {
  const Node& victim = at(node);
  if (victim.synced_length >= 0) removed_.push_back(victim.planner_id);  // its subtree goes with it
  const std::int64_t parent_planner_id = victim.parent == kNoParent ? kNoParent : nodes_[victim.parent].planner_id;
  if (victim.parent != kNoParent) {
    auto& siblings = nodes_[victim.parent].children;
    siblings.erase(std::find(siblings.begin(), siblings.end(), node));
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> stack = {{node, parent_planner_id}};  // node, its parent's planner id
  while (!stack.empty()) {
    const auto [id, parent] = stack.back();
    stack.pop_back();
    auto it = nodes_.find(id);
    const Node& n = it->second;
    if (n.synced_length >= 0) gone_.push_back(Gone{id, n.planner_id, parent, n.synced_length});
    if (n.planner_id >= 0 && n.planner_id != id) --mapped_;
    for (std::int32_t page : n.pages) cache_.release(page);
    tokens_ -= n.length;
    for (std::int64_t child : n.children) stack.emplace_back(child, n.planner_id);
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

std::int64_t SequenceTree::planner_id(std::int64_t id) const {
  // A new node's place is found among the new ones (in creation order, most
  // often consecutive ids) without a lookup by id.
  if (!fresh_.empty() && id >= fresh_.front().first && id <= fresh_.back().first) {
    const std::int64_t first = fresh_.front().first;
    if (fresh_.back().first - first + 1 == std::int64_t(fresh_.size())) return fresh_[std::size_t(id - first)].second->planner_id;
    const auto it = std::lower_bound(fresh_.begin(), fresh_.end(), id,
                                     [](const std::pair<std::int64_t, Node*>& f, std::int64_t v) { return f.first < v; });
    if (it != fresh_.end() && it->first == id) return it->second->planner_id;
  }
  const auto it = nodes_.find(id);
  return it == nodes_.end() ? id : it->second.planner_id;  // an id not in the tree: the planner names it
}

bool SequenceTree::take_places() {
  if (gone_.empty() || gone_.size() != fresh_.size() || handed_.size() < gone_.size()) return false;
  // The planner's order is creation order: the nodes gone must be its last,
  // for the new ones (the newest) to stand where to_tree() puts them.
  const auto last = handed_.end() - std::ptrdiff_t(gone_.size());
  if (!std::equal(gone_.begin(), gone_.end(), last, [](const Gone& g, std::int64_t id) { return g.id == id; })) return false;
  for (std::size_t k = 0; k < fresh_.size(); ++k) {
    Node& node = *fresh_[k].second;
    const std::int64_t parent = node.parent == kNoParent ? kNoParent : planner_id(node.parent);
    if (parent != gone_[k].parent_planner_id || node.length != gone_[k].synced_length) {
      for (std::size_t j = 0; j < k; ++j) fresh_[j].second->planner_id = -1;
      return false;
    }
    node.planner_id = gone_[k].planner_id;  // its parent, if new, took its place just before it
  }
  return true;
}

void SequenceTree::sync(IncrementalPlanner& planner, const std::vector<TreeQuery>& queries,
                        std::vector<std::int64_t>* handed_slots) {
  // Ids count up as nodes are made: the new nodes go in in creation order,
  // as to_tree() lists them, so the plans agree to the node index.
  if (!std::is_sorted(changed_.begin(), changed_.end())) std::sort(changed_.begin(), changed_.end());
  changed_nodes_.clear();
  fresh_.clear();
  for (std::int64_t id : changed_) {
    auto it = nodes_.find(id);
    if (it == nodes_.end()) continue;  // added and removed between two syncs
    changed_nodes_.emplace_back(id, &it->second);
    if (it->second.synced_length < 0) fresh_.emplace_back(id, &it->second);
  }
  // New nodes of the removed ones' shape take their places (and planner
  // ids) with other pages: the planner redoes only their slots.
  std::sort(gone_.begin(), gone_.end(), [](const Gone& a, const Gone& b) { return a.id < b.id; });  // creation order
  const bool replaced = take_places();
  if (replaced) {
    mapped_ += std::int64_t(fresh_.size());
    std::size_t at = handed_.size() - fresh_.size();
    for (const auto& f : fresh_) handed_[at++] = f.first;
  } else {
    for (std::int64_t id : removed_) planner.remove_node(id);
    if (!gone_.empty()) {  // the planner's order closes up
      std::size_t kept = 0, g = 0;
      for (std::int64_t id : handed_) {
        while (g < gone_.size() && gone_[g].id < id) ++g;
        if (g == gone_.size() || gone_[g].id != id) handed_[kept++] = id;
      }
      handed_.resize(kept);
    }
  }
  removed_.clear();
  gone_.clear();

  const std::int32_t page_size = cache_.page_size();
  std::vector<std::int64_t> pages;
  for (const auto& [id, node_ptr] : changed_nodes_) {
    Node& node = *node_ptr;
    node.changed = false;
    // append() holds exactly the pages a node's tokens fill: the new ones
    // follow those handed over.
    pages.assign(node.pages.begin() + std::ptrdiff_t(node.synced_pages), node.pages.end());
    if (node.synced_length < 0) {
      const std::int32_t last = node.length == 0 ? 0 : std::int32_t(node.length - (std::int64_t(pages.size()) - 1) * page_size);
      if (replaced) {
        planner.replace_pages(node.planner_id, pages, page_size, last);
      } else {
        const std::int64_t parent = node.parent == kNoParent || mapped_ == 0 ? node.parent : planner_id(node.parent);
        node.planner_id = id;
        planner.add_node_pages(id, parent, pages, page_size, last);
        handed_.push_back(id);
      }
    } else {
      planner.append_pages(node.planner_id, node.length - node.synced_length, pages);
    }
    if (handed_slots != nullptr) {
      for (std::int64_t t = std::max<std::int64_t>(node.synced_length, 0); t < node.length; ++t) {
        handed_slots->push_back(std::int64_t(node.pages[std::size_t(t / page_size)]) * page_size + t % page_size);
      }
    }
    node.synced_length = node.length;
    node.synced_pages = node.pages.size();
  }
  changed_.clear();
  if (mapped_ == 0) {
    planner.set_queries(queries);
  } else {  // the planner knows a node that took another's place by that one's id
    planner_queries_.resize(queries.size());
    for (std::size_t q = 0; q < queries.size(); ++q) planner_queries_[q] = {planner_id(queries[q].node), queries[q].upto};
    planner.set_queries(planner_queries_);
  }
  fresh_.clear();
  changed_nodes_.clear();
}

}  // namespace treeattn
