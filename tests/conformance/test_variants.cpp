// The attention variants (DESIGN.md §8) against the fp64 oracle on the
// dequantized values: fp8 K and V with per-tensor and per-head scales, sinks,
// soft-capping, their combinations, head_dim_v beside head_dim and head_dim 96.
// Compiled into every backend's program: each runs them all.

#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "support/conformance.hpp"
#include "support/oracle.hpp"
#include "treeattn/error.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;
using namespace treeattn::test;

namespace {

Tree variant_forest(std::uint64_t seed, HeadConfig heads) {
  RandomForestOptions o;
  o.seed = seed;
  o.nodes = 24;
  o.roots = 2;
  o.queries = seed % 2 ? 12 : 70;  // 70: tiles beyond 64 queries
  o.max_tokens = 40;
  o.upto_fraction = 0.3;
  o.heads = heads;
  return random_forest(o);
}

}  // namespace

TEST_CASE("variants: each variant and combination matches the fp64 oracle for every strategy") {
  auto backend = make_test_backend();
  for (const Variant& variant : all_variants()) {
    const std::string variant_name = variant.name;
    CAPTURE(variant_name);
    for (std::uint64_t seed = 1; seed <= 3; ++seed) {
      CAPTURE(seed);
      const Tree tree = variant_forest(seed, {8, 2, 64, 0.0f});
      Inputs in = make_variant_inputs(tree, variant, seed);
      check_inputs_against_oracle(*backend, tree, in, tolerance(DType::f16), seed == 2 ? 16 : 64, seed == 3 ? 7 : 64);
    }
  }
}

TEST_CASE("variants: sliding windows with sinks, soft-cap and fp8 match the windowed fp64 oracle for every strategy") {
  // The window is the plan's (masks); the variants are the kernels': each
  // query's softmax runs over its last `window` tokens, the sink joining it.
  auto backend = make_test_backend();
  for (const Variant& variant : all_variants()) {
    if (!variant.sinks && variant.logit_softcap == 0.0f) continue;  // windowed models use these: gpt-oss (sinks), Gemma 2 (soft-cap)
    const std::string variant_name = variant.name;
    CAPTURE(variant_name);
    for (std::int32_t window : {1, 5, 37}) {
      CAPTURE(window);
      const Tree tree = variant_forest(std::uint64_t(window), {8, 2, 64, 0.0f});
      Inputs in = make_variant_inputs(tree, variant, std::uint64_t(window) + 40);
      check_inputs_against_oracle(*backend, tree, in, tolerance(DType::f16), window == 5 ? 16 : 64, 64, window);
    }
  }
}

TEST_CASE("variants: head_dim_v 128 beside head_dim 192, and head_dim 96, plain and with every variant") {
  auto backend = make_test_backend();
  for (const HeadConfig heads : {HeadConfig{8, 2, 192, 0.0f, 128}, HeadConfig{8, 2, 96, 0.0f}, HeadConfig{4, 4, 96, 0.0f, 96}}) {
    const std::string heads_name = describe(heads);
    CAPTURE(heads_name);
    const Tree tree = variant_forest(5, heads);
    Inputs plain = make_inputs(tree, DType::f16, 5);
    check_inputs_against_oracle(*backend, tree, plain, tolerance(DType::f16));
    for (const Variant& variant : all_variants()) {
      const std::string variant_name = variant.name;
      CAPTURE(variant_name);
      Inputs in = make_variant_inputs(tree, variant, 6);
      check_inputs_against_oracle(*backend, tree, in, tolerance(DType::f16));
    }
  }
}

TEST_CASE("variants: sinks join once per query head, for a query merged from hundreds of partials and a direct one") {
  auto backend = make_test_backend();
  Tree tree({4, 2, 64});
  tree.add_node_range(0, kNoParent, 0, 700);
  tree.add_node_range(1, kNoParent, 700, 30);
  tree.add_query(0);       // 350 blocks of 2 tokens: 350 partials
  tree.add_query(0, 333);
  tree.add_query(1, 1);    // one token in one block: written directly by stage 1
  const Plan plan = treeattn::plan(tree, PlanOptions{Strategy::flatten, 2});
  REQUIRE(plan.merge_begin[1] - plan.merge_begin[0] >= 300);
  REQUIRE(plan.merge_begin[3] == plan.merge_begin[2]);
  for (const std::string name : {"sinks", "sinks + soft-cap 5", "fp8_e4m3 + sinks + soft-cap 30"}) {
    CAPTURE(name);
    Variant variant;
    for (const Variant& v : all_variants()) {
      if (v.name == name) variant = v;
    }
    REQUIRE(variant.sinks);
    Inputs in = make_variant_inputs(tree, variant, 17);
    check_inputs_against_oracle(*backend, tree, in, tolerance(DType::f16), 2);
  }
}

