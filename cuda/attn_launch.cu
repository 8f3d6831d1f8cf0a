// Instantiations of the tree-attention kernels (head_dim x element type) and
// the one switch that turns run-time shapes into template arguments.

#include "attn_kernel.cuh"
#include "attn_launch.hpp"

namespace treeattn::cuda {
namespace {

template <int HeadDim, typename Element>
cudaError_t launch(const KernelParams& p, cudaStream_t stream) {
  using Traits = AttnTraits<HeadDim, Element>;
  auto kernel = tree_attn_partial_kernel<Traits>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
  if (err != cudaSuccess) return err;
  if (p.num_passes > 0) {
    const unsigned ctas = unsigned(p.num_passes) * unsigned(p.heads_kv);
    kernel<<<ctas, Traits::kThreads, Traits::kSmemBytes, stream>>>(p);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  if (p.num_partials > 0) {  // else stage 1 wrote every query: the merge would only return
    const std::int64_t pairs = std::int64_t(p.num_queries) * p.heads_q;
    const unsigned ctas = unsigned((pairs + kMergeWarps - 1) / kMergeWarps);
    if (p.merge_fanin <= kMergeLeanBatch) {
      tree_attn_merge_kernel<HeadDim, kMergeLeanBatch><<<ctas, kMergeWarps * 32, 0, stream>>>(p);
    } else {
      tree_attn_merge_kernel<HeadDim, kMergeBatch><<<ctas, kMergeWarps * 32, 0, stream>>>(p);
    }
    err = cudaGetLastError();
  }
  return err;
}

template <typename Element>
cudaError_t launch_for_dim(const KernelParams& p, int head_dim, cudaStream_t stream) {
  switch (head_dim) {
    case 64: return launch<64, Element>(p, stream);
    case 128: return launch<128, Element>(p, stream);
    case 256: return launch<256, Element>(p, stream);
  }
  return cudaErrorInvalidValue;
}

template <int HeadDim>
int ctas_per_sm() {
  using Traits = AttnTraits<HeadDim, __half>;
  auto kernel = tree_attn_partial_kernel<Traits>;
  int blocks = 0;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, Traits::kThreads, Traits::kSmemBytes) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return blocks;
}

}  // namespace

int stage1_ctas_per_sm(int head_dim) {
  switch (head_dim) {
    case 64: return ctas_per_sm<64>();
    case 128: return ctas_per_sm<128>();
    case 256: return ctas_per_sm<256>();
  }
  return 0;
}

cudaError_t launch_tree_attention(const KernelParams& params, int head_dim, bool bf16, cudaStream_t stream) {
  return bf16 ? launch_for_dim<__nv_bfloat16>(params, head_dim, stream)
              : launch_for_dim<__half>(params, head_dim, stream);
}

}  // namespace treeattn::cuda
