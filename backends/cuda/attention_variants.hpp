#pragma once
// The attention variants (DESIGN.md §8) the CUDA kernels run: fp8 K and V
// (e4m3, e5m2; per-tensor or per-KV-head scales), sinks and logit soft-capping,
// at head_dim 64, 128 and 256 with V of the same width. check_args and
// check_head_dims refuse the others (head_dim 96, head_dim_v) by name.

#include "backend.hpp"

namespace treeattn::cuda {

inline constexpr VariantSupport kAttentionVariants{/*fp8_kv*/ true, /*sinks*/ true, /*logit_softcap*/ true};
inline constexpr const char* kBackendName = "cuda";

}  // namespace treeattn::cuda
