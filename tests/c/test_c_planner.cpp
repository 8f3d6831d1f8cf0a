// The C API's planner (treeattn_planner_*) on the CPU backend: decode replays
// with growth, forks, pruning, paged nodes and partial queries, every step
// against a from-scratch plan and the fp64 oracle; and its bad input.

#include <doctest/doctest.h>

#include <cstddef>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "support/c_replay.hpp"
#include "support/c_tensor.hpp"

using namespace treeattn::test;

namespace {

treeattn_context* cpu_context() {
  treeattn_context_options options;
  treeattn_context_options_init(&options);
  options.backend = TREEATTN_BACKEND_CPU;
  options.threads = 2;
  treeattn_context* context = nullptr;
  REQUIRE_MESSAGE(treeattn_context_create(&options, &context) == TREEATTN_OK, treeattn_last_error());
  return context;
}

std::string last_error() { return treeattn_last_error(); }

// A tree of heads 4/2/64: root `id` on slots 0 .. tokens - 1, one query on all of it.
treeattn_tree* one_node_tree(std::int64_t id, std::int64_t tokens) {
  treeattn_tree* tree = nullptr;
  REQUIRE(treeattn_tree_create(4, 2, 64, 0.0f, &tree) == TREEATTN_OK);
  REQUIRE(treeattn_tree_add_node_range(tree, id, -1, 0, tokens) == TREEATTN_OK);
  REQUIRE(treeattn_tree_add_query(tree, id, -1) == TREEATTN_OK);
  return tree;
}

}  // namespace

TEST_CASE("C planner replay: bitwise updates equal from-scratch plans, every strategy") {
  treeattn_context* context = cpu_context();
  for (treeattn_strategy s : {TREEATTN_STRATEGY_FLATTEN, TREEATTN_STRATEGY_NODE, TREEATTN_STRATEGY_NODE_CHUNK,
                              TREEATTN_STRATEGY_SEQUENCE, TREEATTN_STRATEGY_CASCADE, TREEATTN_STRATEGY_GREEDY}) {
    CAPTURE(int(s));
    CReplayOptions options;
    options.strategy = s;
    const int held = check_c_planner_replay(context, call_on_host, options);
    if (s != TREEATTN_STRATEGY_GREEDY) CHECK(held == 0);
  }
  treeattn_context_destroy(context);
}

TEST_CASE("C planner replay: held layouts stay within rounding of from-scratch plans") {
  treeattn_context* context = cpu_context();
  for (treeattn_strategy s : {TREEATTN_STRATEGY_FLATTEN, TREEATTN_STRATEGY_GREEDY}) {
    CAPTURE(int(s));
    CReplayOptions options;
    options.strategy = s;
    options.bitwise_updates = false;
    const int held = check_c_planner_replay(context, call_on_host, options);
    // Flatten keeps its blocks over the steps of appends alone; greedy keeps
    // edges only where its model chose its own layout, which these trees do not.
    if (s == TREEATTN_STRATEGY_FLATTEN) CHECK(held > 0);
  }
  treeattn_context_destroy(context);
}

TEST_CASE("C planner replay under a sliding window: no layout held, every strategy against the windowed oracle") {
  treeattn_context* context = cpu_context();
  for (treeattn_strategy s : {TREEATTN_STRATEGY_FLATTEN, TREEATTN_STRATEGY_SEQUENCE, TREEATTN_STRATEGY_GREEDY}) {
    for (std::int32_t window : {1, 20}) {
      CAPTURE(int(s));
      CAPTURE(window);
      CReplayOptions options;
      options.strategy = s;
      options.bitwise_updates = false;  // a window holds no layout all the same
      options.window = window;
      CHECK(check_c_planner_replay(context, call_on_host, options) == 0);
    }
  }
  treeattn_context_destroy(context);
}

