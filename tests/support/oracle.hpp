#pragma once
// The fp64 reference: attention computed straight from the tree's definition
// (walk each query's root path by node id), never touching the planner.

#include <vector>

#include "treeattn/tensor.hpp"
#include "treeattn/tree.hpp"

namespace treeattn::test {

struct OracleResult {
  std::vector<double> o;    // [queries, heads_q, head_dim_v]
  std::vector<double> lse;  // [queries, heads_q]
};

// KV-pool slots query `q` sees, in root-to-node order: its whole path, or
// with a sliding window (> 0) the last `window` tokens of it.
std::vector<std::int64_t> visible_slots(const Tree& tree, std::size_t q, std::int32_t window = 0);

// Dense host tensors; the attention variants of `options` (DESIGN.md §8)
// computed on K and V dequantized in double: soft-capped scores, and each
// query head's sink a term of the softmax's denominator and LSE. `window`:
// each query sees the last `window` tokens of its path (0: all).
OracleResult oracle_attention(const Tree& tree, const TensorRef& q, const TensorRef& k, const TensorRef& v,
                              const AttentionOptions& options = {}, std::int32_t window = 0);

// Max |a - b| over two arrays (f32 test output against the fp64 oracle).
double max_abs_error(const TensorRef& got, const std::vector<double>& expected);

}  // namespace treeattn::test
