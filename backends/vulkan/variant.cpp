#include "variant.hpp"

#include <fmt/format.h>

#include "treeattn/error.hpp"

namespace treeattn::vulkan {

// Tokens per shared-memory stage of the scalar shader: K and V (2 bytes each)
// must fit the device's shared memory. (A divisor of 64: a stage lies in one
// 64-token tile of visibility words.)
std::uint32_t scalar_chunk_tokens(const DeviceCaps& caps, int head_dim, int head_dim_v) {
  for (std::uint32_t chunk : {64u, 32u, 16u, 8u}) {
    if (chunk * 2u * std::uint32_t(head_dim + head_dim_v) <= caps.shared_memory_bytes) return chunk;
  }
  return 8;
}

ShaderKey ShaderKey::merge() const {
  ShaderKey key;
  key.head_dim_v = head_dim_v;
  key.sinks = sinks;
  return key;
}

std::uint32_t merge_threads(int head_dim_v) { return head_dim_v % 64 == 0 ? 32u : 48u; }

std::vector<std::uint32_t> ShaderKey::specialization(std::uint32_t id0, std::uint32_t id1) const {
  return {id0, id1, bf16 ? 1u : 0u, std::uint32_t(head_dim_v), kv_fp8, softcap ? 1u : 0u, sinks ? 1u : 0u};
}

Variant choose_variant(const DeviceCaps& caps, const std::string& forced, DType inputs, bool fragment_layout,
                       int head_dim, int head_dim_v, std::string* reason) {
  const bool bf16 = inputs == DType::bf16;
  std::string why_not_coopmat;
#ifdef TREEATTN_HAVE_VK_COOPMAT
  why_not_coopmat = caps.coopmat_unsupported(bf16);
#else
  why_not_coopmat = "this build's glslang cannot compile cooperative-matrix shaders (scripts/setup_glslang.sh provides one)";
#endif
  auto say = [&](std::string text) {
    if (reason) *reason = std::move(text);
  };
  const std::string shape = bf16 ? "VK_KHR_cooperative_matrix 16x16x16 bf16 -> f32, VK_KHR_shader_bfloat16"
                                 : "VK_KHR_cooperative_matrix 16x16x16 f16 -> f32";
  // Which coopmat shader, and why, once coopmat is decided.
  auto coopmat = [&](bool shared_forced, const std::string& how) {
    if (fragment_layout && !shared_forced) {
      if (head_dim == 0 || coopmat_chunk_tokens(caps, head_dim, head_dim_v, true) > 0) {
        say("coopmat, softmax in registers (" + shape + ", elements in mma's fragment layout" + how + ")");
        return Variant::coopmat_fragments;
      }
      say(fmt::format("coopmat, softmax through shared memory (the fragments shader's two K/V stages of head_dim {} "
                      "and head_dim_v {} exceed the device's {} KiB of shared memory)",
                      head_dim, head_dim_v, caps.shared_memory_bytes / 1024));
      return Variant::coopmat_shared;
    }
    say("coopmat, softmax through shared memory (" + shape +
        (shared_forced ? ", forced by --vk-variant" : ", elements not in mma's fragment layout") + ")");
    return Variant::coopmat_shared;
  };
  if (forced == "scalar") {
    say("scalar (forced by --vk-variant)");
    return Variant::scalar;
  }
  if (forced == "coopmat" || forced == "coopmat-shared") {
    if (bf16 && !why_not_coopmat.empty() && caps.coopmat_unsupported(false).empty()) {
      // The device runs the coopmat shaders on f16 only.
      say("scalar for bf16 inputs (" + forced + " forced, but " + why_not_coopmat + ")");
      return Variant::scalar;
    }
    if (!why_not_coopmat.empty()) {
      throw Error(ErrorCategory::Backend,
                  fmt::format("--vk-variant {}: Vulkan device {} cannot run it: {}", forced, caps.name, why_not_coopmat));
    }
    return coopmat(forced == "coopmat-shared", ", forced by --vk-variant");
  }
  if (forced != "auto" && !forced.empty()) {
    throw Error(ErrorCategory::InvalidArgument,
                fmt::format("unknown Vulkan variant '{}' (choose auto, scalar, coopmat or coopmat-shared)", forced));
  }
  if (why_not_coopmat.empty()) return coopmat(false, "");
  say("scalar (coopmat: " + why_not_coopmat + ")");
  return Variant::scalar;
}

// Both coopmat shaders hold each subgroup's 16x16 Q staging tile (48-byte
// columns) and K and V rows (16-bit, fp8 decoded) padded by 16 bytes; the
// shared-memory softmax adds per subgroup a column of S (f32, 20 per column)
// and of P (f16, 24 per column) per token, the register one a second K/V
// stage (coopmat_pipeline.glsl).
std::uint32_t coopmat_chunk_tokens(const DeviceCaps& caps, int head_dim, int head_dim_v, bool fragments) {
  const std::uint32_t q_staging = 4u * 16u * 24u * 2u;
  const std::uint32_t kv_stage = 2u * std::uint32_t(head_dim + head_dim_v) + 32u;
  const std::uint32_t per_token = fragments ? 2u * kv_stage : kv_stage + 4u * (20u * 4u + 24u * 2u);
  for (std::uint32_t chunk : {32u, 16u}) {
    if (q_staging + chunk * per_token <= caps.shared_memory_bytes) return chunk;
  }
  return 0;
}

}  // namespace treeattn::vulkan
