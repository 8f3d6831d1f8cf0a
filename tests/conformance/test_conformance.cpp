// The backend conformance suite: compiled into every backend's test program,
// it runs against that program's make_test_backend(). The fp64 oracle never
// sees the plan.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <tuple>
#include <vector>

#include "support/conformance.hpp"
#include "support/oracle.hpp"
#include "treeattn/error.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;
using namespace treeattn::test;

namespace {
// The random forests the oracle checks run on: a few requests, some queries
// on part of their node, and every fourth seed tiles beyond 64 queries.
RandomForestOptions oracle_forest(std::uint64_t seed) {
  RandomForestOptions o;
  o.seed = seed;
  o.nodes = std::int32_t(5 + seed * 3);
  o.roots = std::int32_t(1 + seed % 3);
  o.queries = std::int32_t(seed % 4 == 0 ? 90 : 12);
  o.max_tokens = 48;
  o.upto_fraction = 0.3;
  o.heads = {4, 2, 64, 0.0f};
  return o;
}

// Runs the tree with f32 outputs, then with f16 and with bf16 outputs: each
// low-precision output must be bit for bit the host's rounding of the f32 one.
// Returns the f32 outputs.
Outputs check_outputs_round_like_host(Backend& backend, const Tree& tree, Inputs& in) {
  const Outputs f32 = run_backend(backend, tree, in, PlanOptions{});
  for (DType out_dtype : {DType::f16, DType::bf16}) {
    CAPTURE(to_string(out_dtype));
    const Outputs low = run_backend(backend, tree, in, PlanOptions{}, out_dtype);
    for (std::int64_t i = 0; i < f32.o.numel(); ++i) {
      float want;
      std::memcpy(&want, f32.o.bytes.data() + i * 4, 4);
      HostArray rounded(out_dtype, {1});
      store_from_float(rounded.bytes.data(), out_dtype, 0, want);
      CAPTURE(i);
      CAPTURE(want);
      REQUIRE(std::memcmp(low.o.bytes.data() + i * 2, rounded.bytes.data(), 2) == 0);
    }
  }
  return f32;
}
}  // namespace

TEST_CASE("conformance: every strategy matches the fp64 oracle on random forests (f16)") {
  auto backend = make_test_backend();
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    CAPTURE(seed);
    check_against_oracle(*backend, random_forest(oracle_forest(seed)), DType::f16, seed, 1.0f, seed % 2 ? 64 : 16,
                         seed % 3 ? 64 : 7);
  }
}

namespace {

// Every pool row that no query's `window` (0: its whole path) holds set to
// NaN in K and V; returns how many.
std::int64_t poison_unseen_rows(const Tree& tree, Inputs& in, std::int32_t window) {
  std::vector<char> seen(std::size_t(total_tokens(tree)), 0);
  for (std::size_t q = 0; q < tree.query_count(); ++q) {
    for (std::int64_t slot : visible_slots(tree, q, window)) seen[std::size_t(slot)] = 1;
  }
  const std::int64_t row = std::int64_t(tree.heads.heads_kv) * tree.heads.head_dim;
  std::int64_t unseen = 0;
  for (std::size_t slot = 0; slot < seen.size(); ++slot) {
    if (seen[slot]) continue;
    ++unseen;
    for (std::int64_t e = 0; e < row; ++e) {
      store_from_float(in.k.bytes.data(), in.k.dtype, std::size_t(std::int64_t(slot) * row + e), std::nanf(""));
      store_from_float(in.v.bytes.data(), in.v.dtype, std::size_t(std::int64_t(slot) * row + e), std::nanf(""));
    }
  }
  return unseen;
}

// Every strategy at blocks whose last tile is partly past their tokens, with
// the rows no query sees NaN, against the oracle.
void check_unseen_rows_change_nothing(const Tree& tree, std::int32_t window) {
  auto backend = make_test_backend();
  Inputs in = make_inputs(tree, DType::f16, 5);
  REQUIRE(poison_unseen_rows(tree, in, window) > 0);
  const OracleResult expected = oracle_attention(tree, in.q.view(), in.k.view(), in.v.view(), {}, window);
  for (Strategy s : all_strategies()) {
    for (std::int32_t block : {40, 64, 100}) {
      CAPTURE(to_string(s));
      CAPTURE(block);
      PlanOptions options{s, block};
      options.window = window;
      Outputs out = run_backend(*backend, tree, in, options);
      CHECK(max_abs_error(out.o.view(), expected.o) <= tolerance(DType::f16));
      CHECK(max_abs_error(out.lse.view(), expected.lse) <= tolerance(DType::f16));
    }
  }
}

RandomForestOptions partly_seen_forest() {
  RandomForestOptions o;
  o.seed = 21;
  o.nodes = 30;
  o.roots = 2;
  o.queries = 20;
  o.max_tokens = 40;
  o.upto_fraction = 0.5;  // tokens past a query's upto that no other query sees
  o.heads = {4, 2, 64, 0.0f};
  return o;
}

}  // namespace

