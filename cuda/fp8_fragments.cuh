#pragma once
// fp8 K and V of a split-KV pass (PassTraits::kKvInRegisters) as mma.sync
// fragments read straight from the gathered bytes and widened in registers:
// no f16 tile, no widening barriers. Each warp takes 16 tokens of a tile, so
// the CTA converts every byte once, as the shared-memory widening does.
//
// Both give the f16 kernel's products in its order, so fp8 with unit scales
// stays bitwise the f16 run of the same values:
// * S = Q K^T: a B fragment's pairs (dims 2 t4, 2 t4 + 1 and 2 t4 + 8,
//   2 t4 + 9 of a 16-dim step) are adjacent bytes of a K row: two 16-bit
//   loads, one conversion each. (A permutation of Q's columns would make a
//   lane's bytes contiguous, but it regroups the dims of each MMA's sum, and
//   with it the rounding.)
// * O = P V: column g of n-tile n of O is dim kVSpan g + n (any column order
//   gives the same sums), so lane group g reads the kVSpan contiguous bytes of
//   its four tokens' V rows and pairs two tokens' bytes of a dim with one
//   byte permute. The epilogue puts O's columns back in order (o_dim).

#include <cstdint>

#include "fp8_widen.cuh"
#include "instructions.cuh"

namespace treeattn::cuda {

template <typename Traits>
struct Fp8Fragments {
  using Element = typename Traits::Element;
  using Fp8 = typename Traits::KvStore;
  static constexpr int D = Traits::kHeadDim;  // Q's and K's columns
  static_assert(Traits::kNTiles == 2 && Traits::kKSteps == 1, "a warp's 16 tokens of a tile");
  static constexpr int kVSpan = Traits::kHeadDimV / 8;  // bytes of a V row a lane reads: one per n-tile of O
  static_assert(Traits::kAccTiles == kVSpan, "O's columns are V's");
  // A lane's loads of V: 16, 8 or 4 bytes (head_dim_v 96: 12 bytes a lane),
  // never across a 16-byte chunk of the gathered row.
  static constexpr int kPieceBytes = kVSpan % 16 == 0 ? 16 : kVSpan % 8 == 0 ? 8 : 4;

  // Where column `col` (0..7) of n-tile n of O lies in the row: dim kVSpan col + n.
  __device__ __forceinline__ static int o_dim(int n, int col) { return kVSpan * col + n; }

  // S for the warp's tokens token0 .. token0 + 15 (n-tile n: token0 + 8 n + g).
  __device__ __forceinline__ static void scores(const std::uint32_t (&qf)[D / 16][4], const unsigned char* k_bytes, int token0,
                                                int g, int t4, float (&s)[2][4]) {
#pragma unroll
    for (int n = 0; n < 2; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const unsigned char* step = k_bytes + Traits::gather_offset(token0 + n * 8 + g, kk) + 2 * t4;
        const std::uint16_t lo = *reinterpret_cast<const std::uint16_t*>(step);
        const std::uint16_t hi = *reinterpret_cast<const std::uint16_t*>(step + 8);
        Mma<Element>::run(s[n], qf[kk], widen_fp8x2<Fp8, Element>(lo), widen_fp8x2<Fp8, Element>(hi));
      }
    }
  }

  // O += P V for the warp's tokens: P's k index 2 t4 + {0, 1, 8, 9} is token
  // token0 + 2 t4 + {0, 1, 8, 9} (the scores' columns).
  __device__ __forceinline__ static void accumulate_pv(const float (&s)[2][4], const unsigned char* v_bytes, int token0, int g,
                                                       int t4, float (&acc)[Traits::kAccTiles][4]) {
    // A half-row pass (PassTraits::kHalfRows) multiplies zeros into rows g + 8
    // and keeps none of their O: the MMA's outputs there die at once.
    constexpr bool kHalf = Traits::kHalfRows;
    const std::uint32_t pf[4] = {Mma<Element>::pack(s[0][0], s[0][1]), kHalf ? 0u : Mma<Element>::pack(s[0][2], s[0][3]),
                                 Mma<Element>::pack(s[1][0], s[1][1]), kHalf ? 0u : Mma<Element>::pack(s[1][2], s[1][3])};
    // A piece of each token's span at a time: its n-tiles' fragments, then the next piece.
    const int first_byte = g * kVSpan;
#pragma unroll
    for (int piece = 0; piece < kVSpan / kPieceBytes; ++piece) {
      std::uint32_t raw[4][kPieceBytes / 4];  // tokens 2 t4, 2 t4 + 1, 2 t4 + 8, 2 t4 + 9
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int row = token0 + 2 * t4 + (q & 1) + (q >> 1) * 8;
        const int byte = first_byte + piece * kPieceBytes;
        const unsigned char* at = v_bytes + Traits::gather_offset(row, byte / 16) + byte % 16;
        if constexpr (kPieceBytes == 16) {
          const uint4 v = *reinterpret_cast<const uint4*>(at);
          raw[q][0] = v.x, raw[q][1] = v.y, raw[q][2] = v.z, raw[q][3] = v.w;
        } else if constexpr (kPieceBytes == 8) {
          const uint2 v = *reinterpret_cast<const uint2*>(at);
          raw[q][0] = v.x, raw[q][1] = v.y;
        } else {
          raw[q][0] = *reinterpret_cast<const std::uint32_t*>(at);
        }
      }
#pragma unroll
      for (int b = 0; b < kPieceBytes; ++b) {
        // Byte b's dim of two tokens side by side: byte b % 4 of each word.
        const std::uint32_t select = b % 4 < 2 ? 0x5140u : 0x7362u;
        const std::uint32_t low = __byte_perm(raw[0][b / 4], raw[1][b / 4], select);
        const std::uint32_t high = __byte_perm(raw[2][b / 4], raw[3][b / 4], select);
        const int shift = (b % 2) * 16;
        float(&o)[4] = acc[piece * kPieceBytes + b];
        float d[4] = {o[0], o[1], kHalf ? 0.0f : o[2], kHalf ? 0.0f : o[3]};
        Mma<Element>::run(d, pf, widen_fp8x2<Fp8, Element>((low >> shift) & 0xffffu), widen_fp8x2<Fp8, Element>((high >> shift) & 0xffffu));
#pragma unroll
        for (int e = 0; e < (kHalf ? 2 : 4); ++e) o[e] = d[e];
      }
    }
  }
};

}  // namespace treeattn::cuda
