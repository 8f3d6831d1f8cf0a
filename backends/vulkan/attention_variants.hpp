#pragma once
// The attention variants (DESIGN.md §8) the Vulkan shaders run, every one of
// them on every shader variant (scalar, coopmat, coopmat-shared), each
// compiled into a pipeline only where a call uses it (ShaderKey).

#include "backend.hpp"

namespace treeattn::vulkan {

inline constexpr VariantSupport kAttentionVariants = VariantSupport::all();
inline constexpr const char* kBackendName = "vulkan";

}  // namespace treeattn::vulkan
