#pragma once
// The end of a stage-1 pass: each row's softmax finished (with its sink where
// written directly) and written into O and LSE or into its partial, by the
// thread's own rows (64-row pass) or after the warps' merge (split-KV pass).

#include <cstdint>

#include "attn_pass_context.cuh"
#include "fp8_fragments.cuh"
#include "instructions.cuh"

namespace treeattn::cuda {

// Where row `row` of the pass goes: the query's O and LSE when this item is its
// only one, else its partial slot (looked up once per row, not per element).
struct RowDest {
  std::int64_t out;    // the row's first element in O (strided rows) or in the partials
  std::int32_t index;  // (query or partial) * heads_q + head: its element of LSE or of the partial LSEs
  bool direct;
};
static_assert(sizeof(RowDest) == 16, "the split-KV path keeps 16 of them in shared memory (AttnTraits::kMergeBytes)");

template <typename Traits>
__device__ __forceinline__ RowDest make_dest(const KernelParams& p, std::int32_t target, int head, bool direct) {
  const std::int32_t index = target * p.heads_q + head;
  return RowDest{direct ? std::int64_t(target) * p.o_row_stride + head * Traits::kHeadDimV : std::int64_t(index) * Traits::kHeadDimV, index, direct};
}
template <typename Traits>
__device__ __forceinline__ RowDest row_dest(const PassContext& c, int row) {
  const int entry = c.q0 + (c.row0 + row) / c.p.group;
  const int partial = c.p.tile_partial[entry];
  const bool direct = partial == kDirectWrite;
  return make_dest<Traits>(c.p, direct ? c.p.tile_query[entry] : partial, row_head(c, c.row0 + row), direct);
}
__device__ __forceinline__ void write_lse(const KernelParams& p, const RowDest& d, float lse) {
  if (!d.direct) p.partial_lse[d.index] = lse;
  else if (p.lse != nullptr) p.lse[d.index] = lse;
}
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kLog2e = 1.4426950408889634f;

// A finished row's softmax, base 2: O = acc * rescale / denom, LSE = (max2 *
// max_scale + log2 denom) ln 2, from the row's maximum and its sum of
// 2^(logit - maximum). max_scale 0: max2 is a base-2 logit already. With
// options, a row written directly (the query's only item) takes its head's
// sink into the denominator and the LSE; a partial's sink joins in the merge.
//
// A 64-row pass's rows keep the raw maximum of their scores (max_scale: the
// softmax scale): the plain kernel scales it and adds the log, which ptxas
// fuses into one FMA, and the LSE of a call without sinks is then the plain
// kernel's bit for bit (a row with a sink uses the scaled maximum twice).
struct RowEnd {
  float rescale, max2, max_scale, denom;
  __device__ __forceinline__ float lse() const {
    return (max_scale == 0.0f ? max2 + __log2f(denom) : fmaf(max2, max_scale, __log2f(denom))) * kLn2;
  }
};
template <bool kOptions>
__device__ __forceinline__ RowEnd end_row(const KernelParams& p, bool direct, int head, float max2, float max_scale,
                                          float sum) {
  RowEnd e{1.0f, max2, max_scale, sum};
  if constexpr (kOptions) {
    if (direct && p.sinks != nullptr) {
      const float scaled = max_scale == 0.0f ? max2 : max2 * max_scale;
      const float sink2 = p.sinks[head] * kLog2e;
      e.max2 = fmaxf(scaled, sink2);
      e.max_scale = 0.0f;
      e.rescale = exp2f(scaled - e.max2);
      e.denom = sum * e.rescale + exp2f(sink2 - e.max2);
    }
  }
  return e;
}

// The epilogue of a 64-row pass: each of the thread's rows normalised into
// its partial (kept in L2 for the merge) or straight into O, and its LSE.
template <typename Traits>
__device__ __forceinline__ void write_thread_rows(const PassContext& c, const PassLane<Traits>& lane, const ThreadRows& rows,
                                                  const PassScales& scales, const float (&row_max)[2],
                                                  const float (&row_sum)[2], const float (&acc)[Traits::kAccTiles][4]) {
  constexpr int D = Traits::kHeadDimV;
  const KernelParams& p = c.p;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (lane.row(c, h) >= c.row_end) continue;
    const int head = row_head(c, lane.row(c, h));
    const bool direct = rows.target[h] < 0;
    const RowDest d = make_dest<Traits>(p, direct ? -2 - rows.target[h] : rows.target[h], head, direct);
    const RowEnd e = end_row<Traits::kOptions>(p, direct, head, row_max[h], Traits::kOptions ? scales.exp_scale : 0.0f, row_sum[h]);
    const float inv = e.rescale / e.denom * scales.out_scale;
    if (d.direct) {
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        store_out_pair(p.o, p.out_type, d.out + n * 8 + lane.t4 * 2, acc[n][2 * h] * inv, acc[n][2 * h + 1] * inv);
      }
    } else {
      float* out = p.partial_o + d.out;
      const std::uint64_t keep = l2_keep_policy();
#pragma unroll
      for (int n = 0; n < D / 8; ++n) store_partial2(out + n * 8 + lane.t4 * 2, acc[n][2 * h] * inv, acc[n][2 * h + 1] * inv, keep);
    }
    if (lane.t4 == 0) write_lse(p, d, e.lse());
  }
}

