#pragma once
// The tree (or forest) of KV-cache nodes and the queries that attend over it.
//
// Query i sits on a node and sees every token on the root->node path, all of its
// own node included, or only the first `upto` tokens of its own node when `upto`
// is given (causal inside a node: speculative token trees, tree-structured append).
// Node ids are arbitrary integers chosen by the caller, but -1: parent -1 marks a root.
// Nothing but a page size is checked while the tree is built: plan() validates everything at once
// and reports the first problem with the node or query it concerns.

#include <cstdint>
#include <string>
#include <vector>

namespace treeattn {

class IncrementalPlanner;

// Supported head dimensions (the kernels are specialised for each): Q, K and
// V rows of one of these, or the (QK, V) pairs of kSupportedSplitHeadDims.
inline constexpr int kSupportedHeadDims[] = {64, 96, 128, 256};
struct SplitHeadDims {
  int head_dim, head_dim_v;
};
// DeepSeek-V2/V3 (and Kimi K2) without absorption: 192-dim queries and keys, 128-dim values.
inline constexpr SplitHeadDims kSupportedSplitHeadDims[] = {{192, 128}};

struct HeadConfig {
  int heads_q = 0;
  int heads_kv = 0;
  int head_dim = 0;    // Q and K columns
  float scale = 0.0f;  // softmax scale; 0 means the default 1/sqrt(head_dim)
  int head_dim_v = 0;  // V and O columns; 0 means head_dim

  int group_size() const noexcept { return heads_kv > 0 ? heads_q / heads_kv : 0; }
  float effective_scale() const noexcept;
  int value_dim() const noexcept { return head_dim_v != 0 ? head_dim_v : head_dim; }
  // The same heads, head dims and effective scale (what a workspace's kernels are set up for).
  bool same_as(const HeadConfig& other) const noexcept;
};

// "32/8/128 scale 0.0883883" ("32/8/192 v 128 scale ..." with another V dim), for messages.
std::string describe(const HeadConfig& heads);

// What plan() checks of a tree's heads, for a caller that takes them before it
// builds a tree: throws an InvalidTree Error naming the first bad field (a
// count, head dims without kernels, the scale).
void check_heads(const HeadConfig& heads);

inline constexpr std::int64_t kNoParent = -1;
inline constexpr std::int64_t kWholeNode = -1;  // a query without `upto`

struct TreeNode {
  std::int64_t id = 0;
  std::int64_t parent = kNoParent;
  std::int64_t length = 0;  // tokens in the node
  // Where the node's slots are: a contiguous range [first, first + length) of
  // the KV pool when `listed` is false, else an offset into Tree's list of
  // slots, or of page ids when the node is paged.
  std::int64_t first = 0;
  bool listed = false;
  // Paged (page_size > 0): `pages` page ids from `first` on; token t is in slot
  // page[t / page_size] * page_size + t % page_size.
  std::int32_t page_size = 0;
  std::int64_t pages = 0;
};

struct TreeQuery {
  std::int64_t node = 0;           // node id
  std::int64_t upto = kWholeNode;  // tokens of its own node it sees, or kWholeNode
};

class Tree {
 public:
  Tree() = default;
  explicit Tree(HeadConfig head_config) : heads(head_config) {}

  HeadConfig heads;

  // A node whose tokens live in the given KV-pool slots, in order.
  void add_node(std::int64_t id, std::int64_t parent, const std::vector<std::int64_t>& slots);
  // A node whose `count` tokens live in slots [first_slot, first_slot + count).
  void add_node_range(std::int64_t id, std::int64_t parent, std::int64_t first_slot,
                      std::int64_t count);
  // A node whose tokens fill pages of a paged KV cache, in order: page p holds
  // slots [p * page_size, (p + 1) * page_size), the last one `last_page_tokens`
  // of them (1..page_size; 0 with no pages). Kept and checked per page; a
  // page_size below 1 is refused at once (InvalidTree).
  void add_node_pages(std::int64_t id, std::int64_t parent, const std::vector<std::int64_t>& pages,
                      std::int32_t page_size, std::int32_t last_page_tokens);
  // A query on node `node_id` (row `query_count()` of Q).
  void add_query(std::int64_t node_id, std::int64_t upto = kWholeNode);

  std::size_t node_count() const noexcept { return nodes_.size(); }
  std::size_t query_count() const noexcept { return queries_.size(); }
  const std::vector<TreeNode>& nodes() const noexcept { return nodes_; }
  const std::vector<TreeQuery>& queries() const noexcept { return queries_; }

  // KV-pool slot of token `token` of the node at `node_index` (insertion order).
  std::int64_t slot(std::size_t node_index, std::int64_t token) const noexcept {
    const TreeNode& n = nodes_[node_index];
    if (n.page_size > 0) return page(node_index, token / n.page_size) * n.page_size + token % n.page_size;
    return n.listed ? listed_slots_[std::size_t(n.first + token)] : n.first + token;
  }
  // Page id `p` of the paged node at `node_index`.
  std::int64_t page(std::size_t node_index, std::int64_t p) const noexcept {
    return listed_slots_[std::size_t(nodes_[node_index].first + p)];
  }

  // Makes room for a tree of known size (optional; avoids reallocations).
  void reserve(std::size_t nodes, std::size_t queries, std::size_t listed_slots = 0);

 private:
  friend class IncrementalPlanner;  // grows, and removes nodes of, the tree it keeps
  // Tokens appended to the node at `index`: slots, a range, or (paged) `count`
  // tokens filling its last page and then `new_pages`.
  void append_slots(std::size_t index, const std::int64_t* slots, std::int64_t count);
  void append_range(std::size_t index, std::int64_t first_slot, std::int64_t count);
  void append_pages(std::size_t index, std::int64_t count, const std::vector<std::int64_t>& new_pages);
  // The node at `index` holds other tokens: these pages, as add_node_pages' (its id, parent and children kept).
  void replace_pages(std::size_t index, const std::vector<std::int64_t>& pages, std::int32_t page_size,
                     std::int32_t last_page_tokens);
  // Keeps the nodes whose flag is 0, in order; the removed nodes' listed
  // slots become dead entries (packed away once they are half of them).
  void remove_nodes(const std::vector<std::uint8_t>& removed);
  // Moves the listed nodes' entries together, in node order, dropping the dead ones.
  void pack();
  // The node at `index` lengthened by `count` listed tokens (a range becomes a
  // list): where their slots go, to be written by the caller.
  std::vector<std::int64_t>::iterator appended_slots(std::size_t index, std::int64_t count);
  // Room for `more` entries after the listed node's own: in place, else the
  // entries move to the end of listed_slots_ with as many again to spare.
  void make_room(std::size_t index, std::int64_t more);
  // `count` entries at the end of the list's used part: where they start.
  std::int64_t claim_listed(std::int64_t count);

  std::vector<TreeNode> nodes_;
  std::vector<TreeQuery> queries_;
  // Entries [0, listed_end_) are in use; the rest is room, already written
  // so that growing into it touches no fresh memory.
  std::vector<std::int64_t> listed_slots_;
  std::int64_t listed_end_ = 0;
  std::vector<std::int64_t> reserved_;  // [nodes] entries of listed_slots_ from a listed node's first that are its
  std::int64_t dead_listed_ = 0;        // entries of listed_slots_ no node refers to any more
};

}  // namespace treeattn
