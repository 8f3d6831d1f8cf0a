// The tree file: the DESIGN example parses, round-trips, and every malformed
// input is rejected with the JSON path at fault.

#include <doctest/doctest.h>

#include "treeattn/error.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/tree_json.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;

namespace {

const char* kDesignExample = R"({
  "heads_q": 32, "heads_kv": 8, "head_dim": 128,
  "scale": 0.088388,
  "nodes": [
    {"id": 0, "parent": -1, "slots": [0, 1, 2, 3]},
    {"id": 1, "parent": 0,  "slots": [4, 5]},
    {"id": 2, "parent": 0,  "slot_range": [6, 3]}
  ],
  "queries": [ {"node": 1}, {"node": 2, "upto": 2} ]
})";

void expect_io_error(const std::string& text, const char* fragment) {
  try {
    (void)parse_tree_json(text, "t.json");
    FAIL("accepted: ", text);
  } catch (const Error& e) {
    CHECK(e.category() == ErrorCategory::Io);
    CHECK_MESSAGE(std::string(e.what()).find(fragment) != std::string::npos, e.what());
    CHECK(std::string(e.what()).rfind("t.json: ", 0) == 0);
  }
}

}  // namespace

TEST_CASE("the DESIGN example parses") {
  const Tree tree = parse_tree_json(kDesignExample);
  CHECK(tree.heads.heads_q == 32);
  CHECK(tree.heads.scale == doctest::Approx(0.088388));
  REQUIRE(tree.node_count() == 3);
  CHECK(tree.nodes()[1].listed);
  CHECK(tree.slot(1, 1) == 5);
  CHECK(!tree.nodes()[2].listed);
  CHECK(tree.slot(2, 2) == 8);
  REQUIRE(tree.query_count() == 2);
  CHECK(tree.queries()[0].upto == kWholeNode);
  CHECK(tree.queries()[1].upto == 2);
  CHECK_NOTHROW(plan(tree));
}

TEST_CASE("tree_to_json round-trips a random forest") {
  RandomForestOptions o;
  o.seed = 17;
  o.nodes = 50;
  o.queries = 30;
  o.sparse_ids = true;
  o.heads.scale = 0.125f;
  const Tree tree = random_forest(o);
  const Tree again = parse_tree_json(tree_to_json(tree));
  REQUIRE(again.node_count() == tree.node_count());
  CHECK(again.heads.scale == 0.125f);
  for (std::size_t i = 0; i < tree.node_count(); ++i) {
    CHECK(again.nodes()[i].id == tree.nodes()[i].id);
    CHECK(again.nodes()[i].parent == tree.nodes()[i].parent);
    CHECK(again.nodes()[i].length == tree.nodes()[i].length);
    for (std::int64_t t = 0; t < tree.nodes()[i].length; ++t) CHECK(again.slot(i, t) == tree.slot(i, t));
  }
  for (std::size_t q = 0; q < tree.query_count(); ++q) {
    CHECK(again.queries()[q].node == tree.queries()[q].node);
    CHECK(again.queries()[q].upto == tree.queries()[q].upto);
  }
}

TEST_CASE("paged nodes in tree files: pages, page_size, last_page_tokens, round-tripped") {
  const Tree tree = parse_tree_json(R"({"heads_q": 8, "heads_kv": 2, "head_dim": 64,
    "nodes": [{"id": 0, "parent": -1, "pages": [4, 1, 9], "page_size": 16, "last_page_tokens": 5},
              {"id": 1, "parent": 0, "slot_range": [200, 3]}],
    "queries": [{"node": 1}]})");
  REQUIRE(tree.node_count() == 2);
  CHECK(tree.nodes()[0].length == 37);
  CHECK(tree.slot(0, 0) == 64);
  CHECK(tree.slot(0, 17) == 17);
  CHECK(tree.slot(0, 36) == 148);
  const Tree again = parse_tree_json(tree_to_json(tree));
  CHECK(tree_to_json(again) == tree_to_json(tree));
  CHECK(again.nodes()[0].page_size == 16);
  CHECK_THROWS_WITH_AS(parse_tree_json(R"({"heads_q": 8, "heads_kv": 2, "head_dim": 64,
    "nodes": [{"id": 0, "parent": -1, "pages": [4], "page_size": 16, "last_page_tokens": 17}], "queries": []})"),
                       doctest::Contains("page_size 16 and last_page_tokens 17"), Error);
  CHECK_THROWS_WITH_AS(parse_tree_json(R"({"heads_q": 8, "heads_kv": 2, "head_dim": 64,
    "nodes": [{"id": 0, "parent": -1, "pages": [4], "page_size": 16}], "queries": []})"),
                       doctest::Contains("last_page_tokens"), Error);
}

