#pragma once
// The math of a stage-1 pass on the tensor cores: Q's fragments, S = Q K^T,
// the soft-cap and the visibility mask, the online softmax, and O += P V.

#include <cstdint>

#include "attn_pass_context.cuh"
#include "instructions.cuh"
#include "wgmma.cuh"

namespace treeattn::cuda {

// The warp's 16 rows of Q as A fragments for the whole head dimension: per
// 16-column step, element pairs (row g, then g + 8) at columns 2 t4 and 2 t4 + 8.
template <typename Traits>
__device__ __forceinline__ void load_q_fragments(const PassContext& c, const PassLane<Traits>& lane, const ThreadRows& rows,
                                                 std::uint32_t (&qf)[Traits::kHeadDim / 16][4]) {
  using Element = typename Traits::Element;
  constexpr int D = Traits::kHeadDim;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (h >= Traits::kRowHalves) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) qf[kk][h] = qf[kk][2 + h] = 0u;
      continue;
    }
    const int head = row_head(c, lane.row(c, h));
    const std::uint32_t* q_row = reinterpret_cast<const std::uint32_t*>(
        static_cast<const Element*>(c.p.q) + std::int64_t(max(rows.query[h], 0)) * c.p.q_row_stride + head * D);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      qf[kk][h] = rows.query[h] < 0 ? 0u : q_row[kk * 8 + lane.t4];
      qf[kk][2 + h] = rows.query[h] < 0 ? 0u : q_row[kk * 8 + 4 + lane.t4];
    }
  }
}

// Soft-capping: s = cap * tanh(s / cap) on base-2 logits (the same curve as
// on natural ones, with the cap in base 2), before the mask and the maximum.
template <typename Traits>
__device__ __forceinline__ void cap_scores(const KernelParams& p, const PassScales& scales, float (&s)[Traits::kNTiles][4]) {
  if constexpr (Traits::kOptions) {
    if (scales.cap_in == 0.0f) return;
#pragma unroll
    for (int n = 0; n < Traits::kNTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 2 * Traits::kRowHalves; ++e) s[n][e] = p.softcap_log2 * tanhf(s[n][e] * scales.cap_in);
    }
  }
}

// S = Q K^T for the warp's 16 rows and its n-tiles of 8 tokens. `kv_row` is
// the lane's ldmatrix row of K (and V): matrices (tokens 0-7, chunk c),
// (tokens 8-15, c), (0-7, c + 1), (8-15, c + 1) of the warp's 16-token steps.
// `in_flight` runs while wgmma computes S (after the MMAs on mma.sync).
template <typename Traits, typename InFlight>
__device__ __forceinline__ void compute_scores(const std::uint32_t (&qf)[Traits::kHeadDim / 16][4],
                                               const typename Traits::Element* ks, const typename Traits::LaneRow& kv_row,
                                               float (&s)[Traits::kNTiles][4], const InFlight& in_flight) {
  using Element = typename Traits::Element;
  constexpr int D = Traits::kHeadDim;
#pragma unroll
  for (int n = 0; n < Traits::kNTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#if defined(TREEATTN_WGMMA)
  if constexpr (!Traits::kSplitKV) {
    // The warpgroup's 64 rows x 64 tokens, 16 dims a step: K-major B, the
    // step's 32 bytes inside its panel's 128-byte rows.
    const std::uint32_t k_base = smem_address(ks);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const std::uint32_t start = k_base + (kk >> 2) * Traits::kPanelElements * 2 + (kk & 3) * 32;
      Wgmma<Element>::template m64n64k16<0>(s, qf[kk], wgmma_descriptor(start, 16, 1024), kk > 0);
    }
    wgmma_commit();
    in_flight();
    wgmma_wait_all();
    wgmma_fence_operands(s);
  } else
#endif
  {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int n = 0; n < Traits::kNTiles; n += 2) {
        std::uint32_t b[4];  // n-tile n: b[0], b[2]; n + 1: b[1], b[3]
        ldmatrix_x4(b, ks + n * 8 * Traits::kPanel + kv_row.pair(kk));
        Mma<Element>::run(s[n], qf[kk], b[0], b[2]);
        Mma<Element>::run(s[n + 1], qf[kk], b[1], b[3]);
      }
    }
    in_flight();
  }
}

