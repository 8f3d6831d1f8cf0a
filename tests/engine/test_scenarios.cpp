// Workload generators and the step-by-step replays: known counts from the
// DeFT workload files (computed independently from the JSON), the paged KV
// cache never leaking or double-freeing across whole replays, static
// generators agreeing with the replays, and the serving loop's invariants.

#include <doctest/doctest.h>

#include <map>
#include <set>
#include <string>
#include <tuple>

#include "support/plan_check.hpp"
#include "support/workloads_dir.hpp"
#include "treeattn/error.hpp"
#include "treeattn/incremental_planner.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/scenarios.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;

namespace {

const std::string kWorkloads = test::workloads_dir();
const HeadConfig kHeads{32, 8, 128, 0.0f};

std::map<std::int64_t, int> depth_histogram(const Tree& tree, bool leaves_only) {
  std::map<std::int64_t, std::int64_t> parent, depth;
  std::map<std::int64_t, int> children;
  for (const TreeNode& n : tree.nodes()) {
    parent[n.id] = n.parent;
    if (n.parent != kNoParent) ++children[n.parent];
  }
  std::map<std::int64_t, int> histogram;
  for (const TreeNode& n : tree.nodes()) {
    std::int64_t d = 0;
    for (std::int64_t v = n.parent; v != kNoParent; v = parent[v]) ++d;
    if (!leaves_only || children[n.id] == 0) ++histogram[d];
  }
  return histogram;
}

// Replayed trees are valid and planned with exact coverage.
bool coverage_error_free(const Tree& tree) {
  const std::string error = test::coverage_error(tree, plan(tree));
  if (!error.empty()) MESSAGE(error);
  return error.empty();
}

}  // namespace

TEST_CASE("Medusa token trees have their published shape") {
  // depth -> count, from Tree_Structure (depth 1 = first draft level); the
  // prefix sits at depth 0 and the token-tree root at depth 1 of the replayed tree.
  const std::map<int, std::tuple<std::map<std::int64_t, int>, std::map<std::int64_t, int>>> expected = {
      {32, {{{2, 4}, {3, 8}, {4, 16}, {5, 3}}, {{4, 14}, {5, 3}}}},
      {64, {{{2, 10}, {3, 28}, {4, 23}, {5, 2}}, {{3, 18}, {4, 22}, {5, 2}}}},
      {128, {{{2, 5}, {3, 20}, {4, 80}, {5, 22}}, {{4, 74}, {5, 22}}}},
      {256, {{{2, 6}, {3, 30}, {4, 150}, {5, 69}}, {{4, 132}, {5, 69}}}},
  };
  for (const auto& [size, shape] : expected) {
    CAPTURE(size);
    const MedusaWorkload w = load_medusa(kWorkloads + "/speculative/APPS_tree_size" + std::to_string(size) + ".json");
    CHECK(w.tree_size == size);
    REQUIRE(w.records.size() == 20);
    CHECK(w.records[0].accept_lengths.size() == 401);
    auto scenario = speculative_scenario(w, 0);
    CHECK(scenario->steps() == 401);
    const Tree tree = replay(*scenario, 101, kHeads);
    CHECK(tree.node_count() == std::size_t(size) + 1);
    CHECK(tree.query_count() == std::size_t(size));
    auto nodes = depth_histogram(tree, false);
    CHECK(nodes[0] == 1);
    CHECK(nodes[1] == 1);
    nodes.erase(0);
    nodes.erase(1);
    CHECK(nodes == std::get<0>(shape));
    CHECK(depth_histogram(tree, true) == std::get<1>(shape));
    // Prompt 3095 chars -> 773 tokens, minus the root token, plus 394 accepted in 100 steps.
    CHECK(tree.nodes()[0].length == 773 - 1 + 394);
    CHECK(total_tokens(tree) == 773 - 1 + 394 + size);
    CHECK(coverage_error_free(tree));
  }
}