TEST_CASE("variants: fp8 K and V with unit scales give the f16 run of the same values, bit for bit") {
  // The fp8 values are exact in f16: dequantizing them is the only difference.
  auto backend = make_test_backend();
  const Tree tree = variant_forest(8, {8, 2, 64, 0.0f});
  for (DType fp8 : {DType::fp8_e4m3, DType::fp8_e5m2}) {
    const std::string fp8_name = to_string(fp8);
    CAPTURE(fp8_name);
    Inputs as_fp8 = make_inputs(tree, DType::f16, 8);
    Inputs as_f16 = make_inputs(tree, DType::f16, 8);
    for (HostArray* a : {&as_fp8.k, &as_fp8.v}) {
      HostArray quantized(fp8, a->shape);
      for (std::size_t i = 0; i < std::size_t(a->numel()); ++i) {
        store_from_float(quantized.bytes.data(), fp8, i, load_as_float(a->bytes.data(), DType::f16, i));
      }
      *a = std::move(quantized);
    }
    for (auto [from, to] : {std::pair{&as_fp8.k, &as_f16.k}, std::pair{&as_fp8.v, &as_f16.v}}) {
      for (std::size_t i = 0; i < std::size_t(from->numel()); ++i) {
        store_from_float(to->bytes.data(), DType::f16, i, load_as_float(from->bytes.data(), fp8, i));
      }
    }
    const Outputs want = run_backend(*backend, tree, as_f16, PlanOptions{});
    const Outputs got = run_backend(*backend, tree, as_fp8, PlanOptions{});
    CHECK(got.o.bytes == want.o.bytes);
    CHECK(got.lse.bytes == want.lse.bytes);
  }
}

