#pragma once
// Shared by the backend suites: inputs, one backend call, and the comparison
// with the fp64 oracle. Each backend's test program defines make_test_backend();
// the conformance cases (conformance/test_conformance.cpp) then run unchanged
// against it.

#include <memory>

#include "backend.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/tree.hpp"

namespace treeattn::test {

// The backend under test (defined once per test program).
std::unique_ptr<Backend> make_test_backend();

// Max abs error against the fp64 oracle that every backend meets: docs/testing.md
// fixes 2e-3 for f16 inputs; bf16 keeps 8 mantissa bits (P is rounded to bf16
// for the P V product on tensor cores), so it gets 1e-2; f32 inputs are
// multiplied in f32 (1e-5).
double tolerance(DType inputs);

// A 4-request forest of 150 nodes and 200 queries (many shared blocks, tiles of
// up to 64 queries) for the determinism checks.
Tree determinism_forest();

// One 10-token root and two queries on it (the second seeing 4 tokens), heads
// 4/2/64: the tree of the bad-input cases.
Tree bad_input_tree();

struct Inputs {
  HostArray q, k, v;
  // The call's attention variants (DESIGN.md §8); an empty array: none.
  float logit_softcap = 0.0f, k_scale = 1.0f, v_scale = 1.0f;
  HostArray sinks{}, k_scales{}, v_scales{};

  AttentionOptions options();
};
// V has the tree's head_dim_v columns.
Inputs make_inputs(const Tree& tree, DType dtype, std::uint64_t seed, float q_amplitude = 1.0f);

// One call's attention variants, as the variant cases combine them.
struct Variant {
  const char* name = "plain";
  DType kv = DType::f16;         // f16, or fp8 quantized from f16 draws divided by their scales
  bool per_head_scales = false;  // fp8: k_scales / v_scales per KV head instead of k_scale / v_scale
  bool sinks = false;            // one logit per query head, drawn from [-2, 4]
  float logit_softcap = 0.0f;
};
// Every variant and the combinations the conformance suite runs.
std::vector<Variant> all_variants();
// f16 Q; K and V as the variant says; its options' tensors.
Inputs make_variant_inputs(const Tree& tree, const Variant& variant, std::uint64_t seed);

struct Outputs {
  HostArray o, lse;
};
Outputs run_backend(Backend& backend, const Tree& tree, Inputs& in, const PlanOptions& options,
                    DType out_dtype = DType::f32);
// The same with a plan already made (perhaps altered) for `tree`.
Outputs run_plan(Backend& backend, const Tree& tree, Inputs& in, const Plan& plan, DType out_dtype = DType::f32);

// Every strategy against the oracle, O and LSE within tolerance(dtype);
// `window`: the plans' sliding window (0: none), the oracle's too.
void check_against_oracle(Backend& backend, const Tree& tree, DType dtype, std::uint64_t seed, float q_amplitude = 1.0f,
                          std::int32_t block_tokens = 64, std::int32_t query_tile = kMaxQueryTile,
                          std::int32_t window = 0);
// The same with `in`'s variants.
void check_inputs_against_oracle(Backend& backend, const Tree& tree, Inputs& in, double tolerance,
                                 std::int32_t block_tokens = 64, std::int32_t query_tile = kMaxQueryTile,
                                 std::int32_t window = 0);

// time_layers() on a 40-query forest with llama3-8b heads: `repeats` positive
// timings and the same O as run(), bit for bit.
void check_timed_layers_match_run(Backend& backend);

// A head split, as each rank of a tensor-parallel model runs it: each half of
// the query heads with its KV heads, read as strided rows of the whole Q, K, V
// and O, planned for half the heads at the same fixed block size, gives bit
// for bit the whole run's O and LSE of those heads.
void check_head_split_is_bitwise(Backend& backend);

}  // namespace treeattn::test
