#pragma once
// The bf16 build of a cooperative-matrix shader, derived from its f16 build.
//
// bf16 cooperative matrices need a bfloat16 type in SPIR-V (SPV_KHR_bfloat16),
// which glslang writes only from GL_EXT_bfloat16 — newer than the glslang 15
// that Debian 13 ships and scripts/setup_glslang.sh builds. The f16 shader
// already keeps its 16-bit floats out of arithmetic: they are bitcast from the
// loaded words, converted from f32, stored, loaded and multiplied as matrices —
// exactly what SPV_KHR_bfloat16 allows a bfloat16 value. So declaring its one
// 16-bit float type with the BFloat16KHR encoding turns it into the bf16 shader:
// Q, K and V are read as bf16, P is rounded to bf16, the products accumulate
// in f32 as in the f16 build.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace treeattn::vulkan {

// `words` with its 16-bit float type declared as bfloat16, and the capabilities
// (BFloat16TypeKHR, BFloat16CooperativeMatrixKHR) and extension that requires.
// Throws Backend when the module is not SPIR-V, has no 16-bit float type or
// more than one, or holds a 16-bit float constant (whose bits would change
// value) or 16-bit float arithmetic (which bfloat16 does not allow).
std::vector<std::uint32_t> retype_f16_as_bf16(const std::uint32_t* words, std::size_t word_count);

}  // namespace treeattn::vulkan
