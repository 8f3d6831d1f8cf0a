#pragma once
// The stage-2 kernel: the partials of stage 1 (attn_kernel.cuh) into O and LSE.

#include <cstdint>

#include "attn_params.hpp"
#include "instructions.cuh"

namespace treeattn::cuda {

// Stage 2: the log-sum-exp merge of a query's partials, in the plan's order.
// One warp per (query, query head), kMergeWarps to a CTA, each lane owning
// head_dim_v / 32 adjacent channels (one 16-byte load per partial at head_dim_v
// 128; three 4-byte loads at 96). The warp reads 32 partials' LSEs at a time (the query's slots are
// merge_begin's range itself: KernelParams), one per lane,
// takes their maximum with shuffles, and then every lane folds the partials in
// CSR order with a running max, so the merge is one pass and deterministic; the
// loads of kBatch partials are in flight together (the merge is latency-bound).
// Plans whose queries merge at most kMergeLeanBatch partials take that batch:
// half the registers in flight, so ten CTAs fit on an SM instead of eight (at
// head_dim <= 128), and no query needs a second round trip. The full batch is
// capped for eight CTAs (64 registers).
constexpr int kMergeWarps = 4;
constexpr int kMergeBatch = 8;
template <int HeadDimV, int kBatch>
constexpr int merge_min_blocks() {
  if (HeadDimV > 128) return 1;
  return kBatch <= kMergeLeanBatch ? 10 : 8;
}

// kSinks: the call's sinks (KernelParams::sinks) join each query's
// denominator and LSE once, after its partials.
template <int HeadDimV, int kBatch, bool kSinks>
__global__ void __launch_bounds__(kMergeWarps * 32, merge_min_blocks<HeadDimV, kBatch>()) tree_attn_merge_kernel(const __grid_constant__ KernelParams p) {
  constexpr int kChannels = HeadDimV / 32;  // per lane: 2, 3, 4 or 8
  const int lane = threadIdx.x % 32;
  const std::int64_t pair = std::int64_t(blockIdx.x) * kMergeWarps + threadIdx.x / 32;
  if (pair >= std::int64_t(p.max_queries) * p.heads_q) return;
  const int query = int(pair / p.heads_q), head = int(pair % p.heads_q);
  const int m0 = p.merge_begin[query], m1 = p.merge_begin[query + 1];
  if (m0 == m1) return;  // written directly by stage 1, or past the plan's queries

  float max_lse = TREEATTN_NEG_INF, sum = 0.0f, acc[kChannels];
#pragma unroll
  for (int c = 0; c < kChannels; ++c) acc[c] = 0.0f;
  for (int c0 = m0; c0 < m1; c0 += 32) {
    const int n = min(32, m1 - c0);
    int my_slot = 0;
    float my_lse = TREEATTN_NEG_INF;
    if (lane < n) {
      my_slot = c0 + lane;
      my_lse = p.partial_lse[std::int64_t(my_slot) * p.heads_q + head];
    }
    // kBatch partials' loads go out before any of them is summed: one
    // dependent round trip per batch instead of one per partial. The first
    // batch leaves beside the LSEs, before their maximum is known.
    float v[kBatch][kChannels];
    auto load_batch = [&](int i0) {
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int slot = __shfl_sync(0xffffffffu, my_slot, (i0 + j) % 32);
        const float* src = p.partial_o + (std::int64_t(slot) * p.heads_q + head) * HeadDimV + lane * kChannels;
        if constexpr (kChannels % 2 == 0) {
#pragma unroll
          for (int c = 0; c < kChannels; c += 2) {
            const float2 two = i0 + j < n ? *reinterpret_cast<const float2*>(src + c) : make_float2(0.0f, 0.0f);
            v[j][c] = two.x;
            v[j][c + 1] = two.y;
          }
        } else {
#pragma unroll
          for (int c = 0; c < kChannels; ++c) v[j][c] = i0 + j < n ? src[c] : 0.0f;
        }
      }
    };
    load_batch(0);
    float chunk_max = my_lse;
#pragma unroll
    for (int o = 16; o > 0; o /= 2) chunk_max = fmaxf(chunk_max, __shfl_xor_sync(0xffffffffu, chunk_max, o));
    const float new_max = fmaxf(max_lse, chunk_max);
    const float rescale = __expf(max_lse - new_max);  // 0 on the first chunk
    sum *= rescale;
#pragma unroll
    for (int c = 0; c < kChannels; ++c) acc[c] *= rescale;
    max_lse = new_max;
    const float my_weight = __expf(my_lse - max_lse);
    for (int i0 = 0; i0 < n; i0 += kBatch) {
      if (i0 > 0) load_batch(i0);
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const float w = __shfl_sync(0xffffffffu, my_weight, (i0 + j) % 32);
        if (i0 + j >= n) break;
        sum += w;
#pragma unroll
        for (int c = 0; c < kChannels; ++c) acc[c] += w * v[j][c];
      }
    }
  }
  if constexpr (kSinks) {
    const float sink = p.sinks[head];
    const float m = fmaxf(max_lse, sink);
    const float rescale = __expf(max_lse - m);
    sum = sum * rescale + __expf(sink - m);
#pragma unroll
    for (int c = 0; c < kChannels; ++c) acc[c] *= rescale;
    max_lse = m;
  }
  const std::int64_t out = std::int64_t(query) * p.o_row_stride + head * HeadDimV + lane * kChannels;
  store_out_channels<kChannels>(p.o, p.out_type, out, [&](int c) { return acc[c] / sum; });
  if (p.lse != nullptr && lane == 0) p.lse[std::int64_t(query) * p.heads_q + head] = max_lse + __logf(sum);
}

}  // namespace treeattn::cuda
