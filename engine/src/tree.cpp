#include "treeattn/tree.hpp"

#include <algorithm>
#include <cmath>

namespace treeattn {

float HeadConfig::effective_scale() const noexcept {
  if (scale != 0.0f) return scale;
  return head_dim > 0 ? 1.0f / std::sqrt(float(head_dim)) : 0.0f;
}

void Tree::add_node(std::int64_t id, std::int64_t parent, const std::vector<std::int64_t>& slots) {
  nodes_.push_back(TreeNode{id, parent, std::int64_t(slots.size()),
                            std::int64_t(listed_slots_.size()), true});
  listed_slots_.insert(listed_slots_.end(), slots.begin(), slots.end());
}

void Tree::add_node_range(std::int64_t id, std::int64_t parent, std::int64_t first_slot,
                          std::int64_t count) {
  nodes_.push_back(TreeNode{id, parent, count, first_slot, false});
}

void Tree::add_node_pages(std::int64_t id, std::int64_t parent, const std::vector<std::int64_t>& pages,
                          std::int32_t page_size, std::int32_t last_page_tokens) {
  // The length as given; plan() checks that it fits the pages (topology.cpp).
  const std::int64_t length =
      pages.empty() ? last_page_tokens : std::int64_t(pages.size() - 1) * page_size + last_page_tokens;
  TreeNode node{id, parent, length, std::int64_t(listed_slots_.size()), true};
  node.page_size = page_size;
  node.pages = std::int64_t(pages.size());
  nodes_.push_back(node);
  listed_slots_.insert(listed_slots_.end(), pages.begin(), pages.end());
}

void Tree::add_query(std::int64_t node_id, std::int64_t upto) {
  queries_.push_back(TreeQuery{node_id, upto});
}

void Tree::move_listed_to_end(TreeNode& node) {
  const std::int64_t entries = node.page_size > 0 ? node.pages : node.length;
  if (node.first + entries == std::int64_t(listed_slots_.size())) return;
  // Packs the list first when most of it is dead: growth stays amortised O(1).
  if (dead_listed_ > std::int64_t(listed_slots_.size()) / 2) remove_nodes(std::vector<std::uint8_t>(nodes_.size(), 0));
  if (node.first + entries == std::int64_t(listed_slots_.size())) return;
  const std::int64_t first = std::int64_t(listed_slots_.size());
  listed_slots_.resize(listed_slots_.size() + std::size_t(entries));
  std::copy_n(listed_slots_.begin() + node.first, entries, listed_slots_.begin() + first);
  node.first = first;
  dead_listed_ += entries;
}

void Tree::append_slots(std::size_t index, const std::int64_t* slots, std::int64_t count) {
  TreeNode& node = nodes_[index];
  if (!node.listed) {  // a range becomes a list
    const std::int64_t first = std::int64_t(listed_slots_.size());
    for (std::int64_t t = 0; t < node.length; ++t) listed_slots_.push_back(node.first + t);
    node.first = first;
    node.listed = true;
  }
  move_listed_to_end(node);
  listed_slots_.insert(listed_slots_.end(), slots, slots + count);
  node.length += count;
}

void Tree::append_range(std::size_t index, std::int64_t first_slot, std::int64_t count) {
  TreeNode& node = nodes_[index];
  if (!node.listed && node.page_size == 0 && (node.length == 0 || node.first + node.length == first_slot)) {
    if (node.length == 0) node.first = first_slot;
    node.length += count;
    return;
  }
  std::vector<std::int64_t> slots(static_cast<std::size_t>(count));
  for (std::int64_t t = 0; t < count; ++t) slots[std::size_t(t)] = first_slot + t;
  append_slots(index, slots.data(), count);
}

void Tree::append_pages(std::size_t index, std::int64_t count, const std::vector<std::int64_t>& new_pages) {
  TreeNode& node = nodes_[index];
  if (!new_pages.empty()) {
    move_listed_to_end(node);
    listed_slots_.insert(listed_slots_.end(), new_pages.begin(), new_pages.end());
    node.pages += std::int64_t(new_pages.size());
  }
  node.length += count;
}

void Tree::remove_nodes(const std::vector<std::uint8_t>& removed) {
  std::vector<std::int64_t> packed;
  packed.reserve(listed_slots_.size() - std::size_t(dead_listed_));
  std::size_t kept = 0;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (removed[i]) continue;
    TreeNode node = nodes_[i];
    if (node.listed) {
      const std::int64_t entries = node.page_size > 0 ? node.pages : node.length;
      const std::int64_t first = std::int64_t(packed.size());
      packed.insert(packed.end(), listed_slots_.begin() + node.first, listed_slots_.begin() + node.first + entries);
      node.first = first;
    }
    nodes_[kept++] = node;
  }
  nodes_.resize(kept);
  listed_slots_ = std::move(packed);
  dead_listed_ = 0;
}

void Tree::reserve(std::size_t nodes, std::size_t queries, std::size_t listed_slots) {
  nodes_.reserve(nodes);
  queries_.reserve(queries);
  listed_slots_.reserve(listed_slots);
}

}  // namespace treeattn
