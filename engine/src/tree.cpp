#include "treeattn/tree.hpp"

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

void Tree::reserve(std::size_t nodes, std::size_t queries, std::size_t listed_slots) {
  nodes_.reserve(nodes);
  queries_.reserve(queries);
  listed_slots_.reserve(listed_slots);
}

}  // namespace treeattn
