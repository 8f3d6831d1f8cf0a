// Instantiations of the tree-attention kernels (head_dim x element type x KV
// storage x options) and the one switch that turns run-time shapes and the
// call's attention variants into template arguments.

#include "attn_kernel.cuh"
#include "attn_kernel_f32.cuh"
#include "attn_launch.hpp"

#include <type_traits>

namespace treeattn::cuda {
namespace {

// Which stage-1 path the code the device loaded was compiled with (read back
// by stage1_occupancy): the host cannot tell sm_90a's cubin from sm_90's.
#if defined(TREEATTN_WGMMA)
__device__ int stage1_uses_wgmma = 1;
#else
__device__ int stage1_uses_wgmma = 0;
#endif

// Stage 1's kernel for Q's element type, the KV pool's and the options: the
// tensor cores' (attn_kernel.cuh) for f16 and bf16, the CUDA cores' for f32
// (attn_kernel_f32.cuh, which reads its options at run time).
template <int HeadDim, typename Element, typename KvStore, bool Options>
struct Stage1 {
  using Traits = AttnTraits<HeadDim, Element, KvStore, Options>;
  static constexpr int kHeadDim = HeadDim;
  static auto kernel() { return tree_attn_partial_kernel<Traits>; }
  static constexpr int kThreads = Traits::kThreads;
  static constexpr int kSmemBytes = Traits::kSmemBytes;
};
template <int HeadDim>
struct Stage1<HeadDim, float, float, false> {
  static constexpr int kHeadDim = HeadDim;
  static auto kernel() { return tree_attn_partial_f32_kernel<HeadDim>; }
  static constexpr int kThreads = kF32Warps * 32;
  static constexpr int kSmemBytes = F32Layout<HeadDim>::kBytes;
};

// Every stage-1 kernel of one element type and head_dim: plain, with options,
// and (tensor cores) over fp8 K and V.
template <typename Element, int HeadDim, typename F>
cudaError_t for_each_stage1(const F& f) {
  if constexpr (std::is_same_v<Element, float>) {
    return f(Stage1<HeadDim, float, float, false>{});
  } else {
    for (cudaError_t err : {f(Stage1<HeadDim, Element, Element, false>{}), f(Stage1<HeadDim, Element, Element, true>{}),
                            f(Stage1<HeadDim, Element, __nv_fp8_e4m3, true>{}),
                            f(Stage1<HeadDim, Element, __nv_fp8_e5m2, true>{})}) {
      if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
  }
}

template <int HeadDim, int kBatch>
void launch_merge(const KernelParams& p, unsigned ctas, cudaStream_t stream) {
  if (p.sinks != nullptr) tree_attn_merge_kernel<HeadDim, kBatch, true><<<ctas, kMergeWarps * 32, 0, stream>>>(p);
  else tree_attn_merge_kernel<HeadDim, kBatch, false><<<ctas, kMergeWarps * 32, 0, stream>>>(p);
}

template <typename Stage1>
cudaError_t launch(const KernelParams& p, const LaunchGeometry& g, cudaStream_t stream) {
  constexpr int kHeadDim = Stage1::kHeadDim;
  cudaError_t err = cudaSuccess;
  if (g.passes > 0) {
    Stage1::kernel()<<<unsigned(g.passes) * unsigned(p.heads_kv), Stage1::kThreads, Stage1::kSmemBytes, stream>>>(p);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  if (g.queries > 0) {
    const std::int64_t pairs = std::int64_t(g.queries) * p.heads_q;
    const unsigned ctas = unsigned((pairs + kMergeWarps - 1) / kMergeWarps);
    if (g.lean_merge) launch_merge<kHeadDim, kMergeLeanBatch>(p, ctas, stream);
    else launch_merge<kHeadDim, kMergeBatch>(p, ctas, stream);
    err = cudaGetLastError();
  }
  return err;
}

// The options kernels run a call that uses a variant; the plain kernel the
// others, so its code and speed are those of plain attention.
bool uses_options(const KernelParams& p) { return p.softcap_log2 > 0.0f || p.sinks != nullptr; }

template <typename Element, int HeadDim>
cudaError_t launch_for_kv(const KernelParams& p, const LaunchGeometry& g, ElementType kv, cudaStream_t stream) {
  if constexpr (std::is_same_v<Element, float>) {
    return launch<Stage1<HeadDim, float, float, false>>(p, g, stream);
  } else {
    switch (kv) {
      case ElementType::fp8_e4m3: return launch<Stage1<HeadDim, Element, __nv_fp8_e4m3, true>>(p, g, stream);
      case ElementType::fp8_e5m2: return launch<Stage1<HeadDim, Element, __nv_fp8_e5m2, true>>(p, g, stream);
      default: break;
    }
    if (uses_options(p)) return launch<Stage1<HeadDim, Element, Element, true>>(p, g, stream);
    return launch<Stage1<HeadDim, Element, Element, false>>(p, g, stream);
  }
}

template <typename Element>
cudaError_t launch_for_dim(const KernelParams& p, const LaunchGeometry& g, int head_dim, ElementType kv,
                           cudaStream_t stream) {
  switch (head_dim) {
    case 64: return launch_for_kv<Element, 64>(p, g, kv, stream);
    case 128: return launch_for_kv<Element, 128>(p, g, kv, stream);
    case 256: return launch_for_kv<Element, 256>(p, g, kv, stream);
  }
  return cudaErrorInvalidValue;
}

template <typename Element>
cudaError_t set_shared_memory() {
  const auto set = [](auto stage1) {
    using S = decltype(stage1);
    return cudaFuncSetAttribute(S::kernel(), cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes);
  };
  for (cudaError_t err :
       {for_each_stage1<Element, 64>(set), for_each_stage1<Element, 128>(set), for_each_stage1<Element, 256>(set)}) {
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

template <int HeadDim>
Stage1Occupancy occupancy() {
  using Traits = AttnTraits<HeadDim, __half>;
  auto kernel = tree_attn_partial_kernel<Traits>;
  Stage1Occupancy o;
  cudaFuncAttributes attributes{};
  int wgmma = 0;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o.ctas_per_sm, kernel, Traits::kThreads, Traits::kSmemBytes) !=
          cudaSuccess ||
      cudaFuncGetAttributes(&attributes, kernel) != cudaSuccess ||
      cudaMemcpyFromSymbol(&wgmma, stage1_uses_wgmma, sizeof(wgmma)) != cudaSuccess) {
    cudaGetLastError();
    return Stage1Occupancy{};
  }
  o.binary_arch = attributes.binaryVersion;
  o.ptx_arch = attributes.ptxVersion;
  o.wgmma = wgmma != 0;
  o.registers = attributes.numRegs;
  o.spill_bytes = int(attributes.localSizeBytes);
  o.shared_bytes = Traits::kSmemBytes;
  return o;
}

}  // namespace

Stage1Occupancy stage1_occupancy(int head_dim) {
  switch (head_dim) {
    case 64: return occupancy<64>();
    case 128: return occupancy<128>();
    case 256: return occupancy<256>();
  }
  return Stage1Occupancy{};
}

cudaError_t launch_tree_attention(const KernelParams& params, const LaunchGeometry& geometry, int head_dim,
                                  ElementType q, ElementType kv, cudaStream_t stream) {
  switch (q) {
    case ElementType::f16: return launch_for_dim<__half>(params, geometry, head_dim, kv, stream);
    case ElementType::bf16: return launch_for_dim<__nv_bfloat16>(params, geometry, head_dim, kv, stream);
    case ElementType::f32: return launch_for_dim<float>(params, geometry, head_dim, kv, stream);
    default: break;
  }
  return cudaErrorInvalidValue;
}

cudaError_t prepare_kernels() {
  for (cudaError_t err : {set_shared_memory<__half>(), set_shared_memory<__nv_bfloat16>(), set_shared_memory<float>()}) {
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace treeattn::cuda