TEST_CASE("reasoning replays match the tree sizes computed from the JSON") {
  // (file, tree, iteration) -> (live nodes, live tokens, decoding queries)
  const std::vector<std::tuple<const char*, std::size_t, std::int64_t, std::size_t, std::int64_t, std::size_t>> cases = {
      {"sorting128ToT.json", 1, 1, 11, 1114, 10},   {"sorting128ToT.json", 1, 100, 7, 1704, 6},
      {"sorting128ToT.json", 1, 1000, 20, 6785, 17}, {"sorting128ToT.json", 1, 2000, 15, 4104, 9},
      {"keywordToT.json", 0, 1, 11, 1455, 10},       {"keywordToT.json", 0, 50, 11, 1945, 10},
      {"keywordToT.json", 0, 300, 14, 1907, 10},     {"keywordToT.json", 0, 500, 16, 2215, 10},
      {"docmergeToT.json", 0, 1, 11, 1083, 10},      {"docmergeToT.json", 0, 500, 10, 5573, 9},
      {"docmergeToT.json", 0, 1500, 19, 6341, 16},   {"docmergeToT.json", 0, 2300, 7, 5791, 4},
  };
  std::map<std::string, std::vector<ReasoningTree>> files;
  for (const auto& [file, index, iteration, nodes, tokens, queries] : cases) {
    CAPTURE(file);
    CAPTURE(iteration);
    if (!files.count(file)) files[file] = load_reasoning(kWorkloads + "/reasoning/" + file);
    const ReasoningTree& rt = files[file].at(index);
    CHECK(!rt.incompleted);
    auto scenario = reasoning_scenario(rt);
    const Tree tree = replay(*scenario, iteration, kHeads);
    CHECK(tree.node_count() == nodes);
    CHECK(total_tokens(tree) == tokens);
    CHECK(tree.query_count() == queries);
    CHECK(coverage_error_free(tree));
  }
  CHECK(files["sorting128ToT.json"].size() == 100);
}

TEST_CASE("the paged KV cache never leaks or double-frees across full reasoning replays") {
  for (const char* file : {"sorting128ToT.json", "keywordToT.json", "docmergeToT.json"}) {
    CAPTURE(file);
    const std::vector<ReasoningTree> trees = load_reasoning(kWorkloads + "/reasoning/" + file);
    std::size_t replayed = 0;
    for (std::size_t t = 0; t < trees.size() && replayed < 12; ++t) {
      if (trees[t].incompleted) continue;  // the records mark unfinished traces: skipped (docs/cli.md, Workloads)
      ++replayed;
      PagedKvCache cache(16, 4096);
      {
        SequenceTree live(cache);
        auto scenario = reasoning_scenario(trees[t]);
        std::vector<TreeQuery> queries;
        for (std::int64_t s = 0; s < scenario->steps(); ++s) {
          scenario->advance(live, queries);
          // Pages in use are exactly the live nodes' pages, and every live
          // node lies on the path of a decoding node (pruning left nothing behind).
          const Tree snapshot = live.to_tree(kHeads, queries);
          std::int64_t pages = 0;
          for (const TreeNode& n : snapshot.nodes()) pages += (n.length + 15) / 16;
          REQUIRE(cache.pages_in_use() == pages);
          std::set<std::int64_t> on_paths;
          for (const TreeQuery& q : queries) {
            for (std::int64_t v = q.node; v != kNoParent && on_paths.insert(v).second; v = live.parent(v)) {
            }
          }
          REQUIRE(on_paths.size() == live.size());
        }
        live.remove(0);  // the root, and with it whatever the last step left
        CHECK(live.size() == 0);
      }
      CHECK(cache.pages_in_use() == 0);
      CHECK(cache.peak_pages_in_use() > 0);
    }
    CHECK(replayed > 0);
  }
}

TEST_CASE("KV cache misuse is an error") {
  PagedKvCache cache(4, 2);
  const std::int32_t a = cache.allocate();
  (void)cache.allocate();
  CHECK_THROWS_WITH_AS(cache.allocate(), doctest::Contains("all 2 pages (8 slots) are in use"), Error);
  cache.release(a);
  CHECK_THROWS_WITH_AS(cache.release(a), doctest::Contains("page 0 released but not allocated"), Error);
  CHECK_THROWS_WITH_AS(cache.release(7), doctest::Contains("page 7"), Error);

  PagedKvCache growing(4, 0);  // unbounded: pages appear on demand, freed ones are reused first
  for (int i = 0; i < 100; ++i) (void)growing.allocate();
  growing.release(42);
  CHECK(growing.allocate() == 42);
  CHECK(growing.capacity_pages() == 100);
  CHECK(growing.peak_pages_in_use() == 100);
}

