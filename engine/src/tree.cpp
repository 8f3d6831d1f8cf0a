#include "treeattn/tree.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "fail.hpp"

namespace treeattn {
namespace {

// A paged node is told apart by its page size: one below 1 could not be
// stored as a paged node (nor read back as one), so it is refused at once.
void check_page_size(std::int64_t id, std::int32_t page_size) {
  if (page_size < 1) fail(ErrorCategory::InvalidTree, "node {}: page_size {} must be positive", id, page_size);
}

}  // namespace

float HeadConfig::effective_scale() const noexcept {
  if (scale != 0.0f) return scale;
  return head_dim > 0 ? 1.0f / std::sqrt(float(head_dim)) : 0.0f;
}

bool HeadConfig::same_as(const HeadConfig& o) const noexcept {
  return heads_q == o.heads_q && heads_kv == o.heads_kv && head_dim == o.head_dim && value_dim() == o.value_dim() &&
         effective_scale() == o.effective_scale();
}

std::string describe(const HeadConfig& h) {
  if (h.value_dim() != h.head_dim) {
    return fmt::format("{}/{}/{} v {} scale {}", h.heads_q, h.heads_kv, h.head_dim, h.value_dim(), h.effective_scale());
  }
  return fmt::format("{}/{}/{} scale {}", h.heads_q, h.heads_kv, h.head_dim, h.effective_scale());
}

void Tree::add_node(std::int64_t id, std::int64_t parent, const std::vector<std::int64_t>& slots) {
  const std::int64_t first = claim_listed(std::int64_t(slots.size()));
  nodes_.push_back(TreeNode{id, parent, std::int64_t(slots.size()), first, true});
  reserved_.push_back(std::int64_t(slots.size()));
  std::copy(slots.begin(), slots.end(), listed_slots_.begin() + first);
}

void Tree::add_node_range(std::int64_t id, std::int64_t parent, std::int64_t first_slot,
                          std::int64_t count) {
  nodes_.push_back(TreeNode{id, parent, count, first_slot, false});
  reserved_.push_back(0);
}

void Tree::add_node_pages(std::int64_t id, std::int64_t parent, const std::vector<std::int64_t>& pages,
                          std::int32_t page_size, std::int32_t last_page_tokens) {
  check_page_size(id, page_size);
  // The length as given; plan() checks that it fits the pages (topology.cpp).
  const std::int64_t length =
      pages.empty() ? last_page_tokens : std::int64_t(pages.size() - 1) * page_size + last_page_tokens;
  TreeNode node{id, parent, length, claim_listed(std::int64_t(pages.size())), true};
  node.page_size = page_size;
  node.pages = std::int64_t(pages.size());
  nodes_.push_back(node);
  reserved_.push_back(std::int64_t(pages.size()));
  std::copy(pages.begin(), pages.end(), listed_slots_.begin() + node.first);
}

void Tree::add_query(std::int64_t node_id, std::int64_t upto) {
  queries_.push_back(TreeQuery{node_id, upto});
}

namespace {
std::int64_t listed_entries(const TreeNode& node) { return node.page_size > 0 ? node.pages : node.length; }
}  // namespace

std::int64_t Tree::claim_listed(std::int64_t count) {
  const std::int64_t first = listed_end_;
  listed_end_ += count;
  if (listed_end_ > std::int64_t(listed_slots_.size())) {
    // Written (and so faulted in) here, all at once: the entries claimed at
    // later steps are then in memory the process already has.
    listed_slots_.resize(std::size_t(std::max(listed_end_, 2 * std::int64_t(listed_slots_.size()))));
  }
  return first;
}

void Tree::make_room(std::size_t index, std::int64_t more) {
  TreeNode& node = nodes_[index];
  const std::int64_t entries = listed_entries(node);
  std::int64_t& reserved = reserved_[index];
  if (entries + more <= reserved) return;
  if (node.first + reserved == listed_end_) {  // last in the list: it grows there
    claim_listed(2 * (entries + more) - reserved);
    reserved = 2 * (entries + more);
    return;
  }
  // Packs the list first when most of it is dead: growth stays amortised O(1).
  if (dead_listed_ > listed_end_ / 2) pack();
  dead_listed_ += reserved;
  reserved = 2 * (entries + more);
  const std::int64_t first = claim_listed(reserved);
  std::copy_n(listed_slots_.begin() + node.first, entries, listed_slots_.begin() + first);
  node.first = first;
}

std::vector<std::int64_t>::iterator Tree::appended_slots(std::size_t index, std::int64_t count) {
  TreeNode& node = nodes_[index];
  if (!node.listed) {  // a range becomes a list
    reserved_[index] = 2 * (node.length + count);
    const std::int64_t first = claim_listed(reserved_[index]);
    for (std::int64_t t = 0; t < node.length; ++t) {  // wrapping past INT64_MAX as append_range's slots do
      listed_slots_[std::size_t(first + t)] = std::int64_t(std::uint64_t(node.first) + std::uint64_t(t));
    }
    node.first = first;
    node.listed = true;
  }
  make_room(index, count);
  const auto at = listed_slots_.begin() + node.first + node.length;
  node.length += count;
  return at;
}

void Tree::append_slots(std::size_t index, const std::int64_t* slots, std::int64_t count) {
  std::copy_n(slots, count, appended_slots(index, count));
}

void Tree::append_range(std::size_t index, std::int64_t first_slot, std::int64_t count) {
  TreeNode& node = nodes_[index];
  // Unsigned: a range not yet validated may start anywhere (plan() refuses it later).
  const bool continues = std::uint64_t(node.first) + std::uint64_t(node.length) == std::uint64_t(first_slot);
  if (!node.listed && node.page_size == 0 && (node.length == 0 || continues)) {
    if (node.length == 0) node.first = first_slot;
    node.length += count;
    return;
  }
  // Counted in uint64: past INT64_MAX the slots wrap to negative ones, which plan() refuses.
  const auto slots = appended_slots(index, count);
  for (std::int64_t t = 0; t < count; ++t) slots[t] = std::int64_t(std::uint64_t(first_slot) + std::uint64_t(t));
}

void Tree::append_pages(std::size_t index, std::int64_t count, const std::vector<std::int64_t>& new_pages) {
  TreeNode& node = nodes_[index];
  if (!new_pages.empty()) {
    make_room(index, std::int64_t(new_pages.size()));
    std::copy(new_pages.begin(), new_pages.end(), listed_slots_.begin() + node.first + node.pages);
    node.pages += std::int64_t(new_pages.size());
  }
  node.length += count;
}

void Tree::replace_pages(std::size_t index, const std::vector<std::int64_t>& pages, std::int32_t page_size,
                         std::int32_t last_page_tokens) {
  check_page_size(nodes_[index].id, page_size);
  TreeNode& node = nodes_[index];
  const std::int64_t entries = std::int64_t(pages.size());
  if (!node.listed || reserved_[index] < entries) {  // its room is too small: new room at the end
    if (node.listed) {  // its room is given up (a pack drops it)
      dead_listed_ += reserved_[index];
      node.listed = false;
    }
    if (dead_listed_ > listed_end_ / 2) pack();
    node.first = claim_listed(entries);
    node.listed = true;
    reserved_[index] = entries;
  }
  std::copy(pages.begin(), pages.end(), listed_slots_.begin() + node.first);
  node.page_size = page_size;
  node.pages = entries;
  node.length = pages.empty() ? last_page_tokens : (entries - 1) * page_size + last_page_tokens;
}

void Tree::remove_nodes(const std::vector<std::uint8_t>& removed) {
  std::size_t kept = 0;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (removed[i]) {
      if (nodes_[i].listed) dead_listed_ += reserved_[i];
      continue;
    }
    nodes_[kept] = nodes_[i];
    reserved_[kept++] = reserved_[i];
  }
  nodes_.resize(kept);
  reserved_.resize(kept);
  if (dead_listed_ > listed_end_ / 2) pack();
}

void Tree::pack() {
  // Room for as much again: the nodes packed without spare room move to the
  // end as they grow.
  std::vector<std::int64_t> packed(std::size_t(std::max<std::int64_t>(2 * (listed_end_ - dead_listed_), 1)));
  std::int64_t end = 0;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    TreeNode& node = nodes_[i];
    if (!node.listed) continue;
    const std::int64_t entries = listed_entries(node);
    std::copy_n(listed_slots_.begin() + node.first, entries, packed.begin() + end);
    node.first = end;
    reserved_[i] = entries;
    end += entries;
  }
  listed_slots_ = std::move(packed);
  listed_end_ = end;
  dead_listed_ = 0;
}

void Tree::reserve(std::size_t nodes, std::size_t queries, std::size_t listed_slots) {
  nodes_.reserve(nodes);
  queries_.reserve(queries);
  if (std::int64_t(listed_slots) > std::int64_t(listed_slots_.size())) listed_slots_.resize(listed_slots);
}

}  // namespace treeattn
