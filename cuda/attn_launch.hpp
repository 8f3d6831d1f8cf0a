#pragma once
// Host entry points of the CUDA kernels (implemented in attn_launch.cu), for
// the CUDA backend. Enqueue only: no allocation, no synchronisation, so a decode
// step can be captured in a CUDA graph.

#include <cuda_runtime_api.h>

#include "attn_params.hpp"

namespace treeattn::cuda {

// Query rows (queries x query heads of a KV head) one stage-1 CTA takes at
// most: a pass of a large tile (plan.hpp, kLargeTileRows).
inline constexpr int kRowsPerPass = 64;

// Stage-1 CTAs (f16, this head_dim) that fit on one SM of the current device.
int stage1_ctas_per_sm(int head_dim);

// Stage 1 over every work item and KV head, then the stage-2 merge.
// head_dim is 64, 128 or 256; bf16 selects bf16 inputs (else f16).
cudaError_t launch_tree_attention(const KernelParams& params, int head_dim, bool bf16, cudaStream_t stream);

}  // namespace treeattn::cuda
