#pragma once
// A non-owning view of a C-ordered tensor in host or device memory: dense,
// or with its rows (the first dimension) `row_stride` elements apart.

#include <cstdint>
#include <string>
#include <vector>

#include "treeattn/dtype.hpp"

namespace treeattn {

struct TensorRef {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  // Elements from one row's start to the next's; 0: dense (the product of the
  // other dimensions). Q, K, V and O accept a larger one (a slice of a fused
  // QKV projection or of a wider output; some heads of a KV pool); LSE is dense.
  std::int64_t row_stride = 0;

  std::int64_t numel() const noexcept;
  // Elements of one row (the product of the dimensions after the first).
  std::int64_t row_elements() const noexcept;
  // Elements from one row's start to the next's: row_stride, or row_elements() when dense.
  std::int64_t row_pitch() const noexcept { return row_stride != 0 ? row_stride : row_elements(); }
  bool dense() const noexcept { return row_stride == 0 || row_stride == row_elements(); }
  // Bytes of the elements (rows only, not the gaps between strided rows).
  std::size_t bytes() const noexcept { return std::size_t(numel()) * dtype_size(dtype); }
};

// An owning, zero-initialised host array (what .npy files and generators hold).
struct HostArray {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::vector<unsigned char> bytes;  // C-ordered elements

  HostArray() = default;
  HostArray(DType dtype, std::vector<std::int64_t> shape);
  TensorRef view() { return TensorRef{bytes.data(), dtype, shape}; }
  std::int64_t numel() const noexcept;
};

// "[4, 32, 128] f16" (and " row stride 12288" when strided), for error messages.
std::string describe(const TensorRef& t);

// The attention variants of one call (DESIGN.md §8); the defaults are plain
// softmax attention, so a call that sets none of them is unchanged.
struct AttentionOptions {
  // Gemma 2: s = cap * tanh(s / cap) on the scaled logits, before the softmax; 0: off.
  float logit_softcap = 0.0f;
  // fp8 K and V (vLLM's per-tensor scales): k = K * k_scale, v = V * v_scale.
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  // gpt-oss: [heads_q] f32, one logit per query head that joins the softmax's
  // denominator and the LSE and contributes no value (data null: none).
  TensorRef sinks;
  // fp8 K and V: [heads_kv] f32 scales per KV head, in place of k_scale and
  // v_scale (data null: none). Host or device memory, as the other tensors.
  TensorRef k_scales, v_scales;
};

// Arguments of one attention call. Layouts (docs/design.md):
//   q   [num_queries, heads_q, head_dim]
//   k   [kv_slots, heads_kv, head_dim]            (the KV pool; the tree indexes its rows)
//   v   [kv_slots, heads_kv, head_dim_v]
//   o   [num_queries, heads_q, head_dim_v]        f16, bf16 or f32
//   lse [num_queries, heads_q] f32, natural log   (optional: leave data null)
// Q, K and V share one dtype, or K and V are both fp8 of one kind (Q f16 or bf16).
struct AttentionArgs {
  TensorRef q, k, v, o, lse;
  AttentionOptions options{};
};

}  // namespace treeattn