// -inf for the scores of tokens a row does not see. The row's word of the
// tile's visibility, shifted to the thread's first token (`first_bit`), holds
// every token it tests at a constant bit: one LOP3 per score.
template <typename Traits>
__device__ __forceinline__ void mask_invisible(const TileMap& map, const int (&tile_query)[2], int first_bit,
                                               float (&s)[Traits::kNTiles][4]) {
#pragma unroll
  for (int h = 0; h < Traits::kRowHalves; ++h) {
    const std::uint64_t seen = map.visible[tile_query[h]] >> first_bit;
#pragma unroll
    for (int n = 0; n < Traits::kNTiles; ++n) {
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        if (((seen >> (n * 8 + b)) & 1) == 0) s[n][2 * h + b] = TREEATTN_NEG_INF;
      }
    }
  }
}

// The online softmax of the thread's two rows, in base 2:
// p = 2^(s * scale_log2 - max * scale_log2). row_max holds the maxima of the
// raw scores Q K^T (the softmax scale is positive, so it is applied inside the
// exponent's FFMA instead of to every score); row_sum the thread's share of
// the sums until softmax_finish. The pass keeps them as two arrays of its own:
// a struct of the four compiles to another register assignment.
//
// softmax_update takes a tile's masked scores: it rescales the rows' sums and
// O to the new maxima and turns the scores into P. kSkipUnchanged: a warp whose
// rows all keep their maxima leaves O as it is (the factors are exactly 1), a
// branch that saves the fp8 kernels head_dim / 2 multiplies a thread and tile.
// kRowHalves 1 (PassTraits::kHalfRows): only the rows g are live; the scores
// and O of rows g + 8 are left as they are.
template <bool kSkipUnchanged = false, int kRowHalves = 2, int kNTiles, int kAccTiles>
__device__ __forceinline__ void softmax_update(float (&row_max)[2], float (&row_sum)[2], float (&s)[kNTiles][4],
                                               float (&acc)[kAccTiles][4], float exp_scale) {
  // The row maxima as trees: S -> max -> exponents -> P V is the tile's
  // critical path, and a chain of 2 * kNTiles dependent FMNMX would be its
  // longest link.
  float tile_max[2];
#pragma unroll
  for (int h = 0; h < kRowHalves; ++h) tile_max[h] = tree_reduce<kNTiles>([&](int n) { return fmaxf(s[n][2 * h], s[n][2 * h + 1]); }, [](float a, float b) { return fmaxf(a, b); });
  float correction[2] = {1.0f, 1.0f}, neg_reference[2] = {0.0f, 0.0f};
#pragma unroll
  for (int h = 0; h < kRowHalves; ++h) {
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
    const float new_max = fmaxf(row_max[h], tile_max[h]);
    // A row that has seen nothing yet keeps -inf: shift by 0 instead (no NaN).
    neg_reference[h] = new_max == TREEATTN_NEG_INF ? 0.0f : -new_max * exp_scale;
    // Exactly 1 while the maximum holds: the FFMA would leave the product's
    // rounding error, and compounding it over a long block drifts the weights.
    correction[h] = new_max == row_max[h] ? 1.0f : exp2_ftz(fmaf(row_max[h], exp_scale, neg_reference[h]));
    row_max[h] = new_max;
    row_sum[h] *= correction[h];
  }
  if (!kSkipUnchanged || __any_sync(0xffffffffu, correction[0] != 1.0f || correction[1] != 1.0f)) {
#pragma unroll
    for (int n = 0; n < kAccTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 2 * kRowHalves; ++e) acc[n][e] *= correction[e / 2];
    }
  }
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
    for (int e = 0; e < 2 * kRowHalves; ++e) s[n][e] = exp2_ftz(fmaf(s[n][e], exp_scale, neg_reference[e / 2]));
  }