TEST_CASE("C plan options: a window plans it; a struct_size from before `window` plans none") {
  treeattn_context* context = cpu_context();
  treeattn_tree* tree = one_node_tree(5, 10);
  // The same node's last three tokens alone: what a window of 3 leaves its query.
  treeattn_tree* last_three = nullptr;
  REQUIRE(treeattn_tree_create(4, 2, 64, 0.0f, &last_three) == TREEATTN_OK);
  REQUIRE(treeattn_tree_add_node_range(last_three, 5, -1, 7, 3) == TREEATTN_OK);
  REQUIRE(treeattn_tree_add_query(last_three, 5, -1) == TREEATTN_OK);
  treeattn::Tree twin({4, 2, 64});  // for the inputs: K and V rows 0..9
  twin.add_node_range(5, treeattn::kNoParent, 0, 10);
  twin.add_query(5);
  Inputs in = make_inputs(twin, treeattn::DType::f16, 3);
  auto output = [&](const treeattn_tree* planned, const treeattn_plan_options* options) {
    treeattn_plan* plan = nullptr;
    REQUIRE_MESSAGE(treeattn_plan_create(context, planned, options, &plan) == TREEATTN_OK, treeattn_last_error());
    Outputs out{treeattn::HostArray(treeattn::DType::f32, {1, 4, 64}), treeattn::HostArray(treeattn::DType::f32, {1, 4})};
    call_on_host(context, plan, in, out);
    treeattn_plan_destroy(plan);
    return out.o.bytes;
  };
  treeattn_plan_options windowed;
  treeattn_plan_options_init(&windowed);
  windowed.window = 3;
  treeattn_plan_options older = windowed;
  older.struct_size = offsetof(treeattn_plan_options, window);  // a caller built before the field
  const auto whole = output(tree, nullptr);
  CHECK(output(tree, &older) == whole);
  CHECK(output(tree, &windowed) == output(last_three, nullptr));
  CHECK(output(tree, &windowed) != whole);
  treeattn_tree_destroy(last_three);
  treeattn_tree_destroy(tree);
  treeattn_context_destroy(context);
}

// kv_dtype guides the device model's choices only (the engine's test_greedy
// checks that fp8 plans with its fp8 terms): an fp8 kind plans, and so does a
// caller built before the field; an unknown dtype is refused by name.
TEST_CASE("C plan options: kv_dtype is read, and an unknown one is refused naming it") {
  treeattn_context* context = cpu_context();
  treeattn_tree* tree = one_node_tree(5, 10);
  treeattn_plan_options fp8;
  treeattn_plan_options_init(&fp8);
  CHECK(fp8.kv_dtype == TREEATTN_DTYPE_F16);
  fp8.kv_dtype = TREEATTN_DTYPE_FP8_E4M3;
  treeattn_plan* plan = nullptr;
  CHECK(treeattn_plan_create(context, tree, &fp8, &plan) == TREEATTN_OK);
  treeattn_plan_destroy(plan);
  treeattn_plan_options older = fp8;
  older.struct_size = offsetof(treeattn_plan_options, kv_dtype);  // a caller built before the field
  int unknown = 9;  // what a C caller may store in an enum field; unread before the field
  std::memcpy(&older.kv_dtype, &unknown, sizeof unknown);
  plan = nullptr;
  CHECK(treeattn_plan_create(context, tree, &older, &plan) == TREEATTN_OK);
  treeattn_plan_destroy(plan);
  treeattn_plan_options bad = fp8;
  std::memcpy(&bad.kv_dtype, &unknown, sizeof unknown);
  plan = nullptr;
  CHECK(treeattn_plan_create(context, tree, &bad, &plan) == TREEATTN_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("treeattn_plan_options.kv_dtype: unknown dtype 9") != std::string::npos);
  CHECK(plan == nullptr);
  treeattn_planner* planner = nullptr;
  CHECK(treeattn_planner_create(context, tree, &bad, &planner) == TREEATTN_ERROR_INVALID_ARGUMENT);
  CHECK(planner == nullptr);
  treeattn_tree_destroy(tree);
  treeattn_context_destroy(context);
}