TEST_CASE("the few-shot replay ends in the few-shot tree") {
  auto scenario = few_shot_scenario(4000, 20, 400);
  CHECK(scenario->steps() == 400);
  const Tree replayed = replay(*scenario, 400, kHeads);
  const Tree direct = few_shot_tree(kHeads, 4000, 20, 400);
  REQUIRE(replayed.node_count() == direct.node_count());
  for (std::size_t i = 0; i < direct.node_count(); ++i) {
    CHECK(replayed.nodes()[i].length == direct.nodes()[i].length);
    CHECK(replayed.nodes()[i].parent == direct.nodes()[i].parent);
  }
  CHECK(replayed.query_count() == 20);
  const PlanStats a = compute_stats(plan(replayed)), b = compute_stats(plan(direct));
  CHECK(a.tokens == b.tokens);
  CHECK(a.sequence_read_tokens == b.sequence_read_tokens);
}

TEST_CASE("level trees follow FastTree's shapes") {
  const Tree tree = level_tree(kHeads, {1, 4, 16, 512}, {1024, 256, 128, 32});
  CHECK(tree.node_count() == 533);
  CHECK(tree.query_count() == 512);
  CHECK(total_tokens(tree) == 1024 + 4 * 256 + 16 * 128 + 512 * 32);
  const auto leaves = depth_histogram(tree, true);
  CHECK(leaves == std::map<std::int64_t, int>{{3, 512}});
  CHECK_THROWS_WITH_AS(level_tree(kHeads, {1, 4, 6}, {8, 8, 8}), doctest::Contains("level 2 has 6 nodes"), Error);
  CHECK(find_model("codellama-34b").heads.heads_q == 64);
  CHECK_THROWS_WITH_AS(find_model("gpt"), doctest::Contains("unknown model 'gpt'"), Error);
}

TEST_CASE("malformed workload files are named") {
  CHECK_THROWS_WITH_AS(load_medusa(kWorkloads + "/reasoning/keywordToT.json"), doctest::Contains("not a Medusa workload"),
                       Error);
  CHECK_THROWS_WITH_AS(load_reasoning(kWorkloads + "/speculative/APPS_tree_size32.json"),
                       doctest::Contains("not a reasoning workload"), Error);
  CHECK_THROWS_WITH_AS(load_medusa("/nonexistent.json"), doctest::Contains("/nonexistent.json: cannot open"), Error);
}

TEST_CASE("random arrays filled by several threads equal the seed's sequential stream") {
  // 3 000 001 f32 elements: at least two threads wherever there are two cores,
  // with chunk boundaries off any round number.
  const std::int64_t n = 3000001;
  const HostArray a = random_array(DType::f32, {n}, 7, 2.0f);
  const float* got = reinterpret_cast<const float*>(a.bytes.data());
  Rng rng(7);
  std::int64_t mismatches = 0;
  for (std::int64_t i = 0; i < n; ++i) mismatches += got[i] != float((2.0 * rng.unit() - 1.0) * 2.0f);
  CHECK(mismatches == 0);
  Rng skipped(7);
  skipped.skip(n - 1);
  Rng stepped(7);
  for (std::int64_t i = 0; i + 1 < n; ++i) stepped.next();
  CHECK(skipped.next() == stepped.next());
}

namespace {

// A step of a replay as a value: each node's parent and length, and the queries.
struct Snapshot {
  std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>> nodes;  // id, parent, length
  std::vector<std::pair<std::int64_t, std::int64_t>> queries;              // node, upto
  bool operator==(const Snapshot& other) const { return nodes == other.nodes && queries == other.queries; }
};

Snapshot snapshot(const Tree& tree) {
  Snapshot s;
  for (const TreeNode& n : tree.nodes()) s.nodes.emplace_back(n.id, n.parent, n.length);
  for (const TreeQuery& q : tree.queries()) s.queries.emplace_back(q.node, q.upto);
  return s;
}

}  // namespace