// The epilogue of a split-KV pass: the four warps' states for its (at most)
// 16 rows merged in shared memory (the tiles are free now) — each warp's
// unnormalised O, row maxima and row sums — then written as a 64-row pass
// writes them.
template <typename Traits>
__device__ __forceinline__ void merge_warps_and_write(const PassContext& c, const PassLane<Traits>& lane,
                                                      const PassScales& scales, const float (&row_max)[2], const float (&row_sum)[2],
                                                      const float (&acc)[Traits::kAccTiles][4]) {
  constexpr int D = Traits::kHeadDimV;
  constexpr int kAccStride = Traits::kMergeAccStride;
  const KernelParams& p = c.p;
  const int tid = lane.tid, warp = lane.warp, g = lane.g, t4 = lane.t4;
  float* red_acc = reinterpret_cast<float*>(smem);              // [4][16][kAccStride]
  float* red_max = red_acc + Traits::kWarps * 16 * kAccStride;  // [4][16]
  float* red_sum = red_max + Traits::kWarps * 16;               // [4][16], then each warp's row weight
  if constexpr (Traits::kKvInRegisters) {
    // O's columns in dim order (Fp8Fragments::o_dim): the thread's dims of
    // n-tiles n and n + 1 are adjacent, stored at the dim XOR 2 t4 so that a
    // half-warp's stores fall in distinct banks (undone when read below).
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
#pragma unroll
      for (int e = 0; e < 2 * Traits::kRowHalves; ++e) {
        const int dim = Fp8Fragments<Traits>::o_dim(n, 2 * t4 + e % 2) ^ (2 * t4);
        *reinterpret_cast<float2*>(red_acc + (warp * 16 + g + (e / 2) * 8) * kAccStride + dim) = make_float2(acc[n][e], acc[n + 1][e]);
      }
    }
  } else {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        *reinterpret_cast<float2*>(red_acc + (warp * 16 + g + h * 8) * kAccStride + n * 8 + t4 * 2) =
            make_float2(acc[n][2 * h], acc[n][2 * h + 1]);
      }
    }
  }
  if (t4 == 0) {
#pragma unroll
    for (int h = 0; h < Traits::kRowHalves; ++h) {
      red_max[warp * 16 + g + h * 8] = row_max[h];
      red_sum[warp * 16 + g + h * 8] = row_sum[h];
    }
  }
  RowDest* dests = reinterpret_cast<RowDest*>(red_sum + Traits::kWarps * 16);  // [16]
  const int rows_here = min(16, c.row_end - c.row0);
  const RowDest my_dest = tid < rows_here ? row_dest<Traits>(c, tid) : RowDest{0, 0, false};  // in flight over the barrier
  __syncthreads();
  // One thread per row: the row's log-sum-exp, its destination, and each
  // warp's weight exp2(max_w - max) / sum (in place of the warp's row sum).
  if (tid < rows_here) {
    float m = TREEATTN_NEG_INF;
#pragma unroll
    for (int w = 0; w < Traits::kWarps; ++w) m = fmaxf(m, red_max[w * 16 + tid]);
    const float ref = m == TREEATTN_NEG_INF ? 0.0f : m;
    float f[Traits::kWarps], sum = 0.0f;
#pragma unroll
    for (int w = 0; w < Traits::kWarps; ++w) {
      f[w] = exp2_ftz(red_max[w * 16 + tid] - ref);
      sum += red_sum[w * 16 + tid] * f[w];
    }
    const RowEnd e = end_row<Traits::kOptions>(p, my_dest.direct, row_head(c, c.row0 + tid), m, 0.0f, sum);
#pragma unroll
    for (int w = 0; w < Traits::kWarps; ++w) {
      red_sum[w * 16 + tid] = Traits::kOptions ? f[w] * e.rescale / e.denom * scales.out_scale : f[w] / sum;
    }
    dests[tid] = my_dest;
    write_lse(p, my_dest, e.lse());
  }
  __syncthreads();
  // Four adjacent channels per thread and step.
  const std::uint64_t keep = l2_keep_policy();
  for (int i = tid; i < rows_here * D / 4; i += Traits::kThreads) {
    const int row = i / (D / 4), col = i % (D / 4) * 4;
    // fp8 in registers: dims col .. col + 3 were stored XOR 2 t4, t4 = col / (D / 4).
    const int t4_of_col = Traits::kKvInRegisters ? col / (D / 4) : 0;
    const int at = Traits::kKvInRegisters ? col ^ ((t4_of_col & 2) << 1) : col;
    float4 value = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < Traits::kWarps; ++w) {
      const float f = red_sum[w * 16 + row];
      const float4 a = *reinterpret_cast<const float4*>(red_acc + (w * 16 + row) * kAccStride + at);
      value.x += a.x * f;
      value.y += a.y * f;
      value.z += a.z * f;
      value.w += a.w * f;
    }
    if (Traits::kKvInRegisters && (t4_of_col & 1) != 0) value = make_float4(value.z, value.w, value.x, value.y);
    const RowDest d = dests[row];
    if (d.direct) {
      store_out_pair(p.o, p.out_type, d.out + col, value.x, value.y);
      store_out_pair(p.o, p.out_type, d.out + col + 2, value.z, value.w);
    } else {
      store_partial4(p.partial_o + d.out + col, value, keep);
    }
  }
}

}  // namespace treeattn::cuda
