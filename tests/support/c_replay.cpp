#include "support/c_replay.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "support/c_tensor.hpp"
#include "support/oracle.hpp"
#include "treeattn/workloads.hpp"

namespace treeattn::test {
namespace {

constexpr HeadConfig kHeads{4, 2, 64, 0.0f};
constexpr std::int32_t kPageSize = 4;
constexpr std::int64_t kFirstPage = 1024;  // pages hold slots from 4096 on; ranged nodes take slots below
constexpr std::int64_t kPoolSlots = 8192;

void ok(treeattn_status status) { REQUIRE_MESSAGE(status == TREEATTN_OK, treeattn_last_error()); }

// The replay's own record of the tree, from which each step's whole tree is built.
struct Node {
  std::int64_t id = 0, parent = -1;
  std::vector<std::int64_t> slots;
  std::vector<std::int64_t> pages;  // empty: a ranged node
  bool has_children = false;
};

class Model {
 public:
  std::vector<Node> nodes;  // alive, in insertion order
  std::int64_t next_slot = 0, next_page = kFirstPage, next_id = 0;

  Node& add_ranged(std::int64_t parent, std::int64_t count) {
    Node n;
    n.id = next_id++;
    n.parent = parent;
    for (std::int64_t i = 0; i < count; ++i) n.slots.push_back(next_slot++);
    return push(n);
  }
  Node& add_paged(std::int64_t parent, std::int64_t count) {
    Node n;
    n.id = next_id++;
    n.parent = parent;
    n.pages.push_back(next_page++);
    push(n);
    grow_paged(nodes.back(), count, nullptr);
    return nodes.back();
  }
  // Appends `count` tokens to a paged node; the pages it opened go to `opened`.
  void grow_paged(Node& n, std::int64_t count, std::vector<std::int64_t>* opened) {
    for (std::int64_t i = 0; i < count; ++i) {
      if (std::int64_t(n.slots.size()) == std::int64_t(n.pages.size()) * kPageSize) {
        n.pages.push_back(next_page++);
        if (opened != nullptr) opened->push_back(n.pages.back());
      }
      n.slots.push_back(n.pages.back() * kPageSize + std::int64_t(n.slots.size()) % kPageSize);
    }
  }
  Node* find(std::int64_t id) {
    for (Node& n : nodes) {
      if (n.id == id) return &n;
    }
    return nullptr;
  }
  std::vector<Node*> leaves() {
    std::vector<Node*> out;
    for (Node& n : nodes) {
      if (!n.has_children) out.push_back(&n);
    }
    return out;
  }
  void remove(std::int64_t id) {
    std::vector<std::int64_t> doomed{id};
    for (std::size_t i = 0; i < doomed.size(); ++i) {
      for (const Node& n : nodes) {
        if (n.parent == doomed[i]) doomed.push_back(n.id);
      }
    }
    nodes.erase(std::remove_if(nodes.begin(), nodes.end(),
                               [&](const Node& n) { return std::count(doomed.begin(), doomed.end(), n.id) > 0; }),
                nodes.end());
    for (Node& n : nodes) {
      n.has_children = std::any_of(nodes.begin(), nodes.end(), [&](const Node& c) { return c.parent == n.id; });
    }
  }

  Tree tree(const std::vector<TreeQuery>& queries) const {
    Tree t(kHeads);
    for (const Node& n : nodes) t.add_node(n.id, n.parent, n.slots);
    for (const TreeQuery& q : queries) t.add_query(q.node, q.upto);
    return t;
  }
  treeattn_tree* c_tree(const std::vector<TreeQuery>& queries) const {
    treeattn_tree* t = nullptr;
    ok(treeattn_tree_create(kHeads.heads_q, kHeads.heads_kv, kHeads.head_dim, 0.0f, &t));
    for (const Node& n : nodes) {
      if (n.pages.empty()) {
        ok(treeattn_tree_add_node(t, n.id, n.parent, n.slots.data(), std::int64_t(n.slots.size())));
      } else {
        const std::int64_t last = std::int64_t(n.slots.size()) - std::int64_t(n.pages.size() - 1) * kPageSize;
        ok(treeattn_tree_add_node_pages(t, n.id, n.parent, n.pages.data(), std::int64_t(n.pages.size()), kPageSize,
                                        std::int32_t(last)));
      }
    }
    for (const TreeQuery& q : queries) ok(treeattn_tree_add_query(t, q.node, q.upto));
    return t;
  }