TEST_CASE("C planner: bad input names what is wrong") {
  treeattn_context* context = cpu_context();
  treeattn_tree* tree = one_node_tree(5, 10);

  treeattn_planner* planner = nullptr;
  CHECK(treeattn_planner_create(context, nullptr, nullptr, &planner) == TREEATTN_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("initial") != std::string::npos);
  CHECK(treeattn_planner_create(nullptr, tree, nullptr, &planner) == TREEATTN_ERROR_INVALID_ARGUMENT);
  treeattn_plan_options bad;
  treeattn_plan_options_init(&bad);
  int strategy = -1;  // what a C caller may store in an enum field
  std::memcpy(&bad.strategy, &strategy, sizeof strategy);
  CHECK(treeattn_planner_create(context, tree, &bad, &planner) == TREEATTN_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("strategy is -1") != std::string::npos);
  treeattn_plan_options negative_window;
  treeattn_plan_options_init(&negative_window);
  negative_window.window = -2;
  CHECK(treeattn_planner_create(context, tree, &negative_window, &planner) == TREEATTN_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("window = -2 is negative") != std::string::npos);
  treeattn_plan* refused = nullptr;
  CHECK(treeattn_plan_create(context, tree, &negative_window, &refused) == TREEATTN_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("window = -2 is negative") != std::string::npos);
  CHECK(refused == nullptr);

  REQUIRE(treeattn_planner_create(context, tree, nullptr, &planner) == TREEATTN_OK);
  treeattn_tree_destroy(tree);
  const treeattn_plan* plan = nullptr;
  REQUIRE(treeattn_planner_update(planner, &plan) == TREEATTN_OK);
  CHECK(treeattn_plan_num_queries(plan) == 1);
  treeattn_plan_destroy(const_cast<treeattn_plan*>(plan));  // a planner's plan: left alone
  CHECK(treeattn_plan_num_queries(plan) == 1);

  CHECK(treeattn_planner_add_node_range(planner, 6, 42, 10, 3) == TREEATTN_OK);  // a parent is checked at the update
  CHECK(treeattn_planner_update(planner, &plan) == TREEATTN_ERROR_INVALID_TREE);
  CHECK(last_error().find("parent 42") != std::string::npos);
  REQUIRE(treeattn_planner_remove_node(planner, 6) == TREEATTN_OK);  // the pending change taken back
  CHECK(treeattn_planner_add_node_range(planner, 5, -1, 10, 3) == TREEATTN_ERROR_INVALID_TREE);
  CHECK(last_error().find("node id 5") != std::string::npos);
  CHECK(treeattn_planner_add_node(planner, 7, 5, nullptr, 2) == TREEATTN_ERROR_INVALID_ARGUMENT);
  CHECK(treeattn_planner_add_node(planner, 7, 5, nullptr, -1) == TREEATTN_ERROR_INVALID_TREE);
  const std::int64_t nodes[] = {5, 77};
  CHECK(treeattn_planner_set_queries(planner, nodes, nullptr, 2) == TREEATTN_OK);
  CHECK(treeattn_planner_update(planner, &plan) != TREEATTN_OK);  // query on node 77, named at the update
  CHECK(last_error().find("77") != std::string::npos);
  CHECK(treeattn_planner_set_queries(planner, nodes, nullptr, 1) == TREEATTN_OK);
  CHECK(treeattn_planner_append_range(planner, 5, -4, 1) == TREEATTN_OK);  // slots are checked at the update
  CHECK(treeattn_planner_update(planner, &plan) == TREEATTN_ERROR_INVALID_TREE);
  CHECK(last_error().find("node 5") != std::string::npos);
  CHECK(treeattn_planner_update(nullptr, &plan) == TREEATTN_ERROR_INVALID_ARGUMENT);
  treeattn_planner_destroy(planner);
  treeattn_planner_destroy(nullptr);

  // A node on pages of size 0 is refused as it is added: a planner made from
  // the tree copied it as a listed node of tokens it did not have.
  treeattn_tree* paged = nullptr;
  REQUIRE(treeattn_tree_create(4, 2, 64, 0.0f, &paged) == TREEATTN_OK);
  const std::int64_t pages[] = {3, 4};
  CHECK(treeattn_tree_add_node_pages(paged, 1, -1, pages, 2, 0, 9) == TREEATTN_ERROR_INVALID_TREE);
  CHECK(last_error().find("node 1: page_size 0 must be positive") != std::string::npos);
  REQUIRE(treeattn_planner_create(context, paged, nullptr, &planner) == TREEATTN_OK);
  treeattn_planner_destroy(planner);
  treeattn_tree_destroy(paged);

  // A struct_size that ends inside a field is refused: its low bytes alone
  // made threads = -1 into 65535 threads.
  treeattn_context_options partial;
  treeattn_context_options_init(&partial);
  partial.backend = TREEATTN_BACKEND_CPU;
  partial.threads = -1;
  partial.struct_size = offsetof(treeattn_context_options, threads) + 2;
  treeattn_context* wrong = nullptr;
  CHECK(treeattn_context_create(&partial, &wrong) == TREEATTN_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("must end at a field's end") != std::string::npos);
  CHECK(wrong == nullptr);
  partial.struct_size = offsetof(treeattn_context_options, threads);  // an older caller's: threads takes its default
  REQUIRE(treeattn_context_create(&partial, &wrong) == TREEATTN_OK);
  treeattn_context_destroy(wrong);
  treeattn_plan_options mid;
  treeattn_plan_options_init(&mid);
  mid.struct_size = offsetof(treeattn_plan_options, block_tokens) + 1;
  treeattn_tree* small = nullptr;
  REQUIRE(treeattn_tree_create(4, 2, 64, 0.0f, &small) == TREEATTN_OK);
  CHECK(treeattn_planner_create(context, small, &mid, &planner) == TREEATTN_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("treeattn_plan_options.struct_size is 13") != std::string::npos);
  treeattn_tree_destroy(small);

  // graph-stable workspaces are CUDA's
  treeattn_tree* one = one_node_tree(0, 10);
  treeattn_plan* whole = nullptr;
  REQUIRE(treeattn_plan_create(context, one, nullptr, &whole) == TREEATTN_OK);
  const treeattn_plan* plans[] = {whole};
  CHECK(treeattn_context_graph_stable(context, plans, 1, 1.0) == TREEATTN_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("CUDA") != std::string::npos);
  CHECK(treeattn_context_graph_stable(context, plans, 0, 1.0) == TREEATTN_ERROR_INVALID_ARGUMENT);
  CHECK(treeattn_upload(context, whole, nullptr) == TREEATTN_ERROR_INVALID_ARGUMENT);
  // A strided tensor whose rows would hold more elements than an int64 counts, and a negative dimension.
  std::uint16_t cell[16] = {};
  treeattn_tensor huge = treeattn::test::c_tensor(cell, TREEATTN_DTYPE_F16, 3, 1, std::int64_t(1) << 40, std::int64_t(1) << 40);
  huge.strides[0] = 8;
  huge.strides[1] = std::int64_t(1) << 40;
  huge.strides[2] = 1;
  float out[16] = {};
  const treeattn_tensor o = treeattn::test::c_tensor(out, TREEATTN_DTYPE_F32, 3, 1, 4, 64);
  CHECK(treeattn_run(context, whole, &huge, &huge, &huge, &o, nullptr) == TREEATTN_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("more elements than an int64 counts") != std::string::npos);
  treeattn_tensor negative = treeattn::test::c_tensor(cell, TREEATTN_DTYPE_F16, 3, 1, -4, 64);
  CHECK(treeattn_run(context, whole, &negative, &negative, &negative, &o, nullptr) == TREEATTN_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("shape[1] is -4") != std::string::npos);
  treeattn_plan_destroy(whole);
  treeattn_tree_destroy(one);
  treeattn_context_destroy(context);
}

