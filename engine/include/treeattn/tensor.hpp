#pragma once
// A non-owning view of a dense, C-ordered tensor in host or device memory.

#include <cstdint>
#include <string>
#include <vector>

#include "treeattn/dtype.hpp"

namespace treeattn {

struct TensorRef {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;

  std::int64_t numel() const noexcept;
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

// "[4, 32, 128] f16", for error messages.
std::string describe(const TensorRef& t);

// Arguments of one attention call. Layouts (DESIGN §2):
//   q   [num_queries, heads_q, head_dim]
//   k,v [kv_slots, heads_kv, head_dim]          (the KV pool; the tree indexes its rows)
//   o   [num_queries, heads_q, head_dim]          f16, bf16 or f32
//   lse [num_queries, heads_q] f32, natural log   (optional: leave data null)
struct AttentionArgs {
  TensorRef q, k, v, o, lse;
};

}  // namespace treeattn
