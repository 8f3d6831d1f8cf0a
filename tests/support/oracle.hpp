#pragma once
// The fp64 reference: attention computed straight from the tree's definition
// (walk each query's root path by node id), never touching the planner.

#include <vector>

#include "treeattn/tensor.hpp"
#include "treeattn/tree.hpp"

namespace treeattn::test {

struct OracleResult {
  std::vector<double> o;    // [queries, heads_q, head_dim]
  std::vector<double> lse;  // [queries, heads_q]
};

// KV-pool slots query `q` sees, in root-to-node order: its whole path, or
// with a sliding window (> 0) the last `window` tokens of it.
std::vector<std::int64_t> visible_slots(const Tree& tree, std::size_t q, std::int32_t window = 0);

OracleResult oracle_attention(const Tree& tree, const TensorRef& q, const TensorRef& k, const TensorRef& v,
                              std::int32_t window = 0);

// Max |a - b| over two arrays (f32 test output against the fp64 oracle).
double max_abs_error(const TensorRef& got, const std::vector<double>& expected);

}  // namespace treeattn::test