TEST_CASE("conformance: pool rows no query sees hold NaN and change nothing (a tile past its item's end reads a row it sees)") {
  check_unseen_rows_change_nothing(random_forest(partly_seen_forest()), 0);
}

// Sliding windows reach the kernels through the plan alone: its segments
// leave out the tokens outside every window, its masks hold each query to
// its own (masks that need not be contiguous runs of a tile's bits).
TEST_CASE("conformance: sliding windows, every strategy matches the fp64 oracle (windows of 1 to 300 tokens)") {
  auto backend = make_test_backend();
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    CAPTURE(seed);
    RandomForestOptions o = oracle_forest(seed);
    o.chain_bias = 0.6;  // deep paths: windows end inside ancestors
    const Tree tree = random_forest(o);
    for (std::int32_t window : {1, 7, 40, 300}) {
      CAPTURE(window);
      check_against_oracle(*backend, tree, DType::f16, seed, 1.0f, seed % 2 ? 64 : 16, seed % 3 ? 64 : 7, window);
    }
  }
}

TEST_CASE("conformance: pool rows outside every window hold NaN and change nothing") {
  RandomForestOptions o = partly_seen_forest();
  o.chain_bias = 0.6;
  for (std::int32_t window : {3, 25}) {
    CAPTURE(window);
    check_unseen_rows_change_nothing(random_forest(o), window);
  }
}

TEST_CASE("conformance: GQA groups 1 to 16 and head_dim 64, 128, 256") {
  auto backend = make_test_backend();
  RandomForestOptions o;
  o.seed = 21;
  o.nodes = 10;
  o.queries = 6;
  o.max_tokens = 40;
  for (auto [hq, hkv, d] : {std::tuple{2, 2, 64}, std::tuple{8, 2, 128}, std::tuple{16, 2, 64}, std::tuple{16, 1, 256},
                            std::tuple{32, 8, 128}, std::tuple{32, 2, 128}}) {
    CAPTURE(hq);
    CAPTURE(hkv);
    CAPTURE(d);
    o.heads = {hq, hkv, d, 0.0f};
    check_against_oracle(*backend, random_forest(o), DType::f16, 5);
  }
}

TEST_CASE("conformance: groups of 3 and 5 query heads, whose queries straddle two 64-row passes") {
  auto backend = make_test_backend();
  for (auto [hq, hkv] : {std::pair{12, 4}, std::pair{40, 8}}) {
    CAPTURE(hq);
    Tree tree({hq, hkv, 64});
    tree.add_node_range(0, kNoParent, 0, 300);  // 30 queries share it: 90 or 150 rows
    for (int i = 0; i < 30; ++i) {
      tree.add_node_range(i + 1, 0, 300 + 20 * i, 20);
      tree.add_query(i + 1);
    }
    check_against_oracle(*backend, tree, DType::f16, 23);
  }
}

TEST_CASE("conformance: blocks of many 64-token tiles, up to a 1 320-token block, at every head_dim") {
  auto backend = make_test_backend();
  for (int d : kSupportedHeadDims) {
    CAPTURE(d);
    Tree tree({8, 2, d});
    tree.add_node_range(0, kNoParent, 0, 1250);  // 19 full KV tiles and a part
    tree.add_node_range(1, 0, 1250, 70);
    tree.add_query(0);
    tree.add_query(1);
    tree.add_query(1, 3);
    for (std::int32_t block_tokens : {250, 4096}) {  // four tiles a block; the whole tree in one block
      CAPTURE(block_tokens);
      check_against_oracle(*backend, tree, DType::f16, 11, 1.0f, block_tokens);
    }
  }
}

