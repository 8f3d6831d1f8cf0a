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

namespace {
double per_head_or(const TensorRef& per_head, float per_tensor, std::size_t head) {
  return per_head.data ? double(static_cast<const float*>(per_head.data)[head]) : double(per_tensor);
}
}  // namespace

OracleResult oracle_attention(const Tree& tree, const TensorRef& q, const TensorRef& k, const TensorRef& v,
                              const AttentionOptions& options, std::int32_t window) {
  const HeadConfig& h = tree.heads;
  const std::size_t hq = std::size_t(h.heads_q), hkv = std::size_t(h.heads_kv), d = std::size_t(h.head_dim);
  const std::size_t dv = std::size_t(h.head_dim_v != 0 ? h.head_dim_v : h.head_dim);
  const double scale = h.scale != 0.0f ? double(h.scale) : 1.0 / std::sqrt(double(h.head_dim));
  const double cap = options.logit_softcap;
  const std::size_t nq = tree.query_count();
  OracleResult r;
  r.o.assign(nq * hq * dv, 0.0);
  r.lse.assign(nq * hq, 0.0);
  for (std::size_t qi = 0; qi < nq; ++qi) {
    const std::vector<std::int64_t> slots = visible_slots(tree, qi, window);
    for (std::size_t head = 0; head < hq; ++head) {
      const std::size_t kv_head = head / (hq / hkv);
      const double k_scale = per_head_or(options.k_scales, options.k_scale, kv_head);
      const double v_scale = per_head_or(options.v_scales, options.v_scale, kv_head);
      std::vector<double> scores(slots.size());
      double max_score = -std::numeric_limits<double>::infinity();
      for (std::size_t t = 0; t < slots.size(); ++t) {
        double dot = 0.0;
        for (std::size_t c = 0; c < d; ++c) {
          dot += double(load_as_float(q.data, q.dtype, (qi * hq + head) * d + c)) *
                 double(load_as_float(k.data, k.dtype, (std::size_t(slots[t]) * hkv + kv_head) * d + c)) * k_scale;
        }
        scores[t] = scale * dot;
        if (cap != 0.0) scores[t] = cap * std::tanh(scores[t] / cap);
        max_score = std::max(max_score, scores[t]);
      }
      const bool sink = options.sinks.data != nullptr;
      const double sink_logit = sink ? double(static_cast<const float*>(options.sinks.data)[head]) : 0.0;
      if (sink) max_score = std::max(max_score, sink_logit);
      double sum = sink ? std::exp(sink_logit - max_score) : 0.0;
      for (std::size_t t = 0; t < slots.size(); ++t) {
        const double p = std::exp(scores[t] - max_score);
        sum += p;
        for (std::size_t c = 0; c < dv; ++c) {
          r.o[(qi * hq + head) * dv + c] +=
              p * double(load_as_float(v.data, v.dtype, (std::size_t(slots[t]) * hkv + kv_head) * dv + c)) * v_scale;
        }
      }
      for (std::size_t c = 0; c < dv; ++c) r.o[(qi * hq + head) * dv + c] /= sum;
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
