// Every way a tree can be wrong is rejected with a message that names the node
// or query, the value and the limit.

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>

#include "treeattn/error.hpp"
#include "treeattn/planner.hpp"

using namespace treeattn;

namespace {

Tree base() {
  Tree tree({8, 2, 64});
  tree.add_node_range(10, kNoParent, 0, 4);
  tree.add_node(11, 10, {4, 5, 6});
  tree.add_query(11);
  return tree;
}

void expect_rejected(const Tree& tree, std::initializer_list<const char*> fragments, std::int64_t kv_slots = 0) {
  try {
    (void)plan(tree, PlanOptions{Strategy::flatten, 256, kMaxQueryTile, kv_slots});
    FAIL("plan() accepted an invalid tree");
  } catch (const Error& e) {
    CHECK(e.category() == ErrorCategory::InvalidTree);
    for (const char* f : fragments) CHECK_MESSAGE(std::string(e.what()).find(f) != std::string::npos, e.what());
  }
}

}  // namespace

TEST_CASE("the base tree is valid") { CHECK_NOTHROW(plan(base(), PlanOptions{Strategy::flatten, 256, kMaxQueryTile, 7})); }

TEST_CASE("head configuration") {
  for (auto [hq, hkv, d, fragment] : {std::tuple{0, 1, 64, "heads_q = 0"}, std::tuple{8, 0, 64, "heads_kv = 0"},
                                      std::tuple{8, 3, 64, "not a multiple of heads_kv = 3"},
                                      std::tuple{8, 2, 80, "head_dim = 80 is not supported (supported: 64, 96, 128, 256; "
                                                            "or head_dim 192 with head_dim_v 128)"},
                                      std::tuple{8, 2, 192, "head_dim = 192 is not supported"}}) {
    Tree tree = base();
    tree.heads = {hq, hkv, d, 0.0f};
    expect_rejected(tree, {fragment});
  }
  for (auto [d, dv, fragment] : {std::tuple{192, 64, "head_dim = 192 with head_dim_v = 64 is not supported (supported: "
                                                     "head_dim 192 with head_dim_v 128)"},
                                 std::tuple{128, 64, "head_dim = 128 with head_dim_v = 64 is not supported"},
                                 std::tuple{128, -1, "head_dim_v = -1 must be positive (0: head_dim)"}}) {
    Tree tree = base();
    tree.heads = {8, 2, d, 0.0f, dv};
    expect_rejected(tree, {fragment});
  }
  for (HeadConfig good : {HeadConfig{8, 2, 96, 0.0f}, HeadConfig{8, 2, 192, 0.0f, 128}, HeadConfig{8, 2, 128, 0.0f, 128}}) {
    Tree tree = base();
    tree.heads = good;
    CHECK_NOTHROW(plan(tree, PlanOptions{Strategy::flatten, 256, kMaxQueryTile, 7}));
  }
  for (float scale : {-1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    Tree tree = base();
    tree.heads.scale = scale;
    expect_rejected(tree, {"scale"});
  }
}

TEST_CASE("ids and parents") {
  {
    Tree tree = base();
    tree.add_node_range(11, 10, 7, 1);
    expect_rejected(tree, {"duplicate node id 11", "nodes[1]", "nodes[2]"});
  }
  {
    Tree tree = base();
    tree.add_node_range(12, 99, 7, 1);
    expect_rejected(tree, {"node 12 (nodes[2])", "parent 99 is not a node id"});
  }
  {
    Tree tree = base();
    tree.add_node_range(12, 12, 7, 1);
    expect_rejected(tree, {"node 12 (nodes[2]) is its own parent"});
  }
  {
    Tree tree = base();
    tree.add_node_range(20, 22, 7, 1);
    tree.add_node_range(21, 20, 8, 1);
    tree.add_node_range(22, 21, 9, 1);
    expect_rejected(tree, {"cycle", "20", "21", "22"});
  }
  {
    // -1 is a root's parent: a node of that id could have no children, and a
    // query on it would be taken for one on no node.
    Tree tree = base();
    tree.add_node_range(kNoParent, 10, 7, 1);
    tree.add_query(kNoParent);
    expect_rejected(tree, {"nodes[2]: id -1 is the parent of a root"});
  }
  {
    // Sparse ids go through the hashed index: the same checks apply.
    Tree tree({8, 2, 64});
    tree.add_node_range(-5000000000, kNoParent, 0, 2);
    tree.add_node_range(7000000000, -5000000000, 2, 2);
    tree.add_node_range(7000000000, -5000000000, 4, 2);
    tree.add_query(7000000000);
    expect_rejected(tree, {"duplicate node id 7000000000"});
  }
}

TEST_CASE("slots") {
  {
    Tree tree = base();
    tree.add_node(12, 10, {7, -3});
    expect_rejected(tree, {"node 12 (nodes[2])", "slots[1] = -3 is negative"});
  }
  {
    Tree tree = base();
    tree.add_node(12, 10, {7, 8, 100});
    expect_rejected(tree, {"node 12", "slots[2] = 100", "KV pool of 50 slots"}, 50);
  }
  {
    Tree tree = base();
    tree.add_node_range(12, 10, -1, 4);
    expect_rejected(tree, {"node 12", "slot_range start -1 is negative"});
  }
  {
    Tree tree = base();
    tree.add_node_range(12, 10, 0, -2);
    expect_rejected(tree, {"node 12", "slot_range count -2 is negative"});
  }
  {
    Tree tree = base();
    tree.add_node_range(12, 10, 40, 20);
    expect_rejected(tree, {"node 12", "slot_range[19] = 59", "KV pool of 50 slots"}, 50);
  }
  {
    Tree tree = base();
    tree.add_node_range(12, 10, 3000000000, 1);
    expect_rejected(tree, {"node 12", "exceeds the slot limit"});
  }
  {
    // A range whose end does not fit int64 is named by its start.
    Tree tree = base();
    tree.add_node_range(12, 10, std::numeric_limits<std::int64_t>::max(), 2);
    expect_rejected(tree, {"node 12", "slot_range[0] = 9223372036854775807 exceeds the slot limit"});
  }
}

TEST_CASE("paged nodes: page size, the last page's tokens, page ids, checked per page") {
  auto paged = [](std::vector<std::int64_t> pages, std::int32_t page_size, std::int32_t last) {
    Tree tree = base();
    tree.add_node_pages(12, 10, pages, page_size, last);
    tree.add_query(12);
    return tree;
  };
  CHECK_NOTHROW(plan(paged({3, 5}, 4, 2), PlanOptions{Strategy::flatten, 256, kMaxQueryTile, 22}));
  CHECK_NOTHROW(plan(paged({}, 4, 0), PlanOptions{}));  // an empty node (its query sees its ancestors)
  // A page size below 1 is refused as the node is added: such a node has no
  // way to be stored (with no pages it would read as 5 listed slots it lacks).
  Tree tree = base();
  CHECK_THROWS_WITH_AS(tree.add_node_pages(12, 10, {3}, 0, 1), doctest::Contains("node 12: page_size 0 must be positive"),
                       Error);
  CHECK_THROWS_WITH_AS(tree.add_node_pages(12, 10, {}, -3, 5), doctest::Contains("node 12: page_size -3 must be positive"),
                       Error);
  CHECK(tree.node_count() == 2);
  expect_rejected(paged({3, 5}, 4, 0), {"node 12 (nodes[2])", "2 pages of 4 tokens with 0 in the last",
                                        "last_page_tokens must be 1 to 4"});
  expect_rejected(paged({3, 5}, 4, 5), {"with 5 in the last"});
  expect_rejected(paged({3, -2}, 4, 1), {"node 12 (nodes[2]): pages[1] = -2 is negative"});
  // A page whose slots do not fit int64 (page id times page size) is named before they are computed.
  expect_rejected(paged({3, std::int64_t(1) << 62}, 4, 1),
                  {"node 12 (nodes[2]): pages[1] = 4611686018427387904 of 4 tokens starts past the slot limit"});
  // Page 5's second token is slot 21: a pool of 21 slots ends one short, named by the token.
  expect_rejected(paged({3, 5}, 4, 2), {"node 12 (nodes[2]): tokens[5] = 21 is out of range for a KV pool of 21 slots"},
                  21);
}

TEST_CASE("queries") {
  {
    Tree tree = base();
    tree.add_query(42);
    expect_rejected(tree, {"queries[1]: node 42 is not a node id"});
  }
  {
    Tree tree = base();
    tree.add_query(11, 4);
    expect_rejected(tree, {"queries[1]: upto 4 exceeds the 3 tokens of node 11"});
  }
  {
    Tree tree = base();
    tree.add_query(11, -2);
    expect_rejected(tree, {"queries[1]: upto -2 is negative"});
  }
  {
    Tree tree = base();
    tree.add_query(10, 0);
    expect_rejected(tree, {"queries[1] on node 10", "sees no token"});
  }
  {
    Tree tree = base();
    tree.add_node_range(13, kNoParent, 9, 0);
    tree.add_node_range(14, 13, 9, 0);
    tree.add_query(14);
    expect_rejected(tree, {"queries[1] on node 14", "sees no token"});
  }
  {
    Tree tree = base();
    tree.add_query(11, 0);  // fine: it still sees the 4 tokens of node 10
    CHECK_NOTHROW(plan(tree));
  }
}

TEST_CASE("plan options") {
  for (auto [block_tokens, query_tile, fragment] :
       {std::tuple{-1, 64, "block_tokens = -1"}, std::tuple{70000, 64, "block_tokens = 70000"},
        std::tuple{256, 0, "query_tile = 0"}, std::tuple{256, 65, "query_tile = 65"}}) {
    try {
      (void)plan(base(), PlanOptions{Strategy::flatten, block_tokens, query_tile, 0});
      FAIL("accepted bad options");
    } catch (const Error& e) {
      CHECK(e.category() == ErrorCategory::InvalidArgument);
      CHECK_MESSAGE(std::string(e.what()).find(fragment) != std::string::npos, e.what());
    }
  }
  CHECK_THROWS_WITH_AS(parse_strategy("deft"), doctest::Contains("unknown strategy 'deft'"), Error);
  CHECK_THROWS_WITH_AS(Planner(-1), doctest::Contains("threads = -1 is negative"), Error);
  // A Planner refuses what plan() refuses, from whichever thread found it.
  Planner planner(3);
  CHECK_THROWS_WITH_AS(planner.plan(base(), PlanOptions{Strategy::flatten, 70000, 64, 0}),
                       doctest::Contains("block_tokens = 70000"), Error);
  Tree unknown_node = base();
  unknown_node.add_query(999, 0);
  CHECK_THROWS_WITH_AS(planner.plan(unknown_node), doctest::Contains("999"), Error);
  CHECK_NOTHROW(planner.plan(base()));  // and plans again after an error
}