TEST_CASE("conformance: many queries on one block (tiles of 64, 16 query heads per KV head)") {
  auto backend = make_test_backend();
  Tree tree({16, 1, 128});
  tree.add_node_range(0, kNoParent, 0, 300);
  for (std::int64_t i = 0; i < 150; ++i) {
    tree.add_node_range(i + 1, 0, 300 + i, 1);
    tree.add_query(i + 1);
  }
  check_against_oracle(*backend, tree, DType::f16, 3, 1.0f, 256);
}

TEST_CASE("conformance: passes whose rows see little of their block (a deep tree, one query head per KV head)") {
  // 64 leaves under six levels of 16-token nodes, in blocks of 1 024 tokens:
  // each 64-query item sees the block, but each query only its path, so many
  // 16-row slices of a pass see nothing of a 32-token chunk (the coopmat
  // shader skips those chunks' math; checked here that the plan has them).
  auto backend = make_test_backend();
  const Tree tree = level_tree({2, 2, 64, 0.0f}, {1, 2, 4, 8, 16, 32, 64}, {16, 16, 16, 16, 16, 16, 16});
  PlanOptions options;
  options.block_tokens = 1024;
  const Plan plan = treeattn::plan(tree, options);
  const ItemTokenMap map = item_token_map(plan, 64);
  std::int64_t unseen = 0;
  for (std::int32_t item = 0; item < plan.num_items(); ++item) {
    const std::int32_t queries = plan.item_query_begin[std::size_t(item) + 1] - plan.item_query_begin[std::size_t(item)];
    for (std::int32_t chunk = 0; chunk * 32 < map.begin[std::size_t(item) + 1] - map.begin[std::size_t(item)]; ++chunk) {
      const std::size_t tile = std::size_t(map.begin[std::size_t(item)] / 64 + chunk / 2);
      for (std::int32_t q0 = 0; q0 < queries; q0 += 16) {
        std::uint64_t seen = 0;
        for (std::int32_t q = q0; q < std::min(queries, q0 + 16); ++q) seen |= map.visible[tile * 64 + std::size_t(q)];
        unseen += ((seen >> (chunk % 2 * 32)) & 0xffffffffull) == 0;
      }
    }
  }
  CHECK(unseen > 20);
  check_against_oracle(*backend, tree, DType::f16, 29, 1.0f, 1024);
}

TEST_CASE("conformance: a query merged from hundreds of partials") {
  auto backend = make_test_backend();
  Tree tree({4, 2, 64});
  tree.add_node_range(0, kNoParent, 0, 700);
  tree.add_query(0);
  tree.add_query(0, 333);
  check_against_oracle(*backend, tree, DType::f16, 17, 1.0f, 2);  // 350 blocks of 2 tokens
}

TEST_CASE("conformance: bf16 inputs and a custom scale") {
  auto backend = make_test_backend();
  RandomForestOptions o;
  o.seed = 4;
  o.nodes = 20;
  o.queries = 10;
  o.heads = {4, 1, 64, 0.3f};
  check_against_oracle(*backend, random_forest(o), DType::bf16, 8);
}

TEST_CASE("conformance: large-magnitude logits stay accurate (max-shifted softmax and merge)") {
  auto backend = make_test_backend();
  RandomForestOptions o;
  o.seed = 33;
  o.nodes = 25;
  o.queries = 15;
  o.max_tokens = 64;
  o.heads = {4, 2, 128, 0.0f};
  // Q in [-60, 60]: logits reach the hundreds; exp() without the max shift overflows.
  check_against_oracle(*backend, random_forest(o), DType::f16, 12, 60.0f, 16);
}

