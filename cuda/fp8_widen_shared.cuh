#pragma once
// fp8 K and V of a 64-row pass widened in shared memory (PassTraits::kWidenInShared):
// the gathered bytes into the f16 or bf16 tile the math reads.

#include "fp8_widen.cuh"
#include "wgmma.cuh"

namespace treeattn::cuda {

// fp8 K or V: gather stage `stage`'s bytes of one of them (rows of kRowPieces
// 16-byte pieces: K's or V's kGatherChunksPerRow) widened into the tile the
// math reads (kTileStages: one), each thread 16 bytes at a time. Where a
// row's pieces divide the threads into columns of at least 8, a thread takes
// one piece of rows kColumnThreads apart, which share both swizzles' low row
// bits: its addresses are one base and constant offsets. Else (6 and 12
// pieces: head_dim 96 and 192) step j's thread i takes item i + j threads,
// row-major by piece. Consecutive threads take one piece of consecutive rows:
// both swizzles put those in distinct banks. The caller's barrier (widened)
// publishes the tile.
template <typename Traits, int kRowPieces>
__device__ __forceinline__ void widen(const unsigned char* gathered, typename Traits::Element* tile, int stage, int tid) {
  constexpr int kTokens = Traits::kTileTokens, kThreads = Traits::kThreads;
  constexpr bool kColumns = kThreads % kRowPieces == 0 && (kThreads / kRowPieces) % 8 == 0;
  constexpr int kColumnThreads = kColumns ? kThreads / kRowPieces : kTokens;
  constexpr int kSteps = kTokens * kRowPieces / kThreads;
  static_assert(kSteps * kThreads == kTokens * kRowPieces, "whole steps of the CTA's threads");
  static_assert(Traits::kKGatherBytes == Traits::kVGatherBytes, "K's and V's fp8 stages have one layout");
  const unsigned char* from = gathered + stage * Traits::kKGatherBytes;
  const int piece = tid / kColumnThreads, row0 = tid % kColumnThreads;
  const int from0 = Traits::gather_offset(row0, piece);
  const int lo0 = Traits::swizzle(row0, 2 * piece), hi0 = Traits::swizzle(row0, 2 * piece + 1);
  // Two pieces in flight: V is widened beside S's live accumulators.
#pragma unroll 2
  for (int j = 0; j < kSteps; ++j) {
    int at, lo, hi;
    if constexpr (kColumns) {
      at = kColumnThreads % Traits::kGatherSwizzleRows == 0 ? from0 + j * kColumnThreads * Traits::kGatherRowBytes
                                                            : Traits::gather_offset(row0 + j * kColumnThreads, piece);
      lo = lo0 + j * kColumnThreads * Traits::kPanel;
      hi = hi0 + j * kColumnThreads * Traits::kPanel;
    } else {
      const int i = tid + j * kThreads, row = i % kTokens, piece_j = i / kTokens;
      at = Traits::gather_offset(row, piece_j);
      lo = Traits::swizzle(row, 2 * piece_j);
      hi = Traits::swizzle(row, 2 * piece_j + 1);
    }
    uint4 wide_lo, wide_hi;
    widen_fp8x16<typename Traits::KvStore, typename Traits::Element>(*reinterpret_cast<const uint4*>(from + at), wide_lo, wide_hi);
    *reinterpret_cast<uint4*>(tile + lo) = wide_lo;
    *reinterpret_cast<uint4*>(tile + hi) = wide_hi;
  }
}
// The widened tile for every thread of the CTA (and wgmma's async proxy).
template <typename Traits>
__device__ __forceinline__ void widened() {
#if defined(TREEATTN_WGMMA)
  if constexpr (!Traits::kSplitKV) fence_shared_for_wgmma();
#endif
  __syncthreads();
}

}  // namespace treeattn::cuda
