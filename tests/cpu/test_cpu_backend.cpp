// CPU backend against the fp64 oracle (which never sees the plan), for every
// strategy, dtype, head configuration and head_dim; bitwise determinism for any
// thread count; tensor checks.

#include <doctest/doctest.h>

#include <cstring>
#include <tuple>

#include "support/oracle.hpp"
#include "treeattn/backend.hpp"
#include "treeattn/error.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;

namespace {

constexpr double kTolerance = 2e-3;  // DESIGN §7: max abs error against fp64, fp16 inputs

struct Inputs {
  HostArray q, k, v;
};

Inputs make_inputs(const Tree& tree, DType dtype, std::uint64_t seed, float q_amplitude = 1.0f) {
  const HeadConfig& h = tree.heads;
  const std::int64_t slots = std::max<std::int64_t>(total_tokens(tree), 1);
  return {random_array(dtype, {std::int64_t(tree.query_count()), h.heads_q, h.head_dim}, seed, q_amplitude),
          random_array(dtype, {slots, h.heads_kv, h.head_dim}, seed + 1),
          random_array(dtype, {slots, h.heads_kv, h.head_dim}, seed + 2)};
}

struct Outputs {
  HostArray o, lse;
};

Outputs run_cpu(const Tree& tree, Inputs& in, const PlanOptions& options, int threads = 0, DType out_dtype = DType::f32) {
  const Plan plan = treeattn::plan(tree, options);
  const HeadConfig& h = tree.heads;
  const std::int64_t nq = std::int64_t(tree.query_count());
  Outputs out{HostArray(out_dtype, {nq, h.heads_q, h.head_dim}), HostArray(DType::f32, {nq, h.heads_q})};
  BackendOptions backend_options;
  backend_options.threads = threads;
  make_backend(BackendKind::cpu, backend_options)
      ->run(plan, AttentionArgs{in.q.view(), in.k.view(), in.v.view(), out.o.view(), out.lse.view()});
  return out;
}

void check_against_oracle(const Tree& tree, DType dtype, std::uint64_t seed, float q_amplitude = 1.0f,
                          std::int32_t block_tokens = 64, std::int32_t query_tile = kMaxQueryTile) {
  Inputs in = make_inputs(tree, dtype, seed, q_amplitude);
  const test::OracleResult expected = test::oracle_attention(tree, in.q.view(), in.k.view(), in.v.view());
  for (Strategy s : all_strategies()) {
    CAPTURE(to_string(s));
    Outputs out = run_cpu(tree, in, PlanOptions{s, block_tokens, query_tile, 0});
    CHECK(test::max_abs_error(out.o.view(), expected.o) <= kTolerance);
    CHECK(test::max_abs_error(out.lse.view(), expected.lse) <= kTolerance);
  }
}

}  // namespace

TEST_CASE("every strategy matches the fp64 oracle on random forests (f16)") {
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    CAPTURE(seed);
    RandomForestOptions o;
    o.seed = seed;
    o.nodes = std::int32_t(5 + seed * 3);
    o.roots = std::int32_t(1 + seed % 3);
    o.queries = std::int32_t(seed % 4 == 0 ? 90 : 12);  // 90: tiles beyond 64 queries
    o.max_tokens = 48;
    o.upto_fraction = 0.3;
    o.heads = {4, 2, 64, 0.0f};
    check_against_oracle(random_forest(o), DType::f16, seed, 1.0f, seed % 2 ? 64 : 16, seed % 3 ? 64 : 7);
  }
}

TEST_CASE("GQA groups 1, 4, 8, 16 and head_dim 64, 128, 256") {
  RandomForestOptions o;
  o.seed = 21;
  o.nodes = 10;
  o.queries = 6;
  o.max_tokens = 40;
  for (auto [hq, hkv, d] : {std::tuple{2, 2, 64}, std::tuple{8, 2, 128}, std::tuple{16, 2, 64}, std::tuple{16, 1, 256},
                            std::tuple{32, 8, 128}}) {
    CAPTURE(hq);
    CAPTURE(hkv);
    CAPTURE(d);
    o.heads = {hq, hkv, d, 0.0f};
    check_against_oracle(random_forest(o), DType::f16, 5);
  }
}

TEST_CASE("bf16 and f32 inputs, a custom scale") {
  RandomForestOptions o;
  o.seed = 4;
  o.nodes = 20;
  o.queries = 10;
  o.heads = {4, 1, 64, 0.3f};
  const Tree tree = random_forest(o);
  check_against_oracle(tree, DType::bf16, 8);
  check_against_oracle(tree, DType::f32, 9);
}

