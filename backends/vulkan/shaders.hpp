#pragma once
// The SPIR-V modules compiled from shaders/ at build time and embedded
// (cmake/embed_spirv.cmake writes their definitions).

#include <cstddef>
#include <cstdint>

namespace treeattn::vulkan::spirv {

extern const std::uint32_t tree_attn_scalar[];
extern const std::size_t tree_attn_scalar_words;
extern const std::uint32_t tree_merge[];
extern const std::size_t tree_merge_words;
#ifdef TREEATTN_HAVE_VK_COOPMAT
extern const std::uint32_t tree_attn_coopmat[];
extern const std::size_t tree_attn_coopmat_words;
extern const std::uint32_t tree_attn_coopmat_fragments[];
extern const std::size_t tree_attn_coopmat_fragments_words;
extern const std::uint32_t coopmat_layout[];
extern const std::size_t coopmat_layout_words;
#endif

}  // namespace treeattn::vulkan::spirv
