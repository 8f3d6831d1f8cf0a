#pragma once
// The device instructions the kernels are written in: cp.async, ldmatrix,
// mma.sync m16n8k16, ex2, cache-hinted stores, and the output stores of each
// element type.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "attn_params.hpp"

namespace treeattn::cuda {

// -inf as a bit pattern (no constexpr -inf float in device code before C++20).
#define TREEATTN_NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ std::uint32_t smem_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1.
__device__ __forceinline__ void cp_async_16(std::uint32_t smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// 2^x in one MUFU.EX2: flushing subnormal results to zero drops only terms
// below 2^-126 of a row whose largest term is 1 (exp2f's subnormal handling
// costs three more instructions per score).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// leaf(0) op leaf(1) op ... leaf(N - 1) as a balanced tree (N a power of two):
// log2(N) dependent steps instead of N - 1.
template <int N, typename Leaf, typename Op>
__device__ __forceinline__ float tree_reduce(Leaf leaf, Op op) {
  static_assert(N > 0 && (N & (N - 1)) == 0, "a power of two");
  float v[N];
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = leaf(i);
#pragma unroll
  for (int width = N / 2; width > 0; width /= 2) {
#pragma unroll
    for (int i = 0; i < width; ++i) v[i] = op(v[i], v[i + width]);
  }
  return v[0];
}

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(smem)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(smem)));
}

template <typename Element>
struct Mma;

template <>
struct Mma<__half> {
  __device__ __forceinline__ static void run(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                             std::uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ __forceinline__ static std::uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<std::uint32_t*>(&h);
  }
};

template <>
struct Mma<__nv_bfloat16> {
  __device__ __forceinline__ static void run(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                             std::uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ __forceinline__ static std::uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<std::uint32_t*>(&h);
  }
};

// Output elements `index` and `index + 1` (index even): one 4- or 8-byte store
// (two scalar stores of 16-bit values would take a warp twice the store
// instructions, each half as wide).
__device__ __forceinline__ void store_out_pair(void* o, ElementType type, std::int64_t index, float v0, float v1) {
  switch (type) {
    case ElementType::f16: reinterpret_cast<__half2*>(static_cast<__half*>(o) + index)[0] = __floats2half2_rn(v0, v1); break;
    case ElementType::bf16:
      reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(o) + index)[0] = __floats2bfloat162_rn(v0, v1);
      break;
    case ElementType::f32: reinterpret_cast<float2*>(static_cast<float*>(o) + index)[0] = make_float2(v0, v1); break;
  }
}

// Output element `index` alone, for a lane whose elements are not pairs.
__device__ __forceinline__ void store_out_one(void* o, ElementType type, std::int64_t index, float v) {
  switch (type) {
    case ElementType::f16: static_cast<__half*>(o)[index] = __float2half_rn(v); break;
    case ElementType::bf16: static_cast<__nv_bfloat16*>(o)[index] = __float2bfloat16_rn(v); break;
    case ElementType::f32: static_cast<float*>(o)[index] = v; break;
  }
}

// A lane's kChannels adjacent output elements from `index`, element c being
// value(c): in pairs, or one at a time where a lane holds an odd number (three
// at head_dim_v 96, whose odd lanes start at odd elements).
template <int kChannels, typename Value>
__device__ __forceinline__ void store_out_channels(void* o, ElementType type, std::int64_t index, const Value& value) {
  if constexpr (kChannels % 2 == 0) {
#pragma unroll
    for (int c = 0; c < kChannels; c += 2) store_out_pair(o, type, index + c, value(c), value(c + 1));
  } else {
#pragma unroll
    for (int c = 0; c < kChannels; ++c) store_out_one(o, type, index + c, value(c));
  }
}

// Partials are written to be read once by the merge: kept in L2 ahead of the
// KV lines streaming past (evict_last), so the merge finds them there — as far
// as the L2 set-aside for such lines goes (about 10 MB on the H100; larger
// partial sets still reach HBM; docs/performance.md).
__device__ __forceinline__ std::uint64_t l2_keep_policy() {
  std::uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ void store_partial2(float* at, float a, float b, std::uint64_t policy) {
  asm volatile("st.global.L2::cache_hint.v2.f32 [%0], {%1, %2}, %3;\n" ::"l"(at), "f"(a), "f"(b), "l"(policy) : "memory");
}
__device__ __forceinline__ void store_partial4(float* at, float4 v, std::uint64_t policy) {
  asm volatile("st.global.L2::cache_hint.v4.f32 [%0], {%1, %2, %3, %4}, %5;\n" ::"l"(at), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "l"(policy) : "memory");
}

}  // namespace treeattn::cuda