TEST_CASE("large-magnitude logits stay accurate (max-shifted softmax and merge)") {
  RandomForestOptions o;
  o.seed = 33;
  o.nodes = 25;
  o.queries = 15;
  o.max_tokens = 64;
  o.heads = {4, 2, 128, 0.0f};
  // Q in [-60, 60]: logits reach the hundreds; exp() without the max shift overflows.
  check_against_oracle(random_forest(o), DType::f16, 12, 60.0f, 16);
}

TEST_CASE("f16 and bf16 outputs are the rounded f32 outputs") {
  RandomForestOptions o;
  o.seed = 6;
  o.nodes = 12;
  o.queries = 8;
  const Tree tree = random_forest(o);
  Inputs in = make_inputs(tree, DType::f16, 3);
  const Outputs f32 = run_cpu(tree, in, PlanOptions{});
  for (DType out_dtype : {DType::f16, DType::bf16}) {
    const Outputs low = run_cpu(tree, in, PlanOptions{}, 0, out_dtype);
    for (std::int64_t i = 0; i < f32.o.numel(); ++i) {
      const float want = static_cast<const float*>(static_cast<const void*>(f32.o.bytes.data()))[i];
      HostArray rounded(out_dtype, {1});
      store_from_float(rounded.bytes.data(), out_dtype, 0, want);
      REQUIRE(std::memcmp(low.o.bytes.data() + i * 2, rounded.bytes.data(), 2) == 0);
    }
  }
}

TEST_CASE("output is bitwise identical for any thread count and across runs") {
  RandomForestOptions o;
  o.seed = 77;
  o.nodes = 150;
  o.roots = 4;
  o.queries = 200;
  o.heads = {8, 2, 64, 0.0f};
  const Tree tree = random_forest(o);
  Inputs in = make_inputs(tree, DType::f16, 1);
  for (Strategy s : {Strategy::flatten, Strategy::sequence}) {
    const Outputs reference = run_cpu(tree, in, PlanOptions{s, 32, kMaxQueryTile, 0}, 1);
    for (int threads : {1, 2, 3, 8}) {
      const Outputs again = run_cpu(tree, in, PlanOptions{s, 32, kMaxQueryTile, 0}, threads);
      CHECK(again.o.bytes == reference.o.bytes);
      CHECK(again.lse.bytes == reference.lse.bytes);
    }
  }
}

TEST_CASE("tensors that do not match the plan are rejected by name") {
  Tree tree({4, 2, 64});
  tree.add_node_range(0, kNoParent, 0, 10);
  tree.add_query(0);
  tree.add_query(0, 4);
  const Plan plan = treeattn::plan(tree);
  auto backend = make_backend(BackendKind::cpu);
  auto run_with = [&](HostArray q, HostArray k, HostArray v, HostArray o, HostArray lse, const char* fragment) {
    try {
      backend->run(plan, AttentionArgs{q.view(), k.view(), v.view(), o.view(), lse.view()});
      FAIL("accepted mismatched tensors");
    } catch (const Error& e) {
      CHECK(e.category() == ErrorCategory::InvalidArgument);
      CHECK_MESSAGE(std::string(e.what()).find(fragment) != std::string::npos, e.what());
    }
  };
  const HostArray q(DType::f16, {2, 4, 64}), k(DType::f16, {10, 2, 64}), o(DType::f32, {2, 4, 64}), lse(DType::f32, {2, 4});
  run_with(HostArray(DType::f16, {3, 4, 64}), k, k, o, lse, "Q is [3, 4, 64] f16, expected [2, 4, 64]");
  run_with(q, HostArray(DType::f16, {10, 4, 64}), k, o, lse, "K is [10, 4, 64] f16, expected [slots, 2, 64]");
  run_with(q, HostArray(DType::f16, {9, 2, 64}), HostArray(DType::f16, {9, 2, 64}), o, lse,
           "K has 9 slots but the tree reads slot 9");
  run_with(q, k, HostArray(DType::f16, {11, 2, 64}), o, lse, "V is [11, 2, 64] f16");
  run_with(HostArray(DType::f32, {2, 4, 64}), k, k, o, lse, "share one dtype");
  run_with(q, k, k, HostArray(DType::f32, {2, 4, 32}), lse, "O is [2, 4, 32]");
  run_with(q, k, k, o, HostArray(DType::f16, {2, 4}), "LSE must be f32");
  CHECK_THROWS_WITH_AS(make_backend(BackendKind::cuda), doctest::Contains("built without the cuda backend"), Error);
}