TEST_CASE("C run: K and V rows, and row strides, whose bytes an int64 cannot count are refused") {
  treeattn_context* context = cpu_context();
  treeattn_tree* tree = one_node_tree(0, 4);
  treeattn_plan* plan = nullptr;
  REQUIRE(treeattn_plan_create(context, tree, nullptr, &plan) == TREEATTN_OK);
  std::vector<std::uint16_t> q(4 * 64), kv(4 * 2 * 64);
  std::vector<float> o(4 * 64);
  const treeattn_tensor tq = c_tensor(q.data(), TREEATTN_DTYPE_F16, 3, 1, 4, 64);
  const treeattn_tensor to = c_tensor(o.data(), TREEATTN_DTYPE_F32, 3, 1, 4, 64);
  // A KV pool may have more rows than the tree reads, but not more than int64 bytes.
  const std::int64_t huge = std::numeric_limits<std::int64_t>::max();
  const treeattn_tensor tk = c_tensor(kv.data(), TREEATTN_DTYPE_F16, 3, huge, 2, 64);
  CHECK(treeattn_run(context, plan, &tq, &tk, &tk, &to, nullptr) == TREEATTN_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("K is [9223372036854775807, 2, 64] f16: 9223372036854775807 rows 128 elements apart exceed") !=
        std::string::npos);
  const treeattn_tensor dense_k = c_tensor(kv.data(), TREEATTN_DTYPE_F16, 3, 4, 2, 64);
  CHECK(treeattn_run(context, plan, &tq, &dense_k, &dense_k, &to, nullptr) == TREEATTN_OK);
  treeattn_tensor strided_k = dense_k;
  strided_k.strides[0] = huge / 2;
  strided_k.strides[1] = 64;
  strided_k.strides[2] = 1;
  CHECK(treeattn_run(context, plan, &tq, &strided_k, &dense_k, &to, nullptr) == TREEATTN_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("K is [4, 2, 64] f16 row stride 4611686018427387903: 4 rows") != std::string::npos);
  treeattn_plan_destroy(plan);
  treeattn_tree_destroy(tree);
  treeattn_context_destroy(context);
}
