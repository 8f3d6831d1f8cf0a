#pragma once
// Which stage-1 shader runs on a device: one pure function of the device's
// capabilities (DeviceCaps), the inputs and the head_dim, unit-tested on
// fabricated capabilities; and the shared-memory stage each shader is built with.

#include <cstdint>
#include <string>

#include "treeattn/dtype.hpp"
#include "vk_device.hpp"

namespace treeattn::vulkan {

// scalar: tree_attn_scalar.comp (any device); coopmat_shared:
// tree_attn_coopmat.comp (cooperative matrices, softmax through shared memory,
// any layout); coopmat_fragments: tree_attn_coopmat_fragments.comp (softmax in
// registers, where the matrices keep mma.sync's fragment layout).
enum class Variant { scalar, coopmat_shared, coopmat_fragments };

// The stage-1 shader variant for inputs of this dtype on this device: `forced`
// is "auto" (coopmat where the device and this build can, else scalar),
// "scalar", "coopmat" (throws Backend saying why the device cannot) or
// "coopmat-shared" (the shared-memory softmax even where the fragments one
// runs). The coopmat variants take the fragments shader when
// `fragment_layout` (coopmat_fragment_layout() of the device) and its two K/V
// stages of `head_dim` fit the shared memory (0: any head_dim, as `treeattn
// devices` lists them). `reason` receives the choice and why, for --verbose
// and `treeattn devices`.
Variant choose_variant(const DeviceCaps& caps, const std::string& forced, DType inputs, bool fragment_layout, int head_dim,
                       std::string* reason = nullptr);

// Tokens per shared-memory stage of a coopmat stage-1 shader at `head_dim`
// (`fragments`: tree_attn_coopmat_fragments.comp, else tree_attn_coopmat.comp):
// 32 (one 32-bit visibility word per query and stage) or 16, the most that fit
// the device's shared memory; 0 when neither does (the backend then runs the
// shared-memory shader in place of the fragments one).
std::uint32_t coopmat_chunk_tokens(const DeviceCaps& caps, int head_dim, bool fragments);

// Tokens per shared-memory stage of the scalar shader at `head_dim`.
std::uint32_t scalar_chunk_tokens(const DeviceCaps& caps, int head_dim);

// Query rows (tile queries x query heads of a KV head) one work group takes.
inline constexpr std::uint32_t kScalarRowsPerPass = 16;   // tree_attn_scalar.comp: 16 rows x 8 lanes
inline constexpr std::uint32_t kCoopmatRowsPerPass = 64;  // the coopmat shaders: 4 subgroups x 16 rows
inline std::uint32_t rows_per_pass(Variant variant) {
  return variant == Variant::scalar ? kScalarRowsPerPass : kCoopmatRowsPerPass;
}

}  // namespace treeattn::vulkan
