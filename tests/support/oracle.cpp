#include "support/oracle.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

namespace treeattn::test {

std::vector<std::int64_t> visible_slots(const Tree& tree, std::size_t q, std::int32_t window) {
  std::map<std::int64_t, std::size_t> index;
  for (std::size_t i = 0; i < tree.node_count(); ++i) index[tree.nodes()[i].id] = i;
  const TreeQuery& query = tree.queries()[q];
  std::vector<std::size_t> path;
  for (std::int64_t id = query.node; id != kNoParent; id = tree.nodes()[index.at(id)].parent) {
    path.push_back(index.at(id));
  }
  std::reverse(path.begin(), path.end());
  std::vector<std::int64_t> slots;
  for (std::size_t i : path) {
    std::int64_t count = tree.nodes()[i].length;
    if (i == path.back() && query.upto != kWholeNode) count = query.upto;
    for (std::int64_t t = 0; t < count; ++t) slots.push_back(tree.slot(i, t));
  }
  if (window > 0 && slots.size() > std::size_t(window)) slots.erase(slots.begin(), slots.end() - window);
  return slots;
}

OracleResult oracle_attention(const Tree& tree, const TensorRef& q, const TensorRef& k, const TensorRef& v,
                              std::int32_t window) {
  const HeadConfig& h = tree.heads;
  const std::size_t hq = std::size_t(h.heads_q), hkv = std::size_t(h.heads_kv), d = std::size_t(h.head_dim);
  const double scale = h.scale != 0.0f ? double(h.scale) : 1.0 / std::sqrt(double(h.head_dim));
  const std::size_t nq = tree.query_count();
  OracleResult r;
  r.o.assign(nq * hq * d, 0.0);
  r.lse.assign(nq * hq, 0.0);
  for (std::size_t qi = 0; qi < nq; ++qi) {
    const std::vector<std::int64_t> slots = visible_slots(tree, qi, window);
    for (std::size_t head = 0; head < hq; ++head) {
      const std::size_t kv_head = head / (hq / hkv);
      std::vector<double> scores(slots.size());
      double max_score = -std::numeric_limits<double>::infinity();
      for (std::size_t t = 0; t < slots.size(); ++t) {
        double dot = 0.0;
        for (std::size_t c = 0; c < d; ++c) {
          dot += double(load_as_float(q.data, q.dtype, (qi * hq + head) * d + c)) *
                 double(load_as_float(k.data, k.dtype, (std::size_t(slots[t]) * hkv + kv_head) * d + c));
        }
        scores[t] = scale * dot;
        max_score = std::max(max_score, scores[t]);
      }
      double sum = 0.0;
      for (std::size_t t = 0; t < slots.size(); ++t) {
        const double p = std::exp(scores[t] - max_score);
        sum += p;
        for (std::size_t c = 0; c < d; ++c) {
          r.o[(qi * hq + head) * d + c] +=
              p * double(load_as_float(v.data, v.dtype, (std::size_t(slots[t]) * hkv + kv_head) * d + c));
        }
      }
      for (std::size_t c = 0; c < d; ++c) r.o[(qi * hq + head) * d + c] /= sum;
      r.lse[qi * hq + head] = max_score + std::log(sum);
    }
  }
  return r;
}

double max_abs_error(const TensorRef& got, const std::vector<double>& expected) {
  double worst = 0.0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const double diff = std::fabs(double(load_as_float(got.data, got.dtype, i)) - expected[i]);
    worst = std::isnan(diff) ? std::numeric_limits<double>::infinity() : std::max(worst, diff);
  }
  return worst;
}

}  // namespace treeattn::test
