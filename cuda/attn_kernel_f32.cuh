#pragma once
// Stage 1 for f32 Q, K and V, on the CUDA cores. Tensor cores take f16, bf16
// or tf32 operands, each of which rounds f32 inputs to 10 mantissa bits or
// fewer; an f32 model (or a comparison with an f32 reference) gets full f32
// products here instead. The grid, passes, tile maps and partials are the
// tensor-core kernel's (attn_kernel.cuh), so the plan, its upload and the
// merge are shared. It is written to be exact, not fast: f16 and bf16 are the
// inputs the engine is tuned for.
//
// One CTA per (pass, KV head) of kF32Warps warps; warp w takes rows w,
// w + kF32Warps, ... of the pass. The CTA walks the item's tiles in steps of
// F32Layout::kStepTokens tokens: it gathers their K and V rows into shared
// memory, then each lane scores tokens lane, lane + 32, ... for each of its
// warp's rows (online softmax in base 2, as stage 1 and the merge use) and
// accumulates head_dim_v / 32 adjacent channels of each row's O. The call's
// soft-cap and sinks (fp8 K and V take f16 or bf16 Q: not here) are read at
// run time: this kernel is not the tuned path.

#include "attn_epilogue.cuh"
#include "attn_params.hpp"
#include "attn_pass_context.cuh"
#include "instructions.cuh"