#pragma unroll
  for (int h = 0; h < kRowHalves; ++h) row_sum[h] += tree_reduce<kNTiles>([&](int n) { return s[n][2 * h] + s[n][2 * h + 1]; }, [](float a, float b) { return a + b; });
}

// After the last tile: the rows' sums over their quads, maxima in base-2 units.
template <int kRowHalves = 2>
__device__ __forceinline__ void softmax_finish(float (&row_max)[2], float (&row_sum)[2], float exp_scale) {
#pragma unroll
  for (int h = 0; h < kRowHalves; ++h) {
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 1);
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 2);
    row_max[h] *= exp_scale;  // -inf stays -inf
  }
}

// O += P V: P's accumulators become A fragments (16 tokens per k-step).
// `in_flight` runs while wgmma computes it (after the MMAs on mma.sync).
template <typename Traits, typename InFlight>
__device__ __forceinline__ void accumulate_pv(const float (&s)[Traits::kNTiles][4], const typename Traits::Element* vs,
                                              const typename Traits::LaneRow& kv_row, float (&acc)[Traits::kAccTiles][4],
                                              const InFlight& in_flight) {
  using Element = typename Traits::Element;
  constexpr int D = Traits::kHeadDimV;
  constexpr int kKSteps = Traits::kKSteps;
  std::uint32_t pf[kKSteps][4];
#pragma unroll
  for (int j = 0; j < kKSteps; ++j) {
    pf[j][0] = Mma<Element>::pack(s[2 * j][0], s[2 * j][1]);
    pf[j][1] = Mma<Element>::pack(s[2 * j][2], s[2 * j][3]);
    pf[j][2] = Mma<Element>::pack(s[2 * j + 1][0], s[2 * j + 1][1]);
    pf[j][3] = Mma<Element>::pack(s[2 * j + 1][2], s[2 * j + 1][3]);
  }
#if defined(TREEATTN_WGMMA)
  if constexpr (!Traits::kSplitKV) {
    // MN-major (transposed) B: a step's 16 tokens are two 8-row groups of
    // every panel; one instruction spans two panels (128 dims). Its columns
    // are the accumulator's: V's panels (kAccDim).
    constexpr int kAccDim = Traits::kAccDim;
    const std::uint32_t v_base = smem_address(vs);
    constexpr int kPanelBytes = Traits::kPanelElements * 2;
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < kKSteps; ++j) {
      const std::uint32_t start = v_base + j * 2048;
      if constexpr (kAccDim == 64) {
        Wgmma<Element>::template m64n64k16<1>(acc, pf[j], wgmma_descriptor(start, kPanelBytes, 1024), true);
      } else {
#pragma unroll
        for (int h = 0; h < kAccDim / 128; ++h) {
          auto& acc_half = *reinterpret_cast<float(*)[16][4]>(&acc[16 * h]);
          Wgmma<Element>::template m64n128k16<1>(acc_half, pf[j], wgmma_descriptor(start + 2 * h * kPanelBytes, kPanelBytes, 1024), true);
        }
      }
    }
    wgmma_commit();
    in_flight();
    wgmma_wait_all();
    wgmma_fence_operands(acc);
  } else
#endif
  {
#pragma unroll
    for (int j = 0; j < kKSteps; ++j) {
#pragma unroll
      for (int n = 0; n < D / 8; n += 2) {
        std::uint32_t b[4];
        ldmatrix_x4_trans(b, vs + j * 16 * Traits::kPanel + kv_row.pair(n / 2));
        Mma<Element>::run(acc[n], pf[j], b[0], b[1]);
        Mma<Element>::run(acc[n + 1], pf[j], b[2], b[3]);
      }
    }
    in_flight();
  }
}

}  // namespace treeattn::cuda
