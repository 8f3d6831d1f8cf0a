#include "support/conformance.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "support/oracle.hpp"
#include "treeattn/error.hpp"
#include "treeattn/workloads.hpp"

namespace treeattn::test {

double tolerance(DType inputs) {
  switch (inputs) {
    case DType::f16: return 2e-3;
    case DType::bf16: return 1e-2;
    case DType::f32: return 1e-5;
  }
  return 0.0;
}

Tree determinism_forest() {
  RandomForestOptions o;
  o.seed = 77;
  o.nodes = 150;
  o.roots = 4;
  o.queries = 200;
  o.heads = {8, 2, 64, 0.0f};
  return random_forest(o);
}

Tree bad_input_tree() {
  Tree tree({4, 2, 64});
  tree.add_node_range(0, kNoParent, 0, 10);
  tree.add_query(0);
  tree.add_query(0, 4);
  return tree;
}

AttentionOptions Inputs::options() {
  AttentionOptions o;
  o.logit_softcap = logit_softcap;
  o.k_scale = k_scale;
  o.v_scale = v_scale;
  auto view_or_none = [](HostArray& a) { return a.bytes.empty() ? TensorRef{} : a.view(); };
  o.sinks = view_or_none(sinks);
  o.k_scales = view_or_none(k_scales);
  o.v_scales = view_or_none(v_scales);
  return o;
}

Inputs make_inputs(const Tree& tree, DType dtype, std::uint64_t seed, float q_amplitude) {
  const HeadConfig& h = tree.heads;
  const std::int64_t slots = std::max<std::int64_t>(total_tokens(tree), 1);
  return {random_array(dtype, {std::int64_t(tree.query_count()), h.heads_q, h.head_dim}, seed, q_amplitude),
          random_array(dtype, {slots, h.heads_kv, h.head_dim}, seed + 1),
          random_array(dtype, {slots, h.heads_kv, h.value_dim()}, seed + 2)};
}

std::vector<Variant> all_variants() {
  std::vector<Variant> v;
  for (DType fp8 : {DType::fp8_e4m3, DType::fp8_e5m2}) {
    for (bool per_head : {false, true}) {
      v.push_back({per_head ? (fp8 == DType::fp8_e4m3 ? "fp8_e4m3 per-head scales" : "fp8_e5m2 per-head scales")
                            : (fp8 == DType::fp8_e4m3 ? "fp8_e4m3 per-tensor scales" : "fp8_e5m2 per-tensor scales"),
                   fp8, per_head});
    }
  }
  v.push_back({"sinks", DType::f16, false, true});
  v.push_back({"soft-cap 5", DType::f16, false, false, 5.0f});
  v.push_back({"sinks + soft-cap 5", DType::f16, false, true, 5.0f});
  v.push_back({"fp8_e4m3 + sinks + soft-cap 30", DType::fp8_e4m3, true, true, 30.0f});
  return v;
}

Inputs make_variant_inputs(const Tree& tree, const Variant& variant, std::uint64_t seed) {
  // Scores of a few units (q_amplitude 2) so that a soft-cap of 5 bends them.
  Inputs in = make_inputs(tree, DType::f16, seed, 2.0f);
  const HeadConfig& h = tree.heads;
  in.logit_softcap = variant.logit_softcap;
  if (variant.sinks) {
    in.sinks = random_array(DType::f32, {h.heads_q}, seed + 3, 3.0f);
    for (std::int64_t i = 0; i < h.heads_q; ++i) {
      store_from_float(in.sinks.bytes.data(), DType::f32, std::size_t(i), load_as_float(in.sinks.bytes.data(), DType::f32, std::size_t(i)) + 1.0f);
    }
  }
  if (!is_fp8(variant.kv)) return in;
  // K and V stored as fp8 of (the f16 draw / its scale): the dequantized
  // values are the draw to fp8's precision, and the scales matter.
  std::vector<float> k_scale(std::size_t(h.heads_kv), 0.05f), v_scale(std::size_t(h.heads_kv), 0.02f);
  if (variant.per_head_scales) {
    for (std::size_t head = 0; head < k_scale.size(); ++head) {
      k_scale[head] = 0.01f * float(head + 2);
      v_scale[head] = 0.03f / float(head + 1);
    }
    in.k_scales = HostArray(DType::f32, {h.heads_kv});
    in.v_scales = HostArray(DType::f32, {h.heads_kv});
    std::memcpy(in.k_scales.bytes.data(), k_scale.data(), k_scale.size() * 4);
    std::memcpy(in.v_scales.bytes.data(), v_scale.data(), v_scale.size() * 4);
  } else {
    in.k_scale = k_scale[0];
    in.v_scale = v_scale[0];
  }
  auto quantize = [&](const HostArray& draw, const std::vector<float>& scale) {
    HostArray out(variant.kv, draw.shape);
    const std::size_t row = std::size_t(draw.shape[2]);
    for (std::size_t i = 0; i < std::size_t(draw.numel()); ++i) {
      const std::size_t head = i / row % scale.size();
      store_from_float(out.bytes.data(), variant.kv, i, load_as_float(draw.bytes.data(), draw.dtype, i) / scale[head]);
    }
    return out;
  };
  in.k = quantize(in.k, k_scale);
  in.v = quantize(in.v, v_scale);
  return in;
}

Outputs run_backend(Backend& backend, const Tree& tree, Inputs& in, const PlanOptions& options, DType out_dtype) {
  return run_plan(backend, tree, in, treeattn::plan(tree, options), out_dtype);
}

Outputs run_plan(Backend& backend, const Tree& tree, Inputs& in, const Plan& plan, DType out_dtype) {
  const HeadConfig& h = tree.heads;
  const std::int64_t nq = std::int64_t(tree.query_count());
  Outputs out{HostArray(out_dtype, {nq, h.heads_q, h.value_dim()}), HostArray(DType::f32, {nq, h.heads_q})};
  backend.run(plan, AttentionArgs{in.q.view(), in.k.view(), in.v.view(), out.o.view(), out.lse.view(), in.options()});
  return out;
}

void check_against_oracle(Backend& backend, const Tree& tree, DType dtype, std::uint64_t seed, float q_amplitude,
                          std::int32_t block_tokens, std::int32_t query_tile, std::int32_t window) {
  Inputs in = make_inputs(tree, dtype, seed, q_amplitude);
  check_inputs_against_oracle(backend, tree, in, tolerance(dtype), block_tokens, query_tile, window);
}

void check_inputs_against_oracle(Backend& backend, const Tree& tree, Inputs& in, double tolerance,
                                 std::int32_t block_tokens, std::int32_t query_tile, std::int32_t window) {
  const OracleResult expected = oracle_attention(tree, in.q.view(), in.k.view(), in.v.view(), in.options(), window);
  for (Strategy s : all_strategies()) {
    CAPTURE(to_string(s));
    PlanOptions options{s, block_tokens, query_tile, 0};
    options.window = window;
    Outputs out = run_backend(backend, tree, in, options);
    CHECK(max_abs_error(out.o.view(), expected.o) <= tolerance);
    CHECK(max_abs_error(out.lse.view(), expected.lse) <= tolerance);
  }
}

void check_timed_layers_match_run(Backend& backend) {
  RandomForestOptions o;
  o.seed = 9;
  o.nodes = 60;
  o.queries = 40;
  o.heads = {32, 8, 128, 0.0f};
  const Tree tree = random_forest(o);
  Inputs in = make_inputs(tree, DType::f16, 2);
  const Outputs direct = run_backend(backend, tree, in, PlanOptions{});
  const Plan plan = treeattn::plan(tree);
  HostArray out(DType::f32, direct.o.shape);
  const std::vector<double> us =
      backend.time_layers(plan, AttentionArgs{in.q.view(), in.k.view(), in.v.view(), out.view(), {}}, 4, 3);
  REQUIRE(us.size() == 3);
  for (double t : us) CHECK(t > 0.0);
  CHECK(out.bytes == direct.o.bytes);
}

void check_head_split_is_bitwise(Backend& backend) {
  RandomForestOptions o;
  o.seed = 17;
  o.nodes = 40;
  o.queries = 24;
  o.max_tokens = 60;
  o.heads = {8, 4, 64, 0.0f};
  const Tree whole = random_forest(o);
  Inputs in = make_inputs(whole, DType::f16, 6);
  const PlanOptions options{Strategy::flatten, 64};
  const Outputs reference = run_backend(backend, whole, in, options);

  const HeadConfig& h = whole.heads;
  const std::int64_t nq = std::int64_t(whole.query_count()), slots = in.k.shape[0];
  Tree half = whole;
  half.heads = {h.heads_q / 2, h.heads_kv / 2, h.head_dim, 0.0f};
  const Plan plan = treeattn::plan(half, options);
  HostArray o_whole(DType::f32, {nq, h.heads_q, h.head_dim});
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    auto heads_of = [&](HostArray& a, std::int64_t heads, std::int64_t rows) {
      const std::int64_t first = rank * heads / 2;
      return TensorRef{a.bytes.data() + first * h.head_dim * std::int64_t(dtype_size(a.dtype)), a.dtype,
                       {rows, heads / 2, h.head_dim}, heads * h.head_dim};
    };
    HostArray lse(DType::f32, {nq, h.heads_q / 2});
    backend.run(plan, AttentionArgs{heads_of(in.q, h.heads_q, nq), heads_of(in.k, h.heads_kv, slots),
                                    heads_of(in.v, h.heads_kv, slots), heads_of(o_whole, h.heads_q, nq), lse.view()});
    for (std::int64_t q = 0; q < nq; ++q) {
      CAPTURE(q);
      const std::size_t at = std::size_t((q * h.heads_q + rank * h.heads_q / 2) * 4);
      CHECK(std::memcmp(lse.bytes.data() + q * h.heads_q / 2 * 4, reference.lse.bytes.data() + at,
                        std::size_t(h.heads_q / 2 * 4)) == 0);
    }
  }
  CHECK(o_whole.bytes == reference.o.bytes);
}

}  // namespace treeattn::test
