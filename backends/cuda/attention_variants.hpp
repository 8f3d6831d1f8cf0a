#pragma once
// The attention variants (DESIGN.md §8) the CUDA kernels run: fp8 K and V
// (e4m3, e5m2; per-tensor or per-KV-head scales), sinks and logit soft-capping,
// at every head dim the engine takes: 64, 96, 128 and 256 with V of the same
// width, and head_dim 192 with head_dim_v 128 (attn_launch.cu, KernelHeadDims).

#include "backend.hpp"

namespace treeattn::cuda {

inline constexpr VariantSupport kAttentionVariants = VariantSupport::all();
inline constexpr const char* kBackendName = "cuda";

}  // namespace treeattn::cuda