TEST_CASE("conformance: f16 and bf16 outputs are the rounded f32 outputs") {
  auto backend = make_test_backend();
  RandomForestOptions o;
  o.seed = 6;
  o.nodes = 12;
  o.queries = 8;
  const Tree tree = random_forest(o);
  Inputs in = make_inputs(tree, DType::f16, 3);
  check_outputs_round_like_host(*backend, tree, in);
}

TEST_CASE("conformance: f16 and bf16 outputs round like the host at the edges: subnormal, huge, overflowing") {
  // Each head dimension of V is scaled by one of these, so the outputs (averages
  // of V) span f16 subnormals, the largest finite values and, with bf16 inputs,
  // values that overflow f16 to infinity.
  auto backend = make_test_backend();
  RandomForestOptions o;
  o.seed = 11;
  o.nodes = 10;
  o.queries = 6;
  const Tree tree = random_forest(o);
  for (DType in_dtype : {DType::f16, DType::bf16}) {
    CAPTURE(to_string(in_dtype));
    const std::vector<float> scales = in_dtype == DType::f16
                                          ? std::vector<float>{3e-8f, 1e-6f, 4e-5f, 1.0f, 2e4f, 6e4f}
                                          : std::vector<float>{3e-8f, 1e-6f, 4e-5f, 1.0f, 6e4f, 7e4f, 1e5f, 1e30f};
    Inputs in = make_inputs(tree, in_dtype, 4);
    const std::int64_t head_dim = in.v.shape[2];
    for (std::int64_t i = 0; i < in.v.numel(); ++i) {
      const float scale = scales[std::size_t(i % head_dim) % scales.size()];
      // |v| <= 1 before scaling; f16 inputs keep below 65504.
      store_from_float(in.v.bytes.data(), in_dtype, std::size_t(i),
                       load_as_float(in.v.bytes.data(), in_dtype, std::size_t(i)) * scale);
    }
    const Outputs f32 = check_outputs_round_like_host(*backend, tree, in);
    int subnormal = 0, overflow = 0;
    for (std::int64_t i = 0; i < f32.o.numel(); ++i) {
      float want;
      std::memcpy(&want, f32.o.bytes.data() + i * 4, 4);
      subnormal += std::abs(want) > 0.0f && std::abs(want) < 6.1e-5f;
      overflow += std::abs(want) > 65520.0f;
    }
    CHECK(subnormal > 0);  // the test reaches the cases it is about
    if (in_dtype == DType::bf16) CHECK(overflow > 0);
  }
}

TEST_CASE("conformance: the same inputs give bitwise the same output, run after run") {
  auto backend = make_test_backend();
  const Tree tree = determinism_forest();
  Inputs in = make_inputs(tree, DType::f16, 1);
  for (Strategy s : {Strategy::flatten, Strategy::sequence}) {
    const Outputs first = run_backend(*backend, tree, in, PlanOptions{s, 32, kMaxQueryTile, 0});
    for (int run = 0; run < 3; ++run) {
      const Outputs again = run_backend(*backend, tree, in, PlanOptions{s, 32, kMaxQueryTile, 0});
      CHECK(again.o.bytes == first.o.bytes);
      CHECK(again.lse.bytes == first.lse.bytes);
    }
  }
}

TEST_CASE("conformance: two threads, each planning and running on its own backend, give bitwise one thread's output") {
  // Backends (contexts) are one per thread; the planner is re-entrant.
  const Tree tree = determinism_forest();
  Inputs in = make_inputs(tree, DType::f16, 5);
  const Outputs alone = run_backend(*make_test_backend(), tree, in, PlanOptions{Strategy::flatten, 32, kMaxQueryTile, 0});
  std::vector<Outputs> got(2 * 4);
  auto worker = [&](int t) {
    auto backend = make_test_backend();
    Inputs mine = in;
    for (int r = 0; r < 4; ++r) got[std::size_t(t * 4 + r)] = run_backend(*backend, tree, mine, PlanOptions{Strategy::flatten, 32, kMaxQueryTile, 0});
  };
  std::thread first(worker, 0), second(worker, 1);
  first.join();
  second.join();
  for (const Outputs& o : got) {
    CHECK(o.o.bytes == alone.o.bytes);
    CHECK(o.lse.bytes == alone.lse.bytes);
  }
}