TEST_CASE("the serving loop stays bounded, frees and reuses pages, and queries live nodes") {
  ServingOptions o;
  o.seed = 3;
  o.live_tokens = 3000;
  o.requests = 6;
  o.decode_steps = 300;
  const std::int64_t steps = 6000;
  PagedKvCache cache(16, 0);  // unbounded: its capacity is the most pages ever in use
  SequenceTree live(cache);
  auto scenario = serving_scenario(o);
  CHECK(scenario->steps() == kEndless);
  IncrementalPlanner planner(kHeads);
  std::vector<TreeQuery> queries;
  std::set<std::int64_t> seen, fork_nodes, previous_queries;
  std::int64_t generated = 0, removed = 0, shared_steps = 0, upto = 0, query_changes = 0;
  std::size_t most_nodes = 0;
  for (std::int64_t step = 1; step <= steps; ++step) {
    CAPTURE(step);
    generated += scenario->advance(live, queries);
    const Tree tree = live.to_tree(kHeads, queries);
    REQUIRE(live.tokens() <= o.live_tokens);
    // Pages in use are exactly the live nodes' pages.
    std::int64_t pages = 0;
    std::map<std::int64_t, int> children;
    std::set<std::int64_t> ids;
    for (const TreeNode& n : tree.nodes()) {
      pages += (n.length + 15) / 16;
      ids.insert(n.id);
      if (n.parent != kNoParent) ++children[n.parent];
    }
    REQUIRE(cache.pages_in_use() == pages);
    // A root with two children is a shared prompt under two requests; any other
    // node with two is a branch that forked.
    bool shared = false;
    for (const auto& [parent, count] : children) {
      if (count < 2) continue;
      if (live.parent(parent) == kNoParent) shared = true;
      else fork_nodes.insert(parent);
    }
    shared_steps += shared ? 1 : 0;
    for (std::int64_t id : seen) removed += ids.count(id) == 0 ? 1 : 0;
    seen = ids;
    most_nodes = std::max(most_nodes, ids.size());
    // Every query sits on a live node and sees at least one of its tokens.
    REQUIRE(!queries.empty());
    std::set<std::int64_t> queried;
    for (const TreeQuery& q : queries) {
      REQUIRE(live.contains(q.node));
      REQUIRE(live.length(q.node) >= 1);
      if (q.upto != kWholeNode) {
        ++upto;
        REQUIRE(q.upto >= 1);
        REQUIRE(q.upto <= live.length(q.node));
      }
      queried.insert(q.node);
    }
    query_changes += queried != previous_queries ? 1 : 0;
    previous_queries = queried;
    live.sync(planner, queries);
    const Plan& plan = planner.update();
    REQUIRE(plan.num_queries == std::int64_t(queries.size()));
    if (step % 500 == 0) REQUIRE(test::coverage_error(planner.tree(), plan) == "");
  }
  // Requests come and go: pages are freed and handed out again many times over.
  CHECK(removed > 100);
  CHECK(fork_nodes.size() > 50);
  CHECK(shared_steps > steps / 10);
  CHECK(upto > 100);
  CHECK(query_changes > steps / 2);
  CHECK(cache.capacity_pages() == cache.peak_pages_in_use());
  CHECK(cache.peak_pages_in_use() <= o.live_tokens / 16 + std::int64_t(most_nodes));
  CHECK(generated > 10 * cache.slots());
}

TEST_CASE("the serving loop is deterministic by seed") {
  ServingOptions o;
  o.live_tokens = 2000;
  auto replay_steps = [&](std::uint64_t seed) {
    o.seed = seed;
    PagedKvCache cache(16, 0);
    SequenceTree live(cache);
    auto scenario = serving_scenario(o);
    std::vector<TreeQuery> queries;
    std::vector<Snapshot> steps;
    for (int s = 0; s < 400; ++s) {
      scenario->advance(live, queries);
      steps.push_back(snapshot(live.to_tree(kHeads, queries)));
    }
    return steps;
  };
  const std::vector<Snapshot> a = replay_steps(7), b = replay_steps(7), c = replay_steps(8);
  CHECK(a == b);
  CHECK(a != c);
}

TEST_CASE("serving options out of range are named") {
  ServingOptions o;
  o.live_tokens = 700;  // under 512 + 256 + 4
  CHECK_THROWS_WITH_AS(serving_scenario(o), doctest::Contains("live_tokens 700 cannot hold a request's arrival"), Error);
  o = ServingOptions{};
  o.requests = 0;
  CHECK_THROWS_WITH_AS(serving_scenario(o), doctest::Contains("requests (0)"), Error);
}