TEST_CASE("head_dim_v in tree files: read, written only where it differs from head_dim, checked") {
  const Tree tree = parse_tree_json(R"({"heads_q": 8, "heads_kv": 2, "head_dim": 192, "head_dim_v": 128,
    "nodes": [{"id": 0, "parent": -1, "slot_range": [0, 3]}], "queries": [{"node": 0}]})");
  CHECK(tree.heads.head_dim_v == 128);
  CHECK(tree.heads.value_dim() == 128);
  const std::string written = tree_to_json(tree);
  CHECK(written.find("\"head_dim_v\":128") != std::string::npos);
  CHECK(parse_tree_json(written).heads.same_as(tree.heads));
  const Tree plain = parse_tree_json(R"({"heads_q": 8, "heads_kv": 2, "head_dim": 64,
    "nodes": [], "queries": []})");
  CHECK(plain.heads.value_dim() == 64);
  CHECK(tree_to_json(plain).find("head_dim_v") == std::string::npos);
  CHECK_THROWS_WITH_AS(parse_tree_json(R"({"heads_q": 8, "heads_kv": 2, "head_dim": 64, "head_dim_v": 0,
    "nodes": [], "queries": []})"), doctest::Contains("head_dim_v = 0 must be positive (omit it for head_dim)"), Error);
  CHECK_THROWS_WITH_AS(parse_tree_json(R"({"heads_q": 8, "heads_kv": 2, "head_dim": 64, "head_dim_v": "x",
    "nodes": [], "queries": []})"), doctest::Contains("head_dim_v must be an integer"), Error);
}

TEST_CASE("malformed tree files name the field at fault") {
  const std::string heads = R"("heads_q": 4, "heads_kv": 2, "head_dim": 64, )";
  expect_io_error("{\"heads_q\": 4,", "malformed JSON at byte");
  expect_io_error("{" + heads + R"("scale": 1e300, "nodes": [], "queries": []})", "scale 1e+300 is not a finite float");
  // A number past a double's range is an I/O error too, not nlohmann's out_of_range escaping.
  expect_io_error("{\"heads_q\": 2e999999}", "malformed JSON: [json.exception.out_of_range.406] number overflow");
  expect_io_error("[1, 2]", "must be an object");
  expect_io_error(R"({"heads_kv": 2, "head_dim": 64, "nodes": [], "queries": []})", "heads_q is missing");
  expect_io_error("{" + heads + R"("nodes": {}, "queries": []})", "nodes must be an array");
  expect_io_error("{" + heads + R"("nodes": [], "queries": [], "extra": 1})", "unknown key 'extra'");
  expect_io_error("{" + heads + R"("nodes": [{"id": "a", "parent": -1, "slots": []}], "queries": []})",
                  "nodes[0].id must be an integer");
  expect_io_error("{" + heads + R"("nodes": [{"id": 0, "parent": -1}], "queries": []})",
                  "nodes[0] needs exactly one of 'slots', 'slot_range' and 'pages'");
  expect_io_error("{" + heads + R"("nodes": [{"id": 0, "parent": -1, "slots": [1], "slot_range": [0, 1]}], "queries": []})",
                  "exactly one of");
  expect_io_error("{" + heads + R"("nodes": [{"id": 0, "parent": -1, "slots": [1, 2.5]}], "queries": []})",
                  "nodes[0].slots[1] must be an integer");
  expect_io_error("{" + heads + R"("nodes": [{"id": 0, "parent": -1, "slot_range": [3]}], "queries": []})",
                  "slot_range must be [start, count]");
  expect_io_error("{" + heads + R"("nodes": [{"id": 0, "slots": [1]}], "queries": []})", "nodes[0].parent is missing");
  expect_io_error("{" + heads + R"("nodes": [{"id": 0, "parent": -1, "slots": [1]}], "queries": [{"node": 0, "upto": -1}]})",
                  "queries[0].upto = -1 is negative");
  expect_io_error("{" + heads + R"("nodes": [{"id": 0, "parent": -1, "slots": [1]}], "queries": [{"nod": 0}]})",
                  "queries[0] has unknown key 'nod'");
  expect_io_error("{" + heads + R"("scale": "big", "nodes": [], "queries": []})", "scale must be a number");
  expect_io_error("{" + heads + R"("nodes": [{"id": 99999999999999999999, "parent": -1, "slots": []}], "queries": []})",
                  "nodes[0].id");
}

TEST_CASE("a missing file is an I/O error naming the path") {
  CHECK_THROWS_WITH_AS(load_tree_json("/nonexistent/tree.json"), doctest::Contains("/nonexistent/tree.json: cannot open"),
                       Error);
}
