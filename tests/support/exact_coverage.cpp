#include "support/exact_coverage.hpp"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include <fmt/format.h>

#include "support/oracle.hpp"
#include "treeattn/workloads.hpp"

namespace treeattn::test {
namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

int coverage_bit(std::int64_t slot, std::int32_t kv_head, std::int32_t column) {
  // A group is 64 columns: one hash gives each of them a bit.
  const std::uint64_t key = (std::uint64_t(slot) << 16 | std::uint64_t(kv_head) << 8) | std::uint64_t(column / 64);
  return int(splitmix64(key) >> (column % 64) & 1u);
}

CoverageCheck::CoverageCheck(const Tree& tree, DType inputs, std::int32_t window) : tree_(tree) {
  const HeadConfig& h = tree.heads;
  const std::int64_t nq = std::int64_t(tree.query_count()), slots = std::max<std::int64_t>(total_tokens(tree), 1);
  const std::size_t row = std::size_t(h.heads_kv) * std::size_t(h.head_dim);
  q_ = HostArray(inputs, {nq, h.heads_q, h.head_dim});  // zero bytes: 0 in every dtype
  kv_ = HostArray(inputs, {slots, h.heads_kv, h.head_dim});
  for (std::int64_t s = 0; s < slots; ++s) {
    for (std::int32_t kv = 0; kv < h.heads_kv; ++kv) {
      for (std::int32_t c = 0; c < h.head_dim; ++c) {
        store_from_float(kv_.bytes.data(), inputs, std::size_t(s) * row + std::size_t(kv * h.head_dim + c),
                         float(coverage_bit(s, kv, c)));
      }
    }
  }

  // Each node's whole V-bit sums, then each query's path: its ancestors whole,
  // its node whole or its first `upto` tokens.
  std::unordered_map<std::int64_t, std::size_t> index;
  for (std::size_t i = 0; i < tree.node_count(); ++i) index[tree.nodes()[i].id] = i;
  auto add_slot = [&](std::vector<double>& sums, std::int64_t slot) {
    for (std::size_t e = 0; e < row; ++e) {
      sums[e] += coverage_bit(slot, std::int32_t(e / std::size_t(h.head_dim)), std::int32_t(e % std::size_t(h.head_dim)));
    }
  };
  auto add_tokens = [&](std::vector<double>& sums, std::size_t node, std::int64_t count) {
    for (std::int64_t t = 0; t < count; ++t) add_slot(sums, tree.slot(node, t));
  };
  std::vector<std::vector<double>> node_sums(tree.node_count());
  auto whole = [&](std::size_t node) -> const std::vector<double>& {
    if (node_sums[node].empty()) {
      node_sums[node].assign(row, 0.0);
      add_tokens(node_sums[node], node, tree.nodes()[node].length);
    }
    return node_sums[node];
  };
  tokens_.assign(std::size_t(nq), 0);
  o_.assign(std::size_t(nq) * row, 0.0);
  for (std::size_t q = 0; q < std::size_t(nq); ++q) {
    const TreeQuery& query = tree.queries()[q];
    std::vector<double> sums(row, 0.0);
    if (window > 0) {  // the window's tokens one by one (the oracle's list): no whole node to share
      const std::vector<std::int64_t> slots = visible_slots(tree, q, window);
      for (std::int64_t slot : slots) add_slot(sums, slot);
      tokens_[q] = std::int64_t(slots.size());
      for (std::size_t e = 0; e < row; ++e) o_[q * row + e] = sums[e] / double(tokens_[q]);
      continue;
    }
    const std::size_t own = index.at(query.node);
    const std::int64_t own_count = query.upto == kWholeNode ? tree.nodes()[own].length : query.upto;
    add_tokens(sums, own, own_count);
    tokens_[q] = own_count;
    for (std::int64_t id = tree.nodes()[own].parent; id != kNoParent; id = tree.nodes()[index.at(id)].parent) {
      const std::size_t node = index.at(id);
      const std::vector<double>& node_sum = whole(node);
      for (std::size_t e = 0; e < row; ++e) sums[e] += node_sum[e];
      tokens_[q] += tree.nodes()[node].length;
    }
    for (std::size_t e = 0; e < row; ++e) o_[q * row + e] = sums[e] / double(tokens_[q]);
  }
}

std::string CoverageCheck::error(Backend& backend, const Plan& plan) {
  const HeadConfig& h = tree_.heads;
  const std::int64_t nq = std::int64_t(tree_.query_count());
  HostArray o(DType::f32, {nq, h.heads_q, h.head_dim}), lse(DType::f32, {nq, h.heads_q});
  backend.run(plan, AttentionArgs{q_.view(), kv_.view(), kv_.view(), o.view(), lse.view()});
  const std::int32_t group = h.heads_q / h.heads_kv;
  for (std::int64_t q = 0; q < nq; ++q) {
    const double want_lse = std::log(double(tokens_[std::size_t(q)]));
    for (std::int32_t head = 0; head < h.heads_q; ++head) {
      const double got_lse = load_as_float(lse.bytes.data(), DType::f32, std::size_t(q * h.heads_q + head));
      if (!(std::fabs(got_lse - want_lse) <= kCoverageLseTolerance)) {
        return fmt::format("query {} head {}: LSE {:.7f}, expected ln({}) = {:.7f} (off by {:.2e}, {:.2f} tokens)", q,
                           head, got_lse, tokens_[std::size_t(q)], want_lse, got_lse - want_lse,
                           std::exp(got_lse) - double(tokens_[std::size_t(q)]));
      }
      for (std::int32_t c = 0; c < h.head_dim; ++c) {
        const std::size_t at = std::size_t((q * h.heads_q + head) * h.head_dim + c);
        const double got = load_as_float(o.bytes.data(), DType::f32, at);
        const double want = o_[std::size_t((q * h.heads_kv + head / group) * h.head_dim + c)];
        if (!(std::fabs(got - want) <= kCoverageOTolerance)) {
          return fmt::format("query {} head {} column {}: O {:.7f}, expected {:.7f} (the mean of {} bits; off by {:.2e})",
                             q, head, c, got, want, tokens_[std::size_t(q)], got - want);
        }
      }
    }
  }
  return "";
}

}  // namespace treeattn::test
