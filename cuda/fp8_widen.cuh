#pragma once
// fp8 K and V (DESIGN.md §8) widened to the tensor cores' f16 or bf16. Exact:
// every e4m3 and e5m2 value is an f16 value and a bf16 value, so the scales
// are applied where the kernel folds them (the softmax scale, the output).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

namespace treeattn::cuda {

template <typename Fp8>
struct Fp8Kind;
template <>
struct Fp8Kind<__nv_fp8_e4m3> {
  static constexpr __nv_fp8_interpretation_t kind = __NV_E4M3;
};
template <>
struct Fp8Kind<__nv_fp8_e5m2> {
  static constexpr __nv_fp8_interpretation_t kind = __NV_E5M2;
};

// Two fp8 values (the low byte first) as an Element pair, the low one first.
// e5m2 is f16's top byte: a byte permute places it.
template <typename Fp8, typename Element>
__device__ __forceinline__ std::uint32_t widen_fp8x2(std::uint32_t two) {
  if constexpr (std::is_same_v<Fp8, __nv_fp8_e5m2> && std::is_same_v<Element, __half>) return __byte_perm(two, 0u, 0x1404);
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two), Fp8Kind<Fp8>::kind);
  if constexpr (std::is_same_v<Element, __half>) {
    return std::uint32_t(h.x) | std::uint32_t(h.y) << 16;
  } else {
    const __nv_bfloat162 b = __float22bfloat162_rn(__half22float2(__half2(h)));
    return *reinterpret_cast<const std::uint32_t*>(&b);
  }
}

// Sixteen fp8 values as two 16-byte pieces of eight Elements each.
template <typename Fp8, typename Element>
__device__ __forceinline__ void widen_fp8x16(const uint4& raw, uint4& lo, uint4& hi) {
  const std::uint32_t in[4] = {raw.x, raw.y, raw.z, raw.w};
  std::uint32_t out[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = widen_fp8x2<Fp8, Element>(in[i] & 0xffffu);
    out[2 * i + 1] = widen_fp8x2<Fp8, Element>(in[i] >> 16);
  }
  lo = make_uint4(out[0], out[1], out[2], out[3]);
  hi = make_uint4(out[4], out[5], out[6], out[7]);
}

}  // namespace treeattn::cuda
