#pragma once
// Warpgroup MMA (wgmma, sm_90a) for stage 1's 64-row passes: the CTA's four
// warps are one warpgroup, A (Q or P) comes from registers in mma.sync's
// m16n8k16 A layout (warp w: rows 16w..16w+15), B (K or V) straight from
// shared memory through a matrix descriptor, and D has mma.sync's C layout, so
// the masks and the online softmax are shared with the mma.sync path. B is read
// once per warpgroup instead of once per warp (ldmatrix).
//
// Shared-memory operands use the 128-byte swizzle: panels of [rows][64
// elements] (AttnTraits::swizzle), 8-row groups 1024 bytes apart, every panel
// 1024-byte aligned. K is K-major (dims contiguous); V is MN-major for P V
// (its N, the dims, contiguous), the transposed-B form.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace treeattn::cuda {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TREEATTN_WGMMA 1

// A shared-memory matrix descriptor with the 128-byte swizzle: start address,
// leading and stride byte offsets (PTX ISA, "Matrix Descriptor Format").
__device__ __forceinline__ std::uint64_t wgmma_descriptor(std::uint32_t smem_address, int leading_bytes,
                                                          int stride_bytes) {
  return std::uint64_t((smem_address & 0x3FFFF) >> 4) | (std::uint64_t(leading_bytes >> 4) << 16) |
         (std::uint64_t(stride_bytes >> 4) << 32) | (std::uint64_t(1) << 62);
}

// Orders register writes before the next wgmma reads them.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits for every committed wgmma of this warp.
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Pins an accumulator after the wait: later reads cannot move above it.
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[n][e])::"memory");
  }
}
// Makes this thread's generic-proxy shared-memory writes (cp.async, stores)
// visible to wgmma, which reads through the async proxy.
__device__ __forceinline__ void fence_shared_for_wgmma() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

template <typename Element>
struct Wgmma;

#define TREEATTN_WGMMA_SHAPES(TYPE)                                                                                   \
  /* D[64 x 64] (+)= A[64 x 16] (registers) B[16 x 64] (shared memory, `desc`) */                                     \
  template <int kTransposeB>                                                                                          \
  __device__ __forceinline__ static void m64n64k16(float(&d)[8][4], const std::uint32_t(&a)[4], std::uint64_t desc,   \
                                                   bool accumulate) {                                                 \
    asm volatile(                                                                                                     \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                                  \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE                                                   \
        " {"                                                                                                          \
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                                                      \
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"                                             \
        "}, {%32,%33,%34,%35}, %36, p, 1, 1, %38;\n}\n"                                                               \
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),    \
          "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),    \
          "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),    \
          "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),    \
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])                                                  \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(int(accumulate)), "n"(kTransposeB));             \
  }                                                                                                                   \
  /* D[64 x 128] (+)= A[64 x 16] (registers) B[16 x 128] (shared memory, `desc`) */                                   \
  template <int kTransposeB>                                                                                          \
  __device__ __forceinline__ static void m64n128k16(float(&d)[16][4], const std::uint32_t(&a)[4], std::uint64_t desc, \
                                                    bool accumulate) {                                                \
    asm volatile(                                                                                                     \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                                  \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE                                                  \
        " {"                                                                                                          \
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                                                      \
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"                                            \
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"                                            \
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"                                             \
        "}, {%64,%65,%66,%67}, %68, p, 1, 1, %70;\n}\n"                                                               \
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),    \
          "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),    \
          "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),    \
          "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),    \
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]),    \
          "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),  \
          "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),             \
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]),             \
          "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),             \
          "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])                                              \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(int(accumulate)), "n"(kTransposeB));             \
  }

template <>
struct Wgmma<__half> {
  TREEATTN_WGMMA_SHAPES("f16")
};
template <>
struct Wgmma<__nv_bfloat16> {
  TREEATTN_WGMMA_SHAPES("bf16")
};
#undef TREEATTN_WGMMA_SHAPES

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace treeattn::cuda
