// Instantiations of the tree-attention kernels (head dims x element type x KV
// storage x options) and the one switch that turns run-time shapes and the
// call's attention variants into template arguments.

#include "attn_kernel.cuh"
#include "attn_kernel_f32.cuh"
#include "attn_launch.hpp"
#include "attn_merge.cuh"

#include <tuple>
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

// The head dims with kernels (tree.hpp's kSupportedHeadDims and
// kSupportedSplitHeadDims): Q's and K's columns, and V's and O's.
template <int QK, int V>
struct HeadDims {
  static constexpr int kQK = QK, kV = V;
};
using KernelHeadDims =
    std::tuple<HeadDims<64, 64>, HeadDims<96, 96>, HeadDims<128, 128>, HeadDims<256, 256>, HeadDims<192, 128>>;

// f(HeadDims) for the pair (head_dim, head_dim_v); cudaErrorInvalidValue for a pair without kernels.
template <typename F>
cudaError_t with_head_dims(int head_dim, int head_dim_v, const F& f) {
  return std::apply(
      [&](auto... dims) {
        cudaError_t err = cudaErrorInvalidValue;
        (void)((dims.kQK == head_dim && dims.kV == head_dim_v && ((err = f(dims)), true)) || ...);
        return err;
      },
      KernelHeadDims{});
}
// f(HeadDims) for every pair, up to the first error.
template <typename F>
cudaError_t for_all_head_dims(const F& f) {
  return std::apply(
      [&](auto... dims) {
        cudaError_t err = cudaSuccess;
        (void)(((err = f(dims)) == cudaSuccess) && ...);
        return err;
      },
      KernelHeadDims{});
}

// Stage 1's kernel for Q's element type, the KV pool's and the options: the
// tensor cores' (attn_kernel.cuh) for f16 and bf16, the CUDA cores' for f32
// (attn_kernel_f32.cuh, which reads its options at run time).
template <typename Dims, typename Element, typename KvStore, bool Options>
struct Stage1 {
  using Traits = AttnTraits<Dims::kQK, Element, KvStore, Options, Dims::kV>;
  static auto kernel() { return tree_attn_partial_kernel<Traits>; }
  static constexpr int kThreads = Traits::kThreads;
  static constexpr int kSmemBytes = Traits::kSmemBytes;
};
template <typename Dims>
struct Stage1<Dims, float, float, false> {
  static auto kernel() { return tree_attn_partial_f32_kernel<Dims::kQK, Dims::kV>; }
  static constexpr int kThreads = kF32Warps * 32;
  static constexpr int kSmemBytes = F32Layout<Dims::kQK, Dims::kV>::kBytes;
};

// Every stage-1 kernel of one element type and pair of head dims: plain, with
// options, and (tensor cores) over fp8 K and V.
template <typename Element, typename Dims, typename F>
cudaError_t for_each_stage1(const F& f) {
  if constexpr (std::is_same_v<Element, float>) {
    return f(Stage1<Dims, float, float, false>{});
  } else {
    for (cudaError_t err : {f(Stage1<Dims, Element, Element, false>{}), f(Stage1<Dims, Element, Element, true>{}),
                            f(Stage1<Dims, Element, __nv_fp8_e4m3, true>{}),
                            f(Stage1<Dims, Element, __nv_fp8_e5m2, true>{})}) {
      if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
  }
}

template <int HeadDimV, int kBatch>
void launch_merge(const KernelParams& p, unsigned ctas, cudaStream_t stream) {
  if (p.sinks != nullptr) tree_attn_merge_kernel<HeadDimV, kBatch, true><<<ctas, kMergeWarps * 32, 0, stream>>>(p);
  else tree_attn_merge_kernel<HeadDimV, kBatch, false><<<ctas, kMergeWarps * 32, 0, stream>>>(p);
}

template <typename Dims, typename Stage1>
cudaError_t launch(const KernelParams& p, const LaunchGeometry& g, cudaStream_t stream) {
  constexpr int kHeadDimV = Dims::kV;  // the merge's rows are V's
  cudaError_t err = cudaSuccess;
  if (g.passes > 0) {
    Stage1::kernel()<<<unsigned(g.passes) * unsigned(p.heads_kv), Stage1::kThreads, Stage1::kSmemBytes, stream>>>(p);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  if (g.queries > 0) {
    const std::int64_t pairs = std::int64_t(g.queries) * p.heads_q;
    const unsigned ctas = unsigned((pairs + kMergeWarps - 1) / kMergeWarps);
    if (g.lean_merge) launch_merge<kHeadDimV, kMergeLeanBatch>(p, ctas, stream);
    else launch_merge<kHeadDimV, kMergeBatch>(p, ctas, stream);
    err = cudaGetLastError();
  }
  return err;
}

// The options kernels run a call that uses a variant; the plain kernel the
// others, so its code and speed are those of plain attention.
bool uses_options(const KernelParams& p) { return p.softcap_log2 > 0.0f || p.sinks != nullptr; }

template <typename Element, typename Dims>
cudaError_t launch_for_kv(const KernelParams& p, const LaunchGeometry& g, ElementType kv, cudaStream_t stream) {
  if constexpr (std::is_same_v<Element, float>) {
    return launch<Dims, Stage1<Dims, float, float, false>>(p, g, stream);
  } else {
    switch (kv) {
      case ElementType::fp8_e4m3: return launch<Dims, Stage1<Dims, Element, __nv_fp8_e4m3, true>>(p, g, stream);
      case ElementType::fp8_e5m2: return launch<Dims, Stage1<Dims, Element, __nv_fp8_e5m2, true>>(p, g, stream);
      default: break;
    }
    if (uses_options(p)) return launch<Dims, Stage1<Dims, Element, Element, true>>(p, g, stream);
    return launch<Dims, Stage1<Dims, Element, Element, false>>(p, g, stream);
  }
}

template <typename Element>
cudaError_t launch_for_dims(const KernelParams& p, const LaunchGeometry& g, int head_dim, int head_dim_v,
                            ElementType kv, cudaStream_t stream) {
  return with_head_dims(head_dim, head_dim_v,
                        [&](auto dims) { return launch_for_kv<Element, decltype(dims)>(p, g, kv, stream); });
}

template <typename Element>
cudaError_t set_shared_memory() {
  const auto set = [](auto stage1) {
    using S = decltype(stage1);
    return cudaFuncSetAttribute(S::kernel(), cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes);
  };
  return for_all_head_dims([&](auto dims) { return for_each_stage1<Element, decltype(dims)>(set); });
}

template <typename Dims>
Stage1Occupancy occupancy() {
  using Traits = AttnTraits<Dims::kQK, __half, __half, false, Dims::kV>;
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

Stage1Occupancy stage1_occupancy(int head_dim, int head_dim_v) {
  Stage1Occupancy o;
  with_head_dims(head_dim, head_dim_v, [&](auto dims) {
    o = occupancy<decltype(dims)>();
    return cudaSuccess;
  });
  return o;
}

cudaError_t launch_tree_attention(const KernelParams& params, const LaunchGeometry& geometry, int head_dim,
                                  int head_dim_v, ElementType q, ElementType kv, cudaStream_t stream) {
  switch (q) {
    case ElementType::f16: return launch_for_dims<__half>(params, geometry, head_dim, head_dim_v, kv, stream);
    case ElementType::bf16: return launch_for_dims<__nv_bfloat16>(params, geometry, head_dim, head_dim_v, kv, stream);
    case ElementType::f32: return launch_for_dims<float>(params, geometry, head_dim, head_dim_v, kv, stream);
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
