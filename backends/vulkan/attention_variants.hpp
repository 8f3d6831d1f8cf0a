#pragma once
// The attention variants (DESIGN.md §8) the Vulkan kernels run: plain softmax
// attention. check_args and check_head_dims refuse the others by name; a
// variant whose kernels exist is turned on here.

#include "backend.hpp"

namespace treeattn::vulkan {

inline constexpr VariantSupport kAttentionVariants{};
inline constexpr const char* kBackendName = "vulkan";

}  // namespace treeattn::vulkan
