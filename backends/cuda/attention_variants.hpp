#pragma once
// The attention variants (DESIGN.md §8) the CUDA kernels run: plain softmax
// attention. check_args and check_head_dims refuse the others by name; a
// variant whose kernels exist is turned on here.

#include "backend.hpp"

namespace treeattn::cuda {

inline constexpr VariantSupport kAttentionVariants{};
inline constexpr const char* kBackendName = "cuda";

}  // namespace treeattn::cuda