namespace treeattn::cuda {

inline constexpr int kF32Warps = 8;
inline constexpr int kF32RowsPerWarp = kRowsPerPass / kF32Warps;

// HeadDim: Q's and K's columns; HeadDimV: V's and O's.
template <int HeadDim, int HeadDimV>
struct F32Layout {
  // Tokens gathered per step: a whole tile up to head_dim 128; half of one
  // above, so K, V and Q fit the A100's 164 KB of shared memory.
  static constexpr int kStepTokens = HeadDim <= 128 ? kTileTokens : kTileTokens / 2;
  static constexpr int kTokensPerLane = kStepTokens / 32;
  // K rows padded by one float: the 32 lanes of a warp read one element of 32
  // different rows at once, which then fall in 32 different banks.
  static constexpr int kKStride = HeadDim + 1;
  static constexpr int kQOffset = 0;                                    // [kRowsPerPass][HeadDim]
  static constexpr int kKOffset = kQOffset + kRowsPerPass * HeadDim;    // [kStepTokens][kKStride]
  static constexpr int kVOffset = kKOffset + kStepTokens * kKStride;    // [kStepTokens][HeadDimV]
  static constexpr int kBytes = (kVOffset + kStepTokens * HeadDimV) * 4;
};

template <int HeadDim, int HeadDimV>
__global__ void __launch_bounds__(kF32Warps * 32) tree_attn_partial_f32_kernel(const __grid_constant__ KernelParams p) {
  using Layout = F32Layout<HeadDim, HeadDimV>;
  constexpr int D = HeadDim;
  constexpr int DV = HeadDimV;
  constexpr int kChannels = DV / 32;  // adjacent channels of O per lane
  constexpr int kThreads = kF32Warps * 32;
  const int pass = int(blockIdx.x / unsigned(p.heads_kv));
  const int kv_head = int(blockIdx.x % unsigned(p.heads_kv));
  const PassInfo info = p.passes[pass];
  if (info.row_end <= info.row_begin) return;  // past the plan's passes (a graph-stable grid holds more)
  const int rows = info.row_end - info.row_begin;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  float* q_rows = reinterpret_cast<float*>(smem) + Layout::kQOffset;
  float* k_rows = reinterpret_cast<float*>(smem) + Layout::kKOffset;
  float* v_rows = reinterpret_cast<float*>(smem) + Layout::kVOffset;

  // Row r of the pass (r counted from the item's first row, as in
  // attn_pass_context.cuh) is the item's tile query r / group under query head
  // kv_head * group + r % group.
  auto entry_of = [&](int r) { return info.query_begin + (info.row_begin + r) / p.group; };
  auto head_of = [&](int r) { return kv_head * p.group + (info.row_begin + r) % p.group; };
  const float* q = static_cast<const float*>(p.q);
  for (int i = tid; i < rows * D; i += kThreads) {
    const int r = i / D, d = i % D;
    q_rows[i] = q[std::int64_t(p.tile_query[entry_of(r)]) * p.q_row_stride + head_of(r) * D + d];
  }

  float row_max[kF32RowsPerWarp], row_sum[kF32RowsPerWarp], acc[kF32RowsPerWarp][kChannels];
#pragma unroll
  for (int j = 0; j < kF32RowsPerWarp; ++j) {
    row_max[j] = TREEATTN_NEG_INF;
    row_sum[j] = 0.0f;
#pragma unroll
    for (int c = 0; c < kChannels; ++c) acc[j][c] = 0.0f;
  }

  const float* k_head = static_cast<const float*>(p.k) + std::int64_t(kv_head) * D;
  const float* v_head = static_cast<const float*>(p.v) + std::int64_t(kv_head) * DV;
  const int ntiles = info.tile_end - info.tile_begin;
  for (int t = 0; t < ntiles; ++t) {
    const TileMap& map = p.tile_map[info.tile_begin + t];
    for (int first = 0; first < kTileTokens; first += Layout::kStepTokens) {
      __syncthreads();  // the previous step's rows are read (and, the first time, Q is in)
      // K's and V's rows together, or V's after K's where they are narrower (and strided apart of their own).
      for (int i = tid; i < Layout::kStepTokens * D; i += kThreads) {
        const int token = i / D, d = i % D;
        const std::int64_t at = std::int64_t(map.slot[first + token]) * p.kv_row_stride + d;
        k_rows[token * Layout::kKStride + d] = k_head[at];
        if constexpr (DV == D) v_rows[token * D + d] = v_head[at];
      }
      if constexpr (DV != D) {
        for (int i = tid; i < Layout::kStepTokens * DV; i += kThreads) {
          const int token = i / DV, d = i % DV;
          v_rows[token * DV + d] = v_head[std::int64_t(map.slot[first + token]) * p.v_row_stride + d];
        }
      }
      __syncthreads();
#pragma unroll
      for (int j = 0; j < kF32RowsPerWarp; ++j) {
        const int r = warp + j * kF32Warps;
        if (r >= rows) continue;  // (not break: the loop stays unrolled, acc[j] in registers)
        const std::uint64_t seen = map.visible[(info.row_begin + r) / p.group] >> first;
        float s[Layout::kTokensPerLane];
        float step_max = TREEATTN_NEG_INF;
#pragma unroll
        for (int u = 0; u < Layout::kTokensPerLane; ++u) {
          const int token = lane + 32 * u;
          float dot = 0.0f;
#pragma unroll 16
          for (int d = 0; d < D; ++d) dot = fmaf(q_rows[r * D + d], k_rows[token * Layout::kKStride + d], dot);
          float logit = dot * p.scale_log2;
          if (p.softcap_log2 > 0.0f) logit = p.softcap_log2 * tanhf(logit / p.softcap_log2);
          s[u] = (seen >> token) & 1u ? logit : TREEATTN_NEG_INF;
          step_max = fmaxf(step_max, s[u]);
        }
#pragma unroll
        for (int o = 16; o > 0; o /= 2) step_max = fmaxf(step_max, __shfl_xor_sync(0xffffffffu, step_max, o));
        const float new_max = fmaxf(row_max[j], step_max);
        const float ref = new_max == TREEATTN_NEG_INF ? 0.0f : new_max;  // no token seen yet: every term is 0
        const float rescale = exp2f(row_max[j] - ref);
        float step_sum = 0.0f;
#pragma unroll
        for (int u = 0; u < Layout::kTokensPerLane; ++u) {
          s[u] = exp2f(s[u] - ref);
          step_sum += s[u];
        }
#pragma unroll
        for (int o = 16; o > 0; o /= 2) step_sum += __shfl_xor_sync(0xffffffffu, step_sum, o);
        row_sum[j] = row_sum[j] * rescale + step_sum;
        row_max[j] = new_max;
#pragma unroll
        for (int c = 0; c < kChannels; ++c) acc[j][c] *= rescale;
#pragma unroll
        for (int u = 0; u < Layout::kTokensPerLane; ++u) {
#pragma unroll 8
          for (int k = 0; k < 32; ++k) {
            const float weight = __shfl_sync(0xffffffffu, s[u], k);
            const float* v_row = v_rows + (32 * u + k) * DV + lane * kChannels;
#pragma unroll
            for (int c = 0; c < kChannels; ++c) acc[j][c] = fmaf(weight, v_row[c], acc[j][c]);
          }
        }
      }
    }
  }

  // The rows' partials (normalised, with their log-sum-exp), or O and LSE
  // directly where this item is the query's only one (then with its sink).
#pragma unroll
  for (int j = 0; j < kF32RowsPerWarp; ++j) {
    const int r = warp + j * kF32Warps;
    if (r >= rows) continue;
    const int entry = entry_of(r), head = head_of(r);
    const int partial = p.tile_partial[entry];
    const bool direct = partial == kDirectWrite;
    const std::int32_t index = (direct ? p.tile_query[entry] : partial) * p.heads_q + head;
    const RowEnd e = end_row<true>(p, direct, head, row_max[j], 0.0f, row_sum[j]);
    const float inv = e.rescale / e.denom;
    if (direct) {
      const std::int64_t out = std::int64_t(p.tile_query[entry]) * p.o_row_stride + head * DV + lane * kChannels;
      store_out_channels<kChannels>(p.o, p.out_type, out, [&](int c) { return acc[j][c] * inv; });
    } else {
      float* out = p.partial_o + std::int64_t(index) * DV + lane * kChannels;
#pragma unroll
      for (int c = 0; c < kChannels; ++c) out[c] = acc[j][c] * inv;
    }
    if (lane == 0) {
      const float lse = (e.max2 + log2f(e.denom)) * kLn2;
      if (!direct) p.partial_lse[index] = lse;
      else if (p.lse != nullptr) p.lse[index] = lse;
    }
  }
}

}  // namespace treeattn::cuda
