#pragma once
// Exact coverage through a backend. With Q = 0 every score is 0, so each query
// head's LSE is ln(the tokens it sees) and its O the mean of V over them. V
// holds 0/1 bits of a hash of (slot, KV head, column group), so the expected
// values come from the tree alone (each query's path counted, its V bits
// summed exactly in double), never from another backend, and one token too
// many, too few or foreign moves LSE or O past kCoverageLseTolerance /
// kCoverageOTolerance: one token more or less of n moves LSE by about 1/n
// (8.6e-5 for n = 11 662) and a column of O by |O - the token's bit| / n; a
// token swapped for a foreign one moves the columns whose bits differ by 1/n.
// 0 and 1 are exact in f16 and bf16.

#include <string>
#include <vector>

#include "backend.hpp"
#include "treeattn/plan.hpp"
#include "treeattn/tree.hpp"

namespace treeattn::test {

inline constexpr double kCoverageOTolerance = 1e-5;
inline constexpr double kCoverageLseTolerance = 2e-5;

class CoverageCheck {
 public:
  // Q = 0, K and V the bits, in `inputs` (f16 or bf16; f32 too for the CPU
  // and CUDA backends). Requires a tree whose slots are distinct. With a
  // sliding window (> 0) each query is expected to see exactly the last
  // `window` tokens of its path.
  CoverageCheck(const Tree& tree, DType inputs, std::int32_t window = 0);

  // "" when `plan` (made for the tree) run on `backend` gives every query head
  // LSE = ln(its tokens) and O = the mean of their V bits, column by column;
  // else the first query, head and column off, what it got and what it expected.
  std::string error(Backend& backend, const Plan& plan);

  const Tree& tree() const noexcept { return tree_; }

 private:
  Tree tree_;
  HostArray q_, kv_;
  std::vector<std::int64_t> tokens_;  // [queries] tokens each query sees
  std::vector<double> o_;             // [queries, heads_kv, head_dim] expected O of each KV head's query heads
};

// V's bit at (slot, KV head, column).
int coverage_bit(std::int64_t slot, std::int32_t kv_head, std::int32_t column);

}  // namespace treeattn::test
