#pragma once
// Which stage-1 shader runs on a device: one pure function of the device's
// capabilities (DeviceCaps), the inputs and the head_dim, unit-tested on
// fabricated capabilities; and the shared-memory stage each shader is built with.

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

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
// stages of `head_dim` (K) and `head_dim_v` (V) columns fit the shared memory
// (head_dim 0: any, as `treeattn devices` lists them). `reason` receives the
// choice and why, for --verbose and `treeattn devices`.
Variant choose_variant(const DeviceCaps& caps, const std::string& forced, DType inputs, bool fragment_layout, int head_dim,
                       int head_dim_v, std::string* reason = nullptr);

// Tokens per shared-memory stage of a coopmat stage-1 shader at `head_dim`
// and `head_dim_v` (`fragments`: tree_attn_coopmat_fragments.comp, else
// tree_attn_coopmat.comp): 32 (one 32-bit visibility word per query and
// stage) or 16, the most that fit the device's shared memory; 0 when neither
// does (the backend then runs the shared-memory shader in place of the
// fragments one).
std::uint32_t coopmat_chunk_tokens(const DeviceCaps& caps, int head_dim, int head_dim_v, bool fragments);

// Tokens per shared-memory stage of the scalar shader at `head_dim` and `head_dim_v`.
std::uint32_t scalar_chunk_tokens(const DeviceCaps& caps, int head_dim, int head_dim_v);

// What a pipeline is specialised for: the stage-1 shader, the head dims, the
// inputs' 16-bit type and the attention variants a call uses (DESIGN.md §8;
// attn_common.glsl's specialization constants). Keys the built pipelines, so
// the plain call's pipelines are the ones without any variant's code.
struct ShaderKey {
  Variant variant = Variant::scalar;
  int head_dim = 0, head_dim_v = 0;
  bool bf16 = false;
  std::uint32_t kv_fp8 = 0;  // K and V: 0 the inputs' 16-bit type, 1 fp8_e4m3, 2 fp8_e5m2
  bool softcap = false, sinks = false;

  auto tie() const { return std::tie(variant, head_dim, head_dim_v, bf16, kv_fp8, softcap, sinks); }
  bool operator<(const ShaderKey& other) const { return tie() < other.tie(); }
  bool operator==(const ShaderKey& other) const { return tie() == other.tie(); }
  // The merge's part of the key: its rows' width and the sinks.
  ShaderKey merge() const;
  // The specialization constants: the shader's own ids 0 and 1, then
  // attn_common.glsl's (IN_BF16, HEAD_DIM_V, KV_FP8, SOFTCAP, SINKS).
  std::vector<std::uint32_t> specialization(std::uint32_t id0, std::uint32_t id1) const;
};

// The merge's threads per (query, query head): 32 (head_dim_v 64, 128, 256:
// two or more columns each), 48 for 96 columns.
std::uint32_t merge_threads(int head_dim_v);

// Query rows (tile queries x query heads of a KV head) one work group takes.
inline constexpr std::uint32_t kScalarRowsPerPass = 16;   // tree_attn_scalar.comp: 16 rows x 8 lanes
inline constexpr std::uint32_t kCoopmatRowsPerPass = 64;  // the coopmat shaders: 4 subgroups x 16 rows
inline std::uint32_t rows_per_pass(Variant variant) {
  return variant == Variant::scalar ? kScalarRowsPerPass : kCoopmatRowsPerPass;
}

}  // namespace treeattn::vulkan
