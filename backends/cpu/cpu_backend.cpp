#include "cpu_backend.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

namespace treeattn::cpu {
namespace {

// A dot product with eight independent sums combined in a fixed order:
// deterministic, and fast enough without -ffast-math.
float dot(const float* a, const float* b, int n) {
  float s[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) s[l] += a[i + l] * b[i + l];
  }
  for (; i < n; ++i) s[0] += a[i] * b[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

void load_row(const TensorRef& t, std::size_t offset, int n, float* out) {
  for (int d = 0; d < n; ++d) out[d] = load_as_float(t.data, t.dtype, offset + std::size_t(d));
}

// A K or V row dequantized: fp8 values times their scale (1 for other dtypes, which check_args enforces).
void load_scaled_row(const TensorRef& t, std::size_t offset, int n, float scale, float* out) {
  load_row(t, offset, n, out);
  if (scale != 1.0f) {
    for (int d = 0; d < n; ++d) out[d] *= scale;
  }
}

// The scale of KV head `kv_head`'s rows: per head where given, else per tensor.
float kv_scale(const TensorRef& per_head, float per_tensor, std::int32_t kv_head) {
  return per_head.data ? static_cast<const float*>(per_head.data)[kv_head] : per_tensor;
}

// Folds a query head's sink logit into its finished softmax: the sink joins the
// denominator, so O scales by e^lse / (e^lse + e^sink) (returned) and the LSE
// becomes ln(e^lse + e^sink) (both shifted by their maximum).
float sink_share(float sink, float& lse) {
  const float m = std::max(lse, sink);
  const float kept = std::exp(lse - m), total = kept + std::exp(sink - m);
  lse = m + std::log(total);
  return kept / total;
}

// The multiplier of a finished query head's accumulated O (1 / its softmax
// sum, the sink's share folded in where there is one) and its final LSE.
float finish(const AttentionArgs& a, int head, float sum, float& lse) {
  if (a.options.sinks.data == nullptr) return 1.0f / sum;
  return sink_share(static_cast<const float*>(a.options.sinks.data)[head], lse) / sum;
}

}  // namespace

CpuBackend::CpuBackend(const BackendOptions& options) : pool_(options.threads), scratch_(std::size_t(pool_.size())) {}

double CpuBackend::peak_gbps() {
  if (peak_gbps_ > 0.0) return peak_gbps_;
  // Every worker sums its share of a 256 MiB buffer; the best of three passes.
  const std::size_t n = std::size_t(64) << 20;
  std::vector<float> data(n, 1.0f);
  std::vector<float> sums(std::size_t(pool_.size()));
  const std::size_t share = n / sums.size();
  double best_us = 1e30;
  for (int pass = 0; pass < 3; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    pool_.parallel_for(std::int64_t(sums.size()), [&](std::int64_t w, int) {
      float s[8] = {};
      for (std::size_t i = share * std::size_t(w); i + 8 <= share * std::size_t(w + 1); i += 8) {
        for (int l = 0; l < 8; ++l) s[l] += data[i + std::size_t(l)];
      }
      sums[std::size_t(w)] = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    });
    best_us = std::min(best_us, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  peak_gbps_ = double(n * sizeof(float)) / (best_us * 1e3);
  return peak_gbps_;
}

void CpuBackend::run(const Plan& plan, const AttentionArgs& args) {
  check_args(plan, args);
  check_host_scale_values(args.options);
  const int hq = plan.heads.heads_q, hkv = plan.heads.heads_kv, dv = plan.heads.value_dim();
  partial_o_.resize(std::size_t(plan.num_partials) * std::size_t(hq) * std::size_t(dv));
  partial_lse_.resize(std::size_t(plan.num_partials) * std::size_t(hq));

  pool_.parallel_for(std::int64_t(plan.num_items()) * hkv, [&](std::int64_t task, int worker) {
    const std::int32_t item = plan.launch_item(std::int32_t(task / hkv));
    run_item(plan, args, item, std::int32_t(task % hkv), scratch_[std::size_t(worker)]);
  });
  pool_.parallel_for(plan.num_queries, [&](std::int64_t q, int worker) {
    if (plan.merge_begin[std::size_t(q) + 1] > plan.merge_begin[std::size_t(q)]) {
      merge_query(plan, args, std::int32_t(q), scratch_[std::size_t(worker)]);
    }
  });
}

// Stage 1: one work item for one KV head. The block's K/V rows are gathered
// once and shared by every query of the tile and every query head of the group.
void CpuBackend::run_item(const Plan& plan, const AttentionArgs& a, std::int32_t item,
                          std::int32_t kv_head, Scratch& sc) {
  const int hq = plan.heads.heads_q, hkv = plan.heads.heads_kv, d = plan.heads.head_dim, dv = plan.heads.value_dim();
  const int group = hq / hkv;
  const float scale = plan.heads.scale, softcap = a.options.logit_softcap;
  const float k_scale = kv_scale(a.options.k_scales, a.options.k_scale, kv_head);
  const float v_scale = kv_scale(a.options.v_scales, a.options.v_scale, kv_head);
  const std::int32_t block = plan.item_block[std::size_t(item)];
  const std::int32_t seg0 = plan.block_segment_begin[std::size_t(block)];
  const std::int32_t segs = plan.block_segment_begin[std::size_t(block) + 1] - seg0;
  const std::uint64_t* masks = plan.segment_mask.data() + plan.item_mask_begin[std::size_t(item)];
  const std::int32_t q0 = plan.item_query_begin[std::size_t(item)];
  const std::int32_t tile = plan.item_query_begin[std::size_t(item) + 1] - q0;

  const std::size_t tokens = std::size_t(plan.block_token_count(block));
  sc.k.resize(tokens * std::size_t(d));
  sc.v.resize(tokens * std::size_t(dv));
  sc.scores.resize(tokens);
  sc.q.resize(std::size_t(d));
  sc.acc.resize(std::size_t(dv));

  std::size_t local = 0;
  for (std::int32_t s = 0; s < segs; ++s) {
    const std::int32_t b = plan.segment_token_begin[std::size_t(seg0 + s)];
    const std::int32_t e = plan.segment_token_end[std::size_t(seg0 + s)];
    if (masks[s] != 0) {
      for (std::int32_t t = b; t < e; ++t) {
        const std::size_t slot = std::size_t(plan.token_slot[std::size_t(t)]), row = local + std::size_t(t - b);
        load_scaled_row(a.k, slot * std::size_t(a.k.row_pitch()) + std::size_t(kv_head) * std::size_t(d), d, k_scale,
                        sc.k.data() + row * std::size_t(d));
        load_scaled_row(a.v, slot * std::size_t(a.v.row_pitch()) + std::size_t(kv_head) * std::size_t(dv), dv, v_scale,
                        sc.v.data() + row * std::size_t(dv));
      }
    }
    local += std::size_t(e - b);
  }

  for (std::int32_t j = 0; j < tile; ++j) {
    const std::int32_t query = plan.tile_query[std::size_t(q0 + j)];
    const std::int32_t partial = plan.tile_partial[std::size_t(q0 + j)];
    const std::uint64_t bit = std::uint64_t(1) << j;
    for (int r = 0; r < group; ++r) {
      const int head = kv_head * group + r;
      load_row(a.q, std::size_t(query) * std::size_t(a.q.row_pitch()) + std::size_t(head) * std::size_t(d), d, sc.q.data());

      float max_score = -std::numeric_limits<float>::infinity();
      local = 0;
      for (std::int32_t s = 0; s < segs; ++s) {
        const std::int32_t len = plan.segment_token_end[std::size_t(seg0 + s)] - plan.segment_token_begin[std::size_t(seg0 + s)];
        if (masks[s] & bit) {
          for (std::int32_t t = 0; t < len; ++t) {
            float score = scale * dot(sc.q.data(), sc.k.data() + (local + std::size_t(t)) * std::size_t(d), d);
            if (softcap != 0.0f) score = softcap * std::tanh(score / softcap);
            sc.scores[local + std::size_t(t)] = score;
            max_score = std::max(max_score, score);
          }
        }
        local += std::size_t(len);
      }

      std::fill(sc.acc.begin(), sc.acc.end(), 0.0f);
      float sum = 0.0f;
      local = 0;
      for (std::int32_t s = 0; s < segs; ++s) {
        const std::int32_t len = plan.segment_token_end[std::size_t(seg0 + s)] - plan.segment_token_begin[std::size_t(seg0 + s)];
        if (masks[s] & bit) {
          for (std::int32_t t = 0; t < len; ++t) {
            const float p = std::exp(sc.scores[local + std::size_t(t)] - max_score);
            sum += p;
            const float* v = sc.v.data() + (local + std::size_t(t)) * std::size_t(dv);
            for (int c = 0; c < dv; ++c) sc.acc[std::size_t(c)] += p * v[c];
          }
        }
        local += std::size_t(len);
      }

      float lse = max_score + std::log(sum);
      if (partial == kDirect) {  // the query's only contributor: its O is finished here
        const float inv = finish(a, head, sum, lse);
        const std::size_t out = std::size_t(query) * std::size_t(a.o.row_pitch()) + std::size_t(head) * std::size_t(dv);
        for (int c = 0; c < dv; ++c) store_from_float(a.o.data, a.o.dtype, out + std::size_t(c), sc.acc[std::size_t(c)] * inv);
        if (a.lse.data) static_cast<float*>(a.lse.data)[std::size_t(query) * std::size_t(hq) + std::size_t(head)] = lse;
      } else {
        const float inv = 1.0f / sum;
        float* out = partial_o_.data() + (std::size_t(partial) * std::size_t(hq) + std::size_t(head)) * std::size_t(dv);
        for (int c = 0; c < dv; ++c) out[c] = sc.acc[std::size_t(c)] * inv;
        partial_lse_[std::size_t(partial) * std::size_t(hq) + std::size_t(head)] = lse;
      }
    }
  }
}

// Stage 2: the log-sum-exp merge of a query's partials, in the plan's order
// (and its sinks, which no partial holds).
void CpuBackend::merge_query(const Plan& plan, const AttentionArgs& a, std::int32_t query,
                             Scratch& sc) {
  const int hq = plan.heads.heads_q, d = plan.heads.value_dim();
  const std::int32_t m0 = plan.merge_begin[std::size_t(query)], m1 = plan.merge_begin[std::size_t(query) + 1];
  std::vector<float>& acc = sc.acc;
  acc.resize(std::size_t(d));
  for (int head = 0; head < hq; ++head) {
    float max_lse = -std::numeric_limits<float>::infinity();
    for (std::int32_t m = m0; m < m1; ++m) {
      const std::size_t p = std::size_t(plan.merge_partial[std::size_t(m)]);
      max_lse = std::max(max_lse, partial_lse_[p * std::size_t(hq) + std::size_t(head)]);
    }
    std::fill(acc.begin(), acc.end(), 0.0f);
    float sum = 0.0f;
    for (std::int32_t m = m0; m < m1; ++m) {
      const std::size_t p = std::size_t(plan.merge_partial[std::size_t(m)]);
      const float w = std::exp(partial_lse_[p * std::size_t(hq) + std::size_t(head)] - max_lse);
      sum += w;
      const float* o = partial_o_.data() + (p * std::size_t(hq) + std::size_t(head)) * std::size_t(d);
      for (int c = 0; c < d; ++c) acc[std::size_t(c)] += w * o[c];
    }
    float lse = max_lse + std::log(sum);
    const float inv = finish(a, head, sum, lse);
    const std::size_t out = std::size_t(query) * std::size_t(a.o.row_pitch()) + std::size_t(head) * std::size_t(d);
    for (int c = 0; c < d; ++c) store_from_float(a.o.data, a.o.dtype, out + std::size_t(c), acc[std::size_t(c)] * inv);
    if (a.lse.data) static_cast<float*>(a.lse.data)[std::size_t(query) * std::size_t(hq) + std::size_t(head)] = lse;
  }
}

}  // namespace treeattn::cpu
