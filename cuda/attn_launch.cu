// Instantiations of the tree-attention kernels (head_dim x element type) and
// the one switch that turns run-time shapes into template arguments.

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

template <int HeadDim, typename Element>
cudaError_t set_shared_memory() {
  using Traits = AttnTraits<HeadDim, Element>;
  return cudaFuncSetAttribute(tree_attn_partial_kernel<Traits>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              Traits::kSmemBytes);
}

template <int HeadDim>
cudaError_t set_shared_memory_f32() {
  return cudaFuncSetAttribute(tree_attn_partial_f32_kernel<HeadDim>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              F32Layout<HeadDim>::kBytes);
}

// Stage 1 for one element type (f32 on the CUDA cores, attn_kernel_f32.cuh).
template <int HeadDim, typename Element>
void launch_stage1(const KernelParams& p, unsigned ctas, cudaStream_t stream) {
  if constexpr (std::is_same_v<Element, float>) {
    tree_attn_partial_f32_kernel<HeadDim><<<ctas, kF32Warps * 32, F32Layout<HeadDim>::kBytes, stream>>>(p);
  } else {
    using Traits = AttnTraits<HeadDim, Element>;
    tree_attn_partial_kernel<Traits><<<ctas, Traits::kThreads, Traits::kSmemBytes, stream>>>(p);
  }
}

template <int HeadDim, typename Element>
cudaError_t launch(const KernelParams& p, const LaunchGeometry& g, cudaStream_t stream) {
  cudaError_t err = cudaSuccess;
  if (g.passes > 0) {
    launch_stage1<HeadDim, Element>(p, unsigned(g.passes) * unsigned(p.heads_kv), stream);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  if (g.queries > 0) {
    const std::int64_t pairs = std::int64_t(g.queries) * p.heads_q;
    const unsigned ctas = unsigned((pairs + kMergeWarps - 1) / kMergeWarps);
    if (g.lean_merge) {
      tree_attn_merge_kernel<HeadDim, kMergeLeanBatch><<<ctas, kMergeWarps * 32, 0, stream>>>(p);
    } else {
      tree_attn_merge_kernel<HeadDim, kMergeBatch><<<ctas, kMergeWarps * 32, 0, stream>>>(p);
    }
    err = cudaGetLastError();
  }
  return err;
}

template <typename Element>
cudaError_t launch_for_dim(const KernelParams& p, const LaunchGeometry& g, int head_dim, cudaStream_t stream) {
  switch (head_dim) {
    case 64: return launch<64, Element>(p, g, stream);
    case 128: return launch<128, Element>(p, g, stream);
    case 256: return launch<256, Element>(p, g, stream);
  }
  return cudaErrorInvalidValue;
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
                                  ElementType inputs, cudaStream_t stream) {
  switch (inputs) {
    case ElementType::f16: return launch_for_dim<__half>(params, geometry, head_dim, stream);
    case ElementType::bf16: return launch_for_dim<__nv_bfloat16>(params, geometry, head_dim, stream);
    case ElementType::f32: return launch_for_dim<float>(params, geometry, head_dim, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t prepare_kernels() {
  for (cudaError_t err : {set_shared_memory<64, __half>(), set_shared_memory<128, __half>(),
                          set_shared_memory<256, __half>(), set_shared_memory<64, __nv_bfloat16>(),
                          set_shared_memory<128, __nv_bfloat16>(), set_shared_memory<256, __nv_bfloat16>(),
                          set_shared_memory_f32<64>(), set_shared_memory_f32<128>(), set_shared_memory_f32<256>()}) {
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace treeattn::cuda