TEST_CASE("variants: options and dtypes that do not fit the call are rejected by name") {
  auto backend = make_test_backend();
  const Plan plan = treeattn::plan(bad_input_tree());
  HostArray q(DType::f16, {2, 4, 64}), k(DType::f16, {10, 2, 64}), o(DType::f32, {2, 4, 64});
  HostArray k8(DType::fp8_e4m3, {10, 2, 64}), v8(DType::fp8_e5m2, {10, 2, 64}), q32(DType::f32, {2, 4, 64});
  HostArray heads_q(DType::f32, {4}), heads_kv(DType::f32, {2}), wrong_length(DType::f32, {3}), f16_sinks(DType::f16, {4});
  auto expect_refused = [&](const AttentionArgs& args, const std::string& fragment) {
    CAPTURE(fragment);
    CHECK_THROWS_WITH_AS(backend->run(plan, args), doctest::Contains(fragment.c_str()), Error);
  };
  auto with = [&](AttentionOptions options, TensorRef kk, TensorRef vv) {
    return AttentionArgs{q.view(), kk, vv, o.view(), {}, options};
  };
  AttentionOptions sinks_short;
  sinks_short.sinks = wrong_length.view();
  expect_refused(with(sinks_short, k.view(), k.view()), "sinks is [3] f32, expected [4] (heads_q)");
  AttentionOptions sinks_f16;
  sinks_f16.sinks = f16_sinks.view();
  expect_refused(with(sinks_f16, k.view(), k.view()), "sinks must be f32, got f16");
  AttentionOptions negative_cap;
  negative_cap.logit_softcap = -1.0f;
  expect_refused(with(negative_cap, k.view(), k.view()), "logit_softcap = -1 must be finite and not negative");
  expect_refused(with({}, k8.view(), k.view()), "K and V must both be fp8 of one kind, got K fp8_e4m3 and V f16");
  expect_refused(with({}, k.view(), k8.view()), "K and V must both be fp8 of one kind, got K f16 and V fp8_e4m3");
  expect_refused(with({}, k8.view(), v8.view()), "K and V must both be fp8 of one kind, got K fp8_e4m3 and V fp8_e5m2");
  expect_refused(AttentionArgs{q32.view(), k8.view(), k8.view(), o.view(), {}, {}}, "Q must be f16 or bf16 with fp8_e4m3 K and V");
  AttentionOptions f16_scaled;
  f16_scaled.k_scale = 0.5f;
  expect_refused(with(f16_scaled, k.view(), k.view()), "k_scale dequantizes fp8 K and V; K and V are f16");
  AttentionOptions scales_short;
  scales_short.v_scales = wrong_length.view();
  expect_refused(with(scales_short, k8.view(), k8.view()), "v_scales is [3] f32, expected [2] (heads_kv)");
  AttentionOptions k_scales_short;
  k_scales_short.k_scales = wrong_length.view();
  expect_refused(with(k_scales_short, k8.view(), k8.view()), "k_scales is [3] f32, expected [2] (heads_kv)");
  HostArray f16_scales(DType::f16, {2});
  AttentionOptions k_scales_f16, v_scales_f16;
  k_scales_f16.k_scales = f16_scales.view();
  v_scales_f16.v_scales = f16_scales.view();
  expect_refused(with(k_scales_f16, k8.view(), k8.view()), "k_scales must be f32, got f16");
  expect_refused(with(v_scales_f16, k8.view(), k8.view()), "v_scales must be f32, got f16");
  AttentionOptions both;
  both.k_scale = 2.0f;
  both.k_scales = heads_kv.view();
  expect_refused(with(both, k8.view(), k8.view()), "give k_scale = 2 or k_scales per KV head, not both");
  AttentionOptions strided_sinks;
  strided_sinks.sinks = TensorRef{heads_q.bytes.data(), DType::f32, {4}, 2};  // checked before any read
  expect_refused(with(strided_sinks, k.view(), k.view()), "sinks is [4] f32 row stride 2: it must be dense");
  AttentionOptions zero_scale;
  zero_scale.v_scale = 0.0f;
  expect_refused(with(zero_scale, k8.view(), k8.view()), "v_scale = 0 must be positive and finite");
  // Per-head scales in host memory are read and checked (heads_kv's are 0 here).
  AttentionOptions zero_head;
  zero_head.k_scales = heads_kv.view();
  expect_refused(with(zero_head, k8.view(), k8.view()), "k_scales[0] = 0 must be positive and finite");
  HostArray nan_second(DType::f32, {2});
  store_from_float(nan_second.bytes.data(), DType::f32, 0, 1.0f);
  store_from_float(nan_second.bytes.data(), DType::f32, 1, std::nanf(""));
  AttentionOptions nan_head;
  nan_head.v_scales = nan_second.view();
  expect_refused(with(nan_head, k8.view(), k8.view()), "v_scales[1] = nan must be positive and finite");
  expect_refused(AttentionArgs{q.view(), k.view(), HostArray(DType::f16, {10, 2, 32}).view(), o.view(), {}, {}},
                 "V is [10, 2, 32] f16, expected [10, 2, 64] (the shape of K)");
}

TEST_CASE("variants: O and V of head_dim_v columns are checked against the plan's") {
  auto backend = make_test_backend();
  Tree tree({4, 2, 192, 0.0f, 128});
  tree.add_node_range(0, kNoParent, 0, 10);
  tree.add_query(0);
  const Plan plan = treeattn::plan(tree);
  HostArray q(DType::f16, {1, 4, 192}), k(DType::f16, {10, 2, 192}), v(DType::f16, {10, 2, 128});
  HostArray o_wide(DType::f32, {1, 4, 192});
  CHECK_THROWS_WITH_AS(backend->run(plan, AttentionArgs{q.view(), k.view(), k.view(), o_wide.view(), {}}),
                       doctest::Contains("V is [10, 2, 192] f16, expected [10, 2, 128] (K's slots, heads_kv, head_dim_v)"),
                       Error);
  CHECK_THROWS_WITH_AS(backend->run(plan, AttentionArgs{q.view(), k.view(), v.view(), o_wide.view(), {}}),
                       doctest::Contains("O is [1, 4, 192] f32, expected [1, 4, 128] (queries, heads_q, head_dim_v)"),
                       Error);
}