 private:
  Node& push(const Node& n) {
    if (Node* parent = find(n.parent)) parent->has_children = true;
    nodes.push_back(n);
    return nodes.back();
  }
};

// One query per leaf; the first leaf longer than one token also has one that
// sees its first token only (the same query while the leaf grows, so steps of
// appends alone leave the queries as they were).
std::vector<TreeQuery> queries_of(Model& model) {
  std::vector<TreeQuery> queries;
  for (Node* leaf : model.leaves()) queries.push_back(TreeQuery{leaf->id, kWholeNode});
  for (Node* leaf : model.leaves()) {
    if (leaf->slots.size() >= 2) {
      queries.push_back(TreeQuery{leaf->id, 1});
      break;
    }
  }
  return queries;
}

void set_queries(treeattn_planner* planner, const std::vector<TreeQuery>& queries) {
  std::vector<std::int64_t> nodes, upto;
  for (const TreeQuery& q : queries) {
    nodes.push_back(q.node);
    upto.push_back(q.upto);
  }
  ok(treeattn_planner_set_queries(planner, nodes.data(), upto.data(), std::int64_t(queries.size())));
}

// The step's changes, made to the model and handed to the planner.
void change(Model& model, treeattn_planner* planner, int step) {
  for (Node* leaf : model.leaves()) {
    if (leaf->pages.empty()) {
      ok(treeattn_planner_append_range(planner, leaf->id, model.next_slot, 1));
      leaf->slots.push_back(model.next_slot++);
    } else {
      std::vector<std::int64_t> opened;
      model.grow_paged(*leaf, 1, &opened);
      ok(treeattn_planner_append_pages(planner, leaf->id, 1, opened.data(), std::int64_t(opened.size())));
    }
  }
  if (step % 3 == 0) {  // the longest leaf forks
    std::vector<Node*> leaves = model.leaves();
    Node* longest = *std::max_element(leaves.begin(), leaves.end(),
                                      [](const Node* a, const Node* b) { return a->slots.size() < b->slots.size(); });
    const Node& child = model.add_ranged(longest->id, 2);
    ok(treeattn_planner_add_node_range(planner, child.id, child.parent, child.slots.front(), 2));
  }
  if (step % 4 == 0 && model.leaves().size() > 2) {  // the oldest leaf is pruned
    const std::int64_t id = model.leaves().front()->id;
    ok(treeattn_planner_remove_node(planner, id));
    model.remove(id);
  }
  if (step % 5 == 0) {  // a paged branch joins under the root
    const Node& n = model.add_paged(0, 6);
    const std::int64_t last = std::int64_t(n.slots.size()) - std::int64_t(n.pages.size() - 1) * kPageSize;
    ok(treeattn_planner_add_node_pages(planner, n.id, 0, n.pages.data(), std::int64_t(n.pages.size()), kPageSize,
                                       std::int32_t(last)));
  }
  set_queries(planner, queries_of(model));
}

std::vector<double> doubles_of(const HostArray& f32) {
  std::vector<float> values(std::size_t(f32.numel()));
  std::memcpy(values.data(), f32.bytes.data(), f32.bytes.size());
  return std::vector<double>(values.begin(), values.end());
}

Outputs outputs_for(std::int64_t queries) {
  return Outputs{HostArray(DType::f32, {queries, kHeads.heads_q, kHeads.head_dim}),
                 HostArray(DType::f32, {queries, kHeads.heads_q})};
}

}  // namespace

void call_on_host(treeattn_context* context, const treeattn_plan* plan, Inputs& in, Outputs& out) {
  const treeattn_tensor q = c_tensor(in.q.bytes.data(), TREEATTN_DTYPE_F16, 3, in.q.shape[0], in.q.shape[1], in.q.shape[2]);
  const treeattn_tensor k = c_tensor(in.k.bytes.data(), TREEATTN_DTYPE_F16, 3, in.k.shape[0], in.k.shape[1], in.k.shape[2]);
  const treeattn_tensor v = c_tensor(in.v.bytes.data(), TREEATTN_DTYPE_F16, 3, in.v.shape[0], in.v.shape[1], in.v.shape[2]);
  const treeattn_tensor o = c_tensor(out.o.bytes.data(), TREEATTN_DTYPE_F32, 3, out.o.shape[0], out.o.shape[1], out.o.shape[2]);
  const treeattn_tensor lse = c_tensor(out.lse.bytes.data(), TREEATTN_DTYPE_F32, 2, out.lse.shape[0], out.lse.shape[1]);
  ok(treeattn_run(context, plan, &q, &k, &v, &o, &lse));
}

int check_c_planner_replay(treeattn_context* context, const CallPlan& call, const CReplayOptions& options) {
  Model model;
  model.add_ranged(-1, 200);  // the prompt
  model.add_ranged(0, 3);
  model.add_ranged(0, 5);
  model.add_paged(0, 7);
  std::vector<TreeQuery> queries = queries_of(model);

  treeattn_plan_options plan_options;
  treeattn_plan_options_init(&plan_options);
  plan_options.strategy = options.strategy;
  plan_options.block_tokens = 48;  // several blocks, so updates move block edges
  plan_options.bitwise_updates = options.bitwise_updates ? 1 : 0;
  plan_options.window = options.window;

  treeattn_tree* initial = model.c_tree(queries);
  treeattn_planner* planner = nullptr;
  ok(treeattn_planner_create(context, initial, &plan_options, &planner));
  treeattn_tree_destroy(initial);  // the planner keeps what it needs

  Inputs in{HostArray(), random_array(DType::f16, {kPoolSlots, kHeads.heads_kv, kHeads.head_dim}, 3),
            random_array(DType::f16, {kPoolSlots, kHeads.heads_kv, kHeads.head_dim}, 4)};
  int held = 0;
  for (int step = 0; step < options.steps; ++step) {
    CAPTURE(step);
    if (step > 0) change(model, planner, step);
    queries = queries_of(model);
    const treeattn_plan* updated = nullptr;
    ok(treeattn_planner_update(planner, &updated));
    REQUIRE(treeattn_plan_num_queries(updated) == std::int32_t(queries.size()));

    in.q = random_array(DType::f16, {std::int64_t(queries.size()), kHeads.heads_q, kHeads.head_dim}, 100 + step);
    Outputs incremental = outputs_for(std::int64_t(queries.size()));
    call(context, updated, in, incremental);

    treeattn_tree* whole = model.c_tree(queries);
    treeattn_plan* scratch = nullptr;
    ok(treeattn_plan_create(context, whole, &plan_options, &scratch));
    treeattn_tree_destroy(whole);
    Outputs reference = outputs_for(std::int64_t(queries.size()));
    call(context, scratch, in, reference);
    treeattn_plan_destroy(scratch);

    // Greedy's layout (its own, flatten's, one item per query) is a cost-model
    // choice the planner keeps while the tree stays near the size it was made
    // for, where a whole plan makes it again: equal only up to rounding.
    if (options.bitwise_updates) CHECK(treeattn_planner_held_layout(planner) == 0);
    if (options.bitwise_updates && options.strategy != TREEATTN_STRATEGY_GREEDY) {
      CHECK(incremental.o.bytes == reference.o.bytes);
      CHECK(incremental.lse.bytes == reference.lse.bytes);
    } else {  // a held layout rounds differently: as close as two plans of one tree are
      held += treeattn_planner_held_layout(planner);
      CHECK(max_abs_error(incremental.o.view(), doubles_of(reference.o)) <= 1e-4);
      CHECK(max_abs_error(incremental.lse.view(), doubles_of(reference.lse)) <= 1e-4);
    }
    const OracleResult expected =
        oracle_attention(model.tree(queries), in.q.view(), in.k.view(), in.v.view(), {}, options.window);
    CHECK(max_abs_error(incremental.o.view(), expected.o) <= tolerance(DType::f16));
    CHECK(max_abs_error(incremental.lse.view(), expected.lse) <= tolerance(DType::f16));
  }

  // A change naming a node the planner does not have fails at once, naming it.
  CHECK(treeattn_planner_append_range(planner, 987654, 0, 1) == TREEATTN_ERROR_INVALID_TREE);
  CHECK(std::string(treeattn_last_error()).find("987654") != std::string::npos);
  CHECK(treeattn_planner_remove_node(planner, 987654) == TREEATTN_ERROR_INVALID_TREE);
  CHECK(std::string(treeattn_last_error()).find("987654") != std::string::npos);
  treeattn_planner_destroy(planner);
  return held;
}

}  // namespace treeattn::test