TEST_CASE("conformance: a plan whose partials are numbered in another valid order gives bitwise the same output") {
  // The planner numbers partials query by query (merge_partial 0, 1, 2, ...),
  // which the CUDA and Vulkan merges rely on; a plan numbered otherwise (here
  // the queries' ranges in reverse) is renumbered by the lowering at upload
  // (engine/src/lowering.hpp) and must give the same bits.
  auto backend = make_test_backend();
  const Tree tree = determinism_forest();
  Inputs in = make_inputs(tree, DType::f16, 4);
  const Plan planned = treeattn::plan(tree, PlanOptions{Strategy::flatten, 32, kMaxQueryTile, 0});
  std::int32_t fan_in = 0;
  for (std::size_t q = 0; q + 1 < planned.merge_begin.size(); ++q) {
    fan_in = std::max(fan_in, planned.merge_begin[q + 1] - planned.merge_begin[q]);
  }
  REQUIRE(fan_in > 8);  // the Vulkan merge's steps of eight and of four, and more than one, on both paths
  Plan renumbered = planned;
  std::vector<std::int32_t> new_slot(std::size_t(planned.num_partials));
  std::int32_t next = 0;
  for (std::int32_t q = planned.num_queries - 1; q >= 0; --q) {
    for (std::int32_t m = planned.merge_begin[std::size_t(q)]; m < planned.merge_begin[std::size_t(q) + 1]; ++m) {
      new_slot[std::size_t(planned.merge_partial[std::size_t(m)])] = next++;
    }
  }
  for (std::int32_t& slot : renumbered.merge_partial) slot = new_slot[std::size_t(slot)];
  for (std::int32_t& slot : renumbered.tile_partial) {
    if (slot != kDirect) slot = new_slot[std::size_t(slot)];
  }
  validate(renumbered);
  REQUIRE(renumbered.merge_partial != planned.merge_partial);
  REQUIRE(planned.merge_in_order());  // the second plan is renumbered, the first is not
  REQUIRE_FALSE(renumbered.merge_in_order());
  const Outputs expected = run_plan(*backend, tree, in, planned);
  const Outputs got = run_plan(*backend, tree, in, renumbered);
  CHECK(got.o.bytes == expected.o.bytes);
  CHECK(got.lse.bytes == expected.lse.bytes);
}

TEST_CASE("conformance: a plan launched in another order gives bitwise the same output") {
  // Plan::launch_order changes which passes a backend starts first, never what
  // they compute: here the blocks in reverse, and a plan of several items a
  // block (two queries an item) in reverse too.
  auto backend = make_test_backend();
  const Tree tree = determinism_forest();
  Inputs in = make_inputs(tree, DType::f16, 4);
  for (std::int32_t query_tile : {kMaxQueryTile, 2}) {
    CAPTURE(query_tile);
    const Plan planned = treeattn::plan(tree, PlanOptions{Strategy::flatten, 32, query_tile, 0});
    REQUIRE(planned.launch_order.empty());
    REQUIRE(planned.num_blocks() > 1);
    Plan reversed = planned;
    for (std::int32_t b = planned.num_blocks() - 1; b >= 0; --b) {
      for (std::int32_t i = 0; i < planned.num_items(); ++i) {
        if (planned.item_block[std::size_t(i)] == b) reversed.launch_order.push_back(i);
      }
    }
    validate(reversed);
    const Outputs expected = run_plan(*backend, tree, in, planned);
    const Outputs got = run_plan(*backend, tree, in, reversed);
    CHECK(got.o.bytes == expected.o.bytes);
    CHECK(got.lse.bytes == expected.lse.bytes);
  }
}

TEST_CASE("conformance: tensors that do not match the plan are rejected by name") {
  auto backend = make_test_backend();
  const Plan plan = treeattn::plan(bad_input_tree());
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
  run_with(HostArray(DType::bf16, {2, 4, 64}), k, k, o, lse, "share one dtype");
  run_with(q, k, k, HostArray(DType::f32, {2, 4, 32}), lse, "O is [2, 4, 32]");
  run_with(q, k, k, o, HostArray(DType::f16, {2, 4}), "LSE must be f32");
}
