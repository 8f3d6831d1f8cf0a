#include "treeattn/workloads.hpp"

#include <algorithm>
#include <numeric>
#include <thread>

#include "fail.hpp"

namespace treeattn {

std::uint64_t Rng::next() noexcept {  // splitmix64
  std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::int64_t Rng::uniform(std::int64_t lo, std::int64_t hi) noexcept {
  const std::uint64_t span = std::uint64_t(hi - lo) + 1;
  return lo + std::int64_t(span == 0 ? next() : next() % span);
}

double Rng::unit() noexcept { return double(next() >> 11) * 0x1.0p-53; }

Tree random_forest(const RandomForestOptions& o) {
  if (o.nodes < 1 || o.roots < 1 || o.roots > o.nodes || o.queries < 0 || o.min_tokens < 0 ||
      o.max_tokens < o.min_tokens) {
    fail(ErrorCategory::InvalidArgument,
         "random forest: need 1 <= roots ({}) <= nodes ({}), queries ({}) >= 0, 0 <= min_tokens ({}) <= max_tokens ({})",
         o.roots, o.nodes, o.queries, o.min_tokens, o.max_tokens);
  }
  Rng rng(o.seed);
  const std::size_t n = std::size_t(o.nodes);
  std::vector<std::int64_t> parent(n, -1), length(n);
  std::vector<char> has_child(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    length[i] = rng.uniform(o.min_tokens, o.max_tokens);
    if (i < std::size_t(o.roots)) continue;
    parent[i] = rng.chance(o.chain_bias) ? std::int64_t(i) - 1 : rng.uniform(0, std::int64_t(i) - 1);
    has_child[std::size_t(parent[i])] = 1;
  }
  // Distinct slots for every token, handed out in a shuffled order of nodes.
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  for (std::size_t i = n; i > 1; --i) std::swap(order[i - 1], order[std::size_t(rng.uniform(0, std::int64_t(i) - 1))]);
  std::vector<std::int64_t> first(n);
  std::int64_t next_slot = 0;
  for (std::size_t i : order) {
    first[i] = next_slot;
    next_slot += length[i];
  }
  auto id_of = [&](std::int64_t index) {
    return o.sparse_ids ? index * 7919 + 1000003 : index;
  };

  Tree tree(o.heads);
  tree.reserve(n, std::size_t(o.queries));
  std::vector<std::int64_t> slots;
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t p = parent[i] < 0 ? kNoParent : id_of(parent[i]);
    if (rng.chance(o.listed_fraction)) {
      slots.resize(std::size_t(length[i]));
      std::iota(slots.begin(), slots.end(), first[i]);
      // Listed slots need not be contiguous: reverse some to prove it.
      if (rng.chance(0.5)) std::reverse(slots.begin(), slots.end());
      tree.add_node(id_of(std::int64_t(i)), p, slots);
    } else {
      tree.add_node_range(id_of(std::int64_t(i)), p, first[i], length[i]);
    }
  }

  // Tokens above each node, to keep every query's view non-empty.
  std::vector<std::int64_t> above(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    if (parent[i] >= 0) above[i] = above[std::size_t(parent[i])] + length[std::size_t(parent[i])];
  }
  std::vector<std::int64_t> leaves;
  for (std::size_t i = 0; i < n; ++i) {
    if (!has_child[i]) leaves.push_back(std::int64_t(i));
  }
  for (std::int32_t q = 0; q < o.queries;) {
    const std::int64_t v = rng.chance(o.leaf_queries) ? leaves[std::size_t(rng.uniform(0, std::int64_t(leaves.size()) - 1))]
                                                      : rng.uniform(0, o.nodes - 1);
    const std::int64_t len = length[std::size_t(v)];
    if (len + above[std::size_t(v)] == 0) continue;  // nothing to see from here
    std::int64_t upto = kWholeNode;
    if (len > 0 && rng.chance(o.upto_fraction)) upto = rng.uniform(above[std::size_t(v)] > 0 ? 0 : 1, len);
    tree.add_query(id_of(v), upto);
    ++q;
  }
  return tree;
}

Tree few_shot_tree(const HeadConfig& heads, std::int64_t prompt, std::int32_t branches, std::int64_t generated) {
  if (prompt < 0 || branches < 1 || generated < 0) {
    fail(ErrorCategory::InvalidArgument, "few-shot: need prompt ({}) >= 0, branches ({}) >= 1, generated ({}) >= 0",
         prompt, branches, generated);
  }
  Tree tree(heads);
  tree.add_node_range(0, kNoParent, 0, prompt);
  for (std::int32_t b = 0; b < branches; ++b) {
    tree.add_node_range(b + 1, 0, prompt + b * generated, generated);
    tree.add_query(b + 1);
  }
  return tree;
}

Tree level_tree(const HeadConfig& heads, const std::vector<std::int64_t>& nodes,
                const std::vector<std::int64_t>& context) {
  if (nodes.empty() || nodes.size() != context.size()) {
    fail(ErrorCategory::InvalidArgument, "level tree: {} node counts for {} context lengths", nodes.size(),
         context.size());
  }
  for (std::size_t k = 0; k < nodes.size(); ++k) {
    if (nodes[k] < 1 || context[k] < 0 || (k > 0 && nodes[k] % nodes[k - 1] != 0)) {
      fail(ErrorCategory::InvalidArgument,
           "level tree: level {} has {} nodes of {} tokens; each level needs a positive multiple of the one above", k,
           nodes[k], context[k]);
    }
  }
  Tree tree(heads);
  std::int64_t id = 0, slot = 0, level_first = 0;
  for (std::size_t k = 0; k < nodes.size(); ++k) {
    const std::int64_t fanout = k == 0 ? 0 : nodes[k] / nodes[k - 1];
    for (std::int64_t i = 0; i < nodes[k]; ++i) {
      const std::int64_t parent = k == 0 ? kNoParent : level_first - nodes[k - 1] + i / fanout;
      tree.add_node_range(id++, parent, slot, context[k]);
      slot += context[k];
    }
    level_first += nodes[k];
  }
  for (std::int64_t i = 0; i < nodes.back(); ++i) tree.add_query(level_first - nodes.back() + i);
  return tree;
}

const std::vector<ModelShape>& model_shapes() {
  static const std::vector<ModelShape> shapes = {
      {"llama3-8b", {32, 8, 128, 0.0f}, 32},
      {"llama2-7b", {32, 32, 128, 0.0f}, 32},
      {"codellama-34b", {64, 8, 128, 0.0f}, 48},
  };
  return shapes;
}

const ModelShape& find_model(const std::string& name) {
  for (const ModelShape& m : model_shapes()) {
    if (m.name == name) return m;
  }
  fail(ErrorCategory::InvalidArgument, "unknown model '{}' (choose llama3-8b, llama2-7b or codellama-34b)", name);
}

std::int64_t total_tokens(const Tree& tree) {
  std::int64_t total = 0;
  for (const TreeNode& node : tree.nodes()) total += node.length;
  return total;
}

HostArray random_array(DType dtype, std::vector<std::int64_t> shape, std::uint64_t seed, float amplitude) {
  HostArray array(dtype, std::move(shape));
  const std::size_t n = std::size_t(array.numel());
  auto fill = [&](std::size_t begin, std::size_t end) {
    Rng rng(seed);
    rng.skip(begin);
    for (std::size_t i = begin; i < end; ++i) {
      store_from_float(array.bytes.data(), dtype, i, float((2.0 * rng.unit() - 1.0) * amplitude));
    }
  };
  // A benchmark's KV pools reach hundreds of millions of elements (seconds on
  // one core); below a million, threads cost more than they save.
  constexpr std::size_t kPerThread = std::size_t(1) << 20;
  const std::size_t threads =
      std::clamp<std::size_t>(n / kPerThread, 1, std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> workers;
  for (std::size_t t = 1; t < threads; ++t) workers.emplace_back(fill, n * t / threads, n * (t + 1) / threads);
  fill(0, n / threads);
  for (std::thread& w : workers) w.join();
  return array;
}

}  // namespace treeattn
